"""Sampling at the gateway: a share of a task's requests is kept, and copied to its shadow.

For a sampled request (``serving/sample_records.py`` decides from its id at the task's rate):

- a copy goes to the task's shadow (when a live worker holds its placement) on
  ``shadow.<task>``: the same queue payload, its own message id, a short deadline (a copy that
  cannot run soon is shed by the shadow, never queued for long), and as reply subject the
  shadow's subject in stream ``SAMPLES``. It is published in the background: the caller never
  waits for it, and its reply never reaches the caller;
- once the champion answered, its :class:`~serving.sample_records.ChampionSample` is published to
  ``samples.<task>.<request id>.champion`` with the task's retention as TTL, before the caller
  gets the reply (so feedback about it is accepted at once); the reply then says
  ``X-Taskfleet-Sampled: 1``. A record above the inline limit, or one NATS does not take in
  ``RECORD_TIMEOUT_S``, is not kept (counted), and the reply is not marked sampled.

Nothing of this touches a database: the control plane consumes both streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

import nats.errors
from nats.js import JetStreamContext

from contract import HEADERS
from serving import nats_layout
from serving.gateway.metrics import GatewayMetrics
from serving.protocol import AnyReplyOk, PlacementValue, pack
from serving.sample_records import (
    HEADER_TTL,
    ROLE_CHAMPION,
    ROLE_SHADOW,
    SHADOW_DEADLINE_MS,
    ChampionSample,
    encode,
    sampled,
    ttl_header,
)

log = logging.getLogger(__name__)

RECORD_TIMEOUT_S = 1.0
SAMPLED_HEADER = "X-Taskfleet-Sampled"


@dataclass(frozen=True)
class Sampling:
    """What the gateway knows of sampling one task now (from its directory and placements)."""

    rate: float
    retention_s: float
    kind: str
    candidate: str  # the champion its placement names
    shadow: PlacementValue | None  # the shadow placement, when a live worker holds it
    key: str | None  # the caller's API key name

    def sampled(self, request_id: str) -> bool:
        return sampled(request_id, self.rate)


class Sampler:
    def __init__(self, metrics: GatewayMetrics, inline_limit_bytes: int) -> None:
        self.metrics = metrics
        self.inline_limit_bytes = inline_limit_bytes
        self._copies: set[asyncio.Task[None]] = set()

    def copy_to_shadow(
        self, js: JetStreamContext, task: str, request_id: str, payload: bytes, priority: int
    ) -> None:
        """Publish the shadow's copy in the background (never awaited by the caller)."""
        headers = {
            HEADERS.msg_id: request_id,
            HEADERS.request_id: request_id,
            HEADERS.reply: nats_layout.sample_subject(task, request_id, ROLE_SHADOW),
            HEADERS.deadline: str(int(time.time() * 1000) + SHADOW_DEADLINE_MS),
            HEADERS.priority: str(priority),
        }
        copy = asyncio.create_task(self._publish_copy(js, task, payload, headers))
        self._copies.add(copy)
        copy.add_done_callback(self._copies.discard)

    async def _publish_copy(
        self, js: JetStreamContext, task: str, payload: bytes, headers: dict[str, str]
    ) -> None:
        try:
            await js.publish(
                nats_layout.shadow_subject(task),
                payload,
                timeout=RECORD_TIMEOUT_S,
                stream=nats_layout.SHADOW_STREAM,
                headers=headers,
            )
            self.metrics.shadow_copies.labels(task=task, outcome="sent").inc()
        except (nats.errors.Error, TimeoutError) as exc:
            self.metrics.shadow_copies.labels(task=task, outcome="failed").inc()
            log.info("shadow copy of %s not published: %s", headers[HEADERS.request_id], exc)

    async def record(
        self,
        js: JetStreamContext,
        sampling: Sampling,
        task: str,
        payload: bytes,
        reply: AnyReplyOk,
        queued_ms: int,
        latency_ms: float,
    ) -> bool:
        """Keep the champion's side of a sampled request; True once the stream holds it."""
        record = ChampionSample(
            task=task,
            kind=sampling.kind,
            request_id=reply.request_id,
            ts_ms=queued_ms,
            payload=payload,
            reply=pack(reply),
            candidate=sampling.candidate,
            latency_ms=latency_ms,
            shadow=sampling.shadow.candidate if sampling.shadow is not None else None,
            key=sampling.key,
        )
        data = encode(record)
        if len(data) > self.inline_limit_bytes:
            self.metrics.samples.labels(task=task, outcome="too_large").inc()
            return False
        headers = {
            HEADERS.msg_id: f"{reply.request_id}.{ROLE_CHAMPION}",
            HEADER_TTL: ttl_header(sampling.retention_s),
        }
        try:
            await js.publish(
                nats_layout.sample_subject(task, reply.request_id, ROLE_CHAMPION),
                data,
                timeout=RECORD_TIMEOUT_S,
                stream=nats_layout.SAMPLES_STREAM,
                headers=headers,
            )
        except (nats.errors.Error, TimeoutError) as exc:
            self.metrics.samples.labels(task=task, outcome="failed").inc()
            log.info("sample %s not kept: %s", reply.request_id, exc)
            return False
        self.metrics.samples.labels(task=task, outcome="kept").inc()
        return True

    async def close(self) -> None:
        for copy in list(self._copies):
            copy.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await copy
