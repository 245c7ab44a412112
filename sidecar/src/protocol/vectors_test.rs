//! Golden vectors shared with Python (`tests/vectors/`, written by `serving/protocol/`):
//! every vector decodes into its Rust type, re-encodes to the identical bytes, and equals its
//! JSON twin. A vector name this table does not know, or a known name without a vector, fails.

use std::path::PathBuf;

use base64::Engine;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::*;
use crate::error::Result;

type Roundtrip = fn(&[u8]) -> Result<Vec<u8>>;

fn typed<T: Serialize + DeserializeOwned>(bytes: &[u8]) -> Result<Vec<u8>> {
    encode(&decode::<T>(bytes)?)
}

fn request(op: &'static str) -> Roundtrip {
    // A fn pointer cannot capture `op`, so each op gets its own small function.
    fn check(bytes: &[u8], op: &str) -> Result<Vec<u8>> {
        let request: Request = decode(bytes)?;
        assert_eq!(
            request.op(),
            op,
            "vector decoded to the wrong request variant"
        );
        encode(&request)
    }
    match op {
        "hello" => |b| check(b, "hello"),
        "load" => |b| check(b, "load"),
        "unload" => |b| check(b, "unload"),
        "infer" => |b| check(b, "infer"),
        "score" => |b| check(b, "score"),
        "classify" => |b| check(b, "classify"),
        "stats" => |b| check(b, "stats"),
        "shutdown" => |b| check(b, "shutdown"),
        _ => unreachable!("unknown op {op}"),
    }
}

fn reply_message(variant: &'static str) -> Roundtrip {
    fn check(bytes: &[u8], variant: &str) -> Result<Vec<u8>> {
        let reply: ReplyMessage = decode(bytes)?;
        let got = match reply {
            ReplyMessage::Ok(_) => "ok",
            ReplyMessage::Score(_) => "score",
            ReplyMessage::Classify(_) => "classify",
            ReplyMessage::Error(_) => "error",
        };
        assert_eq!(got, variant, "wrong reply variant");
        encode(&reply)
    }
    match variant {
        "ok" => |b| check(b, "ok"),
        "score" => |b| check(b, "score"),
        "classify" => |b| check(b, "classify"),
        "error" => |b| check(b, "error"),
        _ => unreachable!("unknown reply variant {variant}"),
    }
}

fn task_payload(op: &'static str) -> Roundtrip {
    fn check(bytes: &[u8], op: &str) -> Result<Vec<u8>> {
        let payload: TaskPayload = decode(bytes)?;
        assert_eq!(payload.op(), Ok(op), "payload decoded to the wrong op");
        encode(&payload)
    }
    match op {
        "embed" => |b| check(b, "embed"),
        "score" => |b| check(b, "score"),
        "classify" => |b| check(b, "classify"),
        _ => unreachable!("unknown op {op}"),
    }
}

fn known_vectors() -> Vec<(&'static str, Roundtrip)> {
    vec![
        ("socket_hello_request", request("hello")),
        ("socket_load_request", request("load")),
        ("socket_unload_request", request("unload")),
        ("socket_infer_request", request("infer")),
        ("socket_score_request", request("score")),
        ("socket_classify_request", request("classify")),
        ("socket_stats_request", request("stats")),
        ("socket_shutdown_request", request("shutdown")),
        ("socket_hello_reply", typed::<HelloReply>),
        ("socket_load_reply", typed::<LoadReply>),
        ("socket_unload_reply", typed::<UnloadReply>),
        ("socket_infer_reply", typed::<InferReply>),
        ("socket_score_reply", typed::<ScoreReply>),
        ("socket_classify_reply", typed::<ClassifyReply>),
        ("socket_stats_reply", typed::<StatsReply>),
        ("socket_shutdown_reply", typed::<ShutdownReply>),
        ("socket_error_reply", typed::<ErrorReply>),
        ("queue_payload", typed::<QueuePayload>),
        ("queue_payload_ref", typed::<QueuePayload>),
        ("queue_payload", task_payload("embed")),
        ("queue_payload_score", task_payload("score")),
        ("queue_payload_score_ref", task_payload("score")),
        ("queue_payload_classify", task_payload("classify")),
        ("reply_ok", reply_message("ok")),
        ("reply_ok_ref", reply_message("ok")),
        ("reply_score", reply_message("score")),
        ("reply_classify", reply_message("classify")),
        ("reply_classify_ref", reply_message("classify")),
        ("reply_error", reply_message("error")),
        ("placement_value", typed::<Placement>),
        ("worker_heartbeat", typed::<WorkerHeartbeat>),
    ]
}

