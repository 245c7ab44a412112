"""A registry that cannot answer (SQLite file locked by another process) makes the gateway
answer the retryable 503 its error is declared as, with ``Retry-After``, on every path that
reads the registry: the API-key check and the task/placement look-up. Never a 500."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from registry import Registry
from serving.embedded_nats import EmbeddedNats
from serving.gateway import GatewaySettings, create_gateway
from tests.gateway_fixture import add_placed_task, serve_app, wait_ready
from tests.nats_fixture import running_nats

# Seconds a registry call waits for a locked SQLite file before it gives up.
BUSY_TIMEOUT_S = 1


@pytest.fixture(scope="module")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    with running_nats(tmp_path_factory.mktemp("nats")) as server:
        yield server


def _locked(db: Path) -> sqlite3.Connection:
    """Another process's writer that holds the file's write lock until closed."""
    conn = sqlite3.connect(db, isolation_level=None, timeout=5)
    conn.execute("BEGIN EXCLUSIVE")
    return conn


def _assert_store_unavailable(response: httpx.Response, elapsed: float) -> None:
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert error["code"] == "DATABASE_ERROR" and error["retryable"] is True
    assert int(response.headers["Retry-After"]) > 0
    assert elapsed < 10 * BUSY_TIMEOUT_S + 5, f"answered after {elapsed:.1f}s"


@pytest.mark.parametrize("auth", [True, False], ids=["key-check", "task-lookup"])
def test_locked_registry_answers_503_retryable(
    nats_server: EmbeddedNats, tmp_path: Path, auth: bool
) -> None:
    db = tmp_path / "registry.db"
    registry = Registry.open(
        f"sqlite:///{db}?timeout={BUSY_TIMEOUT_S}", artifact_dir=tmp_path / "a", actor="test"
    )
    add_placed_task(registry, tmp_path, "locked-task")
    headers = {"Content-Type": "application/json"}
    if auth:
        _, token = registry.create_api_key("app", roles=["caller"])
        headers["Authorization"] = f"Bearer {token}"
    app = create_gateway(
        registry, nats_server.url, GatewaySettings(require_auth=auth, workers_refresh_s=0)
    )
    try:
        with serve_app(app) as url:
            wait_ready(url)
            lock = _locked(db)
            try:
                began = time.monotonic()
                response = httpx.post(
                    f"{url}/v1/tasks/locked-task",
                    content=b'{"inputs": ["x"]}',
                    headers=headers,
                    timeout=90,
                )
                _assert_store_unavailable(response, time.monotonic() - began)
            finally:
                lock.rollback()
                lock.close()
            # Once the lock is gone the same call passes the registry checks again.
            response = httpx.post(
                f"{url}/v1/tasks/locked-task", content=b'{"inputs": ["x"]}', headers=headers
            )
            assert response.json()["error"]["code"] == "NO_WORKER"
    finally:
        registry.close()
