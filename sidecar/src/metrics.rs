//! The sidecar's Prometheus metrics, written by hand in the text exposition format (0.0.4):
//! a few labelled counters and histograms the worker, the settler and residency record into,
//! plus gauges read from the heartbeat snapshot at scrape time. `server` serves them on
//! `GET /metrics` when `--metrics-addr` is given.
//!
//! One process-wide set (`metrics()`): the sidecar is one worker per process, and every part of
//! it records into the same families without passing a handle around.

pub mod server;

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::{LazyLock, Mutex};

use crate::protocol::WorkerHeartbeat;

/// Seconds of one runtime call (infer, load): from a few milliseconds to minutes on a CPU.
const SECONDS_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];
/// Estimated tokens of one batch (the default budget is 32768).
const TOKEN_BUCKETS: &[f64] = &[
    16.0, 64.0, 256.0, 1024.0, 4096.0, 8192.0, 16384.0, 32768.0, 65536.0, 262144.0,
];
/// Messages (requests) in one batch.
const MESSAGE_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

pub fn metrics() -> &'static Metrics {
    &METRICS
}

type Labels = Vec<String>;

pub struct Counter {
    name: &'static str,
    help: &'static str,
    labels: &'static [&'static str],
    values: Mutex<BTreeMap<Labels, u64>>,
}

impl Counter {
    const fn new(name: &'static str, help: &'static str, labels: &'static [&'static str]) -> Self {
        Self {
            name,
            help,
            labels,
            values: Mutex::new(BTreeMap::new()),
        }
    }

    pub fn inc(&self, labels: &[&str]) {
        self.add(labels, 1);
    }

    pub fn add(&self, labels: &[&str], by: u64) {
        debug_assert_eq!(labels.len(), self.labels.len(), "labels of {}", self.name);
        let key = labels.iter().map(|l| l.to_string()).collect();
        *self
            .values
            .lock()
            .expect("counter lock")
            .entry(key)
            .or_default() += by;
    }

    /// The current value for these labels (0 when never counted).
    pub fn get(&self, labels: &[&str]) -> u64 {
        let key: Labels = labels.iter().map(|l| l.to_string()).collect();
        self.values
            .lock()
            .expect("counter lock")
            .get(&key)
            .copied()
            .unwrap_or(0)
    }

    fn render(&self, out: &mut String) {
        let name = format!("{}_total", self.name);
        header(out, &name, self.help, "counter");
        for (values, count) in self.values.lock().expect("counter lock").iter() {
            let _ = writeln!(
                out,
                "{name}{} {count}",
                label_set(self.labels, values, None)
            );
        }
    }
}

#[derive(Clone)]
struct HistogramValue {
    buckets: Vec<u64>,
    sum: f64,
    count: u64,
}

pub struct Histogram {
    name: &'static str,
    help: &'static str,
    labels: &'static [&'static str],
    bounds: &'static [f64],
    values: Mutex<BTreeMap<Labels, HistogramValue>>,
}

impl Histogram {
    const fn new(
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
        bounds: &'static [f64],
    ) -> Self {
        Self {
            name,
            help,
            labels,
            bounds,
            values: Mutex::new(BTreeMap::new()),
        }
    }

    pub fn observe(&self, labels: &[&str], value: f64) {
        debug_assert_eq!(labels.len(), self.labels.len(), "labels of {}", self.name);
        let key = labels.iter().map(|l| l.to_string()).collect();
        let mut values = self.values.lock().expect("histogram lock");
        let entry = values.entry(key).or_insert_with(|| HistogramValue {
            buckets: vec![0; self.bounds.len()],
            sum: 0.0,
            count: 0,
        });
        for (bucket, bound) in entry.buckets.iter_mut().zip(self.bounds) {
            if value <= *bound {
                *bucket += 1;
            }
        }
        entry.sum += value;
        entry.count += 1;
    }

    /// How many values were observed for these labels.
    pub fn count(&self, labels: &[&str]) -> u64 {
        let key: Labels = labels.iter().map(|l| l.to_string()).collect();
        self.values
            .lock()
            .expect("histogram lock")
            .get(&key)
            .map_or(0, |v| v.count)
    }

    fn render(&self, out: &mut String) {
        header(out, self.name, self.help, "histogram");
        let name = self.name;
        for (values, h) in self.values.lock().expect("histogram lock").iter() {
            for (bound, count) in self.bounds.iter().zip(&h.buckets) {
                let le = format_float(*bound);
                let labels = label_set(self.labels, values, Some(&le));
                let _ = writeln!(out, "{name}_bucket{labels} {count}");
            }
            let labels = label_set(self.labels, values, Some("+Inf"));
            let _ = writeln!(out, "{name}_bucket{labels} {}", h.count);
            let labels = label_set(self.labels, values, None);
            let _ = writeln!(out, "{name}_sum{labels} {}", format_float(h.sum));
            let _ = writeln!(out, "{name}_count{labels} {}", h.count);
        }
    }
}

