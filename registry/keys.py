"""API keys: stored as sha256 hashes, scoped to roles and (optionally) tasks."""

from __future__ import annotations

import dataclasses

from sqlalchemy import select

from httpapi.tokens import key_prefix, token_matches
from registry import entities as e
from registry.errors import AlreadyExists, NotFound, Unauthenticated
from registry.key_rules import MAX_TOKEN_CHARS, check_quota, new_key
from registry.models import ApiKeyRow, utcnow
from registry.transactions import Transactions


class ApiKeyRepository:
    def __init__(self, tx: Transactions) -> None:
        self.tx = tx

    def create_api_key(
        self,
        name: str,
        *,
        roles: list[str],
        tasks: list[str] | None = None,
        rate_limit_per_s: float | None = None,
        rate_burst: int | None = None,
        token_rate_per_s: float | None = None,
        token_burst: int | None = None,
    ) -> tuple[e.ApiKey, str]:
        """Create a key; the plain token is returned once and never stored."""
        key, token = new_key(
            name,
            roles=roles,
            tasks=tasks,
            rate_limit_per_s=rate_limit_per_s,
            rate_burst=rate_burst,
            token_rate_per_s=token_rate_per_s,
            token_burst=token_burst,
        )
        with self.tx.write() as s:
            if s.scalar(select(ApiKeyRow).where(ApiKeyRow.name == name)):
                raise AlreadyExists(f"api key {name!r} already exists")
            row = ApiKeyRow(**dataclasses.asdict(key))
            s.add(row)
            s.flush()
            self.tx.audit(s, "apikey.create", "api_key", name, {"roles": row.roles})
            return api_key_entity(row), token

    def authenticate(self, token: str) -> e.ApiKey:
        prefix = key_prefix(token)
        # A login form can carry what no header can (NUL, any length): refused before a query.
        if prefix is None or len(token) > MAX_TOKEN_CHARS or "\x00" in token:
            raise Unauthenticated("malformed API key")
        with self.tx.read() as s:
            row = s.scalar(select(ApiKeyRow).where(ApiKeyRow.prefix == prefix))
            if row is None or not token_matches(token, row.secret_hash):
                raise Unauthenticated("unknown API key")
            if row.revoked_at is not None:
                raise Unauthenticated(f"API key {row.name!r} was revoked")
            return api_key_entity(row)

    def revoke_api_key(self, name: str) -> None:
        with self.tx.write() as s:
            row = s.scalar(select(ApiKeyRow).where(ApiKeyRow.name == name))
            if row is None:
                raise NotFound(f"unknown api key {name!r}")
            row.revoked_at = utcnow()
            self.tx.audit(s, "apikey.revoke", "api_key", name)

    def set_api_key_quota(
        self,
        name: str,
        *,
        rate_limit_per_s: float | None,
        rate_burst: int | None = None,
        token_rate_per_s: float | None = None,
        token_burst: int | None = None,
    ) -> e.ApiKey:
        """Set a key's whole gateway quota: requests/s and estimated tokens/s, each with its
        burst; ``None`` for a rate removes that limit."""
        check_quota(rate_limit_per_s, rate_burst, "request")
        check_quota(token_rate_per_s, token_burst, "token")
        with self.tx.write() as s:
            row = s.scalar(select(ApiKeyRow).where(ApiKeyRow.name == name))
            if row is None:
                raise NotFound(f"unknown api key {name!r}")
            row.rate_limit_per_s = rate_limit_per_s
            row.rate_burst = rate_burst
            row.token_rate_per_s = token_rate_per_s
            row.token_burst = token_burst
            detail = {
                "rate_limit_per_s": rate_limit_per_s,
                "rate_burst": rate_burst,
                "token_rate_per_s": token_rate_per_s,
                "token_burst": token_burst,
            }
            self.tx.audit(s, "apikey.quota", "api_key", name, detail)
            return api_key_entity(row)

    def list_api_keys(self) -> list[e.ApiKey]:
        with self.tx.read() as s:
            return [
                api_key_entity(r) for r in s.scalars(select(ApiKeyRow).order_by(ApiKeyRow.name))
            ]

    def api_key_digests(self) -> list[e.ApiKeyDigest]:
        """Every key with the sha256 of its token: what gateways verify keys against (the
        control plane publishes it to NATS; the plain token is never stored anywhere)."""
        with self.tx.read() as s:
            rows = s.scalars(select(ApiKeyRow).order_by(ApiKeyRow.name))
            return [e.ApiKeyDigest(api_key_entity(r), r.secret_hash) for r in rows]


def api_key_entity(r: ApiKeyRow) -> e.ApiKey:
    return e.ApiKey(
        r.id,
        r.name,
        r.prefix,
        list(r.roles),
        list(r.tasks),
        r.created_at,
        r.revoked_at,
        r.rate_limit_per_s,
        r.rate_burst,
        r.token_rate_per_s,
        r.token_burst,
    )
