//! Keeps one runtime available: spawns a socket runtime's process (and restarts it when it
//! dies), attaches to a socket someone else serves (and reconnects when it drops), or holds an
//! in-process backend (Candle, HTTP) and withdraws it while its health check fails.
//! Every time a backend becomes available it gets a new generation number, so that the
//! residency manager knows to load its models again after a restart.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::socket::{RuntimeClient, SocketRuntime};
use super::{Backend, RuntimeInfo};
use crate::error::{Error, Result};

/// How often an in-process backend's health is checked while it serves.
const HEALTH_EVERY: Duration = Duration::from_secs(2);

#[derive(Clone)]
pub enum RuntimeMode {
    /// Start `command` (with `{socket}` replaced by the socket path) and keep it running.
    Spawn { command: String, socket: PathBuf },
    /// Connect to a runtime that is started and owned elsewhere.
    Attach { socket: PathBuf },
    /// A backend inside the sidecar (Candle) or reached by it directly (HTTP).
    InProcess(Arc<dyn Backend>),
}

impl std::fmt::Debug for RuntimeMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RuntimeMode::Spawn { command, socket } => f
                .debug_struct("Spawn")
                .field("command", command)
                .field("socket", socket)
                .finish(),
            RuntimeMode::Attach { socket } => {
                f.debug_struct("Attach").field("socket", socket).finish()
            }
            RuntimeMode::InProcess(backend) => f
                .debug_tuple("InProcess")
                .field(&backend.info().runtime)
                .finish(),
        }
    }
}

#[derive(Clone)]
pub struct Connected {
    pub backend: Arc<dyn Backend>,
    pub generation: u64,
    pub info: RuntimeInfo,
}

/// The handle the rest of the sidecar uses to reach the current runtime.
pub struct Runtime {
    current: watch::Sender<Option<Connected>>,
}

impl Runtime {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            current: watch::Sender::new(None),
        })
    }

    pub fn subscribe(&self) -> watch::Receiver<Option<Connected>> {
        self.current.subscribe()
    }

    /// The available backend, or `RuntimeUnavailable` while the runtime is (re)starting.
    pub fn backend(&self) -> Result<Arc<dyn Backend>> {
        match &*self.current.borrow() {
            Some(c) => Ok(c.backend.clone()),
            None => Err(Error::RuntimeUnavailable("runtime is starting".into())),
        }
    }

    /// Waits until a backend is available.
    pub async fn connected(&self) -> Connected {
        let mut rx = self.subscribe();
        let connected = rx
            .wait_for(|c| c.is_some())
            .await
            .expect("the sender lives in self");
        connected.clone().expect("checked by wait_for")
    }

    /// The runtime kinds available now (for heartbeats).
    pub fn runtimes(&self) -> Vec<String> {
        self.current
            .borrow()
            .as_ref()
            .map(|c| vec![c.info.runtime.clone()])
            .unwrap_or_default()
    }

    /// Runs until `shutdown`; then asks a runtime it started to shut down.
    pub async fn supervise(
        self: Arc<Self>,
        mode: RuntimeMode,
        start_timeout: Duration,
        shutdown: CancellationToken,
    ) {
        let mut generation = 0;
        let mut backoff = Duration::from_millis(500);
        while !shutdown.is_cancelled() {
            let started = Instant::now();
            let outcome = match &mode {
                RuntimeMode::Spawn { command, socket } => {
                    self.run_spawned(command, socket, start_timeout, &mut generation, &shutdown)
                        .await
                }
                RuntimeMode::Attach { socket } => {
                    self.run_attached(socket, start_timeout, &mut generation, &shutdown)
                        .await
                }
                RuntimeMode::InProcess(backend) => {
                    self.run_in_process(backend, &mut generation, &shutdown)
                        .await
                }
            };
            self.current.send_replace(None);
            if shutdown.is_cancelled() {
                break;
            }
            crate::metrics::metrics().runtime_restarts.inc(&[]);
            match outcome {
                Ok(()) => tracing::warn!("runtime went away; restarting"),
                Err(e) => tracing::error!(error = %e, "runtime failed; restarting"),
            }
            // A runtime that ran a while earns a quick restart; a crash loop backs off.
            if started.elapsed() > Duration::from_secs(30) {
                backoff = Duration::from_millis(500);
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = shutdown.cancelled() => break,
            }
            backoff = (backoff * 2).min(Duration::from_secs(10));
        }
    }

    async fn run_spawned(
        &self,
        command: &str,
        socket: &Path,
        start_timeout: Duration,
        generation: &mut u64,
        shutdown: &CancellationToken,
    ) -> Result<()> {
        let _ = std::fs::remove_file(socket);
        let mut child = spawn(command, socket)?;
        tracing::info!(pid = child.id(), command, "runtime process started");
        let connected = tokio::select! {
            c = connect_when_ready(socket, start_timeout, Some(&mut child)) => c?,
            _ = shutdown.cancelled() => {
                let _ = child.kill().await;
                return Ok(());
            }
        };
        let client = connected.client.clone();
        self.publish(Arc::new(connected), generation);
        tokio::select! {
            status = child.wait() => {
                tracing::warn!(status = ?status, "runtime process exited");
            }
            _ = client.closed() => {
                tracing::warn!("runtime socket closed; killing the process");
                let _ = child.kill().await;
            }
            _ = shutdown.cancelled() => {
                stop_child(&client, &mut child).await;
            }
        }
        Ok(())
    }

    async fn run_attached(
        &self,
        socket: &Path,
        start_timeout: Duration,
        generation: &mut u64,
        shutdown: &CancellationToken,
    ) -> Result<()> {
        let connected = tokio::select! {
            c = connect_when_ready(socket, start_timeout, None) => c?,
            _ = shutdown.cancelled() => return Ok(()),
        };
        let client = connected.client.clone();
        self.publish(Arc::new(connected), generation);
        tokio::select! {
            _ = client.closed() => {}
            _ = shutdown.cancelled() => {}
        }
        Ok(())
    }

    /// Serves with an in-process backend while it is healthy; returns when it stops being so.
    async fn run_in_process(
        &self,
        backend: &Arc<dyn Backend>,
        generation: &mut u64,
        shutdown: &CancellationToken,
    ) -> Result<()> {
        backend.health().await?;
        self.publish(backend.clone(), generation);
        loop {
            tokio::select! {
                _ = tokio::time::sleep(HEALTH_EVERY) => {}
                _ = shutdown.cancelled() => return Ok(()),
            }
            backend.health().await?;
        }
    }

    fn publish(&self, backend: Arc<dyn Backend>, generation: &mut u64) {
        *generation += 1;
        let info = backend.info();
        tracing::info!(
            generation = *generation,
            runtime = %info.runtime,
            version = %info.version,
            capabilities = ?info.capabilities,
            "runtime ready"
        );
        self.current.send_replace(Some(Connected {
            backend,
            generation: *generation,
            info,
        }));
    }
}

