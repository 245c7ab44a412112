"""What makes a new API key: its checks and its token, without a database.

The registry's `ApiKeyRepository` (SQLAlchemy) and the CLI's `registry/key_writer.py`
(sqlite3, for `taskfleet key create` on a current SQLite registry) both create keys; both take
the rules and the token from here, so the two paths cannot accept different keys.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from httpapi.tokens import TOKEN_PREFIX, token_hash
from registry.errors import InvalidInput
from registry.kinds import check_name

ROLES = ("viewer", "promoter", "admin", "caller")
MAX_TOKEN_CHARS = 256  # tokens are ~45 characters
# Quotas are stored in a float and a 32-bit integer column; beyond these nobody is limited.
MAX_QUOTA_RATE = 1e9
MAX_QUOTA_BURST = 2**31 - 1


@dataclass(frozen=True)
class NewKey:
    """A checked key as it is stored (the token itself is returned once, never stored)."""

    name: str
    prefix: str
    secret_hash: str
    roles: list[str]
    tasks: list[str]
    rate_limit_per_s: float | None
    rate_burst: int | None
    token_rate_per_s: float | None
    token_burst: int | None


def new_key(
    name: str,
    *,
    roles: list[str],
    tasks: list[str] | None = None,
    rate_limit_per_s: float | None = None,
    rate_burst: int | None = None,
    token_rate_per_s: float | None = None,
    token_burst: int | None = None,
) -> tuple[NewKey, str]:
    """The stored form of a new key and its plain token; InvalidInput for what is refused."""
    check_name("api key", name)
    unknown = sorted(set(roles) - set(ROLES))
    if not roles or unknown:
        raise InvalidInput(f"roles must be some of {', '.join(ROLES)}; got {roles}")
    check_quota(rate_limit_per_s, rate_burst, "request")
    check_quota(token_rate_per_s, token_burst, "token")
    prefix = secrets.token_hex(4)
    token = f"{TOKEN_PREFIX}_{prefix}_{secrets.token_urlsafe(24)}"
    key = NewKey(
        name=name,
        prefix=prefix,
        secret_hash=token_hash(token),
        roles=sorted(set(roles)),
        tasks=sorted(set(tasks or [])),
        rate_limit_per_s=rate_limit_per_s,
        rate_burst=rate_burst,
        token_rate_per_s=token_rate_per_s,
        token_burst=token_burst,
    )
    return key, token


def check_quota(rate: float | None, burst: int | None, unit: str) -> None:
    """A rate above 0 (per second) and a burst of at least 1, both in ``unit``s."""
    if rate is not None and not 0 < rate <= MAX_QUOTA_RATE:  # NaN fails too
        raise InvalidInput(
            f"a {unit} rate limit must be above 0 and at most {MAX_QUOTA_RATE:g} {unit}s/s; "
            f"got {rate}"
        )
    if burst is not None and not 1 <= burst <= MAX_QUOTA_BURST:
        raise InvalidInput(
            f"a {unit} burst must be between 1 and {MAX_QUOTA_BURST} {unit}s; got {burst}"
        )
    if burst is not None and rate is None:
        raise InvalidInput(f"a {unit} burst needs a {unit} rate limit")
