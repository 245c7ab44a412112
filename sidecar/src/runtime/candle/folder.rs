//! What a sentence-transformers folder says about how to embed, read the way
//! sentence-transformers reads it: `modules.json` (Transformer, Pooling, Normalize, in that
//! order), the pooling module's `config.json`, `max_seq_length` from `sentence_bert_config.json`
//! (else the tokenizer's `model_max_length`), and the transformer's `config.json`,
//! `model.safetensors` and `tokenizer.json`. Anything the Candle runtime cannot reproduce
//! exactly (another architecture, a Dense layer, pickled weights) is refused with its reason.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use crate::error::Result;
use crate::protocol::Code;
use crate::runtime::failure;

/// How token vectors become one sentence vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    Mean,
    Cls,
    Max,
    MeanSqrtLen,
    LastToken,
}

#[derive(Debug, Clone)]
pub struct SentenceFolder {
    pub transformer_dir: PathBuf,
    pub pooling: Pooling,
    pub normalize: bool,
    /// sentence-transformers' `max_seq_length`; `None` when the folder names none.
    pub max_seq_length: Option<usize>,
    pub config: Value,
}

#[derive(Deserialize)]
struct Module {
    #[serde(default)]
    path: String,
    #[serde(rename = "type")]
    kind: String,
}

fn load_failed(message: String) -> crate::error::Error {
    failure(Code::LoadFailed, message)
}

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| load_failed(format!("cannot read {}: {e}", path.display())))?;
    serde_json::from_str(&text)
        .map_err(|e| load_failed(format!("{} is not valid JSON: {e}", path.display())))
}

impl SentenceFolder {
    pub fn read(root: &Path) -> Result<Self> {
        if !root.is_dir() {
            return Err(load_failed(format!(
                "base model folder does not exist: {}",
                root.display()
            )));
        }
        let modules_path = root.join("modules.json");
        let (transformer_dir, pooling, normalize) = if modules_path.is_file() {
            let modules: Vec<Module> = serde_json::from_value(read_json(&modules_path)?)
                .map_err(|e| load_failed(format!("modules.json: {e}")))?;
            read_modules(root, &modules)?
        } else {
            // A plain transformers folder: sentence-transformers defaults to mean pooling.
            (root.to_path_buf(), Pooling::Mean, false)
        };
        let config = read_json(&transformer_dir.join("config.json"))?;
        let model_type = config.get("model_type").and_then(Value::as_str);
        if model_type != Some("bert") {
            return Err(load_failed(format!(
                "the candle runtime serves BERT-family models; this one is {:?}",
                model_type.unwrap_or("unknown")
            )));
        }
        Ok(Self {
            max_seq_length: max_seq_length(root, &transformer_dir)?,
            transformer_dir,
            pooling,
            normalize,
            config,
        })
    }

    pub fn weights(&self) -> Result<PathBuf> {
        let path = self.transformer_dir.join("model.safetensors");
        if path.is_file() {
            return Ok(path);
        }
        Err(load_failed(format!(
            "no model.safetensors in {} (the candle runtime does not read pickled weights)",
            self.transformer_dir.display()
        )))
    }

    pub fn tokenizer(&self) -> Result<PathBuf> {
        let path = self.transformer_dir.join("tokenizer.json");
        if path.is_file() {
            return Ok(path);
        }
        Err(load_failed(format!(
            "no tokenizer.json in {}",
            self.transformer_dir.display()
        )))
    }

    /// The longest input the position embeddings allow.
    pub fn max_positions(&self) -> usize {
        self.config
            .get("max_position_embeddings")
            .and_then(Value::as_u64)
            .unwrap_or(512) as usize
    }
}

fn read_modules(root: &Path, modules: &[Module]) -> Result<(PathBuf, Pooling, bool)> {
    let short = |m: &Module| m.kind.rsplit('.').next().unwrap_or("").to_string();
    let kinds: Vec<String> = modules.iter().map(short).collect();
    let expected = match kinds.len() {
        2 => ["Transformer", "Pooling"].as_slice(),
        3 => ["Transformer", "Pooling", "Normalize"].as_slice(),
        _ => &[],
    };
    if kinds != expected {
        return Err(load_failed(format!(
            "the candle runtime serves Transformer + Pooling [+ Normalize] pipelines; this \
             model's modules are {kinds:?}"
        )));
    }
    let transformer_dir = root.join(&modules[0].path);
    let pooling = read_pooling(&root.join(&modules[1].path).join("config.json"))?;
    Ok((transformer_dir, pooling, kinds.len() == 3))
}

