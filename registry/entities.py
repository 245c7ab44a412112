"""Plain, immutable records returned by the registry service (never ORM rows)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from registry.limits import (
    DEFAULT_MAX_DOCUMENT_CHARS,
    DEFAULT_MAX_QUERY_CHARS,
    DEFAULT_MAX_TEXT_CHARS,
)


@dataclass(frozen=True)
class SuiteCreate:
    """A suite declaration as the eval harness read and fingerprinted it."""

    name: str
    kind: str  # "retrieval" | "rerank" | "classification"
    location: str  # absolute, or relative to the data root
    test_split: str
    main_metric: str
    metrics: list[str]
    fingerprint: str
    train_split: str | None = None
    description: str = ""
    mteb_task: str | None = None
    stats: dict[str, Any] = field(default_factory=dict)
    # The split of labelled production items a live version holds (docs: "Live splits").
    live_split: str | None = None


@dataclass(frozen=True)
class Suite:
    """One registered version of a suite; versions count up per name from 1."""

    id: int
    name: str
    version: int
    kind: str
    location: str
    test_split: str
    train_split: str | None
    main_metric: str
    metrics: list[str]
    description: str
    fingerprint: str
    mteb_task: str | None
    stats: dict[str, Any]
    created_at: datetime
    live_split: str | None = None

    @property
    def splits(self) -> tuple[str, ...]:
        return tuple(s for s in (self.test_split, self.train_split, self.live_split) if s)


@dataclass(frozen=True)
class Task:
    id: int
    name: str
    kind: str
    description: str
    suite: str
    owner: str
    margin: float
    auto_promote: bool
    created_at: datetime
    # What one request may send the task, per text in characters (`registry/limits.py`).
    max_text_chars: int = DEFAULT_MAX_TEXT_CHARS
    max_query_chars: int = DEFAULT_MAX_QUERY_CHARS
    max_document_chars: int = DEFAULT_MAX_DOCUMENT_CHARS
    prefer: str = "best"  # "cheapest": a cheaper non-inferior candidate may replace the best


@dataclass(frozen=True)
class BaseModel:
    id: int
    name: str
    path: str | None
    package: str | None
    sha256: str
    dims: int | None
    max_seq_length: int | None
    size_bytes: int
    runtime_kinds: list[str]
    query_prefix: str
    passage_prefix: str
    created_at: datetime
    #: A variant's source model (its name) and kind (``onnx``, ``onnx-int8``); None for a
    #: model registered from its own weights.
    source: str | None = None
    variant: str | None = None
    #: What the folder is: None a model folder; "tfidf-lr" / "bm25" a fitted lexical baseline;
    #: "endpoint" a model behind an external API, whose record is ``endpoint`` (URL, model ids,
    #: sides, key variable name: serving/endpoints.py) and whose identity includes the probe.
    format: str | None = None
    endpoint: dict[str, Any] | None = None
    probe_fingerprint: str | None = None
    price_per_million: float | None = None
    #: The endpoint watcher's latest probe: its fingerprint (None when it failed), when, and
    #: the failure.
    probed_fingerprint: str | None = None
    probed_at: datetime | None = None
    probe_error: str | None = None

    @property
    def stale(self) -> bool:
        """The endpoint answered its probe differently from when it was registered: every
        pairing on it no longer holds its evidence."""
        return (
            self.probed_fingerprint is not None
            and self.probe_fingerprint is not None
            and self.probed_fingerprint != self.probe_fingerprint
        )


@dataclass(frozen=True)
class TrainingRecord:
    """How an adapter was made: everything needed to answer 'where did this come from?'."""

    data_fingerprint: str
    train_split: str
    hyperparameters: dict[str, Any]
    seed: int
    code_version: str
    suite: str | None = None
    mlflow_run_id: str | None = None


@dataclass(frozen=True)
class Adapter:
    id: int
    name: str
    base_model: str
    parent: str | None
    sha256: str
    size_bytes: int
    training: TrainingRecord
    created_at: datetime


@dataclass(frozen=True)
class Candidate:
    id: int
    name: str
    task: str
    # retrieval: "embedding" | "bm25"; rerank: "embedding" (bi-encoder), "cross-encoder",
    # "bm25", "random"; classification: "classifier", "tfidf-lr", "majority"
    kind: str
    base_model: str | None
    adapter: str | None
    created_at: datetime


@dataclass(frozen=True)
class EvalRunCreate:
    """What the eval harness hands the registry once a run has finished completely."""

    task: str
    candidate: str
    suite_name: str
    suite_version: str
    suite_fingerprint: str
    split: str
    main_metric: str
    metrics: dict[str, float]
    ci: dict[str, tuple[float, float]]
    cost: dict[str, float]
    per_query: dict[str, float]
    model_fingerprint: str | None = None
    adapter_fingerprint: str | None = None
    sample_size: int | None = None
    warnings: list[str] = field(default_factory=list)
    code_version: str = ""
    mlflow_run_id: str | None = None
    wall_seconds: float = 0.0
    runtime: str | None = None  # the runtime it was scored through; None for bm25
    details: dict[str, Any] | None = None

    @property
    def main_score(self) -> float:
        return self.metrics[self.main_metric]


@dataclass(frozen=True)
class EvalRun:
    id: int
    task: str
    candidate: str
    suite_name: str
    suite_version: str
    suite_fingerprint: str
    split: str
    main_metric: str
    metrics: dict[str, float]
    ci: dict[str, tuple[float, float]]
    cost: dict[str, float]
    per_query: dict[str, float]
    model_fingerprint: str | None
    adapter_fingerprint: str | None
    sample_size: int | None
    warnings: list[str]
    code_version: str
    mlflow_run_id: str | None
    wall_seconds: float
    created_at: datetime
    runtime: str | None = None
    details: dict[str, Any] | None = None

    @property
    def main_score(self) -> float:
        return self.metrics[self.main_metric]


@dataclass(frozen=True)
class Placement:
    id: int
    task: str
    candidate: str
    epoch: int
    pinned: bool
    replicas: int
    created_at: datetime
    published_at: datetime | None
    runtime: str = "torch"


@dataclass(frozen=True)
class Promotion:
    id: int
    task: str
    candidate: str
    previous_candidate: str | None
    kind: str  # "promote" | "override" | "rollback" | "placement" (pinned/replicas only)
    actor: str
    reason: str
    eval_run_ids: list[int]
    epoch: int
    created_at: datetime
    pinned: bool  # of the placement epoch this row wrote
    replicas: int
    runtime: str = "torch"  # the runtime the placement epoch names


@dataclass(frozen=True)
class ApiKey:
    id: int
    name: str
    prefix: str
    roles: list[str]
    tasks: list[str]  # empty = all tasks
    created_at: datetime
    revoked_at: datetime | None
    # Gateway quota (token bucket): refill rate in requests/s and bucket size; None = no limit.
    rate_limit_per_s: float | None = None
    rate_burst: int | None = None
    # The same in estimated model tokens (the gateway's estimate, serving/gateway/bodies.py).
    token_rate_per_s: float | None = None
    token_burst: int | None = None


@dataclass(frozen=True)
class ApiKeyDigest:
    """A key with the sha256 of its token, as published for the gateways."""

    key: ApiKey
    secret_hash: str


@dataclass(frozen=True)
class AuditEntry:
    id: int
    actor: str
    action: str
    entity: str
    entity_id: str
    detail: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True)
class WorkerReport:
    """One worker heartbeat as the fleet watcher hands it to the registry."""

    worker_id: str
    host: str
    reported_at: datetime
    loaded: list[str]
    memory_used: int
    memory_budget: int
    queue_depth: dict[str, int]
    runtimes: list[str]
    epochs: dict[str, int]  # task -> placement epoch the worker serves
    profiles: dict[str, int] = field(default_factory=dict)  # task -> runtime profile applied


@dataclass(frozen=True)
class Worker:
    id: int
    worker_id: str
    host: str
    loaded: list[str]
    memory_used: int
    memory_budget: int
    queue_depth: dict[str, int]
    runtimes: list[str]
    epochs: dict[str, int]
    reported_at: datetime
    seen_at: datetime
    reachable: bool
    created_at: datetime
    profiles: dict[str, int] = field(default_factory=dict)  # task -> runtime profile applied


@dataclass(frozen=True)
class PlacementStatus:
    """Desired (newest placement) against reported (reachable workers' epochs) for one task."""

    task: str
    candidate: str
    desired_epoch: int
    pinned: bool
    replicas: int
    published_at: datetime | None
    reported: dict[str, int]  # worker id -> epoch it serves the task with

    @classmethod
    def of(cls, placement: Placement, reachable: list[Worker]) -> PlacementStatus:
        """A task's newest placement against what the reachable workers report for it."""
        return cls(
            task=placement.task,
            candidate=placement.candidate,
            desired_epoch=placement.epoch,
            pinned=placement.pinned,
            replicas=placement.replicas,
            published_at=placement.published_at,
            reported={
                w.worker_id: w.epochs[placement.task]
                for w in reachable
                if placement.task in w.epochs
            },
        )

    @property
    def converged_workers(self) -> list[str]:
        return sorted(w for w, epoch in self.reported.items() if epoch >= self.desired_epoch)

    @property
    def converged(self) -> bool:
        """True once at least `replicas` workers serve the desired epoch."""
        return len(self.converged_workers) >= self.replicas


@dataclass(frozen=True)
class PromotionCheck:
    """The promotion rule's verdict for one challenger, with the evidence behind it."""

    task: str
    challenger: str
    champion: str | None
    passes: bool
    reason: str
    main_metric: str | None = None
    margin: float = 0.0
    difference: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    paired_queries: int = 0
    challenger_run_id: int | None = None
    champion_run_id: int | None = None
    runtime: str | None = None  # the runtime the challenger would be placed on
    champion_runtime: str | None = None
    # The split(s) compared ("offline", "live", "both"), and whether it failed only because
    # a contender's evidence is stale (a newer suite version, another runtime).
    evidence: str = "offline"
    stale: bool = False


@dataclass(frozen=True)
class Recommendation:
    """What a task should serve under its preference (registry/recommendation.py), and why."""

    task: str
    prefer: str  # "best" | "cheapest"
    candidate: str | None  # None: nothing servable has a run on the suite version
    runtime: str | None
    reason: str  # the one line that says why
    considered: list[str]  # one line per other candidate: why it was not chosen
    champion: str | None = None


@dataclass(frozen=True)
class RuntimeSettings:
    """A model's runtime knobs on one kind of machine; None leaves the worker's default."""

    max_batch_tokens: int | None = None  # sidecar: tokens of the batches it forms
    max_batch_wait_ms: int | None = None  # sidecar: how long a batch waits for more requests
    intra_op_threads: int | None = None  # runtime: threads of one forward pass
    runtimes: int | None = None  # runtime: batches of the model that run at once
    max_padding: float | None = None  # runtime: padding share before a pass is cut
    engine: str | None = None  # runtime: "torch", or "onnx" (the same fp32 graph, ONNX Runtime)

    def changed(self) -> dict[str, Any]:
        """The knobs this profile sets, by name."""
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass(frozen=True)
class ProfileCreate:
    """What a tuning run found for one model on one machine class (``taskfleet tune``)."""

    model: str  # the base model's name; the profile is keyed by its sha256
    machine_class: str  # "cpu:<model> x<cores>" or "gpu:<model>" (serving/machine.py)
    settings: RuntimeSettings
    task: str  # the task whose traffic the sweep replayed
    p99_bound_ms: float
    throughput: float  # texts/s at the bound with these settings, measured again once applied
    default_throughput: float  # texts/s at the bound with the defaults, same sweep
    sweep: list[dict[str, Any]] = field(default_factory=list)  # every configuration's figures


@dataclass(frozen=True)
class RuntimeProfile:
    """A recorded profile: placements of the model carry it, workers of its class apply it."""

    id: int
    model: str
    model_sha256: str
    machine_class: str
    settings: RuntimeSettings
    task: str
    p99_bound_ms: float
    throughput: float
    default_throughput: float
    sweep: list[dict[str, Any]]
    actor: str
    created_at: datetime


# ---- production (docs/architecture.md "Production") --------------------------------------------

#: What the promotion rule compares: the suite's test split, its live split, or both.
EVIDENCE_KINDS = ("offline", "live", "both")


@dataclass(frozen=True)
class ProductionSettings:
    """How a task is watched in production (``taskfleet production set``)."""

    task: str
    sample_rate: float = 0.0  # share of requests sampled: kept, copied to a shadow, judged
    retention_days: float = 7.0  # how long sampled inputs are kept
    evidence: str = "offline"  # what the promotion rule compares (EVIDENCE_KINDS)
    drift_alpha: float = 0.01  # false-alarm rate per drift window
    drift_window: int = 100  # sampled inputs per drift window
    live_every: int = 100  # labelled items per new live version of the suite


@dataclass(frozen=True)
class Shadow:
    """One start or stop of a task's shadow (the recorded act and its placement epoch)."""

    id: int
    task: str
    action: str  # "start" | "stop"
    candidate: str
    runtime: str
    sample_rate: float
    epoch: int
    actor: str
    reason: str
    created_at: datetime
    published_at: datetime | None

    @property
    def active(self) -> bool:
        return self.action == "start"


@dataclass(frozen=True)
class SampleCreate:
    """A sampled request as its gateway answered it, judged by the control plane."""

    task: str
    request_id: str
    received_at: datetime
    inputs: int
    champion: str
    champion_model_key: str
    champion_epoch: int
    champion_ms: float
    shadow: str | None  # the candidate its copy went to; None: no shadow
    lengths: list[int]
    predicted: list[str] | None = None
    vectors: bytes | None = None
    dims: int | None = None


@dataclass(frozen=True)
class ShadowOutcome:
    """What the shadow made of a sampled request's copy."""

    request_id: str
    outcome: str  # "ok" | "shed" | "error"
    shadow_ms: float | None = None
    error: str | None = None
    agreement: list[float] | None = None  # per input: the headline measure
    agreement_extra: dict[str, list[float]] | None = None


@dataclass(frozen=True)
class Sample:
    id: int
    task: str
    request_id: str
    received_at: datetime
    inputs: int
    champion: str
    champion_model_key: str
    champion_epoch: int
    champion_ms: float
    shadow: str | None
    shadow_outcome: str  # "none" | "pending" | "ok" | "shed" | "error"
    shadow_ms: float | None
    agreement: list[float] | None
    agreement_extra: dict[str, list[float]] | None
    lengths: list[int]
    predicted: list[str] | None
    vectors: bytes | None
    dims: int | None


@dataclass(frozen=True)
class AgreementPoint:
    """Agreement of the inputs of one time bucket, with its 95% bootstrap CI."""

    start: datetime
    inputs: int
    estimate: float
    low: float
    high: float


@dataclass(frozen=True)
class AgreementSummary:
    """How far the shadow agreed with the champion on the sampled requests kept."""

    task: str
    shadow: str | None
    inputs: int  # inputs both answered
    estimate: float | None
    low: float | None
    high: float | None
    extra: dict[str, float]  # the kind's other measures, means over the same inputs
    outcomes: dict[str, int]  # sampled requests by shadow outcome
    series: list[AgreementPoint]
    champion_ms_p50: float | None = None
    shadow_ms_p50: float | None = None


@dataclass(frozen=True)
class LiveItemCreate:
    task: str
    request_id: str
    index: int
    item: dict[str, Any]  # what the suite's kind reads: text+label, query+documents+relevant...
    key: str | None = None


@dataclass(frozen=True)
class LiveItem:
    id: int
    task: str
    request_id: str
    index: int
    item: dict[str, Any]
    key: str | None
    received_at: datetime
    suite_version: int | None  # the first live version holding it


@dataclass(frozen=True)
class DriftWindowCreate:
    task: str
    first_sample_id: int
    last_sample_id: int
    size: int
    champion: str
    suite_version: int
    signals: list[dict[str, Any]]  # {"name", "statistic", "p_value"}
    p_min: float
    alpha: float
    drifted: bool


@dataclass(frozen=True)
class DriftWindow:
    id: int
    task: str
    created_at: datetime
    first_sample_id: int
    last_sample_id: int
    size: int
    champion: str
    suite_version: int
    signals: list[dict[str, Any]]
    p_min: float
    alpha: float
    drifted: bool


@dataclass(frozen=True)
class Reevaluation:
    """A stale pairing queued for a fresh eval run, and how that run went."""

    id: int
    task: str
    candidate: str
    runtime: str | None
    suite_fingerprint: str
    suite_version: int | None
    split: str
    reason: str
    state: str  # "queued" | "running" | "done" | "failed"
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    eval_run_id: int | None
    error: str | None


@dataclass(frozen=True)
class Staleness:
    """Why a pairing's evidence no longer matches what it is measured on (empty: fresh)."""

    task: str
    candidate: str
    runtime: str | None
    role: str  # "champion" | "shadow" | "challenger"
    reasons: list[str]
