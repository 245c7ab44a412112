"""The control plane's production consumers: streams ``SAMPLES`` and ``FEEDBACK`` into the
registry, durably (docs/architecture.md "Production").

The leading control plane runs one :class:`ProductionConsumer` on the durable pull consumers
``control_samples`` and ``control_feedback``. A message is acked only once the registry holds
what it says, so a control plane killed mid-way loses nothing: the next leader gets the
unacked messages again, and the registry keeps each sample and each labelled item once.

- ``samples.<task>.<id>.champion`` (a gateway's :class:`~serving.sample_records.ChampionSample`):
  the judge turns it into the sample row (who answered, how fast, the features drift reads).
- ``samples.<task>.<id>.shadow`` (the shadow worker's reply): the judge compares it with the
  champion's reply, read back from the stream, and the row gets the shadow's side; the message
  is deleted then (the gateway's TTL is on the champion record only). A shadow reply that
  arrives before its champion record waits (nak with a delay) until it is kept.
- ``feedback.<task>.<id>.<index>``: joined with the champion record (its inputs) into a
  labelled live item, in the form the task's suite reads. Feedback about a sample the stream
  no longer holds (its retention ended) is dropped, counted in the log.

The judge is the shell's (``taskfleet/production.py``): it knows suites and models, which this
module, on the NATS side, does not.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from httpapi.errors import ErrorCode
from registry import RegistryError
from registry import entities as e
from registry.store import ControlLoopStore
from serving import nats_layout
from serving import protocol as p
from serving.connection import NatsTarget, connect_forever
from serving.sample_records import (
    ROLE_CHAMPION,
    ROLE_SHADOW,
    ChampionSample,
    Feedback,
    decode_feedback,
    decode_sample,
)

log = logging.getLogger("taskfleet.production")

FETCH_BATCH = 64
# A shadow reply whose champion record has not been kept yet is looked at again this much later.
WAIT_FOR_CHAMPION_S = 1.0
# Per message, how often: a shadow reply whose champion record never comes is dropped after.
MAX_DELIVER = 30


class Judge(Protocol):
    """What the control plane makes of production traffic (``taskfleet/production.py``)."""

    def sample(self, record: ChampionSample) -> e.SampleCreate:
        """The row of a sampled request: who answered, how fast, the drift features."""

    def agreement(
        self, record: ChampionSample, shadow: p.AnyReplyOk
    ) -> tuple[list[float], dict[str, list[float]]]:
        """Per input, the headline agreement of the shadow's reply with the champion's, and
        the kind's other measures."""

    def live_item(self, record: ChampionSample, feedback: Feedback) -> e.LiveItemCreate:
        """The labelled item feedback makes of the sampled input (``ValueError``: unusable)."""


@dataclass
class Counts:
    samples: int = 0
    shadow: int = 0
    feedback: int = 0
    dropped: int = 0


