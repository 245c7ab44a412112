"""The registry service: the only writer of the database.

`Registry` is one facade over small per-area mixins (catalog, eval runs, placements and
promotions, API keys); each public method is one transaction that also appends to the audit log.
"""

from __future__ import annotations

from pathlib import Path

from registry import db
from registry.artifacts import ArtifactStore
from registry.catalog import CatalogMixin
from registry.evalruns import EvalRunMixin
from registry.keys import ApiKeyMixin
from registry.placements import PlacementMixin


class Registry(CatalogMixin, EvalRunMixin, PlacementMixin, ApiKeyMixin):
    @classmethod
    def open(
        cls, database_url: str, *, artifact_dir: Path, actor: str = "system", migrate: bool = True
    ) -> Registry:
        """Connect, bring the schema to the newest migration, and return the service."""
        engine = db.create_registry_engine(database_url)
        if migrate:
            db.upgrade(engine)
        return cls(engine, ArtifactStore(artifact_dir), actor=actor)

    def as_actor(self, actor: str) -> Registry:
        """The same registry acting for someone else (REST/dashboard users)."""
        clone = Registry(self.engine, self.artifacts, actor=actor)
        clone._sessions = self._sessions
        return clone

    def close(self) -> None:
        self.engine.dispose()
