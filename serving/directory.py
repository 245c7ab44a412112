"""KV ``directory``: what gateways need from the registry, published so they never read it.

The leading control plane (``serving/control.py``, through the publisher in
``serving/publisher.py``) writes, for every task ``task.<name>`` (its kind, per-text
limits, sample rate and retention) and for every API key ``key.<prefix>`` (name, sha256 of
the token, roles, task list, quotas, revoked or not: never a usable key), then ``meta`` last.
A gateway watches the bucket (``serving/gateway/view.py``): it authenticates from these records,
tells an unknown task (404) from an unplaced one (503), refuses texts above a task's limits
(413), samples the task's share of requests, and keeps serving when the database is away. A
revoked key is published as revoked (no hash) within one publisher pass (0.5 s by default).

The bucket is made to hold exactly the registry's current set: the first pass of a term reads
what the bucket holds and deletes what the registry no longer has, later passes write only what
changed since. Writing is idempotent, so two control planes leading for a moment do no harm.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgpack
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from registry.limits import (
    DEFAULT_MAX_DOCUMENT_CHARS,
    DEFAULT_MAX_QUERY_CHARS,
    DEFAULT_MAX_TEXT_CHARS,
    TEXT_LIMIT_DEFAULTS,
)
from serving import nats_layout

if TYPE_CHECKING:  # the control plane's side only: gateways import this module without them
    from registry import entities as e
    from registry.store import PublisherStore

log = logging.getLogger("taskfleet.directory")

META_KEY = "meta"
# A task whose record names no retention keeps sampled inputs this long (7 days).
DEFAULT_RETENTION_S = 7 * 86400.0
KEY_PREFIX = "key."
TASK_PREFIX = "task."


class DirectoryError(ValueError):
    """A directory value that does not decode (written by hand, or by a future version)."""


@dataclass(frozen=True)
class KeyRecord:
    """One API key as gateways see it: enough to verify and scope it, never the key itself."""

    name: str
    prefix: str
    secret_hash: str | None  # None once revoked
    roles: tuple[str, ...]
    tasks: tuple[str, ...]  # empty: every task
    rate_limit_per_s: float | None = None
    rate_burst: int | None = None
    revoked: bool = False
    # Estimated model tokens per second and at once (serving/gateway/quotas.py); None: no limit.
    token_rate_per_s: float | None = None
    token_burst: int | None = None

    def pack(self) -> bytes:
        return msgpack.packb(
            {
                "name": self.name,
                "prefix": self.prefix,
                "hash": self.secret_hash,
                "roles": list(self.roles),
                "tasks": list(self.tasks),
                "rate": self.rate_limit_per_s,
                "burst": self.rate_burst,
                "token_rate": self.token_rate_per_s,
                "token_burst": self.token_burst,
                "revoked": self.revoked,
            }
        )

    @classmethod
    def unpack(cls, data: bytes) -> KeyRecord:
        try:
            obj = msgpack.unpackb(data, raw=False)
            # Absent from the records of control planes older than token quotas.
            token_rate, token_burst = obj.get("token_rate"), obj.get("token_burst")
            record = cls(
                name=_str(obj["name"]),
                prefix=_str(obj["prefix"]),
                secret_hash=None if obj["hash"] is None else _str(obj["hash"]),
                roles=tuple(_str(r) for r in obj["roles"]),
                tasks=tuple(_str(t) for t in obj["tasks"]),
                rate_limit_per_s=None if obj["rate"] is None else float(obj["rate"]),
                rate_burst=None if obj["burst"] is None else int(obj["burst"]),
                revoked=bool(obj["revoked"]),
                token_rate_per_s=None if token_rate is None else float(token_rate),
                token_burst=None if token_burst is None else int(token_burst),
            )
        except (ValueError, TypeError, KeyError, AttributeError, msgpack.UnpackException) as exc:
            raise DirectoryError(f"not a key record: {exc}") from None
        if record.secret_hash is None and not record.revoked:
            raise DirectoryError(f"key record {record.name!r} has no hash")
        return record


@dataclass(frozen=True)
class TaskRecord:
    """One task as gateways see it: its kind and what one request may send it."""

    name: str
    kind: str  # retrieval, rerank, classification, ...
    max_text_chars: int = DEFAULT_MAX_TEXT_CHARS
    max_query_chars: int = DEFAULT_MAX_QUERY_CHARS
    max_document_chars: int = DEFAULT_MAX_DOCUMENT_CHARS
    # Production (registry/production_settings.py): the share of requests sampled, and how
    # long a sampled request's inputs are kept (its messages' TTL in stream SAMPLES).
    sample_rate: float = 0.0
    retention_s: float = DEFAULT_RETENTION_S

    def pack(self) -> bytes:
        return msgpack.packb(
            {
                "name": self.name,
                "kind": self.kind,
                "max_text_chars": self.max_text_chars,
                "max_query_chars": self.max_query_chars,
                "max_document_chars": self.max_document_chars,
                "sample_rate": self.sample_rate,
                "retention_s": self.retention_s,
            }
        )

    @classmethod
    def unpack(cls, data: bytes) -> TaskRecord:
        """A ``task.<name>`` value; limits a control plane older than them did not publish
        are the defaults (``registry/limits.py``)."""
        try:
            obj = msgpack.unpackb(data, raw=False)
            limits = {
                setting: _positive_int(obj.get(setting, default))
                for setting, default in TEXT_LIMIT_DEFAULTS.items()
            }
            # Absent from the records of control planes older than sampling: none sampled.
            rate = float(obj.get("sample_rate", 0.0))
            retention = float(obj.get("retention_s", DEFAULT_RETENTION_S))
            if not (0.0 <= rate <= 1.0 and retention > 0):
                raise ValueError(f"sample rate {rate} or retention {retention}s out of range")
            return cls(
                name=_str(obj["name"]),
                kind=_str(obj["kind"]),
                sample_rate=rate,
                retention_s=retention,
                **limits,
            )
        except (ValueError, TypeError, KeyError, AttributeError, msgpack.UnpackException) as exc:
            raise DirectoryError(f"not a task record: {exc}") from None


def _str(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value


def _positive_int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TypeError(f"expected a positive integer, got {value!r}")
    return value


def key_record(digest: e.ApiKeyDigest) -> KeyRecord:
    key = digest.key
    revoked = key.revoked_at is not None
    return KeyRecord(
        name=key.name,
        prefix=key.prefix,
        secret_hash=None if revoked else digest.secret_hash,
        roles=tuple(key.roles),
        tasks=tuple(key.tasks),
        rate_limit_per_s=key.rate_limit_per_s,
        rate_burst=key.rate_burst,
        revoked=revoked,
        token_rate_per_s=key.token_rate_per_s,
        token_burst=key.token_burst,
    )


def task_record(task: e.Task, production: e.ProductionSettings | None = None) -> TaskRecord:
    """A task's record; without production settings it samples nothing."""
    return TaskRecord(
        name=task.name,
        kind=task.kind,
        max_text_chars=task.max_text_chars,
        max_query_chars=task.max_query_chars,
        max_document_chars=task.max_document_chars,
        sample_rate=production.sample_rate if production else 0.0,
        retention_s=production.retention_days * 86400.0 if production else DEFAULT_RETENTION_S,
    )


