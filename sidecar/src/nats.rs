//! Connection to NATS and the JetStream objects the sidecar uses. Streams and buckets are
//! created elsewhere (the gateway and `taskfleet up`); creating a missing one here with the
//! settings of ARCHITECTURE.md lets a worker start first without a manual step.

use std::time::Duration;

use async_nats::jetstream::{self, kv, object_store, stream};
use tokio::sync::OnceCell;

use crate::error::{Error, Result};

pub const TASKS_STREAM: &str = "TASKS";
pub const DLQ_STREAM: &str = "DLQ";
pub const PLACEMENTS_BUCKET: &str = "placements";
pub const WORKERS_BUCKET: &str = "workers";
pub const PAYLOADS_BUCKET: &str = "payloads";

/// Connects and keeps reconnecting forever, also when the server is not up yet at start.
pub async fn connect(url: &str, name: &str) -> Result<async_nats::Client> {
    async_nats::ConnectOptions::new()
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
        .connect(url)
        .await
        .map_err(Error::nats(format!("connect to {url}")))
}

pub async fn tasks_stream(js: &jetstream::Context) -> Result<stream::Stream> {
    js.get_or_create_stream(stream::Config {
        name: TASKS_STREAM.into(),
        subjects: vec!["tasks.>".into()],
        retention: stream::RetentionPolicy::WorkQueue,
        storage: stream::StorageType::File,
        max_age: Duration::from_secs(24 * 3600),
        duplicate_window: Duration::from_secs(120),
        ..Default::default()
    })
    .await
    .map_err(Error::nats("get or create stream TASKS"))
}

pub async fn dlq_stream(js: &jetstream::Context) -> Result<stream::Stream> {
    js.get_or_create_stream(stream::Config {
        name: DLQ_STREAM.into(),
        subjects: vec!["dlq.>".into()],
        storage: stream::StorageType::File,
        max_age: Duration::from_secs(14 * 24 * 3600),
        ..Default::default()
    })
    .await
    .map_err(Error::nats("get or create stream DLQ"))
}

/// A KV bucket, created with `config` when missing.
pub async fn key_value(js: &jetstream::Context, config: kv::Config) -> Result<kv::Store> {
    let bucket = config.bucket.clone();
    match js.get_key_value(&bucket).await {
        Ok(store) => Ok(store),
        Err(_) => js
            .create_key_value(config)
            .await
            .map_err(Error::nats(format!("create KV bucket {bucket}"))),
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
