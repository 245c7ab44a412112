"""The gateway's NATS side: publish a request to ``tasks.<task>``, wait for its reply.

One wildcard subscription (``_tf.reply.<gateway id>.>``) receives every reply of this gateway;
replies resolve futures keyed by request id. A reply whose request is no longer waiting (already
answered, or abandoned at its deadline) is dropped and counted: JetStream may deliver a message
twice (ack lost, worker died after replying), and the second answer must not reach anyone.

Every reply received is confirmed to its worker (an empty response): the worker acks the queue
message only then. A reply above NATS's ``max_payload`` carries its float32 data (embeddings,
scores or probabilities) as an object-store reference; the gateway reads the object and
deletes it. When the deadline passes
without a reply, the 504 says ``retryable`` if a worker that served the task died or restarted
meanwhile (its heartbeat is gone, or carries a new start time): whatever it held was lost with
it, not refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from dataclasses import dataclass

import msgpack
import nats
import nats.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import NoStreamResponseError, NotFoundError

from contract import HEADERS
from serving import nats_layout
from serving.connection import NatsTarget, nats_options
from serving.gateway.bodies import EmbedBody
from serving.gateway.bodies_classify import ClassifyBody
from serving.gateway.bodies_rerank import RerankBody
from serving.gateway.errors import (
    DeadlineExceeded,
    GatewayError,
    Unavailable,
    from_worker_error,
)
from serving.gateway.metrics import ConsumerStats, GatewayMetrics, QueueSnapshot
from serving.gateway.sampling import Sampler, Sampling
from serving.gateway.view import FleetView
from serving.protocol import (
    AnyReplyOk,
    PayloadRef,
    ProtocolError,
    ReplyError,
    WorkerHeartbeat,
    decode_reply_message,
    from_wire,
    offloaded_data,
    pack,
    unpack,
)

# Who served a task when a request was queued: worker id -> its process start time.
Incarnations = dict[str, int | None]
# What a request of each task kind asks for; each knows its queue payload and reply type.
TaskBody = EmbedBody | RerankBody | ClassifyBody

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Served:
    """A request's reply, and whether it was sampled (kept in stream SAMPLES)."""

    reply: AnyReplyOk
    sampled: bool = False


@dataclass(frozen=True)
class DispatchSettings:
    gateway_id: str
    # Packed inputs above this go to the object store; NATS's default max_payload is 1 MiB and
    # the headers and payload envelope need room too.
    inline_limit_bytes: int = 1_000_000
    # How stale the gateway's picture of live workers may be.
    workers_refresh_s: float = 1.0
    retry_after_s: int = 2
    publish_attempt_timeout_s: float = 2.0
    # How long a request whose X-Taskfleet-Min-Epoch is ahead of this gateway's placement waits
    # for the placement to arrive (the KV watch lags a promotion by milliseconds) before 503.
    min_epoch_wait_s: float = 2.0


def now_ms() -> int:
    return int(time.time() * 1000)


