"""Wire messages of taskfleet, protocol version 1 (docs/protocol.md), as typed dataclasses.

Every message is a frozen dataclass whose field order *is* the msgpack map key order, so that
the Rust sidecar (serde struct field order) produces byte-identical encodings; the golden
vectors under ``tests/vectors/`` pin this down. Constant fields (``op``, ``ok``, ``v``) are
ordinary fields with a literal default so that they sit in their documented position.

Maps keyed by data (``queue_depth``, ``epochs``) are written with sorted keys, as a Rust
``BTreeMap`` would be, so the bytes never depend on insertion order.
"""

from __future__ import annotations

import asyncio
import struct
import types
import typing
from dataclasses import dataclass, fields, is_dataclass, replace
from enum import StrEnum
from typing import Any, ClassVar, Literal, TypeVar, Union

import msgpack
import numpy as np

PROTOCOL_VERSION = 1
DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024
FRAME_HEADER = struct.Struct(">I")
# A reply to a frame whose request id could not be read carries this id.
UNKNOWN_REQUEST_ID = 0

TextKind = Literal["query", "passage"]


class ErrorCode(StrEnum):
    BAD_REQUEST = "BAD_REQUEST"
    UNKNOWN_OP = "UNKNOWN_OP"
    MODEL_NOT_LOADED = "MODEL_NOT_LOADED"
    LOAD_FAILED = "LOAD_FAILED"
    INFER_FAILED = "INFER_FAILED"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"


RETRYABLE_CODES = frozenset({ErrorCode.MODEL_NOT_LOADED, ErrorCode.OUT_OF_MEMORY})


