//! One loop per placed task: pulls from the durable consumer `task_<task>` on stream `TASKS`
//! (all workers share it, so the consumer is one queue with competing workers), forms batches
//! from local state and runs them on the runtime. `Workers` starts and stops the task loops as
//! placements come and go, and keeps residency in line with them.

mod batch;
mod fair;
pub mod intake;
pub mod outcome;
mod parts;
pub mod tokens;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::error::Result;
use crate::members::{self, Members};
use crate::nats;
use crate::placement::Placements;
use crate::protocol::Placement;
use crate::residency::Residency;
use crate::runtime::supervisor::Runtime;

#[derive(Debug, Clone)]
pub struct WorkerConfig {
    pub worker_id: String,
    /// The runtime kind of this worker; it serves only placements that name it.
    pub runtime: String,
    pub max_batch_tokens: usize,
    pub max_batch_wait: Duration,
    /// Batches in the runtime's queue at once; more waiting messages stay in JetStream.
    pub max_inflight_batches: usize,
    pub ack_wait: Duration,
    pub max_deliver: i64,
    pub nak_delay: Duration,
}

/// What a task loop reports for heartbeats.
#[derive(Default)]
pub struct TaskStatus {
    /// Messages pulled and not yet settled.
    pub held: Arc<AtomicU64>,
    /// The placement whose model this worker serves the task with now.
    pub serving: Mutex<Option<Placement>>,
}

pub type TaskStatuses = Arc<Mutex<BTreeMap<String, Arc<TaskStatus>>>>;

pub struct Workers {
    pub client: async_nats::Client,
    pub js: jetstream::Context,
    pub residency: Arc<Residency>,
    pub runtime: Arc<Runtime>,
    pub config: WorkerConfig,
    pub statuses: TaskStatuses,
    inflight: Arc<Semaphore>,
    payloads: Arc<nats::Payloads>,
}

struct Running {
    placement: watch::Sender<Placement>,
    stop: CancellationToken,
    handle: JoinHandle<()>,
}

impl Workers {
    pub fn new(
        client: async_nats::Client,
        residency: Arc<Residency>,
        runtime: Arc<Runtime>,
        config: WorkerConfig,
    ) -> Arc<Self> {
        let js = jetstream::new(client.clone());
        Arc::new(Self {
            payloads: Arc::new(nats::Payloads::new(js.clone())),
            js,
            client,
            residency,
            runtime,
            inflight: Arc::new(Semaphore::new(config.max_inflight_batches.max(1))),
            config,
            statuses: Arc::default(),
        })
    }

    /// Follows the placements until `shutdown`, then lets running batches finish.
    pub async fn run(
        self: Arc<Self>,
        mut placements: watch::Receiver<Placements>,
        mut members: watch::Receiver<Option<Members>>,
        shutdown: CancellationToken,
    ) {
        let mut running: HashMap<String, Running> = HashMap::new();
        loop {
            let live = members.borrow_and_update().clone();
            let desired = self.mine(&placements.borrow_and_update(), live.as_ref());
            for (task, placement) in desired.iter() {
                match running.get(task) {
                    Some(r) => {
                        r.placement.send_if_modified(|p| {
                            let changed = p != placement;
                            *p = placement.clone();
                            changed
                        });
                    }
                    None => {
                        running.insert(task.clone(), self.start_task(placement.clone()));
                    }
                }
            }
            let gone: Vec<String> = running
                .keys()
                .filter(|t| !desired.contains_key(*t))
                .cloned()
                .collect();
            for task in gone {
                tracing::info!(%task, "task no longer placed; stopping its loop");
                if let Some(r) = running.remove(&task) {
                    r.stop.cancel();
                    let _ = r.handle.await;
                }
                self.statuses.lock().expect("statuses lock").remove(&task);
            }
            let serving: HashSet<String> = self.serving_model_keys();
            let list: Vec<Placement> = desired.values().cloned().collect();
            self.residency.sync(&list, &serving).await;
            tokio::select! {
                changed = placements.changed() => if changed.is_err() { break },
                changed = members.changed() => if changed.is_err() { break },
                _ = shutdown.cancelled() => break,
                // Re-sync now and then: models a task stopped serving can be unloaded.
                _ = tokio::time::sleep(Duration::from_secs(10)) => {}
            }
        }
        for r in running.values() {
            r.stop.cancel();
        }
        for (_, r) in running {
            let _ = r.handle.await;
        }
    }

