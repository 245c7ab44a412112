//! What KV `placements` and `workers` hold; serving/protocol/bucket_values.py.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::socket_ops::LoadRequest;

/// Value of KV `placements` under key = task: what the fleet should run for the task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
        }
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
}
