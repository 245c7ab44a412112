//! The one error type of the sidecar. Inner code returns precise variants; the worker turns
//! them into the public error shape (`ErrorBody`) at the edge, when it replies to a request.

use crate::protocol::{Code, ErrorBody};

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A NATS or JetStream operation failed; `context` says which one.
    #[error("nats: {context}: {source}")]
    Nats {
        context: String,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error("msgpack encode: {0}")]
    Encode(#[from] rmp_serde::encode::Error),
    #[error("msgpack decode: {0}")]
    Decode(#[from] rmp_serde::decode::Error),
    /// The runtime answered an op with `ok: false`.
    #[error("runtime error {}: {}", .0.code, .0.message)]
    Runtime(ErrorBody),
    /// The runtime is not running or its socket closed while a request was in flight.
    #[error("runtime unavailable: {0}")]
    RuntimeUnavailable(String),
    /// The external engine or API behind the http runtime is down, timed out or overloaded.
    /// Every worker would fail alike, so the request is answered at once, retryable, instead
    /// of being retried here until its deadline.
    #[error("engine unavailable: {0}")]
    EngineUnavailable(String),
    /// The runtime broke the socket protocol (oversized frame, reply without id, ...).
    #[error("runtime protocol violation: {0}")]
    Protocol(String),
    /// A queue message that can never be processed (undecodable payload, missing input ref).
    #[error("bad request payload: {0}")]
    BadPayload(String),
    /// A computed reply could not be handed to NATS (nor its embeddings to the object store).
    #[error("reply undeliverable: {0}")]
    ReplyUndeliverable(String),
    #[error("configuration: {0}")]
    Config(String),
    #[cfg(feature = "candle")]
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
}

impl Error {
    /// Wraps any NATS client error with a short description of what was attempted.
    pub fn nats<E>(context: impl Into<String>) -> impl FnOnce(E) -> Error
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        let context = context.into();
        move |source| Error::Nats {
            context,
            source: Box::new(source),
        }
    }

    /// The public error shape for a reply to the requester, retryable as contract/shared.toml
    /// declares its code (a runtime's own body as it said).
    pub fn to_body(&self) -> ErrorBody {
        match self {
            Error::Runtime(body) => body.clone(),
            Error::BadPayload(message) => ErrorBody::new(Code::BadRequest, message),
            Error::RuntimeUnavailable(message) | Error::EngineUnavailable(message) => {
                ErrorBody::new(Code::RuntimeUnavailable, message)
            }
            Error::ReplyUndeliverable(message) => ErrorBody::new(Code::ReplyUndeliverable, message),
            other => ErrorBody::new(Code::Internal, &other.to_string()),
        }
    }

    /// Whether trying the same message again later may succeed.
    pub fn is_retryable(&self) -> bool {
        self.to_body().retryable
    }
}
