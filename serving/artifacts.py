"""Artifacts by content: the control plane uploads base models and adapters into the artifact
source before it publishes a placement that names them; workers fetch what their cache lacks
(``sidecar/src/artifacts.rs``) and load only what hashes to the placement's digest.

Sources (``ArtifactBucket``): the NATS object store ``artifacts`` (default, ``NatsBucket``) or an
S3-compatible bucket URL ``s3://bucket/prefix`` (``serving/artifacts_s3.py``); both hold the same
objects, under the prefix in S3.

Layout of the bucket (format ``tree-v1``, docs/protocol.md): object ``file.<sha256>`` holds one
file's bytes (shared by every artifact with that file: adapters of one base share nothing big,
re-registered models share everything); object ``tree.<sha256>`` is the msgpack manifest of one
artifact (relative path, sha256 and size per file). The manifest is written last, so its
presence means every file it names is there.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

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
