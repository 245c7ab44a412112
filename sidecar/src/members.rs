//! Which workers hold which task. A placement with `replicas: N` is served by the N live workers
//! of its runtime kind that rank highest by rendezvous hashing (sha256 of task NUL worker id).
//! Every worker reads the same live set from KV `workers` (the bucket's TTL drops a silent
//! worker, a clean stop deletes its key) and so computes the same holders with no coordination;
//! a worker that joins or dies moves only the tasks it wins or held. While views differ (a
//! heartbeat not yet seen everywhere) a task may briefly have one holder more or less.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::kv;
use futures::StreamExt;
use ring::digest::{digest, SHA256};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::protocol::{self, WorkerHeartbeat};

/// Live workers: worker id -> runtime kind (None: a worker too old to say).
pub type Members = Arc<BTreeMap<String, Option<String>>>;

fn score(task: &str, worker_id: &str) -> [u8; 32] {
    let mut input = Vec::with_capacity(task.len() + worker_id.len() + 1);
    input.extend_from_slice(task.as_bytes());
    input.push(0);
    input.extend_from_slice(worker_id.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(digest(&SHA256, &input).as_ref());
    out
}

/// The `replicas` workers among `candidates` that hold `task`, best first.
pub fn holders<'a>(
    task: &str,
    replicas: usize,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Vec<&'a str> {
    let mut ranked: Vec<([u8; 32], &str)> = candidates
        .into_iter()
        .map(|id| (score(task, id), id))
        .collect();
    ranked.sort_by(|a, b| b.cmp(a));
    ranked.dedup_by(|a, b| a.1 == b.1);
    ranked
        .into_iter()
        .take(replicas.max(1))
        .map(|(_, id)| id)
        .collect()
}

/// Whether `me` (of runtime kind `kind`) holds `task` placed with `replicas` on `runtime`.
pub fn holds(
    members: &Members,
    me: &str,
    kind: &str,
    task: &str,
    runtime: &str,
    replicas: u32,
) -> bool {
    if kind != runtime {
        return false;
    }
    holders(task, replicas as usize, of_runtime(members, me, runtime)).contains(&me)
}

/// The live workers of `runtime`, `me` among them.
fn of_runtime<'a>(members: &'a Members, me: &'a str, runtime: &'a str) -> Vec<&'a str> {
    members
        .iter()
        .filter(|(id, k)| k.as_deref() == Some(runtime) && id.as_str() != me)
        .map(|(id, _)| id.as_str())
        .chain(std::iter::once(me))
        .collect()
}

/// Whether `me` holds the shadow placed under `key` (`<task>.shadow`) with `replicas` on
/// `runtime`, beside a champion held by `champion` (its holders, from [`holders_of`]). The
/// shadow ranks the workers that do not hold the champion, so that the shadow's work and a
/// crash of its worker stay off the champion's workers; only when no such worker is left does
/// it share theirs.
pub fn holds_shadow(
    members: &Members,
    me: &str,
    kind: &str,
    key: &str,
    runtime: &str,
    replicas: u32,
    champion: &[String],
) -> bool {
    if kind != runtime {
        return false;
    }
    let all = of_runtime(members, me, runtime);
    let apart: Vec<&str> = all
        .iter()
        .copied()
        .filter(|id| !champion.iter().any(|c| c == id))
        .collect();
    let pool = if apart.is_empty() { all } else { apart };
    holders(key, replicas as usize, pool).contains(&me)
}

/// The workers that hold `task` placed with `replicas` on `runtime`, as every worker computes
/// them.
pub fn holders_of(members: &Members, task: &str, runtime: &str, replicas: u32) -> Vec<String> {
    let all = members
        .iter()
        .filter(|(_, k)| k.as_deref() == Some(runtime))
        .map(|(id, _)| id.as_str());
    holders(task, replicas as usize, all)
        .into_iter()
        .map(str::to_string)
        .collect()
}

async fn read(store: &kv::Store) -> Option<BTreeMap<String, Option<String>>> {
    let mut keys = match store.keys().await {
        Ok(keys) => keys,
        Err(e) => {
            tracing::warn!(error = %e, "cannot list workers");
            return None;
        }
    };
    let mut members = BTreeMap::new();
    while let Some(key) = keys.next().await {
        let Ok(key) = key else { return None };
        match store.get(&key).await {
            Ok(Some(bytes)) => match protocol::decode::<WorkerHeartbeat>(&bytes) {
                Ok(beat) => {
                    members.insert(beat.worker_id, beat.runtime_kind);
                }
                Err(e) => tracing::debug!(%key, error = %e, "ignoring unreadable heartbeat"),
            },
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(%key, error = %e, "cannot read heartbeat");
                return None;
            }
        }
    }
    Some(members)
}

