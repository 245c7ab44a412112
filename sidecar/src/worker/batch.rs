//! The loop of one task: wait for runtime capacity, wait for demand, make sure the model is
//! loaded, fill a batch up to the token budget or the wait limit, and hand it to `run_batch`.
//! Requests wait as parts of at most one call's tokens (`parts.rs`) in per-key queues
//! (`fair.rs`), and the loop never waits on one request: a request it cannot answer now (a
//! newer epoch needed) is handed back.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{consumer::pull, consumer::Consumer, message::AckKind};
use futures::StreamExt;
use tokio::sync::{watch, Notify, OwnedSemaphorePermit};
use tokio_util::sync::CancellationToken;

use super::fair::{FairQueue, Queued};
use super::intake::{self, Envelope, Work};
use super::outcome::Settler;
use super::parts::{self, Answer, Held, Part};
use super::shadow::{self, ChampionGate};
use super::tokens::{self, TokenCounter};
use super::{TaskStatus, Workers};
use crate::clock::now_ms;
use crate::error::{Error, Result};
use crate::metrics::metrics;
use crate::protocol::{ClassifyItem, Code, ErrorBody, InferItem, Placement, ScoreItem};
use crate::residency::Readiness;
use crate::runtime::{Backend, Terms};

/// How long one idle pull waits for a first message before looking around again.
const IDLE_POLL: Duration = Duration::from_secs(1);
/// Most messages asked for in one pull while filling a batch.
const MAX_PULL: usize = 256;
/// Most requests held while one larger than a call is worked through (see `fill`).
const LOOKAHEAD: usize = 16;
/// Longest a fetch (a pull that takes only what is queued) may wait for its answer.
const FETCH_BOUND: Duration = Duration::from_secs(2);
/// How often the loop looks for new requests while it waits for a running part.
const BLOCKED_POLL: Duration = Duration::from_millis(10);

pub(super) struct TaskLoop {
    workers: Arc<Workers>,
    task: String,
    consumer: Consumer<pull::Config>,
    settler: Settler,
    placement: watch::Receiver<Placement>,
    status: Arc<TaskStatus>,
    /// Parts of the requests this worker holds that are not in a batch yet.
    carry: FairQueue<Part>,
    /// Told when a batch's parts leave the runtime (the next parts of their requests may go).
    finished: Arc<Notify>,
    /// When the requests waiting in `carry` are next sent progress acks.
    next_keep_alive: tokio::time::Instant,
    /// Messages the consumer still held undelivered when the last one reached us.
    queued: u64,
    /// Counts tokens with the desired placement's tokenizer; rebuilt when the model changes,
    /// or once its base folder has reached the artifact cache (the flag: it was there).
    counter: Option<(Arc<TokenCounter>, bool)>,
    batches: u64,
    /// A shadow placement's loop runs only while the champion is idle (`shadow.rs`).
    gate: Option<ChampionGate>,
}

impl TaskLoop {
    pub(super) fn new(
        workers: Arc<Workers>,
        task: String,
        consumer: Consumer<pull::Config>,
        settler: Settler,
        placement: watch::Receiver<Placement>,
        status: Arc<TaskStatus>,
        gate: Option<ChampionGate>,
    ) -> Self {
        Self {
            workers,
            task,
            consumer,
            settler,
            placement,
            status,
            carry: FairQueue::default(),
            finished: Arc::new(Notify::new()),
            next_keep_alive: tokio::time::Instant::now(),
            queued: 0,
            counter: None,
            batches: 0,
            gate,
        }
    }

