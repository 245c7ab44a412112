"""A fleet on loopback (nats-server, the placement publisher, the fleet watcher, real sidecars
and runtimes) and the steps around it: register a served task, wait for a condition, read
heartbeats. Shared by the fleet and end-to-end tests and by the benchmarks."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import nats
import uvicorn

from registry import Registry
from registry import entities as e
from serving import protocol as p
from serving.embedded_nats import EmbeddedNats, EmbeddedNatsCluster, free_port
from serving.fleet_watcher import FleetWatcher, decode_heartbeat
from serving.machine import machine_class as this_machine
from serving.nats_layout import WORKERS_BUCKET, ensure_layout
from serving.publisher import PlacementPublisher
from taskfleet.stack import SidecarProcess, find_sidecar_binary, runtime_args
from testbed.declared_tasks import add_task

T = TypeVar("T")

# How long a test waits for a cold start: a runtime importing torch and sentence-transformers,
# then its first model load. In make test three files' fleets start beside each other; on CI
# (pytest 1,675 s) and here on a slow day (1,729 s) 40 s was too short, CI's log showing 28 s
# for the first load alone. Waiting for a cold start is not a claim about speed, so the bound
# is long; what a test asserts about speed it asserts after it.
COLD_START_S = 150.0

# A test's HTTP call to a server on loopback. httpx's default (5 s) is a claim about speed that
# a starved machine breaks: in make test here a control plane's 401 to a wrong key took longer.
# What a test asserts about speed it asserts explicitly.
HTTP_TIMEOUT_S = 60.0


def unique_task(prefix: str = "t") -> str:
    """A task name no other test on a shared server uses (valid as a subject token)."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def register_served_task(
    registry: Registry,
    task: str,
    model_dir: Path,
    *,
    model_name: str | None = None,
    pinned: bool = False,
    adapter_dir: Path | None = None,
    suite: str = "test-suite",
    replicas: int | None = None,
) -> e.Placement:
    """Task + base model (+ adapter) + candidate, promoted (an admin override: no eval run).
    The task takes its kind from ``suite`` (declared as a retrieval suite if it does not exist);
    ``replicas``: how many workers hold it (default 1, the registry's)."""
    add_task(registry, task, suite=suite)
    name = model_name or f"m-{task}"
    try:
        registry.get_model(name)
    except Exception:
        registry.add_model(name, path=model_dir)
    adapter = None
    if adapter_dir is not None:
        adapter = f"a-{task}"
        register_test_adapter(registry, adapter, name, adapter_dir)
    candidate = registry.add_candidate(task, base=name, adapter=adapter)
    registry.promote(
        task,
        candidate.name,
        override=True,
        reason="test fixture: no eval run",
        pinned=pinned,
        replicas=replicas,
    )
    placement = registry.current_placement(task)
    assert placement is not None
    return placement


def register_test_adapter(registry: Registry, name: str, base: str, folder: Path) -> None:
    """An adapter with a placeholder training record (tests place it, never train it)."""
    from registry.entities import TrainingRecord

    registry.register_adapter(
        name,
        base=base,
        source_dir=folder,
        training=TrainingRecord(
            data_fingerprint="0" * 64,
            train_split="dev",
            hyperparameters={},
            seed=1,
            code_version="test",
        ),
    )


async def eventually(
    probe: Callable[[], Awaitable[T | None]], timeout_s: float = 15.0, every_s: float = 0.1
) -> T:
    """Poll ``probe`` until it returns something truthy; fail with the last value otherwise."""
    began = time.monotonic()
    deadline = began + timeout_s
    last: T | None = None
    while time.monotonic() < deadline:
        last = await probe()
        if last:
            _log_wait(began, timeout_s, met=True)
            return last
        await asyncio.sleep(every_s)
    _log_wait(began, timeout_s, met=False)
    raise AssertionError(f"condition not met within {timeout_s}s (last value: {last!r})")


def wait_until(probe: Callable[[], T | None], timeout_s: float = 15.0, every_s: float = 0.1) -> T:
    """Poll ``probe`` until it returns something truthy; fail with the last value otherwise."""
    began = time.monotonic()
    deadline = began + timeout_s
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            _log_wait(began, timeout_s, met=True)
            return last
        time.sleep(every_s)
    _log_wait(began, timeout_s, met=False)
    raise AssertionError(f"condition not met within {timeout_s}s (last value: {last!r})")


