//! The rules the sidecar shares with the Python roles, read from the one declared file
//! `contract/shared.toml` (compiled in, parsed once on first use): the task-name rule, the NATS
//! streams, per-task consumer, buckets and object stores, the headers of queue messages, the
//! runtime start timeout, and the error codes with their retryability. No module writes one of
//! these values by hand.
//!
//! The file is refused whole (an unknown key, a missing one, a wrong type or value), like
//! contract/__init__.py does: `cargo test` fails on it before any binary ships.
//! `taskfleet-sidecar --print-contract` prints what this module read (and what `nats.rs` builds
//! from it), so tests/test_contract.py compares both languages' readings key by key.

use std::collections::BTreeMap;
use std::sync::LazyLock;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub const SOURCE: &str = "contract/shared.toml";
const DECLARED: &str = include_str!("../../contract/shared.toml");

static CONTRACT: LazyLock<Contract> = LazyLock::new(|| {
    read(DECLARED).unwrap_or_else(|e| panic!("{e} (the file compiled into this binary)"))
});

/// The declared contract (the file as it was when this binary was built).
pub fn declared() -> &'static Contract {
    &CONTRACT
}

/// The contract a TOML text declares; the error names what is wrong.
pub fn read(text: &str) -> Result<Contract, String> {
    toml::from_str(text).map_err(|e| format!("{SOURCE}: {e}"))
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Contract {
    pub task_name: TaskNameRule,
    pub nats: Nats,
    pub headers: Headers,
    pub worker: Worker,
    pub error_codes: BTreeMap<String, CodeRule>,
}

/// Lowercase ASCII letters and digits plus `also`, a letter or digit first, at most
/// `max_chars`: a task name is a NATS subject token and a consumer name.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskNameRule {
    pub max_chars: usize,
    pub also: String,
    pub examples_valid: Vec<String>,
    pub examples_invalid: Vec<String>,
}

impl TaskNameRule {
    pub fn allows(&self, name: &str) -> bool {
        let plain = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
        let mut chars = name.chars();
        chars.next().is_some_and(plain)
            && chars.all(|c| plain(c) || self.also.contains(c))
            && name.chars().count() <= self.max_chars
    }

