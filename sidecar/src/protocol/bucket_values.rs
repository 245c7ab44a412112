//! What KV `placements` and `workers` hold; serving/protocol/bucket_values.py.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::socket_ops::{LoadRequest, LoadSettings};

/// Value of KV `placements` under key = task: what the fleet should run for the task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Placement {
    pub v: u32,
    pub task: String,
    pub epoch: u64,
    pub candidate: String,
    pub model_key: String,
    /// The weights by content; fetched into the worker's cache (`artifacts.rs`) before loading.
    pub base: ArtifactRef,
    pub adapter: Option<ArtifactRef>,
    pub query_prefix: String,
    pub passage_prefix: String,
    pub max_seq_length: Option<u32>,
    pub pinned: bool,
    pub replicas: u32,
    /// Estimated memory of the model, used to make room before loading it.
    pub memory_bytes: u64,
    /// The runtime kind that serves it ("torch", "candle", "http"); values written before
    /// runtimes existed lack it and mean "torch".
    #[serde(default = "torch")]
    pub runtime: String,
    /// Every runtime profile of the base model, one per machine class.
    #[serde(default)]
    pub profiles: Option<Vec<RuntimeProfile>>,
    /// The profile this worker applies (its own machine class's; see `apply_profile`): local
    /// state, never on the wire.
    #[serde(skip)]
    pub applied: Option<RuntimeProfile>,
}

/// Runtime settings tuned for a placement's base model on one machine class (docs/protocol.md,
/// "Runtime profiles"); `None` leaves the worker's default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RuntimeProfile {
    pub id: u64,
    pub machine_class: String,
    pub max_batch_tokens: Option<u64>,
    pub max_batch_wait_ms: Option<u64>,
    pub intra_op_threads: Option<u32>,
    pub runtimes: Option<u32>,
    pub max_padding: Option<f64>,
    pub engine: Option<String>,
}

impl RuntimeProfile {
    /// Its runtime knobs, or `None` when it sets none (the runtime's defaults).
    pub fn load_settings(&self) -> Option<LoadSettings> {
        let settings = LoadSettings {
            intra_op_threads: self.intra_op_threads,
            runtimes: self.runtimes,
            max_padding: self.max_padding,
            engine: self.engine.clone(),
        };
        (settings != LoadSettings::default()).then_some(settings)
    }
}

fn torch() -> String {
    "torch".into()
}

/// A folder of files by content (docs/protocol.md, "Artifacts").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArtifactRef {
    pub sha256: String,
    pub size: u64,
    pub format: String,
}

impl Placement {
    /// The artifacts this placement's model needs, base first.
    pub fn artifacts(&self) -> Vec<ArtifactRef> {
        std::iter::once(self.base.clone())
            .chain(self.adapter.clone())
            .collect()
    }

    /// The `load` request for this placement's model (id filled in by the client), naming the
    /// artifacts' folders in the cache at `cache` (`<cache>/sha256/<digest>`).
    pub fn load_request(&self, cache: &std::path::Path) -> LoadRequest {
        let folder = |a: &ArtifactRef| {
            cache
                .join("sha256")
                .join(&a.sha256)
                .to_string_lossy()
                .into_owned()
        };
        LoadRequest {
            id: 0,
            model_key: self.model_key.clone(),
            base_path: folder(&self.base),
            adapter_path: self.adapter.as_ref().map(folder),
            query_prefix: self.query_prefix.clone(),
            passage_prefix: self.passage_prefix.clone(),
            max_seq_length: self.max_seq_length,
            settings: self
                .applied
                .as_ref()
                .and_then(RuntimeProfile::load_settings),
        }
    }

    /// Applies the profile of `machine_class` (none when the worker has no class or the
    /// placement no profile for it: a profile tuned on other machines never applies). A
    /// profile with runtime knobs loads the model as its own key (`<model key>~<knobs>`), so a
    /// change of profile loads the model again beside the old one, as a model change does.
    pub fn apply_profile(mut self, machine_class: Option<&str>) -> Self {
        let chosen = machine_class.and_then(|class| {
            self.profiles
                .iter()
                .flatten()
                .find(|p| p.machine_class == class)
                .cloned()
        });
        if let Some(settings) = chosen.as_ref().and_then(RuntimeProfile::load_settings) {
            let mut knobs = Vec::new();
            if let Some(engine) = &settings.engine {
                knobs.push(engine.clone());
            }
            if let Some(threads) = settings.intra_op_threads {
                knobs.push(format!("t{threads}"));
            }
            if let Some(runtimes) = settings.runtimes {
                knobs.push(format!("r{runtimes}"));
            }
            if let Some(padding) = settings.max_padding {
                knobs.push(format!("p{padding}"));
            }
            self.model_key = format!("{}~{}", self.model_key, knobs.join("-"));
        }
        self.applied = chosen;
        self
    }

    /// Tokens per batch and how long a batch waits for more: the applied profile's, else the
    /// worker's own.
    pub fn batch_limits(
        &self,
        tokens: usize,
        wait: std::time::Duration,
    ) -> (usize, std::time::Duration) {
        let profile = self.applied.as_ref();
        (
            profile
                .and_then(|p| p.max_batch_tokens)
                .map_or(tokens, |t| usize::try_from(t).unwrap_or(usize::MAX)),
            profile
                .and_then(|p| p.max_batch_wait_ms)
                .map_or(wait, std::time::Duration::from_millis),
        )
    }
}

/// Value of KV `workers` under key = worker id; data-keyed maps are sorted (BTreeMap).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerHeartbeat {
    pub v: u32,
    pub worker_id: String,
    pub host: String,
    pub ts_ms: u64,
    pub loaded: Vec<String>,
    pub memory_used: u64,
    pub memory_budget: u64,
    pub queue_depth: BTreeMap<String, u64>,
    pub runtimes: Vec<String>,
    pub epochs: BTreeMap<String, u64>,
    /// When this worker process started (unix ms): a new value under the same worker id means
    /// the worker restarted, and whatever the old process held was lost with it.
    #[serde(default)]
    pub started_ms: Option<u64>,
    /// The runtime kind this worker serves (its pool; fixed for the process, unlike `runtimes`,
    /// which is empty while the runtime restarts). Workers rank each other by it for replicas.
    #[serde(default)]
    pub runtime_kind: Option<String>,
    /// Task -> id of the runtime profile this worker applies to it.
    #[serde(default)]
    pub profiles: Option<BTreeMap<String, u64>>,
}