/// Every metric family the sidecar records. Names are documented in docs/architecture.md and
/// used by the Grafana dashboard under deploy/ (a test checks that they exist).
pub struct Metrics {
    pub batches: Counter,
    pub batch_messages: Histogram,
    pub batch_tokens: Histogram,
    pub runtime_seconds: Histogram,
    pub replies: Counter,
    pub reply_offloads: Counter,
    pub reply_failures: Counter,
    pub expired: Counter,
    pub redeliveries: Counter,
    pub retries: Counter,
    pub dead_letters: Counter,
    pub loads: Counter,
    pub evictions: Counter,
    pub runtime_restarts: Counter,
}

impl Metrics {
    fn new() -> Self {
        Self {
            batches: Counter::new(
                "taskfleet_sidecar_batches",
                "Batches sent to the runtime, by task.",
                &["task"],
            ),
            batch_messages: Histogram::new(
                "taskfleet_sidecar_batch_messages",
                "Requests (queue messages) per batch, by task.",
                &["task"],
                MESSAGE_BUCKETS,
            ),
            batch_tokens: Histogram::new(
                "taskfleet_sidecar_batch_tokens",
                "Tokens per batch by the model's tokenizer (characters / 4 without a tokenizer.json), by task.",
                &["task"],
                TOKEN_BUCKETS,
            ),
            runtime_seconds: Histogram::new(
                "taskfleet_sidecar_runtime_seconds",
                "Latency of runtime calls by op (infer, score, classify, load), failures included.",
                &["op"],
                SECONDS_BUCKETS,
            ),
            replies: Counter::new(
                "taskfleet_sidecar_replies",
                "Replies published to requesters, by task and outcome (ok, error).",
                &["task", "outcome"],
            ),
            reply_offloads: Counter::new(
                "taskfleet_sidecar_reply_offloads",
                "Replies above NATS max_payload whose embeddings went to the object store.",
                &["task"],
            ),
            reply_failures: Counter::new(
                "taskfleet_sidecar_reply_failures",
                "Replies that could not be sent; each became a dead letter.",
                &["task"],
            ),
            expired: Counter::new(
                "taskfleet_sidecar_expired",
                "Requests dropped unrun because their deadline had passed.",
                &["task"],
            ),
            redeliveries: Counter::new(
                "taskfleet_sidecar_redeliveries",
                "Messages received again (a worker died, failed or nakked before).",
                &["task"],
            ),
            retries: Counter::new(
                "taskfleet_sidecar_retries",
                "Messages handed back to the queue for a later try, by task and error code.",
                &["task", "code"],
            ),
            dead_letters: Counter::new(
                "taskfleet_sidecar_dead_letters",
                "Messages moved to the DLQ stream, by task and error code.",
                &["task", "code"],
            ),
            loads: Counter::new(
                "taskfleet_sidecar_model_loads",
                "Model loads by outcome (ok, failed).",
                &["outcome"],
            ),
            evictions: Counter::new(
                "taskfleet_sidecar_model_evictions",
                "Lazy models unloaded to make room under the memory budget.",
                &[],
            ),
            runtime_restarts: Counter::new(
                "taskfleet_sidecar_runtime_restarts",
                "Times the runtime went away and was started or reconnected again.",
                &[],
            ),
        }
    }

    /// The whole exposition: gauges from `heartbeat` (none before the worker is set up), then
    /// every counter and histogram.
    pub fn render(&self, heartbeat: Option<&WorkerHeartbeat>, runtime_up: bool) -> String {
        let mut out = String::new();
        if let Some(heartbeat) = heartbeat {
            self.render_gauges(&mut out, heartbeat);
        }
        header(
            &mut out,
            "taskfleet_sidecar_runtime_up",
            "1 while a runtime is connected, else 0.",
            "gauge",
        );
        let _ = writeln!(
            out,
            "taskfleet_sidecar_runtime_up {}",
            u64::from(runtime_up)
        );
        for counter in [
            &self.batches,
            &self.replies,
            &self.reply_offloads,
            &self.reply_failures,
            &self.expired,
            &self.redeliveries,
            &self.retries,
            &self.dead_letters,
            &self.loads,
            &self.evictions,
            &self.runtime_restarts,
        ] {
            counter.render(&mut out);
        }
        for histogram in [
            &self.batch_messages,
            &self.batch_tokens,
            &self.runtime_seconds,
        ] {
            histogram.render(&mut out);
        }
        out
    }