class ProtocolError(ValueError):
    """A message does not follow docs/protocol.md.

    ``code`` is the error code to answer with; ``request_id`` is the id of the offending request
    when it could be read, so the peer can match the error reply to its request.
    """

    def __init__(
        self,
        message: str,
        *,
        code: ErrorCode = ErrorCode.BAD_REQUEST,
        request_id: int | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.request_id = request_id


class FrameError(ProtocolError):
    """The byte stream itself is broken (truncated or oversized frame): drop the connection."""


# --------------------------------------------------------------------------- shared shapes


@dataclass(frozen=True, kw_only=True)
class ErrorInfo:
    """The one error shape: ``{"code", "message", "retryable"}``."""

    code: str
    message: str
    retryable: bool

    @classmethod
    def of(cls, code: ErrorCode, message: str) -> ErrorInfo:
        return cls(code=code.value, message=message, retryable=code in RETRYABLE_CODES)


# --------------------------------------------------------------------------- socket requests


@dataclass(frozen=True, kw_only=True)
class HelloRequest:
    op: Literal["hello"] = "hello"
    id: int
    protocol: int
    client: str


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


# --------------------------------------------------------------------------- socket replies


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


# --------------------------------------------------------------------------- queue and KV


@dataclass(frozen=True, kw_only=True)
class PayloadRef:
    """``inputs`` of a payload, or the float32 data of an ok reply (``embeddings``, ``scores``,
    ``probabilities``), moved to the ``payloads`` object store because it would not fit NATS's
    ``max_payload``."""

    ref: str


@dataclass(frozen=True, kw_only=True)
class QueuePayload:
    v: Literal[1] = 1
    task: str
    kind: TextKind
    inputs: list[str] | PayloadRef


@dataclass(frozen=True, kw_only=True)
class ScorePayload:
    """A rerank request on the queue: score ``documents`` against ``query``."""

    v: Literal[1] = 1
    task: str
    op: Literal["score"] = "score"
    query: str
    documents: list[str] | PayloadRef


@dataclass(frozen=True, kw_only=True)
class ClassifyPayload:
    v: Literal[1] = 1
    task: str
    op: Literal["classify"] = "classify"
    inputs: list[str] | PayloadRef


TaskPayload = QueuePayload | ScorePayload | ClassifyPayload


def decode_task_payload(obj: Any) -> TaskPayload:
    """A queue payload of any op: ``op`` absent means an embedding request."""
    op = obj.get("op") if isinstance(obj, dict) else None
    if op == "score":
        return from_wire(ScorePayload, obj)
    if op == "classify":
        return from_wire(ClassifyPayload, obj)
    return from_wire(QueuePayload, obj)


@dataclass(frozen=True, kw_only=True)
class ReplyOk:
    v: Literal[1] = 1
    request_id: str
    ok: Literal[True] = True
    model_key: str
    epoch: int
    dims: int
    count: int
    # The float32 bytes, or where they are in the object store (the gateway fetches them).
    embeddings: bytes | PayloadRef
    DATA: ClassVar[str] = "embeddings"

    @property
    def data_bytes(self) -> int:
        return self.count * self.dims * 4

    def with_data(self, data: bytes) -> ReplyOk:
        return replace(self, embeddings=data)

    def matrix(self) -> np.ndarray:
        return embeddings_from_bytes(inline_data(self), self.count, self.dims)


@dataclass(frozen=True, kw_only=True)
class ScoreReplyOk:
    v: Literal[1] = 1
    request_id: str
    ok: Literal[True] = True
    op: Literal["score"] = "score"
    model_key: str
    epoch: int
    count: int
    scores: bytes | PayloadRef  # as ReplyOk.embeddings
    DATA: ClassVar[str] = "scores"

    @property
    def data_bytes(self) -> int:
        return self.count * 4

    def with_data(self, data: bytes) -> ScoreReplyOk:
        return replace(self, scores=data)

    def array(self) -> np.ndarray:
        return floats_from_bytes(inline_data(self), self.count, 1)[:, 0]


@dataclass(frozen=True, kw_only=True)
class ClassifyReplyOk:
    v: Literal[1] = 1
    request_id: str
    ok: Literal[True] = True
    op: Literal["classify"] = "classify"
    model_key: str
    epoch: int
    count: int
    labels: list[str]
    probabilities: bytes | PayloadRef  # as ReplyOk.embeddings
    DATA: ClassVar[str] = "probabilities"

    @property
    def data_bytes(self) -> int:
        return self.count * len(self.labels) * 4

    def with_data(self, data: bytes) -> ClassifyReplyOk:
        return replace(self, probabilities=data)

    def matrix(self) -> np.ndarray:
        return floats_from_bytes(inline_data(self), self.count, len(self.labels))


AnyReplyOk = ReplyOk | ScoreReplyOk | ClassifyReplyOk


def inline_data(reply: AnyReplyOk) -> bytes:
    """An ok reply's float32 bytes (embeddings, scores or probabilities), once at hand."""
    data = getattr(reply, reply.DATA)
    if isinstance(data, PayloadRef):
        raise ProtocolError(f"the reply's {reply.DATA} are in the object store; fetch them first")
    return typing.cast(bytes, data)


def offloaded_data(reply: AnyReplyOk | ReplyError) -> PayloadRef | None:
    """Where an ok reply's float32 data is in the object store, if it was moved there."""
    if isinstance(reply, ReplyError):
        return None
    data = getattr(reply, reply.DATA)
    return data if isinstance(data, PayloadRef) else None


@dataclass(frozen=True, kw_only=True)
class ReplyError:
    v: Literal[1] = 1
    request_id: str
    ok: Literal[False] = False
    error: ErrorInfo


ARTIFACT_FORMAT = "tree-v1"


@dataclass(frozen=True, kw_only=True)
class Artifact:
    """A folder of files named by content: ``sha256`` is the registry's fingerprint (sha256
    over "relative path NUL file sha256 LF" of every file, in path order), ``size`` the sum of
    the file sizes, ``format`` how it travels (``tree-v1``: a manifest plus one object per file
    in the object store ``artifacts``)."""

    sha256: str
    size: int
    format: str = ARTIFACT_FORMAT


@dataclass(frozen=True, kw_only=True)
class ManifestFile:
    path: str
    sha256: str
    size: int


@dataclass(frozen=True, kw_only=True)
class ArtifactManifest:
    """Object ``tree.<sha256>`` of bucket ``artifacts``: the files of one artifact, in path
    order; each file's bytes are object ``file.<file sha256>`` (shared by every artifact that
    holds the same file)."""

    v: Literal[1] = 1
    format: str = ARTIFACT_FORMAT
    sha256: str
    size: int
    files: list[ManifestFile]


@dataclass(frozen=True, kw_only=True)
class PlacementValue:
    v: Literal[1] = 1
    task: str
    epoch: int
    candidate: str
    model_key: str
    # The weights by content: a worker fetches what its cache lacks from the object store
    # `artifacts` and loads only what hashes to these digests (serving/artifacts.py).
    base: Artifact
    adapter: Artifact | None
    query_prefix: str
    passage_prefix: str
    max_seq_length: int | None
    pinned: bool
    replicas: int
    memory_bytes: int
    # The runtime kind that serves it ("torch", "candle", "http"); only workers of that kind
    # run the task.
    runtime: str = "torch"


@dataclass(frozen=True, kw_only=True)
class WorkerHeartbeat:
    v: Literal[1] = 1
    worker_id: str
    host: str
    ts_ms: int
    loaded: list[str]
    memory_used: int
    memory_budget: int
    queue_depth: dict[str, int]
    runtimes: list[str]
    epochs: dict[str, int]
    # When the worker process started (unix ms); a new value under the same id is a restart.
    started_ms: int | None = None
    # The runtime kind this worker serves (its pool), fixed for the process; replicas are
    # chosen among the live workers of the placement's kind (sidecar/src/members.rs).
    runtime_kind: str | None = None


# --------------------------------------------------------------------------- embeddings


def embeddings_to_bytes(matrix: np.ndarray) -> tuple[int, int, bytes]:
    """Return ``(count, dims, little-endian float32 row-major bytes)`` of a 2-D matrix."""
    if matrix.ndim != 2:
        raise ValueError(f"embeddings must be a 2-D matrix, got shape {matrix.shape}")
    data = np.ascontiguousarray(matrix, dtype="<f4").tobytes()
    return int(matrix.shape[0]), int(matrix.shape[1]), data


def embeddings_from_bytes(data: bytes, count: int, dims: int) -> np.ndarray:
    """Inverse of :func:`embeddings_to_bytes`; checks the byte length against the shape."""
    return floats_from_bytes(data, count, dims)


def floats_to_bytes(values: np.ndarray) -> bytes:
    """Little-endian float32 bytes of a vector or a row-major matrix."""
    return np.ascontiguousarray(values, dtype="<f4").tobytes()


def floats_from_bytes(data: bytes, rows: int, columns: int) -> np.ndarray:
    """A ``rows x columns`` float32 matrix from little-endian bytes (length checked)."""
    if rows < 0 or columns < 0 or len(data) != rows * columns * 4:
        raise ProtocolError(f"{len(data)} bytes do not hold {rows} x {columns} float32")
    return np.frombuffer(data, dtype="<f4").reshape(rows, columns).astype(np.float32)


def decode_reply_message(obj: Any) -> AnyReplyOk | ReplyError:
    """A worker's reply on the gateway's reply subject: an error, or the ok reply of its op."""
    if not isinstance(obj, dict):
        raise ProtocolError("a reply must be a msgpack map")
    if obj.get("ok") is not True:
        return from_wire(ReplyError, obj)
    op = obj.get("op")
    if op == "score":
        return from_wire(ScoreReplyOk, obj)
    if op == "classify":
        return from_wire(ClassifyReplyOk, obj)
    return from_wire(ReplyOk, obj)


# --------------------------------------------------------------------------- map <-> dataclass

M = TypeVar("M")


def to_wire(message: Any) -> dict[str, Any]:
    """The msgpack-ready map of a message, keys in field order."""
    return {f.name: _to_wire_value(getattr(message, f.name)) for f in fields(message)}


def _to_wire_value(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return to_wire(value)
    if isinstance(value, list):
        return [_to_wire_value(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_wire_value(value[k]) for k in sorted(value)}
    return value


def from_wire(cls: type[M], obj: Any) -> M:
    """Build and type-check a message from a decoded map; raises :class:`ProtocolError`."""
    return typing.cast(M, _from_map(cls, obj, cls.__name__))


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        hints = typing.get_type_hints(cls)
        # The wire fields only: class constants (ClassVar) are not part of a message.
        _HINTS[cls] = {f.name: hints[f.name] for f in fields(cls)}
    return _HINTS[cls]


def _from_map(cls: type[Any], obj: Any, where: str) -> Any:
    if not isinstance(obj, dict):
        raise ProtocolError(f"{where}: expected a map, got {type(obj).__name__}")
    hints = _hints(cls)
    unknown = sorted(set(obj) - set(hints))
    if unknown:
        raise ProtocolError(f"{where}: unknown field(s) {', '.join(map(str, unknown))}")
    values: dict[str, Any] = {}
    for name, tp in hints.items():
        if name in obj:
            values[name] = _check(obj[name], tp, f"{where}.{name}")
        elif not _allows_none(tp):
            raise ProtocolError(f"{where}: missing field {name!r}")
        elif not _has_default(cls, name):
            values[name] = None
    return cls(**values)


def _has_default(cls: type[Any], name: str) -> bool:
    from dataclasses import MISSING

    return any(f.name == name and f.default is not MISSING for f in fields(cls))


def _allows_none(tp: Any) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType) and type(None) in typing.get_args(tp)


def _check(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is Literal:
        if not any(type(value) is type(a) and value == a for a in args):
            allowed = ", ".join(repr(a) for a in args)
            raise ProtocolError(f"{where}: expected one of {allowed}, got {value!r}")
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arm in (a for a in args if a is not type(None)):
            try:
                return _check(value, arm, where)
            except ProtocolError as exc:
                errors.append(str(exc))
        raise ProtocolError("; ".join(errors))
    if origin is list:
        if not isinstance(value, list):
            raise ProtocolError(f"{where}: expected a list, got {type(value).__name__}")
        return [_check(v, args[0], f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ProtocolError(f"{where}: expected a map, got {type(value).__name__}")
        return {
            _check(k, args[0], f"{where} key"): _check(v, args[1], f"{where}[{k!r}]")
            for k, v in value.items()
        }
    if is_dataclass(tp):
        return _from_map(typing.cast(type[Any], tp), value, where)
    # bool is an int subclass in Python but a distinct type on the wire.
    if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
        raise ProtocolError(f"{where}: expected {tp.__name__}, got {type(value).__name__}")
    return value


# --------------------------------------------------------------------------- requests/replies


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
            code=ErrorCode.UNKNOWN_OP,
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


# --------------------------------------------------------------------------- frames


def pack(message: Any) -> bytes:
    """msgpack bytes of a message (dataclass) or a plain map."""
    obj = to_wire(message) if is_dataclass(message) else message
    return typing.cast(bytes, msgpack.packb(obj, use_bin_type=True))


def unpack(data: bytes) -> Any:
    """Decode msgpack bytes; undecodable content raises :class:`ProtocolError`."""
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise ProtocolError(f"frame body is not valid msgpack: {exc}") from exc


def encode_frame(message: Any) -> bytes:
    body = pack(message)
    if len(body) > 0xFFFFFFFF:
        raise ValueError(f"message of {len(body)} bytes does not fit a frame")
    return FRAME_HEADER.pack(len(body)) + body


async def write_frame(writer: asyncio.StreamWriter, message: Any) -> None:
    writer.write(encode_frame(message))
    await writer.drain()


async def read_frame(
    reader: asyncio.StreamReader, max_bytes: int = DEFAULT_MAX_FRAME_BYTES
) -> dict[str, Any] | None:
    """Read one frame's map; ``None`` on a clean end of stream between frames.

    Raises :class:`FrameError` when the stream is broken (the connection cannot be trusted
    any more) and :class:`ProtocolError` when one frame's body is bad but the stream is intact.
    """
    try:
        header = await reader.readexactly(FRAME_HEADER.size)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise FrameError(f"stream ended inside a frame header ({len(exc.partial)} bytes)") from exc
    (length,) = FRAME_HEADER.unpack(header)
    if length > max_bytes:
        raise FrameError(f"frame of {length} bytes exceeds the limit of {max_bytes} bytes")
    try:
        body = await reader.readexactly(length)
    except asyncio.IncompleteReadError as exc:
        raise FrameError(f"stream ended after {len(exc.partial)} of {length} frame bytes") from exc
    obj = unpack(body)
    if not isinstance(obj, dict):
        raise ProtocolError(f"frame body must be a msgpack map, got {type(obj).__name__}")
    return obj
