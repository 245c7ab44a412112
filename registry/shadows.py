"""Shadows: a challenger placed beside a task's champion that answers a sampled copy of live
requests, never a caller (docs/architecture.md "Production").

Every start and stop is a recorded row, like a promotion: who, why, which candidate on which
runtime, the sample rate, and the shadow placement epoch it writes. The task's newest row is
its shadow's state; the publisher (``serving/placements.py``) puts a started shadow into KV
``placements`` under ``<task>.shadow`` (marked shadow) and deletes the key for a stopped one,
then marks the row published (the same outbox as placements). Starting a shadow also sets the
task's sample rate (``registry/production_settings.py``): sampling is the task's, so it goes
on (for feedback and drift) after the shadow stops.
"""

from __future__ import annotations

from dataclasses import replace

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from registry import entities as e
from registry.errors import Conflict, InvalidInput, NotFound, PermissionDenied
from registry.evalruns import newest_run_row
from registry.models import AdapterRow, BaseModelRow, CandidateRow, ShadowRow, TaskRow, utcnow
from registry.production_settings import check_settings, settings_of, write_settings
from registry.promotion_history import champion_pairing
from registry.rows import get_candidate_row, get_task_row
from registry.runtimes import DEFAULT_RUNTIME, check_servable
from registry.transactions import Transactions

SHADOW_ROLES = ("promoter", "admin")


class ShadowRepository:
    def __init__(self, tx: Transactions) -> None:
        self.tx = tx

    def start_shadow(
        self,
        task: str,
        candidate: str,
        *,
        sample_rate: float,
        runtime: str | None = None,
        reason: str = "",
    ) -> e.Shadow:
        """Place ``candidate`` (on ``runtime``; default the runtime of its newest eval run)
        as the task's shadow and sample ``sample_rate`` of its requests. A running shadow of
        another candidate is replaced (one row: the start of the new one)."""
        if not set(self.tx.roles) & set(SHADOW_ROLES):
            raise PermissionDenied("starting a shadow needs the promoter or admin role")
        with self.tx.write() as s:
            task_row = get_task_row(s, task)
            cand = get_candidate_row(s, task, candidate)
            # A fitted baseline (tfidf-lr, rerank bm25) has its artifact as base model and is
            # placed like any model; a model-free one has nothing to place.
            if cand.base_model_id is None:
                raise InvalidInput(
                    f"a {cand.kind} candidate has no model to place on the fleet, so it cannot "
                    "be a shadow"
                )
            runtime = runtime or _evaluated_runtime(s, cand) or DEFAULT_RUNTIME
            base = s.get(BaseModelRow, cand.base_model_id)
            assert base is not None
            adapter = s.get(AdapterRow, cand.adapter_id) if cand.adapter_id else None
            adapter_name = adapter.name if adapter is not None else None
            check_servable(
                runtime,
                model=base.name,
                model_runtimes=list(base.runtime_kinds),
                adapter=adapter_name,
                task_kind=task_row.kind,
                variant=base.variant,
                model_format=base.format,
                endpoint_kind=(base.endpoint or {}).get("kind"),
            )
            champion = champion_pairing(s, task_row.id)
            if champion is None:
                raise InvalidInput(
                    f"task {task!r} has no champion yet: a shadow is compared with the champion "
                    "on live requests, so promote one first"
                )
            if champion[0].id == cand.id:
                raise InvalidInput(f"{candidate!r} is the champion of {task!r}, not a challenger")
            current = latest_shadow_row(s, task_row.id)
            settings = check_settings(replace(settings_of(s, task_row), sample_rate=sample_rate))
            if (
                current is not None
                and current.action == "start"
                and (current.candidate_id, current.runtime, current.sample_rate)
                == (cand.id, runtime, sample_rate)
            ):
                raise Conflict(
                    f"{candidate!r} on {runtime} already shadows {task!r} at {sample_rate:g}"
                )
            write_settings(s, task_row, settings)
            row = _write(s, task_row, cand, "start", runtime, sample_rate, self.tx.actor, reason)
            self.tx.audit(
                s,
                "shadow.start",
                "task",
                task,
                {"candidate": candidate, "runtime": runtime, "sample_rate": sample_rate},
            )
            return shadow_entity(s, row)

    def stop_shadow(self, task: str, *, reason: str = "") -> e.Shadow:
        """End the task's shadow: its placement is removed; sampling goes on at the task's
        rate (``taskfleet production set TASK --sample 0`` ends it)."""
        if not set(self.tx.roles) & set(SHADOW_ROLES):
            raise PermissionDenied("stopping a shadow needs the promoter or admin role")
        with self.tx.write() as s:
            task_row = get_task_row(s, task)
            current = latest_shadow_row(s, task_row.id)
            if current is None or current.action != "start":
                raise InvalidInput(f"task {task!r} has no shadow to stop")
            cand = s.get(CandidateRow, current.candidate_id)
            assert cand is not None
            row = _write(
                s,
                task_row,
                cand,
                "stop",
                current.runtime,
                current.sample_rate,
                self.tx.actor,
                reason,
            )
            self.tx.audit(s, "shadow.stop", "task", task, {"candidate": cand.name})
            return shadow_entity(s, row)

    def current_shadow(self, task: str) -> e.Shadow | None:
        """The task's running shadow, or None."""
        with self.tx.read() as s:
            row = latest_shadow_row(s, get_task_row(s, task).id)
            return shadow_entity(s, row) if row is not None and row.action == "start" else None

    def shadow_history(self, task: str | None = None) -> list[e.Shadow]:
        """Every start and stop (of one task, or all), newest first."""
        with self.tx.read() as s:
            query = select(ShadowRow).order_by(ShadowRow.id.desc())
            if task is not None:
                query = query.where(ShadowRow.task_id == get_task_row(s, task).id)
            return [shadow_entity(s, r) for r in s.scalars(query)]

    def unpublished_shadows(self) -> list[e.Shadow]:
        """Per task, its newest shadow row when the fleet has not been told yet (the outbox)."""
        with self.tx.read() as s:
            newest = (
                select(ShadowRow.task_id, func.max(ShadowRow.epoch).label("epoch"))
                .group_by(ShadowRow.task_id)
                .subquery()
            )
            rows = s.scalars(
                select(ShadowRow)
                .join(
                    newest,
                    (ShadowRow.task_id == newest.c.task_id) & (ShadowRow.epoch == newest.c.epoch),
                )
                .where(ShadowRow.published_at.is_(None))
            )
            return sorted((shadow_entity(s, r) for r in rows), key=lambda x: x.task)

    def mark_shadow_published(self, task: str, epoch: int) -> None:
        with self.tx.write(signal=False) as s:
            row = s.scalar(
                select(ShadowRow).where(
                    ShadowRow.task_id == get_task_row(s, task).id, ShadowRow.epoch == epoch
                )
            )
            if row is None:
                raise NotFound(f"task {task!r} has no shadow epoch {epoch}")
            if row.published_at is None:
                row.published_at = utcnow()