def _log_wait(began: float, timeout_s: float, *, met: bool) -> None:
    """With ``TASKFLEET_WAIT_LOG`` set, one line per wait: the test, where it waited, the
    seconds it took against its bound. Run the suite under load with it to find the waits too
    tight for a slow machine before CI does."""
    path = os.environ.get("TASKFLEET_WAIT_LOG")
    if not path:
        return
    frame: Any = sys._getframe(2)  # the caller of wait_until / eventually
    where = f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno}"
    while frame is not None and f"{os.sep}tests{os.sep}" not in frame.f_code.co_filename:
        frame = frame.f_back
    if frame is not None:  # and the line in the test that led to it
        where += f" <- {Path(frame.f_code.co_filename).name}:{frame.f_lineno}"
    test = os.environ.get("PYTEST_CURRENT_TEST", "-").split(" ")[0]
    line = f"{test}\t{where}\t{time.monotonic() - began:.1f}\t{timeout_s:g}\t{int(met)}\n"
    with open(path, "a") as out:
        out.write(line)


def stable(probe: Callable[[], Any], seconds: float, timeout_s: float = 60.0) -> Any:
    """The value of ``probe`` once it has stayed the same for ``seconds``."""
    deadline = time.monotonic() + timeout_s
    last, since = probe(), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.3)
        now = probe()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= seconds:
            return last
    raise AssertionError(f"never stable: {last!r}")