    /// The placements this worker holds: those that name its runtime and for which it is one
    /// of the `replicas` workers rendezvous hashing picks among the live workers of that runtime
    /// (`members.rs`; nothing until the live set has been read once). A placement that moves
    /// to another runtime or another worker leaves this worker's loops (and, once idle, its
    /// memory); the loop hands back what it holds.
    fn mine(&self, placements: &Placements, live: Option<&Members>) -> BTreeMap<String, Placement> {
        let Some(live) = live else {
            return BTreeMap::new();
        };
        let me = self.config.worker_id.as_str();
        let kind = self.config.runtime.as_str();
        placements
            .iter()
            .filter(|(task, p)| {
                let ours = members::holds(live, me, kind, task, &p.runtime, p.replicas);
                if !ours {
                    tracing::debug!(%task, runtime = %p.runtime, replicas = p.replicas, "held by other workers");
                }
                ours
            })
            .map(|(task, p)| (task.clone(), p.clone()))
            .collect()
    }

    /// Waits until the batches already sent to the runtime have finished (at most `timeout`).
    pub async fn drain(&self, timeout: Duration) {
        let all = self.config.max_inflight_batches.max(1) as u32;
        if tokio::time::timeout(timeout, self.inflight.acquire_many(all))
            .await
            .is_err()
        {
            tracing::warn!("in-flight batches did not finish in time");
        }
    }

    fn serving_model_keys(&self) -> HashSet<String> {
        let statuses = self.statuses.lock().expect("statuses lock");
        statuses
            .values()
            .filter_map(|s| {
                s.serving
                    .lock()
                    .expect("serving lock")
                    .as_ref()
                    .map(|p| p.model_key.clone())
            })
            .collect()
    }

    fn start_task(self: &Arc<Self>, placement: Placement) -> Running {
        let task = placement.task.clone();
        tracing::info!(%task, "starting task loop");
        let status = Arc::new(TaskStatus::default());
        self.statuses
            .lock()
            .expect("statuses lock")
            .insert(task.clone(), status.clone());
        let (tx, rx) = watch::channel(placement);
        let stop = CancellationToken::new();
        let handle = tokio::spawn(self.clone().run_task(task, rx, status, stop.clone()));
        Running {
            placement: tx,
            stop,
            handle,
        }
    }

    /// The task's durable pull consumer, created with our settings when missing (workers are
    /// the one role that creates it: `nats::task_consumer`).
    async fn consumer(&self, task: &str) -> Result<jetstream::consumer::Consumer<pull::Config>> {
        let stream = nats::tasks_stream(&self.js).await?;
        // Failing messages of this task end up there; it must exist before the first one.
        nats::dlq_stream(&self.js).await?;
        let config =
            nats::task_consumer_config(task, self.config.ack_wait, self.config.max_deliver);
        nats::task_consumer(&stream, config).await
    }

    async fn run_task(
        self: Arc<Self>,
        task: String,
        placement: watch::Receiver<Placement>,
        status: Arc<TaskStatus>,
        stop: CancellationToken,
    ) {
        let consumer = loop {
            match self.consumer(&task).await {
                Ok(consumer) => break consumer,
                Err(e) => tracing::error!(%task, error = %e, "no consumer yet; retrying"),
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(2)) => {}
                _ = stop.cancelled() => return,
            }
        };
        let max_deliver = consumer.cached_info().config.max_deliver;
        let settler = outcome::Settler {
            client: self.client.clone(),
            js: self.js.clone(),
            task: task.clone(),
            max_deliver,
            nak_delay: self.config.nak_delay,
            payloads: self.payloads.clone(),
        };
        let mut task_loop = batch::TaskLoop::new(self, task, consumer, settler, placement, status);
        task_loop.run(stop).await;
    }
}

pub(crate) fn held_count(status: &TaskStatus) -> u64 {
    status.held.load(Ordering::Relaxed)
}
