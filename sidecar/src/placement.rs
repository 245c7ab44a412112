//! Follows KV bucket `placements` (all keys) and keeps the desired placement per task in a
//! watch channel. Workers and residency react to the channel; this module only keeps it true.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::kv;
use futures::StreamExt;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::contract;
use crate::error::{Error, Result};
use crate::protocol::{self, Placement};

pub type Placements = Arc<BTreeMap<String, Placement>>;

/// Runs until `shutdown`, re-watching after errors. A re-watch replays the last value of
/// every key (deletes included), so nothing missed while disconnected stays wrong. Each
/// placement is kept with the runtime profile of `machine_class` applied (none without one).
pub async fn watch_placements(
    store: kv::Store,
    tx: watch::Sender<Placements>,
    machine_class: Option<String>,
    shutdown: CancellationToken,
) {
    while !shutdown.is_cancelled() {
        match store.watch_with_history(">").await {
            Ok(mut entries) => loop {
                tokio::select! {
                    entry = entries.next() => match entry {
                        Some(Ok(entry)) => apply(&tx, entry, machine_class.as_deref()),
                        Some(Err(e)) => {
                            tracing::warn!(error = %e, "placement watch failed; re-watching");
                            break;
                        }
                        None => break,
                    },
                    _ = shutdown.cancelled() => return,
                }
            },
            Err(e) => tracing::warn!(error = %e, "cannot watch placements; retrying"),
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}

fn apply(tx: &watch::Sender<Placements>, entry: kv::Entry, machine_class: Option<&str>) {
    let task = entry.key;
    match entry.operation {
        kv::Operation::Put => {
            let placement = protocol::decode::<Placement>(&entry.value)
                .and_then(|p| validate(&task, &p).map(|_| p.apply_profile(machine_class)));
            match placement {
                Ok(placement) => put(tx, task, placement),
                Err(e) => tracing::error!(%task, error = %e, "ignoring invalid placement"),
            }
        }
        kv::Operation::Delete | kv::Operation::Purge => {
            tx.send_if_modified(|map| {
                let removed = Arc::make_mut(map).remove(&task).is_some();
                if removed {
                    tracing::info!(%task, "placement removed");
                }
                removed
            });
        }
    }
}

fn put(tx: &watch::Sender<Placements>, task: String, placement: Placement) {
    tx.send_if_modified(|map| match map.get(&task) {
        Some(current) if current.epoch > placement.epoch => {
            tracing::warn!(
                %task,
                current = current.epoch,
                stale = placement.epoch,
                "ignoring placement with an older epoch"
            );
            false
        }
        Some(current) if *current == placement => false,
        _ => {
            tracing::info!(
                %task,
                epoch = placement.epoch,
                model_key = %placement.model_key,
                pinned = placement.pinned,
                profile = ?placement.applied.as_ref().map(|p| p.id),
                "placement updated"
            );
            Arc::make_mut(map).insert(task, placement);
            true
        }
    });
}

/// Task names become NATS subject tokens and consumer names: the registry's rule
/// (contract/shared.toml `[task_name]`), which the gateway applies too.
pub fn valid_task_name(task: &str) -> bool {
    contract::declared().task_name.allows(task)
}

/// The KV key a shadow placement of `task` is stored under (`<task>.shadow`); a champion's
/// placement lies under its task's name (contract/shared.toml `shadow_key_suffix`).
pub fn shadow_key(task: &str) -> String {
    format!("{task}{}", contract::declared().nats.shadow_key_suffix)
}

fn validate(key: &str, placement: &Placement) -> Result<()> {
    let suffix = contract::declared().nats.shadow_key_suffix.as_str();
    let task = match key.strip_suffix(suffix) {
        Some(task) if placement.shadow => task,
        _ if placement.shadow => {
            return Err(Error::BadPayload(format!(
                "a shadow placement must lie under {:?}, not {key:?}",
                shadow_key(&placement.task)
            )));
        }
        _ => key,
    };
    if !valid_task_name(task) {
        return Err(Error::BadPayload(format!(
            "task name {task:?} cannot be served: a task name holds {}",
            contract::declared().task_name.describe()
        )));
    }
    if placement.task != task {
        return Err(Error::BadPayload(format!(
            "placement under key {key:?} names task {:?}",
            placement.task
        )));
    }
    if placement.model_key.is_empty() || placement.base.sha256.is_empty() {
        return Err(Error::BadPayload("empty model_key or base sha256".into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use tokio::sync::watch;
    use tokio_util::sync::CancellationToken;

    use super::{validate, watch_placements};
    use crate::nats;
    use crate::nats_server_test::NatsServer;
    use crate::protocol::{self, ArtifactRef, Placement, RuntimeProfile};

    fn placement(profiles: Vec<RuntimeProfile>) -> Placement {
        Placement {
            v: 1,
            task: "t".into(),
            epoch: 3,
            candidate: "c".into(),
            model_key: "minilm-abc".into(),
            base: ArtifactRef {
                sha256: "b".repeat(64),
                size: 1,
                format: "tree-v1".into(),
            },
            adapter: None,
            query_prefix: String::new(),
            passage_prefix: String::new(),
            max_seq_length: None,
            pinned: true,
            replicas: 1,
            memory_bytes: 0,
            runtime: "torch".into(),
            profiles: Some(profiles),
            shadow: false,
            applied: None,
        }
    }

    fn profile(id: u64, class: &str) -> RuntimeProfile {
        RuntimeProfile {
            id,
            machine_class: class.into(),
            max_batch_tokens: Some(4096),
            max_batch_wait_ms: Some(1),
            intra_op_threads: Some(1),
            runtimes: Some(2),
            max_padding: None,
            engine: Some("onnx".into()),
        }
    }

    const DEFAULTS: (usize, Duration) = (32768, Duration::from_millis(5));

    #[test]
    fn only_the_profile_of_this_machine_class_applies() {
        let both = vec![profile(1, "cpu:Other x64"), profile(2, "cpu:AMD EPYC x2")];
        let mine = placement(both.clone()).apply_profile(Some("cpu:AMD EPYC x2"));
        assert_eq!(mine.applied.as_ref().map(|p| p.id), Some(2));
        assert_eq!(mine.model_key, "minilm-abc~onnx-t1-r2");
        assert_eq!(
            mine.batch_limits(DEFAULTS.0, DEFAULTS.1),
            (4096, Duration::from_millis(1))
        );
        let settings = mine
            .load_request(std::path::Path::new("/c"))
            .settings
            .unwrap();
        assert_eq!(
            (settings.runtimes, settings.engine.as_deref()),
            (Some(2), Some("onnx"))
        );

        for class in [Some("cpu:Intel Xeon x2"), None] {
            let other = placement(both.clone()).apply_profile(class);
            assert!(other.applied.is_none());
            assert_eq!(other.model_key, "minilm-abc");
            assert_eq!(other.batch_limits(DEFAULTS.0, DEFAULTS.1), DEFAULTS);
            assert!(other
                .load_request(std::path::Path::new("/c"))
                .settings
                .is_none());
        }
    }

    #[test]
    fn a_profile_of_batch_knobs_only_keeps_the_model_key() {
        let batching = RuntimeProfile {
            intra_op_threads: None,
            runtimes: None,
            engine: None,
            ..profile(5, "gpu:NVIDIA H200")
        };
        let applied = placement(vec![batching]).apply_profile(Some("gpu:NVIDIA H200"));
        assert_eq!(applied.model_key, "minilm-abc");
        assert_eq!(applied.applied.as_ref().map(|p| p.id), Some(5));
        assert!(applied
            .load_request(std::path::Path::new("/c"))
            .settings
            .is_none());
    }

    fn of_task(task: &str, shadow: bool) -> Placement {
        Placement {
            task: task.into(),
            shadow,
            ..placement(Vec::new())
        }
    }

    #[test]
    fn a_shadow_lies_under_its_tasks_shadow_key_and_nowhere_else() {
        assert!(validate("area", &of_task("area", false)).is_ok());
        assert!(validate("area.shadow", &of_task("area", true)).is_ok());
        // A shadow under the champion's key, a champion under a shadow key, another task.
        assert!(validate("area", &of_task("area", true)).is_err());
        assert!(validate("area.shadow", &of_task("area", false)).is_err());
        assert!(validate("other.shadow", &of_task("area", true)).is_err());
        assert!(validate("a.b.shadow", &of_task("a.b", true)).is_err());
    }

    /// A placement of `task` at `epoch` as the registry publishes it (no runtime profiles).
    fn placed(task: &str, epoch: u64, model_key: &str) -> Placement {
        Placement {
            task: task.into(),
            epoch,
            candidate: format!("cand-{epoch}"),
            model_key: model_key.into(),
            profiles: None,
            ..placement(Vec::new())
        }
    }

    #[tokio::test]
    async fn placement_watcher_follows_puts_deletes_and_ignores_stale_or_invalid() {
        let server = NatsServer::start();
        let js = server.jetstream().await;
        let store = nats::placements_bucket(&js).await.unwrap();
        // A placement written before the watcher starts is seen too.
        let first = placed("faq", 3, "m1");
        store
            .put("faq", protocol::encode(&first).unwrap().into())
            .await
            .unwrap();

        let (tx, mut rx) = watch::channel(Arc::default());
        let stop = CancellationToken::new();
        let watcher = tokio::spawn(watch_placements(store.clone(), tx, None, stop.clone()));
        let seen = rx
            .wait_for(|m| m.contains_key("faq"))
            .await
            .unwrap()
            .clone();
        assert_eq!(seen["faq"], first);

        let newer = placed("faq", 4, "m2");
        store
            .put("faq", protocol::encode(&newer).unwrap().into())
            .await
            .unwrap();
        rx.wait_for(|m| m.get("faq").is_some_and(|p| p.epoch == 4))
            .await
            .unwrap();

        // Entries arrive in order, so once the sentinel is seen the two before it were handled.
        let stale = placed("faq", 2, "m0");
        let invalid = placed("other-task", 9, "m9");
        let sentinel = placed("zz-sentinel", 1, "m1");
        for (key, value) in [
            ("faq", &stale),
            ("legal", &invalid),
            ("zz-sentinel", &sentinel),
        ] {
            store
                .put(key, protocol::encode(value).unwrap().into())
                .await
                .unwrap();
        }
        let seen = rx
            .wait_for(|m| m.contains_key("zz-sentinel"))
            .await
            .unwrap()
            .clone();
        assert_eq!(
            seen["faq"], newer,
            "an older epoch does not replace a newer one"
        );
        assert!(!seen.contains_key("legal"), "key/task mismatch is rejected");

        store.delete("zz-sentinel").await.unwrap();
        store.delete("faq").await.unwrap();
        rx.wait_for(|m| m.is_empty()).await.unwrap();
        stop.cancel();
        watcher.await.unwrap();
    }
}
