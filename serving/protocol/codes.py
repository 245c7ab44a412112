"""The error side of the wire: the socket protocol's codes, the one error shape every failed
reply carries, and the exceptions a message that breaks the protocol raises.

The codes, and whether each is retryable by default, are declared in ``contract/shared.toml``
(``socket = true`` marks the ones a runtime answers with); :class:`SocketErrorCode` names them
for type checkers and must name exactly those.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from contract import ERROR_CODES, SOCKET_CODES


class SocketErrorCode(StrEnum):
    """What a runtime answers a failed socket request with (docs/protocol.md)."""

    BAD_REQUEST = "BAD_REQUEST"
    UNKNOWN_OP = "UNKNOWN_OP"
    MODEL_NOT_LOADED = "MODEL_NOT_LOADED"
    LOAD_FAILED = "LOAD_FAILED"
    INFER_FAILED = "INFER_FAILED"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"


if set(SocketErrorCode.__members__) != SOCKET_CODES:
    raise RuntimeError(
        "SocketErrorCode and the codes contract/shared.toml marks `socket = true` differ: "
        f"{sorted(set(SocketErrorCode.__members__) ^ SOCKET_CODES)}"
    )
RETRYABLE_CODES = frozenset(c for c in SocketErrorCode if ERROR_CODES[c.value].retryable)


class ProtocolError(ValueError):
    """A message does not follow docs/protocol.md.

    ``code`` is the error code to answer with; ``request_id`` is the id of the offending request
    when it could be read, so the peer can match the error reply to its request.
    """

    def __init__(
        self,
        message: str,
        *,
        code: SocketErrorCode = SocketErrorCode.BAD_REQUEST,
        request_id: int | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.request_id = request_id


class FrameError(ProtocolError):
    """The byte stream itself is broken (truncated or oversized frame): drop the connection."""


@dataclass(frozen=True, kw_only=True)
class ErrorInfo:
    """The one error shape: ``{"code", "message", "retryable"}``."""

    code: str
    message: str
    retryable: bool

    @classmethod
    def of(cls, code: SocketErrorCode, message: str) -> ErrorInfo:
        """A socket code's error, retryable as the contract declares it."""
        return cls(code=code.value, message=message, retryable=code in RETRYABLE_CODES)
