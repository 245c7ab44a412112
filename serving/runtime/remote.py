"""Encode through a runtime other than the in-process PyTorch one: Candle or an HTTP engine.

Those runtimes live in the Rust sidecar. ``taskfleet-sidecar --serve-socket PATH --runtime
candle|http`` serves them over the same socket protocol the PyTorch runtime speaks
(docs/protocol.md), and :class:`RemoteEncoder` drives it with ``load``/``infer``
(:class:`RemoteScorer` with ``load``/``score``, for rerank): the eval harness scores a candidate
*through* a runtime with exactly the code that serves it. An endpoint model (an external
embeddings or rerank API, serving/endpoints.py) is reached through the http runtime this way; its
folder's record names the URL, so the runtime needs no ``http_base_url`` for it.

``RuntimeTarget`` names the runtime; :func:`open_encoder` gives an encoder for a ``ModelSpec``
on it (the in-process :class:`~serving.runtime.encoder.Encoder` for ``torch``).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from serving import protocol as p
from serving.runtime.encoder import Encoder, EncodeStats
from serving.runtime.model_folder import ModelLoadError, ModelSpec, TextKind

RUNTIME_KINDS = ("torch", "candle", "http")
# Texts per infer request: small enough for steady progress, large enough for the runtime's
# own token batching to sort by length.
TEXTS_PER_REQUEST = 256
# (query, passages) items per score request (a rerank query has ~30 passages).
ITEMS_PER_SCORE_REQUEST = 8


class RemoteRuntimeError(ModelLoadError):
    """The runtime could not be started or answered an error."""


@dataclass(frozen=True)
class RuntimeTarget:
    """Which runtime to encode with, and what it needs."""

    kind: str = "torch"
    sidecar_binary: Path | None = None  # candle and http run in the sidecar
    http_base_url: str | None = None
    http_model: str | None = None
    start_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if self.kind not in RUNTIME_KINDS:
            raise ValueError(f"unknown runtime {self.kind!r}; known: {', '.join(RUNTIME_KINDS)}")


class TextEncoder(Protocol):
    """What the eval harness needs of an encoder, whichever runtime it runs on."""

    spec: ModelSpec

    @property
    def max_seq_length(self) -> int: ...

    def iter_batches(
        self, texts: Sequence[str], kind: TextKind = "passage"
    ) -> Iterator[tuple[list[int], np.ndarray, EncodeStats]]: ...


def open_encoder(
    spec: ModelSpec, target: RuntimeTarget, *, max_batch_tokens: int | None = None
) -> TextEncoder:
    if target.kind == "torch":
        return Encoder(spec, max_batch_tokens=max_batch_tokens)
    return RemoteEncoder(spec, target)


class SocketClient:
    """A blocking client of one runtime socket (one request at a time)."""

    def __init__(self, path: Path, timeout_s: float = 600.0) -> None:
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout_s)
        self._sock.connect(str(path))
        self._next_id = 1

    def call(self, op: str, **fields: Any) -> Any:
        request = p.from_wire(p.REQUEST_TYPES[op], {"op": op, "id": self._next_id, **fields})
        self._next_id += 1
        self._sock.sendall(p.encode_frame(request))
        header = self._read(p.FRAME_HEADER.size)
        (length,) = p.FRAME_HEADER.unpack(header)
        reply = p.decode_reply(op, p.unpack(self._read(length)))
        if isinstance(reply, p.ErrorReply):
            raise RemoteRuntimeError(f"{op} failed: {reply.error.code}: {reply.error.message}")
        return reply

    def _read(self, n: int) -> bytes:
        chunks = bytearray()
        while len(chunks) < n:
            chunk = self._sock.recv(n - len(chunks))
            if not chunk:
                raise RemoteRuntimeError("the runtime closed the connection")
            chunks += chunk
        return bytes(chunks)

    def close(self) -> None:
        self._sock.close()


class SidecarRuntime:
    """``taskfleet-sidecar --serve-socket`` as a child process, stopped with :meth:`close`."""

    def __init__(self, target: RuntimeTarget) -> None:
        if target.sidecar_binary is None:
            raise RemoteRuntimeError(
                f"the {target.kind} runtime needs the taskfleet-sidecar binary"
            )
        self._dir = tempfile.TemporaryDirectory(prefix="taskfleet-runtime-")
        self.socket_path = Path(self._dir.name) / "runtime.sock"
        command = [
            str(target.sidecar_binary),
            "--runtime", target.kind,
            "--serve-socket", str(self.socket_path),
        ]  # fmt: skip
        if target.http_base_url:
            command += ["--http-base-url", target.http_base_url]
        if target.http_model:
            command += ["--http-model", target.http_model]
        self._log = open(Path(self._dir.name) / "sidecar.log", "w+b")  # noqa: SIM115
        env = {**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")}
        self.process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, env=env
        )
        try:
            self.client = self._connect(target.start_timeout_s)
            self.hello: p.HelloReply = self.client.call(
                "hello", protocol=p.PROTOCOL_VERSION, client="taskfleet-eval"
            )
        except BaseException:
            self.close()
            raise

    def _connect(self, timeout_s: float) -> SocketClient:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RemoteRuntimeError(f"the sidecar runtime exited at start:\n{self.log_tail()}")
            with contextlib.suppress(OSError):
                return SocketClient(self.socket_path)
            time.sleep(0.05)
        raise RemoteRuntimeError(f"the sidecar runtime did not listen within {timeout_s:.0f}s")

    def log_tail(self, lines: int = 20) -> str:
        self._log.flush()
        self._log.seek(0)
        return "\n".join(self._log.read().decode(errors="replace").splitlines()[-lines:])

    def close(self) -> None:
        client = getattr(self, "client", None)
        if client is not None and self.process.poll() is None:
            with contextlib.suppress(Exception):
                client.call("shutdown")
            client.close()
        if self.process.poll() is None:
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
        self._dir.cleanup()


class _RemoteModel:
    """One model loaded under :attr:`MODEL_KEY` on a sidecar runtime this object started."""

    MODEL_KEY = "eval"

    def __init__(self, spec: ModelSpec, target: RuntimeTarget) -> None:
        self.spec = spec
        self.target = target
        self.runtime = SidecarRuntime(target)
        try:
            self.runtime.client.call(
                "load",
                model_key=self.MODEL_KEY,
                base_path=str(spec.base_path),
                adapter_path=str(spec.adapter_path) if spec.adapter_path else None,
                query_prefix=spec.query_prefix,
                passage_prefix=spec.passage_prefix,
                max_seq_length=spec.max_seq_length,
            )
        except BaseException:
            self.runtime.close()
            raise

    @property
    def runtime_pid(self) -> int:
        """The runtime process, whose CPU and memory an eval counts as the candidate's cost."""
        return self.runtime.process.pid

    def close(self) -> None:
        self.runtime.close()


