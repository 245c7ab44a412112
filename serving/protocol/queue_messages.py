"""Messages on the queue: the payload a gateway publishes to ``tasks.<task>`` (one type per op:
embed, score, classify), and the reply a worker sends to the request's reply subject (an ok
reply of the request's op, or an error). docs/protocol.md "JetStream" and "Replies".

Inputs above NATS's ``max_payload`` travel as a :class:`PayloadRef` into the object store
``payloads``, and so may an ok reply's float32 data.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Literal

import numpy as np

from serving.protocol.codec import from_wire
from serving.protocol.codes import ErrorInfo, ProtocolError
from serving.protocol.floats import embeddings_from_bytes, floats_from_bytes
from serving.protocol.socket_ops import TextKind


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
