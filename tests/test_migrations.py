"""Alembic is the only schema path: up, down, up again on both databases, and no drift."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from registry import db
from registry.models import Base


def test_upgrade_downgrade_upgrade_and_no_drift(db_url: str) -> None:
    engine = db.create_registry_engine(db_url)
    try:
        db.upgrade(engine)
        assert db.current_revision(engine) == db.head_revision(engine)
        tables = set(inspect(engine).get_table_names())
        assert set(Base.metadata.tables) <= tables

        db.downgrade(engine, "base")
        assert db.current_revision(engine) is None
        assert set(inspect(engine).get_table_names()) <= {"alembic_version"}

        db.upgrade(engine)
        with engine.connect() as conn:
            diff = compare_metadata(
                MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata
            )
        assert diff == [], f"ORM models and migrations disagree: {diff}"
    finally:
        engine.dispose()


def test_malformed_url_is_one_clear_error() -> None:
    import pytest

    from registry.errors import DatabaseError

    with pytest.raises(DatabaseError, match="malformed database URL"):
        db.create_registry_engine("not a url")
    with pytest.raises(DatabaseError, match="unsupported database 'mysql'"):
        db.create_registry_engine("mysql://x@y/z")


def test_the_newest_revision_without_alembic_is_alembic_head(db_url: str) -> None:
    """`migrations.newest_revision` (file names, no Alembic) is the head Alembic computes, every
    version file's revision is its number, and a database one revision behind is still brought
    to the head (the fast path skips only a current schema)."""
    import re

    import migrations

    for path in sorted(migrations.VERSIONS.glob("*.py")):
        if path.name == "__init__.py":
            continue
        declared = re.search(r'^revision: str = "(\w+)"$', path.read_text(), re.M)
        assert declared and declared.group(1) == path.name.split("_", 1)[0], path.name
    engine = db.create_registry_engine(db_url)
    try:
        head = db.head_revision(engine)
        assert migrations.newest_revision() == head
        db.upgrade(engine)
        db.downgrade(engine, "-1")
        assert db.current_revision(engine) not in (None, head)
        db.upgrade(engine)
        assert db.current_revision(engine) == head
    finally:
        engine.dispose()
