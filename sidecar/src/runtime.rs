//! The runtime boundary: one small trait, [`Backend`], that every model runtime implements,
//! the way text-embeddings-inference keeps its backends behind one trait. The sidecar's
//! residency, batching and heartbeats only ever talk to a `dyn Backend`:
//!
//! - [`socket`]: a runtime in another process over a Unix socket (the PyTorch runtime);
//! - [`candle`] (cargo feature `candle`): BERT-family sentence embedders inside the sidecar;
//! - [`http`]: an existing engine (infinity, TEI, vLLM, SGLang) over its OpenAI-compatible
//!   `/v1/embeddings` API, or an endpoint model's own API ([`endpoint`]: embeddings or rerank).
//!
//! [`supervisor`] keeps one backend available; [`serve`] exposes any backend over the socket
//! protocol (what `taskfleet eval --runtime` and the tests use to reach Candle and HTTP).
//! Failures are `Error::Runtime` with the protocol's codes (`LOAD_FAILED`, `INFER_FAILED`, ...)
//! or `Error::RuntimeUnavailable`, whichever backend they come from.

#[cfg(feature = "candle")]
pub mod candle;
pub mod endpoint;
pub mod http;
pub mod serve;
pub mod socket;
pub mod supervisor;

use async_trait::async_trait;

use crate::error::{Error, Result};
use crate::protocol::{
    ClassifyItem, Code, Embeddings, ErrorBody, InferItem, LoadRequest, ModelStats, Probabilities,
    ScoreItem, Scores,
};

/// Capability names reported in `hello` and heartbeats (docs/protocol.md).
pub const CAP_EMBED: &str = "embed";
pub const CAP_LORA: &str = "lora";
pub const CAP_MIXED_ADAPTERS: &str = "mixed_adapters";
pub const CAP_SCORE: &str = "score";
pub const CAP_CLASSIFY: &str = "classify";

/// The runtime kinds a worker can run; a placement names one of them.
pub const KINDS: [&str; 3] = ["torch", "candle", "http"];

/// What a backend is: reported by `hello`, heartbeats and logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeInfo {
    /// The runtime kind a placement names: "torch", "candle" or "http".
    pub runtime: String,
    pub version: String,
    pub capabilities: Vec<String>,
}

impl RuntimeInfo {
    pub fn can(&self, capability: &str) -> bool {
        self.capabilities.iter().any(|c| c == capability)
    }
}

/// Memory and models of a backend, as `stats` reports them.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RuntimeStats {
    pub memory_bytes: u64,
    pub models: Vec<ModelStats>,
    pub queue_depth: u32,
}

/// How a batch is to be run, beside what it holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Terms {
    /// Unix epoch milliseconds after which nobody waits for the batch: a backend that has not
    /// started it by then drops it unrun (`DEADLINE_EXCEEDED`). `None`: no deadline.
    pub deadline_ms: Option<u64>,
    /// A shadow's batch (sampled copies whose answers reach no caller): the torch runtime runs
    /// it on its own thread at the lowest CPU priority, so on shared cores a champion's batch
    /// that arrives while it runs gets the CPU. The http and Candle runtimes run it as any
    /// other (an external engine has no such knob; Candle's blocking threads are shared).
    pub background: bool,
}

#[async_trait]
pub trait Backend: Send + Sync {
    fn info(&self) -> RuntimeInfo;

    /// Ok while the backend can serve; the supervisor withdraws it while this fails.
    async fn health(&self) -> Result<()>;

    /// Loads `request.model_key`; returns the bytes this load added (0 when already loaded
    /// with the same spec).
    async fn load(&self, request: LoadRequest) -> Result<u64>;

    /// Unloads a model key; returns the bytes freed.
    async fn unload(&self, model_key: &str) -> Result<u64>;

    /// Embeddings per item, in item order (one result per item). A batch that has not started
    /// by `terms.deadline_ms` (Unix milliseconds) is dropped unrun with `DEADLINE_EXCEEDED`.
    async fn infer(
        &self,
        batch_id: String,
        items: Vec<InferItem>,
        terms: Terms,
    ) -> Result<Vec<Embeddings>>;

