"""The control plane's NATS side: what `taskfleet serve` (and `taskfleet up`) runs beside the
REST API and dashboard.

Any number of control planes may run against one NATS and one database; exactly one leads (the
KV lock of ``serving/leader.py``) and runs the control loops: the placement publisher (the
outbox of promotions), the fleet watcher (heartbeats into the registry), the directory
publisher (tasks and API-key digests for the gateways) and the endpoint watcher (re-probes
endpoint models, serving/endpoint_watch.py). The others stand by and take over
within the lock's TTL when the leader dies. While NATS is unreachable the HTTP side serves on,
from the database alone, and this side says that publishing waits for NATS.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Protocol

from nats.aio.client import Client as NATS
from nats.errors import Error as NatsError

from registry.store import ControlLoopStore
from serving.connection import NatsTarget, connect_forever, nats_options
from serving.endpoint_watch import DEFAULT_PROBE_PERIOD_S, EndpointWatcher
from serving.fleet_watcher import FleetWatcher
from serving.leader import LeaderLock, new_holder_id
from serving.nats_layout import LEADER_TTL_S, WORKERS_TTL_S, ensure_layout
from serving.publisher import PlacementPublisher

log = logging.getLogger("taskfleet.control")

# How long the first connection may take before the control plane says it waits for NATS.
WAITING_NOTICE_S = 3.0

STATUS_CONNECTING = "connecting"
STATUS_WAITING = "waiting for NATS"
STATUS_STANDBY = "standby"
STATUS_LEADER = "leader"
STATUS_STOPPED = "stopped"


class _Loop(Protocol):
    async def run(self, nc: NATS | None = None) -> None: ...

    def stop(self) -> None: ...


class ControlLoops:
    """Leader election plus, on the leader, the control loops on one shared connection."""

    def __init__(
        self,
        registry: ControlLoopStore,
        nats_url: NatsTarget,
        *,
        holder: str | None = None,
        poll_interval_s: float = 0.5,
        flush_interval_s: float = 1.0,
        stale_after_s: float = WORKERS_TTL_S,
        standby_retry_s: float = 1.0,
        ttl_s: float = LEADER_TTL_S,
        announce: Callable[[str], None] | None = None,
        artifact_source: str | None = None,
        probe_period_s: float = DEFAULT_PROBE_PERIOD_S,
    ) -> None:
        self.registry = registry
        self.nats_url = nats_url
        self.artifact_source = artifact_source  # None: the NATS object store
        self.nats = nats_options(nats_url)  # printed without passwords
        self.holder = holder or new_holder_id()
        self.poll_interval_s = poll_interval_s
        self.flush_interval_s = flush_interval_s
        self.stale_after_s = stale_after_s
        self.standby_retry_s = standby_retry_s
        self.ttl_s = ttl_s
        self.probe_period_s = probe_period_s
        self._announce = announce or (lambda message: log.info("%s", message))
        self._stop = asyncio.Event()
        self._nc: NATS | None = None
        self._status = STATUS_CONNECTING
        self.leader: str | None = None  # the holder last seen leading (maybe this one)

    # ------------------------------------------------------------------ status

    @property
    def status(self) -> str:
        if self._status in (STATUS_LEADER, STATUS_STANDBY) and not (
            self._nc is not None and self._nc.is_connected
        ):
            return STATUS_WAITING
        return self._status

    def describe(self) -> dict[str, str | None]:
        """For the control plane's /healthz: this process's part in publishing."""
        return {
            "publisher": self.status,
            "holder": self.holder,
            "leader": self.leader,
            "nats": str(self.nats),
        }

    def stop(self) -> None:
        self._stop.set()

    # ------------------------------------------------------------------ loop

    async def run(self) -> None:
        """Until :meth:`stop`: connect (for ever), then lead or stand by."""
        connecting = asyncio.ensure_future(
            connect_forever(self.nats_url, self._stop, name=f"taskfleet-control-{self.holder}")
        )
        done, _ = await asyncio.wait({connecting}, timeout=WAITING_NOTICE_S)
        if not done:
            self._status = STATUS_WAITING
            self._announce(
                f"NATS at {self.nats} is not reachable: publishing placements waits for it "
                "(the dashboard and REST API serve meanwhile; promotions are published once "
                "NATS is back)"
            )
        nc = await connecting
        if nc is None:
            self._status = STATUS_STOPPED
            return
        self._nc = nc
        if not done:
            self._announce(f"connected to NATS at {self.nats}")
        backoff = self.standby_retry_s
        try:
            while not self._stop.is_set():
                try:
                    layout = await ensure_layout(nc.jetstream())
                    lock = LeaderLock(layout.leader, self.holder)
                    while not self._stop.is_set():
                        if await lock.acquire():
                            await self._lead(nc, lock)
                        else:
                            await self._stand_by(lock)
                        backoff = self.standby_retry_s
                except (NatsError, OSError, TimeoutError) as exc:
                    log.warning("control loops: %s; retrying in %.1fs", _describe(exc), backoff)
                    await self._sleep(backoff)
                    backoff = min(backoff * 2, 15.0)
        finally:
            self._status = STATUS_STOPPED
            with contextlib.suppress(Exception):
                await nc.close()

    async def _stand_by(self, lock: LeaderLock) -> None:
        current = await lock.current()
        holder = current.holder if current is not None else None
        if holder is not None and (holder != self.leader or self._status != STATUS_STANDBY):
            self._announce(f"control plane {holder} leads; standing by to take over")
        self.leader = holder
        self._status = STATUS_STANDBY
        await self._sleep(self.standby_retry_s)

    def loops(self) -> list[_Loop]:
        """The loops a leader runs; fresh ones every term."""
        return [
            PlacementPublisher(
                self.registry,
                self.nats_url,
                poll_interval_s=self.poll_interval_s,
                artifact_source=self.artifact_source,
            ),
            FleetWatcher(
                self.registry,
                self.nats_url,
                flush_interval_s=self.flush_interval_s,
                stale_after_s=self.stale_after_s,
            ),
            EndpointWatcher(self.registry, period_s=self.probe_period_s),
        ]

    async def _lead(self, nc: NATS, lock: LeaderLock) -> None:
        """Run the loops while the lock is ours; back to the caller when it is lost or on stop."""
        self.leader = self.holder
        self._status = STATUS_LEADER
        self._announce(
            f"leading ({self.holder}): publishing placements to {self.nats} and mirroring the fleet"
        )
        loops = self.loops()
        tasks = [asyncio.create_task(loop.run(nc)) for loop in loops]
        for task in tasks:
            task.add_done_callback(_log_crash)
        renewed = time.monotonic()
        renew_every = self.ttl_s / 4
        try:
            while not self._stop.is_set():
                await self._sleep(renew_every)
                if self._stop.is_set():
                    break
                if any(task.done() for task in tasks):
                    # A bug ended a loop (its traceback is logged): hand the lock on, so this
                    # control plane or another starts fresh loops, rather than lead idle.
                    self._announce("a control loop stopped unexpectedly; giving up the lead")
                    with contextlib.suppress(NatsError, OSError, TimeoutError):
                        await asyncio.wait_for(lock.release(), 2.0)
                    return
                try:
                    if not await asyncio.wait_for(lock.renew(), renew_every):
                        self._announce("lost the leader lock to another control plane")
                        return
                    renewed = time.monotonic()
                except (NatsError, OSError, TimeoutError) as exc:
                    silent = time.monotonic() - renewed
                    if silent > self.ttl_s * 0.6:
                        # The lock expires soon if it has not already: someone else may lead.
                        self._announce(
                            f"could not renew the leader lock for {silent:.0f}s "
                            f"({_describe(exc)}); stepping down"
                        )
                        lock.revision = None
                        return
        finally:
            self._status = STATUS_STANDBY
            for loop in loops:
                loop.stop()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self._stop.is_set():
                with contextlib.suppress(NatsError, OSError, TimeoutError):
                    await asyncio.wait_for(lock.release(), 2.0)

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)


def _log_crash(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("a control loop failed", exc_info=task.exception())


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
