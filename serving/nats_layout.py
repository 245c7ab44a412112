"""The JetStream objects of the fleet (ARCHITECTURE.md "NATS layout"), created idempotently.

Their names and settings are declared in ``contract/shared.toml``; this module builds the
nats-py configurations from it (``sidecar/src/nats.rs`` builds the sidecar's from the same
file). Every process that needs a stream or bucket calls :func:`ensure_layout` instead of
assuming another one ran first: the gateway, the fleet tools and `taskfleet up` all do. An
object that already exists is left exactly as it is, so two processes starting at once, or a
Rust sidecar that created the object first, never fight over its configuration.

The per-task consumer is the workers' alone: a sidecar creates it when it starts serving the
task, with its ``--ack-wait-ms`` and ``--max-deliver`` (the declared values by default). The
gateway only reads it (:func:`check_task_consumer`); a request queued before any worker started
waits in the stream, and the consumer the first worker creates delivers it.
"""

from __future__ import annotations

import logging
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

from contract import NATS, TASK_NAME, BucketRule, ObjectStoreRule, StreamRule
from httpapi.errors import shown

log = logging.getLogger(__name__)


def _required(value: float | None, key: str) -> float:
    if value is None:
        raise RuntimeError(f"contract/shared.toml must declare {key}")
    return value


# Every name and setting below is read from contract/shared.toml: these are its Python
# spellings, never values of their own.
_TASKS = NATS.streams.tasks
_DLQ = NATS.streams.dlq
_KV = NATS.kv
TASKS_STREAM = _TASKS.name
TASKS_SUBJECT_PREFIX = _TASKS.subject_prefix
DLQ_STREAM = _DLQ.name
DLQ_SUBJECT_PREFIX = _DLQ.subject_prefix
PLACEMENTS_BUCKET = _KV.placements.bucket
WORKERS_BUCKET = _KV.workers.bucket
PAYLOADS_BUCKET = NATS.object_stores.payloads.bucket
# Base models and adapters by content (serving/artifact_source.py): kept until deleted, no TTL.
ARTIFACTS_BUCKET = NATS.object_stores.artifacts.bucket
# The control planes' leader lock (serving/leader.py) and what the leader publishes for gateways
# (serving/directory.py): tasks and API-key digests, so no gateway reads the database.
LEADER_BUCKET = _KV.leader.bucket
DIRECTORY_BUCKET = _KV.directory.bucket
CONSUMER_PREFIX = NATS.task_consumer.name_prefix
# Core-NATS subjects replies are published to: `_tf.reply.<gateway id>.<request id>`.
REPLY_SUBJECT_PREFIX = NATS.reply_subject_prefix

TASKS_MAX_AGE_S = _TASKS.max_age_s
# Retries by the gateway or a client within this window carry the same Nats-Msg-Id and are
# dropped by the server instead of running twice.
DUPLICATE_WINDOW_S = _TASKS.duplicate_window_s
DLQ_MAX_AGE_S = _DLQ.max_age_s
PAYLOADS_TTL_S = NATS.object_stores.payloads.ttl_s
PLACEMENTS_HISTORY = _KV.placements.history
# A worker beating every few seconds drops out of the fleet this long after its last beat.
WORKERS_TTL_S = _required(_KV.workers.ttl_s, "nats.kv.workers.ttl_s")
# How long a message stays with a worker that stopped acknowledging it (redelivered after).
ACK_WAIT_S = NATS.task_consumer.ack_wait_s
# Bounded so a poison message ends in the DLQ instead of cycling forever.
MAX_DELIVER = NATS.task_consumer.max_deliver
# Copies of every stream and bucket on a cluster of this many nodes or more.
REPLICAS = NATS.replicas
# A leader that stops renewing its lock (killed, cut off from NATS) loses it this long after its
# last renewal; a standby control plane then takes over. The bucket's TTL, fixed at creation.
LEADER_TTL_S = _required(_KV.leader.ttl_s, "nats.kv.leader.ttl_s")


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
    # The registry's rule (registry/kinds.py reads the same declaration).
    if not TASK_NAME.allows(task):
        raise InvalidTaskName(
            f"task name {shown(task)} cannot be served: a task name holds {TASK_NAME.describe()}"
        )
    return task


def task_subject(task: str) -> str:
    return TASKS_SUBJECT_PREFIX + check_task_name(task)


