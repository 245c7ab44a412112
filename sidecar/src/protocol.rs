//! Wire messages of protocol version 1 (docs/protocol.md), mirrored from `serving/protocol/`.
//!
//! Struct field order *is* the msgpack map key order, so both languages produce identical
//! bytes; the golden vectors in `tests/vectors/` pin this down (see the tests at the bottom).
//! Constant fields (`op`, `ok`, `v`) are real fields so that they sit in their documented place.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;

use crate::error::Result;

pub const PROTOCOL_VERSION: u32 = 1;

/// msgpack bytes of a message, structs written as maps with string keys.
pub fn encode<T: Serialize>(message: &T) -> Result<Vec<u8>> {
    Ok(rmp_serde::to_vec_named(message)?)
}

pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    Ok(rmp_serde::from_slice(bytes)?)
}

/// The one error shape: `{"code", "message", "retryable"}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub code: String,
    pub message: String,
    pub retryable: bool,
}

impl ErrorBody {
    pub fn new(code: &str, message: &str, retryable: bool) -> Self {
        Self {
            code: code.to_string(),
            message: message.to_string(),
            retryable,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TextKind {
    Query,
    Passage,
}

// ------------------------------------------------------------------ socket requests

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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoadRequest {
    pub id: u64,
    pub model_key: String,
    pub base_path: String,
    pub adapter_path: Option<String>,
    pub query_prefix: String,
    pub passage_prefix: String,
    pub max_seq_length: Option<u32>,
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
}

/// `stats` and `shutdown` carry nothing but their id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BareRequest {
    pub id: u64,
}

// ------------------------------------------------------------------ socket replies

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

// ------------------------------------------------------------------ queue and KV

/// Inputs of a queue payload: inline texts, or a key in the `payloads` object store whose
/// object holds the texts as a msgpack array of strings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Inputs {
    Texts(Vec<String>),
    Ref(PayloadRef),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PayloadRef {
    #[serde(rename = "ref")]
    pub key: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueuePayload {
    pub v: u32,
    pub task: String,
    pub kind: TextKind,
    pub inputs: Inputs,
}

/// The float32 data of an ok reply (embeddings, scores or probabilities): the little-endian
/// bytes themselves, or, when the reply would not fit NATS's `max_payload`, a key in the
/// `payloads` object store whose object holds them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum EmbeddingsData {
    Bytes(ByteBuf),
    Ref(PayloadRef),
}

/// A rerank request on the queue: score `documents` against `query` (`op` is "score").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScorePayload {
    pub v: u32,
    pub task: String,
    pub op: String,
    pub query: String,
    pub documents: Inputs,
}

/// A classification request on the queue (`op` is "classify").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClassifyPayload {
    pub v: u32,
    pub task: String,
    pub op: String,
    pub inputs: Inputs,
}

/// Any queue payload: the `op` field names score and classify requests; without it, an
/// embedding request. Variants are tried in order and each needs its own fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TaskPayload {
    Score(ScorePayload),
    Classify(ClassifyPayload),
    Embed(QueuePayload),
}

impl TaskPayload {
    pub fn v(&self) -> u32 {
        match self {
            TaskPayload::Score(p) => p.v,
            TaskPayload::Classify(p) => p.v,
            TaskPayload::Embed(p) => p.v,
        }
    }

    pub fn task(&self) -> &str {
        match self {
            TaskPayload::Score(p) => &p.task,
            TaskPayload::Classify(p) => &p.task,
            TaskPayload::Embed(p) => &p.task,
        }
    }

    /// The op name, checked against the variant (a stray `op` value is refused).
    pub fn op(&self) -> std::result::Result<&'static str, String> {
        match self {
            TaskPayload::Score(p) if p.op == "score" => Ok("score"),
            TaskPayload::Classify(p) if p.op == "classify" => Ok("classify"),
            TaskPayload::Embed(_) => Ok("embed"),
            TaskPayload::Score(p) => Err(format!("unknown op {:?}", p.op)),
            TaskPayload::Classify(p) => Err(format!("unknown op {:?}", p.op)),
        }
    }
}

