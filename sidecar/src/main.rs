//! `taskfleet-sidecar`: the worker agent. See `--help` for every setting.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use clap::Parser;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use taskfleet_sidecar::artifacts::{ArtifactCache, Source};
use taskfleet_sidecar::heartbeat::{self, host_name, Heartbeat};
use taskfleet_sidecar::metrics::{metrics, server as metrics_server};
use taskfleet_sidecar::protocol::Code;
use taskfleet_sidecar::residency::Residency;
use taskfleet_sidecar::runtime::http::{HttpConfig, HttpRuntime};
use taskfleet_sidecar::runtime::supervisor::{Runtime, RuntimeMode};
use taskfleet_sidecar::runtime::{serve, Backend};
use taskfleet_sidecar::s3::S3Source;
use taskfleet_sidecar::worker::{WorkerConfig, Workers};
use taskfleet_sidecar::{contract, members, nats, Error, Result};

/// `--version` names the runtimes built in: `taskfleet up` reads it before it starts workers.
#[cfg(feature = "candle")]
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (runtimes: torch, candle, http)"
);
#[cfg(not(feature = "candle"))]
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (runtimes: torch, http)");

/// The taskfleet worker agent: pulls task requests from NATS JetStream, batches them by
/// tokens, runs them on its model runtime and publishes the results. The runtime is one of:
/// `torch` (a Python process over a Unix socket), `candle` (inside this binary, when built with
/// the `candle` feature) or `http` (an OpenAI-compatible embeddings engine). A worker serves
/// only the placements that name its runtime.
///
/// Every flag can also be set by the environment variable named after it.
#[derive(Debug, Parser)]
#[command(name = "taskfleet-sidecar", version = VERSION)]
struct Cli {
    /// NATS server URL(s), comma-separated for a cluster; the sidecar keeps retrying until one
    /// is reachable, and reconnects (to any node it knows, also those the server announces).
    #[arg(
        long,
        env = "TASKFLEET_NATS_URL",
        default_value = "nats://127.0.0.1:4222"
    )]
    nats_url: String,

    /// NATS user; its password comes from TASKFLEET_NATS_PASSWORD.
    #[arg(long, env = "TASKFLEET_NATS_USER")]
    nats_user: Option<String>,

    /// NATS password (give it by environment: a flag shows in the process list).
    #[arg(
        long,
        env = "TASKFLEET_NATS_PASSWORD",
        hide_env_values = true,
        requires = "nats_user"
    )]
    nats_password: Option<String>,

    /// NATS credentials file (JWT + nkey seed).
    #[arg(long, env = "TASKFLEET_NATS_CREDS", conflicts_with = "nats_user")]
    nats_creds: Option<PathBuf>,

    /// CA certificate (PEM) to trust for NATS TLS; implies --nats-tls.
    #[arg(long, env = "TASKFLEET_NATS_TLS_CA")]
    nats_tls_ca: Option<PathBuf>,

    /// Client certificate (PEM) for NATS TLS; needs --nats-tls-key.
    #[arg(long, env = "TASKFLEET_NATS_TLS_CERT", requires = "nats_tls_key")]
    nats_tls_cert: Option<PathBuf>,

    /// The client certificate's private key (PEM).
    #[arg(long, env = "TASKFLEET_NATS_TLS_KEY", requires = "nats_tls_cert")]
    nats_tls_key: Option<PathBuf>,

    /// Require TLS to NATS.
    #[arg(long, env = "TASKFLEET_NATS_TLS")]
    nats_tls: bool,

    /// Unique id of this worker: its key in KV `workers` and the prefix of its batch ids.
    /// Default: `<host>-<pid>`.
    #[arg(long, env = "TASKFLEET_WORKER_ID")]
    worker_id: Option<String>,

    /// The runtime this worker serves with: torch, candle or http.
    #[arg(long, env = "TASKFLEET_RUNTIME", default_value = "torch")]
    runtime: String,

    /// Serve the runtime over the socket protocol at this path instead of joining the fleet
    /// (no NATS): how `taskfleet eval --runtime candle|http` scores through these runtimes.
    #[arg(long, env = "TASKFLEET_SERVE_SOCKET")]
    serve_socket: Option<PathBuf>,

    /// Token budget of one Candle forward pass (padded tokens).
    #[arg(
        long,
        env = "TASKFLEET_CANDLE_MAX_BATCH_TOKENS",
        default_value_t = 4096
    )]
    candle_max_batch_tokens: usize,

    /// http runtime: base URL of the engine's OpenAI-compatible API; requests go to
    /// `{url}/embeddings` (infinity: http://host:7997; vLLM/TEI/SGLang: http://host:port/v1).
    /// Without it the worker serves endpoint models only, each at the URL of its record.
    #[arg(long, env = "TASKFLEET_HTTP_BASE_URL")]
    http_base_url: Option<String>,

    /// http runtime: the engine's model id (default: the only model it lists).
    #[arg(long, env = "TASKFLEET_HTTP_MODEL")]
    http_model: Option<String>,

    /// http runtime: bearer token for the engine.
    #[arg(long, env = "TASKFLEET_HTTP_API_KEY", hide_env_values = true)]
    http_api_key: Option<String>,

    /// http runtime: requests in flight to the engine at once.
    #[arg(long, env = "TASKFLEET_HTTP_MAX_CONCURRENCY", default_value_t = 4)]
    http_max_concurrency: usize,

    /// http runtime: inputs per request to the engine.
    #[arg(long, env = "TASKFLEET_HTTP_MAX_BATCH", default_value_t = 64)]
    http_max_batch: usize,

    /// http runtime: connect timeout.
    #[arg(
        long,
        env = "TASKFLEET_HTTP_CONNECT_TIMEOUT_MS",
        default_value_t = 2000
    )]
    http_connect_timeout_ms: u64,

    /// http runtime: whole-request timeout; a request past it is retried later.
    #[arg(long, env = "TASKFLEET_HTTP_TIMEOUT_MS", default_value_t = 60_000)]
    http_timeout_ms: u64,

    /// torch runtime: command that starts the runtime; `{socket}` is replaced by the socket path (also given
    /// as TASKFLEET_RUNTIME_SOCKET). The sidecar restarts it when it dies and asks it to shut
    /// down on exit. Example: ".venv/bin/python -m serving.runtime.server --socket {socket}".
    #[arg(long, env = "TASKFLEET_RUNTIME_CMD")]
    runtime_cmd: Option<String>,

    /// Unix socket of the runtime. With --runtime-cmd: where the started runtime listens
    /// (default: a file in the temp dir). Without: attach to a runtime already serving there.
    #[arg(long, env = "TASKFLEET_RUNTIME_SOCKET")]
    runtime_socket: Option<PathBuf>,

    /// How long a runtime may take from start to answering `hello` (default: contract/shared.toml
    /// `[worker] runtime_start_timeout_s`).
    #[arg(
        long,
        env = "TASKFLEET_RUNTIME_START_TIMEOUT_MS",
        default_value_t = contract::declared().worker.runtime_start_timeout_ms()
    )]
    runtime_start_timeout_ms: u64,

    /// Runtime memory the models may use; idle lazy models are evicted (least recently used
    /// first) to stay under it. Pinned models always load.
    #[arg(long, env = "TASKFLEET_MEMORY_BUDGET_BYTES", default_value_t = 8 << 30)]
    memory_budget_bytes: u64,

    /// Content-addressed cache of base models and adapters (`<dir>/sha256/<digest>`): what a
    /// placement names and the cache lacks is fetched from the NATS object store `artifacts`
    /// and verified before loading. Workers on one machine may share it; it survives restarts.
    #[arg(
        long,
        env = "TASKFLEET_ARTIFACT_CACHE",
        default_value = "taskfleet-artifacts"
    )]
    artifact_cache: PathBuf,

    /// Where the control plane put the artifacts: empty for the NATS object store `artifacts`,
    /// or an S3-compatible bucket `s3://bucket/prefix` (credentials, region and endpoint from
    /// the standard AWS_* environment variables; AWS_ENDPOINT_URL for MinIO and the like).
    #[arg(long, env = "TASKFLEET_ARTIFACT_SOURCE", default_value = "")]
    artifact_source: String,

    /// Most bytes the artifact cache may hold (0: no limit). After each fetch, the least
    /// recently used artifacts that no current placement of this worker names are removed until
    /// it fits; what current placements name is kept even over the limit. Use it with a cache
    /// of this worker's own (workers sharing a cache know only their own placements).
    #[arg(long, env = "TASKFLEET_ARTIFACT_CACHE_MAX_BYTES", default_value_t = 0)]
    artifact_cache_max_bytes: u64,

    /// Token budget of one batch, counted with the model's own tokenizer (its folder's
    /// tokenizer.json; characters / 4 without one). The runtime sorts a batch by length and
    /// cuts it into forward passes that pad little (the runtime's --max-padding), so a larger budget pads
    /// less: 32768 measured 0.92-1.00x in-process throughput where 8192 gave 0.78x.
    #[arg(long, env = "TASKFLEET_MAX_BATCH_TOKENS", default_value_t = 32768)]
    max_batch_tokens: usize,

    /// How long a batch may wait for more requests after its first one arrived, while the
    /// queue holds more. A request that finds the queue empty is sent at once.
    #[arg(long, env = "TASKFLEET_MAX_BATCH_WAIT_MS", default_value_t = 5)]
    max_batch_wait_ms: u64,

    /// The machine class whose runtime profiles this worker applies (`cpu:<model> x<cores>` or
    /// `gpu:<model>`, as `taskfleet tune` recorded them; `taskfleet worker` and `taskfleet up`
    /// pass this machine's). A placement's profile of another class is never applied; without
    /// this flag none is.
    #[arg(long, env = "TASKFLEET_MACHINE_CLASS")]
    machine_class: Option<String>,

    /// Batches queued in the runtime at once; further requests stay in JetStream for other
    /// workers.
    #[arg(long, env = "TASKFLEET_MAX_INFLIGHT_BATCHES", default_value_t = 2)]
    max_inflight_batches: usize,

    /// Period of the heartbeat put into KV `workers`.
    #[arg(long, env = "TASKFLEET_HEARTBEAT_MS", default_value_t = 2000)]
    heartbeat_ms: u64,

    /// `ack_wait` of task consumers this worker creates (workers are the one role that creates
    /// them; default: contract/shared.toml's). Workers send progress acks for every message
    /// they hold three times per `ack_wait`, so it bounds how long the messages of a worker
    /// that died stay with it before JetStream redelivers them, not the batch time.
    #[arg(long, env = "TASKFLEET_ACK_WAIT_MS", default_value_t = declared_ack_wait_ms())]
    ack_wait_ms: u64,

    /// `max_deliver` of task consumers this worker creates (default: contract/shared.toml's);
    /// a request that failed that many times goes to stream DLQ.
    #[arg(long, env = "TASKFLEET_MAX_DELIVER", default_value_t = contract::declared().nats.task_consumer.max_deliver)]
    max_deliver: i64,

    /// Base delay of a nak (model loading, retryable failure); grows with the delivery count.
    #[arg(long, env = "TASKFLEET_NAK_DELAY_MS", default_value_t = 1000)]
    nak_delay_ms: u64,

    /// Print the rules this binary read from contract/shared.toml, and what it builds from
    /// them (streams, consumer, buckets, the codes it answers with), as JSON, and exit:
    /// tests/test_contract.py compares them with Python's.
    #[arg(long)]
    print_contract: bool,

    /// Serve Prometheus metrics on this address (`GET /metrics`), e.g. 0.0.0.0:9464. Port 0
    /// picks a free port (logged). Default: no metrics endpoint.
    #[arg(long, env = "TASKFLEET_METRICS_ADDR")]
    metrics_addr: Option<SocketAddr>,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,async_nats=warn".into()),
        )
        .init();
    let cli = Cli::parse();
    if cli.print_contract {
        println!("{:#}", contract_report());
        return ExitCode::SUCCESS;
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("taskfleet-sidecar: cannot start async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "sidecar stopped");
            eprintln!("taskfleet-sidecar: {e}");
            ExitCode::from(2)
        }
    }
}

