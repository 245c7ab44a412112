"""Artifacts by content: the control plane uploads base models and adapters into the artifact
source before it publishes a placement that names them; workers fetch what their cache lacks
(``sidecar/src/artifacts.rs``) and load only what hashes to the placement's digest.

Sources (``ArtifactBucket``): the NATS object store ``artifacts`` (default, ``NatsBucket``) or an
S3-compatible bucket URL ``s3://bucket/prefix`` (``serving/artifact_source_s3.py``); both hold the
same objects, under the prefix in S3.

Layout of the bucket (format ``tree-v1``, docs/protocol.md): object ``file.<sha256>`` holds one
file's bytes (shared by every artifact with that file: adapters of one base share nothing big,
re-registered models share everything); object ``tree.<sha256>`` is the msgpack manifest of one
artifact (relative path, sha256 and size per file). The manifest is written last, so its
presence means every file it names is there.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Protocol

import msgpack
from nats.js.errors import NotFoundError
from nats.js.object_store import ObjectStore

from registry.fingerprint import file_sha256, tree_files, tree_sha256
from serving import protocol as p

log = logging.getLogger("taskfleet.artifacts")


class ArtifactMismatch(RuntimeError):
    """A folder no longer hashes to the digest the registry recorded for it."""


def manifest_object(sha256: str) -> str:
    return f"tree.{sha256}"


def file_object(sha256: str) -> str:
    return f"file.{sha256}"


def build_manifest(root: Path, expected_sha256: str) -> p.ArtifactManifest:
    """The manifest of ``root``, checked against the digest the registry holds for it."""
    files = tree_files(root)
    entries = [
        p.ManifestFile(
            path=path.relative_to(root).as_posix(),
            sha256=file_sha256(path),
            size=path.stat().st_size,
        )
        for path in files
    ]
    digest = tree_sha256(root)
    if digest.sha256 != expected_sha256:
        raise ArtifactMismatch(
            f"{root} hashes to {digest.sha256[:12]}, not to the registered "
            f"{expected_sha256[:12]}: the folder changed since it was registered"
        )
    return p.ArtifactManifest(sha256=digest.sha256, size=digest.size_bytes, files=entries)


class ArtifactBucket(Protocol):
    """Where artifacts are uploaded to and fetched from (workers read the same objects)."""

    def describe(self) -> str: ...

    async def exists(self, name: str) -> bool: ...

    async def put_file(self, name: str, path: Path) -> None: ...

    async def put_bytes(self, name: str, data: bytes) -> None: ...

    async def list_objects(self) -> dict[str, StoredObject]: ...

    async def get_bytes(self, name: str) -> bytes: ...

    async def delete(self, name: str) -> None: ...


@dataclass(frozen=True)
class StoredObject:
    size: int
    modified: datetime  # UTC


@dataclass(frozen=True)
class NatsBucket:
    """The NATS object store ``artifacts``: nothing else to run."""

    store: ObjectStore

    def describe(self) -> str:
        return "NATS object store artifacts"

    async def exists(self, name: str) -> bool:
        try:
            info = await self.store.get_info(name)
        except NotFoundError:
            return False
        return not info.deleted

    async def put_file(self, name: str, path: Path) -> None:
        with path.open("rb") as fh:
            await self.store.put(name, fh)

    async def put_bytes(self, name: str, data: bytes) -> None:
        await self.store.put(name, data)

    async def list_objects(self) -> dict[str, StoredObject]:
        try:
            infos = await self.store.list()
        except NotFoundError:  # an empty bucket
            return {}
        return {i.name: StoredObject(i.size or 0, _utc(i.mtime)) for i in infos if not i.deleted}

    async def get_bytes(self, name: str) -> bytes:
        return (await self.store.get(name)).data or b""

    async def delete(self, name: str) -> None:
        await self.store.delete(name)


def _utc(stamp: str | datetime | None) -> datetime:
    if isinstance(stamp, datetime):
        return stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)
    if not stamp:
        return datetime.now(UTC)  # unknown: as if new, so never collected early
    # NATS writes RFC 3339 with nanoseconds; Python parses microseconds.
    head, _, rest = stamp.rstrip("Z").partition(".")
    return datetime.fromisoformat(head + ("." + rest[:6] if rest else "")).replace(tzinfo=UTC)


@dataclass
class Uploaded:
    files_sent: int
    bytes_sent: int


async def upload(bucket: ArtifactBucket | ObjectStore, root: Path, sha256: str) -> Uploaded:
    """Put the folder ``root`` (registered with digest ``sha256``) into the bucket, unless its
    manifest is already there (a look-up of its info only: nothing is read); files the bucket
    already holds are not sent again."""
    store = NatsBucket(bucket) if isinstance(bucket, ObjectStore) else bucket
    if await store.exists(manifest_object(sha256)):
        return Uploaded(0, 0)
    manifest = await asyncio.to_thread(build_manifest, root, sha256)
    sent = sent_bytes = 0
    for entry in manifest.files:
        name = file_object(entry.sha256)
        if await store.exists(name):
            continue
        await store.put_file(name, root / entry.path)
        sent += 1
        sent_bytes += entry.size
    await store.put_bytes(manifest_object(sha256), p.pack(manifest))
    log.info(
        "uploaded artifact %s to %s: %d files, %d bytes sent",
        sha256[:12],
        store.describe(),
        sent,
        sent_bytes,
    )
    return Uploaded(sent, sent_bytes)


@dataclass
class Collected:
    """What ``collect_garbage`` removed (or, dry run, would remove)."""

    kept: list[str] = field(default_factory=list)  # referenced artifacts found in the bucket
    manifests: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    bytes_freed: int = 0
    too_young: int = 0  # unreferenced objects left for a later run (see ``min_age``)


async def collect_garbage(
    bucket: ArtifactBucket,
    referenced: set[str],
    *,
    min_age: timedelta = timedelta(minutes=10),
    dry_run: bool = False,
) -> Collected:
    """Remove the artifacts no candidate references, and every file no kept manifest names.

    Manifests go first, so a worker never finds a manifest whose files are gone. Objects newer
    than ``min_age`` stay: a control plane may be uploading a new artifact (files first, its
    manifest last) while this runs."""
    objects = await bucket.list_objects()
    cutoff = datetime.now(UTC) - min_age
    result = Collected()
    keep_files: set[str] = set()
    manifests = {n.removeprefix("tree."): n for n in objects if n.startswith("tree.")}
    for sha256, name in sorted(manifests.items()):
        if sha256 in referenced:
            result.kept.append(sha256)
            manifest = msgpack.unpackb(await bucket.get_bytes(name))
            keep_files.update(f["sha256"] for f in manifest["files"])
    for name, obj in sorted(objects.items()):
        kind, _, sha256 = name.partition(".")
        unreferenced = (kind == "tree" and sha256 not in referenced) or (
            kind == "file" and sha256 not in keep_files
        )
        if not unreferenced:
            continue
        if obj.modified > cutoff:
            result.too_young += 1
            continue
        (result.manifests if kind == "tree" else result.files).append(name)
        result.bytes_freed += obj.size
    if not dry_run:
        for name in result.manifests + result.files:
            await bucket.delete(name)
    log.info(
        "artifact gc on %s: kept %d artifacts, %s %d manifests and %d files (%d bytes)",
        bucket.describe(),
        len(result.kept),
        "would remove" if dry_run else "removed",
        len(result.manifests),
        len(result.files),
        result.bytes_freed,
    )
    return result
