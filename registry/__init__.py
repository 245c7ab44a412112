"""The registry: source of truth for tasks, models, adapters, candidates, evals and placements.

Only this package writes the database. Everything else calls `registry.Registry` (in-process)
or the control-plane REST API.
"""

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
