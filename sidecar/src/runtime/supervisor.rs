//! Keeps one runtime connected: either spawns the runtime process (and restarts it when it
//! dies) or attaches to a socket someone else serves (and reconnects when it drops).
//! Every successful connection gets a new generation number so that the residency manager
//! knows to load its models again after a restart.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::RuntimeClient;
use crate::error::{Error, Result};
use crate::protocol::HelloReply;

#[derive(Debug, Clone)]
pub enum RuntimeMode {
    /// Start `command` (with `{socket}` replaced by the socket path) and keep it running.
    Spawn { command: String, socket: PathBuf },
    /// Connect to a runtime that is started and owned elsewhere.
    Attach { socket: PathBuf },
}

#[derive(Clone)]
pub struct Connected {
    pub client: Arc<RuntimeClient>,
    pub generation: u64,
    pub hello: HelloReply,
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

    /// The connected client, or `RuntimeUnavailable` while the runtime is (re)starting.
    pub fn client(&self) -> Result<Arc<RuntimeClient>> {
        match &*self.current.borrow() {
            Some(c) if !c.client.is_closed() => Ok(c.client.clone()),
            _ => Err(Error::RuntimeUnavailable("runtime is starting".into())),
        }
    }

    /// Waits until a runtime is connected.
    pub async fn connected(&self) -> Connected {
        let mut rx = self.subscribe();
        let connected = rx
            .wait_for(|c| c.as_ref().is_some_and(|c| !c.client.is_closed()))
            .await
            .expect("the sender lives in self");
        connected.clone().expect("checked by wait_for")
    }

    /// The runtime kinds reported by hello (for heartbeats).
    pub fn runtimes(&self) -> Vec<String> {
        self.current
            .borrow()
            .as_ref()
            .map(|c| vec![c.hello.runtime.clone()])
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
        self.publish(connected.0, connected.1, generation);
        let client = self.client()?;
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
        self.publish(connected.0, connected.1, generation);
        let client = self.client()?;
        tokio::select! {
            _ = client.closed() => {}
            _ = shutdown.cancelled() => {}
        }
        Ok(())
    }

    fn publish(&self, client: Arc<RuntimeClient>, hello: HelloReply, generation: &mut u64) {
        *generation += 1;
        tracing::info!(
            generation = *generation,
            runtime = %hello.runtime,
            version = %hello.runtime_version,
            capabilities = ?hello.capabilities,
            "runtime ready"
        );
        self.current.send_replace(Some(Connected {
            client,
            generation: *generation,
            hello,
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
) -> Result<(Arc<RuntimeClient>, HelloReply)> {
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
            Ok(client) => {
                let hello = client.hello().await?;
                return Ok((client, hello));
            }
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