    /// Scores per item (one per passage, in passage order), in item order. Only backends
    /// with the `score` capability implement it; the others refuse it as `UNKNOWN_OP`
    /// (the registry never places a rerank task on them).
    async fn score(
        &self,
        batch_id: String,
        items: Vec<ScoreItem>,
        terms: Terms,
    ) -> Result<Vec<Scores>> {
        let _ = (batch_id, items, terms);
        Err(unsupported(&self.info(), CAP_SCORE))
    }

    /// Label probabilities per item, in item order. Only backends with the `classify`
    /// capability implement it; the others refuse it as `UNKNOWN_OP`.
    async fn classify(
        &self,
        batch_id: String,
        items: Vec<ClassifyItem>,
        terms: Terms,
    ) -> Result<Vec<Probabilities>> {
        let _ = (batch_id, items, terms);
        Err(unsupported(&self.info(), CAP_CLASSIFY))
    }

    async fn stats(&self) -> Result<RuntimeStats>;
}

/// What a backend without `capability` answers to that op: not retryable, it never will.
pub fn unsupported(info: &RuntimeInfo, capability: &str) -> Error {
    failure(
        Code::UnknownOp,
        format!(
            "the {} runtime cannot {capability} (its capabilities: {})",
            info.runtime,
            info.capabilities.join(", ")
        ),
    )
}

/// A failure a backend answers with, in the protocol's error shape (retryable as declared).
pub fn failure(code: Code, message: impl AsRef<str>) -> Error {
    Error::Runtime(ErrorBody::new(code, message.as_ref()))
}

/// `DEADLINE_EXCEEDED` once `deadline_ms` has passed: nobody waits for the batch any more, and
/// computing it would only delay the next (what the Python runtime does too).
pub fn check_deadline(batch_id: &str, deadline_ms: Option<u64>) -> Result<()> {
    match deadline_ms {
        Some(deadline) if crate::clock::now_ms() > deadline => Err(failure(
            Code::DeadlineExceeded,
            format!("batch {batch_id} expired before it could run"),
        )),
        _ => Ok(()),
    }
}

/// `MODEL_NOT_LOADED` (retryable: the sidecar loads it again) for an unknown model key.
pub fn not_loaded(model_key: &str) -> Error {
    failure(
        Code::ModelNotLoaded,
        format!("model {model_key:?} is not loaded"),
    )
}

/// A load of a key that is already loaded: nothing to do with the same spec (0 bytes added),
/// refused with another one.
pub fn reload(loaded: &LoadRequest, request: &LoadRequest) -> Result<u64> {
    let same = LoadRequest {
        id: 0,
        ..loaded.clone()
    };
    if same
        == (LoadRequest {
            id: 0,
            ..request.clone()
        })
    {
        return Ok(0);
    }
    Err(failure(
        Code::BadRequest,
        format!(
            "model key {:?} is already loaded with a different spec; unload it first",
            request.model_key
        ),
    ))
}

/// Packs row-major f32 vectors as the protocol's little-endian bytes.
pub fn embeddings(dims: usize, rows: &[Vec<f32>]) -> Embeddings {
    let mut bytes = Vec::with_capacity(rows.len() * dims * 4);
    for row in rows {
        for value in row {
            bytes.extend_from_slice(&value.to_le_bytes());
        }
    }
    Embeddings {
        dims: dims as u32,
        count: rows.len() as u32,
        embeddings: serde_bytes::ByteBuf::from(bytes),
    }
}

/// The prefix a load request asks for before texts of `kind`.
pub fn prefix(request: &LoadRequest, kind: crate::protocol::TextKind) -> &str {
    match kind {
        crate::protocol::TextKind::Query => &request.query_prefix,
        crate::protocol::TextKind::Passage => &request.passage_prefix,
    }
}

#[cfg(test)]
#[path = "runtime/socket_test.rs"]
mod socket_test;

#[cfg(test)]
#[path = "runtime/frame_fuzz_test.rs"]
mod frame_fuzz_test;
