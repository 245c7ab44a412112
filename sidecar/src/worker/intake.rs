//! Turns a pulled JetStream message into work: reads the gateway's headers and the payload
//! (fetching object-store inputs), and counts it as held by this worker until it is settled.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_nats::jetstream;
use async_nats::jetstream::object_store::ObjectStore;
use async_nats::HeaderMap;
use tokio::io::AsyncReadExt;

use crate::contract;
use crate::error::{Error, Result};
use crate::nats::Payloads;
use crate::protocol::{self, Inputs, TaskPayload, TextKind};

/// Longest key name kept; a longer `Tf-Key` is cut (it only names a queue).
const MAX_KEY_CHARS: usize = 128;

/// A message this worker holds (pulled, not yet acked, nakked or terminated).
pub struct Envelope {
    pub msg: jetstream::Message,
    pub request_id: String,
    pub reply_to: Option<String>,
    pub deadline_ms: Option<u64>,
    /// `Tf-Min-Epoch` (0 when absent).
    pub min_epoch: u64,
    /// `Tf-Key` ("" when absent: every key-less request shares one queue).
    pub key: String,
    /// How many times the server has delivered this message, this time included.
    pub delivered: i64,
    held: Arc<AtomicU64>,
}

impl Drop for Envelope {
    fn drop(&mut self) {
        self.held.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What the gateway's headers say about a request (docs/protocol.md, queue messages).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHeaders {
    pub request_id: String,
    pub reply_to: Option<String>,
    pub deadline_ms: Option<u64>,
    pub min_epoch: u64,
    pub key: String,
}

impl RequestHeaders {
    /// Reads the headers (named in contract/shared.toml `[headers]`); missing or malformed ones
    /// read as absent, never fail. `min_epoch`: the oldest placement epoch the request may be
    /// answered from (the gateway stamps the newest epoch its caller has seen): a worker still
    /// serving an older one hands the message back.
    pub fn read(headers: Option<&HeaderMap>) -> Self {
        let names = &contract::declared().headers;
        let header = |name: &str| {
            headers
                .and_then(|h| h.get(name))
                .map(|v| v.as_str().to_string())
        };
        let request_id = header(&names.request_id)
            .or_else(|| header(&names.msg_id))
            .unwrap_or_default();
        let reply_to = header(&names.reply).filter(|s| !s.trim().is_empty());
        let deadline_ms = header(&names.deadline).and_then(|v| v.trim().parse().ok());
        let min_epoch = header(&names.min_epoch)
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        let key = header(&names.key)
            .map(|k| k.trim().chars().take(MAX_KEY_CHARS).collect())
            .unwrap_or_default();
        Self {
            request_id,
            reply_to,
            deadline_ms,
            min_epoch,
            key,
        }
    }
}

impl Envelope {
    pub fn new(msg: jetstream::Message, held: Arc<AtomicU64>) -> Self {
        held.fetch_add(1, Ordering::Relaxed);
        let headers = RequestHeaders::read(msg.headers.as_ref());
        let delivered = msg.info().map(|i| i.delivered).unwrap_or(1);
        Self {
            msg,
            request_id: headers.request_id,
            reply_to: headers.reply_to,
            deadline_ms: headers.deadline_ms,
            min_epoch: headers.min_epoch,
            key: headers.key,
            delivered,
            held,
        }
    }

    pub fn is_expired(&self, now_ms: u64) -> bool {
        self.deadline_ms.is_some_and(|deadline| now_ms > deadline)
    }
}

/// What a request asks the runtime to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Work {
    /// Embeddings of the texts (`infer`).
    Embed { kind: TextKind, texts: Vec<String> },
    /// A score per document against the query (`score`, a rerank request).
    Score {
        query: String,
        documents: Vec<String>,
    },
    /// Label probabilities per text (`classify`).
    Classify { texts: Vec<String> },
}