# ---- a whole local fleet from its real parts ---------------------------------------------
class LocalFleet:
    """nats-server, registry (SQLite), gateway (uvicorn thread), publisher + watcher (their own
    event-loop thread) and N real sidecars, each supervising a real Python runtime.

    Built from parts rather than `taskfleet up` so tests can kill one sidecar or restart NATS.
    """

    def __init__(
        self,
        root: Path,
        *,
        workers: int = 1,
        memory_budget_bytes: int = 1 << 30,
        sidecar_args: list[str] | None = None,
        runtimes: list[str] | None = None,
        nats_nodes: int = 1,
        separate_caches: bool = False,
        gateways: int = 1,
        artifact_source: str | None = None,
        require_auth: bool = False,
        machine_class: str | None = "this machine",
    ) -> None:
        """``runtimes``: the runtime of each worker (default: all torch). ``separate_caches``:
        each worker its own artifact cache (``cache<i>``), as on separate machines; else one
        shared cache, as `taskfleet up` has. ``gateways``: how many gateways (each its own
        uvicorn thread and NATS connection; ``gateway_urls``; ``gateway_url`` is the first).
        ``artifact_source``: an s3://bucket/prefix instead of the NATS object store.
        ``require_auth``: gateways that take API keys (``reg.create_api_key``) only.
        ``machine_class``: whose runtime profiles the workers apply (default this machine's,
        as `taskfleet up` passes; None: none)."""
        self.root = root
        self.runtimes = runtimes or ["torch"] * workers
        self.n_workers = len(self.runtimes)
        self.nats_nodes = nats_nodes
        self.memory_budget_bytes = memory_budget_bytes
        self.separate_caches = separate_caches
        self.artifact_source = artifact_source
        self.n_gateways = gateways
        self.require_auth = require_auth
        self.machine_class = this_machine() if machine_class == "this machine" else machine_class
        self.gateway_urls: list[str] = []
        self._gateway_servers: list[uvicorn.Server] = []
        self.sidecar_args = sidecar_args or [
            "--heartbeat-ms", "300",
            "--nak-delay-ms", "200",
            "--ack-wait-ms", "5000",
            "--max-batch-wait-ms", "2",
        ]  # fmt: skip
        # One nats-server, or a cluster of ``nats_nodes`` (both: .url, .start(), .stop()).
        self.nats: EmbeddedNats | EmbeddedNatsCluster | None = None
        self.registry: Registry | None = None
        self.sidecars: list[SidecarProcess] = []
        self.gateway_url = ""
        self._threads: list[threading.Thread] = []
        self._gateway_server: uvicorn.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loops: list[PlacementPublisher | FleetWatcher] = []
        self._control_thread: threading.Thread | None = None

    # -- lifecycle
    def start(self) -> LocalFleet:
        from serving.gateway.app import GatewaySettings, create_gateway

        if self.nats_nodes > 1:
            self.nats = EmbeddedNatsCluster(self.root / "nats", self.nats_nodes).start()
        else:
            self.nats = EmbeddedNats(self.root / "nats").start()
        self.registry = Registry.open(
            f"sqlite:///{self.root / 'registry.db'}", artifact_dir=self.root / "artifacts"
        )
        asyncio.run(make_layout(self.nats.url))
        self._start_control_loops()
        for _ in range(self.n_gateways):
            port = free_port()
            app = create_gateway(
                self.nats.url,
                GatewaySettings(
                    require_auth=self.require_auth, workers_refresh_s=0.2, retry_after_s=1
                ),
            )
            server = uvicorn.Server(
                uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
            )
            thread = threading.Thread(target=server.run, daemon=True)
            thread.start()
            self._threads.append(thread)
            self._gateway_servers.append(server)
            self.gateway_urls.append(f"http://127.0.0.1:{port}")
        self._gateway_server = self._gateway_servers[0]
        self.gateway_url = self.gateway_urls[0]
        binary = find_sidecar_binary()
        for i, runtime in enumerate(self.runtimes):
            sidecar = SidecarProcess(
                binary=binary,
                nats_url=self.nats.url,
                worker_id=f"w{i}-{uuid.uuid4().hex[:8]}",
                run_dir=self.root / "run",
                memory_budget_bytes=self.memory_budget_bytes,
                metrics_addr=f"127.0.0.1:{free_port()}",
                extra_args=self.sidecar_args,
                env={"RUST_LOG": "info,async_nats=warn"},
                runtime=runtime,
                runtime_flags=runtime_args(runtime) if runtime != "torch" else [],
                artifact_cache=self.root / f"cache{i}" if self.separate_caches else None,
                artifact_source=self.artifact_source,
                machine_class=self.machine_class,
            )
            sidecar.start()
            self.sidecars.append(sidecar)
        wait_until(lambda: all(g.started for g in self._gateway_servers))
        return self

    def _start_control_loops(self) -> None:
        assert self.registry is not None and self.nats is not None
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._loops = [
            # The control plane's own poll: what a test writes through ``reg`` (this process)
            # is published at once (the registry's commit signal); a poll of 0.1 s had cost
            # a tenth of a core per idle fleet.
            PlacementPublisher(
                self.registry,
                self.nats.url,
                poll_interval_s=0.5,
                artifact_source=self.artifact_source,
            ),
            # Half production's flush: ``serving`` waits for the mirror (at 0.2 s the watcher
            # had cost 1.0 CPU-s per 30 s of an idle one-task fleet).
            FleetWatcher(self.registry, self.nats.url, flush_interval_s=0.5, stale_after_s=3.0),
        ]

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.run_until_complete(asyncio.gather(*(c.run() for c in self._loops)))

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self._threads.append(thread)
        self._control_thread = thread

    def stop_control_loops(self) -> None:
        """Stop the placement publisher and fleet watcher (the control plane's NATS side), as
        a control-plane crash would; :meth:`start_control_loops` brings them back."""
        assert self._loop is not None and self._control_thread is not None
        for control in self._loops:
            self._loop.call_soon_threadsafe(control.stop)
        self._control_thread.join(timeout=15)
        self._threads.remove(self._control_thread)

    def start_control_loops(self) -> None:
        self._start_control_loops()

    def __enter__(self) -> LocalFleet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        for sidecar in self.sidecars:
            sidecar.stop(timeout_s=10)
        for server in self._gateway_servers:
            server.should_exit = True
        if self._loop is not None:
            for control in self._loops:
                self._loop.call_soon_threadsafe(control.stop)
        for thread in self._threads:
            thread.join(timeout=15)
        if self.nats is not None:
            self.nats.cleanup()
        if self.registry is not None:
            self.registry.close()

    def logs(self) -> str:
        """Every sidecar's log tail: printed when a test fails, to see why."""
        return "\n".join(f"--- {s.worker_id}\n{s.log_tail(40)}" for s in self.sidecars)

    # -- helpers
    @property
    def reg(self) -> Registry:
        assert self.registry is not None
        return self.registry

    def serving(
        self, task: str, epoch: int, workers: int | None = None, timeout_s: float = COLD_START_S
    ) -> list[str]:
        """Wait until ``workers`` (default all) report serving ``task`` at ``epoch`` or newer,
        as mirrored into the registry by the fleet watcher (a cold start included)."""
        need = self.n_workers if workers is None else workers

        def probe() -> list[str]:
            status = {s.task: s for s in self.reg.placement_status()}.get(task)
            if status is None:
                return []
            done = [w for w, e in status.reported.items() if e >= epoch]
            return done if len(done) >= need else []

        return wait_until(probe, timeout_s=timeout_s)

    def ready_for(self, tasks: Iterable[str], timeout_s: float = COLD_START_S) -> None:
        """Wait until every worker's runtime is up (its heartbeat names one) and it runs a loop
        for each of ``tasks``: all a lazy placement shows before its first request (a pinned
        one shows :meth:`serving`). A request sent sooner waits for the runtime's start, its
        imports included, inside its own deadline."""
        want = set(tasks)

        def ready(worker_id: str) -> bool:
            beat = self.heartbeat(worker_id)
            return beat is not None and bool(beat.runtimes) and want <= set(beat.queue_depth)

        wait_until(lambda: all(ready(s.worker_id) for s in self.sidecars), timeout_s=timeout_s)

    def gateway_nats_node(self) -> int:
        """Which node of the NATS cluster the gateway is connected to now."""
        assert isinstance(self.nats, EmbeddedNatsCluster) and self._gateway_server is not None
        app: Any = self._gateway_server.config.app  # the FastAPI app uvicorn serves
        dispatcher = app.state.dispatcher
        port = dispatcher._nc.connected_url.port
        return next(i for i, node in enumerate(self.nats.nodes) if node.port == port)

    def sidecar_metrics(self, index: int = 0) -> str:
        """The Prometheus text of one sidecar's /metrics."""
        return httpx.get(f"http://{self.sidecars[index].metrics_addr}/metrics", timeout=10).text

    def gateway_metrics(self) -> str:
        return httpx.get(f"{self.gateway_url}/metrics", timeout=10).text

    def heartbeats(self) -> dict[str, p.WorkerHeartbeat]:
        """Current KV `workers` values, read straight from NATS."""
        assert self.nats is not None
        return asyncio.run(read_heartbeats(self.nats.url))

    def heartbeat(self, worker_id: str) -> p.WorkerHeartbeat | None:
        """One worker's current KV `workers` value: a direct get, cheap to poll every few ms
        (``heartbeats`` makes a consumer per call, and JetStream limits their number)."""
        assert self.nats is not None
        return asyncio.run(_heartbeat(self.nats.url, worker_id))


