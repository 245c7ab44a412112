"""Sampled requests as the control plane judged them, and the drift windows measured on them.

A sampled request arrives twice (``serving/production_consumer.py``): the gateway's record (who
answered, how fast, the features drift needs) makes the row, and the shadow's reply, once
judged against the champion's, fills in the shadow's side (``ok`` with the agreement per
input, ``shed`` or ``error``). A row never holds the inputs themselves: those stay in stream
``SAMPLES`` for the task's retention, and the row is pruned with them (``expires_at``).
Agreement over time is summarised here with the project's bootstrap (``registry/bootstrap.py``).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from registry import entities as e
from registry.errors import InvalidInput
from registry.models import DriftWindowRow, SampleRow, TaskRow, utcnow
from registry.production_settings import settings_of
from registry.rows import get_task_row
from registry.transactions import Transactions

SHADOW_OUTCOMES = ("ok", "shed", "error")
SERIES_BUCKETS = 12


class SampleRepository:
    def __init__(self, tx: Transactions) -> None:
        self.tx = tx

    def record_sample(self, sample: e.SampleCreate) -> bool:
        """Keep a sampled request (until its task's retention ends); False when it is already
        kept (a redelivered record)."""
        if sample.inputs < 1 or len(sample.lengths) != sample.inputs:
            raise InvalidInput("a sample needs one length per input")
        with self.tx.write(signal=False) as s:
            task_row = get_task_row(s, sample.task)
            if s.scalar(select(SampleRow.id).where(SampleRow.request_id == sample.request_id)):
                return False
            retention = timedelta(days=settings_of(s, task_row).retention_days)
            s.add(
                SampleRow(
                    task_id=task_row.id,
                    request_id=sample.request_id,
                    received_at=sample.received_at,
                    expires_at=sample.received_at + retention,
                    inputs=sample.inputs,
                    champion=sample.champion,
                    champion_model_key=sample.champion_model_key,
                    champion_epoch=sample.champion_epoch,
                    champion_ms=sample.champion_ms,
                    shadow=sample.shadow,
                    shadow_outcome="pending" if sample.shadow else "none",
                    lengths=list(sample.lengths),
                    predicted=list(sample.predicted) if sample.predicted is not None else None,
                    vectors=sample.vectors,
                    dims=sample.dims,
                )
            )
            return True

    def record_shadow_outcome(self, outcome: e.ShadowOutcome) -> bool:
        """The shadow's side of a kept sample; False when no sample has that request id (not
        kept yet, or pruned). A second outcome for one request changes nothing."""
        if outcome.outcome not in SHADOW_OUTCOMES:
            raise InvalidInput(f"unknown shadow outcome {outcome.outcome!r}")
        with self.tx.write(signal=False) as s:
            row = s.scalar(select(SampleRow).where(SampleRow.request_id == outcome.request_id))
            if row is None:
                return False
            if row.shadow_outcome in SHADOW_OUTCOMES:
                return True
            row.shadow_outcome = outcome.outcome
            row.shadow_ms = outcome.shadow_ms
            row.shadow_error = outcome.error
            row.agreement = list(outcome.agreement) if outcome.agreement is not None else None
            row.agreement_extra = dict(outcome.agreement_extra or {}) or None
            return True

    def get_sample(self, request_id: str) -> e.Sample | None:
        with self.tx.read() as s:
            row = s.scalar(select(SampleRow).where(SampleRow.request_id == request_id))
            return sample_entity(s, row) if row else None

    def list_samples(
        self, task: str, *, after_id: int = 0, limit: int = 1000, model_key: str | None = None
    ) -> list[e.Sample]:
        """Kept samples of a task after ``after_id`` (oldest first), optionally only those the
        champion's ``model_key`` answered."""
        with self.tx.read() as s:
            query = (
                select(SampleRow)
                .where(SampleRow.task_id == get_task_row(s, task).id, SampleRow.id > after_id)
                .order_by(SampleRow.id)
                .limit(limit)
            )
            if model_key is not None:
                query = query.where(SampleRow.champion_model_key == model_key)
            return [sample_entity(s, r) for r in s.scalars(query)]

    def agreement_summary(
        self, task: str, *, shadow: str | None = None, buckets: int = SERIES_BUCKETS
    ) -> e.AgreementSummary:
        """The shadow's agreement with the champion over the kept samples it answered (of
        ``shadow``, or of the newest shadow that answered any), with a 95% bootstrap CI, per
        time bucket too, and how many copies were answered, shed or failed."""
        with self.tx.read() as s:
            task_id = get_task_row(s, task).id
            if shadow is None:
                shadow = s.scalar(
                    select(SampleRow.shadow)
                    .where(SampleRow.task_id == task_id, SampleRow.shadow.is_not(None))
                    .order_by(SampleRow.id.desc())
                    .limit(1)
                )
            rows = list(
                s.scalars(
                    select(SampleRow)
                    .where(SampleRow.task_id == task_id, SampleRow.shadow == shadow)
                    .order_by(SampleRow.received_at)
                )
            )
        return summarise(task, shadow, rows, buckets)

    def record_drift_window(self, window: e.DriftWindowCreate) -> e.DriftWindow:
        with self.tx.write(signal=False) as s:
            task_row = get_task_row(s, window.task)
            row = DriftWindowRow(
                task_id=task_row.id,
                first_sample_id=window.first_sample_id,
                last_sample_id=window.last_sample_id,
                size=window.size,
                champion=window.champion,
                suite_version=window.suite_version,
                signals=list(window.signals),
                p_min=window.p_min,
                alpha=window.alpha,
                drifted=window.drifted,
            )
            s.add(row)
            s.flush()
            if window.drifted:
                self.tx.audit(
                    s, "drift.flag", "task", window.task, {"window": row.id, "p_min": window.p_min}
                )
            return drift_entity(task_row, row)

    def drift_windows(self, task: str, *, limit: int = 100) -> list[e.DriftWindow]:
        """A task's drift windows, newest first."""
        with self.tx.read() as s:
            task_row = get_task_row(s, task)
            rows = s.scalars(
                select(DriftWindowRow)
                .where(DriftWindowRow.task_id == task_row.id)
                .order_by(DriftWindowRow.id.desc())
                .limit(limit)
            )
            return [drift_entity(task_row, r) for r in rows]

    def prune_samples(self, *, now: datetime | None = None) -> int:
        """Delete the samples whose task's retention has passed; returns how many."""
        with self.tx.write(signal=False) as s:
            result = s.execute(delete(SampleRow).where(SampleRow.expires_at < (now or utcnow())))
            return int(getattr(result, "rowcount", 0) or 0)


