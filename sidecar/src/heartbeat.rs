//! Puts this worker's heartbeat (docs/protocol.md, KV `workers`) under its worker id every
//! period. The bucket's TTL removes a worker that stops beating; a clean shutdown deletes
//! the key at once.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::kv;
use tokio_util::sync::CancellationToken;

use crate::clock::now_ms;
use crate::protocol::{self, WorkerHeartbeat, PROTOCOL_VERSION};
use crate::residency::Residency;
use crate::runtime::supervisor::Runtime;
use crate::worker::TaskStatuses;

pub struct Heartbeat {
    pub worker_id: String,
    pub host: String,
    /// When this process started (unix ms): tells a restart apart from a live worker.
    pub started_ms: u64,
    /// The runtime kind this worker serves (see `WorkerHeartbeat::runtime_kind`).
    pub runtime_kind: String,
    pub residency: Arc<Residency>,
    pub runtime: Arc<Runtime>,
    pub statuses: TaskStatuses,
}

impl Heartbeat {
    pub fn snapshot(&self) -> WorkerHeartbeat {
        let mut queue_depth = BTreeMap::new();
        let mut epochs = BTreeMap::new();
        let mut profiles = BTreeMap::new();
        for (task, status) in self.statuses.lock().expect("statuses lock").iter() {
            queue_depth.insert(task.clone(), crate::worker::held_count(status));
            if let Some(serving) = status.serving.lock().expect("serving lock").as_ref() {
                epochs.insert(task.clone(), serving.epoch);
                if let Some(profile) = &serving.applied {
                    profiles.insert(task.clone(), profile.id);
                }
            }
        }
        WorkerHeartbeat {
            v: PROTOCOL_VERSION,
            worker_id: self.worker_id.clone(),
            host: self.host.clone(),
            ts_ms: now_ms(),
            loaded: self.residency.loaded(),
            memory_used: self.residency.used(),
            memory_budget: self.residency.budget(),
            queue_depth,
            runtimes: self.runtime.runtimes(),
            epochs,
            started_ms: Some(self.started_ms),
            runtime_kind: Some(self.runtime_kind.clone()),
            profiles: Some(profiles),
        }
    }

    pub async fn run(
        self: Arc<Self>,
        store: kv::Store,
        every: Duration,
        shutdown: CancellationToken,
    ) {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticks.tick() => self.beat(&store).await,
                _ = shutdown.cancelled() => break,
            }
        }
        if let Err(e) = store.delete(&self.worker_id).await {
            tracing::warn!(error = %e, "could not remove heartbeat on shutdown");
        }
    }

    async fn beat(&self, store: &kv::Store) {
        let heartbeat = self.snapshot();
        let bytes = match protocol::encode(&heartbeat) {
            Ok(bytes) => bytes,
            Err(e) => return tracing::error!(error = %e, "cannot encode heartbeat"),
        };
        match store.put(&self.worker_id, bytes.into()).await {
            Ok(_) => tracing::debug!(
                loaded = ?heartbeat.loaded,
                memory_used = heartbeat.memory_used,
                epochs = ?heartbeat.epochs,
                queue_depth = ?heartbeat.queue_depth,
                "heartbeat"
            ),
            Err(e) => tracing::warn!(error = %e, "heartbeat not stored"),
        }
    }
}

/// A worker id is a KV key of bucket `workers`: letters (any case: it defaults to the host
/// name), digits, '-' and '_'.
pub fn valid_worker_id(id: &str) -> bool {
    !id.is_empty()
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// This machine's host name, for heartbeats.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use async_nats::jetstream;
    use tokio_util::sync::CancellationToken;

    use super::Heartbeat;
    use crate::artifacts::{ArtifactCache, Source};
    use crate::nats;
    use crate::nats_server_test::{eventually, NatsServer};
    use crate::protocol::{self, WorkerHeartbeat};
    use crate::residency::Residency;
    use crate::runtime::supervisor::Runtime;

    async fn heartbeat_of(store: &jetstream::kv::Store, worker: &str) -> Option<WorkerHeartbeat> {
        let bytes = store.get(worker).await.ok()??;
        Some(protocol::decode(&bytes).expect("heartbeat decodes"))
    }

    #[tokio::test]
    async fn heartbeat_is_put_under_the_worker_id_and_removed_on_stop() {
        let server = NatsServer::start();
        let js = server.jetstream().await;
        let store = nats::workers_bucket(&js).await.unwrap();
        let runtime = Runtime::new();
        let heartbeat = Arc::new(Heartbeat {
            worker_id: "w-test-1".into(),
            host: "test-host".into(),
            started_ms: 1,
            runtime_kind: "torch".into(),
            residency: Residency::new(
                runtime.clone(),
                12_345,
                Arc::new(ArtifactCache::new(
                    "unused-cache".into(),
                    Source::Nats(js.clone()),
                )),
            ),
            runtime,
            statuses: Arc::default(),
        });
        let stop = CancellationToken::new();
        let running =
            tokio::spawn(heartbeat.run(store.clone(), Duration::from_millis(100), stop.clone()));

        let beat = eventually(Duration::from_secs(5), "a heartbeat", || {
            heartbeat_of(&store, "w-test-1")
        })
        .await;
        assert_eq!(beat.worker_id, "w-test-1");
        assert_eq!(beat.host, "test-host");
        assert_eq!(beat.memory_budget, 12_345);
        assert!(beat.loaded.is_empty() && beat.runtimes.is_empty());
        let first_ts = beat.ts_ms;
        let later = eventually(Duration::from_secs(5), "a later heartbeat", || async {
            heartbeat_of(&store, "w-test-1")
                .await
                .filter(|b| b.ts_ms > first_ts)
        })
        .await;
        assert!(later.ts_ms > first_ts);

        stop.cancel();
        running.await.unwrap();
        assert!(store.get("w-test-1").await.unwrap().is_none());
    }
}
