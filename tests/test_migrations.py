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
