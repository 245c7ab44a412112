"""The gateway when NATS goes away and comes back: 503s meanwhile, then serving again."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from serving.embedded_nats import EmbeddedNats, free_port
from serving.gateway import GatewaySettings, create_gateway
from serving.gateway.headers import HEADER_TIMEOUT
from testbed.fleet import HTTP_TIMEOUT_S
from tests.gateway_fixture import Stack, expected_embedding, gateway_stack, serve_app
from tests.nats_fixture import nats_available


def wait_for_status(url: str, status: int, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while httpx.get(f"{url}/readyz", timeout=HTTP_TIMEOUT_S).status_code != status:
        assert time.monotonic() < deadline, f"/readyz never answered {status}"
        time.sleep(0.1)


@contextlib.contextmanager
def served_over_nats(
    tmp_path: Path, workers_refresh_s: float
) -> Iterator[tuple[EmbeddedNats, Stack, str]]:
    """A nats-server of the test's own, a gateway on it and a responder serving one task."""
    server = EmbeddedNats(tmp_path / "nats")
    server.start()
    settings = GatewaySettings(
        require_auth=False, workers_refresh_s=workers_refresh_s, default_timeout_s=10
    )
    try:
        with gateway_stack(server.url, tmp_path / "gw", settings) as stack:
            task = stack.task()
            peer = stack.responder(task)
            try:
                yield server, stack, task
            finally:
                stack.loop.run(peer.stop())
    finally:
        server.cleanup()


@pytest.mark.skipif(not nats_available(), reason="nats-server binary not installed")
def test_gateway_survives_a_nats_restart(tmp_path: Path) -> None:
    with served_over_nats(tmp_path, workers_refresh_s=0) as (server, stack, task):
        first = httpx.post(
            f"{stack.url}/v1/tasks/{task}", json={"inputs": ["before"]}, timeout=HTTP_TIMEOUT_S
        )
        assert first.json()["embeddings"] == [expected_embedding("before", "query")]

        server.stop()
        wait_for_status(stack.url, 503)
        down = httpx.post(
            f"{stack.url}/v1/tasks/{task}", json={"inputs": ["x"]}, timeout=HTTP_TIMEOUT_S
        )
        assert down.status_code == 503
        assert down.json()["error"]["code"] == "QUEUE_UNAVAILABLE"
        assert int(down.headers["Retry-After"]) > 0

        server.start()  # same port, same store: the queue and buckets survive
        wait_for_status(stack.url, 200)
        deadline = time.monotonic() + 20
        while True:
            again = httpx.post(
                f"{stack.url}/v1/tasks/{task}", json={"inputs": ["after"]}, timeout=HTTP_TIMEOUT_S
            )
            if again.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.2)  # the peer's heartbeat may lag the gateway's reconnect
        assert again.status_code == 200, again.text
        assert again.json()["embeddings"] == [expected_embedding("after", "query")]


@pytest.mark.skipif(not nats_available(), reason="nats-server binary not installed")
def test_gateway_started_before_nats_becomes_ready_when_it_comes_up(tmp_path: Path) -> None:
    server = EmbeddedNats(tmp_path / "nats", port=free_port())
    try:
        app = create_gateway(server.url, GatewaySettings(require_auth=False))
        with serve_app(app) as url:
            assert httpx.get(f"{url}/healthz", timeout=HTTP_TIMEOUT_S).status_code == 200
            not_ready = httpx.get(f"{url}/readyz", timeout=HTTP_TIMEOUT_S)
            assert not_ready.status_code == 503
            assert not_ready.json()["error"]["code"] == "NOT_READY"
            server.start()
            wait_for_status(url, 200)
    finally:
        server.cleanup()


@pytest.mark.skipif(not nats_available(), reason="nats-server binary not installed")
def test_a_stalled_jetstream_that_never_acks_is_a_retryable_503(tmp_path: Path) -> None:
    # A nats-server starved of CPU keeps its connections but acknowledges nothing in time
    # (seen under stress: a 2 s deadline passed while the publish waited for its ack). Nothing
    # the caller did is wrong and nothing ran: retry later, not a final 504.
    # The live workers are read once and kept: the stall meets the publish, not that read.
    with served_over_nats(tmp_path, workers_refresh_s=60) as (server, stack, task):
        first = httpx.post(
            f"{stack.url}/v1/tasks/{task}", json={"inputs": ["before"]}, timeout=HTTP_TIMEOUT_S
        )
        assert first.status_code == 200, first.text
        assert server.pid is not None
        os.kill(server.pid, signal.SIGSTOP)
        try:
            stalled = httpx.post(
                f"{stack.url}/v1/tasks/{task}",
                json={"inputs": ["x"]},
                headers={HEADER_TIMEOUT: "800"},
                timeout=30,
            )
        finally:
            os.kill(server.pid, signal.SIGCONT)
        assert stalled.status_code == 503, stalled.text
        error = stalled.json()["error"]
        assert error["code"] == "QUEUE_UNAVAILABLE", error
        assert "acknowledge" in error["message"], error
        assert int(stalled.headers["Retry-After"]) > 0