fn vectors_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/vectors")
}

/// JSON form of a msgpack value by the vectors' convention (`bin` -> `{"$base64": ...}`).
fn to_json(value: &rmpv::Value) -> serde_json::Value {
    use rmpv::Value as M;
    use serde_json::Value as J;
    match value {
        M::Nil => J::Null,
        M::Boolean(b) => J::Bool(*b),
        M::Integer(i) => match (i.as_u64(), i.as_i64()) {
            (Some(u), _) => J::from(u),
            (None, Some(s)) => J::from(s),
            _ => unreachable!("msgpack integers fit u64 or i64"),
        },
        M::F32(f) => J::from(f64::from(*f)),
        M::F64(f) => J::from(*f),
        M::String(s) => J::String(s.as_str().expect("utf-8 string").to_string()),
        M::Binary(b) => serde_json::json!({
            "$base64": base64::engine::general_purpose::STANDARD.encode(b)
        }),
        M::Array(items) => J::Array(items.iter().map(to_json).collect()),
        M::Map(entries) => J::Object(
            entries
                .iter()
                .map(|(k, v)| (k.as_str().expect("string map key").to_string(), to_json(v)))
                .collect(),
        ),
        M::Ext(..) => panic!("the protocol uses no msgpack ext types"),
    }
}

#[test]
fn golden_vectors_roundtrip_byte_identical_and_match_json() {
    let dir = vectors_dir();
    let known = known_vectors();
    let mut seen = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("tests/vectors exists") {
        let path = entry.expect("readable dir entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("msgpack") {
            continue;
        }
        let name = path.file_stem().unwrap().to_str().unwrap().to_string();
        // A vector may be listed more than once (as its own type and as a `TaskPayload`).
        let roundtrips: Vec<Roundtrip> = known
            .iter()
            .filter(|(known_name, _)| *known_name == name)
            .map(|(_, roundtrip)| *roundtrip)
            .collect();
        assert!(
            !roundtrips.is_empty(),
            "vector {name} has no Rust type; add it to the table"
        );
        let bytes = std::fs::read(&path).unwrap();
        for roundtrip in roundtrips {
            let again = roundtrip(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(again, bytes, "{name}: re-encoded bytes differ");
        }

        let json_path = path.with_extension("json");
        if json_path.exists() {
            let expected: serde_json::Value =
                serde_json::from_slice(&std::fs::read(&json_path).unwrap()).unwrap();
            let value = rmpv::decode::read_value(&mut bytes.as_slice()).unwrap();
            assert_eq!(
                to_json(&value),
                expected,
                "{name}: differs from its JSON twin"
            );
        }
        seen.push(name);
    }
    for (name, _) in &known {
        assert!(
            seen.iter().any(|s| s == name),
            "missing vector {name}.msgpack"
        );
    }
}

#[test]
fn absent_optionals_are_nil_not_omitted() {
    let mut load = Placement {
        v: 1,
        task: "t".into(),
        epoch: 1,
        candidate: "c".into(),
        model_key: "m".into(),
        base: ArtifactRef {
            sha256: "b".repeat(64),
            size: 1,
            format: "tree-v1".into(),
        },
        adapter: None,
        query_prefix: String::new(),
        passage_prefix: String::new(),
        max_seq_length: None,
        pinned: false,
        replicas: 1,
        memory_bytes: 0,
        runtime: "torch".into(),
        profiles: None,
        applied: None,
    }
    .load_request(std::path::Path::new("/cache"));
    load.id = 7;
    let value =
        rmpv::decode::read_value(&mut encode(&Request::Load(load)).unwrap().as_slice()).unwrap();
    let map = value.as_map().unwrap();
    let keys: Vec<&str> = map.iter().map(|(k, _)| k.as_str().unwrap()).collect();
    assert_eq!(keys[..2], ["op", "id"]);
    let adapter = map.iter().find(|(k, _)| k.as_str() == Some("adapter_path"));
    assert_eq!(adapter.map(|(_, v)| v.is_nil()), Some(true));
}
