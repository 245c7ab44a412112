"""`taskfleet up` waits for its workers' runtimes before it says it is ready (stack.json, its
URLs), and that wait ends: at its bound, when `up` is stopped, or for a sidecar that exited.

The happy path (every runtime up, then stack.json) is `tests/test_e2e_up.py`'s; here a real
sidecar runs a "runtime" that never answers `hello` (`sleep`), so its
`taskfleet_sidecar_runtime_up` stays 0.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from taskfleet.stack import SidecarProcess, _wait_runtimes, find_sidecar_binary
from testbed.fleet import free_port, wait_until

# The sidecar's /metrics answers within this (it starts in well under a second when idle).
METRICS_UP_S = 30.0


@pytest.fixture(scope="module")
def silent_worker(
    nats_server: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SidecarProcess]:
    """A real sidecar whose runtime never answers (it would restart it after 120 s)."""
    sidecar = SidecarProcess(
        binary=find_sidecar_binary(),
        nats_url=nats_server.url,
        worker_id="silent-worker",
        run_dir=tmp_path_factory.mktemp("run"),
        metrics_addr=f"127.0.0.1:{free_port()}",
        runtime_cmd="sleep 600",
    )
    sidecar.start()
    try:
        addr = str(sidecar.metrics_addr)
        # Up and serving /metrics, whose gauge says the runtime is not: a wait that follows is
        # on the runtime, not on the sidecar's own start.
        wait_until(lambda: _runtime_down(addr) or not sidecar.running(), METRICS_UP_S)
        assert sidecar.running(), sidecar.log_tail()
        yield sidecar
    finally:
        sidecar.stop()


def _runtime_down(addr: str) -> bool:
    """The sidecar's /metrics answers and says `taskfleet_sidecar_runtime_up 0`."""
    import httpx

    try:
        text = httpx.get(f"http://{addr}/metrics", timeout=2.0).text
    except httpx.HTTPError:
        return False
    return re.search(r"^taskfleet_sidecar_runtime_up 0$", text, flags=re.M) is not None


def _wait(sidecars: list[SidecarProcess], stop: asyncio.Event | None = None, **kw: Any) -> float:
    async def run() -> None:
        await _wait_runtimes(sidecars, stop or asyncio.Event(), **kw)

    started = time.monotonic()
    asyncio.run(run())
    return time.monotonic() - started


def test_past_its_bound_up_goes_on_and_names_the_worker_and_its_log(
    silent_worker: SidecarProcess, caplog: pytest.LogCaptureFixture
) -> None:
    assert _runtime_down(str(silent_worker.metrics_addr))
    with caplog.at_level(logging.INFO, logger="taskfleet.up"):
        took = _wait([silent_worker], timeout_s=1.5, poll_s=0.1)
    assert took >= 1.5
    assert took < 1.5 + 20, took  # a poll is bounded by httpx's 2 s timeout
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "silent-worker" in warnings[0] and str(silent_worker.log_path) in warnings[0]
    assert silent_worker.running()  # `up` goes on with it: it is not stopped


def test_stopping_up_ends_the_wait_without_a_warning(
    silent_worker: SidecarProcess, caplog: pytest.LogCaptureFixture
) -> None:
    async def run() -> float:
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(0.5, stop.set)
        started = time.monotonic()
        await _wait_runtimes([silent_worker], stop, timeout_s=600, poll_s=0.1)
        return time.monotonic() - started

    with caplog.at_level(logging.INFO, logger="taskfleet.up"):
        took = asyncio.run(run())
    assert took < 20, took
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_sidecar_that_exited_is_not_waited_for(
    nats_server: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sidecar = SidecarProcess(
        binary=find_sidecar_binary(),
        nats_url=nats_server.url,
        worker_id="exited-worker",
        run_dir=tmp_path,
        metrics_addr=f"127.0.0.1:{free_port()}",
        runtime_cmd="sleep 600",
    )
    sidecar.start()
    sidecar.stop()
    with caplog.at_level(logging.INFO, logger="taskfleet.up"):
        took = _wait([sidecar], timeout_s=600, poll_s=0.1)
    assert took < 20, took
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "exited-worker exited" in warnings[0], warnings