def summarise(
    task: str, shadow: str | None, rows: list[SampleRow], buckets: int
) -> e.AgreementSummary:
    from registry.bootstrap import bootstrap_ci  # numpy: only when a summary is asked for

    outcomes = {k: 0 for k in ("pending", *SHADOW_OUTCOMES)}
    values: list[float] = []
    extra: dict[str, list[float]] = {}
    timed: list[tuple[datetime, list[float]]] = []
    for row in rows:
        outcomes[row.shadow_outcome] = outcomes.get(row.shadow_outcome, 0) + 1
        if row.shadow_outcome == "ok" and row.agreement:
            values.extend(row.agreement)
            timed.append((row.received_at, list(row.agreement)))
            for name, measures in (row.agreement_extra or {}).items():
                extra.setdefault(name, []).extend(measures)
    if not values:
        return e.AgreementSummary(task, shadow, 0, None, None, None, {}, outcomes, [])
    ci = bootstrap_ci(values)
    return e.AgreementSummary(
        task=task,
        shadow=shadow,
        inputs=len(values),
        estimate=ci.estimate,
        low=ci.low,
        high=ci.high,
        extra={k: sum(v) / len(v) for k, v in extra.items() if v},
        outcomes=outcomes,
        series=_series(timed, buckets),
        champion_ms_p50=_median([r.champion_ms for r in rows]),
        shadow_ms_p50=_median([r.shadow_ms for r in rows if r.shadow_ms is not None]),
    )


def _series(timed: list[tuple[datetime, list[float]]], buckets: int) -> list[e.AgreementPoint]:
    from registry.bootstrap import bootstrap_ci

    first, last = timed[0][0], timed[-1][0]
    width = max((last - first) / max(buckets, 1), timedelta(seconds=1))
    grouped: dict[int, list[float]] = {}
    for at, measures in timed:
        grouped.setdefault(min(int((at - first) / width), buckets - 1), []).extend(measures)
    points = []
    for index in sorted(grouped):
        ci = bootstrap_ci(grouped[index])
        points.append(
            e.AgreementPoint(
                first + width * index, len(grouped[index]), ci.estimate, ci.low, ci.high
            )
        )
    return points


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def sample_count(s: Session, task_id: int) -> int:
    return int(s.scalar(select(func.count()).where(SampleRow.task_id == task_id)) or 0)


def sample_entity(s: Session, r: SampleRow) -> e.Sample:
    task = s.get(TaskRow, r.task_id)
    return e.Sample(
        id=r.id,
        task=task.name if task else "?",
        request_id=r.request_id,
        received_at=r.received_at,
        inputs=r.inputs,
        champion=r.champion,
        champion_model_key=r.champion_model_key,
        champion_epoch=r.champion_epoch,
        champion_ms=r.champion_ms,
        shadow=r.shadow,
        shadow_outcome=r.shadow_outcome,
        shadow_ms=r.shadow_ms,
        agreement=list(r.agreement) if r.agreement is not None else None,
        agreement_extra=dict(r.agreement_extra) if r.agreement_extra else None,
        lengths=list(r.lengths),
        predicted=list(r.predicted) if r.predicted is not None else None,
        vectors=r.vectors,
        dims=r.dims,
    )


def drift_entity(task_row: TaskRow, r: DriftWindowRow) -> e.DriftWindow:
    return e.DriftWindow(
        id=r.id,
        task=task_row.name,
        created_at=r.created_at,
        first_sample_id=r.first_sample_id,
        last_sample_id=r.last_sample_id,
        size=r.size,
        champion=r.champion,
        suite_version=r.suite_version,
        signals=list(r.signals),
        p_min=r.p_min,
        alpha=r.alpha,
        drifted=r.drifted,
    )