impl Work {
    pub fn op(&self) -> &'static str {
        match self {
            Work::Embed { .. } => "embed",
            Work::Score { .. } => "score",
            Work::Classify { .. } => "classify",
        }
    }

    /// The request's texts: the inputs, or a score request's documents.
    fn set_texts(&mut self, new: Vec<String>) {
        match self {
            Work::Embed { texts, .. } | Work::Classify { texts } => *texts = new,
            Work::Score { documents, .. } => *documents = new,
        }
    }

    /// How many inputs (texts, or a score request's documents) it holds: one answer row each.
    pub fn inputs(&self) -> usize {
        match self {
            Work::Embed { texts, .. } | Work::Classify { texts } => texts.len(),
            Work::Score { documents, .. } => documents.len(),
        }
    }

    /// Every text, a score request's query included.
    pub fn texts_mut(&mut self) -> Box<dyn Iterator<Item = &mut String> + '_> {
        match self {
            Work::Embed { texts, .. } | Work::Classify { texts } => Box::new(texts.iter_mut()),
            Work::Score { query, documents } => {
                Box::new(std::iter::once(query).chain(documents.iter_mut()))
            }
        }
    }

    /// The work cut into parts, each holding the inputs at `parts[i]` (every input in exactly
    /// one part); a score request's query goes with every part.
    pub fn split(self, parts: &[Vec<usize>]) -> Vec<Work> {
        match self {
            Work::Embed { kind, texts } => pick(texts, parts)
                .map(|texts| Work::Embed { kind, texts })
                .collect(),
            Work::Classify { texts } => pick(texts, parts)
                .map(|texts| Work::Classify { texts })
                .collect(),
            Work::Score { query, documents } => pick(documents, parts)
                .map(|documents| Work::Score {
                    query: query.clone(),
                    documents,
                })
                .collect(),
        }
    }
}

/// The texts at each part's indices, moved out of `texts`.
fn pick<'a>(texts: Vec<String>, parts: &'a [Vec<usize>]) -> impl Iterator<Item = Vec<String>> + 'a {
    let mut texts: Vec<Option<String>> = texts.into_iter().map(Some).collect();
    parts.iter().map(move |indices| {
        indices
            .iter()
            .map(|&i| texts.get_mut(i).and_then(Option::take).unwrap_or_default())
            .collect()
    })
}

/// Decodes and checks a queue payload (no I/O): an embed, score or classify request of this
/// task. `Error::BadPayload` means the message can never succeed.
pub fn parse_payload(task: &str, bytes: &[u8]) -> Result<TaskPayload> {
    let payload: TaskPayload = protocol::decode(bytes)
        .map_err(|e| Error::BadPayload(format!("payload is not a v1 queue payload: {e}")))?;
    if payload.v() != protocol::PROTOCOL_VERSION || payload.task() != task {
        return Err(Error::BadPayload(format!(
            "payload v{} for task {:?} arrived on task {task:?}",
            payload.v(),
            payload.task()
        )));
    }
    payload.op().map_err(Error::BadPayload)?;
    Ok(payload)
}

/// Decodes the payload into work, fetching object-store inputs.
pub async fn decode_payload(
    task: &str,
    envelope: &Envelope,
    payloads: &Payloads,
) -> Result<(Work, Option<String>)> {
    // The texts (inline or in the object store) go into the work once they are at hand.
    let (inputs, mut work) = match parse_off_loop(task, &envelope.msg.payload).await? {
        TaskPayload::Embed(p) => (
            p.inputs,
            Work::Embed {
                kind: p.kind,
                texts: Vec::new(),
            },
        ),
        TaskPayload::Classify(p) => (p.inputs, Work::Classify { texts: Vec::new() }),
        TaskPayload::Score(p) => (
            p.documents,
            Work::Score {
                query: p.query,
                documents: Vec::new(),
            },
        ),
    };
    let (texts, payload_ref) = match inputs {
        Inputs::Texts(texts) => (texts, None),
        Inputs::Ref(reference) => {
            let texts = fetch_inputs(&payloads.store().await?, &reference.key).await?;
            (texts, Some(reference.key))
        }
    };
    work.set_texts(texts);
    Ok((work, payload_ref))
}

