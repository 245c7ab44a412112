//! Serves any [`Backend`] over the socket protocol (docs/protocol.md), the server side of what
//! `runtime::socket` is the client of. `taskfleet-sidecar --serve-socket PATH` runs this instead
//! of joining the fleet: the eval harness scores a candidate *through* the Candle or HTTP
//! runtime this way, with exactly the code that serves it, and the tests reach them this way.

use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;
use tokio::io::AsyncWriteExt;
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use super::{Backend, Terms};
use crate::error::{Error, Result};
use crate::protocol::{
    self, frame, read_frame, ClassifyReply, Code, ErrorBody, ErrorReply, HelloReply, InferReply,
    MemoryReply, Request, ScoreReply, ShutdownReply, StatsReply, PROTOCOL_VERSION,
};

/// The Python runtime's own limit; larger frames end the connection.
const MAX_REQUEST_BYTES: u32 = 64 * 1024 * 1024;
const OPS: [&str; 8] = [
    "hello", "load", "unload", "infer", "score", "classify", "stats", "shutdown",
];

/// Accepts connections on `socket` until `shutdown` (or a `shutdown` request).
pub async fn serve(
    backend: Arc<dyn Backend>,
    socket: &Path,
    shutdown: CancellationToken,
) -> Result<()> {
    let _ = std::fs::remove_file(socket);
    let listener = UnixListener::bind(socket)?;
    let info = backend.info();
    tracing::info!(socket = %socket.display(), runtime = %info.runtime, "serving the runtime");
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, _) = accepted?;
                tokio::spawn(connection(backend.clone(), stream, shutdown.clone()));
            }
            _ = shutdown.cancelled() => break,
        }
    }
    let _ = std::fs::remove_file(socket);
    Ok(())
}

async fn connection(backend: Arc<dyn Backend>, stream: UnixStream, shutdown: CancellationToken) {
    let (mut reader, writer) = stream.into_split();
    let writer = Arc::new(Mutex::new(writer));
    loop {
        let body = tokio::select! {
            body = read_frame(&mut reader, MAX_REQUEST_BYTES) => body,
            _ = shutdown.cancelled() => return,
        };
        match body {
            Ok(Some(body)) => {
                tokio::spawn(answer(
                    backend.clone(),
                    body,
                    writer.clone(),
                    shutdown.clone(),
                ));
            }
            Ok(None) => return,
            Err(e) => {
                // A framing error: say so (id 0, the id could not be read) and hang up.
                let error = ErrorBody::new(Code::BadRequest, &e.to_string());
                write(&writer, &error_reply(0, error)).await;
                return;
            }
        }
    }
}

#[derive(Deserialize)]
struct Head {
    #[serde(default)]
    id: u64,
    #[serde(default)]
    op: Option<String>,
}

async fn answer(
    backend: Arc<dyn Backend>,
    body: Vec<u8>,
    writer: Arc<Mutex<OwnedWriteHalf>>,
    shutdown: CancellationToken,
) {
    let request = match protocol::decode::<Request>(&body) {
        Ok(request) => request,
        Err(e) => {
            let head = protocol::decode::<Head>(&body).unwrap_or(Head { id: 0, op: None });
            let error = match head.op {
                Some(op) if !OPS.contains(&op.as_str()) => {
                    ErrorBody::new(Code::UnknownOp, &format!("unknown op {op:?}"))
                }
                _ => ErrorBody::new(Code::BadRequest, &e.to_string()),
            };
            write(&writer, &error_reply(head.id, error)).await;
            return;
        }
    };
    let id = request.id();
    let reply = match handle(backend.as_ref(), request).await {
        Ok(reply) => reply,
        Err(e) => protocol::encode(&error_reply_body(id, &e)),
    };
    match reply {
        Ok(bytes) => write_bytes(&writer, &bytes).await,
        Err(e) => tracing::error!(id, error = %e, "cannot encode a reply"),
    }
    if shutdown_requested(&body) {
        tracing::info!("shutdown requested");
        shutdown.cancel();
    }
}

