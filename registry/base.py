"""What the entity mixins not yet made repositories share: the transactions they write with."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from sqlalchemy.orm import Session

from registry.artifacts import ArtifactStore
from registry.transactions import Transactions


class ServiceBase:
    def __init__(self, tx: Transactions, artifacts: ArtifactStore) -> None:
        self.tx = tx
        self.artifacts = artifacts
        self.engine = tx.engine
        self.actor = tx.actor
        self.roles = tx.roles

    def _read(self) -> AbstractContextManager[Session]:
        return self.tx.read()

    def _write(self) -> AbstractContextManager[Session]:
        return self.tx.write()

    def _audit(
        self,
        session: Session,
        action: str,
        entity: str,
        entity_id: str,
        detail: dict[str, Any] | None = None,
    ) -> None:
        self.tx.audit(session, action, entity, entity_id, detail)