def consumer_name(task: str) -> str:
    return CONSUMER_PREFIX + check_task_name(task)


def dlq_subject(task: str) -> str:
    return DLQ_SUBJECT_PREFIX + check_task_name(task)


def stream_config(rule: StreamRule, replicas: int = 1) -> StreamConfig:
    """The stream ``rule`` declares, with ``replicas`` copies."""
    return StreamConfig(
        num_replicas=replicas,
        name=rule.name,
        subjects=[rule.subject_prefix + ">"],
        retention=RetentionPolicy(rule.retention),
        storage=StorageType(rule.storage),
        max_age=rule.max_age_s,
        # 0: the server's default (as a stream created without one gets).
        duplicate_window=rule.duplicate_window_s or 0.0,
    )


def tasks_stream_config(replicas: int = 1) -> StreamConfig:
    return stream_config(_TASKS, replicas)


def dlq_stream_config(replicas: int = 1) -> StreamConfig:
    return stream_config(_DLQ, replicas)


def kv_config(rule: BucketRule, replicas: int = 1) -> KeyValueConfig:
    return KeyValueConfig(
        bucket=rule.bucket,
        history=rule.history,
        ttl=rule.ttl_s,
        storage=StorageType.FILE,
        replicas=replicas,
    )


def task_consumer_config(task: str) -> ConsumerConfig:
    name = consumer_name(task)
    rule = NATS.task_consumer
    return ConsumerConfig(
        name=name,
        durable_name=name,
        filter_subject=task_subject(task),
        ack_policy=AckPolicy(rule.ack_policy),
        ack_wait=rule.ack_wait_s,
        max_deliver=rule.max_deliver,
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
    js: JetStreamContext, rule: ObjectStoreRule, replicas: int
) -> ObjectStore:
    try:
        return await js.object_store(rule.bucket)
    except BucketNotFoundError:
        pass
    config = ObjectStoreConfig(ttl=rule.ttl_s, storage=StorageType.FILE, replicas=replicas)
    try:
        return await js.create_object_store(rule.bucket, config)
    except BadRequestError:
        return await js.object_store(rule.bucket)


async def check_task_consumer(js: JetStreamContext, task: str) -> ConsumerInfo | None:
    """The durable consumer ``task_<task>`` as a worker created it, or None while no worker
    has served the task yet. One that would never deliver the task's requests as the protocol
    says (another subject, no explicit acks) is logged; its ack wait and deliveries are the
    workers' choice."""
    try:
        info = await js.consumer_info(TASKS_STREAM, consumer_name(task))
    except NotFoundError:
        return None
    wanted = task_consumer_config(task)
    found = info.config
    differences = [
        f"{key} {getattr(found, key)!r}, not {getattr(wanted, key)!r}"
        for key in ("filter_subject", "ack_policy")
        if getattr(found, key) != getattr(wanted, key)
    ]
    if differences:
        log.warning(
            "consumer %s does not follow contract/shared.toml: %s",
            wanted.durable_name,
            "; ".join(differences),
        )
    return info


async def ensure_task_consumer(js: JetStreamContext, task: str) -> ConsumerInfo:
    """The durable pull consumer ``task_<task>`` on ``TASKS``, created when missing, as a
    worker creates it: for the Python stand-ins of workers in tests (the gateway never does)."""
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
    """Create what is missing of the layout (streams, buckets; one consumer per task in
    ``tasks``, for a caller that plays a worker).

    New objects get ``replicas`` copies (default :func:`layout_replicas`: 3 on a cluster of
    3+ nodes); existing ones are left as they are (consumers follow their stream).
    """
    r = layout_replicas(js) if replicas is None else replicas
    await _ensure_stream(js, tasks_stream_config(r))
    await _ensure_stream(js, dlq_stream_config(r))

    placements = await _ensure_kv(js, kv_config(_KV.placements, r))
    workers = await _ensure_kv(js, kv_config(_KV.workers, r))
    payloads = await _ensure_object_store(js, NATS.object_stores.payloads, r)
    artifacts = await _ensure_object_store(js, NATS.object_stores.artifacts, r)
    leader = await _ensure_kv(js, kv_config(_KV.leader, r))
    directory = await _ensure_kv(js, kv_config(_KV.directory, r))
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
