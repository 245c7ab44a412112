"""A throwaway PostgreSQL server for a test session or a benchmark (Debian's postgresql package).

PostgreSQL refuses to run as root, so when we are root the server runs as the `postgres`
user that the package creates.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from serving.embedded_nats import free_port


def pg_bindir() -> Path | None:
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if Path(candidate, "initdb").is_file():
            return Path(candidate)
    found = shutil.which("initdb")
    return Path(found).parent if found else None


class PostgresServer:
    def __init__(self) -> None:
        bindir = pg_bindir()
        if bindir is None:
            raise RuntimeError("PostgreSQL is not installed: `make test` installs it (apt)")
        self.bindir = bindir
        self.port = free_port()
        self.datadir = Path(tempfile.mkdtemp(prefix="taskfleet-pg-"))
        self.as_root = os.geteuid() == 0
        self.proc: subprocess.Popen[bytes] | None = None

    def _cmd(self, *args: str) -> list[str]:
        return ["runuser", "-u", "postgres", "--", *args] if self.as_root else list(args)

    def start(self) -> str:
        """Start the server (initialising its data folder the first time; a server stopped
        with :meth:`halt` starts again on the same port with the same databases)."""
        if not (self.datadir / "PG_VERSION").is_file():
            self._initdb()
        return self._run()

    def _initdb(self) -> None:
        if self.as_root:
            shutil.chown(self.datadir, "postgres", "postgres")
        subprocess.run(
            self._cmd(
                str(self.bindir / "initdb"),
                "-D",
                str(self.datadir),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ),
            check=True,
            capture_output=True,
        )

    def _run(self) -> str:
        self.proc = subprocess.Popen(
            self._cmd(
                str(self.bindir / "postgres"),
                "-D",
                str(self.datadir),
                "-p",
                str(self.port),
                "-k",
                str(self.datadir),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "fsync=off",
                "-c",
                "synchronous_commit=off",
                "-c",
                "max_connections=200",
            ),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    break
            if self.proc.poll() is not None:
                raise RuntimeError("PostgreSQL exited during start-up")
            time.sleep(0.1)
        time.sleep(0.3)
        return self.url("postgres")

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(
            f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres", autocommit=True
        ) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def halt(self) -> None:
        """Stop the server as an outage would (fast shutdown, open connections cut), keeping
        its data: :meth:`start` brings it back."""
        if self.proc is not None:
            # pg_ctl's fast mode: SIGTERM alone is a *smart* shutdown, which waits for every
            # client (another process's pool) to leave, so the server would outlive this call
            # and a restart would find its lock file.
            subprocess.run(
                self._cmd(
                    str(self.bindir / "pg_ctl"), "stop", "-D", str(self.datadir),
                    "-m", "fast", "-w", "-t", "60",
                ),
                capture_output=True,
                timeout=90,
            )  # fmt: skip
            self.proc.wait(timeout=30)
            self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        shutil.rmtree(self.datadir, ignore_errors=True)
