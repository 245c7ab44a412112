"""API-key tokens as every app reads them: the bearer header, the public prefix, the digest.

A token is ``tfk_<prefix>_<secret>``; only its sha256 is stored (registry) or published (KV
``directory``, for the gateways), so neither the database nor NATS holds a usable key.
"""

from __future__ import annotations

import hashlib
import hmac

TOKEN_PREFIX = "tfk"


def bearer_token(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header (the scheme is case-insensitive,
    RFC 9110), or None when the header is absent or names another scheme."""
    scheme, _, token = (authorization or "").strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def key_prefix(token: str) -> str | None:
    """The public prefix of a well-formed token (`tfk_<prefix>_<secret>`), else None."""
    parts = token.split("_", 2)
    return parts[1] if len(parts) == 3 and parts[0] == TOKEN_PREFIX and parts[1] else None


def token_hash(token: str) -> str:
    """The stored form of a token: its sha256, hex."""
    return hashlib.sha256(token.encode()).hexdigest()


def token_matches(token: str, stored_hash: str) -> bool:
    """Whether ``token`` is the one whose digest is ``stored_hash`` (constant time)."""
    return hmac.compare_digest(stored_hash, token_hash(token))
