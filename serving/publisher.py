"""Registry placements -> NATS KV ``placements``: the value workers read, and the outbox publisher.

Promotion writes a new placement epoch in the registry (one transaction). The publisher here
then pushes every unpublished epoch into KV ``placements`` and marks it published. It never
writes an epoch over a newer one (two publishers, or an operator's put, may race), and it keeps
retrying with backoff while NATS or the database is down, so nothing promoted is left behind.
Each pass also keeps KV ``directory`` (tasks and API-key digests, ``serving/directory.py``)
equal to the registry, so gateways need no database.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, replace
from pathlib import Path

from nats.aio.client import Client as NATS
from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore

from registry import RegistryError
from registry import entities as e
from registry.store import CatalogReader, PublisherStore
from serving import protocol as p
from serving.artifact_source import ArtifactBucket, ArtifactMismatch, upload
from serving.artifact_source_s3 import bucket_for
from serving.connection import NatsTarget, connect_forever
from serving.directory import desired_entries, publish_directory
from serving.nats_layout import check_task_name, ensure_layout, shadow_key
from serving.runtime.heads import HeadError, has_head, read_spec

log = logging.getLogger("taskfleet.publisher")
# Longest one artifact's upload may take before the pass is retried.
UPLOAD_TIMEOUT_S = 600.0


class PlacementError(RuntimeError):
    """A placement cannot be turned into a KV value (no model, weights gone, bad task name)."""


def model_key(base: e.BaseModel, adapter: e.Adapter | None) -> str:
    """A stable key for the loaded weights: names for people, sha256 prefixes for identity.

    Two placements share a loaded model exactly when they name the same weights, whatever
    the task; a re-registered model with other weights gets another key.
    """
    key = f"{base.name}-{base.sha256[:12]}"
    if adapter is not None:
        key += f"+{adapter.name}-{adapter.sha256[:12]}"
    return key


def memory_estimate(base: e.BaseModel, adapter: e.Adapter | None) -> int:
    """Bytes the model is expected to take once loaded.

    float32 weights take in memory what they take on disk, so the file sizes are a fair
    first estimate; the runtime reports the true figure after loading.
    """
    return base.size_bytes + (adapter.size_bytes if adapter else 0)


def profile_value(profile: e.RuntimeProfile) -> p.RuntimeProfileValue:
    """A recorded runtime profile as placements carry it."""
    settings = profile.settings
    return p.RuntimeProfileValue(
        id=profile.id,
        machine_class=profile.machine_class,
        max_batch_tokens=settings.max_batch_tokens,
        max_batch_wait_ms=settings.max_batch_wait_ms,
        intra_op_threads=settings.intra_op_threads,
        runtimes=settings.runtimes,
        max_padding=settings.max_padding,
        engine=settings.engine,
    )


@dataclass(frozen=True)
class Folders:
    """Where the control plane reads the weights it uploads for a placement."""

    base: tuple[Path, str]
    adapter: tuple[Path, str] | None


def placement_value(
    registry: CatalogReader, placement: e.Placement
) -> tuple[p.PlacementValue, Folders]:
    """The KV value of docs/protocol.md for a registry placement, and the folders behind
    its artifacts (uploaded before the value is published)."""
    try:
        check_task_name(placement.task)
    except ValueError as exc:
        raise PlacementError(str(exc)) from None
    candidate = registry.get_candidate(placement.task, placement.candidate)
    if candidate.base_model is None:
        raise PlacementError(
            f"candidate {candidate.name!r} of task {placement.task!r} has no model to serve"
        )
    base = registry.get_model(candidate.base_model)
    adapter = registry.get_adapter(candidate.adapter) if candidate.adapter else None
    try:
        base_path = registry.model_path(base.name)
        adapter_path = registry.adapter_path(adapter.name) if adapter else None
    except RegistryError as exc:
        raise PlacementError(str(exc)) from None
    # A task head reads inputs with the limit it was trained with, as its evaluation did.
    max_seq_length = base.max_seq_length
    if adapter_path is not None and has_head(adapter_path):
        try:
            max_seq_length = read_spec(adapter_path).max_seq_length or max_seq_length
        except HeadError as exc:
            raise PlacementError(str(exc)) from None
    value = p.PlacementValue(
        task=placement.task,
        epoch=placement.epoch,
        candidate=placement.candidate,
        model_key=model_key(base, adapter),
        base=p.Artifact(sha256=base.sha256, size=base.size_bytes),
        adapter=p.Artifact(sha256=adapter.sha256, size=adapter.size_bytes) if adapter else None,
        query_prefix=base.query_prefix,
        passage_prefix=base.passage_prefix,
        max_seq_length=max_seq_length,
        pinned=placement.pinned,
        replicas=placement.replicas,
        memory_bytes=memory_estimate(base, adapter),
        runtime=placement.runtime,
        profiles=[profile_value(profile) for profile in registry.profiles_for(base.sha256)],
    )
    folders = Folders(
        base=(base_path, base.sha256),
        adapter=(adapter_path, adapter.sha256) if adapter and adapter_path else None,
    )
    return value, folders


async def upload_artifacts(store: ArtifactBucket | ObjectStore, folders: Folders) -> None:
    """Every artifact of a placement into the object store, before the placement is published:
    a worker that reads the placement finds what it names."""
    for folder, sha256 in filter(None, (folders.base, folders.adapter)):
        try:
            # Bounded: a stuck object store must not hold the outbox (the loop retries).
            await asyncio.wait_for(upload(store, folder, sha256), UPLOAD_TIMEOUT_S)
        except (ArtifactMismatch, OSError) as exc:
            raise PlacementError(str(exc)) from None


def decode_placement(data: bytes) -> p.PlacementValue:
    return p.from_wire(p.PlacementValue, p.unpack(data))


async def put_placement(kv: KeyValue, value: p.PlacementValue) -> bool:
    """Put ``value`` under its key (the task; ``<task>.shadow`` for a shadow) unless the KV
    holds that epoch or a newer one.

    Returns True when the KV now holds ``value.epoch`` or newer. Compare-and-set on the key's
    revision, so a concurrent writer of a newer epoch always wins.
    """
    data = p.pack(value)
    key = shadow_key(value.task) if value.shadow else value.task
    while True:
        try:
            entry = await kv.get(key)
        except KeyNotFoundError:
            entry = None
        if entry is not None and entry.value:
            try:
                held = decode_placement(entry.value).epoch
            except p.ProtocolError:
                held = -1  # garbage under the key: ours replaces it
            if held >= value.epoch:
                return True
        try:
            if entry is None:
                await kv.create(key, data)
            else:
                await kv.update(key, data, last=entry.revision)
            return True
        except KeyWrongLastSequenceError:
            continue  # someone wrote in between: look again


def shadow_placement(registry: CatalogReader, shadow: e.Shadow) -> tuple[p.PlacementValue, Folders]:
    """The KV value of a started shadow: placed like a champion (artifacts by sha256, its
    runtime), pinned so its model is loaded before copies arrive, marked shadow."""
    placement = e.Placement(
        id=shadow.id,
        task=shadow.task,
        candidate=shadow.candidate,
        epoch=shadow.epoch,
        pinned=True,
        replicas=1,
        created_at=shadow.created_at,
        published_at=shadow.published_at,
        runtime=shadow.runtime,
    )
    value, folders = placement_value(registry, placement)
    return replace(value, shadow=True), folders


async def publish_shadows(
    registry: PublisherStore, kv: KeyValue, artifacts: ArtifactBucket | ObjectStore
) -> PublishResult:
    """One pass over the shadow outbox: a start is uploaded and put under ``<task>.shadow``, a
    stop deletes that key; each is then marked published."""
    result = PublishResult([], [])
    for shadow in await asyncio.to_thread(registry.unpublished_shadows):
        if shadow.active:
            try:
                value, folders = await asyncio.to_thread(shadow_placement, registry, shadow)
                await upload_artifacts(artifacts, folders)
            except (PlacementError, RegistryError) as exc:
                result.failed.append((shadow_key(shadow.task), shadow.epoch, str(exc)))
                continue
            await put_placement(kv, value)
        else:
            with contextlib.suppress(KeyNotFoundError):
                await kv.delete(shadow_key(shadow.task))
        await asyncio.to_thread(registry.mark_shadow_published, shadow.task, shadow.epoch)
        result.published.append((shadow_key(shadow.task), shadow.epoch))
    return result


@dataclass
class PublishResult:
    published: list[tuple[str, int]]
    failed: list[tuple[str, int, str]]


async def publish_pending(
    registry: PublisherStore, kv: KeyValue, artifacts: ArtifactBucket | ObjectStore
) -> PublishResult:
    """One pass over the outbox (shadows first): upload each placement's artifacts, then
    publish it. NATS errors propagate (the caller backs off and retries); a placement that
    can never be published is reported and retried on the next pass."""
    result = await publish_shadows(registry, kv, artifacts)
    pending = await asyncio.to_thread(registry.unpublished_placements)
    for placement in pending:
        try:
            value, folders = await asyncio.to_thread(placement_value, registry, placement)
            await upload_artifacts(artifacts, folders)
        except (PlacementError, RegistryError) as exc:
            result.failed.append((placement.task, placement.epoch, str(exc)))
            continue
        await put_placement(kv, value)
        await asyncio.to_thread(registry.mark_published, placement.task, placement.epoch)
        result.published.append((placement.task, placement.epoch))
    return result


async def publish_everything(
    registry: PublisherStore,
    js: JetStreamContext,
    *,
    prune: bool = True,
    artifact_source: str | None = None,
) -> PublishResult:
    """One full pass of what a leading control plane publishes: the placement outbox and the
    whole directory (read back from NATS and corrected; see ``publish_directory``)."""
    layout = await ensure_layout(js)
    bucket = bucket_for(artifact_source, layout.artifacts)
    result = await publish_pending(registry, layout.placements, bucket)
    desired = await asyncio.to_thread(desired_entries, registry)
    await publish_directory(js, layout.directory, desired, None, prune=prune)
    return result


class PlacementPublisher:
    """The outbox loop: polls the registry, publishes placements (and keeps KV `directory`
    equal to the registry's tasks and keys), backs off while anything is down.

    A write committed by this process's registry (a promotion through the REST API or the
    dashboard of ``taskfleet serve`` or ``up``) starts the next pass at once; writes from other
    processes (the CLI) are seen at the next poll."""

    def __init__(
        self,
        registry: PublisherStore,
        nats_url: NatsTarget,
        *,
        poll_interval_s: float = 0.5,
        max_backoff_s: float = 15.0,
        directory: bool = True,
        artifact_source: str | None = None,
    ) -> None:
        self.registry = registry
        # None: the NATS object store `artifacts`; else an s3://bucket/prefix URL.
        self.artifact_source = artifact_source
        self.nats_url = nats_url
        # Also keep KV `directory` (tasks, API-key digests) equal to the registry's.
        self.directory = directory
        self.poll_interval_s = poll_interval_s
        self.max_backoff_s = max_backoff_s
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()  # a commit, or stop: the next pass starts now
        self._reported_failures: set[tuple[str, int]] = set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    async def run(self, nc: NATS | None = None) -> None:
        """Until :meth:`stop`: connect (retrying), then publish every poll interval. On a
        connection ``nc`` given by the caller (the leader's), which it leaves open."""
        own = nc is None
        if nc is None:
            nc = await connect_forever(self.nats_url, self._stop, name="taskfleet-publisher")
        if nc is None:
            return
        backoff = self.poll_interval_s
        loop = asyncio.get_running_loop()

        def committed() -> None:  # in the writer's thread: hand the word to this loop
            with contextlib.suppress(RuntimeError):  # the loop has closed
                loop.call_soon_threadsafe(self._wake.set)

        unsubscribe = self.registry.subscribe_commits(committed)
        try:
            while not self._stop.is_set():
                try:
                    js = nc.jetstream()
                    layout = await ensure_layout(js)
                    bucket = bucket_for(self.artifact_source, layout.artifacts)
                    known: dict[str, bytes] | None = None  # read afresh after every failure
                    while not self._stop.is_set():
                        self._wake.clear()  # a commit from here on gets a pass of its own
                        self._log(await publish_pending(self.registry, layout.placements, bucket))
                        if self.directory:
                            desired = await asyncio.to_thread(desired_entries, self.registry)
                            known = await publish_directory(js, layout.directory, desired, known)
                        backoff = self.poll_interval_s
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(self._wake.wait(), self.poll_interval_s)
                except (NatsError, OSError, TimeoutError, RegistryError) as exc:
                    log.warning("publisher: %s; retrying in %.1fs", _describe(exc), backoff)
                    await self._sleep(backoff)
                    backoff = min(backoff * 2, self.max_backoff_s)
        finally:
            unsubscribe()
            if own:
                await nc.close()

    def _log(self, result: PublishResult) -> None:
        for task, epoch in result.published:
            log.info("published placement %s@%d", task, epoch)
        for task, epoch, why in result.failed:
            if (task, epoch) not in self._reported_failures:
                self._reported_failures.add((task, epoch))
                log.error("cannot publish placement %s@%d: %s", task, epoch, why)

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