fn runtime_mode(cli: &Cli, worker_id: &str) -> Result<RuntimeMode> {
    match cli.runtime.as_str() {
        "torch" => {}
        "candle" | "http" => return Ok(RuntimeMode::InProcess(in_process_backend(cli)?)),
        other => {
            return Err(Error::Config(format!(
                "unknown runtime {other:?}; known: {}",
                taskfleet_sidecar::runtime::KINDS.join(", ")
            )))
        }
    }
    match (&cli.runtime_cmd, &cli.runtime_socket) {
        (Some(command), socket) => Ok(RuntimeMode::Spawn {
            command: command.clone(),
            socket: socket.clone().unwrap_or_else(|| {
                std::env::temp_dir().join(format!("taskfleet-runtime-{worker_id}.sock"))
            }),
        }),
        (None, Some(socket)) => Ok(RuntimeMode::Attach {
            socket: socket.clone(),
        }),
        (None, None) => Err(Error::Config(
            "give --runtime-cmd (start a runtime) or --runtime-socket (attach to one)".into(),
        )),
    }
}

/// The Candle or HTTP backend the flags describe.
fn in_process_backend(cli: &Cli) -> Result<Arc<dyn Backend>> {
    if cli.runtime == "http" {
        return Ok(Arc::new(HttpRuntime::new(HttpConfig {
            base_url: cli.http_base_url.clone(),
            model: cli.http_model.clone(),
            api_key: cli.http_api_key.clone(),
            max_concurrency: cli.http_max_concurrency,
            max_batch: cli.http_max_batch,
            connect_timeout: Duration::from_millis(cli.http_connect_timeout_ms),
            request_timeout: Duration::from_millis(cli.http_timeout_ms),
        })?));
    }
    candle_backend(cli)
}

