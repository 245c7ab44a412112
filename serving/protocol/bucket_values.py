"""What the KV buckets and object stores hold: a placement (KV ``placements``), a worker's
heartbeat (KV ``workers``), and an artifact's manifest (object store ``artifacts``, format
``tree-v1``). docs/protocol.md "KV placements", "Object store artifacts", "KV workers".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ARTIFACT_FORMAT = "tree-v1"


@dataclass(frozen=True, kw_only=True)
class Artifact:
    """A folder of files named by content: ``sha256`` is the registry's fingerprint (sha256
    over "relative path NUL file sha256 LF" of every file, in path order), ``size`` the sum of
    the file sizes, ``format`` how it travels (``tree-v1``: a manifest plus one object per file
    in the object store ``artifacts``)."""

    sha256: str
    size: int
    format: str = ARTIFACT_FORMAT


@dataclass(frozen=True, kw_only=True)
class ManifestFile:
    path: str
    sha256: str
    size: int


@dataclass(frozen=True, kw_only=True)
class ArtifactManifest:
    """Object ``tree.<sha256>`` of bucket ``artifacts``: the files of one artifact, in path
    order; each file's bytes are object ``file.<file sha256>`` (shared by every artifact that
    holds the same file)."""

    v: Literal[1] = 1
    format: str = ARTIFACT_FORMAT
    sha256: str
    size: int
    files: list[ManifestFile]


@dataclass(frozen=True, kw_only=True)
class RuntimeProfileValue:
    """A runtime profile as placements carry it (registry/profiles.py): the settings tuned for
    the placement's base model on one machine class. A worker applies the one whose class is
    its own and no other; None leaves the worker's default."""

    id: int
    machine_class: str
    max_batch_tokens: int | None = None
    max_batch_wait_ms: int | None = None
    intra_op_threads: int | None = None
    runtimes: int | None = None
    max_padding: float | None = None
    engine: str | None = None


@dataclass(frozen=True, kw_only=True)
class PlacementValue:
    v: Literal[1] = 1
    task: str
    epoch: int
    candidate: str
    model_key: str
    # The weights by content: a worker fetches what its cache lacks from the object store
    # `artifacts` and loads only what hashes to these digests (serving/artifact_source.py).
    base: Artifact
    adapter: Artifact | None
    query_prefix: str
    passage_prefix: str
    max_seq_length: int | None
    pinned: bool
    replicas: int
    memory_bytes: int
    # The runtime kind that serves it ("torch", "candle", "http"); only workers of that kind
    # run the task.
    runtime: str = "torch"
    # Every runtime profile of the base model, one per machine class (none: the defaults).
    profiles: list[RuntimeProfileValue] | None = None


@dataclass(frozen=True, kw_only=True)
class WorkerHeartbeat:
    v: Literal[1] = 1
    worker_id: str
    host: str
    ts_ms: int
    loaded: list[str]
    memory_used: int
    memory_budget: int
    queue_depth: dict[str, int]
    runtimes: list[str]
    epochs: dict[str, int]
    # When the worker process started (unix ms); a new value under the same id is a restart.
    started_ms: int | None = None
    # The runtime kind this worker serves (its pool), fixed for the process; replicas are
    # chosen among the live workers of the placement's kind (sidecar/src/members.rs).
    runtime_kind: str | None = None
    # Task -> id of the runtime profile the worker applies to it (tasks without one: absent).
    profiles: dict[str, int] | None = None