def stop_shadow_of(
    s: Session, task_row: TaskRow, cand: CandidateRow, *, actor: str, why: str
) -> ShadowRow | None:
    """In the caller's transaction: stop the task's shadow if ``cand`` is it (a promotion of
    the shadow makes it the champion; a stop row says so)."""
    current = latest_shadow_row(s, task_row.id)
    if current is None or current.action != "start" or current.candidate_id != cand.id:
        return None
    return _write(s, task_row, cand, "stop", current.runtime, current.sample_rate, actor, why)


def _evaluated_runtime(s: Session, cand: CandidateRow) -> str | None:
    run = newest_run_row(s, cand.id)
    return run.runtime if run is not None else None


def _write(
    s: Session,
    task_row: TaskRow,
    cand: CandidateRow,
    action: str,
    runtime: str,
    sample_rate: float,
    actor: str,
    reason: str,
) -> ShadowRow:
    latest = latest_shadow_row(s, task_row.id)
    row = ShadowRow(
        task_id=task_row.id,
        action=action,
        candidate_id=cand.id,
        runtime=runtime,
        sample_rate=sample_rate,
        epoch=(latest.epoch + 1) if latest else 1,
        actor=actor,
        reason=reason.strip() or f"shadow {action}",
    )
    s.add(row)
    s.flush()
    return row


def latest_shadow_row(s: Session, task_id: int) -> ShadowRow | None:
    return s.scalar(
        select(ShadowRow)
        .where(ShadowRow.task_id == task_id)
        .order_by(ShadowRow.epoch.desc())
        .limit(1)
    )


def shadow_entity(s: Session, r: ShadowRow) -> e.Shadow:
    task = s.get(TaskRow, r.task_id)
    cand = s.get(CandidateRow, r.candidate_id)
    return e.Shadow(
        id=r.id,
        task=task.name if task else "?",
        action=r.action,
        candidate=cand.name if cand else "?",
        runtime=r.runtime,
        sample_rate=r.sample_rate,
        epoch=r.epoch,
        actor=r.actor,
        reason=r.reason,
        created_at=r.created_at,
        published_at=r.published_at,
    )
