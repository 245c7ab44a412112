"""Eval runs: written once, complete, by the eval harness; read by leaderboards and promotion."""

from __future__ import annotations

import math
from dataclasses import replace

from sqlalchemy import select
from sqlalchemy.orm import Session

from registry import entities as e
from registry.errors import InvalidInput, NotFound
from registry.kinds import BASELINE_KINDS
from registry.models import CandidateRow, EvalRunRow, SuiteRow, TaskRow
from registry.rows import get_candidate_row, get_task_row
from registry.runtimes import DEFAULT_RUNTIME, RUNTIME_KINDS
from registry.suite_versions import newest_suite_row
from registry.transactions import Transactions


class EvalRunRepository:
    def __init__(self, tx: Transactions) -> None:
        self.tx = tx

    def record_eval_run(self, run: e.EvalRunCreate) -> e.EvalRun:
        """Record a complete run, scored on a registered version of the task's own suite."""
        _validate(run)
        with self.tx.write() as s:
            cand = get_candidate_row(s, run.task, run.candidate)
            run = replace(run, suite_version=str(_scored_version(s, run).version))
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
                runtime=run.runtime or (None if cand.kind in BASELINE_KINDS else DEFAULT_RUNTIME),
                details=dict(run.details) if run.details is not None else None,
            )
            s.add(row)
            s.flush()
            self.tx.audit(
                s,
                "eval.record",
                "eval_run",
                str(row.id),
                {"task": run.task, "candidate": run.candidate, run.main_metric: run.main_score},
            )
            return eval_entity(s, row)

    def get_eval_run(self, run_id: int) -> e.EvalRun:
        with self.tx.read() as s:
            row = s.get(EvalRunRow, run_id)
            if row is None:
                raise NotFound(f"unknown eval run {run_id}")
            return eval_entity(s, row)

    def list_eval_runs(self, task: str, candidate: str | None = None) -> list[e.EvalRun]:
        """Eval runs of a task (optionally one candidate), newest first."""
        with self.tx.read() as s:
            task_row = get_task_row(s, task)
            query = (
                select(EvalRunRow)
                .join(CandidateRow, CandidateRow.id == EvalRunRow.candidate_id)
                .where(CandidateRow.task_id == task_row.id)
                .order_by(EvalRunRow.created_at.desc(), EvalRunRow.id.desc())
            )
            if candidate is not None:
                query = query.where(CandidateRow.id == get_candidate_row(s, task, candidate).id)
            return [eval_entity(s, r) for r in s.scalars(query)]

    def latest_eval_run(
        self, task: str, candidate: str, *, suite_fingerprint: str | None = None
    ) -> e.EvalRun | None:
        for run in self.list_eval_runs(task, candidate):
            if suite_fingerprint is None or run.suite_fingerprint == suite_fingerprint:
                return run
        return None

    def leaderboard(self, task: str) -> dict[str, e.EvalRun]:
        """Per candidate, the run that ranks it: on the newest version of the task's suite and
        its test split only (a run of another version, another folder or the training split
        never ranks), the newest full run, else the newest sampled one."""
        with self.tx.read() as s:
            task_row = get_task_row(s, task)
            suite = newest_suite_row(s, task_row.suite)
            if suite is None:
                return {}
            cands = s.scalars(select(CandidateRow).where(CandidateRow.task_id == task_row.id))
            board: dict[str, e.EvalRun] = {}
            for cand in cands:
                row = ranking_run_row(s, cand.id, suite.fingerprint, suite.test_split)
                if row is not None:
                    board[cand.name] = eval_entity(s, row)
            return board

    def ranking_run(self, task: str, candidate: str) -> e.EvalRun | None:
        """The run the leaderboard and the promotion rule use for this candidate."""
        return self.leaderboard(task).get(candidate)


def _scored_version(s: Session, run: e.EvalRunCreate) -> SuiteRow:
    task_row = get_task_row(s, run.task)
    if run.suite_name != task_row.suite:
        raise InvalidInput(
            f"task {run.task!r} is scored on suite {task_row.suite!r}, not {run.suite_name!r}"
        )
    version = s.scalar(
        select(SuiteRow).where(
            SuiteRow.name == run.suite_name, SuiteRow.fingerprint == run.suite_fingerprint
        )
    )
    if version is None:
        raise InvalidInput(
            f"suite {run.suite_name!r} has no registered version with fingerprint "
            f"{run.suite_fingerprint[:12]}; register the data first (`taskfleet suite add`)"
        )
    if run.split not in (version.test_split, version.train_split, version.live_split):
        raise InvalidInput(f"suite {run.suite_name!r} has no split {run.split!r}")
    return version


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
        details=dict(r.details) if r.details is not None else None,
    )


def ranking_run_row(
    s: Session,
    candidate_id: int,
    suite_fingerprint: str,
    split: str,
    *,
    runtime: str | None = None,
) -> EvalRunRow | None:
    """Newest full run of a candidate on exactly this suite version and split (through
    ``runtime``, when given), else its newest sampled run there."""
    query = select(EvalRunRow).where(
        EvalRunRow.candidate_id == candidate_id,
        EvalRunRow.suite_fingerprint == suite_fingerprint,
        EvalRunRow.split == split,
    )
    if runtime is not None:
        query = query.where(EvalRunRow.runtime == runtime)
    newest = query.order_by(EvalRunRow.created_at.desc(), EvalRunRow.id.desc())
    full = s.scalar(newest.where(EvalRunRow.sample_size.is_(None)).limit(1))
    return full if full is not None else s.scalar(newest.limit(1))


def newest_run_row(s: Session, candidate_id: int) -> EvalRunRow | None:
    """A candidate's newest run, on any suite version, split or runtime."""
    return s.scalar(
        select(EvalRunRow)
        .where(EvalRunRow.candidate_id == candidate_id)
        .order_by(EvalRunRow.created_at.desc(), EvalRunRow.id.desc())
        .limit(1)
    )
