"""Placements: the versioned (epoch) instruction to the fleet, with an outbox for publishing.

A new epoch is written only by `write_epoch`, together with its promotion row: promote,
override, rollback (the candidate changes) or placement (only pinned/replicas of the champion
change). So the promotion history names every epoch, and no route places a candidate that no
promotion backs. Each epoch names the runtime kind (torch, candle, http) that serves it; only
workers of that kind run the task.
"""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from registry import entities as e
from registry.errors import InvalidInput, NotFound
from registry.models import CandidateRow, PlacementRow, PromotionRow, TaskRow, utcnow
from registry.rows import get_task_row
from registry.runtimes import DEFAULT_RUNTIME
from registry.transactions import Transactions


class PlacementRepository:
    def __init__(self, tx: Transactions) -> None:
        self.tx = tx

    def current_placement(self, task: str) -> e.Placement | None:
        with self.tx.read() as s:
            task_row = get_task_row(s, task)
            row = latest_placement_row(s, task_row.id)
            return placement_entity(s, row) if row else None

    def list_placements(self) -> list[e.Placement]:
        """The newest placement of every task that has one."""
        with self.tx.read() as s:
            return newest_placements(s, unpublished_only=False)

    def unpublished_placements(self) -> list[e.Placement]:
        """Newest placements the fleet has not been told about yet (the outbox).

        The publisher asks this every poll interval (0.5 s), so it is one query whose rows
        are only the pending placements: an idle control plane reads nothing per task."""
        with self.tx.read() as s:
            return newest_placements(s, unpublished_only=True)

    def mark_published(self, task: str, epoch: int) -> None:
        # The publisher's own bookkeeping: nothing new to publish, so no commit signal.
        with self.tx.write(signal=False) as s:
            task_row = get_task_row(s, task)
            row = s.scalar(
                select(PlacementRow).where(
                    PlacementRow.task_id == task_row.id, PlacementRow.epoch == epoch
                )
            )
            if row is None:
                raise NotFound(f"task {task!r} has no placement epoch {epoch}")
            if row.published_at is None:
                row.published_at = utcnow()


def latest_placement_row(s: Session, task_id: int) -> PlacementRow | None:
    return s.scalar(
        select(PlacementRow)
        .where(PlacementRow.task_id == task_id)
        .order_by(PlacementRow.epoch.desc())
        .limit(1)
    )


# Far above any fleet, far below any integer column's limit.
MAX_REPLICAS = 1024
CANDIDATE_CHANGES = ("promote", "override", "rollback")
PROMOTION_KINDS = (*CANDIDATE_CHANGES, "placement")


def check_replicas(replicas: int) -> int:
    if not 1 <= replicas <= MAX_REPLICAS:
        raise InvalidInput(f"replicas must be between 1 and {MAX_REPLICAS}; got {replicas}")
    return replicas


def write_epoch(
    s: Session,
    task_row: TaskRow,
    cand: CandidateRow,
    *,
    kind: str,
    actor: str,
    reason: str,
    previous: CandidateRow | None,
    eval_run_ids: list[int],
    pinned: bool | None = None,
    replicas: int | None = None,
    runtime: str | None = None,
) -> PromotionRow:
    """The next placement epoch and the promotion row that backs it, in the caller's transaction.

    `pinned`/`replicas` default to the previous epoch's (pinned and 1 for a first placement);
    `runtime` to the previous epoch's when it places the same candidate, else torch.
    """
    if kind not in PROMOTION_KINDS:
        raise InvalidInput(f"unknown promotion kind {kind!r}")
    if cand.base_model_id is None:
        raise InvalidInput(f"a {cand.kind} candidate has no model to place on the fleet")
    latest = latest_placement_row(s, task_row.id)
    if pinned is None:
        pinned = latest.pinned if latest else True
    if replicas is None:
        replicas = latest.replicas if latest else 1
    if runtime is None:
        same = latest is not None and latest.candidate_id == cand.id
        runtime = latest.runtime if same and latest else DEFAULT_RUNTIME
    placement = PlacementRow(
        task_id=task_row.id,
        candidate_id=cand.id,
        epoch=(latest.epoch + 1) if latest else 1,
        pinned=pinned,
        replicas=check_replicas(replicas),
        runtime=runtime,
    )
    s.add(placement)
    s.flush()
    row = PromotionRow(
        task_id=task_row.id,
        candidate_id=cand.id,
        previous_candidate_id=previous.id if previous else None,
        kind=kind,
        actor=actor,
        reason=reason,
        eval_run_ids=eval_run_ids,
        placement_id=placement.id,
    )
    s.add(row)
    s.flush()
    return row


def newest_placements(s: Session, *, unpublished_only: bool) -> list[e.Placement]:
    """Each task's newest placement (only those not yet published, when asked), by task name:
    one query with the task and candidate names joined, whatever the number of tasks."""
    newest = (
        select(PlacementRow.task_id, func.max(PlacementRow.epoch).label("epoch"))
        .group_by(PlacementRow.task_id)
        .subquery()
    )
    query = (
        select(PlacementRow, TaskRow.name, CandidateRow.name)
        .join(
            newest,
            (PlacementRow.task_id == newest.c.task_id) & (PlacementRow.epoch == newest.c.epoch),
        )
        .join(TaskRow, TaskRow.id == PlacementRow.task_id)
        .join(CandidateRow, CandidateRow.id == PlacementRow.candidate_id)
        .order_by(TaskRow.name)
    )
    if unpublished_only:
        query = query.where(PlacementRow.published_at.is_(None))
    return [placement_of(r, task, candidate) for r, task, candidate in s.execute(query)]


def placement_entity(s: Session, r: PlacementRow) -> e.Placement:
    task = s.get(TaskRow, r.task_id)
    cand = s.get(CandidateRow, r.candidate_id)
    return placement_of(r, task.name if task else "?", cand.name if cand else "?")


def placement_of(r: PlacementRow, task: str, candidate: str) -> e.Placement:
    return e.Placement(
        r.id,
        task,
        candidate,
        r.epoch,
        r.pinned,
        r.replicas,
        r.created_at,
        r.published_at,
        r.runtime,
    )
