"""Placements: the versioned (epoch) instruction to the fleet, with an outbox for publishing."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from registry import entities as e
from registry.base import ServiceBase
from registry.catalog import _candidate_row, _task_row
from registry.errors import InvalidInput, NotFound
from registry.models import CandidateRow, PlacementRow, TaskRow, utcnow


class PlacementMixin(ServiceBase):
    def set_placement(
        self, task: str, candidate: str, *, pinned: bool = False, replicas: int = 1
    ) -> e.Placement:
        """Write a new placement epoch for the task (published to the fleet by the outbox)."""
        if replicas < 1:
            raise InvalidInput("replicas must be >= 1")
        with self._write() as s:
            task_row = _task_row(s, task)
            cand = _candidate_row(s, task, candidate)
            if cand.kind == "bm25":
                raise InvalidInput("a bm25 candidate cannot be placed on the fleet (no model)")
            row = _new_placement(s, task_row, cand, pinned=pinned, replicas=replicas)
            self._audit(
                s,
                "placement.set",
                "placement",
                f"{task}@{row.epoch}",
                {"candidate": candidate, "pinned": pinned, "replicas": replicas},
            )
            return placement_entity(s, row)

    def current_placement(self, task: str) -> e.Placement | None:
        with self._read() as s:
            task_row = _task_row(s, task)
            row = _latest(s, task_row.id)
            return placement_entity(s, row) if row else None

    def list_placements(self) -> list[e.Placement]:
        """The newest placement of every task that has one."""
        with self._read() as s:
            newest = (
                select(PlacementRow.task_id, func.max(PlacementRow.epoch).label("epoch"))
                .group_by(PlacementRow.task_id)
                .subquery()
            )
            rows = s.scalars(
                select(PlacementRow).join(
                    newest,
                    (PlacementRow.task_id == newest.c.task_id)
                    & (PlacementRow.epoch == newest.c.epoch),
                )
            )
            return sorted((placement_entity(s, r) for r in rows), key=lambda p: p.task)

    def unpublished_placements(self) -> list[e.Placement]:
        """Newest placements the fleet has not been told about yet (the outbox)."""
        return [p for p in self.list_placements() if p.published_at is None]

    def mark_published(self, task: str, epoch: int) -> None:
        with self._write() as s:
            task_row = _task_row(s, task)
            row = s.scalar(
                select(PlacementRow).where(
                    PlacementRow.task_id == task_row.id, PlacementRow.epoch == epoch
                )
            )
            if row is None:
                raise NotFound(f"task {task!r} has no placement epoch {epoch}")
            if row.published_at is None:
                row.published_at = utcnow()


def _latest(s: Session, task_id: int) -> PlacementRow | None:
    return s.scalar(
        select(PlacementRow)
        .where(PlacementRow.task_id == task_id)
        .order_by(PlacementRow.epoch.desc())
        .limit(1)
    )


def _new_placement(
    s: Session, task_row: TaskRow, cand: CandidateRow, *, pinned: bool, replicas: int
) -> PlacementRow:
    latest = _latest(s, task_row.id)
    row = PlacementRow(
        task_id=task_row.id,
        candidate_id=cand.id,
        epoch=(latest.epoch + 1) if latest else 1,
        pinned=pinned,
        replicas=replicas,
    )
    s.add(row)
    s.flush()
    return row


def placement_entity(s: Session, r: PlacementRow) -> e.Placement:
    task = s.get(TaskRow, r.task_id)
    cand = s.get(CandidateRow, r.candidate_id)
    return e.Placement(
        r.id,
        task.name if task else "?",
        cand.name if cand else "?",
        r.epoch,
        r.pinned,
        r.replicas,
        r.created_at,
        r.published_at,
    )
