"""Test harness for the gateway: a background event loop, uvicorn on a free port, and a
*test-only* worker peer that speaks docs/protocol.md.

The peer (``Responder``) is the other side of the wire protocol, not a stand-in for the gateway:
it pulls from the real consumer ``task_<task>``, reads the real headers and payload (object-store
references included), publishes a real reply and acks. Its embeddings are computed from the
texts (length, word count, kind) so a test can check that the answer belongs to its request.
The Rust sidecar is exercised end to end by the fleet tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import nats
import numpy as np
import pytest
import uvicorn
from fastapi import FastAPI
from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext

from registry import Registry
from serving import nats_layout
from serving.embedded_nats import free_port
from serving.gateway import GatewaySettings, create_gateway
from serving.protocol import (
    ErrorInfo,
    PayloadRef,
    QueuePayload,
    ReplyError,
    ReplyOk,
    WorkerHeartbeat,
    embeddings_to_bytes,
    from_wire,
    pack,
    unpack,
)
from serving.publisher import publish_everything
from testbed.declared_tasks import add_task
from testbed.fleet import HTTP_TIMEOUT_S
from tests.nats_fixture import running_nats

T = TypeVar("T")
DIMS = 4


class BackgroundLoop:
    """An asyncio loop in a thread, so sync tests can drive async NATS peers."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


@contextlib.contextmanager
def serve_app(app: FastAPI) -> Iterator[str]:
    """Run ``app`` with uvicorn on a free loopback port; yields its base URL."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=20)


def expected_embedding(text: str, kind: str) -> list[float]:
    """What the test peer answers for one text."""
    return [float(len(text)), float(len(text.split())), 1.0 if kind == "query" else 0.0, 7.0]


def open_registry(tmp: Path) -> Registry:
    return Registry.open(f"sqlite:///{tmp}/r.db", artifact_dir=tmp / "a", actor="test")


def add_placed_task(registry: Registry, tmp: Path, task: str, *, placed: bool = True) -> None:
    """A task with one candidate, placed on the fleet when ``placed``.

    The gateway never loads the model, so a folder with a config.json is weights enough.
    """
    folder = tmp / f"model-{task}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text('{"hidden_size": 4}')
    add_task(registry, task, suite=task)
    registry.add_model(f"m-{task}", path=folder)
    candidate = registry.add_candidate(task, base=f"m-{task}")
    if placed:
        registry.promote(task, candidate.name, override=True, reason="test: no eval run")


@dataclass
class Responder:
    """The worker side of docs/protocol.md for one task (see the module docstring)."""

    nats_url: str
    task: str
    duplicate: bool = False
    error: ErrorInfo | None = None
    model_key: str = "test-model"
    epoch: int = 1
    seen_headers: list[dict[str, str]] = field(default_factory=list)
    seen_payloads: list[QueuePayload] = field(default_factory=list)
    _nc: NatsClient | None = None
    _task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._nc = await nats.connect(
            self.nats_url, max_reconnect_attempts=-1, reconnect_time_wait=0.2
        )
        js = self._nc.jetstream()
        layout = await nats_layout.ensure_layout(js, [self.task])
        await beat(layout, f"peer-{self.task}", self.task)
        sub = await js.pull_subscribe_bind(
            nats_layout.consumer_name(self.task), stream=nats_layout.TASKS_STREAM
        )
        self._task = asyncio.create_task(self._serve(js, layout, sub))

    async def _serve(self, js: JetStreamContext, layout: nats_layout.Layout, sub: Any) -> None:
        assert self._nc is not None
        last_beat = time.monotonic()
        while True:
            try:
                if time.monotonic() - last_beat > 2:
                    await beat(layout, f"peer-{self.task}", self.task)
                    last_beat = time.monotonic()
                messages = await sub.fetch(1, timeout=0.5)
            except nats.errors.TimeoutError:
                continue
            except nats.errors.Error:  # NATS restarting: the client reconnects by itself
                await asyncio.sleep(0.2)
                continue
            for msg in messages:
                headers = dict(msg.headers or {})
                self.seen_headers.append(headers)
                payload = from_wire(QueuePayload, unpack(msg.data))
                self.seen_payloads.append(payload)
                texts = payload.inputs
                if isinstance(texts, PayloadRef):
                    texts = unpack((await layout.payloads.get(texts.ref)).data or b"")
                reply = self._reply(headers["Tf-Request-Id"], texts, payload.kind)
                for _ in range(2 if self.duplicate else 1):
                    await self._nc.publish(headers["Tf-Reply"], pack(reply))
                await msg.ack()

    def _reply(self, request_id: str, texts: list[str], kind: str) -> ReplyOk | ReplyError:
        if self.error is not None:
            return ReplyError(request_id=request_id, error=self.error)
        matrix = np.array([expected_embedding(t, kind) for t in texts], dtype=np.float32)
        count, dims, data = embeddings_to_bytes(matrix)
        return ReplyOk(
            request_id=request_id,
            model_key=self.model_key,
            epoch=self.epoch,
            dims=dims,
            count=count,
            embeddings=data,
        )

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._nc is not None:
            await self._nc.close()


async def beat(layout: nats_layout.Layout, worker_id: str, task: str) -> None:
    """Put a heartbeat that lists ``task``, as a sidecar with a loop for it would."""
    heartbeat = WorkerHeartbeat(
        worker_id=worker_id,
        host="test",
        ts_ms=int(time.time() * 1000),
        loaded=[],
        memory_used=0,
        memory_budget=0,
        queue_depth={task: 0},
        runtimes=["torch"],
        epochs={},
    )
    await layout.workers.put(worker_id, pack(heartbeat))


async def put_heartbeat(nats_url: str, task: str, worker_id: str) -> None:
    nc = await nats.connect(nats_url)
    try:
        layout = await nats_layout.ensure_layout(nc.jetstream())
        await beat(layout, worker_id, task)
    finally:
        await nc.close()


async def consumer_exists(nats_url: str, task: str) -> bool:
    """Whether the task's consumer exists (a worker, or a Responder, created it)."""
    nc = await nats.connect(nats_url)
    try:
        return await nats_layout.check_task_consumer(nc.jetstream(), task) is not None
    finally:
        await nc.close()


