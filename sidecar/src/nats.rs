//! Connection to NATS and the JetStream objects the sidecar uses. Streams and buckets are
//! created elsewhere (the gateway and `taskfleet up`); creating a missing one here with the
//! settings of ARCHITECTURE.md lets a worker start first without a manual step.

use std::path::PathBuf;
use std::time::Duration;

use async_nats::jetstream::{self, kv, object_store, stream};
use async_nats::ServerAddr;
use tokio::sync::OnceCell;

use crate::error::{Error, Result};

pub const TASKS_STREAM: &str = "TASKS";
pub const DLQ_STREAM: &str = "DLQ";
pub const SHADOW_STREAM: &str = "SHADOW";
/// How long a shadow copy may wait in `SHADOW` before the stream drops it, and how many per
/// task it keeps (the oldest go first): a shadow backlog is dropped, never queued for long.
/// Same values as serving/nats_layout.py.
pub const SHADOW_MAX_AGE: Duration = Duration::from_secs(60);
pub const SHADOW_MAX_PER_TASK: i64 = 1000;
pub const PLACEMENTS_BUCKET: &str = "placements";
pub const WORKERS_BUCKET: &str = "workers";
pub const PAYLOADS_BUCKET: &str = "payloads";

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

/// Copies of a new stream or bucket: 3 on a cluster of 3 nodes or more (the server's INFO
/// names every node's client address in `connect_urls`), else 1; as `layout_replicas` in
/// serving/nats_layout.py.
pub fn layout_replicas(js: &jetstream::Context) -> usize {
    replicas_for(js.client().server_info().connect_urls.len())
}

fn replicas_for(nodes: usize) -> usize {
    if nodes >= 3 {
        3
    } else {
        1
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
    stream_with(
        js,
        stream::Config {
            name: TASKS_STREAM.into(),
            subjects: vec!["tasks.>".into()],
            retention: stream::RetentionPolicy::WorkQueue,
            storage: stream::StorageType::File,
            max_age: Duration::from_secs(24 * 3600),
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        },
    )
    .await
}

pub async fn dlq_stream(js: &jetstream::Context) -> Result<stream::Stream> {
    stream_with(
        js,
        stream::Config {
            name: DLQ_STREAM.into(),
            subjects: vec!["dlq.>".into()],
            storage: stream::StorageType::File,
            max_age: Duration::from_secs(14 * 24 * 3600),
            ..Default::default()
        },
    )
    .await
}

/// The sampled copies of requests for shadow placements (`shadow.<task>`): a work queue in
/// memory whose backlog the stream itself drops by age and count.
pub async fn shadow_stream(js: &jetstream::Context) -> Result<stream::Stream> {
    stream_with(
        js,
        stream::Config {
            name: SHADOW_STREAM.into(),
            subjects: vec!["shadow.>".into()],
            retention: stream::RetentionPolicy::WorkQueue,
            storage: stream::StorageType::Memory,
            discard: stream::DiscardPolicy::Old,
            max_age: SHADOW_MAX_AGE,
            max_messages_per_subject: SHADOW_MAX_PER_TASK,
            duplicate_window: Duration::from_secs(30),
            ..Default::default()
        },
    )
    .await
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
    key_value(
        js,
        kv::Config {
            bucket: PLACEMENTS_BUCKET.into(),
            history: 5,
            ..Default::default()
        },
    )
    .await
}

/// Heartbeats expire after `ttl`, so a dead worker drops out of the fleet by itself.
pub async fn workers_bucket(js: &jetstream::Context, ttl: Duration) -> Result<kv::Store> {
    key_value(
        js,
        kv::Config {
            bucket: WORKERS_BUCKET.into(),
            history: 1,
            max_age: ttl,
            ..Default::default()
        },
    )
    .await
}

pub async fn payloads_bucket(js: &jetstream::Context) -> Result<object_store::ObjectStore> {
    match js.get_object_store(PAYLOADS_BUCKET).await {
        Ok(store) => Ok(store),
        Err(_) => js
            .create_object_store(object_store::Config {
                bucket: PAYLOADS_BUCKET.into(),
                max_age: Duration::from_secs(24 * 3600),
                num_replicas: layout_replicas(js),
                ..Default::default()
            })
            .await
            .map_err(Error::nats("create object store payloads")),
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
    use super::{replicas_for, server_addrs};

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
}
