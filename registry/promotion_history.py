"""The promotion history: the append-only rows that say who serves a task, and why.

Every placement epoch has a promotion row (``registry/placements.py``, ``write_epoch``), of one
of four kinds: `promote` (the rule held, or a first champion with an eval run), `override` (an
admin, with a reason), `rollback`, and `placement` (only pinned/replicas of the champion
changed). The champion is the candidate of the newest row, served by the runtime of that row's
placement; the row before it names the pairing a rollback returns to.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from registry import entities as e
from registry.errors import NotFound
from registry.models import CandidateRow, PlacementRow, PromotionRow, TaskRow
from registry.placements import PROMOTION_KINDS
from registry.rows import candidate_entity, get_task_row
from registry.runtimes import DEFAULT_RUNTIME
from registry.transactions import Transactions


class PromotionHistoryRepository:
    def __init__(self, tx: Transactions) -> None:
        self.tx = tx

    def champion(self, task: str) -> e.Candidate | None:
        with self.tx.read() as s:
            row = champion_row(s, get_task_row(s, task).id)
            return candidate_entity(s, row) if row else None

    def list_promotions(self, task: str) -> list[e.Promotion]:
        """The append-only promotion history of a task, newest first."""
        with self.tx.read() as s:
            rows = s.scalars(
                select(PromotionRow)
                .where(PromotionRow.task_id == get_task_row(s, task).id)
                .order_by(PromotionRow.id.desc())
            )
            return [promotion_entity(s, r) for r in rows]


def latest_promotion(
    s: Session, task_id: int, kinds: tuple[str, ...] = PROMOTION_KINDS
) -> PromotionRow | None:
    return s.scalar(
        select(PromotionRow)
        .where(PromotionRow.task_id == task_id, PromotionRow.kind.in_(kinds))
        .order_by(PromotionRow.id.desc())
        .limit(1)
    )


def champion_row(s: Session, task_id: int) -> CandidateRow | None:
    last = latest_promotion(s, task_id)
    return s.get(CandidateRow, last.candidate_id) if last else None


def promotion_runtime(s: Session, promotion: PromotionRow) -> str:
    placement = s.get(PlacementRow, promotion.placement_id)
    return placement.runtime if placement else DEFAULT_RUNTIME


def champion_pairing(s: Session, task_id: int) -> tuple[CandidateRow, str] | None:
    """The champion pairing: the latest promotion's candidate and the runtime it placed."""
    last = latest_promotion(s, task_id)
    if last is None:
        return None
    cand = s.get(CandidateRow, last.candidate_id)
    assert cand is not None
    return cand, promotion_runtime(s, last)


def previous_runtime(s: Session, last: PromotionRow) -> str:
    """The runtime of the pairing that was champion before ``last``."""
    before = s.scalar(
        select(PromotionRow)
        .where(PromotionRow.task_id == last.task_id, PromotionRow.id < last.id)
        .order_by(PromotionRow.id.desc())
        .limit(1)
    )
    return promotion_runtime(s, before) if before else DEFAULT_RUNTIME


def promotion_entity(s: Session, r: PromotionRow) -> e.Promotion:
    task = s.get(TaskRow, r.task_id)
    cand = s.get(CandidateRow, r.candidate_id)
    prev = s.get(CandidateRow, r.previous_candidate_id) if r.previous_candidate_id else None
    placement = s.get(PlacementRow, r.placement_id)
    if task is None or cand is None or placement is None:
        raise NotFound(f"promotion {r.id} refers to missing rows")
    return e.Promotion(
        r.id,
        task.name,
        cand.name,
        prev.name if prev else None,
        r.kind,
        r.actor,
        r.reason,
        list(r.eval_run_ids),
        placement.epoch,
        r.created_at,
        placement.pinned,
        placement.replicas,
        placement.runtime,
    )
