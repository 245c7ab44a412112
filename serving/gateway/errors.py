"""Gateway failures, each one HTTP status and one code of the public error shape.

Inside the gateway code raises these; ``httpapi.handlers`` turns them into the one public error
shape (``httpapi.errors``), adding ``Retry-After`` for the retryable 503s. What a caller sent is
quoted cut short (``httpapi.errors.shown``) and every message is bounded there too, so a refusal
never costs more than the request it refuses.
"""

from __future__ import annotations

from httpapi.errors import ApiError, ErrorCode
from serving.protocol import ErrorInfo


class GatewayError(ApiError):
    """A refusal or failure of the gateway; `httpapi` answers it in the one public shape."""

    code = ErrorCode.INTERNAL


class BadRequest(GatewayError):
    code = ErrorCode.BAD_REQUEST


class Unauthenticated(GatewayError):
    code = ErrorCode.UNAUTHENTICATED


class Forbidden(GatewayError):
    code = ErrorCode.FORBIDDEN


class UnknownTask(GatewayError):
    code = ErrorCode.NOT_FOUND


class PayloadTooLarge(GatewayError):
    code = ErrorCode.PAYLOAD_TOO_LARGE


class UnsupportedMediaType(GatewayError):
    code = ErrorCode.UNSUPPORTED_MEDIA_TYPE


class Unavailable(GatewayError):
    """No worker can take the task yet (not placed, no live worker, NATS down): retry later."""

    code = ErrorCode.UNAVAILABLE


class RateLimited(GatewayError):
    """The API key is over its request or token quota: retry after ``Retry-After``."""

    code = ErrorCode.RATE_LIMITED


class DeadlineExceeded(GatewayError):
    code = ErrorCode.DEADLINE_EXCEEDED


# Worker error codes (docs/protocol.md and the sidecar's settle paths) -> HTTP status.
_WORKER_STATUS = {
    "BAD_REQUEST": 400,
    "DEADLINE_EXCEEDED": 504,
}


def from_worker_error(error: ErrorInfo, *, retry_after_s: int) -> GatewayError:
    """A worker's error reply as a gateway error: its code and message travel unchanged."""
    status = 503 if error.retryable else _WORKER_STATUS.get(error.code, 502)
    return GatewayError(
        error.message,
        code=error.code,
        status=status,
        retryable=error.retryable,
        retry_after_s=retry_after_s if status == 503 else None,
    )
