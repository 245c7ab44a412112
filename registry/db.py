"""Engine creation, URL validation and schema migration (Alembic is the only schema path)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError
from sqlalchemy.exc import OperationalError as SAOperationalError

from registry.errors import DatabaseError
from registry.listing import DEFAULT_SQLITE_BUSY_TIMEOUT_S

SUPPORTED_BACKENDS = ("sqlite", "postgresql")


def create_registry_engine(url: str) -> Engine:
    """Build an engine for a SQLite or PostgreSQL URL, or fail with one clear line."""
    try:
        parsed = make_url(url)
        parsed.port  # noqa: B018 - a non-numeric port only fails when read
    except (ArgumentError, ValueError) as exc:
        raise DatabaseError(f"malformed database URL {url!r}: {exc}") from None
    backend = parsed.get_backend_name()
    if backend not in SUPPORTED_BACKENDS:
        raise DatabaseError(
            f"unsupported database {backend!r} in {url!r}; use sqlite:/// or postgresql://"
        )
    if backend == "postgresql" and parsed.drivername == "postgresql":
        # psycopg 3 is the driver we ship; psycopg2 is not a dependency.
        parsed = parsed.set(drivername="postgresql+psycopg")
    kwargs: dict[str, Any] = {"future": True}
    if backend == "sqlite":
        database = parsed.database
        if database and database != ":memory:":
            parent = Path(database).expanduser().parent
            if not parent.exists():
                parent.mkdir(parents=True, exist_ok=True)
        # How long a call waits for a lock another process holds (`?timeout=<seconds>`).
        busy_timeout_s = _busy_timeout(parsed.query.get("timeout"), url)
        parsed = parsed.difference_update_query(["timeout"])
        kwargs["connect_args"] = {"timeout": busy_timeout_s}
    else:
        kwargs["pool_pre_ping"] = True
    try:
        engine = create_engine(parsed, **kwargs)
    except (ArgumentError, NoSuchModuleError) as exc:
        raise DatabaseError(f"cannot use database URL {url!r}: {exc}") from None
    if backend == "sqlite":
        busy_ms = int(busy_timeout_s * 1000)
        event.listen(engine, "connect", lambda conn, _record: _sqlite_pragmas(conn, busy_ms))
        event.listen(engine, "begin", _sqlite_begin_immediate)
    return engine


def _busy_timeout(raw: Any, url: str) -> float:
    if raw is None:
        return DEFAULT_SQLITE_BUSY_TIMEOUT_S
    try:
        value = float(raw if isinstance(raw, str) else raw[0])
    except (TypeError, ValueError, IndexError):
        value = -1.0
    if not value >= 0:
        raise DatabaseError(f"'timeout' in {url!r} must be a number of seconds >= 0")
    return value


def _sqlite_pragmas(dbapi_conn: Any, busy_timeout_ms: int) -> None:
    # Python's sqlite3 opens transactions lazily; we issue BEGIN ourselves (see below).
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
    cur.close()


def _sqlite_begin_immediate(conn: Any) -> None:
    # Take the write lock at BEGIN so two processes registering at once serialise cleanly
    # instead of failing with "database is locked" on lock upgrade.
    conn.exec_driver_sql("BEGIN IMMEDIATE")


def alembic_config(engine: Engine) -> Any:
    from alembic.config import Config

    import migrations

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
    cfg.attributes["engine"] = engine
    return cfg


def upgrade(engine: Engine, revision: str = "head") -> None:
    import migrations

    if revision == "head" and _stored_revision(engine) == migrations.newest_revision():
        return  # current already: every CLI command opens the registry, few need Alembic
    from alembic import command

    try:
        command.upgrade(alembic_config(engine), revision)
    except SAOperationalError as exc:
        raise DatabaseError(f"cannot reach database: {exc.orig}") from None


def _stored_revision(engine: Engine) -> str | None:
    """The revision in `alembic_version`, read with plain SQL; None when there is none yet or
    the database cannot be read (the full upgrade then says why)."""
    try:
        with engine.connect() as conn:
            value = conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalar()
    except DBAPIError:
        return None
    return None if value is None else str(value)


def downgrade(engine: Engine, revision: str = "base") -> None:
    from alembic import command

    command.downgrade(alembic_config(engine), revision)


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    except SAOperationalError as exc:
        raise DatabaseError(f"cannot reach database: {exc.orig}") from None


def head_revision(engine: Engine) -> str | None:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config(engine)).get_current_head()