    pub(super) async fn run(&mut self, stop: CancellationToken) {
        while !stop.is_cancelled() {
            // A pinned model loads without demand; report its epoch as soon as it serves.
            let desired = self.placement.borrow().clone();
            if self.workers.residency.is_loaded(&desired.model_key) {
                self.mark_serving(&desired);
            }
            // Wait for demand without a runtime slot: an idle task's loop holding one for its
            // whole poll kept the worker's busy tasks waiting for it (slots go first come
            // first served). One message is the most an idle loop takes ahead of capacity.
            if self.carry.is_empty() {
                tokio::select! {
                    _ = self.pull(1, Some(IDLE_POLL)) => {}
                    _ = stop.cancelled() => break,
                }
                if self.carry.is_empty() {
                    continue;
                }
            }
            // More is pulled only when the runtime can take another batch: the rest stays
            // shared with the other workers.
            let Some(permit) = self.wait_for_capacity(&stop).await else {
                break;
            };
            let desired = self.placement.borrow().clone();
            let Some(serving) = self.choose_model(&desired) else {
                self.wait_for_model(&desired, &stop).await;
                continue;
            };
            let (budget, wait) = serving.batch_limits(
                self.workers.config.max_batch_tokens,
                self.workers.config.max_batch_wait,
            );
            let budget = shadow::batch_budget(budget, self.gate.is_some());
            self.fill(budget, wait, &stop).await;
            self.fence(serving.epoch);
            if !self.champion_idle().await {
                drop(permit); // the runtime's room is the champion's while it works
                self.yield_to_champion(&stop).await;
                continue;
            }
            let batch = self.carry.take_batch(budget);
            if batch.is_empty() {
                if !self.carry.is_empty() {
                    // Only next parts of requests with a part running: wait for one to finish,
                    // looking for newly queued requests now and then.
                    self.keep_alive_if_due().await;
                    tokio::select! {
                        _ = self.finished.notified() => {}
                        _ = tokio::time::sleep(BLOCKED_POLL) => {}
                        _ = stop.cancelled() => {}
                    }
                }
                continue;
            }
            let running = parts::Running::new(&batch, self.finished.clone());
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
                (permit, running),
                batch_id,
            ));
        }
        // Hand back what this worker holds so that other workers take it at once.
        for held in distinct(&self.carry.drain()) {
            if let Some(envelope) = held.take() {
                let _ = envelope.msg.ack_with(AckKind::Nak(None)).await;
            }
        }
    }

    /// Always true for a champion's loop; for a shadow's, whether its champion is idle.
    async fn champion_idle(&mut self) -> bool {
        match self.gate.as_mut() {
            Some(gate) => gate.champion_idle().await,
            None => true,
        }
    }

    /// A shadow's loop while its champion works: waits until the champion is idle, shedding
    /// the copies whose deadline passes meanwhile (the gateway gives them a short one).
    async fn yield_to_champion(&mut self, stop: &CancellationToken) {
        loop {
            let now = now_ms();
            for part in self.carry.extract(|part| part.held.is_expired(now)) {
                if let Some(envelope) = part.held.take() {
                    self.settler.shed(envelope, "CHAMPION_BUSY").await;
                }
            }
            if self.carry.is_empty() || self.champion_idle().await || stop.is_cancelled() {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep(shadow::POLL) => {}
                _ = stop.cancelled() => return,
            }
        }
    }

    /// Waits for room in the runtime. Messages carried over from the last fill wait with us:
    /// progress acks keep them ours (`ack_wait` is short so that a dead worker's messages
    /// come back quickly). `None` when stopped.
    async fn wait_for_capacity(
        &mut self,
        stop: &CancellationToken,
    ) -> Option<OwnedSemaphorePermit> {
        let acquire = self.workers.inflight.clone().acquire_owned();
        tokio::pin!(acquire);
        loop {
            tokio::select! {
                p = &mut acquire => return Some(p.expect("semaphore is never closed")),
                _ = stop.cancelled() => return None,
                _ = tokio::time::sleep_until(self.next_keep_alive) => self.keep_alive().await,
            }
        }
    }

    /// Progress acks for every request with parts waiting here. Due every third of
    /// `ack_wait` whatever the loop does meanwhile: a request cut into parts stays with this
    /// worker for many calls, and the loop may cycle far more often than that.
    async fn keep_alive(&mut self) {
        for held in distinct(self.carry.iter()) {
            held.keep_alive().await;
        }
        let period = keep_alive_period(self.workers.config.ack_wait);
        self.next_keep_alive = tokio::time::Instant::now() + period;
    }

    async fn keep_alive_if_due(&mut self) {
        if tokio::time::Instant::now() >= self.next_keep_alive {
            self.keep_alive().await;
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
        let mut keep: Vec<Part> = Vec::new();
        let mut kept: HashMap<usize, bool> = HashMap::new();
        for part in self.carry.drain() {
            let id = Arc::as_ptr(&part.held) as usize;
            let keep_it = match kept.get(&id) {
                Some(&keep_it) => keep_it,
                None => {
                    let keep_it = match residency.ensure(desired) {
                        Readiness::Failed(error) => {
                            if let Some(envelope) = part.held.take() {
                                self.settler.fail(envelope, &Error::Runtime(error)).await;
                            }
                            false
                        }
                        _ if self.settler.is_last(part.held.delivered) => true,
                        _ => {
                            if let Some(envelope) = part.held.take() {
                                self.settler.retry_later(envelope, "MODEL_LOADING").await;
                            }
                            false
                        }
                    };
                    kept.insert(id, keep_it);
                    keep_it
                }
            };
            if keep_it && !part.held.is_settled() {
                keep.push(part);
            }
        }
        tracing::info!(task = %self.task, model_key = %desired.model_key, "waiting for model to load");
        let step = keep_alive_period(self.workers.config.ack_wait);
        loop {
            let readiness = tokio::select! {
                r = residency.wait(desired, step) => r,
                _ = stop.cancelled() => Readiness::Loading,
            };
            match readiness {
                Readiness::Ready => break,
                Readiness::Failed(error) => {
                    for held in distinct(&keep) {
                        if let Some(envelope) = held.take() {
                            self.settler
                                .fail(envelope, &Error::Runtime(error.clone()))
                                .await;
                        }
                    }
                    return;
                }
                Readiness::Loading if stop.is_cancelled() || keep.is_empty() => break,
                Readiness::Loading => {
                    for held in distinct(&keep) {
                        held.keep_alive().await;
                    }
                }
            }
        }
        for part in keep {
            self.carry.push(part);
        }
    }

    /// Epoch fencing: a request stamped with a minimum epoch newer than `serving` may not be
    /// answered by this worker now (its caller has already had a reply from a newer epoch).
    /// It is handed back at once (`Settler::hand_back`: a nak with delay, for a worker that
    /// serves that epoch - this one, once the newer model loads - or, on its last delivery, a
    /// retryable `EPOCH_BEHIND`), never held: the loop goes on serving everyone else.
    fn fence(&mut self, serving: u64) {
        let behind = self.carry.extract(|part| part.held.min_epoch > serving);
        for held in distinct(&behind) {
            if let Some(envelope) = held.take() {
                self.hand_back_behind(envelope, serving);
            }
        }
    }

    /// Hands back a request whose minimum epoch is above `serving` (settled aside: its reply
    /// may wait for a gateway, the loop must not).
    fn hand_back_behind(&self, envelope: Envelope, serving: u64) {
        tracing::debug!(
            task = %self.task,
            request_id = %envelope.request_id,
            min_epoch = envelope.min_epoch,
            serving,
            "request needs a newer epoch; handing it back"
        );
        let message = format!(
            "the request needs placement epoch {} or newer (X-Taskfleet-Min-Epoch), and the \
             workers of task {:?} still serve epoch {serving}; retry once the newer epoch loads",
            envelope.min_epoch, self.task
        );
        let error = ErrorBody::new(Code::EpochBehind, &message);
        let settler = self.settler.clone();
        tokio::spawn(async move { settler.hand_back(envelope, error).await });
    }

    /// Pulls more messages while the queue holds more, until the token `budget` is reached or
    /// the batch `wait` has passed (the sidecar's, or its runtime profile's, for this task). A
    /// request that finds the queue empty is sent at once.
    async fn fill(&mut self, budget: usize, wait: Duration, stop: &CancellationToken) {
        let deadline = Instant::now() + wait;
        // A request larger than one call is being worked through, and nothing pulled since it
        // says what queued behind it: look (without waiting) for requests of other keys, so
        // that the next call is shared fairly. At most LOOKAHEAD requests are held so.
        if self.carry.iter().any(|part| part.held.is_split()) {
            let room = LOOKAHEAD.saturating_sub(distinct(self.carry.iter()).len());
            if room > 0 {
                // The server answers a fetch at once (messages, or "no messages"); the bound
                // is for an answer lost on the way.
                tokio::select! {
                    _ = self.pull(room, None) => {}
                    _ = stop.cancelled() => return,
                }
            }
        }
        loop {
            let tokens = self.carry.tokens();
            let remaining = deadline.saturating_duration_since(Instant::now());
            let Some(want) = fill_want(tokens, self.carry.len(), budget, self.queued, remaining)
            else {
                return;
            };
            let pulled = tokio::select! {
                n = self.pull(want, Some(remaining)) => n,
                _ = stop.cancelled() => return,
            };
            if pulled == 0 {
                return;
            }
        }
    }

    /// One pull request, waiting up to `expires` for messages, or (`None`) taking only what the
    /// queue holds now; every message received is settled at once or kept in `carry`.
    /// Returns how many messages arrived.
    async fn pull(&mut self, max: usize, expires: Option<Duration>) -> usize {
        let messages = match expires {
            Some(expires) => {
                let pull = self.consumer.batch().max_messages(max).expires(expires);
                pull.messages().await
            }
            None => self.consumer.fetch().max_messages(max).messages().await,
        };
        let mut messages = match messages {
            Ok(messages) => messages,
            Err(e) => {
                tracing::warn!(task = %self.task, error = %e, "pull failed");
                tokio::time::sleep(Duration::from_millis(500)).await;
                return 0;
            }
        };
        let mut count = 0;
        loop {
            let next = match expires {
                Some(_) => messages.next().await,
                // The server answers a fetch at once (messages, or "no messages"): the bound
                // is for an answer lost on the way, and covers receiving only, never intake.
                None => tokio::time::timeout(FETCH_BOUND, messages.next())
                    .await
                    .unwrap_or(None),
            };
            let Some(message) = next else {
                break;
            };
            let message = match message {
                Ok(message) => message,
                Err(e) => {
                    tracing::warn!(task = %self.task, error = %e, "pull ended with an error");
                    break;
                }
            };
            count += 1;
            if let Ok(info) = message.info() {
                self.queued = info.pending;
            }
            let envelope = Envelope::new(message, self.status.held.clone());
            self.intake(envelope).await;
        }
        count
    }

    async fn intake(&mut self, envelope: Envelope) {
        if envelope.delivered > 1 {
            metrics().redeliveries.inc(&[&self.task]);
        }
        if envelope.is_expired(now_ms()) {
            self.settler.expire(envelope).await;
            return;
        }
        // Fenced before anything is decoded or tokenised: handing it back costs nothing.
        let serving = self
            .status
            .serving
            .lock()
            .expect("serving lock")
            .as_ref()
            .map(|p| p.epoch);
        if let Some(serving) = serving.filter(|&s| envelope.min_epoch > s) {
            // A request for the desired placement's epoch is demand for its model: a lazy
            // model starts loading now, or no request would ever reach the loop to load it
            // (every one asks for the new epoch and is handed back here).
            let desired = self.placement.borrow().clone();
            if desired.epoch >= envelope.min_epoch {
                let _ = self.workers.residency.ensure(&desired);
            }
            self.hand_back_behind(envelope, serving);
            return;
        }
        let workers = self.workers.clone();
        // The payload names the task; a shadow's loop runs under `<task>.shadow`.
        let task = self.placement.borrow().task.clone();
        match intake::decode_payload(&task, &envelope, &workers.payloads).await {
            Ok((work, payload_ref)) => {
                let counter = self.counter().await;
                let (work, counts) = tokens::prepare(&counter, work).await;
                let budget = workers.config.max_batch_tokens;
                for part in parts::split(envelope, payload_ref, work, &counts, budget) {
                    self.carry.push(part);
                }
            }
            // Settled aside: its error reply may wait for a gateway, the loop must not.
            Err(e) => {
                let settler = self.settler.clone();
                tokio::spawn(async move { settler.fail(envelope, &e).await });
            }
        }
    }
}

