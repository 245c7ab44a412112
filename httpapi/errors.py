"""The public error shape and the one list of error codes, for every app.

Every error answer of every taskfleet HTTP app — control-plane REST, dashboard (when the client
asks for JSON), gateway — is ``{"error": {"code": "UPPER_SNAKE", "message": str, "retryable":
bool}}``. The codes are the members of :class:`ErrorCode`; each one's HTTP status, default
retryability and meaning are declared in ``contract/shared.toml`` (the rules Python and the
sidecar share), and ``docs/protocol.md`` lists the same table (a test keeps them equal).

This module imports no taskfleet package but ``contract`` and no web framework, so the registry,
the gateway, the clients and the CLI can all import it without importing one another.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from contract import ERROR_CODES


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
    EVIDENCE_STALE = "EVIDENCE_STALE"
    TASK_NOT_SERVABLE = "TASK_NOT_SERVABLE"
    UNAUTHENTICATED = "UNAUTHENTICATED"
    FORBIDDEN = "FORBIDDEN"
    CSRF_REFUSED = "CSRF_REFUSED"
    NOT_FOUND = "NOT_FOUND"
    UNKNOWN_REQUEST = "UNKNOWN_REQUEST"
    METHOD_NOT_ALLOWED = "METHOD_NOT_ALLOWED"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    FEEDBACK_EXISTS = "FEEDBACK_EXISTS"
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
    EPOCH_BEHIND = "EPOCH_BEHIND"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    RUNTIME_UNAVAILABLE = "RUNTIME_UNAVAILABLE"
    SHADOW_SHED = "SHADOW_SHED"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"

    @property
    def status(self) -> int:
        return CODES[self].status

    @property
    def retryable(self) -> bool:
        return CODES[self].retryable


def _declared_codes() -> dict[ErrorCode, CodeInfo]:
    """Status, retryability and meaning of every code, from contract/shared.toml; the enum
    above names them for type checkers, and must name exactly the declared ones."""
    named = set(ErrorCode.__members__)
    if named != set(ERROR_CODES):
        raise RuntimeError(
            "httpapi.errors.ErrorCode and contract/shared.toml [error_codes] differ: "
            f"only in the enum {sorted(named - set(ERROR_CODES))}, "
            f"only in the file {sorted(set(ERROR_CODES) - named)}"
        )
    return {
        ErrorCode(code): CodeInfo(rule.status, rule.retryable, rule.meaning)
        for code, rule in ERROR_CODES.items()
    }


CODES: dict[ErrorCode, CodeInfo] = _declared_codes()

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
