"""`taskfleet key create` on a current SQLite registry, written with sqlite3, not SQLAlchemy.

Creating a key is the one registry write a newcomer types among the README's first commands;
through the `Registry` it waits most of a second for SQLAlchemy, the ORM models and the service
to import. This writes the same two rows the `ApiKeyRepository` writes (the key and its audit
entry, in one immediate transaction), from the same rules and token (`registry/key_rules.py`);
`tests/test_listing.py` reads what it wrote back through the `Registry`.

Only for a database `connect_current` opens (a current SQLite file): `KeyWriter.open` answers
None otherwise and the caller uses the `Registry`, which creates or migrates the schema.
"""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime

from registry import entities as e
from registry.errors import AlreadyExists, DatabaseError
from registry.key_rules import new_key
from registry.listing import DEFAULT_SQLITE_BUSY_TIMEOUT_S, connect_current


def _stored_now() -> str:
    """Now as SQLAlchemy's SQLite DateTime stores a UTC moment (naive, microseconds)."""
    return datetime.now(UTC).replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")


class KeyWriter:
    def __init__(self, conn: sqlite3.Connection, actor: str) -> None:
        self._conn = conn
        self._actor = actor

    @classmethod
    def open(
        cls,
        database_url: str,
        *,
        actor: str,
        busy_timeout_s: float = DEFAULT_SQLITE_BUSY_TIMEOUT_S,
    ) -> KeyWriter | None:
        conn = connect_current(database_url, writable=True, busy_timeout_s=busy_timeout_s)
        if conn is None:
            return None
        conn.isolation_level = None  # transactions are begun here, explicitly
        return cls(conn, actor)

    def close(self) -> None:
        self._conn.close()

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
        """As `Registry.create_api_key`: the key, and its plain token (returned once)."""
        key, token = new_key(
            name,
            roles=roles,
            tasks=tasks,
            rate_limit_per_s=rate_limit_per_s,
            rate_burst=rate_burst,
            token_rate_per_s=token_rate_per_s,
            token_burst=token_burst,
        )
        conn = self._conn
        try:
            conn.execute("BEGIN IMMEDIATE")  # as the Registry's SQLite writes begin
            try:
                if conn.execute("SELECT 1 FROM api_keys WHERE name = ?", (name,)).fetchone():
                    raise AlreadyExists(f"api key {name!r} already exists")
                created = _stored_now()
                cursor = conn.execute(
                    "INSERT INTO api_keys (name, prefix, secret_hash, roles, tasks, created_at, "
                    "rate_limit_per_s, rate_burst, token_rate_per_s, token_burst) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        key.name,
                        key.prefix,
                        key.secret_hash,
                        json.dumps(key.roles),
                        json.dumps(key.tasks),
                        created,
                        key.rate_limit_per_s,
                        key.rate_burst,
                        key.token_rate_per_s,
                        key.token_burst,
                    ),
                )
                key_id = cursor.lastrowid
                conn.execute(
                    "INSERT INTO audit_log (actor, action, entity, entity_id, detail, created_at) "
                    "VALUES (?, 'apikey.create', 'api_key', ?, ?, ?)",
                    (self._actor, name, json.dumps({"roles": key.roles}), _stored_now()),
                )
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        except sqlite3.IntegrityError as exc:  # a concurrent writer won the race
            raise AlreadyExists(f"conflicting record already exists ({exc})") from None
        except sqlite3.Error as exc:  # one line, as the Registry says it
            raise DatabaseError(f"database error: {exc}") from None
        assert key_id is not None
        return (
            e.ApiKey(
                key_id,
                key.name,
                key.prefix,
                list(key.roles),
                list(key.tasks),
                datetime.fromisoformat(created).replace(tzinfo=UTC),
                None,
                key.rate_limit_per_s,
                key.rate_burst,
                key.token_rate_per_s,
                key.token_burst,
            ),
            token,
        )