impl Queued for Part {
    fn key(&self) -> &str {
        &self.held.key
    }

    fn tokens(&self) -> usize {
        self.tokens
    }

    fn op(&self) -> &'static str {
        self.work.op()
    }

    fn is_gone(&self) -> bool {
        self.held.is_settled()
    }

    fn is_blocked(&self) -> bool {
        self.held.has_part_running()
    }
}

/// The requests these parts belong to, each once.
fn distinct<'a>(parts: impl IntoIterator<Item = &'a Part>) -> Vec<Arc<Held>> {
    let mut seen = HashSet::new();
    parts
        .into_iter()
        .filter(|part| seen.insert(Arc::as_ptr(&part.held)))
        .map(|part| part.held.clone())
        .collect()
}

impl TaskLoop {
    /// The token counter of the desired placement's model, read from its base folder in the
    /// artifact cache (off the loop: it is file I/O). A counter built before the base was
    /// fetched only estimates, so it is read again once the folder is there.
    async fn counter(&mut self) -> Arc<TokenCounter> {
        let desired = self.placement.borrow().clone();
        let cache = self.workers.residency.artifact_dir().to_path_buf();
        let base = desired.load_request(&cache).base_path;
        if let Some((counter, had_base)) = &self.counter {
            if counter.model_key == desired.model_key
                && (*had_base || !std::path::Path::new(&base).is_dir())
            {
                return counter.clone();
            }
        }
        let model_key = desired.model_key.clone();
        let (counter, had_base) = tokio::task::spawn_blocking(move || {
            let had_base = std::path::Path::new(&base).is_dir();
            (TokenCounter::for_placement(&desired, &cache), had_base)
        })
        .await
        .unwrap_or_else(|_| (TokenCounter::estimating(&model_key), false));
        let counter = Arc::new(counter);
        tracing::info!(
            task = %self.task,
            model_key = %counter.model_key,
            exact = counter.is_exact(),
            "counting tokens for batching"
        );
        self.counter = Some((counter.clone(), had_base));
        counter
    }
}

