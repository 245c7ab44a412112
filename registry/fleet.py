"""The fleet as last reported: worker heartbeats mirrored into the database.

The fleet watcher (``serving/fleet_watcher.py``) is the only caller of the write methods; it copies
NATS KV ``workers`` here so the dashboard and ``taskfleet placement ls`` can compare desired
and reported placement epochs from the database alone, also while NATS is down.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select, update

from registry import entities as e
from registry.errors import InvalidInput
from registry.models import WorkerRow, utcnow
from registry.placements import PlacementRepository
from registry.transactions import Transactions


class FleetRepository:
    def __init__(self, tx: Transactions, placements: PlacementRepository) -> None:
        self.tx = tx
        self.placements = placements  # the desired epochs the workers' reports are set against

    def record_worker_report(
        self, report: e.WorkerReport, *, seen_at: datetime | None = None
    ) -> e.Worker:
        """Insert or refresh a worker's row from its newest heartbeat.

        ``seen_at`` is when the heartbeat reached NATS (the server's clock, one clock for the
        whole fleet); default now.

        Heartbeats arrive every few seconds per worker, so they are deliberately not written
        to the audit log (it records acts of people and promotions, not liveness), nor rung
        as commits (the fleet mirror's writes change nothing the publisher publishes).
        """
        if not report.worker_id or len(report.worker_id) > 128:
            raise InvalidInput("worker id must be 1 to 128 characters")
        if report.memory_used < 0 or report.memory_budget < 0:
            raise InvalidInput("worker memory figures must be >= 0")
        with self.tx.write(signal=False) as s:
            row = s.scalar(select(WorkerRow).where(WorkerRow.worker_id == report.worker_id))
            if row is None:
                row = WorkerRow(worker_id=report.worker_id)
                s.add(row)
            elif row.reported_at >= report.reported_at:
                # The same or an older heartbeat replayed (watch restart): keep what we have.
                return worker_entity(row)
            row.host = report.host[:255]
            row.loaded = list(report.loaded)
            row.memory_used = report.memory_used
            row.memory_budget = report.memory_budget
            row.queue_depth = dict(report.queue_depth)
            row.runtimes = list(report.runtimes)
            row.epochs = dict(report.epochs)
            row.profiles = dict(report.profiles)
            row.reported_at = report.reported_at
            row.seen_at = seen_at or utcnow()
            row.reachable = True
            s.flush()
            return worker_entity(row)

    def mark_workers_unreachable(
        self, *, seen_before: datetime | None = None, worker_ids: list[str] | None = None
    ) -> list[str]:
        """Flag workers silent since ``seen_before``, or the named ones; returns the ids flagged."""
        if seen_before is None and worker_ids is None:
            raise InvalidInput("give seen_before or worker_ids")
        with self.tx.write(signal=False) as s:
            query = select(WorkerRow.worker_id).where(WorkerRow.reachable.is_(True))
            if seen_before is not None:
                query = query.where(WorkerRow.seen_at < seen_before)
            if worker_ids is not None:
                query = query.where(WorkerRow.worker_id.in_(worker_ids))
            ids = list(s.scalars(query))
            if ids:
                s.execute(
                    update(WorkerRow).where(WorkerRow.worker_id.in_(ids)).values(reachable=False)
                )
            return sorted(ids)

    def forget_workers(self, seen_before: datetime) -> list[str]:
        """Delete unreachable workers not heard of since ``seen_before`` (retired machines)."""
        with self.tx.write(signal=False) as s:
            rows = list(
                s.scalars(
                    select(WorkerRow).where(
                        WorkerRow.reachable.is_(False), WorkerRow.seen_at < seen_before
                    )
                )
            )
            for row in rows:
                s.delete(row)
            return sorted(r.worker_id for r in rows)

    def list_workers(self, *, reachable_only: bool = False) -> list[e.Worker]:
        with self.tx.read() as s:
            query = select(WorkerRow).order_by(WorkerRow.worker_id)
            if reachable_only:
                query = query.where(WorkerRow.reachable.is_(True))
            return [worker_entity(r) for r in s.scalars(query)]

    def placement_status(self) -> list[e.PlacementStatus]:
        """Per placed task: the desired epoch and the epoch each reachable worker reports."""
        workers = self.list_workers(reachable_only=True)
        return [e.PlacementStatus.of(p, workers) for p in self.placements.list_placements()]


def worker_entity(r: WorkerRow) -> e.Worker:
    return e.Worker(
        r.id,
        r.worker_id,
        r.host,
        list(r.loaded),
        r.memory_used,
        r.memory_budget,
        dict(r.queue_depth),
        list(r.runtimes),
        dict(r.epochs),
        r.reported_at,
        r.seen_at,
        r.reachable,
        r.created_at,
        dict(r.profiles or {}),
    )
