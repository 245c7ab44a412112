"""The registry service: the only writer of the database.

`Registry` is the one SQLAlchemy implementation of `registry.store.AbstractStore`, split by
entity into small mixins (suites, catalog, eval runs, placements and promotions, API keys,
dashboard sessions, workers); each public method is one transaction that also appends to the
audit log. Callers that need only part of it type against the narrower views in
`registry/store.py`.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from registry import db
from registry import entities as e
from registry.artifacts import ArtifactStore
from registry.evalruns import EvalRunRepository
from registry.fleet import FleetRepository
from registry.keys import ApiKeyRepository
from registry.placements import PlacementRepository
from registry.promotions import PromotionMixin
from registry.sessions import DashboardSessionRepository
from registry.store import AbstractStore
from registry.suite_versions import SuiteRepository
from registry.transactions import Transactions
from registry.variants import VariantMixin


class Registry(
    PromotionMixin,
    VariantMixin,
    AbstractStore,  # last: the mixins' methods implement its abstract ones
):
    def __init__(self, tx: Transactions, artifacts: ArtifactStore) -> None:
        super().__init__(tx, artifacts)
        self._suites = SuiteRepository(tx)
        self._eval_runs = EvalRunRepository(tx)
        self._placements = PlacementRepository(tx)
        self._keys = ApiKeyRepository(tx)
        self._sessions = DashboardSessionRepository(tx)
        self._fleet = FleetRepository(tx, self._placements)

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

    # ---- suite versions ----------------------------------------------------------------
    def add_suite(self, suite: e.SuiteCreate) -> tuple[e.Suite, bool]:
        return self._suites.add_suite(suite)

    def get_suite(self, name: str, version: int | None = None) -> e.Suite:
        return self._suites.get_suite(name, version)

    def suite_versions(self, name: str) -> list[e.Suite]:
        return self._suites.suite_versions(name)

    def list_suites(self) -> list[e.Suite]:
        return self._suites.list_suites()

    # ---- eval runs ---------------------------------------------------------------------
    def record_eval_run(self, run: e.EvalRunCreate) -> e.EvalRun:
        """Record a finished eval run; tasks that opted in promote a winner right away."""
        recorded = self._eval_runs.record_eval_run(run)
        self.maybe_auto_promote(run.task, run.candidate)
        return recorded

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

    # ---- API keys ----------------------------------------------------------------------
    def create_api_key(
        self,
        name: str,
        *,
        roles: list[str],
        tasks: list[str] | None = None,
        rate_limit_per_s: float | None = None,
        rate_burst: int | None = None,
    ) -> tuple[e.ApiKey, str]:
        return self._keys.create_api_key(
            name, roles=roles, tasks=tasks, rate_limit_per_s=rate_limit_per_s, rate_burst=rate_burst
        )

    def authenticate(self, token: str) -> e.ApiKey:
        return self._keys.authenticate(token)

    def revoke_api_key(self, name: str) -> None:
        self._keys.revoke_api_key(name)

    def set_api_key_quota(
        self, name: str, *, rate_limit_per_s: float | None, rate_burst: int | None = None
    ) -> e.ApiKey:
        return self._keys.set_api_key_quota(
            name, rate_limit_per_s=rate_limit_per_s, rate_burst=rate_burst
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
