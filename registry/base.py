"""Transaction and audit plumbing shared by every registry service area."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import DataError, IntegrityError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from registry.artifacts import ArtifactStore
from registry.errors import AlreadyExists, DatabaseError, InvalidInput
from registry.models import AuditRow


class ServiceBase:
    def __init__(
        self,
        engine: Engine,
        artifacts: ArtifactStore,
        actor: str = "system",
        roles: tuple[str, ...] = ("admin",),
    ) -> None:
        self.engine = engine
        self.artifacts = artifacts
        self.actor = actor
        # Who is acting decides what the rule-bound operations (promotion) allow. Local users
        # of the CLI hold the database itself, so they act as admin; REST and dashboard users
        # get the roles of their API key through `Registry.as_actor`.
        self.roles = roles
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    @contextmanager
    def _read(self) -> Iterator[Session]:
        try:
            with self._sessions() as session:
                yield session
        except DataError as exc:
            raise InvalidInput(f"a value the database cannot hold ({_first_line(exc)})") from None
        except OperationalError as exc:
            raise DatabaseError(f"database error: {exc.orig}") from None

    @contextmanager
    def _write(self) -> Iterator[Session]:
        """One transaction: everything in it commits together or not at all."""
        try:
            with self._sessions() as session, session.begin():
                yield session
        except IntegrityError as exc:
            # A concurrent writer won the race past our pre-checks.
            raise AlreadyExists(f"conflicting record already exists ({_first_line(exc)})") from None
        except DataError as exc:  # too long for its column, a NUL in PostgreSQL text, ...
            raise InvalidInput(f"a value the database cannot hold ({_first_line(exc)})") from None
        except OperationalError as exc:
            raise DatabaseError(f"database error: {exc.orig}") from None

    def _audit(
        self,
        session: Session,
        action: str,
        entity: str,
        entity_id: str,
        detail: dict[str, Any] | None = None,
    ) -> None:
        session.add(
            AuditRow(
                actor=self.actor,
                action=action,
                entity=entity,
                entity_id=entity_id,
                detail=detail or {},
            )
        )


def _first_line(exc: Exception) -> str:
    orig = getattr(exc, "orig", exc)
    return str(orig).splitlines()[0] if str(orig) else type(orig).__name__