/// How many messages to ask for while filling a batch, or `None` to send it now: when the
/// token budget is reached, the batch wait is over, or the queue held nothing more when the
/// last message reached us (waiting would only delay a lone request). Never more than the
/// queue holds, so a pull does not wait out its expiry for messages that are not there.
fn fill_want(
    tokens: usize,
    held: usize,
    budget: usize,
    queued: u64,
    remaining: Duration,
) -> Option<usize> {
    if tokens >= budget || remaining < Duration::from_millis(1) || queued == 0 {
        return None;
    }
    let per_message = (tokens / held.max(1)).max(1);
    let want = ((budget - tokens) / per_message).clamp(1, MAX_PULL);
    Some(want.min(usize::try_from(queued).unwrap_or(usize::MAX)))
}

/// How often held messages get a progress ack: three times per `ack_wait`.
fn keep_alive_period(ack_wait: Duration) -> Duration {
    (ack_wait / 3).max(Duration::from_millis(100))
}

/// Runs one batch of parts on the runtime and settles each request whose parts have all
/// answered. Requests whose deadline has passed are expired first; if nothing is left the
/// batch does not run at all.
async fn run_batch(
    workers: Arc<Workers>,
    settler: Settler,
    batch: Vec<Part>,
    placement: Placement,
    permit: (OwnedSemaphorePermit, parts::Running),
    batch_id: String,
) {
    let now = now_ms();
    let mut live = Vec::with_capacity(batch.len());
    for part in batch {
        if part.held.is_settled() {
            continue;
        }
        if part.held.is_expired(now) {
            if let Some(envelope) = part.held.take() {
                settler.expire(envelope).await;
            }
        } else if !part.held.pin(&placement.model_key) {
            // Its first parts ran on the model served before: vectors of two models must not
            // make one reply, so the request runs again from the start.
            if let Some(envelope) = part.held.take() {
                let error = ErrorBody::new(
                    Code::ModelNotLoaded,
                    "the task's model changed while this request ran in parts; it runs again",
                );
                settler.hand_back(envelope, error).await;
            }
        } else {
            live.push(part);
        }
    }
    if live.is_empty() {
        return;
    }
    let Some(_in_use) = workers.residency.acquire(&placement.model_key) else {
        // Evicted or lost with a runtime restart between choosing and running.
        for held in distinct(&live) {
            if let Some(envelope) = held.take() {
                let error = ErrorBody::new(Code::ModelNotLoaded, "the model was unloaded");
                settler.hand_back(envelope, error).await;
            }
        }
        return;
    };
    let backend = match workers.runtime.backend() {
        Ok(backend) => backend,
        Err(e) => {
            fail_parts(&settler, &live, &e).await;
            return;
        }
    };
    let run = BatchRun {
        workers: &workers,
        settler: &settler,
        backend: &backend,
        placement: &placement,
    };
    let tokens: usize = live.iter().map(|p| p.tokens).sum();
    let count = live.len();
    let started = Instant::now();
    match run.infer(&batch_id, &live).await {
        Ok(results) => {
            let infer_ms = started.elapsed().as_millis() as u64;
            drop(permit);
            run.succeed(live, results).await;
            tracing::info!(
                task = %settler.task,
                %batch_id,
                tokens,
                count,
                infer_ms,
                epoch = placement.epoch,
                "batch done"
            );
        }
        Err(Error::Runtime(body)) if body.is(Code::DeadlineExceeded) => {
            // The runtime dropped it unrun: every deadline had passed while it queued there.
            drop(permit);
            for held in distinct(&live) {
                if let Some(envelope) = held.take() {
                    settler.expire(envelope).await;
                }
            }
        }
        Err(e) if count > 1 && matches!(e, Error::Runtime(ref b) if !b.retryable) => {
            // One poison input must not take the others down with it: run each part alone.
            tracing::warn!(task = %settler.task, %batch_id, error = %e, "batch failed; running its parts one by one");
            for (i, part) in live.into_iter().enumerate() {
                if part.held.is_settled() {
                    continue;
                }
                let single_id = format!("{batch_id}.{i}");
                let one = vec![part];
                match run.infer(&single_id, &one).await {
                    Ok(results) => run.succeed(one, results).await,
                    Err(e) => fail_parts(&settler, &one, &e).await,
                }
            }
            drop(permit);
        }
        Err(e) => {
            drop(permit);
            tracing::warn!(task = %settler.task, %batch_id, error = %e, "batch failed");
            fail_parts(&settler, &live, &e).await;
        }
    }
}