fn spawn(command: &str, socket: &std::path::Path) -> Result<Child> {
    let socket_str = socket.to_string_lossy();
    let line = command.replace("{socket}", &socket_str);
    let words = shlex::split(&line)
        .filter(|w| !w.is_empty())
        .ok_or_else(|| Error::Config(format!("cannot parse runtime command {command:?}")))?;
    let mut cmd = Command::new(&words[0]);
    cmd.args(&words[1..])
        .env("TASKFLEET_RUNTIME_SOCKET", socket)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    cmd.spawn()
        .map_err(|e| Error::Config(format!("cannot start runtime {:?}: {e}", words[0])))
}

/// Polls the socket until it accepts a connection and answers `hello`.
async fn connect_when_ready(
    socket: &std::path::Path,
    timeout: Duration,
    mut child: Option<&mut Child>,
) -> Result<SocketRuntime> {
    let deadline = Instant::now() + timeout;
    let mut last_error = String::from("socket not there yet");
    while Instant::now() < deadline {
        if let Some(child) = child.as_deref_mut() {
            if let Some(status) = child.try_wait()? {
                return Err(Error::RuntimeUnavailable(format!(
                    "runtime exited during start-up with {status}"
                )));
            }
        }
        match RuntimeClient::connect(socket).await {
            Ok(client) => return SocketRuntime::hello(client).await,
            Err(e) => last_error = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(Error::RuntimeUnavailable(format!(
        "no runtime at {} after {timeout:?}: {last_error}",
        socket.display()
    )))
}

/// Asks the runtime to exit, then kills it if it does not within a few seconds.
async fn stop_child(client: &RuntimeClient, child: &mut Child) {
    match tokio::time::timeout(Duration::from_secs(5), client.shutdown()).await {
        Ok(Ok(_)) => tracing::info!("runtime acknowledged shutdown"),
        Ok(Err(e)) => tracing::warn!(error = %e, "runtime shutdown request failed"),
        Err(_) => tracing::warn!("runtime did not answer shutdown"),
    }
    match tokio::time::timeout(Duration::from_secs(10), child.wait()).await {
        Ok(status) => tracing::info!(status = ?status, "runtime process exited"),
        Err(_) => {
            tracing::warn!("runtime did not exit; killing it");
            let _ = child.kill().await;
        }
    }
}