async def make_layout(url: str) -> None:
    """Streams, buckets and object stores of the fleet on the NATS at ``url``."""
    nc = await nats.connect(servers=url.split(","))
    try:
        await ensure_layout(nc.jetstream())
    finally:
        await nc.close()


async def _heartbeat(url: str, worker_id: str) -> p.WorkerHeartbeat | None:
    from nats.js.errors import KeyDeletedError, KeyNotFoundError

    nc = await nats.connect(url)
    try:
        # Bind the bucket (one request), not ensure_layout (a dozen): this is polled every
        # few ms, and under load that many API requests a poll slowed the server's answers to
        # everyone past their timeouts.
        kv = await nc.jetstream().key_value(WORKERS_BUCKET)
        try:
            entry = await kv.get(worker_id)
        except (KeyNotFoundError, KeyDeletedError):
            return None
        return decode_heartbeat(entry.value) if entry.value else None
    finally:
        await nc.close()


async def read_heartbeats(url: str) -> dict[str, p.WorkerHeartbeat]:
    """Every worker's current heartbeat in KV `workers` (a watch read up to now)."""
    nc = await nats.connect(servers=url.split(","))
    try:
        kv = await nc.jetstream().key_value(WORKERS_BUCKET)
        beats: dict[str, p.WorkerHeartbeat] = {}
        watcher = await kv.watchall(ignore_deletes=True)
        while (entry := await watcher.updates(timeout=2.0)) is not None:
            beat = decode_heartbeat(entry.value or b"")
            beats[beat.worker_id] = beat
        await watcher.stop()
        return beats
    finally:
        await nc.close()
