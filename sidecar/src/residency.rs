//! Which models are loaded in the runtime. Pinned models are loaded at once and never evicted;
//! lazy models load on first demand and the least recently used idle lazy model is unloaded
//! when loading another would exceed the memory budget. After a runtime restart every model
//! that was loaded (or loading) is loaded again.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::artifacts::ArtifactCache;
use crate::error::{Error, Result};
use crate::metrics::metrics;
use crate::protocol::{ArtifactRef, Code, ErrorBody, LoadRequest, Placement};
use crate::runtime::supervisor::Runtime;

/// How soon a failed load may be tried again on demand.
const RETRY_FAILED_LOAD: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, PartialEq)]
pub enum Readiness {
    Ready,
    Loading,
    Failed(ErrorBody),
}

#[derive(Debug, Clone)]
enum Status {
    Loading,
    Loaded,
    /// Its unload is on the way to the runtime: no batch may take it any more (the runtime
    /// would answer "not loaded"), and a demand for it waits until it is gone and loads it anew.
    Unloading,
    Failed {
        error: ErrorBody,
        retry_at: Instant,
    },
}

#[derive(Debug)]
struct Model {
    request: LoadRequest,
    /// Fetched into the cache and verified before every load.
    artifacts: Vec<ArtifactRef>,
    estimate: u64,
    pinned: bool,
    status: Status,
    /// What unloading this key would free, as last reported by the runtime.
    bytes: u64,
    last_used: Instant,
    in_use: usize,
    loader_running: bool,
}

#[derive(Default)]
struct State {
    models: HashMap<String, Model>,
    /// Total runtime memory as last reported by `stats` (or summed from load replies).
    used: u64,
}

impl State {
    /// Marks a loaded model busy; false when it is not loaded (or being unloaded).
    fn take(&mut self, key: &str) -> bool {
        let Some(model) = self.models.get_mut(key) else {
            return false;
        };
        if !matches!(model.status, Status::Loaded) {
            return false;
        }
        model.in_use += 1;
        model.last_used = Instant::now();
        true
    }

    /// Whether `key` is to be unloaded in the runtime: a loaded model that no batch holds is
    /// marked `Unloading` in the same step, so no batch takes it between this check and the
    /// runtime's unload. `None` when it must stay (a batch took it since it was chosen).
    fn begin_unload(&mut self, key: &str) -> Option<bool> {
        match self.models.get_mut(key) {
            Some(model) if matches!(model.status, Status::Loaded) => {
                if model.in_use > 0 {
                    return None;
                }
                model.status = Status::Unloading;
                Some(true)
            }
            _ => Some(false),
        }
    }

    /// The runtime refused the unload: a model still marked `Unloading` serves again.
    fn cancel_unload(&mut self, key: &str) {
        if let Some(model) = self.models.get_mut(key) {
            if matches!(model.status, Status::Unloading) {
                model.status = Status::Loaded;
            }
        }
    }
}

pub struct Residency {
    runtime: Arc<Runtime>,
    artifacts: Arc<ArtifactCache>,
    budget: u64,
    state: Mutex<State>,
    /// One load or eviction sequence at a time, so two loads never both count the same room.
    load_lock: tokio::sync::Mutex<()>,
    /// Bumped on every status change; waiters re-check.
    changed: watch::Sender<u64>,
}

/// Marks a model as busy (in a running batch) so that it is not evicted under the batch.
pub struct InUse {
    residency: Arc<Residency>,
    key: String,
}

impl Drop for InUse {
    fn drop(&mut self) {
        let mut state = self.residency.lock();
        if let Some(model) = state.models.get_mut(&self.key) {
            model.in_use = model.in_use.saturating_sub(1);
            model.last_used = Instant::now();
        }
        drop(state);
        // A load waiting for room may now evict this model.
        self.residency.notify();
    }
}

impl Residency {
    pub fn new(runtime: Arc<Runtime>, budget: u64, artifacts: Arc<ArtifactCache>) -> Arc<Self> {
        Arc::new(Self {
            runtime,
            artifacts,
            budget,
            state: Mutex::new(State::default()),
            load_lock: tokio::sync::Mutex::new(()),
            changed: watch::Sender::new(0),
        })
    }

    /// The artifact cache's folder (`<dir>/sha256/<digest>` per artifact).
    pub fn artifact_dir(&self) -> &std::path::Path {
        self.artifacts.dir()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("residency lock")
    }

    fn notify(&self) {
        self.changed.send_modify(|v| *v += 1);
    }

    pub fn budget(&self) -> u64 {
        self.budget
    }

    pub fn used(&self) -> u64 {
        self.lock().used
    }

