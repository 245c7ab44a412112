"""Wire messages of taskfleet, protocol version 1 (docs/protocol.md), as typed dataclasses.

One module per concern, each the home of its names; this package re-exports them all, so
``from serving.protocol import PlacementValue`` reads the same wherever a message lives:

- ``codes``: the socket protocol's error codes, the one error shape, protocol exceptions;
- ``codec``: message <-> msgpack map (field order is key order; types checked on the way in);
- ``floats``: little-endian float32 bytes of embeddings, scores and probabilities;
- ``socket_ops``: sidecar <-> runtime requests and replies, one type per op;
- ``queue_messages``: queue payloads (gateway -> worker) and replies (worker -> gateway);
- ``bucket_values``: what KV ``placements`` and ``workers`` and the ``artifacts`` store hold;
- ``framing``: length-prefixed frames on the runtime's socket.

``sidecar/src/protocol/`` mirrors these modules in Rust; the golden vectors under
``tests/vectors/`` hold both to the same bytes.
"""

from __future__ import annotations

from serving.protocol.bucket_values import (
    ARTIFACT_FORMAT,
    Artifact,
    ArtifactManifest,
    ManifestFile,
    PlacementValue,
    RuntimeProfileValue,
    WorkerHeartbeat,
)
from serving.protocol.codec import (
    from_wire,
    pack,
    to_wire,
    unpack,
)
from serving.protocol.codes import (
    RETRYABLE_CODES,
    ErrorInfo,
    FrameError,
    ProtocolError,
    SocketErrorCode,
)
from serving.protocol.floats import (
    embeddings_from_bytes,
    embeddings_to_bytes,
    floats_from_bytes,
    floats_to_bytes,
)
from serving.protocol.framing import (
    DEFAULT_MAX_FRAME_BYTES,
    FRAME_HEADER,
    encode_frame,
    read_frame,
    write_frame,
)
from serving.protocol.queue_messages import (
    AnyReplyOk,
    ClassifyPayload,
    ClassifyReplyOk,
    PayloadRef,
    QueuePayload,
    ReplyError,
    ReplyOk,
    ScorePayload,
    ScoreReplyOk,
    TaskPayload,
    decode_reply_message,
    decode_task_payload,
    inline_data,
    offloaded_data,
)
from serving.protocol.socket_ops import (
    PROTOCOL_VERSION,
    REPLY_TYPES,
    REQUEST_TYPES,
    UNKNOWN_REQUEST_ID,
    ClassifyItem,
    ClassifyReply,
    ClassifyRequest,
    ClassifyResult,
    ErrorReply,
    HelloReply,
    HelloRequest,
    InferItem,
    InferReply,
    InferRequest,
    InferResult,
    LoadReply,
    LoadRequest,
    LoadSettings,
    ModelStats,
    ScoreItem,
    ScoreReply,
    ScoreRequest,
    ScoreResult,
    ShutdownReply,
    ShutdownRequest,
    SocketRequest,
    StatsReply,
    StatsRequest,
    TextKind,
    UnloadReply,
    UnloadRequest,
    decode_reply,
    decode_request,
)

__all__ = [
    "ARTIFACT_FORMAT",
    "DEFAULT_MAX_FRAME_BYTES",
    "FRAME_HEADER",
    "PROTOCOL_VERSION",
    "REPLY_TYPES",
    "REQUEST_TYPES",
    "RETRYABLE_CODES",
    "UNKNOWN_REQUEST_ID",
    "AnyReplyOk",
    "Artifact",
    "ArtifactManifest",
    "ClassifyItem",
    "ClassifyPayload",
    "ClassifyReply",
    "ClassifyReplyOk",
    "ClassifyRequest",
    "ClassifyResult",
    "ErrorInfo",
    "ErrorReply",
    "FrameError",
    "HelloReply",
    "HelloRequest",
    "InferItem",
    "InferReply",
    "InferRequest",
    "InferResult",
    "LoadReply",
    "LoadRequest",
    "LoadSettings",
    "ManifestFile",
    "ModelStats",
    "PayloadRef",
    "PlacementValue",
    "ProtocolError",
    "QueuePayload",
    "ReplyError",
    "ReplyOk",
    "RuntimeProfileValue",
    "ScoreItem",
    "ScorePayload",
    "ScoreReply",
    "ScoreReplyOk",
    "ScoreRequest",
    "ScoreResult",
    "ShutdownReply",
    "ShutdownRequest",
    "SocketErrorCode",
    "SocketRequest",
    "StatsReply",
    "StatsRequest",
    "TaskPayload",
    "TextKind",
    "UnloadReply",
    "UnloadRequest",
    "WorkerHeartbeat",
    "decode_reply",
    "decode_reply_message",
    "decode_request",
    "decode_task_payload",
    "embeddings_from_bytes",
    "embeddings_to_bytes",
    "encode_frame",
    "floats_from_bytes",
    "floats_to_bytes",
    "from_wire",
    "inline_data",
    "offloaded_data",
    "pack",
    "read_frame",
    "to_wire",
    "unpack",
    "write_frame",
]