def desired_entries(registry: PublisherStore) -> dict[str, bytes]:
    """What the bucket should hold now, from the registry (three reads; blocking: run it in a
    thread)."""
    production = {p.task: p for p in registry.list_production_settings()}
    entries = {
        TASK_PREFIX + t.name: task_record(t, production.get(t.name)).pack()
        for t in registry.list_tasks()
    }
    for digest in registry.api_key_digests():
        entries[KEY_PREFIX + digest.key.prefix] = key_record(digest).pack()
    return entries


async def publish_directory(
    js: JetStreamContext,
    kv: KeyValue,
    desired: dict[str, bytes],
    known: dict[str, bytes] | None,
    *,
    prune: bool = True,
) -> dict[str, bytes]:
    """Make the bucket hold ``desired`` (then ``meta``); returns what it holds now.

    ``known`` is what the bucket held after the previous pass (None: read it from NATS, as the
    first pass of a term does). ``meta`` is written only when something changed, or on a first
    pass: a gateway that has seen ``meta`` has seen every entry written before it. ``prune``
    deletes entries the registry does not have (off: only add and update).
    """
    first = known is None
    if known is None:
        known = await nats_layout.kv_values(js, nats_layout.DIRECTORY_BUCKET)
        known.pop(META_KEY, None)
    changed = 0
    for key, value in desired.items():
        if known.get(key) != value:
            await kv.put(key, value)
            changed += 1
    for key in sorted(set(known) - set(desired)) if prune else []:
        await kv.delete(key)
        changed += 1
    if changed or first:
        meta = {"published_ms": int(time.time() * 1000), "entries": len(desired)}
        await kv.put(META_KEY, msgpack.packb(meta))
        if changed:
            log.info("directory: %d entries written or deleted", changed)
    return dict(desired) if prune else {**known, **desired}
