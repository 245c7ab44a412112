//! The socket runtime: a model runtime in another process (the PyTorch runtime, or anything
//! else that speaks docs/protocol.md) reached over a Unix socket. Frames are a 4-byte big-endian
//! length followed by one msgpack map. Requests carry ids; replies may come in any order and are
//! matched to their request by id. The supervisor (`runtime::supervisor`) owns the process.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use serde::de::DeserializeOwned;
use tokio::io::AsyncWriteExt;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::{unsupported, Backend, RuntimeInfo, RuntimeStats, Terms, CAP_CLASSIFY, CAP_SCORE};
use crate::error::{Error, Result};
use crate::protocol::{
    self, frame, read_frame, BareRequest, ClassifyItem, ClassifyReply, ClassifyRequest, Embeddings,
    ErrorReply, HelloReply, HelloRequest, InferItem, InferReply, InferRequest, LoadReply,
    LoadRequest, Probabilities, ReplyHead, Request, ScoreItem, ScoreReply, ScoreRequest, Scores,
    ShutdownReply, StatsReply, UnloadReply, UnloadRequest, MAX_FRAME_BYTES, PROTOCOL_VERSION,
};

type Waiters = HashMap<u64, oneshot::Sender<Vec<u8>>>;

pub struct RuntimeClient {
    writer: tokio::sync::Mutex<OwnedWriteHalf>,
    waiters: Arc<Mutex<Waiters>>,
    next_id: AtomicU64,
    closed: CancellationToken,
}

impl RuntimeClient {
    pub async fn connect(socket: &Path) -> Result<Arc<Self>> {
        let stream = UnixStream::connect(socket).await?;
        let (reader, writer) = stream.into_split();
        let client = Arc::new(Self {
            writer: tokio::sync::Mutex::new(writer),
            waiters: Arc::new(Mutex::new(HashMap::new())),
            // Id 0 is what the runtime uses for replies to frames whose id it could not read.
            next_id: AtomicU64::new(1),
            closed: CancellationToken::new(),
        });
        tokio::spawn(read_replies(
            reader,
            client.waiters.clone(),
            client.closed.clone(),
        ));
        Ok(client)
    }

    /// Resolves once the connection is gone (runtime exited or broke the protocol).
    pub async fn closed(&self) {
        self.closed.cancelled().await
    }

    pub fn is_closed(&self) -> bool {
        self.closed.is_cancelled()
    }

    pub fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Sends one request and waits for the reply with its id; `ok: false` becomes
    /// `Error::Runtime`.
    pub async fn call<T: DeserializeOwned>(&self, request: Request) -> Result<T> {
        let id = request.id();
        let frame = frame(&protocol::encode(&request)?)?;
        let (tx, rx) = oneshot::channel();
        if self.is_closed() {
            return Err(Error::RuntimeUnavailable("runtime socket is closed".into()));
        }
        self.waiters.lock().expect("waiters lock").insert(id, tx);
        let written = self.writer.lock().await.write_all(&frame).await;
        if let Err(e) = written {
            self.waiters.lock().expect("waiters lock").remove(&id);
            return Err(Error::RuntimeUnavailable(format!(
                "writing {}: {e}",
                request.op()
            )));
        }
        let reply = rx.await.map_err(|_| {
            Error::RuntimeUnavailable(format!(
                "runtime closed before replying to {}",
                request.op()
            ))
        })?;
        let head: ReplyHead = protocol::decode(&reply)?;
        if !head.ok {
            let failed: ErrorReply = protocol::decode(&reply)?;
            return Err(Error::Runtime(failed.error));
        }
        protocol::decode(&reply)
    }

    pub async fn hello(&self) -> Result<HelloReply> {
        let reply: HelloReply = self
            .call(Request::Hello(HelloRequest {
                id: self.next_id(),
                protocol: PROTOCOL_VERSION,
                client: format!("taskfleet-sidecar {}", env!("CARGO_PKG_VERSION")),
            }))
            .await?;
        if reply.protocol != PROTOCOL_VERSION {
            return Err(Error::Protocol(format!(
                "runtime speaks protocol {}, the sidecar speaks {PROTOCOL_VERSION}",
                reply.protocol
            )));
        }
        Ok(reply)
    }

    pub async fn load(&self, mut request: LoadRequest) -> Result<LoadReply> {
        request.id = self.next_id();
        self.call(Request::Load(request)).await
    }

    pub async fn unload(&self, model_key: &str) -> Result<UnloadReply> {
        let id = self.next_id();
        let model_key = model_key.to_string();
        self.call(Request::Unload(UnloadRequest { id, model_key }))
            .await
    }

    /// Runs a batch; a runtime that has not started it by `terms.deadline_ms` drops it unrun.
    pub async fn infer(
        &self,
        batch_id: String,
        items: Vec<InferItem>,
        terms: Terms,
    ) -> Result<InferReply> {
        let count = items.len();
        let id = self.next_id();
        let reply: InferReply = self
            .call(Request::Infer(InferRequest {
                id,
                batch_id,
                items,
                deadline_ms: terms.deadline_ms,
                background: terms.background,
            }))
            .await?;
        if reply.results.len() != count {
            return Err(Error::Protocol(format!(
                "infer of {count} items returned {} results",
                reply.results.len()
            )));
        }
        Ok(reply)
    }

