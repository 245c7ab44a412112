"""The socket protocol between a sidecar and its runtime (docs/protocol.md "Sidecar <-> runtime"):
one request type per op, its reply type, and the decoding of a frame's map into them.

Every request carries ``op`` and ``id`` (u64, chosen by the sidecar); every reply the same
``id`` and ``ok``. A failed op answers :class:`ErrorReply` with one of the
:class:`~serving.protocol.codes.SocketErrorCode` codes.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from serving.protocol.codec import from_wire
from serving.protocol.codes import ErrorInfo, ProtocolError, SocketErrorCode
from serving.protocol.floats import (
    embeddings_from_bytes,
    embeddings_to_bytes,
    floats_from_bytes,
    floats_to_bytes,
)

PROTOCOL_VERSION = 1
# A reply to a frame whose request id could not be read carries this id.
UNKNOWN_REQUEST_ID = 0

TextKind = Literal["query", "passage"]


# ---- requests


@dataclass(frozen=True, kw_only=True)
class HelloRequest:
    op: Literal["hello"] = "hello"
    id: int
    protocol: int
    client: str


@dataclass(frozen=True, kw_only=True)
class LoadSettings:
    """How the runtime runs a model (a runtime profile's runtime knobs); None: its default."""

    intra_op_threads: int | None = None
    runtimes: int | None = None  # batches of the model the runtime runs at once
    max_padding: float | None = None
    engine: str | None = None  # "torch" or "onnx" (the same fp32 graph through ONNX Runtime)


@dataclass(frozen=True, kw_only=True)
class LoadRequest:
    op: Literal["load"] = "load"
    id: int
    model_key: str
    base_path: str
    adapter_path: str | None
    query_prefix: str
    passage_prefix: str
    max_seq_length: int | None
    settings: LoadSettings | None = None


@dataclass(frozen=True, kw_only=True)
class UnloadRequest:
    op: Literal["unload"] = "unload"
    id: int
    model_key: str


@dataclass(frozen=True, kw_only=True)
class InferItem:
    model_key: str
    kind: TextKind
    texts: list[str]


@dataclass(frozen=True, kw_only=True)
class InferRequest:
    op: Literal["infer"] = "infer"
    id: int
    batch_id: str
    items: list[InferItem]
    # Unix epoch ms after which nobody waits for the batch: a runtime that has not started it
    # by then drops it with DEADLINE_EXCEEDED. None: no deadline.
    deadline_ms: int | None = None
    # A shadow's batch (answers that reach no caller): run on the runtime's background thread
    # at the lowest CPU priority, so a champion's batch that arrives meanwhile gets the cores.
    background: bool = False


@dataclass(frozen=True, kw_only=True)
class ScoreItem:
    """Passages to score against one query with one model (a rerank request)."""

    model_key: str
    query: str
    passages: list[str]


@dataclass(frozen=True, kw_only=True)
class ScoreRequest:
    op: Literal["score"] = "score"
    id: int
    batch_id: str
    items: list[ScoreItem]
    deadline_ms: int | None = None  # as InferRequest's
    background: bool = False  # as InferRequest's


@dataclass(frozen=True, kw_only=True)
class ClassifyItem:
    model_key: str
    texts: list[str]


@dataclass(frozen=True, kw_only=True)
class ClassifyRequest:
    op: Literal["classify"] = "classify"
    id: int
    batch_id: str
    items: list[ClassifyItem]
    deadline_ms: int | None = None  # as InferRequest's
    background: bool = False  # as InferRequest's


@dataclass(frozen=True, kw_only=True)
class StatsRequest:
    op: Literal["stats"] = "stats"
    id: int


@dataclass(frozen=True, kw_only=True)
class ShutdownRequest:
    op: Literal["shutdown"] = "shutdown"
    id: int


SocketRequest = (
    HelloRequest
    | LoadRequest
    | UnloadRequest
    | InferRequest
    | ScoreRequest
    | ClassifyRequest
    | StatsRequest
    | ShutdownRequest
)
REQUEST_TYPES: dict[str, type[Any]] = {
    "hello": HelloRequest,
    "load": LoadRequest,
    "unload": UnloadRequest,
    "infer": InferRequest,
    "score": ScoreRequest,
    "classify": ClassifyRequest,
    "stats": StatsRequest,
    "shutdown": ShutdownRequest,
}


# ---- replies


@dataclass(frozen=True, kw_only=True)
class HelloReply:
    id: int
    ok: Literal[True] = True
    protocol: int
    runtime: str
    runtime_version: str
    capabilities: list[str]


@dataclass(frozen=True, kw_only=True)
class LoadReply:
    id: int
    ok: Literal[True] = True
    model_key: str
    memory_bytes: int


@dataclass(frozen=True, kw_only=True)
class UnloadReply:
    id: int
    ok: Literal[True] = True
    model_key: str
    memory_bytes: int


@dataclass(frozen=True, kw_only=True)
class InferResult:
    dims: int
    count: int
    embeddings: bytes

    @classmethod
    def from_matrix(cls, matrix: np.ndarray) -> InferResult:
        count, dims, data = embeddings_to_bytes(matrix)
        return cls(dims=dims, count=count, embeddings=data)

    def matrix(self) -> np.ndarray:
        return embeddings_from_bytes(self.embeddings, self.count, self.dims)


@dataclass(frozen=True, kw_only=True)
class InferReply:
    id: int
    ok: Literal[True] = True
    batch_id: str
    results: list[InferResult]


@dataclass(frozen=True, kw_only=True)
class ScoreResult:
    """Scores of one score item: little-endian float32, one per passage in request order."""

    count: int
    scores: bytes

    @classmethod
    def from_array(cls, scores: np.ndarray) -> ScoreResult:
        return cls(count=int(scores.shape[0]), scores=floats_to_bytes(scores))

    def array(self) -> np.ndarray:
        return floats_from_bytes(self.scores, self.count, 1)[:, 0]


@dataclass(frozen=True, kw_only=True)
class ScoreReply:
    id: int
    ok: Literal[True] = True
    batch_id: str
    results: list[ScoreResult]


@dataclass(frozen=True, kw_only=True)
class ClassifyResult:
    """Label probabilities of one classify item: ``count x len(labels)`` float32 rows."""

    count: int
    labels: list[str]
    probabilities: bytes

    @classmethod
    def from_matrix(cls, labels: list[str], matrix: np.ndarray) -> ClassifyResult:
        return cls(count=int(matrix.shape[0]), labels=labels, probabilities=floats_to_bytes(matrix))

    def matrix(self) -> np.ndarray:
        return floats_from_bytes(self.probabilities, self.count, len(self.labels))


@dataclass(frozen=True, kw_only=True)
class ClassifyReply:
    id: int
    ok: Literal[True] = True
    batch_id: str
    results: list[ClassifyResult]


@dataclass(frozen=True, kw_only=True)
class ModelStats:
    model_key: str
    # What unloading this key alone would free now: its adapter, plus the base when it is the
    # last key on that base. The sum over models can be below the total for shared bases.
    memory_bytes: int
    base_key: str


@dataclass(frozen=True, kw_only=True)
class StatsReply:
    id: int
    ok: Literal[True] = True
    memory_bytes: int
    models: list[ModelStats]
    queue_depth: int


@dataclass(frozen=True, kw_only=True)
class ShutdownReply:
    id: int
    ok: Literal[True] = True


@dataclass(frozen=True, kw_only=True)
class ErrorReply:
    id: int
    ok: Literal[False] = False
    error: ErrorInfo


REPLY_TYPES: dict[str, type[Any]] = {
    "hello": HelloReply,
    "load": LoadReply,
    "unload": UnloadReply,
    "infer": InferReply,
    "score": ScoreReply,
    "classify": ClassifyReply,
    "stats": StatsReply,
    "shutdown": ShutdownReply,
}


def decode_request(obj: Any) -> SocketRequest:
    """Turn a decoded frame into a typed socket request (``op`` selects the type)."""
    request_id = obj.get("id") if isinstance(obj, dict) else None
    if not isinstance(request_id, int) or isinstance(request_id, bool) or request_id < 0:
        raise ProtocolError("request has no valid 'id' (u64)")
    op = obj.get("op")
    cls = REQUEST_TYPES.get(op) if isinstance(op, str) else None
    if cls is None:
        raise ProtocolError(
            f"unknown op {op!r}; expected one of {', '.join(REQUEST_TYPES)}",
            code=SocketErrorCode.UNKNOWN_OP,
            request_id=request_id,
        )
    try:
        return typing.cast(SocketRequest, from_wire(cls, obj))
    except ProtocolError as exc:
        raise ProtocolError(str(exc), code=exc.code, request_id=request_id) from exc


def decode_reply(op: str, obj: Any) -> Any:
    """Typed reply to a request of ``op``: its reply type, or :class:`ErrorReply`."""
    if isinstance(obj, dict) and obj.get("ok") is False:
        return from_wire(ErrorReply, obj)
    return from_wire(REPLY_TYPES[op], obj)