/// Re-reads KV `workers` every `every` until `shutdown`; the channel changes only when the
/// live set does. It stays `None` (hold nothing rather than everything) until this worker's
/// own heartbeat (`me`) has been in the bucket for two periods: workers started together have
/// all beaten by then, so a fresh worker does not briefly claim (and load) every task.
pub async fn watch_members(
    store: kv::Store,
    me: String,
    every: Duration,
    tx: watch::Sender<Option<Members>>,
    shutdown: CancellationToken,
) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut self_seen: Option<tokio::time::Instant> = None;
    // When each worker was last listed: a key can be missing from one listing while its
    // heartbeat is being replaced, so a worker leaves the set only after three periods unseen
    // (its key expired by the bucket's TTL, or deleted by a clean stop).
    let mut last_seen: BTreeMap<String, (Option<String>, tokio::time::Instant)> = BTreeMap::new();
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = shutdown.cancelled() => return,
        }
        let Some(listed) = read(&store).await else {
            continue;
        };
        let at = tokio::time::Instant::now();
        for (id, kind) in listed {
            last_seen.insert(id, (kind, at));
        }
        last_seen.retain(|_, (_, seen)| at.duration_since(*seen) < every * 3);
        let now: BTreeMap<String, Option<String>> = last_seen
            .iter()
            .map(|(id, (kind, _))| (id.clone(), kind.clone()))
            .collect();
        if self_seen.is_none() && now.contains_key(&me) {
            self_seen = Some(tokio::time::Instant::now());
        }
        if self_seen.is_none_or(|at| at.elapsed() < every * 2) {
            continue;
        }
        tx.send_if_modified(|current| {
            if current.as_deref() == Some(&now) {
                return false;
            }
            tracing::info!(workers = ?now.keys().collect::<Vec<_>>(), "live workers changed");
            *current = Some(Arc::new(now));
            true
        });
    }
}

#[cfg(test)]
mod tests {
    use super::{holders, holders_of, holds, holds_shadow, Members};
    use std::collections::BTreeMap;
    use std::sync::Arc;

    fn members(ids: &[&str]) -> Members {
        Arc::new(
            ids.iter()
                .map(|id| (id.to_string(), Some("torch".to_string())))
                .collect::<BTreeMap<_, _>>(),
        )
    }

    #[test]
    fn every_worker_computes_the_same_holders() {
        let all = members(&["w0", "w1", "w2"]);
        for task in ["a", "b", "german-legal-retrieval", "x-1"] {
            let held: Vec<&str> = ["w0", "w1", "w2"]
                .into_iter()
                .filter(|me| holds(&all, me, "torch", task, "torch", 2))
                .collect();
            assert_eq!(held.len(), 2, "{task}: {held:?}");
            let mut expected = holders(task, 2, ["w2", "w0", "w1"]);
            expected.sort();
            assert_eq!(held, expected);
        }
    }

    #[test]
    fn a_worker_leaving_moves_only_its_tasks() {
        let tasks: Vec<String> = (0..200).map(|i| format!("task-{i}")).collect();
        let before: Vec<Vec<&str>> = tasks
            .iter()
            .map(|t| holders(t, 1, ["w0", "w1", "w2"]))
            .collect();
        let after: Vec<Vec<&str>> = tasks.iter().map(|t| holders(t, 1, ["w0", "w1"])).collect();
        for (b, a) in before.iter().zip(&after) {
            if b[0] != "w2" {
                assert_eq!(a, b, "a task w2 did not hold moved");
            }
        }
        // Spread: each of three workers wins some of 200 tasks.
        for w in ["w0", "w1", "w2"] {
            assert!(before.iter().filter(|h| h[0] == w).count() > 30);
        }
    }

    #[test]
    fn other_runtimes_and_more_replicas_than_workers() {
        let mut map: BTreeMap<String, Option<String>> = BTreeMap::new();
        map.insert("c0".into(), Some("candle".into()));
        map.insert("t0".into(), Some("torch".into()));
        let all: Members = Arc::new(map);
        assert!(holds(&all, "t0", "torch", "t", "torch", 5));
        assert!(!holds(&all, "t0", "torch", "t", "candle", 5));
        assert!(holds(&all, "c0", "candle", "t", "candle", 1));
    }

    #[test]
    fn a_shadow_lies_on_another_worker_than_its_champion_while_there_is_one() {
        let all = members(&["w0", "w1", "w2"]);
        for task in ["a", "b", "german-legal-area", "x-1"] {
            let champion = holders_of(&all, task, "torch", 1);
            let key = format!("{task}.shadow");
            let shadow: Vec<&str> = ["w0", "w1", "w2"]
                .into_iter()
                .filter(|me| holds_shadow(&all, me, "torch", &key, "torch", 1, &champion))
                .collect();
            assert_eq!(shadow.len(), 1, "{task}: {shadow:?}");
            assert!(
                !champion.iter().any(|c| c == shadow[0]),
                "{task}: {shadow:?}"
            );
        }
        // One worker only: the shadow shares it rather than going unserved.
        let alone = members(&["w0"]);
        let champion = holders_of(&alone, "a", "torch", 1);
        assert!(holds_shadow(
            &alone, "w0", "torch", "a.shadow", "torch", 1, &champion
        ));
        // A shadow on another runtime than the worker's is not its own.
        assert!(!holds_shadow(
            &all,
            "w0",
            "torch",
            "a.shadow",
            "candle",
            1,
            &[]
        ));
    }
}
