//! How a held message is settled: answered and acked, retried later (nak with delay), expired
//! or dead-lettered. The requester always gets a reply unless the message will be retried.

use std::time::Duration;

use async_nats::jetstream::{self, message::AckKind};
use async_nats::HeaderMap;

use super::intake::{Envelope, HEADER_ERROR};
use crate::error::{Error, Result};
use crate::protocol::{self, ErrorBody, ReplyMessage};

#[derive(Clone)]
pub struct Settler {
    pub client: async_nats::Client,
    pub js: jetstream::Context,
    pub task: String,
    /// The consumer's `max_deliver`; the last delivery of a failing message goes to the DLQ.
    pub max_deliver: i64,
    pub nak_delay: Duration,
}

impl Settler {
    pub fn is_last_delivery(&self, envelope: &Envelope) -> bool {
        self.max_deliver > 0 && envelope.delivered >= self.max_deliver
    }

    /// Publishes the reply to the requester's `Tf-Reply` subject (core NATS).
    pub async fn reply(&self, envelope: &Envelope, reply: &ReplyMessage) {
        let Some(subject) = envelope.reply_to.clone() else {
            tracing::warn!(request_id = %envelope.request_id, "message has no Tf-Reply header");
            return;
        };
        let published = match protocol::encode(reply) {
            Ok(bytes) => self
                .client
                .publish(subject, bytes.into())
                .await
                .map_err(Error::nats("publish reply")),
            Err(e) => Err(e),
        };
        if let Err(e) = published {
            tracing::error!(request_id = %envelope.request_id, error = %e, "reply not sent");
        }
    }

    async fn ack(&self, envelope: &Envelope, kind: AckKind) {
        if let Err(e) = envelope.msg.ack_with(kind).await {
            tracing::warn!(request_id = %envelope.request_id, error = %e, "ack failed");
        }
    }

    pub async fn succeed(&self, envelope: Envelope, reply: ReplyMessage) {
        self.reply(&envelope, &reply).await;
        self.ack(&envelope, AckKind::Ack).await;
    }

    /// Leaves the message in the queue for later (the model is loading, the runtime restarts).
    pub async fn retry_later(&self, envelope: Envelope) {
        let delay = self.nak_delay * u32::try_from(envelope.delivered.max(1)).unwrap_or(1);
        self.ack(&envelope, AckKind::Nak(Some(delay))).await;
    }

    pub async fn expire(&self, envelope: Envelope) {
        tracing::info!(request_id = %envelope.request_id, "deadline passed before processing");
        let error = ErrorBody::new(
            "DEADLINE_EXCEEDED",
            "the request's deadline passed before a worker could run it",
            false,
        );
        let reply = ReplyMessage::error(&envelope.request_id, error);
        self.reply(&envelope, &reply).await;
        self.ack(&envelope, AckKind::Term).await;
    }

    /// A processing failure: retried until the last delivery, then dead-lettered. Payloads
    /// that can never succeed go to the DLQ at once.
    pub async fn fail(&self, envelope: Envelope, error: &Error) {
        if matches!(error, Error::BadPayload(_)) || self.is_last_delivery(&envelope) {
            self.dead_letter(envelope, error).await;
        } else {
            tracing::warn!(
                request_id = %envelope.request_id,
                delivered = envelope.delivered,
                error = %error,
                "request failed; will retry"
            );
            self.retry_later(envelope).await;
        }
    }

    /// Copies the original message plus the last error to `dlq.<task>`, tells the requester,
    /// and terminates the message.
    pub async fn dead_letter(&self, envelope: Envelope, error: &Error) {
        let body = error.to_body();
        match self.publish_dlq(&envelope, &body).await {
            Ok(()) => {
                tracing::warn!(
                    request_id = %envelope.request_id,
                    delivered = envelope.delivered,
                    error = %error,
                    "request dead-lettered"
                );
                let mut final_error = body;
                final_error.retryable = false;
                let reply = ReplyMessage::error(&envelope.request_id, final_error);
                self.reply(&envelope, &reply).await;
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
        headers.insert(HEADER_ERROR, summary.replace(['\r', '\n'], " ").as_str());
        let ack = self
            .js
            .publish_with_headers(
                format!("dlq.{}", self.task),
                headers,
                envelope.msg.payload.clone(),
            )
            .await
            .map_err(Error::nats("publish to DLQ"))?;
        ack.await.map_err(Error::nats("DLQ publish ack"))?;
        Ok(())
    }
}