/// A failure of these parts is a failure of their requests (retried or dead-lettered).
async fn fail_parts(settler: &Settler, parts: &[Part], error: &Error) {
    for held in distinct(parts) {
        if let Some(envelope) = held.take() {
            settler.fail(envelope, error).await;
        }
    }
}

/// What running a batch needs, borrowed for the length of `run_batch`.
struct BatchRun<'a> {
    workers: &'a Arc<Workers>,
    settler: &'a Settler,
    backend: &'a Arc<dyn Backend>,
    placement: &'a Placement,
}

impl BatchRun<'_> {
    /// One runtime call (infer, score or classify) for these parts, one item each; long
    /// batches keep their messages from being redelivered elsewhere with progress acks.
    /// One answer per part, whatever the backend: a short answer must not drop requests.
    async fn infer(&self, batch_id: &str, batch: &[Part]) -> Result<Vec<Answer>> {
        let task = self.settler.task.as_str();
        // The runtime may hold the batch in its queue: past every deadline it drops it unrun.
        let deadline_ms = batch
            .iter()
            .map(|p| p.held.deadline_ms)
            .collect::<Option<Vec<u64>>>()
            .and_then(|all| all.into_iter().max());
        // A shadow's batch yields the CPU to champions' batches in the runtime (`Terms`).
        let terms = Terms {
            deadline_ms,
            background: self.placement.shadow,
        };
        let tokens: usize = batch.iter().map(|p| p.tokens).sum();
        metrics().batches.inc(&[task]);
        metrics()
            .batch_messages
            .observe(&[task], batch.len() as f64);
        metrics().batch_tokens.observe(&[task], tokens as f64);
        let started = Instant::now();
        let op = batch.first().map_or("embed", |p| p.work.op());
        let works = batch.iter().map(|p| p.work.clone()).collect();
        let infer = call_runtime(
            self.backend.as_ref(),
            batch_id.to_string(),
            &self.placement.model_key,
            works,
            terms,
        );
        tokio::pin!(infer);
        let period = keep_alive_period(self.workers.config.ack_wait);
        let mut progress = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        let held = distinct(batch);
        let result = loop {
            tokio::select! {
                result = &mut infer => break result,
                _ = progress.tick() => {
                    for request in &held {
                        request.keep_alive().await;
                    }
                }
            }
        };
        let metric_op = if op == "embed" { "infer" } else { op };
        metrics()
            .runtime_seconds
            .observe(&[metric_op], started.elapsed().as_secs_f64());
        let answers = result?;
        if answers.len() != batch.len() {
            return Err(Error::Protocol(format!(
                "runtime answered {} results for {} items",
                answers.len(),
                batch.len()
            )));
        }
        Ok(answers)
    }

    /// Files each part's answer; replies to every request whose parts have all answered (each
    /// reply waits for its gateway's confirmation).
    async fn succeed(&self, batch: Vec<Part>, answers: Vec<Answer>) {
        let settles = batch
            .into_iter()
            .zip(answers)
            .map(|(part, answer)| async move {
                let held = part.held;
                if held.is_settled() {
                    return; // failed or expired through another of its parts
                }
                let whole = match held.complete(part.indices, answer) {
                    Ok(None) => return, // parts of it still to come
                    Ok(Some(whole)) => whole,
                    Err(e) => {
                        if let Some(envelope) = held.take() {
                            self.settler.fail(envelope, &e).await;
                        }
                        return;
                    }
                };
                let Some(envelope) = held.take() else {
                    return;
                };
                let reply = whole.into_reply(
                    &envelope.request_id,
                    &self.placement.model_key,
                    self.placement.epoch,
                );
                let answered = self.settler.succeed(envelope, reply).await;
                if let (true, Some(key)) = (answered, &held.payload_ref) {
                    // The request is answered, so its object-store inputs are no longer needed
                    // (a dead letter keeps them for its replay).
                    self.workers.payloads.delete(key).await;
                }
            });
        futures::future::join_all(settles).await;
    }
}

