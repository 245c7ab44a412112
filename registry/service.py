"""The registry service: the only writer of the database.

`Registry` is the one SQLAlchemy implementation of `registry.store.AbstractStore`, split by
entity into small mixins (suites, catalog, eval runs, placements and promotions, API keys,
dashboard sessions, workers); each public method is one transaction that also appends to the
audit log. Callers that need only part of it type against the narrower views in
`registry/store.py`.
"""

from __future__ import annotations

from pathlib import Path

from registry import db
from registry.artifacts import ArtifactStore
from registry.entities import EvalRun, EvalRunCreate
from registry.evalruns import EvalRunMixin
from registry.fleet import FleetMixin
from registry.keys import ApiKeyMixin
from registry.placements import PlacementMixin
from registry.promotions import PromotionMixin
from registry.sessions import DashboardSessionMixin
from registry.store import AbstractStore
from registry.suite_versions import SuiteMixin
from registry.transactions import Transactions
from registry.variants import VariantMixin


class Registry(
    PromotionMixin,
    VariantMixin,
    EvalRunMixin,
    PlacementMixin,
    ApiKeyMixin,
    DashboardSessionMixin,
    FleetMixin,
    SuiteMixin,
    AbstractStore,  # last: the mixins' methods implement its abstract ones
):
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

    def record_eval_run(self, run: EvalRunCreate) -> EvalRun:
        """Record a finished eval run; tasks that opted in promote a winner right away."""
        recorded = super().record_eval_run(run)
        self.maybe_auto_promote(run.task, run.candidate)
        return recorded

    def close(self) -> None:
        self.tx.close()