class Dispatcher:
    def __init__(
        self, nats_url: NatsTarget, settings: DispatchSettings, metrics: GatewayMetrics
    ) -> None:
        self.nats = nats_options(nats_url)
        self.settings = settings
        self.metrics = metrics
        self.reply_prefix = f"{nats_layout.REPLY_SUBJECT_PREFIX}{settings.gateway_id}."
        self._nc: NatsClient | None = None
        self._js: JetStreamContext | None = None
        self._layout: nats_layout.Layout | None = None
        self._ready = asyncio.Event()
        self._connecting: asyncio.Task[None] | None = None
        self._pending: dict[str, asyncio.Future[AnyReplyOk | ReplyError]] = {}
        self._consumers: set[str] = set()
        # Per task, the newest placement epoch a reply came from: every later request is
        # stamped with it (Tf-Min-Epoch).
        self._epochs: dict[str, int] = {}
        self._heartbeats: list[WorkerHeartbeat] = []
        self._heartbeats_at = -1e9
        self._heartbeats_lock = asyncio.Lock()
        self._cleanups: set[asyncio.Task[None]] = set()
        # Tasks, API-key digests and placements as the control plane publishes them.
        self.view = FleetView()
        self.sampler = Sampler(metrics, settings.inline_limit_bytes)
        self._following: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Connect in the background: the gateway serves /healthz (and answers 503) while
        NATS is not reachable yet, and never gives up reconnecting."""
        self._connecting = asyncio.create_task(self._connect(), name="gateway-nats-connect")

    async def _connect(self) -> None:
        nc = await nats.connect(
            **self.nats.connect_kwargs(),
            name=f"taskfleet-gateway-{self.settings.gateway_id}",
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
            connect_timeout=2,
            error_cb=self._on_error,
            disconnected_cb=self._on_disconnected,
            reconnected_cb=self._on_reconnected,
        )
        self._nc = nc
        self._js = nc.jetstream()
        while True:
            try:
                self._layout = await nats_layout.ensure_layout(self._js)
                break
            except (TimeoutError, nats.errors.Error) as exc:
                log.warning("NATS layout not ready yet (%s); retrying", exc)
                await asyncio.sleep(0.5)
        await nc.subscribe(self.reply_prefix + ">", cb=self._on_reply)
        self._following = asyncio.create_task(
            self.view.follow(nc, self._js, self._layout), name="gateway-fleet-view"
        )
        self._ready.set()
        log.info("gateway %s connected to %s", self.settings.gateway_id, self.nats)

    async def _on_error(self, exc: Exception) -> None:
        log.warning("NATS: %s", exc)

    async def _on_disconnected(self) -> None:
        log.warning("disconnected from NATS; reconnecting")

    async def _on_reconnected(self) -> None:
        log.info("reconnected to NATS")

    @property
    def connected(self) -> bool:
        return self._ready.is_set() and self._nc is not None and self._nc.is_connected

    async def close(self) -> None:
        for task in (self._connecting, self._following):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        for future in self._pending.values():
            if not future.done():
                future.cancel()
        await self.sampler.close()
        if self._nc is not None:
            with contextlib.suppress(Exception):
                await self._nc.drain()
            with contextlib.suppress(Exception):
                await self._nc.close()

    def jetstream(self) -> JetStreamContext:
        """The gateway's JetStream context (503 while it is not connected)."""
        return self._require_connection()[0]

    def _require_connection(self) -> tuple[JetStreamContext, nats_layout.Layout]:
        if not self.connected or self._js is None or self._layout is None:
            raise self._queue_unavailable("the gateway is not connected to NATS right now")
        return self._js, self._layout

    def _queue_unavailable(self, message: str) -> Unavailable:
        """NATS did not do what was asked (down, restarting, refusing): retry later."""
        return Unavailable(
            message, code="QUEUE_UNAVAILABLE", retry_after_s=self.settings.retry_after_s
        )

    # ------------------------------------------------------------------ workers

    async def live_workers(self, task: str) -> list[WorkerHeartbeat]:
        """Live workers that run a loop for ``task``.

        A worker counts when its heartbeat (KV ``workers``, whose TTL drops silent workers)
        lists the task in ``queue_depth`` or ``epochs``: the sidecar runs one task loop per
        placed task and reports every loop there, before its model is loaded. Lazy placements
        load on first demand, so requiring the model to be loaded would refuse the very request
        that makes a worker load it; counting any live worker at all would accept requests that
        nobody pulls.
        """
        beats = await self._current_heartbeats()
        return [b for b in beats if task in b.queue_depth or task in b.epochs]

    async def _current_heartbeats(self, *, fresh: bool = False) -> list[WorkerHeartbeat]:
        max_age = 0.0 if fresh else self.settings.workers_refresh_s
        if time.monotonic() - self._heartbeats_at < max_age:
            return self._heartbeats
        async with self._heartbeats_lock:
            if time.monotonic() - self._heartbeats_at >= max_age:
                self._heartbeats = await self._read_heartbeats()
                self._heartbeats_at = time.monotonic()
        return self._heartbeats

    async def _read_heartbeats(self) -> list[WorkerHeartbeat]:
        js, _ = self._require_connection()
        try:  # NATS may be restarting: every failure here is a retryable 503
            values = await nats_layout.kv_values(js, nats_layout.WORKERS_BUCKET)
        except (TimeoutError, nats.errors.Error) as exc:
            raise self._queue_unavailable("could not read worker heartbeats from NATS") from exc
        beats: list[WorkerHeartbeat] = []
        for key, value in values.items():
            try:
                beats.append(from_wire(WorkerHeartbeat, unpack(value)))
            except ProtocolError as exc:
                log.warning("ignoring malformed heartbeat under %r: %s", key, exc)
        return beats

    async def _incarnations(self, task: str) -> Incarnations:
        return {b.worker_id: b.started_ms for b in await self.live_workers(task)}

    async def _lost_workers(self, task: str, before: Incarnations) -> list[str]:
        """Workers that served ``task`` in ``before`` and are gone or restarted now."""
        with contextlib.suppress(GatewayError, nats.errors.Error, TimeoutError):
            now = {b.worker_id: b.started_ms for b in await self._current_heartbeats(fresh=True)}
            return [w for w, started in before.items() if w not in now or now[w] != started]
        return []

    async def queue_snapshot(self, timeout_s: float = 2.0) -> QueueSnapshot | None:
        """The queue as JetStream sees it (for /metrics); None while NATS cannot be read."""
        if not self.connected or self._js is None:
            return None
        try:
            return await asyncio.wait_for(self._read_queue(self._js), timeout_s)
        except (GatewayError, nats.errors.Error, TimeoutError) as exc:
            log.info("queue figures not readable: %s", exc)
            return None

    async def _read_queue(self, js: JetStreamContext) -> QueueSnapshot:
        consumers = [
            ConsumerStats(
                task=(info.name or "").removeprefix(nats_layout.CONSUMER_PREFIX),
                pending=info.num_pending or 0,
                ack_pending=info.num_ack_pending or 0,
                redelivered=info.num_redelivered or 0,
                waiting_pulls=info.num_waiting or 0,
            )
            for info in await js.consumers_info(nats_layout.TASKS_STREAM)
            if (info.name or "").startswith(nats_layout.CONSUMER_PREFIX)
        ]
        # Requests of a task no worker has served yet wait in the stream without a consumer:
        # all of them are pending.
        stored = await js.stream_info(
            nats_layout.TASKS_STREAM, subjects_filter=nats_layout.TASKS_SUBJECT_PREFIX + ">"
        )
        consumed = {c.task for c in consumers}
        for subject, count in (stored.state.subjects or {}).items():
            task = subject.removeprefix(nats_layout.TASKS_SUBJECT_PREFIX)
            if task not in consumed:
                consumers.append(
                    ConsumerStats(
                        task=task,
                        pending=int(count),
                        ack_pending=0,
                        redelivered=0,
                        waiting_pulls=0,
                    )
                )
        dlq = await js.stream_info(
            nats_layout.DLQ_STREAM, subjects_filter=nats_layout.DLQ_SUBJECT_PREFIX + ">"
        )
        dead = {
            subject.removeprefix(nats_layout.DLQ_SUBJECT_PREFIX): int(count)
            for subject, count in (dlq.state.subjects or {}).items()
        }
        live: dict[str, int] = {}
        for beat in await self._current_heartbeats():
            for task in set(beat.queue_depth) | set(beat.epochs):
                live[task] = live.get(task, 0) + 1
        return QueueSnapshot(consumers=consumers, dead_letters=dead, live_workers=live)

    # ------------------------------------------------------------------ requests

    async def await_epoch(self, task: str, min_epoch: int, timeout_s: float) -> None:
        """Return once this gateway knows the task at ``min_epoch`` or newer (its placement, or
        a reply it had), waiting at most ``min_epoch_wait_s`` (and the request's timeout) for
        its placement watch to catch up; else 503 ``NOT_READY``. A request never reaches the
        queue stamped with an epoch no worker serves, where it would stall the task."""
        if min_epoch <= self._epochs.get(task, 0):
            return
        wait_s = min(self.settings.min_epoch_wait_s, timeout_s)
        if await self.view.wait_for_epoch(task, min_epoch, wait_s):
            return
        raise Unavailable(
            f"the caller has seen epoch {min_epoch} of task {task!r} (X-Taskfleet-Min-Epoch); "
            f"this gateway has epoch {self.view.placement_epoch(task)} and none newer arrived "
            f"within {wait_s:g}s",
            code="NOT_READY",
            retry_after_s=self.settings.retry_after_s,
        )

    async def submit(
        self,
        task: str,
        request: TaskBody,
        *,
        timeout_s: float,
        priority: int,
        min_epoch: int = 0,
        key: str | None = None,
        sampling: Sampling | None = None,
    ) -> Served:
        """Queue one request and wait for its reply until the deadline; raises GatewayError.

        The request's texts (inputs, or a rerank request's documents) move to the object store
        when their msgpack array is above the inline limit. The request is stamped with the
        newest epoch that this gateway has answered the task from or that the caller says it
        has seen (``min_epoch``, checked by ``await_epoch`` first): a worker still on an older
        epoch hands it back, so replies never go back in epoch after a promotion. ``key`` (the
        caller's API key name) travels as ``Tf-Key``. With ``sampling``, a sampled request is
        copied to the task's shadow and kept in stream SAMPLES (``serving/gateway/
        sampling.py``); ``Served.sampled`` says whether it was kept."""
        js, layout = self._require_connection()
        request_id = uuid.uuid4().hex
        deadline = time.monotonic() + timeout_s
        fence = max(min_epoch, self._epochs.get(task, 0))
        headers = {
            HEADERS.msg_id: request_id,
            HEADERS.request_id: request_id,
            HEADERS.reply: self.reply_prefix + request_id,
            HEADERS.deadline: str(now_ms() + int(timeout_s * 1000)),
            HEADERS.priority: str(priority),
        }
        if fence > 0:
            headers[HEADERS.min_epoch] = str(fence)
        if key is not None:
            headers[HEADERS.key] = key
        future: asyncio.Future[AnyReplyOk | ReplyError] = asyncio.get_running_loop().create_future()
        serving = await self._incarnations(task)
        # Registered before publishing: a fast worker may answer before publish() returns.
        self._pending[request_id] = future
        offloaded = False
        self.metrics.in_flight.inc()
        try:
            inputs: list[str] | PayloadRef = request.texts
            packed_inputs = pack(request.texts)
            try:
                if len(packed_inputs) > self.settings.inline_limit_bytes:
                    # Set first: a put that fails halfway still leaves chunks to delete.
                    offloaded = True
                    await layout.payloads.put(request_id, packed_inputs)
                    self.metrics.offloaded_payloads.inc()
                    inputs = PayloadRef(ref=request_id)
                await self._check_consumer(js, task)
            except (nats.errors.Error, TimeoutError) as exc:
                raise self._queue_unavailable(f"NATS did not take the request: {exc}") from exc
            payload = pack(request.payload(task, inputs))
            # Only inline inputs are kept: a sample is one message.
            sample = sampling is not None and not offloaded and sampling.sampled(request_id)
            queued_ms = now_ms()
            started = time.perf_counter()
            await self._publish(js, nats_layout.task_subject(task), payload, headers, deadline)
            if sample and sampling is not None and sampling.shadow is not None:
                self.sampler.copy_to_shadow(js, task, request_id, payload, priority)
            try:
                reply = await asyncio.wait_for(
                    future, timeout=max(0.0, deadline - time.monotonic())
                )
            except TimeoutError as exc:
                raise await self._deadline_error(task, timeout_s, serving) from exc
            if (ref := offloaded_data(reply)) is not None:
                assert not isinstance(reply, ReplyError)
                reply = await self._fetch_data(layout, reply, ref)
        finally:
            self.metrics.in_flight.dec()
            self._pending.pop(request_id, None)
            if offloaded:
                await self._delete_payload(layout, request_id)
        if isinstance(reply, ReplyError):
            raise from_worker_error(reply.error, retry_after_s=self.settings.retry_after_s)
        if not isinstance(reply, request.reply_type):
            self.metrics.bad_replies.inc()
            raise GatewayError(
                f"the worker answered with a {type(reply).__name__} to a "
                f"{type(request).__name__}; is the task placed on a model of another kind?",
                code="BAD_REPLY",
                status=502,
            )
        if reply.epoch > self._epochs.get(task, 0):
            self._epochs[task] = reply.epoch
        kept = False
        if sample and sampling is not None:
            latency_ms = (time.perf_counter() - started) * 1000
            kept = await self.sampler.record(
                js, sampling, task, payload, reply, queued_ms, latency_ms
            )
        return Served(reply, kept)

    async def _deadline_error(
        self, task: str, timeout_s: float, serving: Incarnations
    ) -> DeadlineExceeded:
        lost = await self._lost_workers(task, serving)
        if not lost:
            return DeadlineExceeded(f"no worker answered within {timeout_s:g}s")
        self.metrics.crash_deadlines.inc()
        return DeadlineExceeded(
            f"no worker answered within {timeout_s:g}s; worker(s) {', '.join(sorted(lost))} "
            "died or restarted meanwhile, so the request may be retried",
            retryable=True,
            retry_after_s=self.settings.retry_after_s,
        )

    async def _fetch_data(
        self, layout: nats_layout.Layout, reply: AnyReplyOk, ref: PayloadRef
    ) -> AnyReplyOk:
        """The float32 data a worker put into the object store (replies above max_payload)."""
        key = ref.ref
        try:
            data = (await layout.payloads.get(key)).data or b""
        except (nats.errors.Error, TimeoutError) as exc:
            raise self._queue_unavailable(
                f"the reply's {reply.DATA} could not be read from the object store: {exc}"
            ) from exc
        finally:
            await self._delete_payload(layout, key)
        if len(data) != reply.data_bytes:
            self.metrics.bad_replies.inc()
            raise GatewayError(
                f"the worker's {reply.DATA} object holds {len(data)} bytes, not the "
                f"{reply.data_bytes} its reply announces",
                code="BAD_REPLY",
                status=502,
            )
        self.metrics.offloaded_replies.inc()
        return reply.with_data(data)

    async def _check_consumer(self, js: JetStreamContext, task: str) -> None:
        # Workers create the consumer, with their own ack wait and deliveries; the gateway reads
        # it once it exists. Before, the request waits in the stream (counted by _read_queue).
        if task not in self._consumers and await nats_layout.check_task_consumer(js, task):
            self._consumers.add(task)

    async def _publish(
        self,
        js: JetStreamContext,
        subject: str,
        payload: bytes,
        headers: dict[str, str],
        deadline: float,
    ) -> None:
        """Publish until the stream acknowledges it or the deadline passes.

        Retrying is safe: every attempt carries the same ``Nats-Msg-Id``, so the stream keeps
        one copy even when an earlier attempt was stored but its ack was lost in a reconnect.
        A deadline that passes while JetStream leaves the attempts unacknowledged (a server
        starved of CPU or stalled) is the queue's failure, not the caller's: a retryable 503,
        as when NATS is down. A copy stored without its ack carries the passed deadline, and a
        worker drops it unrun, so the caller's retry is not computed twice.
        """
        attempted = False
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if attempted:
                    raise self._queue_unavailable(
                        "JetStream did not acknowledge the request before its deadline"
                    )
                raise DeadlineExceeded("the request could not be queued before its deadline")
            attempted = True
            try:
                await js.publish(
                    subject,
                    payload,
                    timeout=min(self.settings.publish_attempt_timeout_s, remaining),
                    stream=nats_layout.TASKS_STREAM,
                    headers=headers,
                )
                return
            except NoStreamResponseError:
                # The server lost the stream (restarted without its store): recreate it.
                with contextlib.suppress(nats.errors.Error, asyncio.TimeoutError):
                    self._layout = await nats_layout.ensure_layout(js)
                    self._consumers.clear()
            except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as exc:
                log.warning("publish to %s not acknowledged (%s); retrying", subject, exc)
            except nats.errors.ConnectionClosedError as exc:
                raise self._queue_unavailable("the gateway's NATS connection is closed") from exc
            except nats.errors.Error as exc:  # the stream refused it (full, misconfigured)
                raise self._queue_unavailable(f"JetStream did not take the request: {exc}") from exc
            await asyncio.sleep(min(0.2, max(0.0, deadline - time.monotonic())))

    async def _delete_payload(self, layout: nats_layout.Layout, key: str) -> None:
        # The worker deletes the object after answering too; whoever is second finds nothing.
        with contextlib.suppress(NotFoundError, nats.errors.Error, asyncio.TimeoutError):
            await layout.payloads.delete(key)

    async def _on_reply(self, msg: Msg) -> None:
        # The worker sends its reply as a request and acks the queue message only once we
        # confirm it, so a reply that reaches no gateway (NATS restarting) is sent again.
        if msg.reply:
            with contextlib.suppress(nats.errors.Error):
                await msg.respond(b"")
        try:
            reply = decode_reply_message(msgpack.unpackb(msg.data, raw=False))
        except (ProtocolError, ValueError, msgpack.UnpackException) as exc:
            self.metrics.bad_replies.inc()
            log.warning("dropping malformed reply on %s: %s", msg.subject, exc)
            return
        future = self._pending.get(reply.request_id)
        if future is None or future.done():
            self.metrics.duplicate_replies.inc()
            log.info(
                "dropping reply to %s: not waiting for it (duplicate or late)", reply.request_id
            )
            ref = offloaded_data(reply)
            if ref is not None and self._layout is not None:  # nobody will read that object
                cleanup = self._delete_payload(self._layout, ref.ref)
                task = asyncio.create_task(cleanup)
                self._cleanups.add(task)
                task.add_done_callback(self._cleanups.discard)
            return
        future.set_result(reply)
