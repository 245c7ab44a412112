"""Precise registry exceptions; the CLI and the REST edge translate them to the public shape."""

from __future__ import annotations


class RegistryError(Exception):
    """Base class: every registry failure a caller can expect."""

    code = "REGISTRY_ERROR"
    http_status = 400
    retryable = False


class NotFound(RegistryError):
    code = "NOT_FOUND"
    http_status = 404


class AlreadyExists(RegistryError):
    code = "ALREADY_EXISTS"
    http_status = 409


class InvalidInput(RegistryError):
    code = "INVALID_INPUT"
    http_status = 400


class LineageError(InvalidInput):
    code = "LINEAGE_ERROR"


class Conflict(RegistryError):
    """The state changed under the caller (stale form, concurrent writer)."""

    code = "CONFLICT"
    http_status = 409
    retryable = True


class PermissionDenied(RegistryError):
    code = "FORBIDDEN"
    http_status = 403


class ArtifactError(RegistryError):
    """A stored artifact is missing or does not match its sha256."""

    code = "ARTIFACT_ERROR"
    http_status = 500


class DatabaseError(RegistryError):
    """The database URL is malformed or the database cannot be reached."""

    code = "DATABASE_ERROR"
    http_status = 503
    retryable = True
