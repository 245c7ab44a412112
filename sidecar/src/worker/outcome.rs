//! How a held message is settled: answered and acked, retried later (nak with delay), expired
//! or dead-lettered. The requester always gets a reply unless the message will be retried.
//!
//! A reply is sent as a NATS request and the gateway confirms it with an empty response, so a
//! message is acked only once its reply has *arrived*: a reply published while the gateway
//! was reconnecting (NATS restart) would otherwise vanish and the caller wait for its deadline.
//! Until then the reply is sent again (the message kept alive) up to the request's deadline;
//! past it nobody waits any more. A reply that cannot be sent at all (above `max_payload` and
//! refused by the object store) becomes a dead letter.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, message::AckKind};
use async_nats::{HeaderMap, RequestErrorKind};
use bytes::Bytes;

use super::intake::Envelope;
use crate::clock::now_ms;
use crate::contract;
use crate::error::{Error, Result};
use crate::metrics::metrics;
use crate::nats::Payloads;
use crate::protocol::{self, Code, EmbeddingsData, ErrorBody, PayloadRef, ReplyMessage};

/// NATS's default `max_payload`, used until the server has told its own.
const DEFAULT_MAX_PAYLOAD: usize = 1024 * 1024;
/// How long one delivery attempt waits for the gateway's confirmation.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a reply without a deadline is sent again while no gateway confirms it.
const UNDATED_DELIVERY: Duration = Duration::from_secs(30);

/// What became of a reply.
pub enum Delivery {
    /// The requester's gateway confirmed it (or the message named no reply subject).
    Confirmed,
    /// Nobody confirmed it before the request's deadline: nobody waits for it any more.
    Abandoned(String),
}

#[derive(Clone)]
pub struct Settler {
    pub client: async_nats::Client,
    pub js: jetstream::Context,
    pub task: String,
    /// The consumer's `max_deliver`; the last delivery of a failing message goes to the DLQ.
    pub max_deliver: i64,
    pub nak_delay: Duration,
    /// Where replies above `max_payload` put their embeddings.
    pub payloads: Arc<Payloads>,
}

impl Settler {
    pub fn is_last_delivery(&self, envelope: &Envelope) -> bool {
        self.is_last(envelope.delivered)
    }

    /// Whether a message delivered this many times is on its last delivery.
    pub fn is_last(&self, delivered: i64) -> bool {
        self.max_deliver > 0 && delivered >= self.max_deliver
    }

    /// Sends the reply to the requester's `Tf-Reply` subject until its gateway confirms it
    /// (see the module docs); a reply above the server's `max_payload` carries its embeddings
    /// as an object-store reference. `Err` only when the reply cannot be sent at all.
    pub async fn reply(&self, envelope: &Envelope, reply: ReplyMessage) -> Result<Delivery> {
        let Some(subject) = envelope.reply_to.clone() else {
            tracing::warn!(request_id = %envelope.request_id, "message has no Tf-Reply header");
            return Ok(Delivery::Confirmed);
        };
        let outcome = if matches!(reply, ReplyMessage::Error(_)) {
            "error"
        } else {
            "ok"
        };
        let mut bytes = protocol::encode(&reply)?;
        if bytes.len() > self.max_payload() {
            bytes = protocol::encode(&self.offload(envelope, reply).await?)?;
        }
        let delivery = self.deliver(envelope, subject, bytes.into()).await?;
        let outcome = match &delivery {
            Delivery::Confirmed => outcome,
            Delivery::Abandoned(_) => "abandoned",
        };
        metrics().replies.inc(&[&self.task, outcome]);
        Ok(delivery)
    }

