//! The client against a scripted socket peer: these tests are about framing and matching
//! replies to requests, not about what a runtime computes (the Python end-to-end tests run the
//! real runtime behind the real binary).

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};

use super::socket::*;
use crate::error::Error;
use crate::protocol::{self, Code, ErrorBody, ErrorReply, MemoryReply, Request, StatsReply};

async fn read_request(peer: &mut UnixStream) -> Request {
    let length = peer.read_u32().await.unwrap();
    let mut body = vec![0; length as usize];
    peer.read_exact(&mut body).await.unwrap();
    protocol::decode(&body).unwrap()
}

async fn write_reply<T: serde::Serialize>(peer: &mut UnixStream, reply: &T) {
    let body = protocol::encode(reply).unwrap();
    peer.write_u32(body.len() as u32).await.unwrap();
    peer.write_all(&body).await.unwrap();
}

async fn pair() -> (Arc<RuntimeClient>, UnixStream, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rt.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let client = RuntimeClient::connect(&path).await.unwrap();
    let (peer, _) = listener.accept().await.unwrap();
    (client, peer, dir)
}

#[tokio::test]
async fn replies_out_of_order_reach_their_requests() {
    let (client, mut peer, _dir) = pair().await;
    let unload = tokio::spawn({
        let client = client.clone();
        async move { client.unload("a").await }
    });
    let first = read_request(&mut peer).await;
    let stats = tokio::spawn({
        let client = client.clone();
        async move { client.stats().await }
    });
    let second = read_request(&mut peer).await;
    assert_eq!((first.op(), second.op()), ("unload", "stats"));
    assert_ne!(first.id(), second.id());

    write_reply(
        &mut peer,
        &StatsReply {
            id: second.id(),
            ok: true,
            memory_bytes: 42,
            models: vec![],
            queue_depth: 3,
        },
    )
    .await;
    write_reply(
        &mut peer,
        &MemoryReply {
            id: first.id(),
            ok: true,
            model_key: "a".into(),
            memory_bytes: 7,
        },
    )
    .await;
    assert_eq!(stats.await.unwrap().unwrap().queue_depth, 3);
    assert_eq!(unload.await.unwrap().unwrap().memory_bytes, 7);
}

#[tokio::test]
async fn error_reply_becomes_runtime_error() {
    let (client, mut peer, _dir) = pair().await;
    let call = tokio::spawn({
        let client = client.clone();
        async move { client.unload("missing").await }
    });
    let request = read_request(&mut peer).await;
    let error = ErrorBody::new(Code::ModelNotLoaded, "not loaded");
    write_reply(
        &mut peer,
        &ErrorReply {
            id: request.id(),
            ok: false,
            error: error.clone(),
        },
    )
    .await;
    match call.await.unwrap() {
        Err(Error::Runtime(body)) => assert_eq!(body, error),
        other => panic!("expected a runtime error, got {other:?}"),
    }
}

#[tokio::test]
async fn closed_socket_fails_pending_calls() {
    let (client, mut peer, _dir) = pair().await;
    let call = tokio::spawn({
        let client = client.clone();
        async move { client.stats().await }
    });
    read_request(&mut peer).await;
    drop(peer);
    let result = tokio::time::timeout(Duration::from_secs(5), call)
        .await
        .unwrap();
    assert!(matches!(result.unwrap(), Err(Error::RuntimeUnavailable(_))));
    assert!(client.is_closed());
    assert!(matches!(
        client.stats().await,
        Err(Error::RuntimeUnavailable(_))
    ));
}