/// Payloads above this are decoded on the blocking pool (a 30 MB body takes tens of ms).
const DECODE_INLINE_MAX_BYTES: usize = 64 * 1024;

/// `parse_payload`, on the blocking pool when the payload is large.
async fn parse_off_loop(task: &str, bytes: &bytes::Bytes) -> Result<TaskPayload> {
    if bytes.len() <= DECODE_INLINE_MAX_BYTES {
        return parse_payload(task, bytes);
    }
    let (task, bytes) = (task.to_string(), bytes.clone());
    tokio::task::spawn_blocking(move || parse_payload(&task, &bytes))
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
}

/// Inputs moved to the object store: the object holds a msgpack array of strings.
async fn fetch_inputs(store: &ObjectStore, key: &str) -> Result<Vec<String>> {
    let mut object = store.get(key).await.map_err(|e| {
        if e.kind() == async_nats::jetstream::object_store::GetErrorKind::NotFound {
            Error::BadPayload(format!("payload object {key:?} does not exist"))
        } else {
            Error::nats(format!("get payload object {key}"))(e)
        }
    })?;
    let mut bytes = Vec::new();
    object.read_to_end(&mut bytes).await?;
    let key = key.to_string();
    tokio::task::spawn_blocking(move || {
        protocol::decode(&bytes)
            .map_err(|e| Error::BadPayload(format!("payload object {key:?} is not [str]: {e}")))
    })
    .await
    .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
}

#[cfg(test)]
#[path = "intake_fuzz_test.rs"]
mod fuzz_test;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pair_counts_both_texts() {
        let query = "q".repeat(40); // 10 tokens by the estimate
        let documents = vec!["d".repeat(8), "d".repeat(20)]; // 2 + 5 tokens
        let score = Work::Score {
            query,
            documents: documents.clone(),
        };
        assert_eq!(score.tokens(), 10 * 2 + 2 + 5);
        let classify = Work::Classify { texts: documents };
        assert_eq!(classify.tokens(), 7);
        assert_eq!((score.op(), classify.op()), ("score", "classify"));
    }

    #[test]
    fn the_callers_key_is_read_and_bounded() {
        let names = &contract::declared().headers;
        let mut headers = HeaderMap::new();
        headers.insert(names.request_id.as_str(), "r1");
        assert_eq!(RequestHeaders::read(Some(&headers)).key, "");
        headers.insert(names.key.as_str(), " tfk_abc ");
        assert_eq!(RequestHeaders::read(Some(&headers)).key, "tfk_abc");
        headers.insert(names.key.as_str(), "k".repeat(1000).as_str());
        assert_eq!(
            RequestHeaders::read(Some(&headers)).key.len(),
            MAX_KEY_CHARS
        );
    }

    #[test]
    fn work_splits_into_parts_with_the_query_in_each() {
        let score = Work::Score {
            query: "q".into(),
            documents: vec!["a".into(), "b".into(), "c".into()],
        };
        assert_eq!(score.inputs(), 3);
        let parts = score.split(&[vec![2, 0], vec![1]]);
        let expected = [("q", vec!["c", "a"]), ("q", vec!["b"])];
        for (part, (query, documents)) in parts.iter().zip(expected) {
            assert_eq!(
                part,
                &Work::Score {
                    query: query.into(),
                    documents: documents.into_iter().map(String::from).collect()
                }
            );
        }
    }

    #[test]
    fn a_stray_op_is_refused() {
        let payload = TaskPayload::Classify(protocol::ClassifyPayload {
            v: 1,
            task: "t".into(),
            op: "summarize".into(),
            inputs: Inputs::Texts(vec!["x".into()]),
        });
        assert!(payload.op().is_err());
    }
}
