"""The JetStream objects of the fleet (ARCHITECTURE.md "NATS layout"), created idempotently.

Every process that needs a stream, consumer or bucket calls :func:`ensure_layout` (or
:func:`ensure_task_consumer`) instead of assuming another one ran first: the gateway, the
fleet tools and `taskfleet up` all do. An object that already exists is left exactly as it is,
so two processes starting at once, or a Rust sidecar that created the object first with the
same settings (``sidecar/src/nats.rs``), never fight over its configuration.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    ConsumerInfo,
    KeyValueConfig,
    ObjectStoreConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import BadRequestError, BucketNotFoundError, NotFoundError
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore

TASKS_STREAM = "TASKS"
TASKS_SUBJECT_PREFIX = "tasks."
DLQ_STREAM = "DLQ"
DLQ_SUBJECT_PREFIX = "dlq."
PLACEMENTS_BUCKET = "placements"
WORKERS_BUCKET = "workers"
PAYLOADS_BUCKET = "payloads"
# Base models and adapters by content (serving/artifacts.py): kept until deleted, no TTL.
ARTIFACTS_BUCKET = "artifacts"
# The control planes' leader lock (serving/leader.py) and what the leader publishes for gateways
# (serving/directory.py): tasks and API-key digests, so no gateway reads the database.
LEADER_BUCKET = "leader"
DIRECTORY_BUCKET = "directory"
CONSUMER_PREFIX = "task_"
# Core-NATS subjects replies are published to: `_tf.reply.<gateway id>.<request id>`.
REPLY_SUBJECT_PREFIX = "_tf.reply."

# Same values as sidecar/src/nats.rs, so whichever side creates an object first, it is the same.
TASKS_MAX_AGE_S = 24 * 3600.0
# Retries by the gateway or a client within this window carry the same Nats-Msg-Id and are
# dropped by the server instead of running twice.
DUPLICATE_WINDOW_S = 120.0
DLQ_MAX_AGE_S = 14 * 24 * 3600.0
PAYLOADS_TTL_S = 24 * 3600.0
PLACEMENTS_HISTORY = 5
# A worker beating every few seconds drops out of the fleet this long after its last beat.
WORKERS_TTL_S = 15.0
# How long a message stays with a worker that stopped acknowledging it. Workers send progress
# acks (in_progress) for every message they hold three times per ack_wait, however long the batch,
# so this fires only when the worker is gone: a crashed worker's messages are redelivered within
# ~10 s (the default deadline is 30 s), about when its heartbeat expires too.
ACK_WAIT_S = 10.0
# Bounded so a poison message ends in the DLQ instead of cycling forever.
MAX_DELIVER = 5
# Copies of every stream and bucket on a cluster of this many nodes or more.
REPLICAS = 3
# A leader that stops renewing its lock (killed, cut off from NATS) loses it this long after its
# last renewal; a standby control plane then takes over. The bucket's TTL, fixed at creation.
LEADER_TTL_S = 10.0

# Task names become subject tokens and consumer names (same rule as the sidecar).
_TASK_NAME_RE = re.compile(r"[A-Za-z0-9_-]+")


class InvalidTaskName(ValueError):
    """A task name that cannot be a NATS subject token or consumer name."""


@dataclass(frozen=True)
class Layout:
    """Handles to the buckets, returned by :func:`ensure_layout`."""

    placements: KeyValue
    workers: KeyValue
    payloads: ObjectStore
    artifacts: ObjectStore
    leader: KeyValue
    directory: KeyValue


async def kv_values(js: JetStreamContext, bucket: str) -> dict[str, bytes]:
    """Every live key of a KV bucket with its current value, read from the bucket's stream.

    nats-py's ``watchall`` marks "no more current values" when the consumer has nothing pending
    on the server, which can happen before its callback has queued the values the server already
    pushed: a snapshot read with it can come back short (a live worker looked absent). The
    stream's subject list and one last-message read per subject has no such race.
    """
    stream = f"KV_{bucket}"
    prefix = f"$KV.{bucket}."
    info = await js.stream_info(stream, subjects_filter=f"{prefix}>")
    values: dict[str, bytes] = {}
    for subject in sorted(info.state.subjects or {}):
        try:
            message = await js.get_last_msg(stream, subject)
        except NotFoundError:  # expired (TTL) or purged between the two reads
            continue
        if (message.headers or {}).get("KV-Operation") in ("DEL", "PURGE"):
            continue
        values[subject[len(prefix) :]] = message.data or b""
    return values


def check_task_name(task: str) -> str:
    if not _TASK_NAME_RE.fullmatch(task):
        raise InvalidTaskName(
            f"task name {task!r} cannot be served: on the fleet a task name may hold only "
            "letters, digits, '-' and '_'"
        )
    return task


def task_subject(task: str) -> str:
    return TASKS_SUBJECT_PREFIX + check_task_name(task)


def consumer_name(task: str) -> str:
    return CONSUMER_PREFIX + check_task_name(task)


def dlq_subject(task: str) -> str:
    return DLQ_SUBJECT_PREFIX + check_task_name(task)


def tasks_stream_config(replicas: int = 1) -> StreamConfig:
    return StreamConfig(
        num_replicas=replicas,
        name=TASKS_STREAM,
        subjects=[TASKS_SUBJECT_PREFIX + ">"],
        retention=RetentionPolicy.WORK_QUEUE,
        storage=StorageType.FILE,
        max_age=TASKS_MAX_AGE_S,
        duplicate_window=DUPLICATE_WINDOW_S,
    )


def dlq_stream_config(replicas: int = 1) -> StreamConfig:
    return StreamConfig(
        num_replicas=replicas,
        name=DLQ_STREAM,
        subjects=[DLQ_SUBJECT_PREFIX + ">"],
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        max_age=DLQ_MAX_AGE_S,
    )


def task_consumer_config(task: str) -> ConsumerConfig:
    name = consumer_name(task)
    return ConsumerConfig(
        name=name,
        durable_name=name,
        filter_subject=task_subject(task),
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=ACK_WAIT_S,
        max_deliver=MAX_DELIVER,
    )


async def _ensure_stream(js: JetStreamContext, config: StreamConfig) -> None:
    assert config.name is not None
    try:
        await js.stream_info(config.name)
        return
    except NotFoundError:
        pass
    try:
        await js.add_stream(config)
    except BadRequestError:
        # Another process created it between our look-up and our create: that one stands.
        await js.stream_info(config.name)


async def _ensure_kv(js: JetStreamContext, config: KeyValueConfig) -> KeyValue:
    try:
        return await js.key_value(config.bucket)
    except BucketNotFoundError:
        pass
    try:
        return await js.create_key_value(config)
    except BadRequestError:
        return await js.key_value(config.bucket)


async def _ensure_object_store(
    js: JetStreamContext, bucket: str, replicas: int, ttl: float | None
) -> ObjectStore:
    try:
        return await js.object_store(bucket)
    except BucketNotFoundError:
        pass
    config = ObjectStoreConfig(ttl=ttl, storage=StorageType.FILE, replicas=replicas)
    try:
        return await js.create_object_store(bucket, config)
    except BadRequestError:
        return await js.object_store(bucket)


async def ensure_task_consumer(js: JetStreamContext, task: str) -> ConsumerInfo:
    """The durable pull consumer ``task_<task>`` on ``TASKS``, created when missing."""
    name = consumer_name(task)
    try:
        return await js.consumer_info(TASKS_STREAM, name)
    except NotFoundError:
        pass
    try:
        return await js.add_consumer(TASKS_STREAM, task_consumer_config(task))
    except BadRequestError:
        return await js.consumer_info(TASKS_STREAM, name)


def cluster_size(js: JetStreamContext) -> int:
    """Nodes of the NATS cluster ``js`` is connected to, from the server's INFO (its
    ``connect_urls`` name every node's client address, its own included); 1 when alone."""
    info = getattr(getattr(js, "_nc", None), "_server_info", None) or {}
    return max(1, len(set(info.get("connect_urls") or [])))