class ProductionConsumer:
    """Consumes ``SAMPLES`` and ``FEEDBACK`` until stopped; ``run(nc)`` on the leader's
    connection (the ``ControlLoops`` loop shape)."""

    def __init__(
        self,
        registry: ControlLoopStore,
        nats_url: NatsTarget,
        judge: Judge,
        *,
        idle_s: float = 1.0,
        on_item: Callable[[e.LiveItem], None] | None = None,
    ) -> None:
        self.registry = registry
        self.nats_url = nats_url
        self.judge = judge
        self.idle_s = idle_s
        self.on_item = on_item
        self.counts = Counts()
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    async def run(self, nc: NATS | None = None) -> None:
        own = nc is None
        if nc is None:
            nc = await connect_forever(self.nats_url, self._stop, name="taskfleet-production")
        if nc is None:
            return
        try:
            while not self._stop.is_set():
                try:
                    await self._consume(nc)
                except (nats.errors.Error, OSError, TimeoutError) as exc:
                    log.warning("production consumer: %r; retrying", exc)
                    await self._sleep(1.0)
        finally:
            if own:
                await nc.close()

    async def _consume(self, nc: NATS) -> None:
        js = nc.jetstream()
        layout = await nats_layout.ensure_layout(js)
        samples = await _subscribe(
            js, nats_layout.SAMPLES_STREAM, nats_layout.SAMPLES_CONSUMER,
            nats_layout.SAMPLES_SUBJECT_PREFIX,
        )  # fmt: skip
        feedback = await _subscribe(
            js, nats_layout.FEEDBACK_STREAM, nats_layout.FEEDBACK_CONSUMER,
            nats_layout.FEEDBACK_SUBJECT_PREFIX,
        )  # fmt: skip
        while not self._stop.is_set():
            got = 0
            for sub, handle in ((samples, self._on_sample), (feedback, self._on_feedback)):
                try:
                    messages = await sub.fetch(FETCH_BATCH, timeout=self.idle_s / 2)
                except TimeoutError:  # nothing waiting (nats-py raises either kind)
                    continue
                got += len(messages)
                for msg in messages:
                    await self._settle(msg, handle, js, layout)
            if not got:
                await self._sleep(0.05)

    async def _settle(
        self,
        msg: Msg,
        handle: Callable[[Msg, JetStreamContext, nats_layout.Layout], object],
        js: JetStreamContext,
        layout: nats_layout.Layout,
    ) -> None:
        try:
            outcome = await handle(msg, js, layout)  # type: ignore[misc]
        except RegistryError as exc:
            # The database is away (or refused): keep the message for later.
            log.warning("production: %s; the message waits", exc)
            await msg.nak(delay=2.0)
            return
        except (p.ProtocolError, ValueError, KeyError) as exc:
            self.counts.dropped += 1
            log.warning("production: dropping %s: %s", msg.subject, exc)
            await msg.term()
            return
        if outcome == "later":
            if msg.metadata.num_delivered >= MAX_DELIVER:
                self.counts.dropped += 1
                log.warning("production: %s never found its champion record", msg.subject)
                await msg.term()
            else:
                await msg.nak(delay=WAIT_FOR_CHAMPION_S)
            return
        await msg.ack()

    async def _on_sample(
        self, msg: Msg, js: JetStreamContext, layout: nats_layout.Layout
    ) -> str | None:
        task, request_id, role = _subject_parts(msg.subject, nats_layout.SAMPLES_SUBJECT_PREFIX)
        if role == ROLE_CHAMPION:
            await self._keep(decode_sample(msg.data))
            return None
        if role != ROLE_SHADOW:
            raise ValueError(f"unknown sample role {role!r}")
        reply = p.decode_reply_message(p.unpack(msg.data))
        record = await champion_record(js, task, request_id)
        if record is None:
            return "later"
        if await asyncio.to_thread(self.registry.get_sample, request_id) is None:
            await self._keep(record)
        shadow_ms = max(0.0, msg.metadata.timestamp.timestamp() * 1000 - record.ts_ms)
        if isinstance(reply, p.ReplyError):
            shed = reply.error.code == ErrorCode.SHADOW_SHED
            outcome = e.ShadowOutcome(
                request_id,
                "shed" if shed else "error",
                shadow_ms=None if shed else shadow_ms,
                error=f"{reply.error.code}: {reply.error.message}",
            )
        else:
            if (ref := p.offloaded_data(reply)) is not None:
                reply = await _fetch_data(layout, reply, ref)
            values, extra = await asyncio.to_thread(self.judge.agreement, record, reply)
            outcome = e.ShadowOutcome(
                request_id, "ok", shadow_ms=shadow_ms, agreement=values, agreement_extra=extra
            )
        await asyncio.to_thread(self.registry.record_shadow_outcome, outcome)
        self.counts.shadow += 1
        # Its content is in the registry now; the gateway set no TTL on it (the shadow's worker
        # wrote it), so it is deleted here rather than kept for the streams' 90 days.
        with contextlib.suppress(nats.errors.Error, TimeoutError):
            await js.delete_msg(nats_layout.SAMPLES_STREAM, msg.metadata.sequence.stream)
        return None

    async def _keep(self, record: ChampionSample) -> None:
        sample = await asyncio.to_thread(self.judge.sample, record)
        if await asyncio.to_thread(self.registry.record_sample, sample):
            self.counts.samples += 1

    async def _on_feedback(
        self, msg: Msg, js: JetStreamContext, layout: nats_layout.Layout
    ) -> str | None:
        feedback = decode_feedback(msg.data)
        record = await champion_record(js, feedback.task, feedback.request_id)
        if record is None:
            self.counts.dropped += 1
            log.info("feedback on %s: its sample is no longer kept", feedback.request_id)
            return None
        item = await asyncio.to_thread(self.judge.live_item, record, feedback)
        kept = await asyncio.to_thread(self.registry.add_live_item, item)
        if kept is not None:
            self.counts.feedback += 1
            if self.on_item is not None:
                self.on_item(kept)
        return None

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)


async def _subscribe(
    js: JetStreamContext, stream: str, name: str, prefix: str
) -> JetStreamContext.PullSubscription:
    config = nats_layout.production_consumer_config(name, prefix)
    config.max_deliver = MAX_DELIVER
    return await js.pull_subscribe(prefix + ">", durable=name, stream=stream, config=config)


def _subject_parts(subject: str, prefix: str) -> tuple[str, str, str]:
    parts = subject.removeprefix(prefix).split(".")
    if len(parts) != 3:
        raise ValueError(f"unexpected subject {subject!r}")
    return parts[0], parts[1], parts[2]


async def champion_record(
    js: JetStreamContext, task: str, request_id: str
) -> ChampionSample | None:
    """The gateway's record of a sampled request, while the stream keeps it."""
    subject = nats_layout.sample_subject(task, request_id, ROLE_CHAMPION)
    try:
        message = await js.get_last_msg(nats_layout.SAMPLES_STREAM, subject)
    except NotFoundError:
        return None
    return decode_sample(message.data or b"")


async def _fetch_data(
    layout: nats_layout.Layout, reply: p.AnyReplyOk, ref: p.PayloadRef
) -> p.AnyReplyOk:
    """A shadow reply above max_payload carries its data in the object store: read, delete."""
    try:
        data = (await layout.payloads.get(ref.ref)).data or b""
    finally:
        with contextlib.suppress(nats.errors.Error, NotFoundError, TimeoutError):
            await layout.payloads.delete(ref.ref)
    if len(data) != reply.data_bytes:
        raise ValueError(
            f"the shadow reply's object holds {len(data)} bytes, not {reply.data_bytes}"
        )
    return reply.with_data(data)