    /// The rule in words, for refusals (the same words as contract/__init__.py's).
    pub fn describe(&self) -> String {
        let also: Vec<String> = self.also.chars().map(|c| format!("'{c}'")).collect();
        format!(
            "lowercase letters, digits and {}, starting with a letter or digit, at most {} \
             characters",
            also.join(", "),
            self.max_chars
        )
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Nats {
    pub replicas: usize,
    pub reply_subject_prefix: String,
    /// A task's shadow placement lies in KV `placements` under `<task><shadow_key_suffix>`.
    pub shadow_key_suffix: String,
    pub streams: Streams,
    pub task_consumer: ConsumerRule,
    pub kv: KeyValues,
    pub object_stores: ObjectStores,
    pub shadow_consumer: ConsumerRule,
    /// Python only (the control plane's); read so the file is refused whole here too.
    pub production_consumers: ControlConsumers,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Streams {
    pub tasks: StreamRule,
    pub dlq: StreamRule,
    pub shadow: StreamRule,
    pub samples: StreamRule,
    pub feedback: StreamRule,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyValues {
    pub placements: BucketRule,
    pub workers: BucketRule,
    pub leader: BucketRule,
    pub directory: BucketRule,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObjectStores {
    pub payloads: ObjectStoreRule,
    pub artifacts: ObjectStoreRule,
}

/// The server's names of a stream's retention.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Retention {
    Workqueue,
    Limits,
    Interest,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Storage {
    File,
    Memory,
}

/// What a full stream (or subject) discards: its oldest messages, or the new one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Discard {
    Old,
    New,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AckPolicy {
    Explicit,
    All,
    None,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamRule {
    pub name: String,
    pub subject_prefix: String,
    pub retention: Retention,
    pub storage: Storage,
    pub max_age_s: f64,
    #[serde(default)]
    pub duplicate_window_s: Option<f64>,
    /// None: the server's default (old).
    #[serde(default)]
    pub discard: Option<Discard>,
    /// None: unbounded.
    #[serde(default)]
    pub max_msgs_per_subject: Option<i64>,
    #[serde(default)]
    pub discard_new_per_subject: bool,
    /// Messages may carry their own TTL (`Nats-TTL`).
    #[serde(default)]
    pub allow_msg_ttl: bool,
}

impl StreamRule {
    /// `<subject_prefix><task>`.
    pub fn subject(&self, task: &str) -> String {
        format!("{}{task}", self.subject_prefix)
    }

    /// Every subject of the stream.
    pub fn subjects(&self) -> String {
        format!("{}>", self.subject_prefix)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsumerRule {
    pub name_prefix: String,
    pub ack_policy: AckPolicy,
    pub ack_wait_s: f64,
    pub max_deliver: i64,
}

impl ConsumerRule {
    /// The durable consumer of a task: `<name_prefix><task>`.
    pub fn name(&self, task: &str) -> String {
        format!("{}{task}", self.name_prefix)
    }
}

/// The leading control plane's durable consumers of SAMPLES and FEEDBACK (Python's).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControlConsumers {
    pub samples: String,
    pub feedback: String,
    pub ack_policy: AckPolicy,
    pub ack_wait_s: f64,
    pub max_ack_pending: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BucketRule {
    pub bucket: String,
    pub history: i64,
    #[serde(default)]
    pub ttl_s: Option<f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObjectStoreRule {
    pub bucket: String,
    #[serde(default)]
    pub ttl_s: Option<f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Headers {
    pub msg_id: String,
    pub request_id: String,
    pub reply: String,
    pub deadline: String,
    pub priority: String,
    pub min_epoch: String,
    pub key: String,
    pub error: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Worker {
    /// How long a runtime may take from its start to answering `hello` (the default of
    /// `--runtime-start-timeout-ms`).
    pub runtime_start_timeout_s: f64,
}

impl Worker {
    pub fn runtime_start_timeout_ms(&self) -> u64 {
        seconds(self.runtime_start_timeout_s).as_millis() as u64
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CodeRule {
    pub status: u16,
    pub retryable: bool,
    pub meaning: String,
    /// A code a runtime answers with on the socket protocol.
    #[serde(default)]
    pub socket: bool,
}

/// Seconds as the file writes them (`_s` keys), as a duration.
pub fn seconds(value: f64) -> Duration {
    Duration::from_secs_f64(value)
}

#[cfg(test)]
mod tests {
    use super::{declared, read, DECLARED};

    #[test]
    fn the_declared_file_reads() {
        let contract = declared();
        assert_eq!(contract.nats.streams.tasks.subject("a"), "tasks.a");
        assert_eq!(contract.nats.task_consumer.name("a"), "task_a");
        assert_eq!(contract.nats.streams.shadow.subject("a"), "shadow.a");
        assert_eq!(contract.nats.shadow_consumer.name("a"), "shadow_a");
        assert!(contract.error_codes.contains_key("INTERNAL"));
    }

    #[test]
    fn the_task_name_rule_holds_for_the_files_examples() {
        let rule = &declared().task_name;
        for name in &rule.examples_valid {
            assert!(rule.allows(name), "{name:?} should be allowed");
        }
        for name in &rule.examples_invalid {
            assert!(!rule.allows(name), "{name:?} should be refused");
        }
        let longest = "a".repeat(rule.max_chars);
        assert!(rule.allows(&longest) && !rule.allows(&format!("{longest}a")));
        assert_eq!(
            rule.describe(),
            "lowercase letters, digits and '_', '-', starting with a letter or digit, at most \
             128 characters"
        );
    }

    /// As contract/__init__.py refuses them (tests/test_contract.py, the same cases).
    #[test]
    fn a_file_that_does_not_hold_the_expected_is_refused_whole() {
        let cases = [
            (
                "max_deliver = 5",
                "max_deliver = 5\nmax_delivery = 5",
                "max_delivery",
            ),
            ("max_deliver = 5", "", "max_deliver"),
            ("max_deliver = 5", "max_deliver = \"5\"", "invalid type"),
            ("history = 5", "history = true", "invalid type"),
            ("msg_id = \"Nats-Msg-Id\"", "", "msg_id"),
            ("[headers]", "[header]", "header"),
            ("retention = \"workqueue\"", "retention = \"work\"", "work"),
        ];
        for (old, new, says) in cases {
            assert!(DECLARED.contains(old), "{old}");
            let text = DECLARED.replacen(old, new, 1);
            let error = read(&text).expect_err(new);
            assert!(error.contains(says), "{new:?}: {error}");
        }
    }
}
