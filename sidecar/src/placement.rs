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

/// Task names become NATS subject tokens and consumer names: the registry's rule
/// (contract/shared.toml `[task_name]`), which the gateway applies too.
pub fn valid_task_name(task: &str) -> bool {
    contract::declared().task_name.allows(task)
}

fn validate(key: &str, placement: &Placement) -> Result<()> {
    if !valid_task_name(key) {
        return Err(Error::BadPayload(format!(
            "task name {key:?} cannot be served: a task name holds {}",
            contract::declared().task_name.describe()
        )));
    }
    if placement.task != key {
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
