//! Turns a pulled JetStream message into work: reads the gateway's headers and the payload
//! (fetching object-store inputs), and counts it as held by this worker until it is settled.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_nats::jetstream;
use async_nats::jetstream::object_store::ObjectStore;
use async_nats::HeaderMap;
use tokio::io::AsyncReadExt;

use crate::error::{Error, Result};
use crate::nats::Payloads;
use crate::protocol::{self, Inputs, QueuePayload, TextKind};

pub const HEADER_REQUEST_ID: &str = "Tf-Request-Id";
pub const HEADER_REPLY: &str = "Tf-Reply";
pub const HEADER_DEADLINE: &str = "Tf-Deadline";
pub const HEADER_ERROR: &str = "Tf-Error";

/// A message this worker holds (pulled, not yet acked, nakked or terminated).
pub struct Envelope {
    pub msg: jetstream::Message,
    pub request_id: String,
    pub reply_to: Option<String>,
    pub deadline_ms: Option<u64>,
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
}

impl RequestHeaders {
    /// Reads the headers; missing or malformed ones read as absent, never fail.
    pub fn read(headers: Option<&HeaderMap>) -> Self {
        let header = |name: &str| {
            headers
                .and_then(|h| h.get(name))
                .map(|v| v.as_str().to_string())
        };
        let request_id = header(HEADER_REQUEST_ID)
            .or_else(|| header("Nats-Msg-Id"))
            .unwrap_or_default();
        let reply_to = header(HEADER_REPLY).filter(|s| !s.trim().is_empty());
        let deadline_ms = header(HEADER_DEADLINE).and_then(|v| v.trim().parse().ok());
        Self {
            request_id,
            reply_to,
            deadline_ms,
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
            delivered,
            held,
        }
    }

    pub fn is_expired(&self, now_ms: u64) -> bool {
        self.deadline_ms.is_some_and(|deadline| now_ms > deadline)
    }
}

/// A decoded request, ready to join a batch.
pub struct Pending {
    pub envelope: Envelope,
    pub kind: TextKind,
    pub texts: Vec<String>,
    /// Object-store key of the inputs, deleted once the request is answered.
    pub payload_ref: Option<String>,
    pub tokens: usize,
}

/// Decodes and checks a queue payload (no I/O). `Error::BadPayload` means the message can
/// never succeed.
pub fn parse_payload(task: &str, bytes: &[u8]) -> Result<QueuePayload> {
    let payload: QueuePayload = protocol::decode(bytes)
        .map_err(|e| Error::BadPayload(format!("payload is not a v1 queue payload: {e}")))?;
    if payload.v != protocol::PROTOCOL_VERSION || payload.task != task {
        return Err(Error::BadPayload(format!(
            "payload v{} for task {:?} arrived on task {task:?}",
            payload.v, payload.task
        )));
    }
    Ok(payload)
}

/// Decodes the payload, fetching object-store inputs.
pub async fn decode_payload(
    task: &str,
    envelope: &Envelope,
    payloads: &Payloads,
) -> Result<(TextKind, Vec<String>, Option<String>)> {
    let payload = parse_payload(task, &envelope.msg.payload)?;
    match payload.inputs {
        Inputs::Texts(texts) => Ok((payload.kind, texts, None)),
        Inputs::Ref(reference) => {
            let texts = fetch_inputs(&payloads.store().await?, &reference.key).await?;
            Ok((payload.kind, texts, Some(reference.key)))
        }
    }
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
    protocol::decode(&bytes)
        .map_err(|e| Error::BadPayload(format!("payload object {key:?} is not [str]: {e}")))
}

/// The batching estimate of tokens: a quarter of the characters (at least one per text).
pub fn estimate_tokens(texts: &[String]) -> usize {
    texts.iter().map(|t| (t.chars().count() / 4).max(1)).sum()
}

#[cfg(test)]
#[path = "intake_fuzz_test.rs"]
mod fuzz_test;
