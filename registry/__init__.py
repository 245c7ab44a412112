"""The registry: source of truth for tasks, models, adapters, candidates, evals and placements.

Only this package writes the database. Everything else calls `registry.Registry` (in-process,
typed against the narrow views of `registry.store`) or the control-plane REST API.

`Registry` (and with it SQLAlchemy) is imported on first use, not with the package: roles
without a database (gateway, worker) import `registry.errors` or `registry.fingerprint` and
never load the database layer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from registry.errors import (
    AlreadyExists,
    ArtifactError,
    Conflict,
    InvalidInput,
    LineageError,
    NotFound,
    PermissionDenied,
    RegistryError,
    Unauthenticated,
)

if TYPE_CHECKING:
    from registry.service import Registry

__all__ = [
    "AlreadyExists",
    "ArtifactError",
    "Conflict",
    "InvalidInput",
    "LineageError",
    "NotFound",
    "PermissionDenied",
    "Registry",
    "RegistryError",
    "Unauthenticated",
]


def __getattr__(name: str) -> Any:
    if name == "Registry":
        from registry.service import Registry

        return Registry
    raise AttributeError(f"module 'registry' has no attribute {name!r}")
