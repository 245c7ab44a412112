//! Wire messages of protocol version 1 (docs/protocol.md), mirrored from `serving/protocol/`
//! module by module; every public name is re-exported here, so callers write
//! `crate::protocol::Placement` wherever a message lives:
//!
//! - `codes`: the one error shape and the codes the sidecar and its runtimes answer with;
//! - `codec`: message <-> msgpack map (field order is key order);
//! - `socket_ops`: sidecar <-> runtime requests and replies, one type per op;
//! - `queue_messages`: queue payloads (gateway -> worker) and replies (worker -> gateway);
//! - `bucket_values`: what KV `placements` and `workers` hold;
//! - `framing`: length-prefixed frames on the runtime's socket.
//!
//! The golden vectors in `tests/vectors/` hold both languages to the same bytes
//! (`vectors_test.rs`).

pub mod bucket_values;
pub mod codec;
pub mod codes;
pub mod framing;
pub mod queue_messages;
pub mod socket_ops;

pub use bucket_values::{ArtifactRef, Placement, RuntimeProfile, WorkerHeartbeat};
pub use codec::{decode, encode};
pub use codes::{Code, ErrorBody};
pub use framing::{frame, read_frame, MAX_FRAME_BYTES};
pub use queue_messages::{
    ClassifyPayload, ClassifyReplyOk, EmbeddingsData, Inputs, PayloadRef, QueuePayload, ReplyError,
    ReplyMessage, ReplyOk, ScorePayload, ScoreReplyOk, TaskPayload,
};
pub use socket_ops::{
    BareRequest, ClassifyItem, ClassifyReply, ClassifyRequest, Embeddings, ErrorReply, HelloReply,
    HelloRequest, InferItem, InferReply, InferRequest, LoadReply, LoadRequest, LoadSettings,
    MemoryReply, ModelStats, Probabilities, ReplyHead, Request, ScoreItem, ScoreReply,
    ScoreRequest, Scores, ShutdownReply, StatsReply, TextKind, UnloadReply, UnloadRequest,
    PROTOCOL_VERSION,
};

#[cfg(test)]
mod vectors_test;
