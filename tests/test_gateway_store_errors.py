"""The registry database away does not stop traffic: the gateway verifies keys and finds
placements in what the control plane published to NATS, never in the database.

SQLite: the file locked by another process's writer (a registry call fails with the retryable
DATABASE_ERROR meanwhile). PostgreSQL: the server stopped while a publisher runs and a client
sends a steady stream; every request is answered, a promotion fails retryably, and once the
server is back the next promotion reaches the fleet.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import nats
import pytest

from registry import Registry
from registry.errors import DatabaseError
from serving.embedded_nats import EmbeddedNats
from serving.gateway import GatewaySettings
from serving.nats_layout import ensure_layout
from serving.publisher import PlacementPublisher, decode_placement
from testbed.postgres import PostgresServer
from tests.gateway_fixture import (
    BackgroundLoop,
    Stack,
    add_placed_task,
    expected_embedding,
    gateway_stack,
    serve_app,
    sync_gateway,
    wait_ready,
)
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


def _call(url: str, task: str, token: str | None, text: str) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.post(
        f"{url}/v1/tasks/{task}", json={"inputs": [text]}, headers=headers, timeout=30
    )


@pytest.mark.parametrize("auth", [True, False], ids=["with-keys", "no-auth"])
def test_a_locked_sqlite_registry_does_not_stop_traffic(
    nats_server: EmbeddedNats, tmp_path: Path, auth: bool
) -> None:
    db = tmp_path / "registry.db"
    registry = Registry.open(
        f"sqlite:///{db}?timeout={BUSY_TIMEOUT_S}", artifact_dir=tmp_path / "a", actor="test"
    )
    task = f"locked-{'keys' if auth else 'open'}"
    add_placed_task(registry, tmp_path, task)
    token = registry.create_api_key("app", roles=["caller"])[1] if auth else None
    settings = GatewaySettings(require_auth=auth, workers_refresh_s=0)
    from serving.gateway import create_gateway

    loop = BackgroundLoop()
    try:
        with serve_app(create_gateway(nats_server.url, settings)) as url:
            wait_ready(url)
            sync_gateway(url, registry, nats_server.url, loop)
            stack = Stack(url, nats_server.url, registry, tmp_path, loop, settings.gateway_id)
            peer = stack.responder(task)
            lock = _locked(db)
            try:
                with pytest.raises(DatabaseError) as away:  # the registry cannot answer ...
                    registry.current_placement(task)
                assert away.value.retryable
                began = time.monotonic()  # ... and the gateway answers from NATS at once
                answers = [_call(url, task, token, f"text {i}") for i in range(10)]
                assert [r.status_code for r in answers] == [200] * 10, answers[-1].text
                assert answers[3].json()["embeddings"] == [expected_embedding("text 3", "query")]
                assert time.monotonic() - began < 10 * BUSY_TIMEOUT_S
                if auth:  # keys are still checked: a wrong one is refused, not waved through
                    assert _call(url, task, "tfk_0000_nope", "x").status_code == 401
            finally:
                lock.rollback()
                lock.close()
                loop.run(peer.stop())
    finally:
        loop.close()
        registry.close()


async def _kv_epoch(nats_url: str, task: str) -> int:
    nc = await nats.connect(nats_url)
    try:
        entry = await (await ensure_layout(nc.jetstream())).placements.get(task)
        return decode_placement(entry.value or b"").epoch
    finally:
        await nc.close()


def test_postgresql_stopped_traffic_continues_and_promotion_waits(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    pg = PostgresServer()
    pg.start()
    try:
        registry = Registry.open(
            pg.create_database("outage"), artifact_dir=tmp_path / "a", actor="test"
        )
        task = "pg-outage"
        add_placed_task(registry, tmp_path, task)
        other = tmp_path / "model-b"
        other.mkdir()
        (other / "config.json").write_text('{"hidden_size": 8}')
        registry.add_model("model-b", path=other)
        second = registry.add_candidate(task, base="model-b").name
        _, token = registry.create_api_key("app", roles=["caller"])
        settings = GatewaySettings(require_auth=True, workers_refresh_s=0)
        publisher = PlacementPublisher(registry, nats_server.url, poll_interval_s=0.2)
        with gateway_stack(nats_server.url, tmp_path / "gw", settings) as stack:
            # The stack's own registry is another one: publish ours, keep publishing it.
            sync_gateway(stack.url, registry, nats_server.url, stack.loop)
            running = asyncio.run_coroutine_threadsafe(publisher.run(), stack.loop.loop)
            peer = stack.responder(task)
            sent, failed = 0, []
            stop_stream = threading.Event()

            def stream() -> None:
                nonlocal sent
                while not stop_stream.is_set():
                    response = _call(stack.url, task, token, f"n{sent}")
                    sent += 1
                    if response.status_code != 200:
                        failed.append(response.text)
                    time.sleep(0.02)

            client = threading.Thread(target=stream)
            client.start()
            try:
                time.sleep(1)
                pg.halt()
                outage = time.monotonic()
                with pytest.raises(DatabaseError) as refused:
                    registry.promote(task, second, override=True, reason="during the outage")
                assert refused.value.retryable and refused.value.code == "DATABASE_ERROR"
                while time.monotonic() - outage < 5:
                    time.sleep(0.2)
                during = sent
                pg.start()
                time.sleep(1)
                promoted = registry.promote(task, second, override=True, reason="after it")
                deadline = time.monotonic() + 20
                while stack.loop.run(_kv_epoch(nats_server.url, task)) < promoted.epoch:
                    assert time.monotonic() < deadline, "the promotion was never published"
                    time.sleep(0.2)
            finally:
                stop_stream.set()
                client.join(timeout=60)
                publisher.stop()
                running.result(timeout=30)
                stack.loop.run(peer.stop())
            assert not failed, failed[:3]
            assert during > 20, f"only {during} requests were sent"
            print(f"PostgreSQL stopped 5 s: {sent} requests sent, {sent} answered, 0 failed")
        registry.close()
    finally:
        pg.stop()
