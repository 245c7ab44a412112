//! The error side of the wire: the one error shape every failed reply carries, and the codes
//! the sidecar and its runtimes answer with. The codes and whether each is retryable by default
//! are declared in contract/shared.toml (`socket = true` marks those a runtime answers with on
//! the socket); [`Code`] names the ones this crate emits and reads the rest from the file, as
//! serving/protocol/codes.py does.

use serde::{Deserialize, Serialize};

use crate::contract::{self, CodeRule};

/// A code the sidecar or one of its runtimes answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Code {
    BadRequest,
    UnknownOp,
    ModelNotLoaded,
    EpochBehind,
    LoadFailed,
    InferFailed,
    OutOfMemory,
    DeadlineExceeded,
    RuntimeUnavailable,
    ReplyUndeliverable,
    Internal,
}

impl Code {
    /// Every code the sidecar emits.
    pub const ALL: [Code; 11] = [
        Code::BadRequest,
        Code::UnknownOp,
        Code::ModelNotLoaded,
        Code::EpochBehind,
        Code::LoadFailed,
        Code::InferFailed,
        Code::OutOfMemory,
        Code::DeadlineExceeded,
        Code::RuntimeUnavailable,
        Code::ReplyUndeliverable,
        Code::Internal,
    ];

    /// The codes a runtime answers with on the socket (the declared `socket = true` ones).
    pub const SOCKET: [Code; 7] = [
        Code::BadRequest,
        Code::UnknownOp,
        Code::ModelNotLoaded,
        Code::LoadFailed,
        Code::InferFailed,
        Code::OutOfMemory,
        Code::DeadlineExceeded,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Code::BadRequest => "BAD_REQUEST",
            Code::UnknownOp => "UNKNOWN_OP",
            Code::ModelNotLoaded => "MODEL_NOT_LOADED",
            Code::EpochBehind => "EPOCH_BEHIND",
            Code::LoadFailed => "LOAD_FAILED",
            Code::InferFailed => "INFER_FAILED",
            Code::OutOfMemory => "OUT_OF_MEMORY",
            Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
            Code::RuntimeUnavailable => "RUNTIME_UNAVAILABLE",
            Code::ReplyUndeliverable => "REPLY_UNDELIVERABLE",
            Code::Internal => "INTERNAL",
        }
    }

    /// What contract/shared.toml declares for it (every [`Code`] is declared: tested below).
    pub fn rule(self) -> &'static CodeRule {
        contract::declared()
            .error_codes
            .get(self.as_str())
            .unwrap_or_else(|| panic!("{} does not declare {}", contract::SOURCE, self.as_str()))
    }

    /// Whether a request that failed with it may succeed when sent again, by default.
    pub fn retryable(self) -> bool {
        self.rule().retryable
    }
}

/// The one error shape: `{"code", "message", "retryable"}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub code: String,
    pub message: String,
    pub retryable: bool,
}

impl ErrorBody {
    /// An error of `code`, retryable as the contract declares it.
    pub fn new(code: Code, message: &str) -> Self {
        Self {
            code: code.as_str().to_string(),
            message: message.to_string(),
            retryable: code.retryable(),
        }
    }

    /// The same error, retryable or not whatever the code's default (a load that failed on a
    /// network error may succeed later; a deadline that passed while a failed worker held the
    /// request may be met by another try).
    pub fn retryable(self, retryable: bool) -> Self {
        Self { retryable, ..self }
    }

    pub fn is(&self, code: Code) -> bool {
        self.code == code.as_str()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::Path;

    use super::{Code, ErrorBody};
    use crate::contract;

    #[test]
    fn every_code_the_sidecar_emits_is_declared_with_its_retryability() {
        let declared = &contract::declared().error_codes;
        for code in Code::ALL {
            let rule = &declared[code.as_str()];
            let body = ErrorBody::new(code, "m");
            assert_eq!(
                (body.code.as_str(), body.retryable),
                (code.as_str(), rule.retryable)
            );
        }
        // Today's disagreement: INTERNAL was retryable here and not in httpapi/errors.py.
        assert!(!Code::Internal.retryable());
    }

    #[test]
    fn the_socket_codes_are_the_declared_socket_codes() {
        let ours: BTreeSet<&str> = Code::SOCKET.iter().map(|c| c.as_str()).collect();
        let declared: BTreeSet<&str> = contract::declared()
            .error_codes
            .iter()
            .filter(|(_, rule)| rule.socket)
            .map(|(code, _)| code.as_str())
            .collect();
        assert_eq!(ours, declared);
        assert!(Code::SOCKET.iter().all(|c| Code::ALL.contains(c)));
    }

    /// A code spelled as a string literal bypasses [`Code`] (and the check above); the sources
    /// name codes only here. Test code (after `#[cfg(test)]`, or a `*_test.rs` file) may.
    #[test]
    fn no_module_spells_a_declared_code_by_hand() {
        let codes: Vec<String> = contract::declared()
            .error_codes
            .keys()
            .map(|c| format!("\"{c}\""))
            .collect();
        let mut found = Vec::new();
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        for path in rust_files(&src) {
            let name = path.strip_prefix(&src).unwrap().display().to_string();
            if name == "protocol/codes.rs" || name.ends_with("_test.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let text = text.split("#[cfg(test)]").next().unwrap_or_default();
            found.extend(
                codes
                    .iter()
                    .filter(|c| text.contains(c.as_str()))
                    .map(|c| format!("{name}: {c}")),
            );
        }
        assert!(found.is_empty(), "{found:?}");
    }

    fn rust_files(dir: &Path) -> Vec<std::path::PathBuf> {
        let mut files = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                files.extend(rust_files(&path));
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
        files
    }
}
