"""Alembic environment: the only way the registry schema changes."""

from __future__ import annotations

from pathlib import Path

VERSIONS = Path(__file__).parent / "versions"


def newest_revision() -> str:
    """The head revision, read from the version files' names (`NNNN_what.py`, revision NNNN)
    without loading Alembic, so a command on a current database skips the migration machinery.
    `tests/test_migrations.py` checks that it is Alembic's head and that every file's revision
    is its number."""
    return max(p.name.split("_", 1)[0] for p in VERSIONS.glob("[0-9][0-9][0-9][0-9]_*.py"))
