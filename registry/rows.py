"""Row lookups and row -> entity conversions shared by the SQLAlchemy entity stores.

The one home of what several entity modules (catalog, eval runs, placements, promotions) need
from each other's tables, so no module reaches into another's private helpers. A lookup raises
`NotFound` with the message callers show; a conversion returns the plain entity (never the row).
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from registry import entities as e
from registry.errors import NotFound
from registry.models import AdapterRow, BaseModelRow, CandidateRow, TaskRow


def get_task_row(s: Session, name: str) -> TaskRow:
    row = s.scalar(select(TaskRow).where(TaskRow.name == name))
    if row is None:
        raise NotFound(f"unknown task {name!r}")
    return row


def get_model_row(s: Session, name: str) -> BaseModelRow:
    row = s.scalar(select(BaseModelRow).where(BaseModelRow.name == name))
    if row is None:
        raise NotFound(f"unknown model {name!r}")
    return row


def get_adapter_row(s: Session, name: str) -> AdapterRow:
    row = s.scalar(select(AdapterRow).where(AdapterRow.name == name))
    if row is None:
        raise NotFound(f"unknown adapter {name!r}")
    return row


def get_candidate_row(s: Session, task: str, name: str) -> CandidateRow:
    owner = get_task_row(s, task)
    row = s.scalar(
        select(CandidateRow).where(CandidateRow.task_id == owner.id, CandidateRow.name == name)
    )
    if row is None:
        raise NotFound(f"task {task!r} has no candidate {name!r}")
    return row


def task_entity(r: TaskRow) -> e.Task:
    return e.Task(
        r.id,
        r.name,
        r.kind,
        r.description,
        r.suite,
        r.owner,
        r.margin,
        r.auto_promote,
        r.created_at,
        r.max_text_chars,
        r.max_query_chars,
        r.max_document_chars,
        r.prefer,
    )


def model_entity(s: Session, r: BaseModelRow) -> e.BaseModel:
    """The model as callers see it; a variant names its source model (its lineage)."""
    source = s.get(BaseModelRow, r.source_model_id) if r.source_model_id else None
    return e.BaseModel(
        r.id,
        r.name,
        r.path,
        r.package,
        r.sha256,
        r.dims,
        r.max_seq_length,
        r.size_bytes,
        list(r.runtime_kinds),
        r.query_prefix,
        r.passage_prefix,
        r.created_at,
        source.name if source else None,
        r.variant,
        format=r.format,
        endpoint=dict(r.endpoint) if r.endpoint is not None else None,
        probe_fingerprint=r.probe_fingerprint,
        price_per_million=r.price_per_million,
        probed_fingerprint=r.probed_fingerprint,
        probed_at=r.probed_at,
        probe_error=r.probe_error,
    )


def adapter_entity(s: Session, r: AdapterRow) -> e.Adapter:
    base = s.get(BaseModelRow, r.base_model_id)
    parent = s.get(AdapterRow, r.parent_id) if r.parent_id else None
    training = e.TrainingRecord(
        data_fingerprint=r.data_fingerprint,
        train_split=r.train_split,
        hyperparameters=dict(r.hyperparameters),
        seed=r.seed,
        code_version=r.code_version,
        suite=r.suite,
        mlflow_run_id=r.mlflow_run_id,
    )
    return e.Adapter(
        r.id,
        r.name,
        base.name if base else "?",
        parent.name if parent else None,
        r.sha256,
        r.size_bytes,
        training,
        r.created_at,
    )


def candidate_entity(s: Session, r: CandidateRow) -> e.Candidate:
    task = s.get(TaskRow, r.task_id)
    base = s.get(BaseModelRow, r.base_model_id) if r.base_model_id else None
    adapter = s.get(AdapterRow, r.adapter_id) if r.adapter_id else None
    return e.Candidate(
        r.id,
        r.name,
        task.name if task else "?",
        r.kind,
        base.name if base else None,
        adapter.name if adapter else None,
        r.created_at,
    )
