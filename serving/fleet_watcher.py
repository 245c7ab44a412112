"""The fleet watcher: mirrors NATS KV ``workers`` heartbeats into the registry.

The dashboard and `taskfleet placement ls` then read desired vs reported placement epochs from
the database alone. A worker whose heartbeats stop (crash, network, NATS down) is flagged
unreachable once nothing was heard from it for ``stale_after_s``: KV TTL expiry leaves no
event to watch, so silence is judged here, on the NATS server's timestamps.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from datetime import UTC, datetime, timedelta

from nats.aio.client import Client as NATS
from nats.errors import Error as NatsError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from registry import RegistryError
from registry import entities as e
from registry.store import WorkerReportSink
from serving import protocol as p
from serving.connection import NatsTarget, connect_forever
from serving.nats_layout import WORKERS_TTL_S, ensure_layout

log = logging.getLogger("taskfleet.fleet")


def heartbeat_report(beat: p.WorkerHeartbeat) -> e.WorkerReport:
    return e.WorkerReport(
        worker_id=beat.worker_id,
        host=beat.host,
        reported_at=datetime.fromtimestamp(beat.ts_ms / 1000.0, UTC),
        loaded=list(beat.loaded),
        memory_used=beat.memory_used,
        memory_budget=beat.memory_budget,
        queue_depth=dict(beat.queue_depth),
        runtimes=list(beat.runtimes),
        epochs=dict(beat.epochs),
        profiles=dict(beat.profiles or {}),
    )


def decode_heartbeat(data: bytes) -> p.WorkerHeartbeat:
    return p.from_wire(p.WorkerHeartbeat, p.unpack(data))


class FleetWatcher:
    """Watches KV ``workers`` and writes the newest heartbeat of each worker every flush."""

    def __init__(
        self,
        registry: WorkerReportSink,
        nats_url: NatsTarget,
        *,
        flush_interval_s: float = 1.0,
        stale_after_s: float = WORKERS_TTL_S,
        max_backoff_s: float = 15.0,
    ) -> None:
        self.registry = registry
        self.nats_url = nats_url
        self.flush_interval_s = flush_interval_s
        self.stale_after_s = stale_after_s
        self.max_backoff_s = max_backoff_s
        self._stop = asyncio.Event()
        # Newest heartbeat per worker since the last flush, with its NATS timestamp.
        self._pending: dict[str, tuple[e.WorkerReport, datetime]] = {}
        self._gone: set[str] = set()

    def stop(self) -> None:
        self._stop.set()

    async def run(self, nc: NATS | None = None) -> None:
        """Until :meth:`stop`; on the caller's connection ``nc`` (left open) when given."""
        own = nc is None
        if nc is None:
            nc = await connect_forever(self.nats_url, self._stop, name="taskfleet-fleet-watcher")
        if nc is None:
            return
        backoff = self.flush_interval_s
        try:
            while not self._stop.is_set():
                try:
                    kv = (await ensure_layout(nc.jetstream())).workers
                    await self._watch(kv, nc)
                    backoff = self.flush_interval_s
                except (NatsError, OSError, TimeoutError, RegistryError) as exc:
                    log.warning("fleet watcher: %s; retrying in %.1fs", exc or type(exc), backoff)
                    # Silence while disconnected still ages workers into "unreachable".
                    with contextlib.suppress(RegistryError):
                        await self._flush()
                    await self._sleep(backoff)
                    backoff = min(backoff * 2, self.max_backoff_s)
        finally:
            with contextlib.suppress(RegistryError):
                await self._flush()
            if own:
                await nc.close()

    async def _watch(self, kv: KeyValue, nc: NATS) -> None:
        """Until stop or a reconnect: a watch does not survive a server restart, so a
        reconnect ends it and the caller watches again (which replays each key's last value)."""
        reconnects = nc.stats["reconnects"]
        watcher = await kv.watchall()
        try:
            next_flush = time.monotonic() + self.flush_interval_s
            while not self._stop.is_set() and nc.stats["reconnects"] == reconnects:
                timeout = max(0.01, next_flush - time.monotonic())
                try:
                    entry = await watcher.updates(timeout=timeout)
                except NatsTimeoutError:
                    entry = None
                if entry is not None:
                    self._take(entry)
                if time.monotonic() >= next_flush:
                    await self._flush()
                    next_flush = time.monotonic() + self.flush_interval_s
        finally:
            with contextlib.suppress(Exception):
                await watcher.stop()

    def _take(self, entry: KeyValue.Entry) -> None:
        if entry.operation in (KV_DEL, KV_PURGE):
            # A worker that shut down cleanly removes its key.
            self._pending.pop(entry.key, None)
            self._gone.add(entry.key)
            return
        try:
            beat = decode_heartbeat(entry.value or b"")
        except p.ProtocolError as exc:
            log.warning("ignoring bad heartbeat under %r: %s", entry.key, exc)
            return
        seen = entry.created if isinstance(entry.created, datetime) else datetime.now(UTC)
        self._gone.discard(beat.worker_id)
        self._pending[beat.worker_id] = (heartbeat_report(beat), seen)

    async def _flush(self) -> None:
        pending, self._pending = self._pending, {}
        gone, self._gone = self._gone, set()
        try:
            await asyncio.to_thread(self._write, pending, gone)
        except RegistryError:
            # Keep what we had for the next attempt (newer beats replace older ones).
            for worker_id, item in pending.items():
                self._pending.setdefault(worker_id, item)
            self._gone |= gone
            raise

    def _write(self, pending: dict[str, tuple[e.WorkerReport, datetime]], gone: set[str]) -> None:
        for report, seen in pending.values():
            self.registry.record_worker_report(report, seen_at=seen)
        if gone:
            self.registry.mark_workers_unreachable(worker_ids=sorted(gone))
        cutoff = datetime.now(UTC) - timedelta(seconds=self.stale_after_s)
        for worker_id in self.registry.mark_workers_unreachable(seen_before=cutoff):
            log.warning("worker %s stopped reporting", worker_id)

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)
