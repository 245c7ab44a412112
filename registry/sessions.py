"""Dashboard sessions, kept server-side: logging out (or revoking the key) ends them at once.

The signed cookie carries a random session token; the table keeps only its sha256, the key it
signed in with and when it expires. A cookie copied before logout is worthless after it.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

from sqlalchemy import delete, or_, select

from registry import entities as e
from registry.errors import InvalidInput, NotFound
from registry.keys import api_key_entity
from registry.models import ApiKeyRow, DashboardSessionRow, utcnow
from registry.transactions import Transactions

# Ended or expired sessions are deleted this long after, to keep the table small.
_KEEP_ENDED = timedelta(days=1)


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class DashboardSessionRepository:
    def __init__(self, tx: Transactions) -> None:
        self.tx = tx

    def start_session(self, key_name: str, *, max_age_s: int) -> str:
        """A new session for the key; returns its token (stored only as a hash)."""
        if max_age_s <= 0:
            raise InvalidInput("a session must last more than 0 s")
        token = secrets.token_urlsafe(32)
        now = utcnow()
        with self.tx.write(signal=False) as s:
            key = s.scalar(select(ApiKeyRow).where(ApiKeyRow.name == key_name))
            if key is None:
                raise NotFound(f"unknown api key {key_name!r}")
            s.execute(
                delete(DashboardSessionRow).where(
                    or_(
                        DashboardSessionRow.expires_at < now - _KEEP_ENDED,
                        DashboardSessionRow.ended_at < now - _KEEP_ENDED,
                    )
                )
            )
            s.add(
                DashboardSessionRow(
                    token_hash=_hash(token),
                    api_key_id=key.id,
                    created_at=now,
                    expires_at=now + timedelta(seconds=max_age_s),
                )
            )
            self.tx.audit(s, "session.start", "api_key", key_name)
        return token

    def session_key(self, token: str) -> e.ApiKey | None:
        """The key of a live session (not ended, not expired, key not revoked), else None."""
        with self.tx.read() as s:
            row = s.execute(
                select(DashboardSessionRow, ApiKeyRow)
                .join(ApiKeyRow, ApiKeyRow.id == DashboardSessionRow.api_key_id)
                .where(DashboardSessionRow.token_hash == _hash(token))
            ).first()
            if row is None:
                return None
            session, key = row
            if session.ended_at is not None or session.expires_at <= utcnow():
                return None
            return None if key.revoked_at is not None else api_key_entity(key)

    def end_session(self, token: str) -> None:
        """Log out: the session's cookie no longer signs anyone in. Unknown tokens: nothing."""
        with self.tx.write(signal=False) as s:
            session = s.scalar(
                select(DashboardSessionRow).where(DashboardSessionRow.token_hash == _hash(token))
            )
            if session is None or session.ended_at is not None:
                return
            session.ended_at = utcnow()
            key = s.get(ApiKeyRow, session.api_key_id)
            self.tx.audit(s, "session.end", "api_key", key.name if key else "?")
