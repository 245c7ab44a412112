"""The caller's optional request headers, read strictly: a plain decimal integer within its
range, else 400 (docs/protocol.md "Public API").

``int()`` alone is not enough at an edge: it takes ``" +1_0 "`` and other digits than ASCII,
and a 401-digit timeout parsed fine and then overflowed a float into a 500. So a value is at most
``MAX_DIGITS`` ASCII digits, with a sign only where negatives mean something, inside the range
named per header; what the gateway echoes of a bad value is cut short.
"""

from __future__ import annotations

from dataclasses import dataclass

from starlette.datastructures import Headers

from httpapi.errors import shown
from serving.gateway.errors import BadRequest

HEADER_TIMEOUT = "X-Taskfleet-Timeout-Ms"
HEADER_PRIORITY = "X-Taskfleet-Priority"
HEADER_MIN_EPOCH = "X-Taskfleet-Min-Epoch"

# int64 holds every value below (the sidecar reads these as 64-bit integers).
MAX_DIGITS = 18
# A deadline above the gateway's cap is cut to the cap; above this it is not a deadline.
MAX_TIMEOUT_MS = 2**31 - 1
PRIORITY_RANGE = (-(2**31), 2**31 - 1)
MAX_EPOCH = 2**63 - 1


@dataclass(frozen=True)
class CallHeaders:
    timeout_s: float
    priority: int
    min_epoch: int  # the newest placement epoch the caller has had a reply from (0: none)


def call_headers(
    headers: Headers, *, default_timeout_s: float, max_timeout_s: float
) -> CallHeaders:
    """The call's deadline, priority and minimum epoch; 400 for a value out of its rule."""
    millis = header_int(headers, HEADER_TIMEOUT, 1, MAX_TIMEOUT_MS)
    return CallHeaders(
        timeout_s=default_timeout_s if millis is None else min(millis / 1000, max_timeout_s),
        priority=header_int(headers, HEADER_PRIORITY, *PRIORITY_RANGE) or 0,
        min_epoch=header_int(headers, HEADER_MIN_EPOCH, 0, MAX_EPOCH) or 0,
    )


def header_int(headers: Headers, name: str, lowest: int, highest: int) -> int | None:
    """The header's integer value within [lowest, highest], None when absent; else 400."""
    raw = headers.get(name)
    if raw is None:
        return None
    text = raw.strip()
    digits = text[1:] if text[:1] == "-" and lowest < 0 else text
    if not (digits.isascii() and digits.isdigit() and len(digits) <= MAX_DIGITS):
        raise BadRequest(
            f"{name} must be a decimal integer from {lowest} to {highest}; got {shown(raw)}"
        )
    value = int(text)
    if not lowest <= value <= highest:
        raise BadRequest(f"{name} must be from {lowest} to {highest}; got {value}")
    return value
