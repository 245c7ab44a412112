//! Property tests of the envelope decoders: the gateway's headers and the queue payload (and
//! the KV values the sidecar reads) never panic on arbitrary input, and well-formed payloads
//! decode to what was encoded.

use async_nats::HeaderMap;
use proptest::prelude::*;

use super::{parse_payload, RequestHeaders};
use crate::contract;
use crate::protocol::{
    self, Inputs, PayloadRef, Placement, QueuePayload, TaskPayload, TextKind, WorkerHeartbeat,
};

fn payload_strategy() -> impl Strategy<Value = QueuePayload> {
    let inputs = prop_oneof![
        proptest::collection::vec(any::<String>(), 0..8).prop_map(Inputs::Texts),
        any::<String>().prop_map(|key| Inputs::Ref(PayloadRef { key })),
    ];
    (any::<bool>(), inputs).prop_map(|(query, inputs)| QueuePayload {
        v: 1,
        task: "fuzz-task".into(),
        kind: if query {
            TextKind::Query
        } else {
            TextKind::Passage
        },
        inputs,
    })
}

proptest! {
    #[test]
    fn fuzz_arbitrary_payload_bytes_are_refused_not_panicked_on(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        if let Ok(payload) = parse_payload("fuzz-task", &bytes) {
            prop_assert_eq!(payload.task(), "fuzz-task");
        }
        let _ = protocol::decode::<Placement>(&bytes);
        let _ = protocol::decode::<WorkerHeartbeat>(&bytes);
    }

    #[test]
    fn fuzz_well_formed_payloads_decode_to_what_was_sent(payload in payload_strategy()) {
        let bytes = protocol::encode(&payload).unwrap();
        prop_assert_eq!(
            parse_payload("fuzz-task", &bytes).unwrap(),
            TaskPayload::Embed(payload.clone())
        );
        // The same bytes on another task's subject are refused, not served.
        prop_assert!(parse_payload("other-task", &bytes).is_err());
        // Any truncation is an error, never a different payload.
        for cut in 0..bytes.len() {
            prop_assert!(parse_payload("fuzz-task", &bytes[..cut]).is_err());
        }
    }

    #[test]
    fn fuzz_headers_read_without_panicking(
        request_id in any::<String>(),
        reply in any::<String>(),
        deadline in any::<String>(),
        numeric in any::<u64>(),
        use_numeric in any::<bool>(),
    ) {
        let names = &contract::declared().headers;
        let mut headers = HeaderMap::new();
        headers.insert(names.request_id.as_str(), request_id.as_str());
        headers.insert(names.reply.as_str(), reply.as_str());
        let deadline = if use_numeric { numeric.to_string() } else { deadline };
        headers.insert(names.deadline.as_str(), deadline.as_str());
        let read = RequestHeaders::read(Some(&headers));
        if use_numeric {
            prop_assert_eq!(read.deadline_ms, Some(numeric));
        }
        if let Some(reply_to) = &read.reply_to {
            prop_assert!(!reply_to.trim().is_empty());
        }
        let empty = RequestHeaders::read(None);
        prop_assert_eq!(empty.request_id, "");
        prop_assert_eq!(empty.deadline_ms, None);
    }
}
