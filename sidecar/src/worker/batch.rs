//! The loop of one task: wait for runtime capacity, wait for demand, make sure the model is
//! loaded, fill a batch up to the token budget or the wait limit, and hand it to `run_batch`.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{consumer::pull, consumer::Consumer, message::AckKind};
use futures::StreamExt;
use tokio::sync::{watch, OwnedSemaphorePermit};
use tokio_util::sync::CancellationToken;

use super::intake::{self, Envelope, Pending};
use super::outcome::Settler;
use super::{now_ms, TaskStatus, Workers};
use crate::error::Error;
use crate::protocol::{InferItem, Placement, ReplyMessage};
use crate::residency::Readiness;

/// How long one idle pull waits for a first message before looking around again.
const IDLE_POLL: Duration = Duration::from_secs(1);
/// Most messages asked for in one pull while filling a batch.
const MAX_PULL: usize = 256;

pub(super) struct TaskLoop {
    workers: Arc<Workers>,
    task: String,
    consumer: Consumer<pull::Config>,
    settler: Settler,
    placement: watch::Receiver<Placement>,
    status: Arc<TaskStatus>,
    /// Decoded messages this worker holds that are not in a batch yet.
    carry: VecDeque<Pending>,
    batches: u64,
}

impl TaskLoop {
    pub(super) fn new(
        workers: Arc<Workers>,
        task: String,
        consumer: Consumer<pull::Config>,
        settler: Settler,
        placement: watch::Receiver<Placement>,
        status: Arc<TaskStatus>,
    ) -> Self {
        Self {
            workers,
            task,
            consumer,
            settler,
            placement,
            status,
            carry: VecDeque::new(),
            batches: 0,
        }
    }

    pub(super) async fn run(&mut self, stop: CancellationToken) {
        while !stop.is_cancelled() {
            // Pull only when the runtime can take another batch: the rest stays shared.
            let permit = tokio::select! {
                p = self.workers.inflight.clone().acquire_owned() => p.expect("semaphore is never closed"),
                _ = stop.cancelled() => break,
            };
            // A pinned model loads without demand; report its epoch as soon as it serves.
            let desired = self.placement.borrow().clone();
            if self.workers.residency.is_loaded(&desired.model_key) {
                self.mark_serving(&desired);
            }
            if self.carry.is_empty() {
                tokio::select! {
                    _ = self.pull(1, IDLE_POLL) => {}
                    _ = stop.cancelled() => break,
                }
                if self.carry.is_empty() {
                    continue;
                }
            }
            let desired = self.placement.borrow().clone();
            let Some(serving) = self.choose_model(&desired) else {
                self.wait_for_model(&desired, &stop).await;
                continue;
            };
            self.fill(&stop).await;
            let batch = self.take_batch();
            if batch.is_empty() {
                continue;
            }
            self.batches += 1;
            let batch_id = format!(
                "{}-{}-{}",
                self.workers.config.worker_id, self.task, self.batches
            );
            tokio::spawn(run_batch(
                self.workers.clone(),
                self.settler.clone(),
                batch,
                serving,
                permit,
                batch_id,
            ));
        }
        // Hand back what this worker holds so that other workers take it at once.
        for pending in self.carry.drain(..) {
            let _ = pending.envelope.msg.ack_with(AckKind::Nak(None)).await;
        }
    }

    /// The placement to serve with now: the desired one once its model is loaded, else the
    /// one served so far while its model is still loaded; `None` while nothing can serve.
    fn choose_model(&self, desired: &Placement) -> Option<Placement> {
        let residency = &self.workers.residency;
        if residency.ensure(desired) == Readiness::Ready {
            self.mark_serving(desired);
            return Some(desired.clone());
        }
        let serving = self.status.serving.lock().expect("serving lock").clone()?;
        residency.is_loaded(&serving.model_key).then_some(serving)
    }

