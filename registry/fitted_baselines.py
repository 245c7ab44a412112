"""Servable lexical baselines: a tfidf-lr or bm25 candidate fitted into its own artifact.

``add_baseline_candidate`` has the caller's ``BaselineBuilder`` fit the baseline on the task's
suite (tfidf-lr on its training split, bm25 on the term statistics of its corpus), stores the
folder content-addressed like a variant, records it as a base model of that format (a model
named ``<task>-<candidate>``, served by the Python runtime only) and adds the candidate on it.
So when the baseline wins it is promoted, placed and fetched by sha256 like any model, and the
eval scores the very artifact the fleet serves. The registry imports no evals or serving code:
the shell passes the builder (``taskfleet.baseline_builder.fit_baseline``), as it does the variant
builder. BM25 for retrieval makes no embedding: it stays a model-free candidate.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from sqlalchemy import select

from registry import entities as e
from registry.artifacts import ArtifactStore
from registry.candidates import CandidateRepository
from registry.errors import AlreadyExists, InvalidInput
from registry.kinds import check_name
from registry.models import BaseModelRow, CandidateRow
from registry.rows import get_task_row
from registry.runtimes import BASELINE_FORMATS, BASELINE_RUNTIMES
from registry.store import BaselineBuilder
from registry.suite_versions import newest_suite_row, suite_entity
from registry.transactions import Transactions


def servable_baseline(kind: str | None, task_kind: str) -> bool:
    """Is a ``kind`` candidate of a ``task_kind`` task fitted into a servable artifact?"""
    return kind is not None and BASELINE_FORMATS.get(kind) == task_kind


class BaselineRepository:
    def __init__(
        self, tx: Transactions, artifacts: ArtifactStore, candidates: CandidateRepository
    ) -> None:
        self.tx = tx
        self.artifacts = artifacts  # the fitted folder is stored by sha256, like a variant
        self.candidates = candidates  # and competes as a candidate of its kind

    def add_baseline_candidate(
        self, task: str, kind: str, *, fit: BaselineBuilder, name: str | None = None
    ) -> e.Candidate:
        """Fit ``kind`` on ``task``'s newest suite version, register the artifact as a base
        model of that format, and add the candidate on it."""
        candidate = check_name("candidate", name or kind)
        with self.tx.read() as s:
            task_row = get_task_row(s, task)
            if not servable_baseline(kind, task_row.kind):
                raise InvalidInput(
                    f"a {kind} candidate of a {task_row.kind} task is not fitted into an artifact"
                )
            suite_row = newest_suite_row(s, task_row.suite)
            assert suite_row is not None  # a task is bound to a registered suite
            suite = suite_entity(suite_row)
            if s.scalar(
                select(CandidateRow).where(
                    CandidateRow.task_id == task_row.id, CandidateRow.name == candidate
                )
            ):
                raise AlreadyExists(
                    f"task {task!r} already has a candidate named {candidate!r}; give the fitted "
                    "one another --name"
                )
            model = check_name("model", f"{task}-{candidate}")
            if s.scalar(select(BaseModelRow).where(BaseModelRow.name == model)):
                raise AlreadyExists(f"model {model!r} already exists; choose another --name")
        with tempfile.TemporaryDirectory(prefix="taskfleet-baseline-") as tmp:
            fitted = Path(tmp) / kind
            fit(kind, suite, fitted)
            digest = self.artifacts.put_dir(fitted)
        stored = self.artifacts.path_for(digest.sha256)
        with self.tx.write() as s:
            if s.scalar(select(BaseModelRow).where(BaseModelRow.name == model)):
                raise AlreadyExists(f"model {model!r} already exists; choose another --name")
            row = BaseModelRow(
                name=model,
                path=str(stored.resolve()),
                package=None,
                sha256=digest.sha256,
                dims=None,
                max_seq_length=None,
                size_bytes=digest.size_bytes,
                runtime_kinds=list(BASELINE_RUNTIMES),
                query_prefix="",
                passage_prefix="",
                format=kind,
            )
            s.add(row)
            s.flush()
            self.tx.audit(
                s,
                "model.fit",
                "base_model",
                model,
                {"sha256": digest.sha256, "format": kind, "suite": suite.name},
            )
        return self.candidates.add_candidate(task, name=candidate, base=model, kind=kind)