    /// Model keys loaded now, sorted.
    pub fn loaded(&self) -> Vec<String> {
        let state = self.lock();
        let mut keys: Vec<String> = state
            .models
            .iter()
            .filter(|(_, m)| matches!(m.status, Status::Loaded))
            .map(|(k, _)| k.clone())
            .collect();
        keys.sort();
        keys
    }

    pub fn is_loaded(&self, key: &str) -> bool {
        self.lock()
            .models
            .get(key)
            .is_some_and(|m| matches!(m.status, Status::Loaded))
    }

    /// Whether the placement's model can serve now; starts loading it when it is not loaded.
    pub fn ensure(self: &Arc<Self>, placement: &Placement) -> Readiness {
        let key = placement.model_key.clone();
        let mut state = self.lock();
        let model = state.models.entry(key.clone()).or_insert_with(|| Model {
            request: placement.load_request(self.artifacts.dir()),
            artifacts: placement.artifacts(),
            estimate: placement.memory_bytes,
            pinned: placement.pinned,
            status: Status::Loading,
            bytes: 0,
            last_used: Instant::now(),
            in_use: 0,
            loader_running: false,
        });
        model.last_used = Instant::now();
        let readiness = match &model.status {
            Status::Loaded => return Readiness::Ready,
            // `unload` forgets it and notifies; the next demand loads it again.
            Status::Unloading => return Readiness::Loading,
            Status::Loading => Readiness::Loading,
            Status::Failed { retry_at, .. } if Instant::now() >= *retry_at => {
                model.status = Status::Loading;
                Readiness::Loading
            }
            Status::Failed { error, .. } => return Readiness::Failed(error.clone()),
        };
        if !model.loader_running {
            model.loader_running = true;
            drop(state);
            tokio::spawn(self.clone().load(key));
        }
        readiness
    }

    /// Marks a loaded model busy for the life of the guard; `None` when it is not loaded.
    pub fn acquire(self: &Arc<Self>, key: &str) -> Option<InUse> {
        if !self.lock().take(key) {
            return None;
        }
        Some(InUse {
            residency: self.clone(),
            key: key.to_string(),
        })
    }