    fn mark_serving(&self, placement: &Placement) {
        let mut serving = self.status.serving.lock().expect("serving lock");
        if serving.as_ref() != Some(placement) {
            tracing::info!(
                task = %self.task,
                epoch = placement.epoch,
                model_key = %placement.model_key,
                "serving placement"
            );
            *serving = Some(placement.clone());
        }
    }

    /// The model is not loaded: nak what we hold (with delay) and stop pulling until it is.
    /// A message on its last delivery is held instead (a nak would strand it) and kept alive
    /// with progress acks until the model is ready.
    async fn wait_for_model(&mut self, desired: &Placement, stop: &CancellationToken) {
        let residency = self.workers.residency.clone();
        let mut keep = Vec::new();
        for pending in self.carry.drain(..) {
            match residency.ensure(desired) {
                Readiness::Failed(error) => {
                    self.settler
                        .fail(pending.envelope, &Error::Runtime(error))
                        .await
                }
                _ if self.settler.is_last_delivery(&pending.envelope) => keep.push(pending),
                _ => self.settler.retry_later(pending.envelope).await,
            }
        }
        tracing::info!(task = %self.task, model_key = %desired.model_key, "waiting for model to load");
        let step = self.workers.config.ack_wait / 3;
        loop {
            let readiness = tokio::select! {
                r = residency.wait(desired, step) => r,
                _ = stop.cancelled() => Readiness::Loading,
            };
            match readiness {
                Readiness::Ready => {
                    self.carry.extend(keep);
                    return;
                }
                Readiness::Failed(error) => {
                    for pending in keep {
                        self.settler
                            .fail(pending.envelope, &Error::Runtime(error.clone()))
                            .await;
                    }
                    return;
                }
                Readiness::Loading if stop.is_cancelled() || keep.is_empty() => {
                    self.carry.extend(keep);
                    return;
                }
                Readiness::Loading => {
                    for pending in &keep {
                        let _ = pending.envelope.msg.ack_with(AckKind::Progress).await;
                    }
                }
            }
        }
    }