async def stream_messages(nats_url: str, task: str) -> int:
    """Messages stored in ``TASKS`` for this task's subject."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        info = await js.stream_info(
            nats_layout.TASKS_STREAM, subjects_filter=nats_layout.task_subject(task)
        )
        return int((info.state.subjects or {}).get(nats_layout.task_subject(task), 0))
    finally:
        await nc.close()


@dataclass
class Stack:
    """A served gateway with its registry, NATS URL and a loop for NATS peers."""

    url: str
    nats_url: str
    registry: Registry
    tmp: Path
    loop: BackgroundLoop
    gateway_id: str

    def task(self, *, placed: bool = True, worker: bool = False) -> str:
        name = f"t-{uuid.uuid4().hex[:10]}"
        add_placed_task(self.registry, self.tmp, name, placed=placed)
        self.sync()
        if worker:
            self.loop.run(put_heartbeat(self.nats_url, name, f"w-{name}"))
        return name

    def sync(self) -> None:
        """Publish what the registry holds (as the leading control plane would) and wait
        until the gateway has seen it: after a registry change, before a request."""
        sync_gateway(self.url, self.registry, self.nats_url, self.loop)

    def responder(self, task: str, **options: Any) -> Responder:
        peer = Responder(self.nats_url, task, **options)
        self.loop.run(peer.start())
        return peer


@contextlib.contextmanager
def gateway_stack(nats_url: str, tmp: Path, settings: GatewaySettings) -> Iterator[Stack]:
    """A registry in ``tmp`` and a gateway served by uvicorn, ready (connected to NATS)."""
    registry = open_registry(tmp)
    loop = BackgroundLoop()
    try:
        with serve_app(create_gateway(nats_url, settings)) as url:
            wait_ready(url)
            sync_gateway(url, registry, nats_url, loop)
            yield Stack(url, nats_url, registry, tmp, loop, settings.gateway_id)
    finally:
        loop.close()
        registry.close()


@contextlib.contextmanager
def nats_and_gateway(
    tmp_path_factory: pytest.TempPathFactory, settings: GatewaySettings
) -> Iterator[Stack]:
    """A module's whole stack: a nats-server of its own and a ready gateway on it."""
    with (
        running_nats(tmp_path_factory.mktemp("nats")) as server,
        gateway_stack(server.url, tmp_path_factory.mktemp("gateway"), settings) as stack,
    ):
        yield stack


async def publish_registry(registry: Registry, nats_url: str) -> dict[str, int]:
    """One publisher pass (placements and the directory, adding only: other tests' registries
    may publish to the same server); returns each bucket's newest sequence afterwards."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await publish_everything(registry, js, prune=False)
        buckets = (nats_layout.DIRECTORY_BUCKET, nats_layout.PLACEMENTS_BUCKET)
        return {b: (await js.stream_info(f"KV_{b}")).state.last_seq for b in buckets}
    finally:
        await nc.close()


def sync_gateway(
    url: str, registry: Registry, nats_url: str, loop: BackgroundLoop, timeout_s: float = 20
) -> None:
    """Publish ``registry`` and wait until the gateway at ``url`` has seen all of it."""
    published = loop.run(publish_registry(registry, nats_url))
    deadline = time.monotonic() + timeout_s
    while True:
        response = httpx.get(f"{url}/readyz", timeout=HTTP_TIMEOUT_S)
        seen = response.json().get("view", {}).get("revisions", {})
        if response.status_code == 200 and all(seen.get(b, 0) >= n for b, n in published.items()):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"gateway at {url} saw {seen}, not {published}")
        time.sleep(0.02)


def wait_ready(url: str, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while httpx.get(f"{url}/readyz", timeout=HTTP_TIMEOUT_S).status_code != 200:
        if time.monotonic() > deadline:
            raise RuntimeError(f"gateway at {url} never became ready")
        time.sleep(0.05)