    fn render_gauges(&self, out: &mut String, heartbeat: &WorkerHeartbeat) {
        gauge(
            out,
            "taskfleet_sidecar_held_messages",
            "Messages this worker pulled and has not settled yet, by task.",
            "task",
            &heartbeat.queue_depth,
        );
        gauge(
            out,
            "taskfleet_sidecar_serving_epoch",
            "Placement epoch this worker serves each task with.",
            "task",
            &heartbeat.epochs,
        );
        let plain: [(&str, &str, u64); 3] = [
            (
                "taskfleet_sidecar_memory_used_bytes",
                "Runtime memory held by loaded models.",
                heartbeat.memory_used,
            ),
            (
                "taskfleet_sidecar_memory_budget_bytes",
                "Memory budget of the models (--memory-budget-bytes).",
                heartbeat.memory_budget,
            ),
            (
                "taskfleet_sidecar_loaded_models",
                "Model keys loaded in the runtime.",
                heartbeat.loaded.len() as u64,
            ),
        ];
        for (name, help, value) in plain {
            header(out, name, help, "gauge");
            let _ = writeln!(out, "{name} {value}");
        }
    }
}

fn header(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn gauge(out: &mut String, name: &str, help: &str, label: &str, values: &BTreeMap<String, u64>) {
    header(out, name, help, "gauge");
    for (key, value) in values {
        let _ = writeln!(out, "{name}{{{label}=\"{}\"}} {value}", escape(key));
    }
}

fn label_set(names: &[&str], values: &[String], le: Option<&str>) -> String {
    let mut pairs: Vec<String> = names
        .iter()
        .zip(values)
        .map(|(n, v)| format!("{n}=\"{}\"", escape(v)))
        .collect();
    if let Some(le) = le {
        pairs.push(format!("le=\"{le}\""));
    }
    if pairs.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", pairs.join(","))
    }
}

/// Label values escape backslash, double quote and newline.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn format_float(value: f64) -> String {
    if value.is_finite() && value.fract() == 0.0 && value.abs() < 1e15 {
        format!("{value:.1}")
    } else {
        format!("{value}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn beat() -> WorkerHeartbeat {
        WorkerHeartbeat {
            v: 1,
            worker_id: "w".into(),
            host: "h".into(),
            ts_ms: 1,
            loaded: vec!["m".into()],
            memory_used: 10,
            memory_budget: 100,
            queue_depth: BTreeMap::from([("a\"b".to_string(), 3)]),
            runtimes: vec!["torch".into()],
            epochs: BTreeMap::from([("a\"b".to_string(), 7)]),
            started_ms: Some(1),
            runtime_kind: Some("torch".into()),
            profiles: None,
        }
    }

    #[test]
    fn counters_histograms_and_gauges_render_in_text_format() {
        let m = Metrics::new();
        m.batches.inc(&["t1"]);
        m.batches.add(&["t1"], 2);
        m.batch_tokens.observe(&["t1"], 100.0);
        m.batch_tokens.observe(&["t1"], 100_000.0);
        m.evictions.inc(&[]);
        let text = m.render(Some(&beat()), true);
        assert!(text.contains("# TYPE taskfleet_sidecar_batches_total counter\n"));
        assert!(text.contains("taskfleet_sidecar_batches_total{task=\"t1\"} 3\n"));
        assert!(text.contains("taskfleet_sidecar_model_evictions_total 1\n"));
        assert!(text.contains("taskfleet_sidecar_batch_tokens_bucket{task=\"t1\",le=\"64.0\"} 0\n"));
        assert!(
            text.contains("taskfleet_sidecar_batch_tokens_bucket{task=\"t1\",le=\"256.0\"} 1\n")
        );
        assert!(text.contains("taskfleet_sidecar_batch_tokens_bucket{task=\"t1\",le=\"+Inf\"} 2\n"));
        assert!(text.contains("taskfleet_sidecar_batch_tokens_sum{task=\"t1\"} 100100.0\n"));
        assert!(text.contains("taskfleet_sidecar_batch_tokens_count{task=\"t1\"} 2\n"));
        assert!(text.contains("taskfleet_sidecar_held_messages{task=\"a\\\"b\"} 3\n"));
        assert!(text.contains("taskfleet_sidecar_runtime_up 1\n"));
        assert_eq!(m.batches.get(&["t1"]), 3);
        assert_eq!(m.batch_tokens.count(&["t1"]), 2);
        // Every sample line is `name{labels} value` with a numeric value.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let value = line.rsplit(' ').next().unwrap();
            assert!(value.parse::<f64>().is_ok(), "bad sample line {line:?}");
        }
    }
}
