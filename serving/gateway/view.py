"""What the gateway serves from: KV ``directory`` (tasks, API-key digests) and KV ``placements``,
followed live. No database: a registry outage stops promotions, never traffic.

Each bucket is watched with NATS's KV watch (the last value of every key, then every change).
A bucket counts as *synced* once the watch delivered the entry that was the bucket stream's last
message when the watch began (or at once when the bucket was empty): only then may an absent
key mean "not there". A reconnect ends a watch and a new one replays the current values over the
old picture, which serves meanwhile. ``revisions`` (the newest stream sequence applied, per
bucket) lets a caller that just published wait until this gateway has seen it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import nats.errors
from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from serving import nats_layout
from serving.directory import (
    KEY_PREFIX,
    META_KEY,
    TASK_PREFIX,
    DirectoryError,
    KeyRecord,
    TaskRecord,
)
from serving.protocol import PlacementValue, ProtocolError, from_wire, unpack

log = logging.getLogger(__name__)

# A watch that has not reached its start's last message by then counts as synced anyway (the
# message was removed meanwhile); said in the log.
SYNC_FALLBACK_S = 10.0


class FleetView:
    def __init__(self) -> None:
        self.keys: dict[str, KeyRecord] = {}  # by token prefix
        self.tasks: dict[str, TaskRecord] = {}  # by name: kind and per-text limits
        self.placements: dict[str, PlacementValue] = {}
        # The task's shadow placement, if it has one (KV key `<task>.shadow`).
        self.shadows: dict[str, PlacementValue] = {}
        # Set (and replaced) whenever a placement changes: what `wait_for_epoch` waits on.
        self._placements_changed = asyncio.Event()
        # The control plane has published the directory at least once (its `meta` was seen).
        self.directory_published = False
        self.revisions: dict[str, int] = {
            nats_layout.DIRECTORY_BUCKET: 0,
            nats_layout.PLACEMENTS_BUCKET: 0,
        }
        self._synced: set[str] = set()

    @property
    def synced(self) -> bool:
        return self._synced >= set(self.revisions)

    def describe(self) -> dict[str, object]:
        return {
            "synced": self.synced,
            "directory_published": self.directory_published,
            "revisions": dict(self.revisions),
            "tasks": len(self.tasks),
            "placements": len(self.placements),
        }

    # ------------------------------------------------------------------ following

    async def follow(
        self, nc: NatsClient, js: JetStreamContext, layout: nats_layout.Layout
    ) -> None:
        """Watch both buckets until cancelled."""
        await asyncio.gather(
            self._follow(nc, js, layout.directory, nats_layout.DIRECTORY_BUCKET),
            self._follow(nc, js, layout.placements, nats_layout.PLACEMENTS_BUCKET),
        )

    async def _follow(
        self, nc: NatsClient, js: JetStreamContext, kv: KeyValue, bucket: str
    ) -> None:
        while True:
            reconnects = nc.stats["reconnects"]
            try:
                await self._watch(nc, js, kv, bucket, reconnects)
            except (nats.errors.Error, TimeoutError) as exc:
                log.warning("watching KV %s: %s; watching again", bucket, exc or type(exc))
                await asyncio.sleep(0.5)

    async def _watch(
        self, nc: NatsClient, js: JetStreamContext, kv: KeyValue, bucket: str, reconnects: int
    ) -> None:
        state = (await js.stream_info(f"KV_{bucket}")).state
        target = state.last_seq if state.messages else 0
        if target == 0:
            self._synced.add(bucket)
        began = time.monotonic()
        watcher = await kv.watchall()
        try:
            while nc.stats["reconnects"] == reconnects:
                if bucket not in self._synced and time.monotonic() - began > SYNC_FALLBACK_S:
                    log.warning("KV %s: the watch never reached sequence %d", bucket, target)
                    self._synced.add(bucket)
                try:
                    entry = await watcher.updates(timeout=1.0)
                except nats.errors.TimeoutError:
                    continue
                if entry is None:  # nats-py's own "initial values done" marker: not relied on
                    continue
                self._apply(bucket, entry)
                if entry.revision is not None:
                    self.revisions[bucket] = max(self.revisions[bucket], entry.revision)
                    if entry.revision >= target:
                        self._synced.add(bucket)
        finally:
            with contextlib.suppress(Exception):
                await watcher.stop()

    def _apply_placement(self, key: str, value: bytes | None) -> None:
        # A shadow's placement lies under `<task>.shadow`: it is never the task's champion.
        shadow = key.endswith(nats_layout.SHADOW_KEY_SUFFIX)
        table = self.shadows if shadow else self.placements
        task = key.removesuffix(nats_layout.SHADOW_KEY_SUFFIX) if shadow else key
        if value is None:
            table.pop(task, None)
            return
        try:
            placement = from_wire(PlacementValue, unpack(value))
        except ProtocolError as exc:
            log.warning("ignoring a bad placement under %r: %s", key, exc)
            table.pop(task, None)
            return
        if placement.shadow != shadow or placement.task != task:
            log.warning("ignoring a placement under %r that names %r", key, placement.task)
            table.pop(task, None)
            return
        table[task] = placement

    def placement_epoch(self, task: str) -> int:
        """The epoch of the task's placement as this gateway has it (0: none)."""
        placement = self.placements.get(task)
        return placement.epoch if placement is not None else 0

    async def wait_for_epoch(self, task: str, epoch: int, timeout_s: float) -> bool:
        """Whether the task's placement reaches ``epoch`` within ``timeout_s`` (at once if it
        already has): a caller that has seen a newer epoch through another gateway waits here
        while this one's watch catches up, never in the queue."""
        deadline = time.monotonic() + timeout_s
        while self.placement_epoch(task) < epoch:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._placements_changed.wait(), remaining)
        return True

    def _apply(self, bucket: str, entry: KeyValue.Entry) -> None:
        key = entry.key
        gone = entry.operation in (KV_DEL, KV_PURGE)
        if bucket == nats_layout.PLACEMENTS_BUCKET:
            self._apply_placement(key, None if gone else entry.value or b"")
            changed, self._placements_changed = self._placements_changed, asyncio.Event()
            changed.set()
            return
        if key == META_KEY:
            self.directory_published = self.directory_published or not gone
        elif key.startswith(TASK_PREFIX):
            name = key.removeprefix(TASK_PREFIX)
            if gone:
                self.tasks.pop(name, None)
                return
            try:
                self.tasks[name] = TaskRecord.unpack(entry.value or b"")
            except DirectoryError as exc:
                log.warning("ignoring a bad task record under %r: %s", key, exc)
                self.tasks.pop(name, None)
        elif key.startswith(KEY_PREFIX):
            prefix = key.removeprefix(KEY_PREFIX)
            if gone:
                self.keys.pop(prefix, None)
                return
            try:
                self.keys[prefix] = KeyRecord.unpack(entry.value or b"")
            except DirectoryError as exc:
                log.warning("ignoring a bad key record under %r: %s", key, exc)
                self.keys.pop(prefix, None)