#[cfg(feature = "candle")]
fn candle_backend(cli: &Cli) -> Result<Arc<dyn Backend>> {
    let runtime =
        taskfleet_sidecar::runtime::candle::CandleRuntime::new(cli.candle_max_batch_tokens)?;
    Ok(Arc::new(runtime))
}

#[cfg(not(feature = "candle"))]
fn candle_backend(_cli: &Cli) -> Result<Arc<dyn Backend>> {
    Err(Error::Config(
        "this sidecar was built without the candle runtime; build it with \
         `cargo build --release --features candle` (what `make sidecar-candle` does)"
            .into(),
    ))
}

/// `--serve-socket`: the runtime alone, over the socket protocol, until SIGTERM or `shutdown`.
async fn serve_runtime(cli: &Cli, socket: &std::path::Path) -> Result<()> {
    let backend = match cli.runtime.as_str() {
        "candle" | "http" => in_process_backend(cli)?,
        other => {
            return Err(Error::Config(format!(
                "--serve-socket serves the candle or http runtime, not {other:?} (the torch \
                 runtime serves its own socket: python -m serving.runtime.server)"
            )))
        }
    };
    let shutdown = CancellationToken::new();
    let signalled = CancellationToken::new();
    tokio::spawn(cancel_on_signal(signalled.clone()));
    let stop = shutdown.clone();
    tokio::spawn(async move {
        signalled.cancelled().await;
        stop.cancel();
    });
    serve::serve(backend, socket, shutdown).await
}

