"""Precise registry exceptions. Each is an `httpapi.errors.ApiError`, so the REST edge, the
dashboard and the gateway answer it in the one public shape, and the CLI prints its message."""

from __future__ import annotations

from httpapi.errors import ApiError, ErrorCode


class RegistryError(ApiError):
    """Base class: every registry failure a caller can expect."""

    code = ErrorCode.BAD_REQUEST


class NotFound(RegistryError):
    code = ErrorCode.NOT_FOUND


class AlreadyExists(RegistryError):
    code = ErrorCode.ALREADY_EXISTS


class InvalidInput(RegistryError):
    code = ErrorCode.BAD_REQUEST


class LineageError(InvalidInput):
    code = ErrorCode.LINEAGE_ERROR


class Conflict(RegistryError):
    """The state changed under the caller (stale form, concurrent writer)."""

    code = ErrorCode.CONFLICT


class Unauthenticated(RegistryError):
    """No key, or an unknown, malformed or revoked one: who is asking is not known."""

    code = ErrorCode.UNAUTHENTICATED


class PermissionDenied(RegistryError):
    """The caller is known, but its roles or task list do not allow this."""

    code = ErrorCode.FORBIDDEN


class ArtifactError(RegistryError):
    """A stored artifact is missing or does not match its sha256."""

    code = ErrorCode.ARTIFACT_ERROR


class DatabaseError(RegistryError):
    """The database URL is malformed or the database cannot be reached."""

    code = ErrorCode.DATABASE_ERROR


class NotImplementedHere(RegistryError):
    """This process was not given what the route needs (a control plane without a suite
    reader or a variant builder); another deployment of the same API answers it."""

    code = ErrorCode.NOT_IMPLEMENTED
