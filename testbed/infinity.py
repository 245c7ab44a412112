"""A real infinity-emb 0.0.78 server on loopback, serving the packaged all-MiniLM-L6-v2.

infinity pins numpy<2 and sentence-transformers<4, so it lives in its own virtual environment
(`make infinity` -> .venv-infinity). It refuses an absolute path as model id, so it runs from
inside the model folder with model id ".". Used by tests/test_runtime_http.py and by
benchmarks/runtimes.py and benchmarks/peer.py.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx

from serving.embedded_nats import free_port

REPO = Path(__file__).resolve().parent.parent
INFINITY_VENV = Path(os.environ.get("INFINITY_VENV", REPO / ".venv-infinity"))
INFINITY_BIN = INFINITY_VENV / "bin" / "infinity_emb"
TORCH_ENGINE = ("--engine", "torch", "--no-bettertransformer", "--no-compile")


class InfinityServer:
    def __init__(
        self,
        model_dir: Path,
        log_path: Path,
        *,
        batch_size: int = 32,
        venv: Path = INFINITY_VENV,
        engine_args: Sequence[str] = TORCH_ENGINE,
        served_name: str | None = None,
    ) -> None:
        """``engine_args``: the engine and its options (default: torch, plain); ``served_name``:
        the model name requests carry (default: infinity's own, the model id ".")."""
        self.binary = venv / "bin" / "infinity_emb"
        if not self.binary.is_file():
            raise RuntimeError(f"{self.binary} is missing: run `make infinity` first")
        self.engine_args = list(engine_args)
        self.served_name = served_name
        self.model_dir = model_dir
        self.log_path = log_path
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.batch_size = batch_size
        self.process: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0

    def command(self) -> list[str]:
        named = ["--served-model-name", self.served_name] if self.served_name else []
        return [
            str(self.binary), "v2",
            "--model-id", ".", *named,
            "--device", "cpu",
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--batch-size", str(self.batch_size),
            *self.engine_args,
        ]  # fmt: skip

    def start(self, timeout_s: float = 300.0) -> InfinityServer:
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "INFINITY_ANONYMOUS_USAGE_STATS": "0",
            "DO_NOT_TRACK": "1",
        }
        self.started_at = time.monotonic()
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.command(),
                cwd=self.model_dir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"infinity exited at start:\n{self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/models", timeout=2).status_code == 200:
                    return self
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"infinity did not answer within {timeout_s:.0f}s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@contextlib.contextmanager
def running_infinity(model_dir: Path, log_path: Path) -> Iterator[InfinityServer]:
    server = InfinityServer(model_dir, log_path).start()
    try:
        yield server
    finally:
        server.stop()