/// The reply message published to a request's `Tf-Reply` subject.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ReplyMessage {
    Ok(ReplyOk),
    Score(ScoreReplyOk),
    Classify(ClassifyReplyOk),
    Error(ReplyError),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplyOk {
    pub v: u32,
    pub request_id: String,
    pub ok: bool,
    pub model_key: String,
    pub epoch: u64,
    pub dims: u32,
    pub count: u32,
    pub embeddings: EmbeddingsData,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScoreReplyOk {
    pub v: u32,
    pub request_id: String,
    pub ok: bool,
    pub op: String,
    pub model_key: String,
    pub epoch: u64,
    pub count: u32,
    pub scores: EmbeddingsData,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClassifyReplyOk {
    pub v: u32,
    pub request_id: String,
    pub ok: bool,
    pub op: String,
    pub model_key: String,
    pub epoch: u64,
    pub count: u32,
    pub labels: Vec<String>,
    pub probabilities: EmbeddingsData,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplyError {
    pub v: u32,
    pub request_id: String,
    pub ok: bool,
    pub error: ErrorBody,
}

impl ReplyMessage {
    pub fn ok(request_id: &str, model_key: &str, epoch: u64, result: Embeddings) -> Self {
        ReplyMessage::Ok(ReplyOk {
            v: PROTOCOL_VERSION,
            request_id: request_id.to_string(),
            ok: true,
            model_key: model_key.to_string(),
            epoch,
            dims: result.dims,
            count: result.count,
            embeddings: EmbeddingsData::Bytes(result.embeddings),
        })
    }

    pub fn scores(request_id: &str, model_key: &str, epoch: u64, result: Scores) -> Self {
        ReplyMessage::Score(ScoreReplyOk {
            v: PROTOCOL_VERSION,
            request_id: request_id.to_string(),
            ok: true,
            op: "score".to_string(),
            model_key: model_key.to_string(),
            epoch,
            count: result.count,
            scores: EmbeddingsData::Bytes(result.scores),
        })
    }

    pub fn probabilities(
        request_id: &str,
        model_key: &str,
        epoch: u64,
        result: Probabilities,
    ) -> Self {
        ReplyMessage::Classify(ClassifyReplyOk {
            v: PROTOCOL_VERSION,
            request_id: request_id.to_string(),
            ok: true,
            op: "classify".to_string(),
            model_key: model_key.to_string(),
            epoch,
            count: result.count,
            labels: result.labels,
            probabilities: EmbeddingsData::Bytes(result.probabilities),
        })
    }

    pub fn error(request_id: &str, error: ErrorBody) -> Self {
        ReplyMessage::Error(ReplyError {
            v: PROTOCOL_VERSION,
            request_id: request_id.to_string(),
            ok: false,
            error,
        })
    }
}

/// Value of KV `placements` under key = task: what the fleet should run for the task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    pub v: u32,
    pub task: String,
    pub epoch: u64,
    pub candidate: String,
    pub model_key: String,
    /// The weights by content; fetched into the worker's cache (`artifacts.rs`) before loading.
    pub base: ArtifactRef,
    pub adapter: Option<ArtifactRef>,
    pub query_prefix: String,
    pub passage_prefix: String,
    pub max_seq_length: Option<u32>,
    pub pinned: bool,
    pub replicas: u32,
    /// Estimated memory of the model, used to make room before loading it.
    pub memory_bytes: u64,
    /// The runtime kind that serves it ("torch", "candle", "http"); values written before
    /// runtimes existed lack it and mean "torch".
    #[serde(default = "torch")]
    pub runtime: String,
    /// A shadow placement (KV key `<task>.shadow`): it pulls the sampled copies of the task's
    /// requests from `shadow_<task>` on stream `SHADOW`, and its replies go to stream
    /// `SAMPLES`, never to a caller. Values written before shadows existed lack it.
    #[serde(default)]
    pub shadow: bool,
}

fn torch() -> String {
    "torch".into()
}

/// A folder of files by content (docs/protocol.md, "Artifacts").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArtifactRef {
    pub sha256: String,
    pub size: u64,
    pub format: String,
}

impl Placement {
    /// The artifacts this placement's model needs, base first.
    pub fn artifacts(&self) -> Vec<ArtifactRef> {
        std::iter::once(self.base.clone())
            .chain(self.adapter.clone())
            .collect()
    }

    /// The `load` request for this placement's model (id filled in by the client), naming the
    /// artifacts' folders in the cache at `cache` (`<cache>/sha256/<digest>`).
    pub fn load_request(&self, cache: &std::path::Path) -> LoadRequest {
        let folder = |a: &ArtifactRef| {
            cache
                .join("sha256")
                .join(&a.sha256)
                .to_string_lossy()
                .into_owned()
        };
        LoadRequest {
            id: 0,
            model_key: self.model_key.clone(),
            base_path: folder(&self.base),
            adapter_path: self.adapter.as_ref().map(folder),
            query_prefix: self.query_prefix.clone(),
            passage_prefix: self.passage_prefix.clone(),
            max_seq_length: self.max_seq_length,
        }
    }
}

/// Value of KV `workers` under key = worker id; data-keyed maps are sorted (BTreeMap).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerHeartbeat {
    pub v: u32,
    pub worker_id: String,
    pub host: String,
    pub ts_ms: u64,
    pub loaded: Vec<String>,
    pub memory_used: u64,
    pub memory_budget: u64,
    pub queue_depth: BTreeMap<String, u64>,
    pub runtimes: Vec<String>,
    pub epochs: BTreeMap<String, u64>,
    /// When this worker process started (unix ms): a new value under the same worker id means
    /// the worker restarted, and whatever the old process held was lost with it.
    #[serde(default)]
    pub started_ms: Option<u64>,
    /// The runtime kind this worker serves (its pool; fixed for the process, unlike `runtimes`,
    /// which is empty while the runtime restarts). Workers rank each other by it for replicas.
    #[serde(default)]
    pub runtime_kind: Option<String>,
}

#[cfg(test)]
#[path = "protocol_vectors_test.rs"]
mod vectors_test;
