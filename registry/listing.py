"""What the CLI's listing commands print, read from a SQLite registry without SQLAlchemy.

`taskfleet task ls` should answer as fast as `--help`: importing SQLAlchemy, the ORM models and
the service takes longer than the rest of such a command together. A `Listing` reads the same
rows with the standard library's sqlite3, read-only, and returns the same entities the
`Registry` returns (`tests/test_listing.py` compares the two on one database).

It is only for a database it can read as it is: `Listing.open` answers None for any other
URL (PostgreSQL, an in-memory database, URL options), for a file that does not exist yet, and
for a schema that is not the newest revision. The caller then opens the `Registry`, which
creates or migrates the schema, or says why it cannot.
"""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from registry import entities as e
from registry.errors import DatabaseError, NotFound

_PREFIX = "sqlite:///"
# How long a reader or writer waits for another writer's lock; the Registry's too (registry/db.py).
DEFAULT_SQLITE_BUSY_TIMEOUT_S = 30.0


def sqlite_path(database_url: str) -> Path | None:
    """The file of a plain `sqlite:///PATH` URL; None for anything else."""
    if not database_url.startswith(_PREFIX) or "?" in database_url:
        return None
    path = database_url[len(_PREFIX) :]
    return None if path in ("", ":memory:") else Path(path)


def _when(value: str | None) -> datetime | None:
    """A stored timestamp as the ORM's UTCDateTime returns it (SQLite stores it naive, UTC)."""
    if value is None:
        return None
    moment = datetime.fromisoformat(value)
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _stamp(value: str) -> datetime:
    moment = _when(value)
    assert moment is not None  # the column is NOT NULL
    return moment


def connect_current(
    database_url: str, *, writable: bool, busy_timeout_s: float
) -> sqlite3.Connection | None:
    """A sqlite3 connection to a current SQLite registry (read-only unless ``writable``), or
    None where only the `Registry` can open the database (see the module's docstring)."""
    path = sqlite_path(database_url)
    if path is None or not path.is_file():
        return None
    import migrations

    mode = "rw" if writable else "ro"
    try:
        conn = sqlite3.connect(
            f"{path.resolve().as_uri()}?mode={mode}", uri=True, timeout=busy_timeout_s
        )
    except sqlite3.Error:
        return None
    try:
        row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
    except sqlite3.Error:
        row = None
    if row is None or row[0] != migrations.newest_revision():
        conn.close()
        return None
    conn.row_factory = sqlite3.Row
    return conn


class Listing:
    """Read-only listings of one current SQLite registry."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    @classmethod
    def open(
        cls, database_url: str, *, busy_timeout_s: float = DEFAULT_SQLITE_BUSY_TIMEOUT_S
    ) -> Listing | None:
        """A listing of the database, or None where only the `Registry` can open it."""
        conn = connect_current(database_url, writable=False, busy_timeout_s=busy_timeout_s)
        return None if conn is None else cls(conn)

    def close(self) -> None:
        self._conn.close()

    def _rows(self, sql: str, *params: Any) -> list[sqlite3.Row]:
        try:
            with closing(self._conn.execute(sql, params)) as cursor:
                return list(cursor.fetchall())
        except sqlite3.Error as exc:  # one line, as the Registry says it, not a traceback
            raise DatabaseError(f"cannot read the registry database: {exc}") from None

    # ---- the listings ---------------------------------------------------------------------
    def list_tasks(self) -> list[e.Task]:
        return [
            e.Task(
                r["id"],
                r["name"],
                r["kind"],
                r["description"],
                r["suite"],
                r["owner"],
                r["margin"],
                bool(r["auto_promote"]),
                _stamp(r["created_at"]),
                r["max_text_chars"],
                r["max_query_chars"],
                r["max_document_chars"],
                r["prefer"],
            )
            for r in self._rows("SELECT * FROM tasks ORDER BY name")
        ]

    def list_suites(self) -> list[e.Suite]:
        """The newest version of every suite, by name."""
        rows = self._rows(
            "SELECT s.* FROM suites s JOIN (SELECT name, MAX(version) AS version FROM suites "
            "GROUP BY name) newest ON s.name = newest.name AND s.version = newest.version "
            "ORDER BY s.name"
        )
        return [
            e.Suite(
                id=r["id"],
                name=r["name"],
                version=r["version"],
                kind=r["kind"],
                location=r["location"],
                test_split=r["test_split"],
                train_split=r["train_split"],
                main_metric=r["main_metric"],
                metrics=list(json.loads(r["metrics"])),
                description=r["description"],
                fingerprint=r["fingerprint"],
                mteb_task=r["mteb_task"],
                stats=dict(json.loads(r["stats"])),
                created_at=_stamp(r["created_at"]),
                live_split=r["live_split"],
            )
            for r in rows
        ]

    def list_candidates(self, task: str) -> list[e.Candidate]:
        found = self._rows("SELECT id FROM tasks WHERE name = ?", task)
        if not found:
            raise NotFound(f"unknown task {task!r}")
        rows = self._rows(
            "SELECT c.id, c.name, c.kind, c.created_at, b.name AS base, a.name AS adapter "
            "FROM candidates c LEFT JOIN base_models b ON b.id = c.base_model_id "
            "LEFT JOIN adapters a ON a.id = c.adapter_id WHERE c.task_id = ? ORDER BY c.id",
            found[0]["id"],
        )
        return [
            e.Candidate(
                r["id"],
                r["name"],
                task,
                r["kind"],
                r["base"],
                r["adapter"],
                _stamp(r["created_at"]),
            )
            for r in rows
        ]

    def list_workers(self, *, reachable_only: bool = False) -> list[e.Worker]:
        where = " WHERE reachable = 1" if reachable_only else ""
        return [
            e.Worker(
                r["id"],
                r["worker_id"],
                r["host"],
                list(json.loads(r["loaded"])),
                r["memory_used"],
                r["memory_budget"],
                dict(json.loads(r["queue_depth"])),
                list(json.loads(r["runtimes"])),
                dict(json.loads(r["epochs"])),
                _stamp(r["reported_at"]),
                _stamp(r["seen_at"]),
                bool(r["reachable"]),
                _stamp(r["created_at"]),
                dict(json.loads(r["profiles"] or "null") or {}),
            )
            for r in self._rows(f"SELECT * FROM workers{where} ORDER BY worker_id")
        ]

    def list_placements(self) -> list[e.Placement]:
        """The newest placement of every task that has one."""
        rows = self._rows(
            "SELECT p.*, t.name AS task, c.name AS candidate FROM placements p JOIN (SELECT "
            "task_id, MAX(epoch) AS epoch FROM placements GROUP BY task_id) newest ON "
            "p.task_id = newest.task_id AND p.epoch = newest.epoch JOIN tasks t ON t.id = "
            "p.task_id JOIN candidates c ON c.id = p.candidate_id ORDER BY t.name"
        )
        return [
            e.Placement(
                r["id"],
                r["task"],
                r["candidate"],
                r["epoch"],
                bool(r["pinned"]),
                r["replicas"],
                _stamp(r["created_at"]),
                _when(r["published_at"]),
                r["runtime"],
            )
            for r in rows
        ]

    def placement_status(self) -> list[e.PlacementStatus]:
        """Per placed task: the desired epoch and the epoch each reachable worker reports."""
        workers = self.list_workers(reachable_only=True)
        return [e.PlacementStatus.of(p, workers) for p in self.list_placements()]
