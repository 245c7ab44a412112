"""ORM rows. Only `registry.service` reads and writes them; callers get `registry.entities`."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

from registry.limits import (
    DEFAULT_MAX_DOCUMENT_CHARS,
    DEFAULT_MAX_QUERY_CHARS,
    DEFAULT_MAX_TEXT_CHARS,
)

# Explicit constraint names keep Alembic migrations identical on SQLite and PostgreSQL.
NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite stores them naive)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value.astimezone(UTC) if value is not None else None

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC) if value is not None else None


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


def _created() -> Mapped[datetime]:
    return mapped_column(UTCDateTime(), default=utcnow, nullable=False)


class TaskRow(Base):
    __tablename__ = "tasks"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True, nullable=False)
    kind: Mapped[str] = mapped_column(String(32), nullable=False)
    description: Mapped[str] = mapped_column(Text, default="", nullable=False)
    suite: Mapped[str] = mapped_column(String(128), nullable=False)
    owner: Mapped[str] = mapped_column(String(128), default="", nullable=False)
    margin: Mapped[float] = mapped_column(Float, default=0.0, nullable=False)
    auto_promote: Mapped[bool] = mapped_column(Boolean, default=False, nullable=False)
    created_at: Mapped[datetime] = _created()
    # Per-text limits in characters that gateways enforce (registry/limits.py; migration 0008).
    max_text_chars: Mapped[int] = mapped_column(
        Integer, default=DEFAULT_MAX_TEXT_CHARS, nullable=False
    )
    max_query_chars: Mapped[int] = mapped_column(
        Integer, default=DEFAULT_MAX_QUERY_CHARS, nullable=False
    )
    max_document_chars: Mapped[int] = mapped_column(
        Integer, default=DEFAULT_MAX_DOCUMENT_CHARS, nullable=False
    )
    # "best": the rule asks a challenger to beat the champion; "cheapest": a cheaper one that
    # is non-inferior within the margin may replace it (registry/recommendation.py).
    prefer: Mapped[str] = mapped_column(
        String(16), default="best", server_default="best", nullable=False
    )


class SuiteRow(Base):
    """One version of a declared eval suite: the declaration plus its content fingerprint.

    A changed folder (or declaration) is a new version of the same name; eval runs name the
    version they scored by its fingerprint, so two versions are never compared.
    """

    __tablename__ = "suites"
    __table_args__ = (
        UniqueConstraint("name", "version", name="uq_suites_name_version"),
        UniqueConstraint("name", "fingerprint", name="uq_suites_name_fingerprint"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), nullable=False)
    version: Mapped[int] = mapped_column(Integer, nullable=False)
    kind: Mapped[str] = mapped_column(String(32), nullable=False)
    # Absolute, or relative to the data root (TASKFLEET_DATA_DIR) for built-in declarations.
    location: Mapped[str] = mapped_column(Text, nullable=False)
    test_split: Mapped[str] = mapped_column(String(64), nullable=False)
    train_split: Mapped[str | None] = mapped_column(String(64), nullable=True)
    main_metric: Mapped[str] = mapped_column(String(64), nullable=False)
    metrics: Mapped[list[str]] = mapped_column(JSON, nullable=False)
    description: Mapped[str] = mapped_column(Text, default="", nullable=False)
    fingerprint: Mapped[str] = mapped_column(String(64), nullable=False)
    mteb_task: Mapped[str | None] = mapped_column(String(128), nullable=True)
    # Counts read when the version was declared (queries, documents, items, labels).
    stats: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False)
    created_at: Mapped[datetime] = _created()


class BaseModelRow(Base):
    __tablename__ = "base_models"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True, nullable=False)
    path: Mapped[str | None] = mapped_column(Text, nullable=True)
    package: Mapped[str | None] = mapped_column(String(128), nullable=True)
    sha256: Mapped[str] = mapped_column(String(64), nullable=False, index=True)
    dims: Mapped[int | None] = mapped_column(Integer, nullable=True)
    max_seq_length: Mapped[int | None] = mapped_column(Integer, nullable=True)
    size_bytes: Mapped[int] = mapped_column(BigInteger, nullable=False)
    runtime_kinds: Mapped[list[str]] = mapped_column(JSON, nullable=False)
    query_prefix: Mapped[str] = mapped_column(Text, default="", nullable=False)
    passage_prefix: Mapped[str] = mapped_column(Text, default="", nullable=False)
    created_at: Mapped[datetime] = _created()
    # A variant (ONNX export, int8 quantisation) is derived from another base model.
    source_model_id: Mapped[int | None] = mapped_column(ForeignKey("base_models.id"), nullable=True)
    variant: Mapped[str | None] = mapped_column(String(32), nullable=True)
    # What the folder is: None a model folder; "tfidf-lr" / "bm25" a fitted lexical baseline
    # (serving/runtime/baseline_artifact.py); "endpoint" the record of a model behind an
    # external API (serving/endpoints.py), whose API is ``endpoint`` and whose identity
    # includes the probe.
    format: Mapped[str | None] = mapped_column(String(32), nullable=True)
    endpoint: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    probe_fingerprint: Mapped[str | None] = mapped_column(String(64), nullable=True)
    price_per_million: Mapped[float | None] = mapped_column(Float, nullable=True)
    # The endpoint watcher's latest probe (serving/control.py): a fingerprint other than the
    # registered one makes every pairing on this model stale.
    probed_fingerprint: Mapped[str | None] = mapped_column(String(64), nullable=True)
    probed_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    probe_error: Mapped[str | None] = mapped_column(Text, nullable=True)


class AdapterRow(Base):
    __tablename__ = "adapters"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True, nullable=False)
    base_model_id: Mapped[int] = mapped_column(ForeignKey("base_models.id"), nullable=False)
    parent_id: Mapped[int | None] = mapped_column(ForeignKey("adapters.id"), nullable=True)
    sha256: Mapped[str] = mapped_column(String(64), nullable=False, index=True)
    size_bytes: Mapped[int] = mapped_column(BigInteger, nullable=False)
    data_fingerprint: Mapped[str] = mapped_column(String(64), nullable=False)
    train_split: Mapped[str] = mapped_column(String(64), nullable=False)
    suite: Mapped[str | None] = mapped_column(String(128), nullable=True)
    hyperparameters: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False)
    seed: Mapped[int] = mapped_column(Integer, nullable=False)
    code_version: Mapped[str] = mapped_column(String(128), nullable=False)
    mlflow_run_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[datetime] = _created()


class CandidateRow(Base):
    __tablename__ = "candidates"
    __table_args__ = (
        UniqueConstraint("task_id", "name", name="uq_candidates_task_name"),
        UniqueConstraint("task_id", "signature", name="uq_candidates_task_signature"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id"), nullable=False)
    name: Mapped[str] = mapped_column(String(128), nullable=False)
    kind: Mapped[str] = mapped_column(String(32), nullable=False)
    base_model_id: Mapped[int | None] = mapped_column(ForeignKey("base_models.id"), nullable=True)
    adapter_id: Mapped[int | None] = mapped_column(ForeignKey("adapters.id"), nullable=True)
    # (kind, base, adapter) as one string: SQL treats NULLs as distinct, so a unique
    # constraint over the nullable columns alone would let duplicates through.
    signature: Mapped[str] = mapped_column(String(128), nullable=False)
    created_at: Mapped[datetime] = _created()


class EvalRunRow(Base):
    __tablename__ = "eval_runs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    candidate_id: Mapped[int] = mapped_column(
        ForeignKey("candidates.id"), nullable=False, index=True
    )
    suite_name: Mapped[str] = mapped_column(String(128), nullable=False)
    suite_version: Mapped[str] = mapped_column(String(32), nullable=False)
    suite_fingerprint: Mapped[str] = mapped_column(String(64), nullable=False)
    split: Mapped[str] = mapped_column(String(64), nullable=False)
    main_metric: Mapped[str] = mapped_column(String(64), nullable=False)
    metrics: Mapped[dict[str, float]] = mapped_column(JSON, nullable=False)
    ci: Mapped[dict[str, list[float]]] = mapped_column(JSON, nullable=False)
    cost: Mapped[dict[str, float]] = mapped_column(JSON, nullable=False)
    per_query: Mapped[dict[str, float]] = mapped_column(JSON, nullable=False)
    model_fingerprint: Mapped[str | None] = mapped_column(String(64), nullable=True)
    adapter_fingerprint: Mapped[str | None] = mapped_column(String(64), nullable=True)
    sample_size: Mapped[int | None] = mapped_column(Integer, nullable=True)
    warnings: Mapped[list[str]] = mapped_column(JSON, nullable=False)
    code_version: Mapped[str] = mapped_column(String(128), nullable=False)
    mlflow_run_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    wall_seconds: Mapped[float] = mapped_column(Float, nullable=False)
    # The runtime the candidate was scored through (None: no model, e.g. bm25).
    runtime: Mapped[str | None] = mapped_column(String(16), nullable=True)
    # Kind-specific evidence: for classification the labels, per-item gold and predicted
    # labels (the paired bootstrap of macro-F1 needs them), per-class F1, confusion matrix.
    details: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    created_at: Mapped[datetime] = _created()


class PlacementRow(Base):
    __tablename__ = "placements"
    __table_args__ = (UniqueConstraint("task_id", "epoch", name="uq_placements_task_epoch"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id"), nullable=False)
    candidate_id: Mapped[int] = mapped_column(ForeignKey("candidates.id"), nullable=False)
    epoch: Mapped[int] = mapped_column(Integer, nullable=False)
    pinned: Mapped[bool] = mapped_column(Boolean, nullable=False)
    replicas: Mapped[int] = mapped_column(Integer, nullable=False)
    # Which runtime kind serves it; only workers of that kind run the task.
    runtime: Mapped[str] = mapped_column(String(16), server_default="torch", nullable=False)
    created_at: Mapped[datetime] = _created()
    # Outbox: set by the publisher once the KV holds this epoch.
    published_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class PromotionRow(Base):
    __tablename__ = "promotions"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id"), nullable=False, index=True)
    candidate_id: Mapped[int] = mapped_column(ForeignKey("candidates.id"), nullable=False)
    previous_candidate_id: Mapped[int | None] = mapped_column(
        ForeignKey("candidates.id"), nullable=True
    )
    kind: Mapped[str] = mapped_column(String(16), nullable=False)
    actor: Mapped[str] = mapped_column(String(128), nullable=False)
    reason: Mapped[str] = mapped_column(Text, nullable=False)
    eval_run_ids: Mapped[list[int]] = mapped_column(JSON, nullable=False)
    placement_id: Mapped[int] = mapped_column(ForeignKey("placements.id"), nullable=False)
    created_at: Mapped[datetime] = _created()


class ApiKeyRow(Base):
    __tablename__ = "api_keys"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True, nullable=False)
    prefix: Mapped[str] = mapped_column(String(16), unique=True, nullable=False)
    secret_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    roles: Mapped[list[str]] = mapped_column(JSON, nullable=False)
    tasks: Mapped[list[str]] = mapped_column(JSON, nullable=False)
    created_at: Mapped[datetime] = _created()
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # Gateway quota: requests per second (token bucket refill) and bucket size; NULL = no limit.
    rate_limit_per_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    rate_burst: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # The same in estimated model tokens (migration 0008); NULL = no limit.
    token_rate_per_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    token_burst: Mapped[int | None] = mapped_column(Integer, nullable=True)


class DashboardSessionRow(Base):
    """A signed-in dashboard session: the cookie carries the token, the table its sha256.
    Logging out ends the row, so a copied cookie stops working at once."""

    __tablename__ = "dashboard_sessions"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True, nullable=False)
    api_key_id: Mapped[int] = mapped_column(ForeignKey("api_keys.id"), nullable=False)
    created_at: Mapped[datetime] = _created()
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class AuditRow(Base):
    __tablename__ = "audit_log"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    actor: Mapped[str] = mapped_column(String(128), nullable=False)
    action: Mapped[str] = mapped_column(String(64), nullable=False)
    entity: Mapped[str] = mapped_column(String(64), nullable=False)
    entity_id: Mapped[str] = mapped_column(String(128), nullable=False)
    detail: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False)
    created_at: Mapped[datetime] = _created()


class WorkerRow(Base):
    """The last heartbeat of each worker, mirrored from NATS KV `workers` by the fleet watcher."""

    __tablename__ = "workers"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    worker_id: Mapped[str] = mapped_column(String(128), unique=True, nullable=False)
    host: Mapped[str] = mapped_column(String(255), nullable=False)
    loaded: Mapped[list[str]] = mapped_column(JSON, nullable=False)
    memory_used: Mapped[int] = mapped_column(BigInteger, nullable=False)
    memory_budget: Mapped[int] = mapped_column(BigInteger, nullable=False)
    queue_depth: Mapped[dict[str, int]] = mapped_column(JSON, nullable=False)
    runtimes: Mapped[list[str]] = mapped_column(JSON, nullable=False)
    epochs: Mapped[dict[str, int]] = mapped_column(JSON, nullable=False)
    # When the worker sent its last heartbeat (its clock) and when the watcher recorded it
    # (ours): staleness is judged on our clock so a skewed worker clock cannot hide it.
    reported_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    seen_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    reachable: Mapped[bool] = mapped_column(Boolean, nullable=False)
    created_at: Mapped[datetime] = _created()
    # Task -> the runtime profile the worker applies (absent in heartbeats before profiles).
    profiles: Mapped[dict[str, int] | None] = mapped_column(JSON, nullable=True)


class RuntimeProfileRow(Base):
    """Tuned runtime settings of one base model (by sha256) on one machine class: one row per
    pair, replaced by the next tuning (the audit log keeps the history)."""

    __tablename__ = "runtime_profiles"
    __table_args__ = (
        UniqueConstraint("model_sha256", "machine_class", name="uq_runtime_profiles_model_class"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    base_model_id: Mapped[int] = mapped_column(ForeignKey("base_models.id"), nullable=False)
    model_sha256: Mapped[str] = mapped_column(String(64), nullable=False, index=True)
    machine_class: Mapped[str] = mapped_column(String(255), nullable=False)
    settings: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False)
    task: Mapped[str] = mapped_column(String(128), nullable=False)
    p99_bound_ms: Mapped[float] = mapped_column(Float, nullable=False)
    throughput: Mapped[float] = mapped_column(Float, nullable=False)
    default_throughput: Mapped[float] = mapped_column(Float, nullable=False)
    sweep: Mapped[list[dict[str, Any]]] = mapped_column(JSON, nullable=False)
    actor: Mapped[str] = mapped_column(String(128), nullable=False)
    created_at: Mapped[datetime] = _created()
