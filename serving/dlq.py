"""Dead letters: requests a worker gave up on, kept in stream ``DLQ`` for inspection and replay.

A sidecar copies the *original* message (headers and payload) to ``dlq.<task>`` and adds the
last error as header ``Tf-Error`` (sidecar/src/worker/outcome.rs). Replay publishes the original
payload to ``tasks.<task>`` again as a new request, so it runs once more through the fleet.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from datetime import datetime

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from contract import HEADERS
from serving import protocol as p
from serving.nats_layout import (
    DLQ_STREAM,
    DLQ_SUBJECT_PREFIX,
    check_task_name,
    ensure_layout,
    task_subject,
)


class DeadLetterNotFound(LookupError):
    """No dead letter with that sequence number (or not of that task)."""


@dataclass(frozen=True)
class DeadLetter:
    seq: int
    task: str
    request_id: str
    error: str
    time: datetime | None
    headers: dict[str, str]
    payload: bytes

    @property
    def summary(self) -> str:
        """What the request asked for, without printing its texts (they may be private)."""
        try:
            payload = p.from_wire(p.QueuePayload, p.unpack(self.payload))
        except p.ProtocolError:
            return f"undecodable payload ({len(self.payload)} bytes)"
        if isinstance(payload.inputs, p.PayloadRef):
            return f"{payload.kind} inputs in object store ({payload.inputs.ref})"
        return f"{len(payload.inputs)} {payload.kind} text(s)"


def _subject(task: str | None) -> str:
    return DLQ_SUBJECT_PREFIX + (check_task_name(task) if task else ">")


async def list_dead_letters(
    js: JetStreamContext, task: str | None = None, limit: int = 100
) -> list[DeadLetter]:
    """The oldest ``limit`` dead letters (of one task, or all)."""
    await ensure_layout(js)
    letters: list[DeadLetter] = []
    seq = 1
    while len(letters) < limit:
        try:
            raw = await js.get_msg(DLQ_STREAM, seq=seq, subject=_subject(task), next=True)
        except NotFoundError:
            break
        assert raw.seq is not None
        letters.append(
            _letter(raw.seq, raw.subject or "", raw.headers or {}, raw.data or b"", raw.time)
        )
        seq = raw.seq + 1
    return letters


async def get_dead_letter(js: JetStreamContext, seq: int) -> DeadLetter:
    try:
        raw = await js.get_msg(DLQ_STREAM, seq=seq)
    except NotFoundError:
        raise DeadLetterNotFound(f"no dead letter #{seq}") from None
    return _letter(seq, raw.subject or "", raw.headers or {}, raw.data or b"", raw.time)


def _letter(
    seq: int, subject: str, headers: dict[str, str], data: bytes, time: datetime | None
) -> DeadLetter:
    return DeadLetter(
        seq=seq,
        task=subject.removeprefix(DLQ_SUBJECT_PREFIX),
        request_id=headers.get(HEADERS.request_id) or headers.get(HEADERS.msg_id, ""),
        error=headers.get(HEADERS.error, ""),
        time=time,
        headers=dict(headers),
        payload=data,
    )


@dataclass(frozen=True)
class ReplayOutcome:
    seq: int
    task: str
    request_id: str
    reply: p.ReplyOk | p.ReplyError | None  # None: not waited for, or no reply in time


async def replay(
    nc: NATS,
    seqs: list[int],
    *,
    wait_s: float = 0.0,
    keep: bool = False,
) -> list[ReplayOutcome]:
    """Publish each dead letter's original payload to ``tasks.<task>`` as a new request.

    The new request gets a fresh id (the duplicate window would drop the old one) and no
    deadline (the old one has passed). With ``wait_s`` > 0 the worker's reply is awaited on a
    fresh inbox. The dead letter is deleted once JetStream has stored the replay, unless
    ``keep``; a replay that fails again comes back to the DLQ as a new dead letter.
    """
    js = nc.jetstream()
    letters = [await get_dead_letter(js, seq) for seq in seqs]
    outcomes: list[ReplayOutcome] = []
    for letter in letters:
        request_id = f"replay-{letter.seq}-{uuid.uuid4().hex[:8]}"
        # Not the last error, the old deadline and reply subject, nor the server's own headers.
        dropped = (HEADERS.error, HEADERS.deadline, HEADERS.reply)
        headers = {
            k: v
            for k, v in letter.headers.items()
            if k not in dropped and not k.startswith("Nats-")
        }
        headers[HEADERS.request_id] = request_id
        headers[HEADERS.msg_id] = request_id
        inbox_sub = None
        future: asyncio.Future[Msg] = asyncio.get_running_loop().create_future()
        if wait_s > 0:
            inbox = nc.new_inbox()
            headers[HEADERS.reply] = inbox

            async def on_reply(msg: Msg, fut: asyncio.Future[Msg] = future) -> None:
                if msg.reply:  # the worker acks the request once its reply is confirmed
                    await msg.respond(b"")
                if not fut.done():
                    fut.set_result(msg)

            inbox_sub = await nc.subscribe(inbox, cb=on_reply)
        try:
            await js.publish(task_subject(letter.task), letter.payload, headers=headers)
            if not keep:
                await js.delete_msg(DLQ_STREAM, letter.seq)
            reply: p.ReplyOk | p.ReplyError | None = None
            if inbox_sub is not None:
                try:
                    msg = await asyncio.wait_for(future, wait_s)
                    reply = _decode_reply(msg.data)
                except TimeoutError:
                    reply = None
        finally:
            if inbox_sub is not None:
                await inbox_sub.unsubscribe()
        outcomes.append(ReplayOutcome(letter.seq, letter.task, request_id, reply))
    return outcomes


def _decode_reply(data: bytes) -> p.ReplyOk | p.ReplyError:
    obj = p.unpack(data)
    if isinstance(obj, dict) and obj.get("ok") is False:
        return p.from_wire(p.ReplyError, obj)
    return p.from_wire(p.ReplyOk, obj)