/// One runtime call for a batch of parts of one op (`FairQueue::take_batch` never mixes ops); the
/// answers come back in request order.
async fn call_runtime(
    backend: &dyn Backend,
    batch_id: String,
    model_key: &str,
    works: Vec<Work>,
    terms: Terms,
) -> Result<Vec<Answer>> {
    let key = || model_key.to_string();
    match works.first() {
        None => Ok(Vec::new()),
        Some(Work::Embed { .. }) => {
            let mut items = Vec::with_capacity(works.len());
            for work in works {
                let Work::Embed { kind, texts } = work else {
                    return Err(Error::Protocol("a batch mixed ops".into()));
                };
                items.push(InferItem {
                    model_key: key(),
                    kind,
                    texts,
                });
            }
            let results = backend.infer(batch_id, items, terms).await?;
            Ok(results.into_iter().map(Answer::Embeddings).collect())
        }
        Some(Work::Score { .. }) => {
            let mut items = Vec::with_capacity(works.len());
            for work in works {
                let Work::Score { query, documents } = work else {
                    return Err(Error::Protocol("a batch mixed ops".into()));
                };
                items.push(ScoreItem {
                    model_key: key(),
                    query,
                    passages: documents,
                });
            }
            let results = backend.score(batch_id, items, terms).await?;
            Ok(results.into_iter().map(Answer::Scores).collect())
        }
        Some(Work::Classify { .. }) => {
            let mut items = Vec::with_capacity(works.len());
            for work in works {
                let Work::Classify { texts } = work else {
                    return Err(Error::Protocol("a batch mixed ops".into()));
                };
                items.push(ClassifyItem {
                    model_key: key(),
                    texts,
                });
            }
            let results = backend.classify(batch_id, items, terms).await?;
            Ok(results.into_iter().map(Answer::Probabilities).collect())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WAIT: Duration = Duration::from_millis(5);

    #[test]
    fn a_lone_request_is_sent_at_once() {
        // One message held, nothing else in the queue: no wait, whatever the batch wait.
        assert_eq!(fill_want(30, 1, 32768, 0, Duration::from_secs(60)), None);
    }

    #[test]
    fn a_batch_fills_only_with_what_the_queue_holds() {
        assert_eq!(fill_want(30, 1, 32768, 3, WAIT), Some(3));
        // 100 tokens per message so far: room for 327 more, at most MAX_PULL in one pull.
        assert_eq!(fill_want(100, 1, 32768, 10_000, WAIT), Some(MAX_PULL));
        assert_eq!(fill_want(30_000, 300, 32768, 10_000, WAIT), Some(27));
    }

    #[test]
    fn a_full_budget_or_a_spent_wait_sends_the_batch() {
        assert_eq!(fill_want(32768, 9, 32768, 50, WAIT), None);
        assert_eq!(fill_want(40000, 9, 32768, 50, WAIT), None);
        assert_eq!(fill_want(30, 1, 32768, 50, Duration::ZERO), None);
        assert_eq!(fill_want(0, 0, 32768, 1, WAIT), Some(1));
    }
}