    /// Scores per item (one per passage); checks that every item got its scores.
    pub async fn score(
        &self,
        batch_id: String,
        items: Vec<ScoreItem>,
        terms: Terms,
    ) -> Result<ScoreReply> {
        let expected: Vec<usize> = items.iter().map(|i| i.passages.len()).collect();
        let id = self.next_id();
        let reply: ScoreReply = self
            .call(Request::Score(ScoreRequest {
                id,
                batch_id,
                items,
                deadline_ms: terms.deadline_ms,
                background: terms.background,
            }))
            .await?;
        let got: Vec<usize> = reply.results.iter().map(|r| r.count as usize).collect();
        if got != expected
            || reply
                .results
                .iter()
                .any(|r| r.scores.len() != 4 * r.count as usize)
        {
            return Err(Error::Protocol(format!(
                "score of {expected:?} passages returned {got:?} scores"
            )));
        }
        Ok(reply)
    }

    /// Label probabilities per item; checks the shape of every result.
    pub async fn classify(
        &self,
        batch_id: String,
        items: Vec<ClassifyItem>,
        terms: Terms,
    ) -> Result<ClassifyReply> {
        let expected: Vec<usize> = items.iter().map(|i| i.texts.len()).collect();
        let id = self.next_id();
        let reply: ClassifyReply = self
            .call(Request::Classify(ClassifyRequest {
                id,
                batch_id,
                items,
                deadline_ms: terms.deadline_ms,
                background: terms.background,
            }))
            .await?;
        let got: Vec<usize> = reply.results.iter().map(|r| r.count as usize).collect();
        let sized = reply
            .results
            .iter()
            .all(|r| r.probabilities.len() == 4 * r.count as usize * r.labels.len());
        if got != expected || !sized {
            return Err(Error::Protocol(format!(
                "classify of {expected:?} texts returned {got:?} rows"
            )));
        }
        Ok(reply)
    }

    pub async fn stats(&self) -> Result<StatsReply> {
        let id = self.next_id();
        self.call(Request::Stats(BareRequest { id })).await
    }

    pub async fn shutdown(&self) -> Result<ShutdownReply> {
        let id = self.next_id();
        self.call(Request::Shutdown(BareRequest { id })).await
    }
}

/// Routes each reply frame to the waiter of its id. When the stream ends or breaks, all
/// waiters are dropped, which fails their calls with `RuntimeUnavailable`.
async fn read_replies(
    mut reader: OwnedReadHalf,
    waiters: Arc<Mutex<Waiters>>,
    closed: CancellationToken,
) {
    let end = loop {
        match read_frame(&mut reader, MAX_FRAME_BYTES).await {
            Ok(Some(frame)) => match protocol::decode::<ReplyHead>(&frame) {
                Ok(head) => {
                    let waiter = waiters.lock().expect("waiters lock").remove(&head.id);
                    match waiter {
                        Some(tx) => {
                            let _ = tx.send(frame);
                        }
                        None => tracing::warn!(id = head.id, ok = head.ok, "reply to no request"),
                    }
                }
                Err(e) => break format!("reply without id/ok: {e}"),
            },
            Ok(None) => break "runtime closed the socket".to_string(),
            Err(e) => break e.to_string(),
        }
    };
    tracing::warn!(reason = %end, "runtime connection ended");
    closed.cancel();
    waiters.lock().expect("waiters lock").clear();
}

/// A connected socket runtime behind the [`Backend`] trait; `info` is what its `hello` said.
pub struct SocketRuntime {
    pub client: Arc<RuntimeClient>,
    info: RuntimeInfo,
}

impl SocketRuntime {
    /// Says `hello` and keeps what the runtime reported.
    pub async fn hello(client: Arc<RuntimeClient>) -> Result<Self> {
        let hello = client.hello().await?;
        let info = RuntimeInfo {
            runtime: hello.runtime,
            version: hello.runtime_version,
            capabilities: hello.capabilities,
        };
        Ok(Self { client, info })
    }
}

#[async_trait]
impl Backend for SocketRuntime {
    fn info(&self) -> RuntimeInfo {
        self.info.clone()
    }

    async fn health(&self) -> Result<()> {
        if self.client.is_closed() {
            return Err(Error::RuntimeUnavailable("runtime socket is closed".into()));
        }
        Ok(())
    }

    async fn load(&self, request: LoadRequest) -> Result<u64> {
        Ok(self.client.load(request).await?.memory_bytes)
    }

    async fn unload(&self, model_key: &str) -> Result<u64> {
        Ok(self.client.unload(model_key).await?.memory_bytes)
    }

    async fn infer(
        &self,
        batch_id: String,
        items: Vec<InferItem>,
        terms: Terms,
    ) -> Result<Vec<Embeddings>> {
        Ok(self.client.infer(batch_id, items, terms).await?.results)
    }

    async fn score(
        &self,
        batch_id: String,
        items: Vec<ScoreItem>,
        terms: Terms,
    ) -> Result<Vec<Scores>> {
        if !self.info.can(CAP_SCORE) {
            return Err(unsupported(&self.info, CAP_SCORE));
        }
        Ok(self.client.score(batch_id, items, terms).await?.results)
    }

    async fn classify(
        &self,
        batch_id: String,
        items: Vec<ClassifyItem>,
        terms: Terms,
    ) -> Result<Vec<Probabilities>> {
        if !self.info.can(CAP_CLASSIFY) {
            return Err(unsupported(&self.info, CAP_CLASSIFY));
        }
        Ok(self.client.classify(batch_id, items, terms).await?.results)
    }

    async fn stats(&self) -> Result<RuntimeStats> {
        let stats = self.client.stats().await?;
        Ok(RuntimeStats {
            memory_bytes: stats.memory_bytes,
            models: stats.models,
            queue_depth: stats.queue_depth,
        })
    }
}
