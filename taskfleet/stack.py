"""`taskfleet up`: the whole fleet on one machine, in one process tree.

Starts, in order: nats-server (embedded, unless a URL is given), the NATS layout, the control
plane and the gateway (two uvicorn servers in this event loop), the control plane's NATS side
(`serving/control.py`: leader lock, placement publisher, fleet watcher), and N sidecars that
each start and supervise their own Python runtime. Every child process it starts (nats-server,
the sidecars) is supervised: one that dies is started again, at once the first time and with a
growing back-off while it keeps dying. Ctrl-C or
SIGTERM stops them in reverse order; every child runs in its own process group which is killed
at the end, so no runtime outlives the stack.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import logging
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import uvicorn

import contract
from serving.connection import NatsTarget, nats_options
from serving.httpserver import http_config

if TYPE_CHECKING:
    from registry import Registry
    from registry.store import AbstractStore
    from serving.control import ControlLoop

log = logging.getLogger("taskfleet.up")
SIDECAR_BINARY = "taskfleet-sidecar"
REPO_ROOT = Path(__file__).resolve().parent.parent


class StackError(RuntimeError):
    """The stack cannot start (missing binary, port taken, NATS unreachable)."""


def find_sidecar_binary(explicit: Path | None = None) -> Path:
    """``--sidecar-bin``, else TASKFLEET_SIDECAR_BIN, else the cargo build, else PATH."""
    candidates = [explicit] if explicit else []
    if os.environ.get("TASKFLEET_SIDECAR_BIN"):
        candidates.append(Path(os.environ["TASKFLEET_SIDECAR_BIN"]))
    candidates.append(REPO_ROOT / "sidecar" / "target" / "release" / SIDECAR_BINARY)
    on_path = shutil.which(SIDECAR_BINARY)
    if on_path:
        candidates.append(Path(on_path))
    for path in candidates:
        if path and path.is_file() and os.access(path, os.X_OK):
            return path
    raise StackError(
        f"{SIDECAR_BINARY} not found (looked at {', '.join(str(c) for c in candidates)}); "
        "build it with `make sidecar` or point TASKFLEET_SIDECAR_BIN at it"
    )


def sidecar_runtimes(binary: Path) -> set[str]:
    """The runtimes built into a sidecar binary, from its ``--version`` line."""
    try:
        proc = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, timeout=30, check=True
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise StackError(f"{binary} --version failed: {exc}") from None
    found = re.search(r"\(runtimes: ([a-z, ]+)\)", proc.stdout)
    if found is None:
        raise StackError(f"{binary} does not say which runtimes it has: {proc.stdout.strip()!r}")
    return {kind.strip() for kind in found.group(1).split(",")}


def check_sidecar_runtimes(binary: Path, kinds: Iterable[str]) -> None:
    """Refuse, before any worker starts, runtimes the binary was built without."""
    missing = sorted(set(kinds) - sidecar_runtimes(binary))
    if "candle" in missing:
        raise StackError(
            f"{binary} was built without the candle runtime; build it with "
            "`make sidecar-candle` (cargo build --release --features candle)"
        )
    if missing:
        raise StackError(f"{binary} has no {', '.join(missing)} runtime")


def runtime_command(python: str = sys.executable, device: str = "cpu") -> str:
    """The command a sidecar runs to start its runtime; ``{socket}`` is filled in by it."""
    return f"{shlex.quote(python)} -m serving.runtime.server --socket {{socket}} --device {device}"


def runtime_args(
    runtime: str,
    *,
    python: str = sys.executable,
    device: str = "cpu",
    socket_path: Path | None = None,
    http_url: str | None = None,
    http_model: str | None = None,
) -> list[str]:
    """The sidecar flags that give it its runtime: torch starts the Python runtime over a
    socket; candle runs inside the sidecar; http drives the engine at ``http_url``, and any
    endpoint model at the URL of its own record (without ``http_url``: endpoint models only)."""
    if runtime == "torch":
        args = ["--runtime", "torch", "--runtime-cmd", runtime_command(python, device)]
        return args + (["--runtime-socket", str(socket_path)] if socket_path else [])
    if runtime == "candle":
        return ["--runtime", "candle"]
    if runtime == "http":
        if http_url and not http_url.startswith(("http://", "https://")):
            raise StackError(f"--http-url {http_url!r} must start with http:// or https://")
        engine = ["--http-base-url", http_url] if http_url else []
        return ["--runtime", "http", *engine] + (["--http-model", http_model] if http_model else [])
    raise StackError(f"unknown runtime {runtime!r}; known: torch, candle, http")


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the stack dies without cleaning up (Linux;
    the signal follows the death of the thread that started the child: start from one that
    lives as long as the stack, the main thread)."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class SidecarProcess:
    """One sidecar (and, through it, one runtime) as a child in its own process group."""

    binary: Path
    nats_url: NatsTarget  # URL(s), or options with credentials and TLS
    worker_id: str
    run_dir: Path
    memory_budget_bytes: int = 8 << 30
    # Where the sidecar serves Prometheus metrics ("host:port"); None: no endpoint.
    metrics_addr: str | None = None
    runtime_cmd: str = field(default_factory=runtime_command)
    extra_args: list[str] = field(default_factory=list)
    # "torch" (the Python runtime from runtime_cmd) or "candle"/"http" (all in runtime_flags,
    # from `runtime_args`).
    runtime: str = "torch"
    runtime_flags: list[str] = field(default_factory=list)
    # Where fetched models and adapters are kept by sha256; default <run_dir>/artifacts (shared
    # by the workers of one `up`: a fetch lands there by an atomic rename).
    artifact_cache: Path | None = None
    artifact_source: str | None = None  # None: the NATS object store; else s3://bucket/prefix
    # Whose runtime profiles the sidecar applies (serving/machine.py); None: none.
    machine_class: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None

    @property
    def socket_path(self) -> Path:
        return self.run_dir / f"{self.worker_id}.sock"

    @property
    def log_path(self) -> Path:
        return self.run_dir / f"{self.worker_id}.log"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def command(self) -> list[str]:
        if self.runtime == "torch":
            runtime = [
                "--runtime-cmd", self.runtime_cmd, "--runtime-socket", str(self.socket_path)
            ]  # fmt: skip
        else:
            runtime = self.runtime_flags
        return [
            str(self.binary),
            *nats_options(self.nats_url).sidecar_args(),
            "--worker-id", self.worker_id,
            *runtime,
            "--memory-budget-bytes", str(self.memory_budget_bytes),
            "--artifact-cache", str(self.artifact_cache or self.run_dir / "artifacts"),
            *(["--metrics-addr", self.metrics_addr] if self.metrics_addr else []),
            *(["--artifact-source", self.artifact_source] if self.artifact_source else []),
            *(["--machine-class", self.machine_class] if self.machine_class else []),
            *self.extra_args,
        ]  # fmt: skip

    def start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            **nats_options(self.nats_url).sidecar_env(),
            **self.env,
        }
        # The runtime is started by `python -m serving...`: it must find the project.
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        with self.log_path.open("ab") as log_file:
            self.process = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=str(REPO_ROOT),
                start_new_session=True,  # own group: stop() kills the runtime with it
                preexec_fn=_die_with_parent,
            )

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL the sidecar alone (its runtime stays until :meth:`stop`): a crash."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM (the sidecar drains and shuts its runtime down), then kill the whole group."""
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        _kill_group(process.pid)

    def log_tail(self, lines: int = 20) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""


