"""The registry's abstract store: what each role may ask of the registry, with no database.

Shaped like MLflow's model-registry ``AbstractStore``: an interface of plain methods that take
and return the plain entities of ``registry/entities.py`` (never ORM rows), and one SQLAlchemy
implementation, ``registry.Registry`` (``registry/service.py``), which holds one repository per
entity (``registry/{suite_versions,tasks,base_models,adapters,candidates,variants,evalruns,
placements,promotions,keys,sessions,fleet}.py``) over the rows of ``registry/models.py``
(shared lookups in ``registry/rows.py``). Alembic migrations are the only way the schema moves.

The interface is cut along what roles read, so a caller types against the narrowest view it
needs: the placement and directory publisher against ``PublisherStore``, the control plane's
NATS side against ``ControlLoopStore``, the eval runner against ``EvalStore``. Gateways and
workers need none of it: they read what the control plane publishes to NATS (a test of the
import graph keeps it so). ``AbstractStore`` is the whole registry (CLI, REST, dashboard).

This module imports no SQLAlchemy: importing it (or ``registry``) costs nothing to a role
without a database.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from registry import entities as e

# ``expected_champion`` not given: promote/rollback whatever the champion is now.
UNSET = "\0unset"

#: Writes the ``variant`` of the model folder ``source`` into ``target`` and returns the manifest
#: it wrote (``dims``, ``max_seq_length``, ...): (source, target, variant, source sha256).
#: Refusals are ``InvalidInput``. The shell passes one
#: (``taskfleet.variant_builder.build_variant``): the registry imports no serving code.
VariantBuilder = Callable[[Path, Path, str, str], Mapping[str, Any]]
#: Fits a lexical baseline (``tfidf-lr``, ``bm25``) on a suite version into a new folder and
#: returns its manifest: (kind, suite, target). Refusals are ``InvalidInput``. The shell passes
#: one (``taskfleet.baseline_builder.fit_baseline``): the registry reads no suite data.
BaselineBuilder = Callable[[str, e.Suite, Path], Mapping[str, Any]]


class CatalogReader(ABC):
    """What evals, fine-tuning and the placement publisher read of the catalog: suites,
    tasks, base models, adapters (with their stored folders) and candidates."""

    @abstractmethod
    def get_suite(self, name: str, version: int | None = None) -> e.Suite:
        """A suite's newest version, or the given one."""

    @abstractmethod
    def get_task(self, name: str) -> e.Task: ...

    @abstractmethod
    def list_tasks(self) -> list[e.Task]: ...

    @abstractmethod
    def get_model(self, name: str) -> e.BaseModel: ...

    @abstractmethod
    def model_path(self, name: str) -> Path: ...

    @abstractmethod
    def get_adapter(self, name: str) -> e.Adapter: ...

    @abstractmethod
    def adapter_path(self, name: str) -> Path:
        """The stored adapter folder, verified against its sha256."""

    @abstractmethod
    def lineage(self, name: str) -> list[e.Adapter]:
        """The adapter and its ancestors, root first."""

    @abstractmethod
    def get_candidate(self, task: str, name: str) -> e.Candidate: ...

    @abstractmethod
    def profiles_for(self, model_sha256: str) -> list[e.RuntimeProfile]:
        """Every runtime profile of the base model with this sha256: what its placements
        carry (each worker applies the one of its own machine class)."""


class PlacementOutbox(ABC):
    """The placements the fleet has not been told about yet, and the mark that it has."""

    @abstractmethod
    def unpublished_placements(self) -> list[e.Placement]:
        """Newest placements the fleet has not been told about yet (the outbox)."""

    @abstractmethod
    def mark_published(self, task: str, epoch: int) -> None: ...


