//! Follows KV bucket `placements` (all keys) and keeps the desired placement per task in a
//! watch channel. Workers and residency react to the channel; this module only keeps it true.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::kv;
use futures::StreamExt;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};
use crate::protocol::{self, Placement};

pub type Placements = Arc<BTreeMap<String, Placement>>;

/// Runs until `shutdown`, re-watching after errors. A re-watch replays the last value of
/// every key (deletes included), so nothing missed while disconnected stays wrong.
pub async fn watch_placements(
    store: kv::Store,
    tx: watch::Sender<Placements>,
    shutdown: CancellationToken,
) {
    while !shutdown.is_cancelled() {
        match store.watch_with_history(">").await {
            Ok(mut entries) => loop {
                tokio::select! {
                    entry = entries.next() => match entry {
                        Some(Ok(entry)) => apply(&tx, entry),
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

fn apply(tx: &watch::Sender<Placements>, entry: kv::Entry) {
    let task = entry.key;
    match entry.operation {
        kv::Operation::Put => {
            let placement = protocol::decode::<Placement>(&entry.value)
                .and_then(|p| validate(&task, &p).map(|_| p));
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
                "placement updated"
            );
            Arc::make_mut(map).insert(task, placement);
            true
        }
    });
}

/// Task names become NATS subject tokens and consumer names, so they are kept simple.
pub fn valid_task_name(task: &str) -> bool {
    !task.is_empty()
        && task
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// The KV key a shadow placement of `task` is stored under (`<task>.shadow`).
pub fn shadow_key(task: &str) -> String {
    format!("{task}{SHADOW_SUFFIX}")
}

/// A champion's placement lies under its task's name, a shadow's under `<task>.shadow`.
pub const SHADOW_SUFFIX: &str = ".shadow";

fn validate(key: &str, placement: &Placement) -> Result<()> {
    let task = match key.strip_suffix(SHADOW_SUFFIX) {
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
            "task name {task:?} may hold only letters, digits, '-' and '_'"
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
    use super::validate;
    use crate::protocol::{ArtifactRef, Placement};

    fn placement(task: &str, shadow: bool) -> Placement {
        Placement {
            v: 1,
            task: task.into(),
            epoch: 1,
            candidate: "c".into(),
            model_key: "m".into(),
            base: ArtifactRef {
                sha256: "b".repeat(64),
                size: 1,
                format: "tree-v1".into(),
            },
            adapter: None,
            query_prefix: String::new(),
            passage_prefix: String::new(),
            max_seq_length: None,
            pinned: false,
            replicas: 1,
            memory_bytes: 0,
            runtime: "torch".into(),
            shadow,
        }
    }

    #[test]
    fn a_shadow_lies_under_its_tasks_shadow_key_and_nowhere_else() {
        assert!(validate("area", &placement("area", false)).is_ok());
        assert!(validate("area.shadow", &placement("area", true)).is_ok());
        // A shadow under the champion's key, a champion under a shadow key, another task.
        assert!(validate("area", &placement("area", true)).is_err());
        assert!(validate("area.shadow", &placement("area", false)).is_err());
        assert!(validate("other.shadow", &placement("area", true)).is_err());
        assert!(validate("a.b.shadow", &placement("a.b", true)).is_err());
    }
}