fn declared_ack_wait_ms() -> u64 {
    let rule = &contract::declared().nats.task_consumer;
    contract::seconds(rule.ack_wait_s).as_millis() as u64
}

/// `--print-contract`: what the sidecar read and builds, in the names the server and
/// contract/__init__.py use (durations as the JetStream API writes them: nanoseconds).
fn contract_report() -> serde_json::Value {
    let declared = contract::declared();
    let kv = |rule: &contract::BucketRule| {
        let config = nats::kv_config(rule);
        serde_json::json!({
            "bucket": config.bucket,
            "history": config.history,
            "max_age": config.max_age.as_nanos() as u64,
        })
    };
    let codes: serde_json::Map<String, serde_json::Value> = Code::ALL
        .iter()
        .map(|code| {
            let value = serde_json::json!({
                "retryable": code.retryable(),
                "socket": Code::SOCKET.contains(code),
            });
            (code.as_str().to_string(), value)
        })
        .collect();
    let rule = &declared.task_name;
    let names: Vec<&String> = rule
        .examples_valid
        .iter()
        .chain(&rule.examples_invalid)
        .collect();
    let allowed: serde_json::Map<String, serde_json::Value> = names
        .into_iter()
        .map(|name| (name.clone(), rule.allows(name).into()))
        .collect();
    let consumer = nats::task_consumer_config(
        "alpha",
        std::time::Duration::from_millis(declared_ack_wait_ms()),
        declared.nats.task_consumer.max_deliver,
    );
    let replicas = [1, 2, 3, 5].map(|nodes| [nodes, nats::replicas_for(nodes)]);
    serde_json::json!({
        "contract": declared,
        "tasks_stream": nats::stream_config(&declared.nats.streams.tasks),
        "dlq_stream": nats::stream_config(&declared.nats.streams.dlq),
        "task_consumer_alpha": consumer,
        "shadow_stream": nats::stream_config(&declared.nats.streams.shadow),
        "shadow_consumer_alpha": nats::shadow_consumer_config(
            "alpha",
            std::time::Duration::from_millis(declared_ack_wait_ms()),
        ),
        "kv": {
            "placements": kv(&declared.nats.kv.placements),
            "workers": kv(&declared.nats.kv.workers),
        },
        "payloads": nats::object_store_config(&declared.nats.object_stores.payloads),
        "replicas": replicas,
        "codes": codes,
        "task_names": {"allowed": allowed, "rule": rule.describe()},
    })
}