class CommitSource(ABC):
    """Word that the registry changed, for a reader in the same process that would otherwise
    wait for its next poll (the publisher). Writers in other processes are not heard: a
    reader still polls."""

    @abstractmethod
    def subscribe_commits(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` (in the writer's thread; quick, never raising) after each write
        that may change what is published; returns the function that unsubscribes it."""


class KeyDigestSource(ABC):
    """API keys as gateways verify them: digests, never tokens."""

    @abstractmethod
    def api_key_digests(self) -> list[e.ApiKeyDigest]:
        """Every key with the sha256 of its token: what gateways verify keys against (the
        control plane publishes it to NATS; the plain token is never stored anywhere)."""


class WorkerReportSink(ABC):
    """Where the fleet watcher writes what the workers' heartbeats say."""

    @abstractmethod
    def record_worker_report(
        self, report: e.WorkerReport, *, seen_at: datetime | None = None
    ) -> e.Worker:
        """Insert or refresh a worker's row from its newest heartbeat.

        ``seen_at`` is when the heartbeat reached NATS (the server's clock, one clock for the
        whole fleet); default now.

        Heartbeats arrive every few seconds per worker, so they are deliberately not written
        to the audit log (it records acts of people and promotions, not liveness).
        """

    @abstractmethod
    def mark_workers_unreachable(
        self, *, seen_before: datetime | None = None, worker_ids: list[str] | None = None
    ) -> list[str]:
        """Flag workers silent since ``seen_before``, or the named ones; returns the ids flagged."""


class ShadowOutbox(ABC):
    """Shadow starts and stops the fleet has not been told about yet (``registry/shadows.py``)."""

    @abstractmethod
    def unpublished_shadows(self) -> list[e.Shadow]:
        """Per task, its newest shadow row when it is not published yet: a start to put into
        KV ``placements`` under ``<task>.shadow``, a stop to delete there."""

    @abstractmethod
    def mark_shadow_published(self, task: str, epoch: int) -> None: ...


class ProductionSettingsReader(ABC):
    """How tasks are watched in production (``registry/production_settings.py``): the
    directory publisher tells gateways each task's sample rate and retention."""

    @abstractmethod
    def production_settings(self, task: str) -> e.ProductionSettings:
        """The task's settings (the defaults when none were set)."""

    @abstractmethod
    def list_production_settings(self) -> list[e.ProductionSettings]:
        """Every task's settings, by task name."""


class ShadowReader(ABC):
    @abstractmethod
    def current_shadow(self, task: str) -> e.Shadow | None:
        """The task's running shadow, or None."""


class PublisherStore(
    CatalogReader,
    PlacementOutbox,
    ShadowOutbox,
    ProductionSettingsReader,
    KeyDigestSource,
    CommitSource,
):
    """What the placement and directory publisher reads (``serving/publisher.py``,
    ``serving/directory.py``)."""


class EndpointProbeSink(ABC):
    """What the endpoint watcher reads and writes (``serving/endpoint_watch.py``)."""

    @abstractmethod
    def endpoint_models_in_use(self) -> list[e.BaseModel]:
        """Every endpoint model some candidate competes with."""

    @abstractmethod
    def record_probe(
        self, model: str, *, fingerprint: str | None, error: str | None
    ) -> e.BaseModel:
        """The watcher's latest probe; a fingerprint unlike the registered one makes the model
        (and every pairing on it) stale."""


class ProductionRecordStore(ABC):
    """What the control plane keeps of production (``registry/samples.py``,
    ``live_items.py``, ``reevaluations.py``): sampled requests and the shadow's side of them,
    drift windows, labelled live items, and the queue of re-evaluations of stale evidence."""

    @abstractmethod
    def record_sample(self, sample: e.SampleCreate) -> bool:
        """Keep a sampled request until its task's retention ends; False if already kept."""

    @abstractmethod
    def record_shadow_outcome(self, outcome: e.ShadowOutcome) -> bool:
        """The shadow's side of a kept sample; False when no sample has that request id."""

    @abstractmethod
    def get_sample(self, request_id: str) -> e.Sample | None: ...

    @abstractmethod
    def list_samples(
        self, task: str, *, after_id: int = 0, limit: int = 1000, model_key: str | None = None
    ) -> list[e.Sample]:
        """Kept samples of a task after ``after_id``, oldest first (of one champion model)."""

    @abstractmethod
    def agreement_summary(
        self, task: str, *, shadow: str | None = None, buckets: int = 12
    ) -> e.AgreementSummary:
        """The shadow's agreement with the champion, with a 95% bootstrap CI, over time."""

    @abstractmethod
    def record_drift_window(self, window: e.DriftWindowCreate) -> e.DriftWindow: ...

    @abstractmethod
    def drift_windows(self, task: str, *, limit: int = 100) -> list[e.DriftWindow]:
        """A task's drift windows, newest first."""

    @abstractmethod
    def prune_samples(self, *, now: datetime | None = None) -> int:
        """Delete the samples whose task's retention has passed; returns how many."""

    @abstractmethod
    def add_live_item(self, item: e.LiveItemCreate) -> e.LiveItem | None:
        """Keep a labelled item; None when that (request, input) already has one."""

    @abstractmethod
    def live_items(self, task: str) -> list[e.LiveItem]:
        """Every labelled item of a task, oldest first."""

    @abstractmethod
    def live_counts(self, task: str) -> tuple[int, int]:
        """(labelled items, of which not in a live version yet)."""

    @abstractmethod
    def mark_live_items_cut(self, task: str, item_ids: list[int], suite_version: int) -> int:
        """Note the live version that first holds these items."""

    @abstractmethod
    def stale_pairings(self, task: str, *, challengers: int = 2) -> list[e.Staleness]:
        """The champion's, the shadow's and the best challengers' stale evidence, with why."""

    @abstractmethod
    def queue_stale(self, task: str, *, challengers: int = 2) -> list[e.Reevaluation]:
        """Queue every stale (pairing, split) not queued or tried on this version yet."""

    @abstractmethod
    def next_reevaluation(self) -> e.Reevaluation | None:
        """The oldest queued re-evaluation, marked running."""

    @abstractmethod
    def finish_reevaluation(
        self, reevaluation_id: int, *, eval_run_id: int | None = None, error: str | None = None
    ) -> e.Reevaluation: ...

    @abstractmethod
    def requeue_interrupted(self) -> int:
        """Queue again what a control plane left running when it died."""

    @abstractmethod
    def list_reevaluations(self, task: str, *, limit: int = 50) -> list[e.Reevaluation]:
        """A task's re-evaluations, newest first."""


class ControlLoopStore(
    PublisherStore, WorkerReportSink, EndpointProbeSink, ProductionRecordStore, ShadowReader
):
    """What the control plane's NATS side uses: the publisher, the fleet watcher, the endpoint
    watcher and the production loops (``serving/control.py``, ``serving/endpoint_watch.py``,
    ``serving/production_consumer.py``)."""

    @abstractmethod
    def champion(self, task: str) -> e.Candidate | None: ...

    @abstractmethod
    def current_placement(self, task: str) -> e.Placement | None: ...


class EvalStore(CatalogReader):
    """What the eval runner reads and writes (``evals/runner.py``)."""

    @abstractmethod
    def record_eval_run(self, run: e.EvalRunCreate) -> e.EvalRun:
        """Record a complete run, scored on a registered version of the task's own suite.

        Recording never promotes: a caller that wants the task's auto-promotion asks for it
        next (``maybe_auto_promote``), as the eval runner does after every run."""

    @abstractmethod
    def maybe_auto_promote(self, task: str, candidate: str) -> e.Promotion | None:
        """After a new eval run: promote as the system if the task opted in (``auto_promote``)
        and the rule holds; never a runtime switch. None when nothing was promoted."""

    @abstractmethod
    def leaderboard(self, task: str) -> dict[str, e.EvalRun]:
        """Per candidate, the run that ranks it: on the newest version of the task's suite and
        its test split only (a run of another version, another folder or the training split
        never ranks), the newest full run, else the newest sampled one."""


class SuiteStore(ABC):
    """Suite versions beyond the one a task is scored on (``registry/suite_versions.py``)."""

    @abstractmethod
    def add_suite(self, suite: e.SuiteCreate) -> tuple[e.Suite, bool]:
        """Register a suite version; returns (version, created). Same fingerprint: not created."""

    @abstractmethod
    def suite_versions(self, name: str) -> list[e.Suite]:
        """Every version of a suite, newest first."""

    @abstractmethod
    def list_suites(self) -> list[e.Suite]:
        """The newest version of every suite, by name."""


class ProductionStore(ABC):
    """Production settings and shadows as people change them (``registry/
    production_settings.py``, ``registry/shadows.py``)."""

    @abstractmethod
    def set_production_settings(
        self, task: str, **changes: float | int | str
    ) -> e.ProductionSettings:
        """Change some of a task's production settings (the others keep their value)."""

    @abstractmethod
    def start_shadow(
        self,
        task: str,
        candidate: str,
        *,
        sample_rate: float,
        runtime: str | None = None,
        reason: str = "",
    ) -> e.Shadow:
        """Place ``candidate`` beside the champion as the task's shadow, sampling
        ``sample_rate`` of its requests (a recorded row; replaces a running shadow)."""

    @abstractmethod
    def stop_shadow(self, task: str, *, reason: str = "") -> e.Shadow:
        """End the task's shadow (a recorded row); sampling goes on at the task's rate."""

    @abstractmethod
    def shadow_history(self, task: str | None = None) -> list[e.Shadow]:
        """Every start and stop (of one task, or all), newest first."""


class CatalogStore(ABC):
    """Writes and lists of the catalog (``registry/{tasks,base_models,adapters,candidates}.py``),
    and the audit log (``registry/transactions.py``)."""

    @abstractmethod
    def add_task(
        self,
        name: str,
        *,
        suite: str,
        kind: str | None = None,
        description: str = "",
        owner: str = "",
        margin: float = 0.0,
        auto_promote: bool = False,
        max_text_chars: int | None = None,
        max_query_chars: int | None = None,
        max_document_chars: int | None = None,
        prefer: str = "best",
    ) -> e.Task:
        """Bind a new task to a registered suite; the task has the suite's kind. The
        per-text limits (characters) left out take the defaults of ``registry/limits.py``."""

    @abstractmethod
    def set_task_limits(
        self,
        name: str,
        *,
        max_text_chars: int | None = None,
        max_query_chars: int | None = None,
        max_document_chars: int | None = None,
    ) -> e.Task:
        """Change the per-text limits given (characters); the others stay."""

    @abstractmethod
    def set_task_preference(self, name: str, prefer: str) -> e.Task:
        """``best`` or ``cheapest`` (a cheaper candidate non-inferior within the margin)."""

    @abstractmethod
    def add_endpoint_model(
        self, name: str, *, record_dir: Path, price_per_million: float | None = None
    ) -> e.BaseModel:
        """A model behind an external API, from the record folder the shell wrote after
        probing it (``registry/endpoint_models.py``)."""

    @abstractmethod
    def add_model(
        self,
        name: str,
        *,
        path: Path | None = None,
        package: str | None = None,
        query_prefix: str = "",
        passage_prefix: str = "",
        runtime_kinds: list[str] | None = None,
    ) -> e.BaseModel: ...

    @abstractmethod
    def set_model_runtimes(self, name: str, runtime_kinds: list[str]) -> e.BaseModel:
        """Which runtimes may serve the model (a placement on one still needs its eval run)."""

    @abstractmethod
    def list_models(self) -> list[e.BaseModel]: ...

    @abstractmethod
    def register_adapter(
        self,
        name: str,
        *,
        base: str,
        source_dir: Path,
        training: e.TrainingRecord,
        parent: str | None = None,
    ) -> e.Adapter:
        """Store the adapter folder content-addressed and record it with its lineage."""

    @abstractmethod
    def list_adapters(self, base: str | None = None) -> list[e.Adapter]: ...

    @abstractmethod
    def children(self, name: str) -> list[e.Adapter]: ...

    @abstractmethod
    def add_candidate(
        self,
        task: str,
        *,
        name: str | None = None,
        base: str | None = None,
        adapter: str | None = None,
        kind: str | None = None,
        variant: str | None = None,
        build_variant: VariantBuilder | None = None,
        fit_baseline: BaselineBuilder | None = None,
    ) -> e.Candidate:
        """Add a candidate; ``kind`` defaults to the task kind's model candidate. With
        ``variant``: that variant of ``base``, built by ``build_variant``
        (``VariantStore.add_variant_candidate``). A tfidf-lr (or, on a rerank task, bm25)
        candidate is fitted by ``fit_baseline`` into a servable artifact
        (``registry/fitted_baselines.py``); without one it is model-free, scored but never
        placed."""

    @abstractmethod
    def list_candidates(self, task: str) -> list[e.Candidate]: ...

    @abstractmethod
    def artifact_digests(self) -> set[str]:
        """The sha256 of every base model and adapter a candidate uses: what the artifact
        source must keep (every placement, past or present, serves a candidate)."""

    @abstractmethod
    def audit_log(self, limit: int = 100) -> list[e.AuditEntry]: ...


class VariantStore(ABC):
    """Optimised variants of embedding base models (``registry/variants.py``)."""

    @abstractmethod
    def derive_model(
        self, base: str, variant: str, *, build: VariantBuilder | None, name: str | None = None
    ) -> e.BaseModel:
        """The ``variant`` of base model ``base``, built by ``build`` and registered with lineage
        to it on first use; the same variant of the same source is reused (no builder needed)."""

    @abstractmethod
    def add_variant_candidate(
        self,
        task: str,
        *,
        base: str,
        variant: str,
        build: VariantBuilder | None,
        name: str | None = None,
        adapter: str | None = None,
        kind: str | None = None,
    ) -> e.Candidate:
        """Derive ``variant`` of ``base`` (built by ``build``) and add it to ``task`` as an
        embedding candidate; what a variant cannot be is refused before the (slow) build."""


class EvalRunStore(ABC):
    """Eval runs beyond recording and the leaderboard (``registry/evalruns.py``)."""

    @abstractmethod
    def get_eval_run(self, run_id: int) -> e.EvalRun: ...

    @abstractmethod
    def list_eval_runs(self, task: str, candidate: str | None = None) -> list[e.EvalRun]:
        """Eval runs of a task (optionally one candidate), newest first."""

    @abstractmethod
    def latest_eval_run(
        self, task: str, candidate: str, *, suite_fingerprint: str | None = None
    ) -> e.EvalRun | None: ...

    @abstractmethod
    def ranking_run(self, task: str, candidate: str) -> e.EvalRun | None:
        """The run the leaderboard and the promotion rule use for this candidate."""


class PlacementStore(ABC):
    """The current placements (``registry/placements.py``)."""

    @abstractmethod
    def current_placement(self, task: str) -> e.Placement | None: ...

    @abstractmethod
    def list_placements(self) -> list[e.Placement]:
        """The newest placement of every task that has one."""


class PromotionStore(ABC):
    """Champions and history (``registry/promotion_history.py``), the rule's verdict
    (``registry/promotion_rule.py``, a pure function of the evidence), promotion, rollback and
    placement changes (``registry/promotions.py``)."""

    @abstractmethod
    def champion(self, task: str) -> e.Candidate | None: ...

    @abstractmethod
    def list_promotions(self, task: str) -> list[e.Promotion]:
        """The append-only promotion history of a task, newest first."""

    @abstractmethod
    def check_promotion(
        self, task: str, candidate: str, runtime: str | None = None
    ) -> e.PromotionCheck:
        """Does the rule allow promoting this candidate (on ``runtime``) now? Never writes.

        ``runtime`` None: the runtime of the candidate's latest eval run (what was evaluated).
        """

    @abstractmethod
    def recommend(self, task: str) -> e.Recommendation:
        """What the task should serve under its preference, and why (never writes)."""

    @abstractmethod
    def promote(
        self,
        task: str,
        candidate: str,
        *,
        reason: str = "",
        override: bool = False,
        expected_champion: str | None = UNSET,
        pinned: bool | None = None,
        replicas: int | None = None,
        runtime: str | None = None,
    ) -> e.Promotion:
        """Make a candidate (on ``runtime``) champion: promotion record + new placement epoch,
        atomically. ``runtime`` None: the runtime of its latest eval run.

        `expected_champion` guards against stale forms: if the champion changed since the
        caller looked, nothing happens and Conflict is raised. `pinned`/`replicas` set the new
        epoch's placement (default: the previous epoch's; pinned and 1 for a first champion).
        """

    @abstractmethod
    def rollback(
        self, task: str, *, reason: str = "", expected_champion: str | None = UNSET
    ) -> e.Promotion:
        """Return the task to the champion before the current one."""

    @abstractmethod
    def update_placement(
        self,
        task: str,
        *,
        pinned: bool | None = None,
        replicas: int | None = None,
        candidate: str | None = None,
        runtime: str | None = None,
        reason: str = "",
    ) -> e.Placement:
        """Change how the champion is served (pinned, replicas): a new epoch + its history row.

        What is served changes only by promote, override or rollback: naming a `candidate`
        other than the champion, or a `runtime` other than the champion's (a runtime switch is
        evaluated, then promoted), is refused (`PromotionRequired`). A placement that serves
        another candidate than the champion (written before this rule) is put back on the
        champion. Nothing to change: the current placement, no new epoch.
        """

    @abstractmethod
    def get_task_auto_promote(self, task: str) -> bool: ...


class ApiKeyStore(ABC):
    """API keys (``registry/keys.py``)."""

    @abstractmethod
    def create_api_key(
        self,
        name: str,
        *,
        roles: list[str],
        tasks: list[str] | None = None,
        rate_limit_per_s: float | None = None,
        rate_burst: int | None = None,
        token_rate_per_s: float | None = None,
        token_burst: int | None = None,
    ) -> tuple[e.ApiKey, str]:
        """Create a key; the plain token is returned once and never stored."""

    @abstractmethod
    def authenticate(self, token: str) -> e.ApiKey: ...

    @abstractmethod
    def revoke_api_key(self, name: str) -> None: ...

    @abstractmethod
    def set_api_key_quota(
        self,
        name: str,
        *,
        rate_limit_per_s: float | None,
        rate_burst: int | None = None,
        token_rate_per_s: float | None = None,
        token_burst: int | None = None,
    ) -> e.ApiKey:
        """Set a key's whole gateway quota: requests/s and estimated tokens/s, each with its
        burst; ``None`` for a rate removes that limit."""

    @abstractmethod
    def list_api_keys(self) -> list[e.ApiKey]: ...


class SessionStore(ABC):
    """Dashboard sessions (``registry/sessions.py``)."""

    @abstractmethod
    def start_session(self, key_name: str, *, max_age_s: int) -> str:
        """A new session for the key; returns its token (stored only as a hash)."""

    @abstractmethod
    def session_key(self, token: str) -> e.ApiKey | None:
        """The key of a live session (not ended, not expired, key not revoked), else None."""

    @abstractmethod
    def end_session(self, token: str) -> None:
        """Log out: the session's cookie no longer signs anyone in. Unknown tokens: nothing."""


class FleetStore(ABC):
    """Workers as the registry last heard of them (``registry/fleet.py``)."""

    @abstractmethod
    def forget_workers(self, seen_before: datetime) -> list[str]:
        """Delete unreachable workers not heard of since ``seen_before`` (retired machines)."""

    @abstractmethod
    def list_workers(self, *, reachable_only: bool = False) -> list[e.Worker]: ...

    @abstractmethod
    def placement_status(self) -> list[e.PlacementStatus]:
        """Per placed task: the desired epoch and the epoch each reachable worker reports."""


class ProfileStore(ABC):
    """Runtime profiles (``taskfleet tune``, ``taskfleet profile``)."""

    @abstractmethod
    def record_profile(self, profile: e.ProfileCreate) -> e.RuntimeProfile:
        """Record (or replace) the profile of the model on its machine class, and a new
        placement epoch for every task serving the model, so running workers apply it.
        Needs the promoter or admin role."""

    @abstractmethod
    def remove_profile(self, model: str, machine_class: str) -> e.RuntimeProfile: ...

    @abstractmethod
    def list_profiles(self, model: str | None = None) -> list[e.RuntimeProfile]: ...


class AbstractStore(
    ControlLoopStore,
    ProductionStore,
    EvalStore,
    SuiteStore,
    CatalogStore,
    VariantStore,
    EvalRunStore,
    PlacementStore,
    PromotionStore,
    ApiKeyStore,
    SessionStore,
    FleetStore,
    ProfileStore,
):
    """The whole registry: what the CLI, the REST API and the dashboard use."""

    @abstractmethod
    def as_actor(
        self, actor: str, roles: tuple[str, ...] | list[str] = ("admin",)
    ) -> AbstractStore:
        """The same store acting for someone else (REST/dashboard users)."""

    @abstractmethod
    def close(self) -> None:
        """Release the store's connections."""
