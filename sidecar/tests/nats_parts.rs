//! The NATS-facing parts against a real nats-server: heartbeats land in KV `workers`, the
//! placement watcher follows KV `placements`, and the binary beats and stops cleanly.

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use common::{eventually, NatsServer};
use taskfleet_sidecar::artifacts::{ArtifactCache, Source};
use taskfleet_sidecar::heartbeat::Heartbeat;
use taskfleet_sidecar::protocol::{self, ArtifactRef, Placement, WorkerHeartbeat};
use taskfleet_sidecar::residency::Residency;
use taskfleet_sidecar::runtime::supervisor::Runtime;
use taskfleet_sidecar::{contract, nats, placement};

fn placement(task: &str, epoch: u64, model_key: &str) -> Placement {
    Placement {
        v: 1,
        task: task.into(),
        epoch,
        candidate: format!("cand-{epoch}"),
        model_key: model_key.into(),
        base: ArtifactRef {
            sha256: "b".repeat(64),
            size: 1000,
            format: "tree-v1".into(),
        },
        adapter: None,
        query_prefix: String::new(),
        passage_prefix: String::new(),
        max_seq_length: Some(128),
        pinned: false,
        replicas: 1,
        memory_bytes: 1000,
        runtime: "torch".into(),
        profiles: None,
        applied: None,
    }
}

async fn heartbeat_of(store: &jetstream::kv::Store, worker: &str) -> Option<WorkerHeartbeat> {
    let bytes = store.get(worker).await.ok()??;
    Some(protocol::decode(&bytes).expect("heartbeat decodes"))
}

#[tokio::test]
async fn heartbeat_is_put_under_the_worker_id_and_removed_on_stop() {
    let server = NatsServer::start();
    let client = async_nats::connect(&server.url).await.unwrap();
    let js = jetstream::new(client);
    let store = nats::workers_bucket(&js).await.unwrap();
    let runtime = Runtime::new();
    let heartbeat = Arc::new(Heartbeat {
        worker_id: "w-test-1".into(),
        host: "test-host".into(),
        started_ms: 1,
        runtime_kind: "torch".into(),
        residency: Residency::new(
            runtime.clone(),
            12_345,
            Arc::new(ArtifactCache::new(
                "unused-cache".into(),
                Source::Nats(js.clone()),
            )),
        ),
        runtime,
        statuses: Arc::default(),
    });
    let stop = CancellationToken::new();
    let running =
        tokio::spawn(heartbeat.run(store.clone(), Duration::from_millis(100), stop.clone()));

    let beat = eventually(Duration::from_secs(5), "a heartbeat", || {
        heartbeat_of(&store, "w-test-1")
    })
    .await;
    assert_eq!(beat.worker_id, "w-test-1");
    assert_eq!(beat.host, "test-host");
    assert_eq!(beat.memory_budget, 12_345);
    assert!(beat.loaded.is_empty() && beat.runtimes.is_empty());
    let first_ts = beat.ts_ms;
    let later = eventually(Duration::from_secs(5), "a later heartbeat", || async {
        heartbeat_of(&store, "w-test-1")
            .await
            .filter(|b| b.ts_ms > first_ts)
    })
    .await;
    assert!(later.ts_ms > first_ts);

    stop.cancel();
    running.await.unwrap();
    assert!(store.get("w-test-1").await.unwrap().is_none());
}

#[tokio::test]
async fn placement_watcher_follows_puts_deletes_and_ignores_stale_or_invalid() {
    let server = NatsServer::start();
    let client = async_nats::connect(&server.url).await.unwrap();
    let js = jetstream::new(client);
    let store = nats::placements_bucket(&js).await.unwrap();
    // A placement written before the watcher starts is seen too.
    let first = placement("faq", 3, "m1");
    store
        .put("faq", protocol::encode(&first).unwrap().into())
        .await
        .unwrap();

    let (tx, mut rx) = watch::channel(Arc::default());
    let stop = CancellationToken::new();
    let watcher = tokio::spawn(placement::watch_placements(
        store.clone(),
        tx,
        None,
        stop.clone(),
    ));
    let seen = rx
        .wait_for(|m| m.contains_key("faq"))
        .await
        .unwrap()
        .clone();
    assert_eq!(seen["faq"], first);

    let newer = placement("faq", 4, "m2");
    store
        .put("faq", protocol::encode(&newer).unwrap().into())
        .await
        .unwrap();
    rx.wait_for(|m| m.get("faq").is_some_and(|p| p.epoch == 4))
        .await
        .unwrap();

    // Entries arrive in order, so once the sentinel is seen the two before it were handled.
    let stale = placement("faq", 2, "m0");
    let invalid = placement("other-task", 9, "m9");
    let sentinel = placement("zz-sentinel", 1, "m1");
    for (key, value) in [
        ("faq", &stale),
        ("legal", &invalid),
        ("zz-sentinel", &sentinel),
    ] {
        store
            .put(key, protocol::encode(value).unwrap().into())
            .await
            .unwrap();
    }
    let seen = rx
        .wait_for(|m| m.contains_key("zz-sentinel"))
        .await
        .unwrap()
        .clone();
    assert_eq!(
        seen["faq"], newer,
        "an older epoch does not replace a newer one"
    );
    assert!(!seen.contains_key("legal"), "key/task mismatch is rejected");

    store.delete("zz-sentinel").await.unwrap();
    store.delete("faq").await.unwrap();
    rx.wait_for(|m| m.is_empty()).await.unwrap();
    stop.cancel();
    watcher.await.unwrap();
}

