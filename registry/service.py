"""The registry service: the only writer of the database.

`Registry` is the one SQLAlchemy implementation of `registry.store.AbstractStore`. It holds one
repository per entity (suite versions, tasks, base models, adapters, candidates, variants, eval
runs, placements, the promotion history, promotions, API keys, dashboard sessions, the fleet,
and production: settings, shadows, samples, live items, re-evaluations)
and hands each call to the one that owns it; it inherits nothing but the interface. Each public
method is one transaction (`registry/transactions.py`) that also appends to the audit log.
Callers that need only part of it type against the narrower views in `registry/store.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from registry import db
from registry import entities as e
from registry.adapters import AdapterRepository
from registry.artifacts import ArtifactStore
from registry.base_models import BaseModelRepository
from registry.candidates import CandidateRepository
from registry.endpoint_models import EndpointModelRepository
from registry.evalruns import EvalRunRepository
from registry.fitted_baselines import BaselineRepository, servable_baseline
from registry.fleet import FleetRepository
from registry.keys import ApiKeyRepository
from registry.live_items import LiveItemRepository
from registry.placements import PlacementRepository
from registry.production_settings import ProductionSettingsRepository
from registry.profiles import ProfileRepository
from registry.promotion_history import PromotionHistoryRepository
from registry.promotions import PromotionRepository
from registry.reevaluations import ReevaluationRepository
from registry.samples import SampleRepository
from registry.sessions import DashboardSessionRepository
from registry.shadows import ShadowRepository
from registry.store import UNSET, AbstractStore, BaselineBuilder, VariantBuilder
from registry.suite_versions import SuiteRepository
from registry.tasks import TaskRepository
from registry.transactions import Transactions
from registry.variants import VariantRepository


class Registry(AbstractStore):
    def __init__(self, tx: Transactions, artifacts: ArtifactStore) -> None:
        self.tx = tx
        self.artifacts = artifacts
        self._suites = SuiteRepository(tx)
        self._tasks = TaskRepository(tx)
        self._models = BaseModelRepository(tx)
        self._adapters = AdapterRepository(tx, artifacts)
        self._candidates = CandidateRepository(tx, self._models, self._adapters)
        self._variants = VariantRepository(tx, artifacts, self._models, self._candidates)
        self._baselines = BaselineRepository(tx, artifacts, self._candidates)
        self._endpoints = EndpointModelRepository(tx, artifacts)
        self._eval_runs = EvalRunRepository(tx)
        self._placements = PlacementRepository(tx)
        self._history = PromotionHistoryRepository(tx)
        self._promotions = PromotionRepository(tx)
        self._keys = ApiKeyRepository(tx)
        self._sessions = DashboardSessionRepository(tx)
        self._fleet = FleetRepository(tx, self._placements)
        self._profiles = ProfileRepository(tx)
        self._production = ProductionSettingsRepository(tx)
        self._shadows = ShadowRepository(tx)
        self._samples = SampleRepository(tx)
        self._live = LiveItemRepository(tx)
        self._reevaluations = ReevaluationRepository(tx)

    @classmethod
    def open(
        cls, database_url: str, *, artifact_dir: Path, actor: str = "system", migrate: bool = True
    ) -> Registry:
        """Connect, bring the schema to the newest migration, and return the service."""
        engine = db.create_registry_engine(database_url)
        if migrate:
            db.upgrade(engine)
        return cls(Transactions(engine, actor=actor), ArtifactStore(artifact_dir))

    def as_actor(self, actor: str, roles: tuple[str, ...] | list[str] = ("admin",)) -> Registry:
        """The same registry acting for someone else (REST/dashboard users)."""
        return Registry(self.tx.acting_as(actor, tuple(roles)), self.artifacts)

    def close(self) -> None:
        self.tx.close()

    def audit_log(self, limit: int = 100) -> list[e.AuditEntry]:
        return self.tx.audit_log(limit)

    def subscribe_commits(self, callback: Callable[[], None]) -> Callable[[], None]:
        return self.tx.commits.subscribe(callback)

    # ---- suite versions ----------------------------------------------------------------
    def add_suite(self, suite: e.SuiteCreate) -> tuple[e.Suite, bool]:
        return self._suites.add_suite(suite)

    def get_suite(self, name: str, version: int | None = None) -> e.Suite:
        return self._suites.get_suite(name, version)

    def suite_versions(self, name: str) -> list[e.Suite]:
        return self._suites.suite_versions(name)

    def list_suites(self) -> list[e.Suite]:
        return self._suites.list_suites()

    # ---- tasks -------------------------------------------------------------------------
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
        return self._tasks.add_task(
            name,
            suite=suite,
            kind=kind,
            description=description,
            owner=owner,
            margin=margin,
            auto_promote=auto_promote,
            max_text_chars=max_text_chars,
            max_query_chars=max_query_chars,
            max_document_chars=max_document_chars,
            prefer=prefer,
        )

    def set_task_limits(
        self,
        name: str,
        *,
        max_text_chars: int | None = None,
        max_query_chars: int | None = None,
        max_document_chars: int | None = None,
    ) -> e.Task:
        return self._tasks.set_task_limits(
            name,
            max_text_chars=max_text_chars,
            max_query_chars=max_query_chars,
            max_document_chars=max_document_chars,
        )

    def set_task_preference(self, name: str, prefer: str) -> e.Task:
        return self._tasks.set_task_preference(name, prefer)

    def get_task(self, name: str) -> e.Task:
        return self._tasks.get_task(name)

    def list_tasks(self) -> list[e.Task]:
        return self._tasks.list_tasks()

    # ---- base models -------------------------------------------------------------------
    def add_model(
        self,
        name: str,
        *,
        path: Path | None = None,
        package: str | None = None,
        query_prefix: str = "",
        passage_prefix: str = "",
        runtime_kinds: list[str] | None = None,
    ) -> e.BaseModel:
        return self._models.add_model(
            name,
            path=path,
            package=package,
            query_prefix=query_prefix,
            passage_prefix=passage_prefix,
            runtime_kinds=runtime_kinds,
        )

    def set_model_runtimes(self, name: str, runtime_kinds: list[str]) -> e.BaseModel:
        return self._models.set_model_runtimes(name, runtime_kinds)

    def get_model(self, name: str) -> e.BaseModel:
        return self._models.get_model(name)

    def list_models(self) -> list[e.BaseModel]:
        return self._models.list_models()

    def model_path(self, name: str) -> Path:
        return self._models.model_path(name)

    # ---- endpoint models ---------------------------------------------------------------
    def add_endpoint_model(
        self, name: str, *, record_dir: Path, price_per_million: float | None = None
    ) -> e.BaseModel:
        return self._endpoints.add_endpoint_model(
            name, record_dir=record_dir, price_per_million=price_per_million
        )

    def endpoint_models_in_use(self) -> list[e.BaseModel]:
        return self._endpoints.endpoint_models_in_use()

    def record_probe(
        self, model: str, *, fingerprint: str | None, error: str | None
    ) -> e.BaseModel:
        return self._endpoints.record_probe(model, fingerprint=fingerprint, error=error)

    def derive_model(
        self, base: str, variant: str, *, build: VariantBuilder | None, name: str | None = None
    ) -> e.BaseModel:
        return self._variants.derive_model(base, variant, build=build, name=name)

    # ---- adapters ----------------------------------------------------------------------
    def register_adapter(
        self,
        name: str,
        *,
        base: str,
        source_dir: Path,
        training: e.TrainingRecord,
        parent: str | None = None,
    ) -> e.Adapter:
        return self._adapters.register_adapter(
            name, base=base, source_dir=source_dir, training=training, parent=parent
        )

    def get_adapter(self, name: str) -> e.Adapter:
        return self._adapters.get_adapter(name)

    def list_adapters(self, base: str | None = None) -> list[e.Adapter]:
        return self._adapters.list_adapters(base)

    def adapter_path(self, name: str) -> Path:
        return self._adapters.adapter_path(name)

    def lineage(self, name: str) -> list[e.Adapter]:
        return self._adapters.lineage(name)

    def children(self, name: str) -> list[e.Adapter]:
        return self._adapters.children(name)

    # ---- candidates --------------------------------------------------------------------
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
        if (
            variant is None
            and fit_baseline is not None
            and base is None
            and adapter is None
            and servable_baseline(kind, self.get_task(task).kind)
        ):
            assert kind is not None
            return self._baselines.add_baseline_candidate(task, kind, fit=fit_baseline, name=name)
        if variant is None:
            return self._candidates.add_candidate(
                task, name=name, base=base, adapter=adapter, kind=kind
            )
        return self._variants.add_variant_candidate(
            task,
            base=base,
            variant=variant,
            build=build_variant,
            name=name,
            adapter=adapter,
            kind=kind,
        )

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
        return self._variants.add_variant_candidate(
            task, base=base, variant=variant, build=build, name=name, adapter=adapter, kind=kind
        )

    def get_candidate(self, task: str, name: str) -> e.Candidate:
        return self._candidates.get_candidate(task, name)

    def list_candidates(self, task: str) -> list[e.Candidate]:
        return self._candidates.list_candidates(task)

    def artifact_digests(self) -> set[str]:
        return self._candidates.artifact_digests()

    # ---- eval runs ---------------------------------------------------------------------
    def record_eval_run(self, run: e.EvalRunCreate) -> e.EvalRun:
        return self._eval_runs.record_eval_run(run)

    def get_eval_run(self, run_id: int) -> e.EvalRun:
        return self._eval_runs.get_eval_run(run_id)

    def list_eval_runs(self, task: str, candidate: str | None = None) -> list[e.EvalRun]:
        return self._eval_runs.list_eval_runs(task, candidate)

    def latest_eval_run(
        self, task: str, candidate: str, *, suite_fingerprint: str | None = None
    ) -> e.EvalRun | None:
        return self._eval_runs.latest_eval_run(task, candidate, suite_fingerprint=suite_fingerprint)

    def leaderboard(self, task: str) -> dict[str, e.EvalRun]:
        return self._eval_runs.leaderboard(task)

    def ranking_run(self, task: str, candidate: str) -> e.EvalRun | None:
        return self._eval_runs.ranking_run(task, candidate)

    # ---- placements --------------------------------------------------------------------
    def current_placement(self, task: str) -> e.Placement | None:
        return self._placements.current_placement(task)

    def list_placements(self) -> list[e.Placement]:
        return self._placements.list_placements()

    def unpublished_placements(self) -> list[e.Placement]:
        return self._placements.unpublished_placements()

    def mark_published(self, task: str, epoch: int) -> None:
        self._placements.mark_published(task, epoch)

    # ---- promotions --------------------------------------------------------------------
    def champion(self, task: str) -> e.Candidate | None:
        return self._history.champion(task)

    def list_promotions(self, task: str) -> list[e.Promotion]:
        return self._history.list_promotions(task)

    def recommend(self, task: str) -> e.Recommendation:
        return self._promotions.recommend(task)

    def check_promotion(
        self, task: str, candidate: str, runtime: str | None = None
    ) -> e.PromotionCheck:
        return self._promotions.check_promotion(task, candidate, runtime)

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
        return self._promotions.promote(
            task,
            candidate,
            reason=reason,
            override=override,
            expected_champion=expected_champion,
            pinned=pinned,
            replicas=replicas,
            runtime=runtime,
        )

    def rollback(
        self, task: str, *, reason: str = "", expected_champion: str | None = UNSET
    ) -> e.Promotion:
        return self._promotions.rollback(task, reason=reason, expected_champion=expected_champion)

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
        return self._promotions.update_placement(
            task,
            pinned=pinned,
            replicas=replicas,
            candidate=candidate,
            runtime=runtime,
            reason=reason,
        )

    def maybe_auto_promote(self, task: str, candidate: str) -> e.Promotion | None:
        return self._promotions.maybe_auto_promote(task, candidate)

    def get_task_auto_promote(self, task: str) -> bool:
        return self._promotions.get_task_auto_promote(task)

    # ---- API keys ----------------------------------------------------------------------
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
        return self._keys.create_api_key(
            name,
            roles=roles,
            tasks=tasks,
            rate_limit_per_s=rate_limit_per_s,
            rate_burst=rate_burst,
            token_rate_per_s=token_rate_per_s,
            token_burst=token_burst,
        )

    def authenticate(self, token: str) -> e.ApiKey:
        return self._keys.authenticate(token)

    def revoke_api_key(self, name: str) -> None:
        self._keys.revoke_api_key(name)

    def set_api_key_quota(
        self,
        name: str,
        *,
        rate_limit_per_s: float | None,
        rate_burst: int | None = None,
        token_rate_per_s: float | None = None,
        token_burst: int | None = None,
    ) -> e.ApiKey:
        return self._keys.set_api_key_quota(
            name,
            rate_limit_per_s=rate_limit_per_s,
            rate_burst=rate_burst,
            token_rate_per_s=token_rate_per_s,
            token_burst=token_burst,
        )

    def list_api_keys(self) -> list[e.ApiKey]:
        return self._keys.list_api_keys()

    def api_key_digests(self) -> list[e.ApiKeyDigest]:
        return self._keys.api_key_digests()

    # ---- dashboard sessions ------------------------------------------------------------
    def start_session(self, key_name: str, *, max_age_s: int) -> str:
        return self._sessions.start_session(key_name, max_age_s=max_age_s)

    def session_key(self, token: str) -> e.ApiKey | None:
        return self._sessions.session_key(token)

    def end_session(self, token: str) -> None:
        self._sessions.end_session(token)

    # ---- the fleet as reported ---------------------------------------------------------
    def record_worker_report(
        self, report: e.WorkerReport, *, seen_at: datetime | None = None
    ) -> e.Worker:
        return self._fleet.record_worker_report(report, seen_at=seen_at)

    def mark_workers_unreachable(
        self, *, seen_before: datetime | None = None, worker_ids: list[str] | None = None
    ) -> list[str]:
        return self._fleet.mark_workers_unreachable(seen_before=seen_before, worker_ids=worker_ids)

    def forget_workers(self, seen_before: datetime) -> list[str]:
        return self._fleet.forget_workers(seen_before)

    def list_workers(self, *, reachable_only: bool = False) -> list[e.Worker]:
        return self._fleet.list_workers(reachable_only=reachable_only)

    def placement_status(self) -> list[e.PlacementStatus]:
        return self._fleet.placement_status()

    # ---- runtime profiles --------------------------------------------------------------
    def record_profile(self, profile: e.ProfileCreate) -> e.RuntimeProfile:
        return self._profiles.record_profile(profile)

    def remove_profile(self, model: str, machine_class: str) -> e.RuntimeProfile:
        return self._profiles.remove_profile(model, machine_class)

    def list_profiles(self, model: str | None = None) -> list[e.RuntimeProfile]:
        return self._profiles.list_profiles(model)

    def profiles_for(self, model_sha256: str) -> list[e.RuntimeProfile]:
        return self._profiles.profiles_for(model_sha256)

    # ---- production --------------------------------------------------------------------
    def production_settings(self, task: str) -> e.ProductionSettings:
        return self._production.production_settings(task)

    def set_production_settings(
        self, task: str, **changes: float | int | str
    ) -> e.ProductionSettings:
        return self._production.set_production_settings(task, **changes)

    def list_production_settings(self) -> list[e.ProductionSettings]:
        return self._production.list_production_settings()

    def start_shadow(
        self,
        task: str,
        candidate: str,
        *,
        sample_rate: float,
        runtime: str | None = None,
        reason: str = "",
    ) -> e.Shadow:
        return self._shadows.start_shadow(
            task, candidate, sample_rate=sample_rate, runtime=runtime, reason=reason
        )

    def stop_shadow(self, task: str, *, reason: str = "") -> e.Shadow:
        return self._shadows.stop_shadow(task, reason=reason)

    def current_shadow(self, task: str) -> e.Shadow | None:
        return self._shadows.current_shadow(task)

    def shadow_history(self, task: str | None = None) -> list[e.Shadow]:
        return self._shadows.shadow_history(task)

    def unpublished_shadows(self) -> list[e.Shadow]:
        return self._shadows.unpublished_shadows()

    def mark_shadow_published(self, task: str, epoch: int) -> None:
        self._shadows.mark_shadow_published(task, epoch)

    def record_sample(self, sample: e.SampleCreate) -> bool:
        return self._samples.record_sample(sample)

    def record_shadow_outcome(self, outcome: e.ShadowOutcome) -> bool:
        return self._samples.record_shadow_outcome(outcome)

    def get_sample(self, request_id: str) -> e.Sample | None:
        return self._samples.get_sample(request_id)

    def list_samples(
        self, task: str, *, after_id: int = 0, limit: int = 1000, model_key: str | None = None
    ) -> list[e.Sample]:
        return self._samples.list_samples(task, after_id=after_id, limit=limit, model_key=model_key)

    def agreement_summary(
        self, task: str, *, shadow: str | None = None, buckets: int = 12
    ) -> e.AgreementSummary:
        return self._samples.agreement_summary(task, shadow=shadow, buckets=buckets)

    def record_drift_window(self, window: e.DriftWindowCreate) -> e.DriftWindow:
        return self._samples.record_drift_window(window)

    def drift_windows(self, task: str, *, limit: int = 100) -> list[e.DriftWindow]:
        return self._samples.drift_windows(task, limit=limit)

    def prune_samples(self, *, now: datetime | None = None) -> int:
        return self._samples.prune_samples(now=now)

    def add_live_item(self, item: e.LiveItemCreate) -> e.LiveItem | None:
        return self._live.add_live_item(item)

    def live_items(self, task: str) -> list[e.LiveItem]:
        return self._live.live_items(task)

    def live_counts(self, task: str) -> tuple[int, int]:
        return self._live.live_counts(task)

    def mark_live_items_cut(self, task: str, item_ids: list[int], suite_version: int) -> int:
        return self._live.mark_live_items_cut(task, item_ids, suite_version)

    def stale_pairings(self, task: str, *, challengers: int = 2) -> list[e.Staleness]:
        return self._reevaluations.stale_pairings(task, challengers=challengers)

    def queue_stale(self, task: str, *, challengers: int = 2) -> list[e.Reevaluation]:
        return self._reevaluations.queue_stale(task, challengers=challengers)

    def next_reevaluation(self) -> e.Reevaluation | None:
        return self._reevaluations.next_reevaluation()

    def finish_reevaluation(
        self, reevaluation_id: int, *, eval_run_id: int | None = None, error: str | None = None
    ) -> e.Reevaluation:
        return self._reevaluations.finish_reevaluation(
            reevaluation_id, eval_run_id=eval_run_id, error=error
        )

    def requeue_interrupted(self) -> int:
        return self._reevaluations.requeue_interrupted()

    def list_reevaluations(self, task: str, *, limit: int = 50) -> list[e.Reevaluation]:
        return self._reevaluations.list_reevaluations(task, limit=limit)
