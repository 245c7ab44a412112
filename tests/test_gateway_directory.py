"""The gateway serves from what the control plane publishes (KV `directory` and `placements`).

A revoked key is refused within seconds while a publisher runs; the directory holds digests,
never a usable key; a gateway that has not seen the directory yet says so (503 NOT_READY)
instead of calling every key unknown; `taskfleet gateway` runs with a NATS URL and nothing else.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import msgpack
import nats
import pytest

from registry.limits import (
    DEFAULT_MAX_DOCUMENT_CHARS,
    DEFAULT_MAX_QUERY_CHARS,
    DEFAULT_MAX_TEXT_CHARS,
)
from serving import nats_layout
from serving.directory import KEY_PREFIX, META_KEY, TASK_PREFIX, publish_directory
from serving.embedded_nats import EmbeddedNats, free_port
from serving.gateway import GatewaySettings, create_gateway
from serving.publisher import PlacementPublisher
from testbed.declared_tasks import add_task, declare_suite
from testbed.fleet import HTTP_TIMEOUT_S
from tests.gateway_fixture import (
    BackgroundLoop,
    Stack,
    add_placed_task,
    open_registry,
    serve_app,
    sync_gateway,
    wait_ready,
)
from tests.nats_fixture import running_nats

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[EmbeddedNats]:
    with running_nats(tmp_path / "nats") as server:
        yield server


def _call(url: str, task: str, token: str) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/tasks/{task}",
        json={"inputs": ["x"]},
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )


async def _directory(nats_url: str) -> dict[str, bytes]:
    nc = await nats.connect(nats_url)
    try:
        return await nats_layout.kv_values(nc.jetstream(), nats_layout.DIRECTORY_BUCKET)
    finally:
        await nc.close()


def test_revocation_reaches_the_gateway_within_seconds(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    registry = open_registry(tmp_path)
    task = "revoke-me"
    add_placed_task(registry, tmp_path, task)
    _, token = registry.create_api_key("app", roles=["caller"], tasks=[task])
    publisher = PlacementPublisher(registry, nats_server.url)  # the default 0.5 s pass
    loop = BackgroundLoop()
    running = asyncio.run_coroutine_threadsafe(publisher.run(), loop.loop)
    settings = GatewaySettings(require_auth=True, workers_refresh_s=0)
    try:
        with serve_app(create_gateway(nats_server.url, settings)) as url:
            wait_ready(url)
            stack = Stack(url, nats_server.url, registry, tmp_path, loop, settings.gateway_id)
            peer = stack.responder(task)
            try:
                deadline = time.monotonic() + 20
                while _call(url, task, token).status_code != 200:
                    assert time.monotonic() < deadline, "the key was never published"
                    time.sleep(0.1)
                registry.revoke_api_key("app")
                revoked = time.monotonic()
                while (response := _call(url, task, token)).status_code == 200:
                    assert time.monotonic() - revoked < 10, "the revocation never arrived"
                    time.sleep(0.05)
                took = time.monotonic() - revoked
                assert response.status_code == 401
                assert "revoked" in response.json()["error"]["message"]
                assert took < 5, f"revocation took {took:.2f}s"
                print(f"revocation: refused {took:.2f}s after `revoke` (publisher pass 0.5 s)")
            finally:
                loop.run(peer.stop())
        # What NATS holds: the digest and scope, never the key.
        values = asyncio.run(_directory(nats_server.url))
        assert not any(token.encode() in v for v in values.values())
        assert msgpack.unpackb(values[TASK_PREFIX + task]) == {
            "name": task,
            "kind": "retrieval",
            "max_text_chars": DEFAULT_MAX_TEXT_CHARS,
            "max_query_chars": DEFAULT_MAX_QUERY_CHARS,
            "max_document_chars": DEFAULT_MAX_DOCUMENT_CHARS,
            "sample_rate": 0.0,
            "retention_s": 7 * 86400.0,
        }
        record = msgpack.unpackb(next(v for k, v in values.items() if k.startswith(KEY_PREFIX)))
        assert record["revoked"] is True and record["hash"] is None
        assert record["tasks"] == [task] and record["roles"] == ["caller"]
    finally:
        publisher.stop()
        running.result(timeout=30)
        loop.close()
        registry.close()


def test_a_gateway_without_the_directory_says_it_is_not_ready(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    registry = open_registry(tmp_path)
    loop = BackgroundLoop()
    try:
        for auth in (True, False):
            settings = GatewaySettings(require_auth=auth, workers_refresh_s=0)
            with serve_app(create_gateway(nats_server.url, settings)) as url:
                wait_ready(url)
                headers = {"Authorization": "Bearer tfk_abcd_secret"} if auth else {}
                response = httpx.post(
                    f"{url}/v1/tasks/anything",
                    json={"inputs": ["x"]},
                    headers=headers,
                    timeout=HTTP_TIMEOUT_S,
                )
                assert response.status_code == 503, response.text
                error = response.json()["error"]
                assert error["code"] == "NOT_READY" and error["retryable"] is True
                assert "taskfleet serve" in error["message"]
                assert int(response.headers["Retry-After"]) > 0
        # Once a control plane published (an empty registry), the same calls are plain answers.
        settings = GatewaySettings(require_auth=False, workers_refresh_s=0)
        with serve_app(create_gateway(nats_server.url, settings)) as url:
            wait_ready(url)
            sync_gateway(url, registry, nats_server.url, loop)
            response = httpx.post(
                f"{url}/v1/tasks/anything", json={"inputs": ["x"]}, timeout=HTTP_TIMEOUT_S
            )
            assert response.status_code == 404
    finally:
        loop.close()
        registry.close()


def test_the_directory_is_made_to_equal_the_registry(nats_server: EmbeddedNats) -> None:
    async def scenario() -> None:
        nc = await nats.connect(nats_server.url)
        try:
            js = nc.jetstream()
            kv = (await nats_layout.ensure_layout(js)).directory
            await kv.put(TASK_PREFIX + "gone", b"\x80")  # left by an older registry
            known = await publish_directory(js, kv, {TASK_PREFIX + "kept": b"\x81"}, None)
            held = await nats_layout.kv_values(js, nats_layout.DIRECTORY_BUCKET)
            assert set(held) == {TASK_PREFIX + "kept", META_KEY} and known == {
                TASK_PREFIX + "kept": b"\x81"
            }
            meta_revision = (await kv.get(META_KEY)).revision
            # Nothing changed: nothing is written, not even meta.
            await publish_directory(js, kv, {TASK_PREFIX + "kept": b"\x81"}, known)
            assert (await kv.get(META_KEY)).revision == meta_revision
        finally:
            await nc.close()

    asyncio.run(scenario())


def test_taskfleet_gateway_runs_with_a_nats_url_only(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    registry = open_registry(tmp_path)  # the control plane's, on "another host"
    task = "alone"
    add_placed_task(registry, tmp_path, task)
    _, token = registry.create_api_key("app", roles=["caller"])
    loop = BackgroundLoop()
    home = tmp_path / "gateway-home"  # the gateway's host: no database, no files
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKFLEET_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "taskfleet", "--home", str(home), "--database-url",
         "postgresql+psycopg://nobody@127.0.0.1:1/none", "gateway",
         "--nats-url", nats_server.url, "--port", str(port)],
        cwd=REPO, env={**env, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{url}/healthz", timeout=HTTP_TIMEOUT_S)
                break
            except httpx.HTTPError:
                assert proc.poll() is None, "taskfleet gateway exited"
                assert time.monotonic() < deadline, "taskfleet gateway never listened"
                time.sleep(0.2)
        sync_gateway(url, registry, nats_server.url, loop, timeout_s=30)
        stack = Stack(url, nats_server.url, registry, tmp_path, loop, "standalone")
        peer = stack.responder(task)
        try:
            response = _call(url, task, token)
            assert response.status_code == 200, response.text
        finally:
            loop.run(peer.stop())
        assert not home.exists(), "the gateway wrote under its home"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        loop.close()
        registry.close()


def test_a_registry_is_not_what_the_gateway_reads() -> None:
    """The gateway's modules import nothing of the registry's database (nor SQLAlchemy): only
    the rules every role reads (the per-text limits' defaults) and their errors."""
    rules = ["registry", "registry.errors", "registry.limits"]
    code = (
        "import sys, serving.gateway.app, serving.gateway.view, serving.gateway.dispatch; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('registry', 'sqlalchemy') "
        f"and m not in {rules!r}); "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_gateway_routes_by_the_kind_the_directory_publishes(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    """A task's kind comes from KV `directory`, never from the database: with the registry
    closed and its file gone, a rerank and a classification task take their own bodies and
    stock endpoints, and another kind's endpoint names the right one."""
    registry = open_registry(tmp_path)
    declare_suite(registry, "pairs", kind="rerank")
    declare_suite(registry, "areas", kind="classification")
    add_task(registry, "rank-task", suite="pairs")
    add_task(registry, "area-task", suite="areas")
    loop = BackgroundLoop()
    settings = GatewaySettings(require_auth=False, workers_refresh_s=0)
    try:
        with serve_app(create_gateway(nats_server.url, settings)) as url:
            wait_ready(url)
            sync_gateway(url, registry, nats_server.url, loop)
            registry.close()
            (tmp_path / "r.db").unlink()

            def post(path: str, body: dict[str, object]) -> tuple[int, str, str]:
                response = httpx.post(f"{url}{path}", json=body, timeout=30)
                error = response.json()["error"]
                return response.status_code, error["code"], error["message"]

            rerank = {"query": "frage", "documents": ["a", "b"]}
            # The body of the task's kind passes; the task is known but not placed yet.
            placed_later = (503, "NOT_PLACED")
            assert post("/v1/tasks/rank-task", rerank)[:2] == placed_later
            assert post("/v1/rerank", {"model": "rank-task", **rerank})[:2] == placed_later
            assert post("/v2/rerank", {"model": "rank-task", **rerank})[:2] == placed_later
            assert post("/v1/tasks/area-task", {"inputs": ["x"]})[:2] == placed_later
            assert post("/v1/classify", {"model": "area-task", "input": "x"})[:2] == placed_later
            # A body or endpoint of another kind: one 400 before anything is queued.
            assert post("/v1/tasks/rank-task", {"inputs": ["x"]})[:2] == (400, "BAD_REQUEST")
            status, code, message = post("/v1/embeddings", {"model": "rank-task", "input": "x"})
            assert (status, code) == (400, "BAD_REQUEST") and "/v1/rerank" in message
            status, code, message = post("/v1/rerank", {"model": "area-task", **rerank})
            assert (status, code) == (400, "BAD_REQUEST") and "/v1/classify" in message
            assert post("/v1/classify", {"model": "nope", "input": "x"})[:2] == (404, "NOT_FOUND")
    finally:
        loop.close()
