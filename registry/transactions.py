"""Transactions on the registry's database, made by one actor: what every repository writes with.

Each repository (``registry/suite_versions.py``, ``tasks.py``, ..., ``fleet.py``) holds one
``Transactions`` and opens a ``read()`` or a ``write()`` per public method; a write commits
everything in it or nothing, and appends the audit rows of the act (``audit``) in the same
transaction. Database failures become the registry's own errors here, once.

Who acts travels with it: the actor named in audit and promotion rows, and the roles that the
rule-bound operations (promotion) check. Local users of the CLI hold the database itself, so
they act as admin; REST and dashboard users get the roles of their API key
(``Registry.as_actor`` -> ``acting_as``), over the same session factory.

A write that committed rings ``commits`` (shared by every actor of one registry): the placement
publisher in the same process publishes what a promotion placed at once instead of at its next
poll. Writes nobody publishes pass ``signal=False``: the fleet mirror's worker reports, the
publisher's own marks, and what traffic writes (samples, feedback, sessions, re-evaluation
queue), which would otherwise wake it once per sampled request.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.exc import DataError, IntegrityError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from registry import entities as e
from registry.errors import AlreadyExists, DatabaseError, InvalidInput
from registry.models import AuditRow

log = logging.getLogger(__name__)


class CommitSignal:
    """Callbacks run after each signalled write commits, in the writer's thread; each must be
    quick and must not raise (a failing one is logged, the write stands)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []

    def subscribe(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` after every signalled commit, until the returned function is
        called."""
        with self._lock:
            self._callbacks.append(callback)

        def unsubscribe() -> None:
            with self._lock:
                if callback in self._callbacks:
                    self._callbacks.remove(callback)

        return unsubscribe

    def ring(self) -> None:
        with self._lock:
            callbacks = list(self._callbacks)
        for callback in callbacks:
            try:
                callback()
            except Exception:
                log.exception("a commit callback failed")


class Transactions:
    def __init__(
        self,
        engine: Engine,
        *,
        actor: str = "system",
        roles: tuple[str, ...] = ("admin",),
        sessions: sessionmaker[Session] | None = None,
        commits: CommitSignal | None = None,
    ) -> None:
        self.engine = engine
        self.actor = actor
        self.roles = roles
        self.sessions = sessions or sessionmaker(engine, expire_on_commit=False)
        self.commits = commits or CommitSignal()

    def acting_as(self, actor: str, roles: tuple[str, ...]) -> Transactions:
        """The same database (session factory, commit signal) for another actor."""
        return Transactions(
            self.engine, actor=actor, roles=roles, sessions=self.sessions, commits=self.commits
        )

    @contextmanager
    def read(self) -> Iterator[Session]:
        try:
            with self.sessions() as session:
                yield session
        except DataError as exc:
            raise InvalidInput(f"a value the database cannot hold ({_first_line(exc)})") from None
        except OperationalError as exc:
            raise DatabaseError(f"database error: {exc.orig}") from None

    @contextmanager
    def write(self, *, signal: bool = True) -> Iterator[Session]:
        """One transaction: everything in it commits together or not at all. Once committed,
        ``commits`` rings unless ``signal`` is False."""
        try:
            with self.sessions() as session, session.begin():
                yield session
        except IntegrityError as exc:
            # A concurrent writer won the race past our pre-checks.
            raise AlreadyExists(f"conflicting record already exists ({_first_line(exc)})") from None
        except DataError as exc:  # too long for its column, a NUL in PostgreSQL text, ...
            raise InvalidInput(f"a value the database cannot hold ({_first_line(exc)})") from None
        except OperationalError as exc:
            raise DatabaseError(f"database error: {exc.orig}") from None
        if signal:
            self.commits.ring()

    def audit(
        self,
        session: Session,
        action: str,
        entity: str,
        entity_id: str,
        detail: dict[str, Any] | None = None,
    ) -> None:
        """Append the act to the audit log, in the caller's transaction."""
        session.add(
            AuditRow(
                actor=self.actor,
                action=action,
                entity=entity,
                entity_id=entity_id,
                detail=detail or {},
            )
        )

    def audit_log(self, limit: int = 100) -> list[e.AuditEntry]:
        """The newest acts first."""
        with self.read() as s:
            rows = s.scalars(select(AuditRow).order_by(AuditRow.id.desc()).limit(limit))
            return [
                e.AuditEntry(r.id, r.actor, r.action, r.entity, r.entity_id, r.detail, r.created_at)
                for r in rows
            ]

    def close(self) -> None:
        """Release the engine's connections (every actor's: they share it)."""
        self.engine.dispose()


def _first_line(exc: Exception) -> str:
    orig = getattr(exc, "orig", exc)
    return str(orig).splitlines()[0] if str(orig) else type(orig).__name__