def _kill_group(pgid: int) -> None:
    """Whatever is left in the group (a runtime whose sidecar was killed) goes too."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            os.killpg(pgid, 0)
            time.sleep(0.1)
        os.killpg(pgid, signal.SIGKILL)


def port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


@dataclass
class StackConfig:
    home: Path
    workers: int = 1
    host: str = "127.0.0.1"
    port: int = 8700
    control_port: int = 8600
    nats_url: NatsTarget | None = None  # None: start an embedded nats-server
    nats_cluster: int = 1  # embedded nats-server nodes (3: a cluster with R3 streams and KV)
    require_auth: bool = True
    metrics_token: str | None = (
        None  # what the gateway's /metrics requires (TASKFLEET_METRICS_TOKEN)
    )
    memory_budget_bytes: int = 8 << 30
    sidecar_binary: Path | None = None
    device: str = "cpu"
    session_secret: str | None = None  # None: sessions end with the process
    secure_cookies: bool = False
    candle_workers: int = 0
    http_workers: int = 0
    probe_period_s: float = 60.0  # the endpoint watcher's period (serving/endpoint_watch.py)
    http_url: str | None = None
    http_model: str | None = None
    data_dir: Path | None = None  # root of the built-in suites' data (TASKFLEET_DATA_DIR)
    artifact_source: str | None = None  # None: the NATS object store; else s3://bucket/prefix
    forwarded_allow_ips: str | None = None  # proxies whose forwarded headers are believed
    allowed_hosts: list[str] | None = None  # the control plane's Host names; None: any
    model_roots: list[Path] = field(default_factory=list)  # where REST may register models
    # What the production loops' re-evaluations run against (docs: "Production"); None:
    # SQLite under home, no MLflow logging.
    database_url: str | None = None
    mlflow_uri: str | None = None
    production: bool = True  # run the production loops on the leader
    reevaluate: bool = True  # and, in them, the re-evaluations they queue

    def worker_kinds(self) -> list[tuple[str, int]]:
        return [
            ("torch", self.workers),
            ("candle", self.candle_workers),
            ("http", self.http_workers),
        ]


@dataclass(frozen=True)
class StackUrls:
    gateway: str
    control_plane: str
    nats: str
    workers: list[str]
    # Prometheus endpoints: the gateway's and each worker's.
    metrics: list[str] = field(default_factory=list)


def _production_loops(
    config: StackConfig, registry: AbstractStore, nats_url: NatsTarget
) -> Callable[[], list[ControlLoop]] | None:
    if not config.production:
        return None
    from evals.runner import EvalPaths
    from taskfleet.production import ShellPaths, production_loops

    paths = ShellPaths(
        home=config.home,
        database_url=config.database_url or f"sqlite:///{config.home / 'registry.db'}",
        data_root=config.data_dir,
        eval_paths=EvalPaths(
            cache_dir=config.home / "cache", mlflow_uri=config.mlflow_uri, data_root=config.data_dir
        ),
    )
    return production_loops(registry, nats_url, paths, reevaluate=config.reevaluate)


class QuietServer(uvicorn.Server):
    """A uvicorn server that leaves signal handling to the stack (one handler for all parts)."""

    def __init__(
        self,
        app: Any,
        host: str,
        port: int,
        log_level: str = "warning",
        *,
        forwarded_allow_ips: str | None = None,
    ) -> None:
        super().__init__(
            http_config(app, host, port, log_level, forwarded_allow_ips=forwarded_allow_ips)
        )

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def run_stack(
    config: StackConfig,
    registry: Registry,
    on_ready: Callable[[StackUrls], None],
    stop: asyncio.Event | None = None,
) -> None:
    """Run until SIGINT/SIGTERM (or ``stop``); everything started is stopped on the way out."""
    from registry.api import create_app
    from serving.control import ControlLoops
    from serving.embedded_nats import EmbeddedNats, EmbeddedNatsCluster, free_port
    from serving.gateway.app import GatewaySettings, create_gateway
    from serving.machine import machine_class

    if any(count < 0 for _, count in config.worker_kinds()):
        raise StackError("worker counts must be >= 0")
    if config.nats_cluster < 1:
        raise StackError("--nats-cluster must be >= 1")
    if config.nats_url and config.nats_cluster > 1:
        raise StackError("--nats-cluster starts NATS here; it cannot be combined with a NATS URL")
    for port in (config.port, config.control_port):
        if not port_free(config.host, port):
            raise StackError(f"port {config.host}:{port} is already in use; pick another")
    any_workers = any(count for _, count in config.worker_kinds())
    binary = find_sidecar_binary(config.sidecar_binary) if any_workers else None
    if binary is not None:
        check_sidecar_runtimes(binary, [kind for kind, count in config.worker_kinds() if count])
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    nats_nodes: list[EmbeddedNats] = []
    sidecars: list[SidecarProcess] = []
    tasks: list[asyncio.Task[None]] = []
    servers: list[QuietServer] = []
    control_loops: ControlLoops | None = None
    try:
        nats_url: NatsTarget
        if config.nats_url:
            nats_url = config.nats_url
        else:
            if config.nats_cluster > 1:
                cluster = EmbeddedNatsCluster(config.home / "nats-cluster", config.nats_cluster)
                nats_nodes = cluster.nodes
                await asyncio.to_thread(cluster.start)
                nats_url = cluster.url
            else:
                nats_nodes = [EmbeddedNats(config.home / "nats")]
                await asyncio.to_thread(nats_nodes[0].start)
                nats_url = nats_nodes[0].url
        await _ensure_layout(nats_url)

        # The control plane's NATS side, as `taskfleet serve` runs it: it leads unless another
        # control plane on this NATS already does.
        control_loops = ControlLoops(
            registry,
            nats_url,
            artifact_source=config.artifact_source,
            probe_period_s=config.probe_period_s,
            extra_loops=_production_loops(config, registry, nats_url),
        )
        from taskfleet.baseline_builder import fit_baseline
        from taskfleet.suite_registration import rest_suite_reader
        from taskfleet.variant_builder import build_variant

        control = create_app(
            registry,
            require_auth=config.require_auth,
            session_secret=config.session_secret,
            secure_cookies=config.secure_cookies,
            health=control_loops.describe,
            read_suite=rest_suite_reader(
                data_root=config.data_dir, mteb_dir=config.home / "suites"
            ),
            build_variant=build_variant,
            model_roots=config.model_roots,
            allowed_hosts=config.allowed_hosts,
            fit_baseline=functools.partial(fit_baseline, data_root=config.data_dir),
            metrics_token=config.metrics_token,
        )
        gateway = create_gateway(
            nats_url,
            GatewaySettings(require_auth=config.require_auth, metrics_token=config.metrics_token),
        )
        forwarded = config.forwarded_allow_ips
        servers = [
            QuietServer(control, config.host, config.control_port, forwarded_allow_ips=forwarded),
            QuietServer(gateway, config.host, config.port, forwarded_allow_ips=forwarded),
        ]
        tasks += [asyncio.create_task(s.serve()) for s in servers]
        tasks.append(asyncio.create_task(control_loops.run()))

        run_dir = config.home / "run"
        host = socket.gethostname().split(".")[0] or "local"
        for kind, count in config.worker_kinds():
            for i in range(count):
                assert binary is not None
                sidecar = SidecarProcess(
                    binary=binary,
                    nats_url=nats_url,
                    # torch workers keep the ids they had before runtimes existed
                    worker_id=f"{host}-w{i}" if kind == "torch" else f"{host}-{kind}{i}",
                    run_dir=run_dir,
                    memory_budget_bytes=config.memory_budget_bytes,
                    metrics_addr=f"{config.host}:{free_port(config.host)}",
                    runtime_cmd=runtime_command(device=config.device),
                    runtime=kind,
                    runtime_flags=runtime_args(
                        kind, http_url=config.http_url, http_model=config.http_model
                    )
                    if kind != "torch"
                    else [],
                    artifact_source=config.artifact_source,
                    machine_class=machine_class(config.device if kind == "torch" else "cpu"),
                )
                sidecar.start()
                sidecars.append(sidecar)

        await _wait_started(servers)
        await _wait_runtimes(sidecars, stop)
        if stop.is_set():  # Ctrl-C while the runtimes started: never say ready
            return
        gateway_url = f"http://{config.host}:{config.port}"
        on_ready(
            StackUrls(
                gateway=gateway_url,
                control_plane=f"http://{config.host}:{config.control_port}",
                nats=nats_options(nats_url).url,
                workers=[s.worker_id for s in sidecars],
                metrics=[f"{gateway_url}/metrics"]
                + [f"http://{s.metrics_addr}/metrics" for s in sidecars],
            )
        )
        children = [_sidecar_child(s) for s in sidecars]
        children[:0] = [_nats_child(node) for node in nats_nodes]
        await supervise(children, stop)
    finally:
        for server in servers:
            server.should_exit = True
        await asyncio.gather(*(asyncio.to_thread(s.stop) for s in sidecars))
        if control_loops is not None:
            control_loops.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 15)
        await asyncio.gather(*(asyncio.to_thread(node.stop) for node in nats_nodes))
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


async def _ensure_layout(url: NatsTarget) -> None:
    from serving.connection import connect_once
    from serving.nats_layout import ensure_layout

    try:
        nc = await connect_once(url, name="taskfleet-up")
    except Exception as exc:
        raise StackError(f"cannot reach NATS at {url}: {exc or type(exc).__name__}") from None
    try:
        await ensure_layout(nc.jetstream())
    finally:
        await nc.close()


async def _wait_started(servers: list[QuietServer], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(s.started for s in servers):
        if time.monotonic() > deadline:
            raise StackError("the HTTP servers did not start in time")
        await asyncio.sleep(0.05)


# How long `up` waits for its workers' runtimes before it says it is ready all the same: the
# sidecar's own `--runtime-start-timeout-ms` default (both read it from contract/shared.toml),
# after which it starts the runtime again.
RUNTIMES_UP_TIMEOUT_S = contract.WORKER.runtime_start_timeout_s


def runtime_up(metrics_addr: str) -> bool:
    """Whether a sidecar's runtime is connected: its /metrics says `taskfleet_sidecar_runtime_up
    1` (the runtime answered `hello`, so it has imported its model libraries)."""
    import httpx

    try:
        text = httpx.get(f"http://{metrics_addr}/metrics", timeout=2.0).text
    except httpx.HTTPError:
        return False
    return re.search(r"^taskfleet_sidecar_runtime_up 1$", text, flags=re.M) is not None


async def _wait_runtimes(
    sidecars: list[SidecarProcess],
    stop: asyncio.Event,
    timeout_s: float = RUNTIMES_UP_TIMEOUT_S,
    poll_s: float = 0.25,
) -> None:
    """Wait until every worker's runtime is up, so that `up` says it is ready (stack.json, its
    URLs) only when a request can be run: a Python runtime imports sentence-transformers before
    it listens (15 CPU-s here, 50 s of wall time on a starved machine), and a first request
    sent before that waited for it inside its deadline. Bounded: past ``timeout_s`` (or for a
    sidecar that exited, which `supervise` starts again) `up` goes on, and says which worker
    is not up; its tasks' requests wait in the queue until it is."""
    waiting = [s for s in sidecars if s.metrics_addr]
    if not waiting:
        return
    log.info(
        "waiting for %d worker runtime(s) to start (each imports its model libraries first)",
        len(waiting),
    )
    started = time.monotonic()
    exited = 0
    while waiting and not stop.is_set():
        up = await asyncio.gather(
            *(asyncio.to_thread(runtime_up, str(s.metrics_addr)) for s in waiting)
        )
        down, waiting = [s for s, is_up in zip(waiting, up, strict=True) if not is_up], []
        for s in down:
            if s.running():
                waiting.append(s)
            else:
                exited += 1
                log.warning("worker %s exited before its runtime was up (see %s)", s.worker_id,
                            s.log_path)  # fmt: skip
        if not waiting:
            log.info(
                "worker runtimes up in %.1f s%s",
                time.monotonic() - started,
                f" (not waited for: {exited} that exited)" if exited else "",
            )
            return
        if time.monotonic() - started > timeout_s:
            for s in waiting:
                log.warning(
                    "worker %s: runtime not up after %.0f s (see %s); starting anyway, its "
                    "tasks' requests wait in the queue until it is",
                    s.worker_id,
                    timeout_s,
                    s.log_path,
                )
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), poll_s)


@dataclass
class Child:
    """A supervised child process: how to tell it runs, and how to start it again."""

    name: str
    running: Callable[[], bool]
    restart: Callable[[], None]
    describe_exit: Callable[[], str] = lambda: ""
    backoff_s: float = 0.0
    next_start: float = 0.0
    up_since: float = field(default_factory=time.monotonic)


# The first restart is immediate; a child that keeps dying waits 1, 2, 4 ... 30 s; one that
# stayed up this long counts as healthy again.
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0
HEALTHY_AFTER_S = 60.0


async def supervise(children: list[Child], stop: asyncio.Event, poll_s: float = 0.5) -> None:
    """Start again every child that died, with back-off, until ``stop`` is set."""
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), poll_s)
        for child in children:
            if stop.is_set():
                return
            now = time.monotonic()
            if child.running():
                if now - child.up_since > HEALTHY_AFTER_S:
                    child.backoff_s = 0.0
                continue
            if now < child.next_start:
                continue
            log.warning("%s exited%s; starting it again", child.name, child.describe_exit())
            try:
                await asyncio.to_thread(child.restart)
            except Exception as exc:
                log.error("could not start %s again: %s", child.name, exc)
            child.up_since = time.monotonic()
            child.next_start = child.up_since + child.backoff_s
            child.backoff_s = min(max(child.backoff_s * 2, FIRST_BACKOFF_S), MAX_BACKOFF_S)


def _sidecar_child(sidecar: SidecarProcess) -> Child:
    def restart() -> None:
        if sidecar.pid:
            _kill_group(sidecar.pid)  # its runtime, if it outlived the sidecar
        sidecar.start()

    def describe_exit() -> str:
        code = sidecar.process.returncode if sidecar.process else None
        return f" ({code}); last log lines:\n{sidecar.log_tail()}"

    return Child(f"worker {sidecar.worker_id}", sidecar.running, restart, describe_exit)


def _nats_child(server: Any) -> Child:
    # Same port and store dir: clients reconnect by themselves, the queue is as it was.
    return Child(
        f"nats-server {server.url}",
        lambda: bool(server.running),
        server.start,
        lambda: f" (see {server.log_file})",
    )
