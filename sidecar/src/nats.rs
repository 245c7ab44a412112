//! Connection to NATS and the JetStream objects the sidecar uses, built from their declaration
//! in contract/shared.toml (as serving/nats_layout.py builds Python's). Streams and buckets are
//! created elsewhere too (the gateway and `taskfleet up`); creating a missing one here lets a
//! worker start first without a manual step. The per-task consumer is the workers' alone.

use std::path::PathBuf;
use std::time::Duration;

use async_nats::jetstream::consumer::{self, pull, AckPolicy, Consumer};
use async_nats::jetstream::{self, kv, object_store, stream};
use async_nats::ServerAddr;
use tokio::sync::OnceCell;

use crate::contract::{
    self, seconds, BucketRule, Discard, ObjectStoreRule, Retention, Storage, StreamRule,
};
use crate::error::{Error, Result};

/// How to authenticate to NATS and whether to use TLS (all optional).
#[derive(Debug, Clone, Default)]
pub struct Access {
    pub user: Option<String>,
    pub password: Option<String>,
    pub creds: Option<PathBuf>,
    pub tls_ca: Option<PathBuf>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub tls: bool,
}

/// The servers of a comma-separated URL list.
pub fn server_addrs(urls: &str) -> Result<Vec<ServerAddr>> {
    let addrs = urls
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(|u| {
            u.parse::<ServerAddr>()
                .map_err(|e| Error::Config(format!("bad NATS URL {u:?}: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    if addrs.is_empty() {
        return Err(Error::Config("no NATS URL given".into()));
    }
    Ok(addrs)
}

/// Connects and keeps reconnecting forever, also when the server is not up yet at start.
pub async fn connect(urls: &str, name: &str, access: &Access) -> Result<async_nats::Client> {
    let servers = server_addrs(urls)?;
    for path in [
        &access.creds,
        &access.tls_ca,
        &access.tls_cert,
        &access.tls_key,
    ]
    .into_iter()
    .flatten()
    {
        if !path.is_file() {
            return Err(Error::Config(format!("no such file: {}", path.display())));
        }
    }
    let mut options = async_nats::ConnectOptions::new();
    if let Some(user) = &access.user {
        let password = access.password.clone().unwrap_or_default();
        options = options.user_and_password(user.clone(), password);
    }
    if let Some(creds) = &access.creds {
        options = options
            .credentials_file(creds)
            .await
            .map_err(Error::nats(format!("read {}", creds.display())))?;
    }
    if let Some(ca) = &access.tls_ca {
        options = options.add_root_certificates(ca.clone());
    }
    if let (Some(cert), Some(key)) = (&access.tls_cert, &access.tls_key) {
        options = options.add_client_certificate(cert.clone(), key.clone());
    }
    if access.tls || access.tls_ca.is_some() {
        options = options.require_tls(true);
    }
    options
        .name(name)
        .retry_on_initial_connect()
        .max_reconnects(None)
        .event_callback(|event| async move {
            match event {
                async_nats::Event::Connected => tracing::info!("connected to NATS"),
                async_nats::Event::Disconnected => tracing::warn!("disconnected from NATS"),
                other => tracing::info!(event = %other, "NATS event"),
            }
        })
        .connect(servers)
        .await
        .map_err(Error::nats(format!("connect to {urls}")))
}

/// Copies of a new stream or bucket: the declared `replicas` (3) on a cluster of that many
/// nodes or more (the server's INFO names every node's client address in `connect_urls`), else
/// 1; as `layout_replicas` in serving/nats_layout.py.
pub fn layout_replicas(js: &jetstream::Context) -> usize {
    replicas_for(js.client().server_info().connect_urls.len())
}

pub fn replicas_for(nodes: usize) -> usize {
    let declared = contract::declared().nats.replicas;
    if nodes >= declared {
        declared
    } else {
        1
    }
}

impl From<Retention> for stream::RetentionPolicy {
    fn from(retention: Retention) -> Self {
        match retention {
            Retention::Workqueue => stream::RetentionPolicy::WorkQueue,
            Retention::Limits => stream::RetentionPolicy::Limits,
            Retention::Interest => stream::RetentionPolicy::Interest,
        }
    }
}

impl From<Storage> for stream::StorageType {
    fn from(storage: Storage) -> Self {
        match storage {
            Storage::File => stream::StorageType::File,
            Storage::Memory => stream::StorageType::Memory,
        }
    }
}

impl From<contract::AckPolicy> for AckPolicy {
    fn from(policy: contract::AckPolicy) -> Self {
        match policy {
            contract::AckPolicy::Explicit => AckPolicy::Explicit,
            contract::AckPolicy::All => AckPolicy::All,
            contract::AckPolicy::None => AckPolicy::None,
        }
    }
}

/// The stream `rule` declares (one replica; a missing stream gets the cluster's on creation):
/// one of the streams a worker may create (TASKS, DLQ, SHADOW).
pub fn stream_config(rule: &StreamRule) -> stream::Config {
    stream::Config {
        name: rule.name.clone(),
        subjects: vec![rule.subjects()],
        retention: rule.retention.into(),
        storage: rule.storage.into(),
        max_age: seconds(rule.max_age_s),
        // Zero: the server's default, as a stream created without one gets.
        duplicate_window: rule.duplicate_window_s.map(seconds).unwrap_or_default(),
        discard: match rule.discard {
            Some(Discard::New) => stream::DiscardPolicy::New,
            Some(Discard::Old) | None => stream::DiscardPolicy::Old,
        },
        // -1: no limit (the server's default).
        max_messages_per_subject: rule.max_msgs_per_subject.unwrap_or(-1),
        discard_new_per_subject: rule.discard_new_per_subject,
        // `allow_msg_ttl` is not built: async-nats has it only with feature `server_2_11`, and
        // the streams that declare it (SAMPLES, FEEDBACK) are the control plane's, never
        // created here (tested below).
        ..Default::default()
    }
}

/// The KV bucket `rule` declares; a TTL expires its keys (a dead worker's heartbeat).
pub fn kv_config(rule: &BucketRule) -> kv::Config {
    kv::Config {
        bucket: rule.bucket.clone(),
        history: rule.history,
        max_age: rule.ttl_s.map(seconds).unwrap_or_default(),
        storage: stream::StorageType::File,
        ..Default::default()
    }
}

pub fn object_store_config(rule: &ObjectStoreRule) -> object_store::Config {
    object_store::Config {
        bucket: rule.bucket.clone(),
        max_age: rule.ttl_s.map(seconds).unwrap_or_default(),
        storage: stream::StorageType::File,
        ..Default::default()
    }
}

/// What a worker's consumer of a task is created with: the declared consumer, with this
/// worker's `ack_wait` and `max_deliver` (`--ack-wait-ms`, `--max-deliver`; the declared ones
/// by default).
pub fn task_consumer_config(task: &str, ack_wait: Duration, max_deliver: i64) -> pull::Config {
    let rule = &contract::declared().nats.task_consumer;
    pull::Config {
        durable_name: Some(rule.name(task)),
        filter_subject: contract::declared().nats.streams.tasks.subject(task),
        ack_policy: rule.ack_policy.into(),
        ack_wait,
        max_deliver,
        ..Default::default()
    }
}

/// What a worker's consumer of a task's shadow is created with: the declared shadow consumer
/// (`shadow_<task>` on `SHADOW`, one delivery: a copy lost with its worker is not run again),
/// with this worker's `ack_wait`.
pub fn shadow_consumer_config(task: &str, ack_wait: Duration) -> pull::Config {
    let rule = &contract::declared().nats.shadow_consumer;
    pull::Config {
        durable_name: Some(rule.name(task)),
        filter_subject: contract::declared().nats.streams.shadow.subject(task),
        ack_policy: rule.ack_policy.into(),
        ack_wait,
        max_deliver: rule.max_deliver,
        ..Default::default()
    }
}

/// A stream, created with `config` (and the cluster's replicas) when missing. The replicas are
/// counted after the look-up: the client knows the server's INFO only once connected.
async fn stream_with(
    js: &jetstream::Context,
    mut config: stream::Config,
) -> Result<stream::Stream> {
    if let Ok(found) = js.get_stream(&config.name).await {
        return Ok(found);
    }
    config.num_replicas = layout_replicas(js);
    let name = config.name.clone();
    js.get_or_create_stream(config)
        .await
        .map_err(Error::nats(format!("get or create stream {name}")))
}

pub async fn tasks_stream(js: &jetstream::Context) -> Result<stream::Stream> {
    stream_with(js, stream_config(&contract::declared().nats.streams.tasks)).await
}

pub async fn dlq_stream(js: &jetstream::Context) -> Result<stream::Stream> {
    stream_with(js, stream_config(&contract::declared().nats.streams.dlq)).await
}

/// The durable pull consumer of a task on `TASKS` (or of its shadow on `SHADOW`). Workers are
/// the one role that creates it (the gateway only reads it): created with `config` when
/// missing; one that exists stands as it is, and what differs from `config` (another worker's
/// flags, an older version's) is logged once per task loop.
pub async fn task_consumer(
    stream: &stream::Stream,
    config: pull::Config,
) -> Result<Consumer<pull::Config>> {
    let name = config.durable_name.clone().unwrap_or_default();
    if let Ok(mut found) = stream.get_consumer::<pull::Config>(&name).await {
        let differences = consumer_differences(
            &found
                .info()
                .await
                .map_err(Error::nats(format!("read consumer {name}")))?
                .config,
            &config,
        );
        if !differences.is_empty() {
            tracing::warn!(consumer = %name, differences = %differences.join("; "), "the task's consumer exists with other settings than this worker's; it stands as it is");
        }
        return Ok(found);
    }
    stream
        .get_or_create_consumer(&name, config)
        .await
        .map_err(Error::nats(format!("get or create consumer {name}")))
}

/// What of a found consumer's settings differs from `wanted` ("ack_wait 60s, not 10s").
pub fn consumer_differences(found: &consumer::Config, wanted: &pull::Config) -> Vec<String> {
    let mut differences = Vec::new();
    if found.filter_subject != wanted.filter_subject {
        differences.push(format!(
            "filter_subject {:?}, not {:?}",
            found.filter_subject, wanted.filter_subject
        ));
    }
    if found.ack_policy != wanted.ack_policy {
        differences.push(format!(
            "ack_policy {:?}, not {:?}",
            found.ack_policy, wanted.ack_policy
        ));
    }
    if found.ack_wait != wanted.ack_wait {
        differences.push(format!(
            "ack_wait {:?}, not {:?}",
            found.ack_wait, wanted.ack_wait
        ));
    }
    if found.max_deliver != wanted.max_deliver {
        differences.push(format!(
            "max_deliver {}, not {}",
            found.max_deliver, wanted.max_deliver
        ));
    }
    differences
}

/// The sampled copies of requests for shadow placements (`shadow.<task>`): a work queue in
/// memory whose backlog the stream itself drops by age and count (contract/shared.toml).
pub async fn shadow_stream(js: &jetstream::Context) -> Result<stream::Stream> {
    stream_with(js, stream_config(&contract::declared().nats.streams.shadow)).await
}

/// A KV bucket, created with `config` when missing.
pub async fn key_value(js: &jetstream::Context, mut config: kv::Config) -> Result<kv::Store> {
    let bucket = config.bucket.clone();
    match js.get_key_value(&bucket).await {
        Ok(store) => Ok(store),
        Err(_) => {
            config.num_replicas = layout_replicas(js);
            js.create_key_value(config)
                .await
                .map_err(Error::nats(format!("create KV bucket {bucket}")))
        }
    }
}

pub async fn placements_bucket(js: &jetstream::Context) -> Result<kv::Store> {
    key_value(js, kv_config(&contract::declared().nats.kv.placements)).await
}

/// Heartbeats expire after the declared TTL, so a dead worker drops out of the fleet by itself.
pub async fn workers_bucket(js: &jetstream::Context) -> Result<kv::Store> {
    key_value(js, kv_config(&contract::declared().nats.kv.workers)).await
}

pub async fn payloads_bucket(js: &jetstream::Context) -> Result<object_store::ObjectStore> {
    let mut config = object_store_config(&contract::declared().nats.object_stores.payloads);
    match js.get_object_store(&config.bucket).await {
        Ok(store) => Ok(store),
        Err(_) => {
            config.num_replicas = layout_replicas(js);
            js.create_object_store(config)
                .await
                .map_err(Error::nats("create object store payloads"))
        }
    }
}

/// The `payloads` object store, opened (or created) on first use and kept: large request
/// inputs are read from it and large reply embeddings written to it.
pub struct Payloads {
    js: jetstream::Context,
    store: OnceCell<object_store::ObjectStore>,
}

impl Payloads {
    pub fn new(js: jetstream::Context) -> Self {
        Self {
            js,
            store: OnceCell::new(),
        }
    }

    pub async fn store(&self) -> Result<object_store::ObjectStore> {
        self.store
            .get_or_try_init(|| payloads_bucket(&self.js))
            .await
            .cloned()
    }

    /// Deletes an object that is no longer needed; a failure is only logged (the bucket's
    /// max age removes what is left behind).
    pub async fn delete(&self, key: &str) {
        let deleted = match self.store().await {
            Ok(store) => store.delete(key).await.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        if let Err(e) = deleted {
            tracing::warn!(key, error = %e, "could not delete payload object");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use async_nats::jetstream;

    use super::{
        consumer_differences, dlq_stream, placements_bucket, replicas_for, server_addrs,
        stream_config, task_consumer, task_consumer_config, tasks_stream, workers_bucket,
    };
    use crate::contract;
    use crate::nats_server_test::NatsServer;

    #[test]
    fn the_streams_a_worker_creates_are_built_whole() {
        let streams = &contract::declared().nats.streams;
        for rule in [&streams.tasks, &streams.dlq, &streams.shadow] {
            // What `stream_config` cannot build (see there) must not be declared for them.
            assert!(!rule.allow_msg_ttl, "{}", rule.name);
        }
        let shadow = stream_config(&streams.shadow);
        assert_eq!(shadow.subjects, ["shadow.>"]);
        assert_eq!(shadow.max_messages_per_subject, 1000);
        assert_eq!(
            shadow.discard,
            async_nats::jetstream::stream::DiscardPolicy::Old
        );
        assert_eq!(stream_config(&streams.tasks).max_messages_per_subject, -1);
    }

    #[test]
    fn three_nodes_or_more_get_three_replicas() {
        assert_eq!(
            [0, 1, 2, 3, 5].map(replicas_for),
            [1, 1, 1, 3, 3],
            "a cluster of 2 cannot keep a quorum of 3"
        );
    }

    #[test]
    fn a_url_list_names_every_node() {
        let addrs = server_addrs("nats://a:4222, tls://b:4223,,nats://c:4224").unwrap();
        let hosts: Vec<_> = addrs.iter().map(|a| a.host().to_string()).collect();
        assert_eq!(hosts, ["a", "b", "c"]);
        assert!(addrs[1].tls_required());
        assert!(server_addrs(" , ").is_err());
        assert!(server_addrs("nats://a:notaport").is_err());
    }

    /// What the sidecar creates when it starts first is what contract/shared.toml declares (the
    /// Python side's twin: tests/test_gateway_nats_layout.py), and a consumer that exists with
    /// other settings stands as it is.
    #[tokio::test]
    async fn the_layout_a_worker_creates_is_the_declared_one() {
        let server = NatsServer::start();
        let js = server.jetstream().await;
        let declared = &contract::declared().nats;

        let mut tasks = tasks_stream(&js).await.unwrap();
        let config = tasks.info().await.unwrap().config.clone();
        let rule = &declared.streams.tasks;
        assert_eq!(config.name, rule.name);
        assert_eq!(config.subjects, [format!("{}>", rule.subject_prefix)]);
        assert_eq!(
            config.retention,
            jetstream::stream::RetentionPolicy::WorkQueue
        );
        assert_eq!(config.storage, jetstream::stream::StorageType::File);
        assert_eq!(config.max_age, contract::seconds(rule.max_age_s));
        assert_eq!(
            Some(config.duplicate_window),
            rule.duplicate_window_s.map(contract::seconds)
        );
        let mut dlq = dlq_stream(&js).await.unwrap();
        let dlq = dlq.info().await.unwrap().config.clone();
        assert_eq!(
            (dlq.name.as_str(), dlq.max_age),
            (
                declared.streams.dlq.name.as_str(),
                contract::seconds(declared.streams.dlq.max_age_s)
            )
        );
        assert_eq!(dlq.retention, jetstream::stream::RetentionPolicy::Limits);

        let workers = workers_bucket(&js).await.unwrap();
        let status = workers.status().await.unwrap();
        assert_eq!(
            Some(status.max_age()),
            declared.kv.workers.ttl_s.map(contract::seconds),
            "heartbeats expire after the declared TTL, not a multiple of --heartbeat-ms"
        );
        assert_eq!(status.history(), declared.kv.workers.history);
        let placements = placements_bucket(&js).await.unwrap();
        assert_eq!(
            placements.status().await.unwrap().history(),
            declared.kv.placements.history
        );

        let rule = &declared.task_consumer;
        let wanted = task_consumer_config(
            "alpha",
            contract::seconds(rule.ack_wait_s),
            rule.max_deliver,
        );
        let mut consumer = task_consumer(&tasks, wanted.clone()).await.unwrap();
        let info = consumer.info().await.unwrap().config.clone();
        assert_eq!(info.durable_name.as_deref(), Some("task_alpha"));
        assert_eq!(info.filter_subject, "tasks.alpha");
        assert_eq!(info.ack_policy, jetstream::consumer::AckPolicy::Explicit);
        assert_eq!(info.ack_wait, contract::seconds(rule.ack_wait_s));
        assert_eq!(info.max_deliver, rule.max_deliver);
        assert!(consumer_differences(&info, &wanted).is_empty());

        // A second worker with other flags finds it and leaves it as it is.
        let other = task_consumer_config("alpha", Duration::from_secs(60), 3);
        let mut found = task_consumer(&tasks, other.clone()).await.unwrap();
        let kept = found.info().await.unwrap().config.clone();
        assert_eq!(
            (kept.ack_wait, kept.max_deliver),
            (info.ack_wait, info.max_deliver)
        );
        assert_eq!(
            consumer_differences(&kept, &other),
            ["ack_wait 10s, not 60s", "max_deliver 5, not 3"]
        );
    }
}