class RemoteEncoder(_RemoteModel):
    """Encodes a ``ModelSpec`` on the Candle or HTTP runtime of a sidecar it starts."""

    @property
    def max_seq_length(self) -> int:
        # The runtime applies the folder's own limit unless the spec overrides it; 0 marks
        # "the folder's" in cache keys, which the model fingerprint already covers.
        return self.spec.max_seq_length or 0

    def iter_batches(
        self, texts: Sequence[str], kind: TextKind = "passage"
    ) -> Iterator[tuple[list[int], np.ndarray, EncodeStats]]:
        for start in range(0, len(texts), TEXTS_PER_REQUEST):
            chunk = list(texts[start : start + TEXTS_PER_REQUEST])
            started = time.perf_counter()
            reply: p.InferReply = self.runtime.client.call(
                "infer",
                batch_id=f"eval-{start}",
                items=[{"model_key": self.MODEL_KEY, "kind": kind, "texts": chunk}],
            )
            elapsed = time.perf_counter() - started
            vectors = reply.results[0].matrix()
            stats = EncodeStats(
                items=len(chunk),
                # The gateway's estimate: the runtime does not report token counts.
                tokens=sum(max(1, len(t) // 4) for t in chunk),
                seconds=elapsed,
                batch_latencies=[elapsed],
            )
            yield list(range(start, start + len(chunk))), vectors, stats

    def encode(self, texts: Sequence[str], kind: TextKind = "passage") -> np.ndarray:
        parts = [vectors for _, vectors, _ in self.iter_batches(texts, kind)]
        return np.concatenate(parts) if parts else np.zeros((0, 0), dtype=np.float32)


class RemoteScorer(_RemoteModel):
    """Scores (query, passages) items with the runtime's ``score`` op: a bi-encoder's cosines
    or a rerank API's scores, as the runtime computes them for the fleet."""

    def score(
        self,
        items: Sequence[tuple[str, Sequence[str]]],
        stats: EncodeStats | None = None,
        on_batch: Callable[[int], None] | None = None,
    ) -> list[np.ndarray]:
        stats = stats if stats is not None else EncodeStats()
        out: list[np.ndarray] = []
        for start in range(0, len(items), ITEMS_PER_SCORE_REQUEST):
            chunk = items[start : start + ITEMS_PER_SCORE_REQUEST]
            started = time.perf_counter()
            reply: p.ScoreReply = self.runtime.client.call(
                "score",
                batch_id=f"eval-{start}",
                items=[
                    {"model_key": self.MODEL_KEY, "query": q, "passages": list(passages)}
                    for q, passages in chunk
                ],
            )
            elapsed = time.perf_counter() - started
            pairs = sum(len(passages) for _, passages in chunk)
            stats.add(
                EncodeStats(
                    items=pairs,
                    tokens=sum(len(q) // 4 + sum(len(d) // 4 for d in ds) for q, ds in chunk),
                    seconds=elapsed,
                    batch_latencies=[elapsed],
                )
            )
            out.extend(result.array() for result in reply.results)
            if on_batch is not None:
                on_batch(pairs)
        return out
