"""The public error shape and the one list of error codes, for every app.

Every error answer of every taskfleet HTTP app — control-plane REST, dashboard (when the client
asks for JSON), gateway — is ``{"error": {"code": "UPPER_SNAKE", "message": str, "retryable":
bool}}``. The codes are the members of :class:`ErrorCode`, each with the HTTP status it answers
with; ``docs/protocol.md`` lists the same table (a test keeps them equal).

This module imports no taskfleet package and no web framework, so the registry, the gateway,
the clients and the CLI can all import it without importing one another.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any


@dataclass(frozen=True)
class CodeInfo:
    status: int
    retryable: bool
    meaning: str


class ErrorCode(StrEnum):
    # 4xx: the request, the caller or the state it met
    BAD_REQUEST = "BAD_REQUEST"
    LINEAGE_ERROR = "LINEAGE_ERROR"
    PROMOTION_RULE_NOT_MET = "PROMOTION_RULE_NOT_MET"
    PROMOTION_REQUIRED = "PROMOTION_REQUIRED"
    TASK_NOT_SERVABLE = "TASK_NOT_SERVABLE"
    UNAUTHENTICATED = "UNAUTHENTICATED"
    FORBIDDEN = "FORBIDDEN"
    CSRF_REFUSED = "CSRF_REFUSED"
    NOT_FOUND = "NOT_FOUND"
    METHOD_NOT_ALLOWED = "METHOD_NOT_ALLOWED"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    CONFLICT = "CONFLICT"
    PAYLOAD_TOO_LARGE = "PAYLOAD_TOO_LARGE"
    UNSUPPORTED_MEDIA_TYPE = "UNSUPPORTED_MEDIA_TYPE"
    RATE_LIMITED = "RATE_LIMITED"
    # 5xx: ours or a dependency's
    INTERNAL = "INTERNAL"
    NOT_IMPLEMENTED = "NOT_IMPLEMENTED"
    ARTIFACT_ERROR = "ARTIFACT_ERROR"
    UNKNOWN_OP = "UNKNOWN_OP"
    LOAD_FAILED = "LOAD_FAILED"
    INFER_FAILED = "INFER_FAILED"
    REPLY_UNDELIVERABLE = "REPLY_UNDELIVERABLE"
    BAD_REPLY = "BAD_REPLY"
    UNAVAILABLE = "UNAVAILABLE"
    NOT_PLACED = "NOT_PLACED"
    NO_WORKER = "NO_WORKER"
    QUEUE_UNAVAILABLE = "QUEUE_UNAVAILABLE"
    NOT_READY = "NOT_READY"
    DATABASE_ERROR = "DATABASE_ERROR"
    MODEL_NOT_LOADED = "MODEL_NOT_LOADED"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    RUNTIME_UNAVAILABLE = "RUNTIME_UNAVAILABLE"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"

    @property
    def status(self) -> int:
        return CODES[self].status

    @property
    def retryable(self) -> bool:
        return CODES[self].retryable


_C = ErrorCode
CODES: dict[ErrorCode, CodeInfo] = {
    _C.BAD_REQUEST: CodeInfo(400, False, "the request is malformed or a value is not allowed"),
    _C.LINEAGE_ERROR: CodeInfo(400, False, "an adapter's lineage would be wrong (cycle, base)"),
    _C.PROMOTION_RULE_NOT_MET: CodeInfo(
        400, False, "the challenger does not beat the champion by the rule; admins may override"
    ),
    _C.PROMOTION_REQUIRED: CodeInfo(
        400, False, "the served candidate changes only by promote, rollback or admin override"
    ),
    _C.TASK_NOT_SERVABLE: CodeInfo(400, False, "the task's name cannot be a NATS subject token"),
    _C.UNAUTHENTICATED: CodeInfo(401, False, "no API key, or an unknown, malformed or revoked one"),
    _C.FORBIDDEN: CodeInfo(403, False, "the key's roles or task list do not allow this"),
    _C.CSRF_REFUSED: CodeInfo(403, False, "a dashboard form without this session's token"),
    _C.NOT_FOUND: CodeInfo(404, False, "no such route, task, model, adapter or candidate"),
    _C.METHOD_NOT_ALLOWED: CodeInfo(405, False, "the route exists, the HTTP method does not"),
    _C.ALREADY_EXISTS: CodeInfo(409, False, "a record with that name already exists"),
    _C.CONFLICT: CodeInfo(409, True, "the state changed under the caller (a stale form)"),
    _C.PAYLOAD_TOO_LARGE: CodeInfo(
        413, False, "the body, one of its texts or its cost is above a limit"
    ),
    _C.UNSUPPORTED_MEDIA_TYPE: CodeInfo(415, False, "the body's Content-Type is not accepted"),
    _C.RATE_LIMITED: CodeInfo(429, True, "too many attempts; wait for Retry-After seconds"),
    _C.INTERNAL: CodeInfo(500, False, "a bug or an unforeseen failure; the server log has it"),
    _C.NOT_IMPLEMENTED: CodeInfo(501, False, "this server was not set up for the route"),
    _C.ARTIFACT_ERROR: CodeInfo(500, False, "a stored artifact is missing or corrupted"),
    _C.UNKNOWN_OP: CodeInfo(502, False, "a worker's runtime did not know the operation"),
    _C.LOAD_FAILED: CodeInfo(502, False, "a worker could not load the model"),
    _C.INFER_FAILED: CodeInfo(502, False, "a worker's model failed on the batch"),
    _C.REPLY_UNDELIVERABLE: CodeInfo(
        502, False, "a worker computed the answer but could not send it (it was dead-lettered)"
    ),
    _C.BAD_REPLY: CodeInfo(502, False, "a worker's reply did not match its request"),
    _C.UNAVAILABLE: CodeInfo(503, True, "no worker can take the task yet"),
    _C.NOT_PLACED: CodeInfo(503, True, "the task has no placement yet (no champion)"),
    _C.NO_WORKER: CodeInfo(503, True, "no live worker serves the task"),
    _C.QUEUE_UNAVAILABLE: CodeInfo(503, True, "the gateway is not connected to NATS"),
    _C.NOT_READY: CodeInfo(
        503,
        True,
        "not connected to NATS, or the control plane's directory (or a placement epoch the "
        "caller has seen) not yet received",
    ),
    _C.DATABASE_ERROR: CodeInfo(503, True, "the registry database cannot be reached"),
    _C.MODEL_NOT_LOADED: CodeInfo(503, True, "the worker is still loading the model"),
    _C.OUT_OF_MEMORY: CodeInfo(503, True, "the worker ran out of memory for the batch"),
    _C.RUNTIME_UNAVAILABLE: CodeInfo(503, True, "the worker's runtime is down or restarting"),
    _C.DEADLINE_EXCEEDED: CodeInfo(504, False, "no answer before the request's deadline"),
}

_BY_VALUE: dict[str, CodeInfo] = {code.value: info for code, info in CODES.items()}

# Statuses the web framework answers by itself, as codes of the one list.
_STATUS_CODES = {
    400: ErrorCode.BAD_REQUEST,
    401: ErrorCode.UNAUTHENTICATED,
    403: ErrorCode.FORBIDDEN,
    404: ErrorCode.NOT_FOUND,
    405: ErrorCode.METHOD_NOT_ALLOWED,
    409: ErrorCode.CONFLICT,
    413: ErrorCode.PAYLOAD_TOO_LARGE,
    415: ErrorCode.UNSUPPORTED_MEDIA_TYPE,
    429: ErrorCode.RATE_LIMITED,
    503: ErrorCode.UNAVAILABLE,
}


def code_for_status(status: int) -> ErrorCode:
    """The code for a bare HTTP status (a framework answer): the specific one, else the class."""
    if status in _STATUS_CODES:
        return _STATUS_CODES[status]
    return ErrorCode.BAD_REQUEST if 400 <= status < 500 else ErrorCode.INTERNAL


def error_body(code: str, message: str, retryable: bool = False) -> dict[str, Any]:
    """The one public error shape."""
    return {"error": {"code": str(code), "message": message, "retryable": retryable}}


# Messages often quote what the caller sent (a name, a path, a key); an answer must not grow
# with it (an unknown-field error once echoed a 2.6 MB key), so longer ones are cut.
MAX_MESSAGE_CHARS = 2000
# How much of one value a message quotes (``shown``).
SHOWN_CHARS = 60


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """``repr(value)`` as a message quotes what a caller sent: cut to ``limit`` characters,
    saying how many more there were."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


class ApiError(Exception):
    """A failure that the edge answers in the public shape: a code, a status, a message.

    Subclasses set ``code`` (and so the status); a single instance may override each. A
    message above ``MAX_MESSAGE_CHARS`` is cut there, saying how much was left out.
    """

    code: str = ErrorCode.INTERNAL
    status: int = 0  # 0: the status of the code
    retryable: bool | None = None  # None: the code's default

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        status: int | None = None,
        retryable: bool | None = None,
        retry_after_s: int | None = None,
    ) -> None:
        if len(message) > MAX_MESSAGE_CHARS:
            left_out = len(message) - MAX_MESSAGE_CHARS
            message = f"{message[:MAX_MESSAGE_CHARS]}... ({left_out} more characters left out)"
        super().__init__(message)
        self.message = message
        self.code = str(code or type(self).code)
        known = _BY_VALUE.get(self.code)
        self.status = status or type(self).status or (known.status if known else 500)
        default = type(self).retryable
        if default is None:
            default = known.retryable if known else False
        self.retryable = default if retryable is None else retryable
        self.retry_after_s = retry_after_s

    def body(self) -> dict[str, Any]:
        return error_body(self.code, self.message, bool(self.retryable))
