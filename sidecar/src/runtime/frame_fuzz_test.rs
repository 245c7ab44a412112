//! Property tests ("fuzz" by proptest, on stable) of the socket frame decoder and the reply
//! decoders behind it: arbitrary bytes from a runtime never panic the sidecar and never make it
//! allocate what a header merely announces; well-formed frames come back byte for byte.
//! Each property runs `PROPTEST_CASES` cases (256 by default; `make bench` runs a long bounded
//! session and reports the count).

use proptest::prelude::*;

use crate::protocol::{
    self, ErrorReply, HelloReply, InferReply, MemoryReply, ReplyHead, StatsReply,
};
use crate::protocol::{read_frame, MAX_FRAME_BYTES};

fn block_on<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime")
        .block_on(future)
}

/// Every frame in `stream`, until the end or the first error (as the reader task does).
fn frames(stream: &[u8]) -> (Vec<Vec<u8>>, bool) {
    block_on(async {
        let mut reader = stream;
        let mut out = Vec::new();
        loop {
            match read_frame(&mut reader, MAX_FRAME_BYTES).await {
                Ok(Some(body)) => out.push(body),
                Ok(None) => return (out, false),
                Err(_) => return (out, true),
            }
        }
    })
}

/// What the reader and the callers do with a body: none of it may panic.
fn decode_everything(body: &[u8]) {
    let _ = protocol::decode::<ReplyHead>(body);
    let _ = protocol::decode::<ErrorReply>(body);
    let _ = protocol::decode::<HelloReply>(body);
    let _ = protocol::decode::<MemoryReply>(body);
    let _ = protocol::decode::<InferReply>(body);
    let _ = protocol::decode::<StatsReply>(body);
}

fn framed(bodies: &[Vec<u8>]) -> Vec<u8> {
    let mut stream = Vec::new();
    for body in bodies {
        stream.extend_from_slice(&(body.len() as u32).to_be_bytes());
        stream.extend_from_slice(body);
    }
    stream
}

proptest! {
    #[test]
    fn fuzz_arbitrary_bytes_never_panic_the_frame_reader(stream in proptest::collection::vec(any::<u8>(), 0..4096)) {
        let (bodies, _) = frames(&stream);
        let total: usize = bodies.iter().map(|b| b.len() + 4).sum();
        prop_assert!(total <= stream.len());
        for body in &bodies {
            decode_everything(body);
        }
    }

    #[test]
    fn fuzz_frames_round_trip_and_a_cut_stream_is_an_error(
        bodies in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..512), 0..8),
        cut in any::<prop::sample::Index>(),
    ) {
        let stream = framed(&bodies);
        let (read, failed) = frames(&stream);
        prop_assert!(!failed);
        prop_assert_eq!(&read, &bodies);
        if !stream.is_empty() {
            let at = cut.index(stream.len());
            let (read, failed) = frames(&stream[..at]);
            // A stream cut between frames ends cleanly; inside one it is an error.
            let boundary = read.iter().map(|b| b.len() + 4).sum::<usize>() == at;
            prop_assert_eq!(failed, !boundary);
        }
    }

    #[test]
    fn fuzz_oversized_headers_are_refused_without_allocating(length in (MAX_FRAME_BYTES + 1)..=u32::MAX, tail in proptest::collection::vec(any::<u8>(), 0..64)) {
        let mut stream = length.to_be_bytes().to_vec();
        stream.extend_from_slice(&tail);
        let (read, failed) = frames(&stream);
        prop_assert!(read.is_empty() && failed);
    }

    #[test]
    fn fuzz_msgpack_maps_with_reply_keys_never_panic(
        id in any::<u64>(),
        ok in any::<bool>(),
        junk in proptest::collection::vec(any::<u8>(), 0..256),
    ) {
        // A real head followed by garbage where the rest of the map should be.
        let mut body = vec![0x83, 0xa2, b'i', b'd', 0xcf];
        body.extend_from_slice(&id.to_be_bytes());
        body.extend_from_slice(&[0xa2, b'o', b'k', if ok { 0xc3 } else { 0xc2 }]);
        body.extend_from_slice(&junk);
        decode_everything(&body);
    }
}