fn read_pooling(path: &Path) -> Result<Pooling> {
    let config = read_json(path)?;
    // sentence-transformers >= 6 writes one `pooling_mode` string; older ones one flag a mode.
    if let Some(mode) = config.get("pooling_mode").and_then(Value::as_str) {
        return match mode {
            "mean" => Ok(Pooling::Mean),
            "cls" => Ok(Pooling::Cls),
            "max" => Ok(Pooling::Max),
            "mean_sqrt_len_tokens" => Ok(Pooling::MeanSqrtLen),
            "lasttoken" => Ok(Pooling::LastToken),
            other => Err(load_failed(format!(
                "pooling mode {other:?} is not supported by the candle runtime"
            ))),
        };
    }
    let flag = |key: &str| config.get(key).and_then(Value::as_bool).unwrap_or(false);
    let modes = [
        ("pooling_mode_mean_tokens", Pooling::Mean),
        ("pooling_mode_cls_token", Pooling::Cls),
        ("pooling_mode_max_tokens", Pooling::Max),
        ("pooling_mode_mean_sqrt_len_tokens", Pooling::MeanSqrtLen),
        ("pooling_mode_lasttoken", Pooling::LastToken),
        ("pooling_mode_weightedmean_tokens", Pooling::Mean),
    ];
    let on: Vec<&(&str, Pooling)> = modes.iter().filter(|(key, _)| flag(key)).collect();
    match on.as_slice() {
        [(key, pooling)] if *key != "pooling_mode_weightedmean_tokens" => Ok(*pooling),
        _ => Err(load_failed(format!(
            "the candle runtime needs exactly one of mean/cls/max/mean_sqrt_len/lasttoken \
             pooling; {} sets {:?}",
            path.display(),
            on.iter().map(|(key, _)| *key).collect::<Vec<_>>()
        ))),
    }
}

fn max_seq_length(root: &Path, transformer_dir: &Path) -> Result<Option<usize>> {
    for dir in [root, transformer_dir] {
        let path = dir.join("sentence_bert_config.json");
        if path.is_file() {
            if let Some(n) = read_json(&path)?
                .get("max_seq_length")
                .and_then(Value::as_u64)
            {
                return Ok(Some(n as usize));
            }
        }
    }
    // sentence-transformers 6 keeps the limit on the tokenizer only; transformers writes a
    // huge sentinel when the tokenizer has none.
    let path = transformer_dir.join("tokenizer_config.json");
    if path.is_file() {
        if let Some(n) = read_json(&path)?
            .get("model_max_length")
            .and_then(Value::as_u64)
        {
            if n < 1_000_000 {
                return Ok(Some(n as usize));
            }
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) {
        let path = dir.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    fn folder(modules: &str, pooling: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "modules.json", modules);
        write(dir.path(), "1_Pooling/config.json", pooling);
        write(dir.path(), "config.json", r#"{"model_type": "bert"}"#);
        write(
            dir.path(),
            "sentence_bert_config.json",
            r#"{"max_seq_length": 256}"#,
        );
        dir
    }

    const THREE: &str = r#"[
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}
    ]"#;

    #[test]
    fn reads_pooling_normalize_and_length() {
        let dir = folder(THREE, r#"{"pooling_mode_mean_tokens": true}"#);
        let folder = SentenceFolder::read(dir.path()).unwrap();
        assert_eq!(folder.pooling, Pooling::Mean);
        assert!(folder.normalize);
        assert_eq!(folder.max_seq_length, Some(256));
        let dir = folder_with_mode("cls");
        assert_eq!(
            SentenceFolder::read(dir.path()).unwrap().pooling,
            Pooling::Cls
        );
    }

    fn folder_with_mode(mode: &str) -> tempfile::TempDir {
        folder(THREE, &format!(r#"{{"pooling_mode": "{mode}"}}"#))
    }

    #[test]
    fn refuses_what_it_cannot_reproduce() {
        let dense = r#"[
            {"path": "", "type": "sentence_transformers.models.Transformer"},
            {"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"path": "2_Dense", "type": "sentence_transformers.models.Dense"}
        ]"#;
        let two_modes = r#"{"pooling_mode_mean_tokens": true, "pooling_mode_cls_token": true}"#;
        for dir in [
            folder(dense, r#"{"pooling_mode_mean_tokens": true}"#),
            folder(THREE, two_modes),
            folder_with_mode("weightedmean"),
        ] {
            match SentenceFolder::read(dir.path()) {
                Err(crate::error::Error::Runtime(body)) => assert_eq!(body.code, "LOAD_FAILED"),
                other => panic!("expected LOAD_FAILED, got {other:?}"),
            }
        }
        let dir = folder(THREE, r#"{"pooling_mode_mean_tokens": true}"#);
        write(
            dir.path(),
            "config.json",
            r#"{"model_type": "xlm-roberta"}"#,
        );
        assert!(SentenceFolder::read(dir.path()).is_err());
    }
}