    /// Waits until the model is ready or failed, at most `timeout`.
    pub async fn wait(self: &Arc<Self>, placement: &Placement, timeout: Duration) -> Readiness {
        let mut changes = self.changed.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let readiness = self.ensure(placement);
            if readiness != Readiness::Loading {
                return readiness;
            }
            if tokio::time::timeout_at(deadline, changes.changed())
                .await
                .is_err()
            {
                return Readiness::Loading;
            }
        }
    }

    /// Brings residency in line with the desired placements: pins follow the placements,
    /// pinned models load now, and models no placement (and no running task) names are unloaded.
    pub async fn sync(self: &Arc<Self>, placements: &[Placement], keep: &HashSet<String>) {
        let pinned: HashSet<&str> = placements
            .iter()
            .filter(|p| p.pinned)
            .map(|p| p.model_key.as_str())
            .collect();
        let wanted: HashSet<&str> = placements.iter().map(|p| p.model_key.as_str()).collect();
        self.artifacts.set_in_use(
            placements
                .iter()
                .flat_map(|p| p.artifacts())
                .map(|a| a.sha256)
                .collect(),
        );
        let unwanted: Vec<String> = {
            let mut state = self.lock();
            for (key, model) in state.models.iter_mut() {
                model.pinned = pinned.contains(key.as_str());
            }
            state
                .models
                .iter()
                .filter(|(k, m)| {
                    !wanted.contains(k.as_str()) && !keep.contains(*k) && m.in_use == 0
                })
                .map(|(k, _)| k.clone())
                .collect()
        };
        for placement in placements.iter().filter(|p| p.pinned) {
            self.ensure(placement);
        }
        for key in unwanted {
            let _guard = self.load_lock.lock().await;
            self.unload(&key).await;
        }
    }

    async fn load(self: Arc<Self>, key: String) {
        // The weights first: fetched into the cache when missing, verified against the
        // placement's digests; nothing else is ever loaded.
        let wanted = self.lock().models.get(&key).map(|m| m.artifacts.clone());
        for artifact in wanted.unwrap_or_default() {
            if let Err(e) = self.artifacts.ensure(&artifact).await {
                self.finish_load(&key, Err(e));
                self.notify();
                return;
            }
        }
        loop {
            let connected = self.runtime.connected().await;
            let guard = self.load_lock.lock().await;
            let Some((request, estimate, pinned)) = self.pending_load(&key) else {
                return;
            };
            self.make_room(estimate, &key).await;
            if self.used() + estimate > self.budget
                && !pinned
                && self.fits_once_idle(&key, estimate)
            {
                // Room is held by lazy models in a running batch: wait until they are idle
                // and can be evicted. The model stays "loading": its requests wait in the
                // queue instead of failing.
                drop(guard);
                let mut changes = self.changed.subscribe();
                let _ = tokio::time::timeout(Duration::from_millis(500), changes.changed()).await;
                continue;
            }
            let result = if self.used() + estimate > self.budget && !pinned {
                Err(Error::Runtime(ErrorBody::new(
                    Code::OutOfMemory,
                    &format!(
                        "model {key} needs ~{estimate} bytes; {} of {} bytes are held by \
                         pinned or busy models",
                        self.used(),
                        self.budget
                    ),
                )))
            } else {
                tracing::info!(model_key = %key, estimate, pinned, "loading model");
                let started = Instant::now();
                let loaded = connected.backend.load(request).await;
                metrics()
                    .runtime_seconds
                    .observe(&["load"], started.elapsed().as_secs_f64());
                loaded
            };
            if let Err(Error::RuntimeUnavailable(reason)) = &result {
                // The runtime is restarting; load into the next one.
                tracing::warn!(model_key = %key, %reason, "load interrupted; retrying");
                drop(guard);
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            self.finish_load(&key, result);
            self.refresh_memory().await;
            // The estimate may have been low: get back under budget by evicting idle lazy models.
            self.make_room(0, &key).await;
            self.notify();
            return;
        }
    }

    fn finish_load(&self, key: &str, result: Result<u64>) {
        let mut state = self.lock();
        let Some(model) = state.models.get_mut(key) else {
            return;
        };
        model.loader_running = false;
        metrics()
            .loads
            .inc(&[if result.is_ok() { "ok" } else { "failed" }]);
        match result {
            Ok(memory_bytes) => {
                tracing::info!(model_key = %key, memory_bytes, "model loaded");
                model.status = Status::Loaded;
                model.bytes = memory_bytes;
                model.last_used = Instant::now();
                state.used += memory_bytes;
            }
            Err(e) => {
                tracing::error!(model_key = %key, error = %e, "model load failed");
                model.status = Status::Failed {
                    error: e.to_body(),
                    retry_at: Instant::now() + RETRY_FAILED_LOAD,
                };
            }
        }
    }

    /// What to load for `key`, or `None` (and the loader stops) when it is no longer wanted.
    fn pending_load(&self, key: &str) -> Option<(LoadRequest, u64, bool)> {
        let mut state = self.lock();
        let model = state.models.get_mut(key)?;
        if !matches!(model.status, Status::Loading) {
            model.loader_running = false;
            return None;
        }
        let model = state.models.get(key)?;
        // Adapters on a base that is already loaded add little; do not evict for the base.
        let base_loaded = state.models.values().any(|m| {
            matches!(m.status, Status::Loaded) && m.request.base_path == model.request.base_path
        });
        let estimate = if base_loaded { 0 } else { model.estimate };
        Some((model.request.clone(), estimate, model.pinned))
    }

    /// Whether `extra` bytes would fit once the lazy models now busy in batches are evicted.
    fn fits_once_idle(&self, exclude: &str, extra: u64) -> bool {
        let state = self.lock();
        let busy_lazy: u64 = state
            .models
            .iter()
            .filter(|(k, m)| {
                k.as_str() != exclude
                    && !m.pinned
                    && m.in_use > 0
                    && matches!(m.status, Status::Loaded)
            })
            .map(|(_, m)| m.bytes)
            .sum();
        busy_lazy > 0 && state.used.saturating_sub(busy_lazy) + extra <= self.budget
    }

    /// Unloads least recently used idle lazy models until `extra` more bytes fit the budget.
    async fn make_room(&self, extra: u64, exclude: &str) {
        loop {
            let victim = {
                let state = self.lock();
                if state.used + extra <= self.budget {
                    return;
                }
                state
                    .models
                    .iter()
                    .filter(|(k, m)| {
                        k.as_str() != exclude
                            && !m.pinned
                            && m.in_use == 0
                            && matches!(m.status, Status::Loaded)
                    })
                    .min_by_key(|(_, m)| m.last_used)
                    .map(|(k, _)| k.clone())
            };
            let Some(victim) = victim else { return };
            tracing::info!(model_key = %victim, "evicting least recently used model");
            if !self.unload(&victim).await {
                return;
            }
            metrics().evictions.inc(&[]);
        }
    }

    /// Unloads a model and forgets it; false when the runtime refused or a batch took the
    /// model since it was chosen.
    async fn unload(&self, key: &str) -> bool {
        let Some(loaded) = self.lock().begin_unload(key) else {
            return false;
        };
        if loaded {
            let refused = match self.runtime.backend() {
                Ok(backend) => backend.unload(key).await.err(),
                Err(e) => Some(e),
            };
            if let Some(e) = refused {
                tracing::warn!(model_key = %key, error = %e, "unload failed");
                self.lock().cancel_unload(key);
                self.notify();
                return false;
            }
            tracing::info!(model_key = %key, "model unloaded");
        }
        {
            let mut state = self.lock();
            if let Some(model) = state.models.remove(key) {
                state.used = state.used.saturating_sub(model.bytes);
            }
        }
        self.refresh_memory().await;
        self.notify();
        true
    }

    /// Replaces our byte counts with the runtime's own (shared bases make sums inexact).
    async fn refresh_memory(&self) {
        let Ok(backend) = self.runtime.backend() else {
            return;
        };
        let Ok(stats) = backend.stats().await else {
            return;
        };
        let mut state = self.lock();
        state.used = stats.memory_bytes;
        for reported in stats.models {
            if let Some(model) = state.models.get_mut(&reported.model_key) {
                model.bytes = reported.memory_bytes;
            }
        }
    }

    /// Follows runtime restarts: while it is down nothing is loaded; once a new runtime is
    /// connected, everything that was loaded or wanted is loaded again.
    pub async fn follow_runtime(self: Arc<Self>, shutdown: CancellationToken) {
        let mut runtime = self.runtime.subscribe();
        let mut seen_generation = 0;
        loop {
            let generation = runtime.borrow_and_update().as_ref().map(|c| c.generation);
            match generation {
                Some(generation) if generation != seen_generation => {
                    if seen_generation != 0 {
                        tracing::info!(generation, "runtime restarted; loading models again");
                    }
                    seen_generation = generation;
                    self.reload_all();
                }
                Some(_) => {}
                None => self.forget_loaded(),
            }
            tokio::select! {
                changed = runtime.changed() => if changed.is_err() { return },
                _ = shutdown.cancelled() => return,
            }
        }
    }

    fn forget_loaded(&self) {
        let mut state = self.lock();
        state.used = 0;
        for model in state.models.values_mut() {
            model.status = Status::Loading;
            model.bytes = 0;
        }
        drop(state);
        self.notify();
    }

    fn reload_all(self: &Arc<Self>) {
        let mut keys: Vec<(bool, String)> = {
            let mut state = self.lock();
            state.used = 0;
            state
                .models
                .iter_mut()
                .filter(|(_, m)| !m.loader_running)
                .map(|(k, m)| {
                    m.status = Status::Loading;
                    m.loader_running = true;
                    (!m.pinned, k.clone())
                })
                .collect()
        };
        // Pinned first: they serve right away and must not wait behind lazy ones.
        keys.sort();
        for (_, key) in keys {
            tokio::spawn(self.clone().load(key));
        }
        self.notify();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state_with(key: &str, status: Status) -> State {
        let mut state = State::default();
        state.models.insert(
            key.to_string(),
            Model {
                request: LoadRequest {
                    id: 0,
                    model_key: key.to_string(),
                    base_path: "/models/m".into(),
                    adapter_path: None,
                    query_prefix: String::new(),
                    passage_prefix: String::new(),
                    max_seq_length: None,
                    settings: None,
                },
                artifacts: Vec::new(),
                estimate: 0,
                pinned: false,
                status,
                bytes: 100,
                last_used: Instant::now(),
                in_use: 0,
                loader_running: false,
            },
        );
        state
    }

    #[test]
    fn a_model_on_its_way_out_cannot_be_taken_by_a_batch() {
        let mut state = state_with("m", Status::Loaded);
        assert_eq!(state.begin_unload("m"), Some(true));
        // Before: the model stayed `Loaded` while the runtime unloaded it, a batch took it in
        // that gap and the runtime answered MODEL_NOT_LOADED (dead-lettered on a last delivery).
        assert!(!state.take("m"));
        assert_eq!(state.models["m"].in_use, 0);
    }

    #[test]
    fn a_model_a_batch_took_since_it_was_chosen_stays() {
        let mut state = state_with("m", Status::Loaded);
        assert!(state.take("m"));
        assert_eq!(state.begin_unload("m"), None);
        assert!(matches!(state.models["m"].status, Status::Loaded));
    }

    #[test]
    fn a_refused_unload_serves_again_and_unloaded_states_just_go() {
        let mut state = state_with("m", Status::Loaded);
        assert_eq!(state.begin_unload("m"), Some(true));
        state.cancel_unload("m");
        assert!(state.take("m"));
        // Not loaded in the runtime: nothing to tell it, the entry is simply forgotten.
        let mut loading = state_with("l", Status::Loading);
        assert_eq!(loading.begin_unload("l"), Some(false));
        assert_eq!(loading.begin_unload("absent"), Some(false));
    }
}
