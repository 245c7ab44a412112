//! Messages <-> msgpack maps. Struct field order *is* the msgpack map key order, so both
//! languages produce identical bytes (serving/protocol/codec.py writes dataclass fields in
//! order); constant fields (`op`, `ok`, `v`) are real fields so that they sit in their
//! documented place. Maps keyed by data are `BTreeMap`s: sorted keys, as Python writes them.

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::Result;

/// msgpack bytes of a message, structs written as maps with string keys.
pub fn encode<T: Serialize>(message: &T) -> Result<Vec<u8>> {
    Ok(rmp_serde::to_vec_named(message)?)
}

pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    Ok(rmp_serde::from_slice(bytes)?)
}
