"""What goes to streams ``SAMPLES`` and ``FEEDBACK`` (docs/protocol.md "Production streams").

A gateway samples a share of a task's requests (the task's ``sample_rate``, decided from the
request id so every gateway decides alike). For a sampled request it publishes, once the
champion answered, a :class:`ChampionSample` to ``samples.<task>.<request id>.champion``: the
queue payload it published (the inputs), the champion's reply (data inline), who answered and
how fast. When the task has a shadow it also published a copy of the request to
``shadow.<task>`` whose reply subject is ``samples.<task>.<request id>.shadow``: the shadow's
worker sends its reply there as it would to a gateway (the stream acknowledges it), so the
shadow's answer lands in the stream and never reaches a caller. Both messages carry the task's
retention as their TTL (``Nats-TTL``): the stream deletes the inputs when it ends.

Feedback (``POST /v1/feedback``) becomes a :class:`Feedback` on
``feedback.<task>.<request id>.<input index>``; the stream keeps the first per subject and
refuses the next, so feedback is recorded once whichever gateway took it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal

from serving import protocol as p

ROLE_CHAMPION = "champion"
ROLE_SHADOW = "shadow"
# How long a shadow copy may wait for its champion's workers to be idle before the shadow
# sheds it (its Tf-Deadline): a copy that cannot run soon is not worth running at all.
SHADOW_DEADLINE_MS = 2_000
HEADER_TTL = "Nats-TTL"


def sampled(request_id: str, rate: float) -> bool:
    """Whether a request is sampled at ``rate``: decided by the request id's hash, so every
    gateway (and a test) decides the same for the same id."""
    if rate <= 0:
        return False
    if rate >= 1:
        return True
    draw = int.from_bytes(hashlib.sha256(request_id.encode()).digest()[:8], "big") / 2**64
    return draw < rate


def ttl_header(retention_s: float) -> str:
    """``Nats-TTL`` of a message kept ``retention_s`` seconds (whole seconds, at least 1)."""
    return f"{max(1, int(retention_s))}s"


@dataclass(frozen=True, kw_only=True)
class ChampionSample:
    """``samples.<task>.<request id>.champion``: a sampled request as its gateway answered it."""

    v: Literal[1] = 1
    task: str
    kind: str  # the task's kind: retrieval, rerank, classification
    request_id: str
    ts_ms: int  # when the gateway queued it (unix ms)
    payload: bytes  # the queue payload it published, inputs inline (serving/protocol.py)
    reply: bytes  # the champion's ok reply message, data inline
    candidate: str  # the champion candidate its placement names
    latency_ms: float  # queued -> answered, at the gateway
    shadow: str | None  # the shadow candidate a copy went to; None: no shadow
    key: str | None  # the caller's API key name; None with auth off

    def inputs(self) -> p.TaskPayload:
        return p.decode_task_payload(p.unpack(self.payload))

    def answer(self) -> p.AnyReplyOk:
        reply = p.decode_reply_message(p.unpack(self.reply))
        if isinstance(reply, p.ReplyError):
            raise p.ProtocolError("a champion sample holds an error reply")
        return reply


@dataclass(frozen=True, kw_only=True)
class Feedback:
    """``feedback.<task>.<request id>.<index>``: what a caller said about one input."""

    v: Literal[1] = 1
    task: str
    request_id: str
    index: int
    label: str | None = None  # classification
    relevant: list[int] | None = None  # rerank: indexes into the request's documents
    relevant_ids: list[str] | None = None  # retrieval: ids of the suite's corpus
    key: str | None = None
    ts_ms: int


def encode(record: ChampionSample | Feedback) -> bytes:
    return p.pack(record)


def decode_sample(data: bytes) -> ChampionSample:
    return p.from_wire(ChampionSample, p.unpack(data))


def decode_feedback(data: bytes) -> Feedback:
    return p.from_wire(Feedback, p.unpack(data))
