"""The fleet as separate machines would run it: every role its own OS process, started by the
`taskfleet` CLI, each with its own home, working directory and cache, nothing shared on disk.

- 3 nats-server nodes clustered by routes (streams, KV, object store at R3);
- PostgreSQL (Debian's package, its own cluster on a free port: ``testbed/postgres.py``);
- the control plane: ``taskfleet serve`` (REST API + dashboard + publisher + fleet watcher);
- gateways: ``taskfleet gateway`` (NATS only, API keys from the published directory);
- workers: ``taskfleet worker`` (sidecar + PyTorch runtime; NATS and its own cache dir only:
  models and adapters arrive through the NATS object store, verified by sha256).

The test process plays the operator on the control plane's host: it registers models in the
control plane's registry (same database and artifact store as ``serve``) and promotes through
the control plane's REST API with an admin key, as the dashboard does.

Used by ``benchmarks/scale_out.py`` (the full run with faults, ``make bench``) and by the
seconds-long tests in ``tests/test_machines.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import nats

from registry import Registry
from serving import protocol as p
from serving.embedded_nats import EmbeddedNatsCluster, free_port
from serving.nats_layout import TASKS_STREAM
from testbed.faults.injectors import children_of
from testbed.fleet import read_heartbeats, wait_until
from testbed.postgres import PostgresServer

# Seconds-scale settings a test can wait for; the shipped defaults otherwise.
WORKER_ENV = {
    "TASKFLEET_HEARTBEAT_MS": "500",
    "TASKFLEET_NAK_DELAY_MS": "200",
    "TASKFLEET_MAX_BATCH_WAIT_MS": "2",
    "RUST_LOG": "info,async_nats=warn",
}


@dataclass
class Role:
    """One role as one OS process: ``command`` run in ``home`` (its own folder), output in
    ``home/log``. ``kill`` is a crash (SIGKILL, children included); ``stop`` a clean exit."""

    name: str
    command: list[str]
    home: Path
    env: dict[str, str] = field(default_factory=dict)
    url: str = ""  # where it answers HTTP (gateway, control plane, worker metrics)
    process: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.home / "log"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self) -> Role:
        self.home.mkdir(parents=True, exist_ok=True)
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith("TASKFLEET_") and key not in ("HOME",)
        }
        env.update(
            HOME=str(self.home),
            TASKFLEET_HOME=str(self.home / ".taskfleet"),
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            PYTHONUNBUFFERED="1",
            **self.env,
        )
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.command,
                cwd=self.home,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL the process and what it started (a host that died)."""
        if self.process is None:
            return
        family = [self.process.pid, *children_of(self.process.pid)]
        for pid in family:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self, timeout_s: float = 20.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)

    def log_tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""


def taskfleet(*args: str) -> list[str]:
    """The `taskfleet` console script, as operators run it (``python -m`` would put the
    working directory on sys.path)."""
    script = Path(sys.executable).parent / "taskfleet"
    return [str(script), *args] if script.is_file() else [sys.executable, "-m", "taskfleet", *args]


