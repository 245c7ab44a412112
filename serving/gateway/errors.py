"""Gateway failures, each one HTTP status and one code of the public error shape.

Inside the gateway code raises these; the app's one exception handler turns them into
``registry.api.error_body`` JSON, adding ``Retry-After`` for the retryable 503s.
"""

from __future__ import annotations

from serving.protocol import ErrorInfo


class GatewayError(Exception):
    status = 500
    code = "INTERNAL"
    retryable = False

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        status: int | None = None,
        retryable: bool | None = None,
        retry_after_s: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or type(self).code
        self.status = status or type(self).status
        self.retryable = type(self).retryable if retryable is None else retryable
        self.retry_after_s = retry_after_s


class BadRequest(GatewayError):
    status = 400
    code = "BAD_REQUEST"


class Unauthenticated(GatewayError):
    status = 401
    code = "UNAUTHENTICATED"


class Forbidden(GatewayError):
    status = 403
    code = "FORBIDDEN"


class UnknownTask(GatewayError):
    status = 404
    code = "UNKNOWN_TASK"


class PayloadTooLarge(GatewayError):
    status = 413
    code = "PAYLOAD_TOO_LARGE"


class UnsupportedMediaType(GatewayError):
    status = 415
    code = "UNSUPPORTED_MEDIA_TYPE"


class Unavailable(GatewayError):
    """No worker can take the task yet (not placed, no live worker, NATS down): retry later."""

    status = 503
    code = "UNAVAILABLE"
    retryable = True


class DeadlineExceeded(GatewayError):
    status = 504
    code = "DEADLINE_EXCEEDED"


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
