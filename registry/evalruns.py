"""Eval runs: written once, complete, by the eval harness; read by leaderboards and promotion."""

from __future__ import annotations

import math

from sqlalchemy import select
from sqlalchemy.orm import Session

from registry import entities as e
from registry.base import ServiceBase
from registry.catalog import _candidate_row, _task_row
from registry.errors import InvalidInput, NotFound
from registry.models import CandidateRow, EvalRunRow, TaskRow
from registry.runtimes import DEFAULT_RUNTIME, RUNTIME_KINDS


class EvalRunMixin(ServiceBase):
    def record_eval_run(self, run: e.EvalRunCreate) -> e.EvalRun:
        _validate(run)
        with self._write() as s:
            cand = _candidate_row(s, run.task, run.candidate)
            row = EvalRunRow(
                candidate_id=cand.id,
                suite_name=run.suite_name,
                suite_version=run.suite_version,
                suite_fingerprint=run.suite_fingerprint,
                split=run.split,
                main_metric=run.main_metric,
                metrics=dict(run.metrics),
                ci={k: [float(lo), float(hi)] for k, (lo, hi) in run.ci.items()},
                cost=dict(run.cost),
                per_query=dict(run.per_query),
                model_fingerprint=run.model_fingerprint,
                adapter_fingerprint=run.adapter_fingerprint,
                sample_size=run.sample_size,
                warnings=list(run.warnings),
                code_version=run.code_version,
                mlflow_run_id=run.mlflow_run_id,
                wall_seconds=run.wall_seconds,
                # A model's run that names no runtime was scored in-process, by torch.
                runtime=run.runtime or (None if cand.kind == "bm25" else DEFAULT_RUNTIME),
            )
            s.add(row)
            s.flush()
            self._audit(
                s,
                "eval.record",
                "eval_run",
                str(row.id),
                {"task": run.task, "candidate": run.candidate, run.main_metric: run.main_score},
            )
            return eval_entity(s, row)

    def get_eval_run(self, run_id: int) -> e.EvalRun:
        with self._read() as s:
            row = s.get(EvalRunRow, run_id)
            if row is None:
                raise NotFound(f"unknown eval run {run_id}")
            return eval_entity(s, row)

    def list_eval_runs(self, task: str, candidate: str | None = None) -> list[e.EvalRun]:
        """Eval runs of a task (optionally one candidate), newest first."""
        with self._read() as s:
            task_row = _task_row(s, task)
            query = (
                select(EvalRunRow)
                .join(CandidateRow, CandidateRow.id == EvalRunRow.candidate_id)
                .where(CandidateRow.task_id == task_row.id)
                .order_by(EvalRunRow.created_at.desc(), EvalRunRow.id.desc())
            )
            if candidate is not None:
                query = query.where(CandidateRow.id == _candidate_row(s, task, candidate).id)
            return [eval_entity(s, r) for r in s.scalars(query)]

    def latest_eval_run(
        self, task: str, candidate: str, *, suite_fingerprint: str | None = None
    ) -> e.EvalRun | None:
        for run in self.list_eval_runs(task, candidate):
            if suite_fingerprint is None or run.suite_fingerprint == suite_fingerprint:
                return run
        return None


def _validate(run: e.EvalRunCreate) -> None:
    if run.main_metric not in run.metrics:
        raise InvalidInput(f"main metric {run.main_metric!r} missing from the run's metrics")
    for name, value in run.metrics.items():
        if not math.isfinite(value):
            raise InvalidInput(f"metric {name!r} is not a finite number: {value}")
    if not run.per_query:
        raise InvalidInput("an eval run needs its per-query scores (for paired bootstrap)")
    if run.runtime is not None and run.runtime not in RUNTIME_KINDS:
        raise InvalidInput(f"unknown runtime {run.runtime!r}; known: {', '.join(RUNTIME_KINDS)}")


def eval_entity(s: Session, r: EvalRunRow) -> e.EvalRun:
    cand = s.get(CandidateRow, r.candidate_id)
    task = s.get(TaskRow, cand.task_id) if cand else None
    return e.EvalRun(
        id=r.id,
        task=task.name if task else "?",
        candidate=cand.name if cand else "?",
        suite_name=r.suite_name,
        suite_version=r.suite_version,
        suite_fingerprint=r.suite_fingerprint,
        split=r.split,
        main_metric=r.main_metric,
        metrics=dict(r.metrics),
        ci={k: (v[0], v[1]) for k, v in r.ci.items()},
        cost=dict(r.cost),
        per_query=dict(r.per_query),
        model_fingerprint=r.model_fingerprint,
        adapter_fingerprint=r.adapter_fingerprint,
        sample_size=r.sample_size,
        warnings=list(r.warnings),
        code_version=r.code_version,
        mlflow_run_id=r.mlflow_run_id,
        wall_seconds=r.wall_seconds,
        created_at=r.created_at,
        runtime=r.runtime,
    )


def latest_run_row(
    s: Session,
    candidate_id: int,
    *,
    suite_fingerprint: str | None = None,
    split: str | None = None,
    runtime: str | None = None,
) -> EvalRunRow | None:
    """The newest run of a candidate (through ``runtime``, when given)."""
    query = select(EvalRunRow).where(EvalRunRow.candidate_id == candidate_id)
    if runtime is not None:
        query = query.where(EvalRunRow.runtime == runtime)
    if suite_fingerprint is not None:
        query = query.where(EvalRunRow.suite_fingerprint == suite_fingerprint)
    if split is not None:
        query = query.where(EvalRunRow.split == split)
    return s.scalar(query.order_by(EvalRunRow.created_at.desc(), EvalRunRow.id.desc()).limit(1))
