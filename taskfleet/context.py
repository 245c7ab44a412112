"""What every CLI command shares: the effective settings and an open registry."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from registry import Registry
    from registry.key_writer import KeyWriter
    from registry.listing import Listing
    from taskfleet.settings import Settings


@dataclass
class CliState:
    """Global CLI flags (`taskfleet --home ... --database-url ...`) override the env."""

    overrides: dict[str, Any] = field(default_factory=dict)
    _settings: Settings | None = None
    _registry: Registry | None = None
    _listing: Listing | None = None

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            from taskfleet.settings import Settings

            self._settings = Settings.load(self.overrides)
        return self._settings

    def reset(self) -> None:
        """Forget what the last command opened (a test runs many commands in one process):
        the registry is closed, and settings, registry and listing are read anew."""
        if self._registry is not None:
            self._registry.close()
        if self._listing is not None:
            self._listing.close()
        self._settings, self._registry, self._listing = None, None, None

    def registry(self) -> Registry:
        if self._registry is None:
            from registry import Registry  # the database layer: only for commands that use it

            s = self.settings
            self._registry = Registry.open(
                s.resolved_database_url,
                artifact_dir=s.resolved_artifact_dir,
                actor=s.resolved_actor(),
            )
        return self._registry

    def listing(self) -> Listing | Registry:
        """What a listing command reads: a `Listing` of a current SQLite registry (no
        SQLAlchemy: such a command answers as fast as `--help`), else the registry itself."""
        if self._registry is not None:
            return self._registry
        if self._listing is None:
            from registry.listing import Listing

            self._listing = Listing.open(self.settings.resolved_database_url)
        return self._listing if self._listing is not None else self.registry()

    def key_writer(self) -> KeyWriter | Registry:
        """What `key create` writes with: a `KeyWriter` on a current SQLite registry (no
        SQLAlchemy), else the registry itself."""
        if self._registry is None:
            from registry.key_writer import KeyWriter

            s = self.settings
            writer = KeyWriter.open(s.resolved_database_url, actor=s.resolved_actor())
            if writer is not None:
                return writer
        return self.registry()


state = CliState()


def get_settings() -> Settings:
    return state.settings


def open_listing() -> Listing | Registry:
    """For commands that only list tasks, suites, candidates, placements or workers."""
    return state.listing()


def open_key_writer() -> KeyWriter | Registry:
    """For `key create`: a sqlite3 writer on a current SQLite registry, else the registry."""
    return state.key_writer()


def open_registry() -> Registry:
    """The registry for the effective settings, migrated to the newest schema."""
    return state.registry()