class Machines:
    """The whole fleet as separate processes; ``start`` brings it up, ``stop`` down."""

    def __init__(
        self,
        root: Path,
        *,
        workers: int = 3,
        gateways: int = 2,
        nats_nodes: int = 3,
        worker_env: dict[str, str] | None = None,
        memory_budget_mb: int = 2048,
    ) -> None:
        self.root = root
        self.n_workers = workers
        self.n_gateways = gateways
        self.worker_env = {**WORKER_ENV, **(worker_env or {})}
        self.memory_budget_mb = memory_budget_mb
        self.nats = EmbeddedNatsCluster(root / "nats", nats_nodes)
        self.pg = PostgresServer()
        self.db_url = ""
        self.registry: Registry | None = None
        self.control: Role | None = None
        self.gateways: list[Role] = []
        self.workers: list[Role] = []
        self.admin_key = ""
        self.caller_key = ""

    # ---- lifecycle
    def start(self) -> Machines:
        try:
            # No layout made here: each role creates the streams and buckets it needs, as on
            # separate machines.
            self.nats.start()
            self.pg.start()
            self.db_url = self.pg.create_database("taskfleet")
            # The operator's registry on the control plane's host: same database, same
            # artifact store as `serve` (it uploads from there to the object store).
            self.registry = Registry.open(
                self.db_url, artifact_dir=self.control_home / ".taskfleet" / "artifacts"
            )
            _, self.admin_key = self.registry.create_api_key("ops", roles=["admin"])
            _, self.caller_key = self.registry.create_api_key("app", roles=["caller"])
            self.control = self._control_role().start()
            self.wait_control_leads()
            for i in range(self.n_gateways):
                self.gateways.append(self._gateway_role(i).start())
            for i in range(self.n_workers):
                self.workers.append(self._worker_role(i).start())
            for gateway in self.gateways:
                wait_until(functools.partial(_ready, gateway.url), timeout_s=90, every_s=0.2)
            wait_until(lambda: len(self.heartbeats()) >= self.n_workers, timeout_s=120)
        except BaseException:
            self.stop()
            raise
        return self

    def __enter__(self) -> Machines:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        for role in [*self.workers, *self.gateways]:
            role.stop()
        if self.control is not None:
            self.control.stop()
        if self.registry is not None:
            self.registry.close()
        self.nats.stop()
        self.pg.stop()

    @property
    def control_home(self) -> Path:
        return self.root / "control-plane"

    def _control_role(self) -> Role:
        port = free_port()
        return Role(
            "control-plane",
            taskfleet("serve", "--port", str(port), "--nats-url", self.nats.url),
            self.control_home,
            env={"TASKFLEET_DATABASE_URL": self.db_url},
            url=f"http://127.0.0.1:{port}",
        )

    def _gateway_role(self, i: int) -> Role:
        port = free_port()
        return Role(
            f"gateway-{i}",
            taskfleet("gateway", "--port", str(port), "--nats-url", self.nats.url),
            self.root / f"gateway-{i}",
            url=f"http://127.0.0.1:{port}",
        )

    def _worker_role(self, i: int) -> Role:
        home = self.root / f"worker-{i}"
        metrics = f"127.0.0.1:{free_port()}"
        command = taskfleet(
            "worker",
            "--nats-url", self.nats.url,
            "--cache-dir", str(home / "cache"),
            "--worker-id", f"worker-{i}",
            "--memory-budget-mb", str(self.memory_budget_mb),
        )  # fmt: skip
        env = {**self.worker_env, "TASKFLEET_METRICS_ADDR": metrics}
        return Role(f"worker-{i}", command, home, env=env, url=f"http://{metrics}")

    def restart_control(self) -> None:
        """A new control-plane process (after a kill), leading once the old lock expired."""
        assert self.control is not None
        self.control = Role(
            self.control.name,
            self.control.command,
            self.control.home,
            env=self.control.env,
            url=self.control.url,
        ).start()
        self.wait_control_leads()

    def restart_worker(self, index: int) -> None:
        old = self.workers[index]
        self.workers[index] = Role(old.name, old.command, old.home, old.env, old.url).start()

    def wait_control_leads(self, timeout_s: float = 90.0) -> None:
        def leads() -> bool:
            assert self.control is not None
            if not self.control.alive():
                raise AssertionError(f"control plane exited:\n{self.control.log_tail()}")
            try:
                health = httpx.get(f"{self.control.url}/healthz", timeout=5).json()
            except (httpx.HTTPError, ValueError):
                return False
            return bool(health.get("publisher") == "leader")

        wait_until(leads, timeout_s=timeout_s, every_s=0.3)

    # ---- the operator's side
    @property
    def reg(self) -> Registry:
        assert self.registry is not None
        return self.registry

    @property
    def cp(self) -> Role:
        """The control plane's process."""
        assert self.control is not None
        return self.control

    def rest(self, method: str, path: str, **kw: Any) -> httpx.Response:
        """A control-plane REST call as the admin (the dashboard's routes do the same)."""
        assert self.control is not None
        headers = {"Authorization": f"Bearer {self.admin_key}"}
        return httpx.request(
            method, f"{self.control.url}/api/v1{path}", headers=headers, timeout=60, **kw
        )

    def promote(self, task: str, candidate: str, **body: Any) -> httpx.Response:
        payload = {"candidate": candidate, "override": True, "reason": "scale-out run", **body}
        return self.rest("POST", f"/tasks/{task}/promote", json=payload)

    def rollback(self, task: str) -> httpx.Response:
        return self.rest("POST", f"/tasks/{task}/rollback", json={"reason": "scale-out run"})

    # ---- what the fleet says
    def heartbeats(self) -> dict[str, p.WorkerHeartbeat]:
        return asyncio.run(read_heartbeats(self.nats.url))

    def holders(self, task: str) -> list[str]:
        """Workers whose heartbeat lists a task loop for ``task``."""
        return sorted(w for w, b in self.heartbeats().items() if task in b.queue_depth)

    def serving(self, task: str, epoch: int, workers: int, timeout_s: float = 120.0) -> list[str]:
        """Until ``workers`` heartbeats report ``task`` at ``epoch`` or newer."""

        def probe() -> list[str]:
            done = [w for w, b in self.heartbeats().items() if b.epochs.get(task, 0) >= epoch]
            return sorted(done) if len(done) >= workers else []

        return wait_until(probe, timeout_s=timeout_s, every_s=0.3)

    def sidecar_metrics(self, index: int) -> str:
        return httpx.get(f"{self.workers[index].url}/metrics", timeout=10).text

    def tasks_stream_leader(self) -> int:
        """Index of the NATS node that leads the TASKS stream (the one to kill)."""
        name = asyncio.run(_stream_leader(self.nats.url))
        found = [i for i in range(len(self.nats.nodes)) if name.endswith(f"-n{i}")]
        return found[0] if found else 0

    def current_replicas(self) -> list[str]:
        """Server names of the TASKS stream's leader and its replicas that are current."""
        return asyncio.run(_current_replicas(self.nats.url))

    def cache_holds(self, index: int, sha256: str) -> bool:
        return (self.workers[index].home / "cache" / "artifacts" / "sha256" / sha256).is_dir()

    def logs(self) -> str:
        roles = [r for r in [self.control, *self.gateways, *self.workers] if r is not None]
        return "\n".join(f"--- {r.name}\n{r.log_tail()}" for r in roles)


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


async def _current_replicas(url: str) -> list[str]:
    nc = await nats.connect(servers=url.split(","))
    try:
        cluster = (await nc.jetstream().stream_info(TASKS_STREAM)).cluster
        if cluster is None:
            return []
        names = [cluster.leader] if cluster.leader else []
        return names + [str(peer.name) for peer in cluster.replicas or [] if peer.current]
    finally:
        await nc.close()


async def _stream_leader(url: str) -> str:
    nc = await nats.connect(servers=url.split(","))
    try:
        info = await nc.jetstream().stream_info(TASKS_STREAM)
        return str(info.cluster.leader) if info.cluster and info.cluster.leader else ""
    finally:
        await nc.close()
