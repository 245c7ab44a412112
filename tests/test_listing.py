"""`registry.listing` returns what the `Registry` returns, on one real SQLite database.

The CLI's listing commands read through it to skip SQLAlchemy (tests/test_cli_imports.py); if
it drifted from the ORM's mapping (a column renamed, a JSON or timestamp read differently) a
user would see other data than the dashboard shows. It refuses what it cannot read as it is,
so the `Registry` can create, migrate or explain.
"""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from registry import NotFound, Registry
from registry.entities import WorkerReport
from registry.errors import AlreadyExists, DatabaseError, InvalidInput
from registry.key_writer import KeyWriter
from registry.listing import Listing, sqlite_path
from testbed.declared_tasks import add_task, declare_suite
from tests.evalrun_fixture import record_run
from tests.test_registry import make_adapter_dir, make_model_dir, training


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Two tasks, a suite with two versions, a model, an adapter, candidates of both, two
    placements of one task (the newest counts), a reachable and a silent worker."""
    root = tmp_path_factory.mktemp("listing")
    url = f"sqlite:///{root / 'registry.db'}"
    reg = Registry.open(url, artifact_dir=root / "artifacts")
    try:
        declare_suite(reg, "docs", description="first")
        declare_suite(reg, "docs", description="second, with other data", fingerprint="f" * 64)
        add_task(reg, "tickets", kind="classification", owner="ops", margin=0.02)
        reg.add_task("search", suite="docs", description="find", prefer="cheapest")
        reg.add_model("m", path=make_model_dir(root / "m"), query_prefix="q: ")
        reg.register_adapter(
            "a", base="m", source_dir=make_adapter_dir(root / "ad", b"a"), training=training()
        )
        reg.add_candidate("search", base="m")
        reg.add_candidate("search", base="m", adapter="a")
        reg.add_candidate("tickets", kind="majority")
        record_run(reg, "search", "m", 0.4)
        reg.promote("search", "m", reason="first")
        reg.update_placement("search", replicas=2, pinned=True, reason="more")
        now = datetime.now(UTC)
        epoch = reg.current_placement("search")
        assert epoch is not None
        reg.record_worker_report(
            WorkerReport(
                "w1",
                "h1",
                now,
                ["m"],
                10,
                20,
                {"search": 3},
                ["torch"],
                {"search": epoch.epoch},
                {"search": 1},
            )
        )
        reg.record_worker_report(
            WorkerReport("w0", "h0", now - timedelta(minutes=5), [], 0, 20, {}, ["http"], {}),
            seen_at=now - timedelta(minutes=5),
        )
        reg.mark_workers_unreachable(worker_ids=["w0"])
    finally:
        reg.close()
    return url


def test_every_listing_equals_the_registrys(database: str, tmp_path: Path) -> None:
    listing = Listing.open(database)
    assert listing is not None
    reg = Registry.open(database, artifact_dir=tmp_path / "artifacts")
    try:
        assert listing.list_tasks() == reg.list_tasks()
        assert listing.list_suites() == reg.list_suites()
        assert [s.description for s in listing.list_suites()] == ["second, with other data", ""]
        for task in ("search", "tickets"):
            assert listing.list_candidates(task) == reg.list_candidates(task)
        assert len(listing.list_candidates("search")) == 2
        assert listing.list_workers() == reg.list_workers()
        assert listing.list_workers(reachable_only=True) == reg.list_workers(reachable_only=True)
        assert listing.list_placements() == reg.list_placements()
        assert listing.placement_status() == reg.placement_status()
        (status,) = listing.placement_status()
        assert (status.replicas, status.pinned, status.reported) == (2, True, {"w1": 2})
        with pytest.raises(NotFound, match="unknown task 'nope'"):
            listing.list_candidates("nope")
    finally:
        listing.close()
        reg.close()


def test_what_only_the_registry_can_open_is_left_to_it(database: str, tmp_path: Path) -> None:
    assert sqlite_path("postgresql+psycopg://u@h/db") is None
    assert sqlite_path("sqlite:///:memory:") is None
    assert sqlite_path(f"{database}?timeout=5") is None
    assert Listing.open(f"sqlite:///{tmp_path / 'absent.db'}") is None
    assert not (tmp_path / "absent.db").exists(), "a listing never creates a database"

    older = tmp_path / "older.db"
    older.write_bytes(Path(database[len("sqlite:///") :]).read_bytes())
    with sqlite3.connect(older) as conn:
        conn.execute("UPDATE alembic_version SET version_num = '0001'")
    assert Listing.open(f"sqlite:///{older}") is None, (
        "an older schema is the Registry's to migrate"
    )

    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not a database")
    assert Listing.open(f"sqlite:///{garbage}") is None


def test_a_database_that_breaks_after_opening_is_one_error(database: str, tmp_path: Path) -> None:
    """A file damaged (or a table gone) after the listing opened is a DatabaseError, which the
    CLI prints as one line, never a traceback."""
    copy = tmp_path / "copy.db"
    copy.write_bytes(Path(database[len("sqlite:///") :]).read_bytes())
    listing = Listing.open(f"sqlite:///{copy}")
    assert listing is not None
    try:
        with sqlite3.connect(copy) as conn:
            conn.execute("DROP TABLE workers")
        with pytest.raises(DatabaseError, match="cannot read the registry database"):
            listing.list_workers()
    finally:
        listing.close()


def test_a_key_written_without_the_orm_is_the_registrys_key(database: str, tmp_path: Path) -> None:
    """`taskfleet key create` writes with sqlite3 (registry/key_writer.py): the Registry reads
    the key back as its own, authenticates its token, and finds the audit entry it would
    have written; the writer refuses what the Registry refuses, in one line."""
    copy = tmp_path / "keys.db"
    copy.write_bytes(Path(database[len("sqlite:///") :]).read_bytes())
    url = f"sqlite:///{copy}"
    writer = KeyWriter.open(url, actor="cli:tester")
    assert writer is not None
    reg = Registry.open(url, artifact_dir=tmp_path / "artifacts", actor="cli:tester")
    try:
        written, token = writer.create_api_key(
            "fast",
            roles=["viewer", "caller", "viewer"],
            tasks=["search"],
            rate_limit_per_s=2.5,
            rate_burst=5,
            token_rate_per_s=100.0,
        )
        ormed, _ = reg.create_api_key(
            "slow",
            roles=["viewer", "caller", "viewer"],
            tasks=["search"],
            rate_limit_per_s=2.5,
            rate_burst=5,
            token_rate_per_s=100.0,
        )
        stored = {k.name: k for k in reg.list_api_keys()}
        assert stored["fast"] == written
        for field in ("roles", "tasks", "rate_limit_per_s", "rate_burst", "token_rate_per_s"):
            assert getattr(written, field) == getattr(ormed, field), field
        assert written.token_burst is None
        assert abs(written.created_at - ormed.created_at) < timedelta(minutes=1)
        assert reg.authenticate(token) == written
        with sqlite3.connect(copy) as conn:  # stored as the ORM stores it, byte for byte
            columns = "roles, tasks, typeof(created_at), length(created_at), typeof(rate_burst)"
            rows = conn.execute(
                f"SELECT name, {columns} FROM api_keys WHERE name IN ('fast', 'slow')"
            ).fetchall()
        assert rows[0][1:] == rows[1][1:], rows
        audit = [(a.actor, a.action, a.entity, a.detail) for a in reg.audit_log(limit=2)]
        assert (
            audit
            == [("cli:tester", "apikey.create", "api_key", {"roles": ["caller", "viewer"]})] * 2
        )

        with pytest.raises(AlreadyExists, match="'slow' already exists"):
            writer.create_api_key("slow", roles=["viewer"])
        with pytest.raises(InvalidInput, match="roles must be some of"):
            writer.create_api_key("bad", roles=["king"])
        with pytest.raises(InvalidInput, match="burst needs a request rate"):
            writer.create_api_key("bad", roles=["viewer"], rate_burst=3)
        assert "bad" not in {k.name for k in reg.list_api_keys()}
    finally:
        writer.close()
        reg.close()
    absent = tmp_path / "absent.db"
    assert KeyWriter.open(f"sqlite:///{absent}", actor="x") is None
    assert not absent.exists(), "only the Registry creates a database"


def test_a_key_write_behind_another_writers_lock_is_one_error(
    database: str, tmp_path: Path
) -> None:
    """Another process holding the write lock past the busy timeout: `key create` says so in
    one line (DatabaseError) and leaves no half-written key."""
    copy = tmp_path / "locked.db"
    copy.write_bytes(Path(database[len("sqlite:///") :]).read_bytes())
    url = f"sqlite:///{copy}"
    writer = KeyWriter.open(url, actor="cli:tester", busy_timeout_s=0.2)
    assert writer is not None
    holder = sqlite3.connect(copy, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        with pytest.raises(DatabaseError, match="database is locked"):
            writer.create_api_key("blocked", roles=["viewer"])
        holder.execute("ROLLBACK")
        with sqlite3.connect(copy) as conn:
            assert conn.execute(
                "SELECT count(*) FROM api_keys WHERE name = 'blocked'"
            ).fetchone() == (0,)
    finally:
        holder.close()
        writer.close()
