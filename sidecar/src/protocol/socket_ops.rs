//! Sidecar <-> runtime requests and replies on the socket (docs/protocol.md, "Socket
//! protocol"), one type per op; serving/protocol/socket_ops.py.

use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;

use super::codes::ErrorBody;

pub const PROTOCOL_VERSION: u32 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TextKind {
    Query,
    Passage,
}

/// A socket request; `op` is written first, as the tag of this enum.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum Request {
    Hello(HelloRequest),
    Load(LoadRequest),
    Unload(UnloadRequest),
    Infer(InferRequest),
    Score(ScoreRequest),
    Classify(ClassifyRequest),
    Stats(BareRequest),
    Shutdown(BareRequest),
}

impl Request {
    pub fn id(&self) -> u64 {
        match self {
            Request::Hello(r) => r.id,
            Request::Load(r) => r.id,
            Request::Unload(r) => r.id,
            Request::Infer(r) => r.id,
            Request::Score(r) => r.id,
            Request::Classify(r) => r.id,
            Request::Stats(r) | Request::Shutdown(r) => r.id,
        }
    }

    pub fn op(&self) -> &'static str {
        match self {
            Request::Hello(_) => "hello",
            Request::Load(_) => "load",
            Request::Unload(_) => "unload",
            Request::Infer(_) => "infer",
            Request::Score(_) => "score",
            Request::Classify(_) => "classify",
            Request::Stats(_) => "stats",
            Request::Shutdown(_) => "shutdown",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HelloRequest {
    pub id: u64,
    pub protocol: u32,
    pub client: String,
}

/// What the runtime needs to load one model key (a base plus an optional adapter).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoadRequest {
    pub id: u64,
    pub model_key: String,
    pub base_path: String,
    pub adapter_path: Option<String>,
    pub query_prefix: String,
    pub passage_prefix: String,
    pub max_seq_length: Option<u32>,
    /// How to run the model (a runtime profile's runtime knobs); absent: the runtime's defaults.
    #[serde(default)]
    pub settings: Option<LoadSettings>,
}

/// A runtime profile's runtime knobs, as the `load` request carries them; `None`: the
/// runtime's default.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LoadSettings {
    pub intra_op_threads: Option<u32>,
    /// Batches of the model the runtime runs at once.
    pub runtimes: Option<u32>,
    pub max_padding: Option<f64>,
    /// "torch" or "onnx" (the same fp32 graph through ONNX Runtime).
    pub engine: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UnloadRequest {
    pub id: u64,
    pub model_key: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InferItem {
    pub model_key: String,
    pub kind: TextKind,
    pub texts: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InferRequest {
    pub id: u64,
    pub batch_id: String,
    pub items: Vec<InferItem>,
    /// Unix epoch milliseconds after which nobody waits for this batch any more: a runtime
    /// that has not started it by then drops it (`DEADLINE_EXCEEDED`). `None`: no deadline.
    #[serde(default)]
    pub deadline_ms: Option<u64>,
    /// A shadow's batch: the runtime runs it at its lowest CPU priority (`runtime::Terms`).
    /// Requests written before shadows yielded lack it and mean `false`.
    #[serde(default)]
    pub background: bool,
}

/// Passages to score against one query with one model (one rerank request).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScoreItem {
    pub model_key: String,
    pub query: String,
    pub passages: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScoreRequest {
    pub id: u64,
    pub batch_id: String,
    pub items: Vec<ScoreItem>,
    /// As `InferRequest`'s: past it the runtime drops the batch unrun.
    #[serde(default)]
    pub deadline_ms: Option<u64>,
    /// As `InferRequest`'s.
    #[serde(default)]
    pub background: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClassifyItem {
    pub model_key: String,
    pub texts: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClassifyRequest {
    pub id: u64,
    pub batch_id: String,
    pub items: Vec<ClassifyItem>,
    /// As `InferRequest`'s: past it the runtime drops the batch unrun.
    #[serde(default)]
    pub deadline_ms: Option<u64>,
    /// As `InferRequest`'s.
    #[serde(default)]
    pub background: bool,
}

/// `stats` and `shutdown` carry nothing but their id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BareRequest {
    pub id: u64,
}

/// The part of every reply that routes it to its request.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ReplyHead {
    pub id: u64,
    pub ok: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HelloReply {
    pub id: u64,
    pub ok: bool,
    pub protocol: u32,
    pub runtime: String,
    pub runtime_version: String,
    pub capabilities: Vec<String>,
}

/// Reply to `load` (memory the load added) and `unload` (memory it freed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryReply {
    pub id: u64,
    pub ok: bool,
    pub model_key: String,
    pub memory_bytes: u64,
}

pub type LoadReply = MemoryReply;
pub type UnloadReply = MemoryReply;

/// Embeddings of one infer item: little-endian f32, row-major, `count x dims`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Embeddings {
    pub dims: u32,
    pub count: u32,
    pub embeddings: ByteBuf,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InferReply {
    pub id: u64,
    pub ok: bool,
    pub batch_id: String,
    pub results: Vec<Embeddings>,
}

/// Scores of one score item: little-endian f32, one per passage in request order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Scores {
    pub count: u32,
    pub scores: ByteBuf,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScoreReply {
    pub id: u64,
    pub ok: bool,
    pub batch_id: String,
    pub results: Vec<Scores>,
}

/// Label probabilities of one classify item: `count x labels.len()` little-endian f32 rows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Probabilities {
    pub count: u32,
    pub labels: Vec<String>,
    pub probabilities: ByteBuf,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClassifyReply {
    pub id: u64,
    pub ok: bool,
    pub batch_id: String,
    pub results: Vec<Probabilities>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelStats {
    pub model_key: String,
    pub memory_bytes: u64,
    pub base_key: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatsReply {
    pub id: u64,
    pub ok: bool,
    pub memory_bytes: u64,
    pub models: Vec<ModelStats>,
    pub queue_depth: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShutdownReply {
    pub id: u64,
    pub ok: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorReply {
    pub id: u64,
    pub ok: bool,
    pub error: ErrorBody,
}