#[tokio::test]
async fn binary_beats_without_a_runtime_and_stops_on_sigterm() {
    let server = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_taskfleet-sidecar"))
        .args(["--worker-id", "w-bin", "--heartbeat-ms", "100"])
        .arg("--runtime-socket")
        .arg(dir.path().join("absent.sock"))
        .env("TASKFLEET_NATS_URL", &server.url)
        .env("TASKFLEET_MEMORY_BUDGET_BYTES", "777")
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let client = async_nats::connect(&server.url).await.unwrap();
    let js = jetstream::new(client);
    let beat = eventually(
        Duration::from_secs(20),
        "the binary's heartbeat",
        || async {
            let store = js.get_key_value("workers").await.ok()?;
            heartbeat_of(&store, "w-bin").await
        },
    )
    .await;
    assert_eq!(beat.memory_budget, 777, "env fallback of the flag is used");

    let pid = child.id().unwrap().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("sidecar exits after SIGTERM")
        .unwrap();
    assert!(status.success(), "clean exit, got {status}");
    let store = js.get_key_value("workers").await.unwrap();
    assert!(store.get("w-bin").await.unwrap().is_none());
}

#[test]
fn binary_without_a_runtime_setting_explains_itself() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_taskfleet-sidecar"))
        .env_remove("TASKFLEET_RUNTIME_CMD")
        .env_remove("TASKFLEET_RUNTIME_SOCKET")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--runtime-cmd"), "stderr: {stderr}");
}

/// What the sidecar creates when it starts first is what contract/shared.toml declares (the
/// Python side's twin: tests/test_gateway_nats_layout.py), and a consumer that exists with
/// other settings stands as it is.
#[tokio::test]
async fn the_layout_a_worker_creates_is_the_declared_one() {
    let server = NatsServer::start();
    let client = async_nats::connect(&server.url).await.unwrap();
    let js = jetstream::new(client);
    let declared = &contract::declared().nats;

    let mut tasks = nats::tasks_stream(&js).await.unwrap();
    let config = tasks.info().await.unwrap().config.clone();
    let rule = &declared.streams.tasks;
    assert_eq!(config.name, rule.name);
    assert_eq!(config.subjects, [format!("{}>", rule.subject_prefix)]);
    assert_eq!(
        config.retention,
        jetstream::stream::RetentionPolicy::WorkQueue
    );
    assert_eq!(config.storage, jetstream::stream::StorageType::File);
    assert_eq!(config.max_age, contract::seconds(rule.max_age_s));
    assert_eq!(
        Some(config.duplicate_window),
        rule.duplicate_window_s.map(contract::seconds)
    );
    let mut dlq = nats::dlq_stream(&js).await.unwrap();
    let dlq = dlq.info().await.unwrap().config.clone();
    assert_eq!(
        (dlq.name.as_str(), dlq.max_age),
        (
            declared.streams.dlq.name.as_str(),
            contract::seconds(declared.streams.dlq.max_age_s)
        )
    );
    assert_eq!(dlq.retention, jetstream::stream::RetentionPolicy::Limits);

    let workers = nats::workers_bucket(&js).await.unwrap();
    let status = workers.status().await.unwrap();
    assert_eq!(
        Some(status.max_age()),
        declared.kv.workers.ttl_s.map(contract::seconds),
        "heartbeats expire after the declared TTL, not a multiple of --heartbeat-ms"
    );
    assert_eq!(status.history(), declared.kv.workers.history);
    let placements = nats::placements_bucket(&js).await.unwrap();
    assert_eq!(
        placements.status().await.unwrap().history(),
        declared.kv.placements.history
    );

    let rule = &declared.task_consumer;
    let wanted = nats::task_consumer_config(
        "alpha",
        contract::seconds(rule.ack_wait_s),
        rule.max_deliver,
    );
    let mut consumer = nats::task_consumer(&tasks, wanted.clone()).await.unwrap();
    let info = consumer.info().await.unwrap().config.clone();
    assert_eq!(info.durable_name.as_deref(), Some("task_alpha"));
    assert_eq!(info.filter_subject, "tasks.alpha");
    assert_eq!(info.ack_policy, jetstream::consumer::AckPolicy::Explicit);
    assert_eq!(info.ack_wait, contract::seconds(rule.ack_wait_s));
    assert_eq!(info.max_deliver, rule.max_deliver);
    assert!(nats::consumer_differences(&info, &wanted).is_empty());

    // A second worker with other flags finds it and leaves it as it is.
    let other = nats::task_consumer_config("alpha", Duration::from_secs(60), 3);
    let mut found = nats::task_consumer(&tasks, other.clone()).await.unwrap();
    let kept = found.info().await.unwrap().config.clone();
    assert_eq!(
        (kept.ack_wait, kept.max_deliver),
        (info.ack_wait, info.max_deliver)
    );
    assert_eq!(
        nats::consumer_differences(&kept, &other),
        ["ack_wait 10s, not 60s", "max_deliver 5, not 3"]
    );
}