    async fn deliver(
        &self,
        envelope: &Envelope,
        subject: String,
        bytes: Bytes,
    ) -> Result<Delivery> {
        let until = envelope
            .deadline_ms
            .unwrap_or_else(|| now_ms() + UNDATED_DELIVERY.as_millis() as u64);
        let mut pause = Duration::from_millis(100);
        loop {
            let attempt = self.client.request(subject.clone(), bytes.clone());
            let why = match tokio::time::timeout(CONFIRM_TIMEOUT, attempt).await {
                Ok(Ok(_)) => return Ok(Delivery::Confirmed),
                Ok(Err(e)) => match e.kind() {
                    RequestErrorKind::MaxPayloadExceeded | RequestErrorKind::InvalidSubject => {
                        return Err(Error::nats("send reply")(e));
                    }
                    RequestErrorKind::NoResponders => {
                        "no gateway listens on the reply subject".to_string()
                    }
                    _ => e.to_string(),
                },
                Err(_) => "the gateway did not confirm the reply".to_string(),
            };
            if now_ms() >= until {
                tracing::warn!(request_id = %envelope.request_id, reason = %why, "reply abandoned: its deadline passed");
                return Ok(Delivery::Abandoned(why));
            }
            tracing::info!(request_id = %envelope.request_id, reason = %why, "reply not confirmed; sending it again");
            let _ = envelope.msg.ack_with(AckKind::Progress).await;
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(2));
        }
    }

    fn max_payload(&self) -> usize {
        match self.client.server_info().max_payload {
            0 => DEFAULT_MAX_PAYLOAD,
            limit => limit,
        }
    }

    /// Moves the embeddings of a too-large reply to the object store under
    /// `reply-<request id>`; the gateway reads and deletes the object.
    async fn offload(&self, envelope: &Envelope, reply: ReplyMessage) -> Result<ReplyMessage> {
        let mut reply = reply;
        // Embeddings, scores or probabilities: every ok reply has one float32 field.
        let data = match &mut reply {
            ReplyMessage::Ok(ok) => &mut ok.embeddings,
            ReplyMessage::Score(ok) => &mut ok.scores,
            ReplyMessage::Classify(ok) => &mut ok.probabilities,
            ReplyMessage::Error(_) => {
                return Err(Error::Protocol("an error reply above max_payload".into()));
            }
        };
        let EmbeddingsData::Bytes(bytes) = &*data else {
            return Err(Error::Protocol(
                "reply too large even with a reference".into(),
            ));
        };
        let key = format!("reply-{}", envelope.request_id);
        let store = self.payloads.store().await?;
        store
            .put(key.as_str(), &mut bytes.as_slice())
            .await
            .map_err(Error::nats(format!("put reply object {key}")))?;
        metrics().reply_offloads.inc(&[&self.task]);
        *data = EmbeddingsData::Ref(PayloadRef { key });
        Ok(reply)
    }

    async fn ack(&self, envelope: &Envelope, kind: AckKind) {
        if let Err(e) = envelope.msg.ack_with(kind).await {
            tracing::warn!(request_id = %envelope.request_id, error = %e, "ack failed");
        }
    }

    /// Answers and acks (true); a reply that cannot be sent is dead-lettered instead (false).
    pub async fn succeed(&self, envelope: Envelope, reply: ReplyMessage) -> bool {
        match self.reply(&envelope, reply).await {
            // Abandoned too: the work is done and nobody waits for it; running it again
            // would help no one.
            Ok(_) => {
                self.ack(&envelope, AckKind::Ack).await;
                true
            }
            Err(e) => {
                metrics().reply_failures.inc(&[&self.task]);
                tracing::error!(request_id = %envelope.request_id, error = %e, "reply not sent");
                let undeliverable = Error::ReplyUndeliverable(e.to_string());
                self.dead_letter(envelope, &undeliverable).await;
                false
            }
        }
    }

    /// Leaves the message in the queue for later (the model is loading, the runtime restarts);
    /// `code` says why, for the metrics.
    pub async fn retry_later(&self, envelope: Envelope, code: &str) {
        metrics().retries.inc(&[&self.task, code]);
        let delay = self.nak_delay * u32::try_from(envelope.delivered.max(1)).unwrap_or(1);
        self.ack(&envelope, AckKind::Nak(Some(delay))).await;
    }

    /// Gives back a message this worker cannot answer now (it needs a newer placement epoch
    /// than this worker serves; its model changed while its parts ran): a nak with delay, for
    /// another worker, or this one later, never a wait that holds the task's loop. On its last
    /// delivery a nak would strand it, so it is answered with `error` (retryable: the caller
    /// may send it again) and dropped unrun.
    pub async fn hand_back(&self, envelope: Envelope, error: ErrorBody) {
        if !self.is_last_delivery(&envelope) {
            self.retry_later(envelope, &error.code).await;
            return;
        }
        metrics().retries.inc(&[&self.task, &error.code]);
        tracing::info!(request_id = %envelope.request_id, code = %error.code, "handed back on its last delivery: answered retryable");
        let reply = ReplyMessage::error(&envelope.request_id, error);
        if let Err(e) = self.reply(&envelope, reply).await {
            tracing::warn!(request_id = %envelope.request_id, error = %e, "hand-back reply not sent");
        }
        self.ack(&envelope, AckKind::Term).await;
    }

    /// The deadline passed before the request ran: answer DEADLINE_EXCEEDED and drop it. When
    /// an earlier delivery was lost (a worker died or failed), the caller may retry.
    pub async fn expire(&self, envelope: Envelope) {
        metrics().expired.inc(&[&self.task]);
        let redelivered = envelope.delivered > 1;
        tracing::info!(request_id = %envelope.request_id, redelivered, "deadline passed before processing");
        let message = if redelivered {
            "the request's deadline passed while it was redelivered after a failed worker"
        } else {
            "the request's deadline passed before a worker could run it"
        };
        let error = ErrorBody::new(Code::DeadlineExceeded, message).retryable(redelivered);
        let reply = ReplyMessage::error(&envelope.request_id, error);
        if let Err(e) = self.reply(&envelope, reply).await {
            tracing::warn!(request_id = %envelope.request_id, error = %e, "expiry reply not sent");
        }
        self.ack(&envelope, AckKind::Term).await;
    }

    /// A processing failure: retried until the last delivery, then dead-lettered. Payloads
    /// that can never succeed go to the DLQ at once.
    pub async fn fail(&self, envelope: Envelope, error: &Error) {
        if matches!(error, Error::EngineUnavailable(_)) {
            // The engine behind the http runtime is down for every worker: tell the caller
            // now (retryable, the gateway adds Retry-After) rather than retry until its
            // deadline and answer a bare timeout.
            tracing::warn!(request_id = %envelope.request_id, error = %error, "engine unavailable; answered retryable");
            metrics()
                .retries
                .inc(&[&self.task, Code::RuntimeUnavailable.as_str()]);
            let reply = ReplyMessage::error(&envelope.request_id, error.to_body());
            if let Err(e) = self.reply(&envelope, reply).await {
                tracing::warn!(request_id = %envelope.request_id, error = %e, "error reply not sent");
            }
            self.ack(&envelope, AckKind::Term).await;
            return;
        }
        if matches!(error, Error::BadPayload(_)) || self.is_last_delivery(&envelope) {
            self.dead_letter(envelope, error).await;
        } else {
            tracing::warn!(
                request_id = %envelope.request_id,
                delivered = envelope.delivered,
                error = %error,
                "request failed; will retry"
            );
            let code = error.to_body().code;
            self.retry_later(envelope, &code).await;
        }
    }

    /// Copies the original message plus the last error to `dlq.<task>`, tells the requester,
    /// and terminates the message.
    pub async fn dead_letter(&self, envelope: Envelope, error: &Error) {
        let body = error.to_body();
        match self.publish_dlq(&envelope, &body).await {
            Ok(()) => {
                metrics().dead_letters.inc(&[&self.task, &body.code]);
                tracing::warn!(
                    request_id = %envelope.request_id,
                    delivered = envelope.delivered,
                    error = %error,
                    "request dead-lettered"
                );
                let mut final_error = body;
                final_error.retryable = false;
                let reply = ReplyMessage::error(&envelope.request_id, final_error);
                if let Err(e) = self.reply(&envelope, reply).await {
                    tracing::warn!(request_id = %envelope.request_id, error = %e, "error reply not sent");
                }
                self.ack(&envelope, AckKind::Term).await;
            }
            // Without a DLQ copy, the message stays in TASKS rather than being lost.
            Err(e) => tracing::error!(
                request_id = %envelope.request_id,
                error = %e,
                "could not dead-letter; message left unacknowledged"
            ),
        }
    }

    async fn publish_dlq(&self, envelope: &Envelope, error: &ErrorBody) -> Result<()> {
        // Keep the original headers for replay, except JetStream publish expectations
        // (`Nats-Expected-Stream: TASKS` from the gateway would make the DLQ publish fail).
        let mut headers = HeaderMap::new();
        if let Some(original) = &envelope.msg.headers {
            for (name, values) in original.iter() {
                if name.to_string().starts_with("Nats-Expected-") {
                    continue;
                }
                for value in values {
                    headers.append(name.clone(), value.clone());
                }
            }
        }
        let summary = format!("{}: {}", error.code, error.message);
        // Header values must stay on one line.
        headers.insert(
            contract::declared().headers.error.as_str(),
            summary.replace(['\r', '\n'], " ").as_str(),
        );
        let ack = self
            .js
            .publish_with_headers(
                contract::declared().nats.streams.dlq.subject(&self.task),
                headers,
                envelope.msg.payload.clone(),
            )
            .await
            .map_err(Error::nats("publish to DLQ"))?;
        ack.await.map_err(Error::nats("DLQ publish ack"))?;
        Ok(())
    }
}