def layout_replicas(js: JetStreamContext) -> int:
    """R3 on a cluster of 3 nodes or more, else R1 (a cluster of 2 cannot keep a quorum)."""
    return REPLICAS if cluster_size(js) >= REPLICAS else 1


async def ensure_layout(
    js: JetStreamContext,
    tasks: list[str] | tuple[str, ...] = (),
    *,
    replicas: int | None = None,
) -> Layout:
    """Create what is missing of the layout (streams, buckets, one consumer per task).

    New objects get ``replicas`` copies (default :func:`layout_replicas`: 3 on a cluster of
    3+ nodes); existing ones are left as they are (consumers follow their stream).
    """
    r = layout_replicas(js) if replicas is None else replicas
    await _ensure_stream(js, tasks_stream_config(r))
    await _ensure_stream(js, dlq_stream_config(r))

    def kv(bucket: str, history: int, ttl: float | None = None) -> KeyValueConfig:
        return KeyValueConfig(
            bucket=bucket, history=history, ttl=ttl, storage=StorageType.FILE, replicas=r
        )

    placements = await _ensure_kv(js, kv(PLACEMENTS_BUCKET, PLACEMENTS_HISTORY))
    workers = await _ensure_kv(js, kv(WORKERS_BUCKET, 1, WORKERS_TTL_S))
    payloads = await _ensure_object_store(js, PAYLOADS_BUCKET, r, PAYLOADS_TTL_S)
    artifacts = await _ensure_object_store(js, ARTIFACTS_BUCKET, r, None)
    leader = await _ensure_kv(js, kv(LEADER_BUCKET, 1, LEADER_TTL_S))
    directory = await _ensure_kv(js, kv(DIRECTORY_BUCKET, 1))
    for task in tasks:
        await ensure_task_consumer(js, task)
    return Layout(
        placements=placements,
        workers=workers,
        payloads=payloads,
        artifacts=artifacts,
        leader=leader,
        directory=directory,
    )
