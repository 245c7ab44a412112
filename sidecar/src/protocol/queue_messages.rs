//! Queue payloads (gateway -> worker, stream `TASKS`) and the replies a worker publishes to a
//! request's `Tf-Reply` subject; serving/protocol/queue_messages.py.

use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;

use super::codes::ErrorBody;
use super::socket_ops::{Embeddings, Probabilities, Scores, TextKind, PROTOCOL_VERSION};

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