fn shutdown_requested(body: &[u8]) -> bool {
    matches!(protocol::decode::<Request>(body), Ok(Request::Shutdown(_)))
}

/// Runs one request on the backend; the encoded reply, or the error to answer with.
async fn handle(backend: &dyn Backend, request: Request) -> Result<Result<Vec<u8>>> {
    let bytes = match request {
        Request::Hello(hello) => {
            if hello.protocol != PROTOCOL_VERSION {
                return Err(protocol_error(format!(
                    "protocol {} is not supported; this runtime speaks {PROTOCOL_VERSION}",
                    hello.protocol
                )));
            }
            let info = backend.info();
            protocol::encode(&HelloReply {
                id: hello.id,
                ok: true,
                protocol: PROTOCOL_VERSION,
                runtime: info.runtime,
                runtime_version: info.version,
                capabilities: info.capabilities,
            })
        }
        Request::Load(load) => {
            let (id, model_key) = (load.id, load.model_key.clone());
            let memory_bytes = backend.load(load).await?;
            protocol::encode(&MemoryReply {
                id,
                ok: true,
                model_key,
                memory_bytes,
            })
        }
        Request::Unload(unload) => {
            let memory_bytes = backend.unload(&unload.model_key).await?;
            protocol::encode(&MemoryReply {
                id: unload.id,
                ok: true,
                model_key: unload.model_key,
                memory_bytes,
            })
        }
        Request::Infer(infer) => {
            let results = backend
                .infer(
                    infer.batch_id.clone(),
                    infer.items,
                    Terms {
                        deadline_ms: infer.deadline_ms,
                        background: infer.background,
                    },
                )
                .await?;
            protocol::encode(&InferReply {
                id: infer.id,
                ok: true,
                batch_id: infer.batch_id,
                results,
            })
        }
        Request::Score(score) => {
            let results = backend
                .score(
                    score.batch_id.clone(),
                    score.items,
                    Terms {
                        deadline_ms: score.deadline_ms,
                        background: score.background,
                    },
                )
                .await?;
            protocol::encode(&ScoreReply {
                id: score.id,
                ok: true,
                batch_id: score.batch_id,
                results,
            })
        }
        Request::Classify(classify) => {
            let results = backend
                .classify(
                    classify.batch_id.clone(),
                    classify.items,
                    Terms {
                        deadline_ms: classify.deadline_ms,
                        background: classify.background,
                    },
                )
                .await?;
            protocol::encode(&ClassifyReply {
                id: classify.id,
                ok: true,
                batch_id: classify.batch_id,
                results,
            })
        }
        Request::Stats(stats) => {
            let current = backend.stats().await?;
            protocol::encode(&StatsReply {
                id: stats.id,
                ok: true,
                memory_bytes: current.memory_bytes,
                models: current.models,
                queue_depth: current.queue_depth,
            })
        }
        Request::Shutdown(bare) => protocol::encode(&ShutdownReply {
            id: bare.id,
            ok: true,
        }),
    };
    Ok(bytes)
}

fn protocol_error(message: String) -> Error {
    Error::Runtime(ErrorBody::new(Code::BadRequest, &message))
}

fn error_reply(id: u64, error: ErrorBody) -> ErrorReply {
    ErrorReply {
        id,
        ok: false,
        error,
    }
}

fn error_reply_body(id: u64, error: &Error) -> ErrorReply {
    error_reply(id, error.to_body())
}

async fn write(writer: &Mutex<OwnedWriteHalf>, reply: &ErrorReply) {
    match protocol::encode(reply) {
        Ok(bytes) => write_bytes(writer, &bytes).await,
        Err(e) => tracing::error!(error = %e, "cannot encode an error reply"),
    }
}

async fn write_bytes(writer: &Mutex<OwnedWriteHalf>, body: &[u8]) {
    let framed = match frame(body) {
        Ok(framed) => framed,
        Err(e) => return tracing::error!(error = %e, "reply too large"),
    };
    if let Err(e) = writer.lock().await.write_all(&framed).await {
        tracing::debug!(error = %e, "client went away before its reply");
    }
}