    /// Pulls more messages until the token budget is reached or the batch wait has passed.
    async fn fill(&mut self, stop: &CancellationToken) {
        let workers = self.workers.clone();
        let config = &workers.config;
        let deadline = Instant::now() + config.max_batch_wait;
        loop {
            let tokens: usize = self.carry.iter().map(|p| p.tokens).sum();
            if tokens >= config.max_batch_tokens {
                return;
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining < Duration::from_millis(1) {
                return;
            }
            let per_message = (tokens / self.carry.len().max(1)).max(1);
            let want = ((config.max_batch_tokens - tokens) / per_message).clamp(1, MAX_PULL);
            let pulled = tokio::select! {
                n = self.pull(want, remaining) => n,
                _ = stop.cancelled() => return,
            };
            if pulled == 0 {
                return;
            }
        }
    }

    /// Takes messages off the front while they fit the token budget (always at least one).
    fn take_batch(&mut self) -> Vec<Pending> {
        let budget = self.workers.config.max_batch_tokens;
        let mut batch = Vec::new();
        let mut tokens = 0;
        while let Some(next) = self.carry.front() {
            if !batch.is_empty() && tokens + next.tokens > budget {
                break;
            }
            tokens += next.tokens;
            batch.push(self.carry.pop_front().expect("front exists"));
        }
        batch
    }

    /// One pull request; every message received is settled at once or kept in `carry`.
    /// Returns how many messages arrived.
    async fn pull(&mut self, max: usize, expires: Duration) -> usize {
        let messages = self
            .consumer
            .batch()
            .max_messages(max)
            .expires(expires)
            .messages()
            .await;
        let mut messages = match messages {
            Ok(messages) => messages,
            Err(e) => {
                tracing::warn!(task = %self.task, error = %e, "pull failed");
                tokio::time::sleep(Duration::from_millis(500)).await;
                return 0;
            }
        };
        let mut count = 0;
        while let Some(message) = messages.next().await {
            let message = match message {
                Ok(message) => message,
                Err(e) => {
                    tracing::warn!(task = %self.task, error = %e, "pull ended with an error");
                    break;
                }
            };
            count += 1;
            let envelope = Envelope::new(message, self.status.held.clone());
            self.intake(envelope).await;
        }
        count
    }

    async fn intake(&mut self, envelope: Envelope) {
        if envelope.is_expired(now_ms()) {
            self.settler.expire(envelope).await;
            return;
        }
        let workers = self.workers.clone();
        match intake::decode_payload(&self.task, &envelope, workers.payloads()).await {
            Ok((kind, texts, payload_ref)) => {
                let tokens = intake::estimate_tokens(&texts);
                self.carry.push_back(Pending {
                    envelope,
                    kind,
                    texts,
                    payload_ref,
                    tokens,
                });
            }
            Err(e) => self.settler.fail(envelope, &e).await,
        }
    }
}

/// Runs one batch on the runtime and settles each of its messages.
async fn run_batch(
    workers: Arc<Workers>,
    settler: Settler,
    batch: Vec<Pending>,
    placement: Placement,
    permit: OwnedSemaphorePermit,
    batch_id: String,
) {
    let started = Instant::now();
    let Some(_in_use) = workers.residency.acquire(&placement.model_key) else {
        // Evicted or lost with a runtime restart between choosing and running.
        for pending in batch {
            settler.retry_later(pending.envelope).await;
        }
        return;
    };
    let client = match workers.runtime.client() {
        Ok(client) => client,
        Err(e) => {
            for pending in batch {
                settler.fail(pending.envelope, &e).await;
            }
            return;
        }
    };
    let mut envelopes = Vec::with_capacity(batch.len());
    let mut items = Vec::with_capacity(batch.len());
    let mut tokens = 0;
    for pending in batch {
        tokens += pending.tokens;
        items.push(InferItem {
            model_key: placement.model_key.clone(),
            kind: pending.kind,
            texts: pending.texts,
        });
        envelopes.push((pending.envelope, pending.payload_ref));
    }
    let infer = client.infer(batch_id.clone(), items);
    tokio::pin!(infer);
    // Long batches keep their messages from being redelivered elsewhere.
    let period = (workers.config.ack_wait / 3).max(Duration::from_millis(100));
    let mut progress = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    let result = loop {
        tokio::select! {
            result = &mut infer => break result,
            _ = progress.tick() => {
                for (envelope, _) in &envelopes {
                    let _ = envelope.msg.ack_with(AckKind::Progress).await;
                }
            }
        }
    };
    drop(permit);
    let infer_ms = started.elapsed().as_millis() as u64;
    match result {
        Ok(reply) => {
            for ((envelope, payload_ref), result) in envelopes.into_iter().zip(reply.results) {
                let reply = ReplyMessage::ok(
                    &envelope.request_id,
                    &placement.model_key,
                    placement.epoch,
                    result,
                );
                settler.succeed(envelope, reply).await;
                if let Some(key) = payload_ref {
                    delete_payload(&workers, &key).await;
                }
            }
            tracing::info!(
                task = %settler.task,
                %batch_id,
                tokens,
                infer_ms,
                epoch = placement.epoch,
                "batch done"
            );
        }
        Err(e) => {
            tracing::warn!(task = %settler.task, %batch_id, error = %e, "batch failed");
            for (envelope, _) in envelopes {
                settler.fail(envelope, &e).await;
            }
        }
    }
}

/// The request is answered, so its object-store inputs are no longer needed.
async fn delete_payload(workers: &Workers, key: &str) {
    let deleted = match workers.payloads().await {
        Ok(store) => store.delete(key).await.map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    if let Err(e) = deleted {
        tracing::warn!(key, error = %e, "could not delete payload object");
    }
}