fn validate(cli: &Cli) -> Result<()> {
    let positive = [
        ("--max-batch-tokens", cli.max_batch_tokens as u64),
        ("--max-inflight-batches", cli.max_inflight_batches as u64),
        ("--heartbeat-ms", cli.heartbeat_ms),
        ("--ack-wait-ms", cli.ack_wait_ms),
        ("--runtime-start-timeout-ms", cli.runtime_start_timeout_ms),
    ];
    for (flag, value) in positive {
        if value == 0 {
            return Err(Error::Config(format!("{flag} must be above 0")));
        }
    }
    if cli.max_deliver < 2 {
        return Err(Error::Config("--max-deliver must be at least 2".into()));
    }
    // Two beats may be missed before the declared TTL of KV `workers` drops the worker.
    let ttl = contract::declared()
        .nats
        .kv
        .workers
        .ttl_s
        .map(contract::seconds);
    if let Some(ttl) = ttl.filter(|ttl| Duration::from_millis(cli.heartbeat_ms) > *ttl / 3) {
        return Err(Error::Config(format!(
            "--heartbeat-ms must be at most a third of the workers bucket's TTL ({} ms, \
             contract/shared.toml)",
            ttl.as_millis()
        )));
    }
    Ok(())
}

async fn run(cli: Cli) -> Result<()> {
    validate(&cli)?;
    if let Some(socket) = &cli.serve_socket {
        return serve_runtime(&cli, socket).await;
    }
    let host = host_name();
    let worker_id = cli
        .worker_id
        .clone()
        .unwrap_or_else(|| format!("{host}-{}", std::process::id()));
    if !heartbeat::valid_worker_id(&worker_id) {
        return Err(Error::Config(format!(
            "worker id {worker_id:?} may hold only letters, digits, '-' and '_'"
        )));
    }
    let mode = runtime_mode(&cli, &worker_id)?;
    let s3 = match cli.artifact_source.as_str() {
        "" | "nats" => None,
        url => Some(S3Source::from_url_and_env(url).map_err(Error::Config)?),
    };
    let started_ms = taskfleet_sidecar::clock::now_ms();
    tracing::info!(%worker_id, nats_url = %cli.nats_url, ?mode, "starting");

    let signalled = CancellationToken::new();
    tokio::spawn(cancel_on_signal(signalled.clone()));
    let shutdown = CancellationToken::new();
    let runtime = Runtime::new();
    // Bound before anything else, so a taken port fails the start at once.
    let beats: Arc<OnceLock<Arc<Heartbeat>>> = Arc::default();
    if let Some(addr) = cli.metrics_addr {
        let (beats, runtime) = (beats.clone(), runtime.clone());
        let render: metrics_server::Render = Arc::new(move || {
            let snapshot = beats.get().map(|b| b.snapshot());
            metrics().render(snapshot.as_ref(), runtime.backend().is_ok())
        });
        let (bound, serving) = metrics_server::bind(addr, render, shutdown.child_token()).await?;
        tracing::info!(addr = %bound, "serving metrics on /metrics");
        tokio::spawn(serving);
    }
    let supervisor = tokio::spawn(runtime.clone().supervise(
        mode,
        Duration::from_millis(cli.runtime_start_timeout_ms),
        shutdown.child_token(),
    ));
    let access = nats::Access {
        user: cli.nats_user.clone(),
        password: cli.nats_password.clone(),
        creds: cli.nats_creds.clone(),
        tls_ca: cli.nats_tls_ca.clone(),
        tls_cert: cli.nats_tls_cert.clone(),
        tls_key: cli.nats_tls_key.clone(),
        tls: cli.nats_tls,
    };
    let name = format!("taskfleet-sidecar {worker_id}");
    let client = nats::connect(&cli.nats_url, &name, &access).await?;
    let js = async_nats::jetstream::new(client.clone());
    let source = match s3 {
        None => Source::Nats(js.clone()),
        Some(s3) => Source::S3(s3, reqwest::Client::new()),
    };
    tracing::info!(source = %source.describe(), "artifact source");
    let cache = Arc::new(
        ArtifactCache::new(cli.artifact_cache.clone(), source)
            .with_limit(cli.artifact_cache_max_bytes),
    );
    let residency = Residency::new(runtime.clone(), cli.memory_budget_bytes, cache);
    let stop_work = CancellationToken::new();
    tokio::spawn(residency.clone().follow_runtime(stop_work.clone()));
    let heartbeat_every = Duration::from_millis(cli.heartbeat_ms);
    let buckets = until_ok("KV buckets", &signalled, || async {
        let placements = nats::placements_bucket(&js).await?;
        let workers = nats::workers_bucket(&js).await?;
        Ok((placements, workers))
    })
    .await;
    let Some((placements_kv, workers_kv)) = buckets else {
        shutdown.cancel();
        let _ = supervisor.await;
        return Ok(());
    };

    let (placements_tx, placements_rx) = watch::channel(Arc::default());
    match &cli.machine_class {
        Some(class) => {
            tracing::info!(machine_class = %class, "applying runtime profiles of this class")
        }
        None => tracing::info!("no --machine-class: runtime profiles are not applied"),
    }
    let watcher = tokio::spawn(taskfleet_sidecar::placement::watch_placements(
        placements_kv,
        placements_tx,
        cli.machine_class.clone(),
        stop_work.clone(),
    ));
    let workers = Workers::new(
        client.clone(),
        residency.clone(),
        runtime.clone(),
        WorkerConfig {
            worker_id: worker_id.clone(),
            runtime: cli.runtime.clone(),
            max_batch_tokens: cli.max_batch_tokens,
            max_batch_wait: Duration::from_millis(cli.max_batch_wait_ms),
            max_inflight_batches: cli.max_inflight_batches,
            ack_wait: Duration::from_millis(cli.ack_wait_ms),
            max_deliver: cli.max_deliver,
            nak_delay: Duration::from_millis(cli.nak_delay_ms),
        },
    );
    let (members_tx, members_rx) = watch::channel(None);
    let members_watch = tokio::spawn(members::watch_members(
        workers_kv.clone(),
        worker_id.clone(),
        heartbeat_every,
        members_tx,
        stop_work.clone(),
    ));
    let worker_loop = tokio::spawn(workers.clone().run(
        placements_rx,
        members_rx,
        stop_work.clone(),
    ));
    let heartbeat_stop = CancellationToken::new();
    let beat = Arc::new(Heartbeat {
        worker_id,
        host,
        started_ms,
        runtime_kind: cli.runtime.clone(),
        residency,
        runtime,
        statuses: workers.statuses.clone(),
    });
    let _ = beats.set(beat.clone());
    let heartbeat = tokio::spawn(beat.run(workers_kv, heartbeat_every, heartbeat_stop.clone()));

    signalled.cancelled().await;
    tracing::info!("shutting down: finishing in-flight batches");
    stop_work.cancel();
    let _ = worker_loop.await;
    let _ = watcher.await;
    let _ = members_watch.await;
    workers.drain(Duration::from_secs(30)).await;
    heartbeat_stop.cancel();
    let _ = heartbeat.await;
    shutdown.cancel();
    let _ = supervisor.await;
    let _ = client.flush().await;
    tracing::info!("stopped");
    Ok(())
}

/// Retries a start-up step (NATS may not be up yet) until it works or a signal arrives.
async fn until_ok<T, F, Fut>(what: &str, signalled: &CancellationToken, mut step: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    loop {
        match step().await {
            Ok(value) => return Some(value),
            Err(e) => tracing::warn!(error = %e, "{what} not ready; retrying"),
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = signalled.cancelled() => return None,
        }
    }
}

async fn cancel_on_signal(signalled: CancellationToken) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers");
        return;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = int.recv() => tracing::info!("SIGINT received"),
    }
    signalled.cancel();
}
