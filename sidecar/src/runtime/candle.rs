//! The Candle runtime (cargo feature `candle`): BERT-family sentence embedders run inside the
//! sidecar, from the same folder the PyTorch runtime loads: `model.safetensors` through
//! candle-transformers' BERT, `tokenizer.json` through the `tokenizers` crate, pooling,
//! normalisation and `max_seq_length` as the folder's sentence-transformers config says
//! ([`folder`]), LoRA adapters merged into the weights at load ([`lora`]).
//!
//! Each model key holds its own weights (a merged adapter is a changed copy of its base), so
//! memory counts one base per key. Work runs on blocking threads; a batch is sorted by length
//! and cut into forward passes of at most `max_batch_tokens` padded tokens and 32 texts, as the
//! PyTorch runtime does on a CPU.

pub mod folder;
pub mod lora;

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config};
use tokenizers::{Tokenizer, TruncationDirection, TruncationParams, TruncationStrategy};

use self::folder::{Pooling, SentenceFolder};
use super::{
    check_deadline, embeddings, failure, not_loaded, prefix, reload, Backend, RuntimeInfo,
    RuntimeStats, Terms, CAP_EMBED, CAP_LORA, CAP_MIXED_ADAPTERS,
};
use crate::error::{Error, Result};
use crate::protocol::{Code, Embeddings, InferItem, LoadRequest, ModelStats};
use crate::worker::tokens::cut_text;

/// Texts per forward pass (the PyTorch runtime's CPU default).
const MAX_BATCH_TEXTS: usize = 32;

/// One loaded model key: BERT + tokenizer + pooling, ready to embed.
pub struct SentenceEncoder {
    model: BertModel,
    tokenizer: Tokenizer,
    pooling: Pooling,
    normalize: bool,
    pad_id: u32,
    device: Device,
    pub dims: usize,
    pub max_seq_length: usize,
    pub memory_bytes: u64,
}

impl SentenceEncoder {
    /// Loads a sentence-transformers folder, with a peft LoRA adapter merged in when given.
    pub fn load(
        base: &Path,
        adapter: Option<&Path>,
        max_seq_length: Option<usize>,
        device: &Device,
    ) -> Result<Self> {
        let folder = SentenceFolder::read(base)?;
        let config: Config = serde_json::from_value(folder.config.clone()).map_err(|e| {
            load_failed(format!(
                "{}/config.json is not a BERT config: {e}",
                folder.transformer_dir.display()
            ))
        })?;
        let weights_path = folder.weights()?;
        let mut weights = candle_core::safetensors::load(&weights_path, device)
            .map_err(|e| load_failed(format!("cannot read {}: {e}", weights_path.display())))?;
        if let Some(adapter) = adapter {
            lora::merge(&mut weights, adapter, device).map_err(as_load_failure)?;
        }
        let memory_bytes = weights
            .values()
            .map(|t| (t.elem_count() * t.dtype().size_in_bytes()) as u64)
            .sum();
        let vb = VarBuilder::from_tensors(weights, DType::F32, device);
        let model = BertModel::load(vb, &config)
            .map_err(|e| load_failed(format!("weights do not fit a BERT model: {e}")))?;
        let max_seq_length = max_seq_length
            .or(folder.max_seq_length)
            .unwrap_or(folder.max_positions())
            .min(folder.max_positions());
        let mut tokenizer = Tokenizer::from_file(folder.tokenizer()?)
            .map_err(|e| load_failed(format!("cannot read tokenizer.json: {e}")))?;
        // tokenizer.json may carry its own truncation and fixed padding; sentence-transformers
        // truncates at max_seq_length and pads to the longest text of a batch.
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: max_seq_length,
                strategy: TruncationStrategy::LongestFirst,
                stride: 0,
                direction: TruncationDirection::Right,
            }))
            .map_err(|e| load_failed(format!("tokenizer truncation: {e}")))?;
        tokenizer.with_padding(None);
        let pad_id = tokenizer
            .get_padding()
            .map(|p| p.pad_id)
            .unwrap_or_else(|| {
                tokenizer
                    .token_to_id("[PAD]")
                    .unwrap_or(config.pad_token_id as u32)
            });
        Ok(Self {
            dims: config.hidden_size,
            model,
            tokenizer,
            pooling: folder.pooling,
            normalize: folder.normalize,
            pad_id,
            device: device.clone(),
            max_seq_length,
            memory_bytes,
        })
    }

    /// Sentence vectors of `texts`, in input order.
    pub fn embed(&self, texts: &[String], max_batch_tokens: usize) -> Result<Vec<Vec<f32>>> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        // Cut to what the model reads before tokenising, as the Python runtime does.
        let mut inputs = texts.to_vec();
        for text in &mut inputs {
            cut_text(text, self.max_seq_length);
        }
        let encodings = self
            .tokenizer
            .encode_batch(inputs, true)
            .map_err(|e| infer_failed(format!("tokenizing: {e}")))?;
        let lengths: Vec<usize> = encodings.iter().map(|e| e.get_ids().len()).collect();
        let mut vectors = vec![Vec::new(); texts.len()];
        for batch in plan_batches(&lengths, max_batch_tokens, MAX_BATCH_TEXTS) {
            let rows: Vec<&tokenizers::Encoding> = batch.iter().map(|&i| &encodings[i]).collect();
            let pooled = self.forward(&rows).map_err(as_infer_failure)?;
            for (&i, vector) in batch.iter().zip(pooled) {
                vectors[i] = vector;
            }
        }
        Ok(vectors)
    }

    fn forward(&self, rows: &[&tokenizers::Encoding]) -> Result<Vec<Vec<f32>>> {
        let width = rows
            .iter()
            .map(|e| e.get_ids().len())
            .max()
            .unwrap_or(0)
            .max(1);
        let mut ids = Vec::with_capacity(rows.len() * width);
        let mut types = Vec::with_capacity(rows.len() * width);
        let mut mask = Vec::with_capacity(rows.len() * width);
        for encoding in rows {
            let n = encoding.get_ids().len();
            ids.extend_from_slice(encoding.get_ids());
            ids.extend(std::iter::repeat_n(self.pad_id, width - n));
            types.extend_from_slice(encoding.get_type_ids());
            types.extend(std::iter::repeat_n(0, width - n));
            mask.extend(std::iter::repeat_n(1u32, n));
            mask.extend(std::iter::repeat_n(0u32, width - n));
        }
        let shape = (rows.len(), width);
        let ids = Tensor::from_vec(ids, shape, &self.device)?;
        let types = Tensor::from_vec(types, shape, &self.device)?;
        let attention = Tensor::from_vec(mask, shape, &self.device)?;
        let hidden = self.model.forward(&ids, &types, Some(&attention))?;
        let hidden: Vec<Vec<Vec<f32>>> = hidden.to_dtype(DType::F32)?.to_vec3()?;
        Ok(hidden
            .iter()
            .zip(rows)
            .map(|(tokens, encoding)| {
                let vector = pool(self.pooling, &tokens[..encoding.get_ids().len()]);
                if self.normalize {
                    normalised(vector)
                } else {
                    vector
                }
            })
            .collect())
    }
}

/// Pools the token vectors of one text (padding already cut off), as sentence-transformers does.
fn pool(pooling: Pooling, tokens: &[Vec<f32>]) -> Vec<f32> {
    let dims = tokens.first().map(Vec::len).unwrap_or(0);
    let sum = || {
        let mut sum = vec![0f32; dims];
        for token in tokens {
            for (s, v) in sum.iter_mut().zip(token) {
                *s += v;
            }
        }
        sum
    };
    let count = tokens.len().max(1) as f32;
    match pooling {
        Pooling::Mean => sum().into_iter().map(|s| s / count).collect(),
        Pooling::MeanSqrtLen => sum().into_iter().map(|s| s / count.sqrt()).collect(),
        Pooling::Cls => tokens.first().cloned().unwrap_or_default(),
        Pooling::LastToken => tokens.last().cloned().unwrap_or_default(),
        Pooling::Max => (0..dims)
            .map(|d| {
                tokens
                    .iter()
                    .map(|t| t[d])
                    .fold(f32::NEG_INFINITY, f32::max)
            })
            .collect(),
    }
}

/// `x / max(|x|, 1e-12)`, torch's `F.normalize`.
fn normalised(vector: Vec<f32>) -> Vec<f32> {
    let norm = vector.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-12);
    vector.into_iter().map(|v| v / norm).collect()
}

/// Indices cut into batches sorted by length, padded tokens under the budget (always >= 1).
fn plan_batches(lengths: &[usize], max_tokens: usize, max_texts: usize) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(lengths[i]));
    let mut batches = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    let mut longest = 0;
    for i in order {
        let n = lengths[i].max(1);
        let widest = longest.max(n);
        if !current.is_empty()
            && (widest * (current.len() + 1) > max_tokens || current.len() >= max_texts)
        {
            batches.push(std::mem::take(&mut current));
            longest = 0;
        }
        longest = longest.max(n);
        current.push(i);
    }
    if !current.is_empty() {
        batches.push(current);
    }
    batches
}

fn load_failed(message: String) -> Error {
    failure(Code::LoadFailed, message)
}

fn infer_failed(message: String) -> Error {
    failure(Code::InferFailed, message)
}

fn as_load_failure(error: Error) -> Error {
    match error {
        Error::Runtime(_) => error,
        other => load_failed(other.to_string()),
    }
}

fn as_infer_failure(error: Error) -> Error {
    match error {
        Error::Runtime(_) => error,
        other => infer_failed(other.to_string()),
    }
}

struct Loaded {
    request: LoadRequest,
    encoder: Arc<SentenceEncoder>,
}

pub struct CandleRuntime {
    device: Device,
    max_batch_tokens: usize,
    models: Mutex<HashMap<String, Loaded>>,
    in_flight: AtomicU32,
}

impl CandleRuntime {
    pub fn new(max_batch_tokens: usize) -> Result<Self> {
        if max_batch_tokens == 0 {
            return Err(Error::Config(
                "--candle-max-batch-tokens must be above 0".into(),
            ));
        }
        Ok(Self {
            device: Device::Cpu,
            max_batch_tokens,
            models: Mutex::new(HashMap::new()),
            in_flight: AtomicU32::new(0),
        })
    }
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| Error::RuntimeUnavailable(format!("candle worker thread failed: {e}")))?
}

#[async_trait]
impl Backend for CandleRuntime {
    fn info(&self) -> RuntimeInfo {
        RuntimeInfo {
            runtime: "candle".into(),
            version: format!("candle {}", env!("CARGO_PKG_VERSION")),
            capabilities: vec![CAP_EMBED.into(), CAP_LORA.into(), CAP_MIXED_ADAPTERS.into()],
        }
    }

    async fn health(&self) -> Result<()> {
        Ok(())
    }

    async fn load(&self, request: LoadRequest) -> Result<u64> {
        if let Some(loaded) = self
            .models
            .lock()
            .expect("models lock")
            .get(&request.model_key)
        {
            return reload(&loaded.request, &request);
        }
        let device = self.device.clone();
        let spec = request.clone();
        let encoder = blocking(move || {
            SentenceEncoder::load(
                Path::new(&spec.base_path),
                spec.adapter_path.as_deref().map(Path::new),
                spec.max_seq_length.map(|n| n as usize),
                &device,
            )
        })
        .await?;
        let memory_bytes = encoder.memory_bytes;
        tracing::info!(
            model_key = %request.model_key,
            memory_bytes,
            max_seq_length = encoder.max_seq_length,
            "candle model loaded"
        );
        self.models.lock().expect("models lock").insert(
            request.model_key.clone(),
            Loaded {
                request,
                encoder: Arc::new(encoder),
            },
        );
        Ok(memory_bytes)
    }

    async fn unload(&self, model_key: &str) -> Result<u64> {
        match self.models.lock().expect("models lock").remove(model_key) {
            Some(loaded) => Ok(loaded.encoder.memory_bytes),
            None => Err(not_loaded(model_key)),
        }
    }

    async fn infer(
        &self,
        batch_id: String,
        items: Vec<InferItem>,
        terms: Terms,
    ) -> Result<Vec<Embeddings>> {
        let deadline_ms = terms.deadline_ms;
        let mut work = Vec::with_capacity(items.len());
        {
            let models = self.models.lock().expect("models lock");
            for item in items {
                let loaded = models
                    .get(&item.model_key)
                    .ok_or_else(|| not_loaded(&item.model_key))?;
                let prefix = prefix(&loaded.request, item.kind).to_string();
                let texts: Vec<String> =
                    item.texts.iter().map(|t| format!("{prefix}{t}")).collect();
                work.push((loaded.encoder.clone(), texts));
            }
        }
        let max_batch_tokens = self.max_batch_tokens;
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        let result = blocking(move || {
            // Checked when a blocking thread picks the batch up, not when it was queued.
            check_deadline(&batch_id, deadline_ms)?;
            work.iter()
                .map(|(encoder, texts)| {
                    let rows = encoder.embed(texts, max_batch_tokens)?;
                    Ok(embeddings(encoder.dims, &rows))
                })
                .collect::<Result<Vec<_>>>()
        })
        .await;
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        result
    }

    async fn stats(&self) -> Result<RuntimeStats> {
        let models = self.models.lock().expect("models lock");
        let stats: Vec<ModelStats> = models
            .iter()
            .map(|(key, loaded)| ModelStats {
                model_key: key.clone(),
                memory_bytes: loaded.encoder.memory_bytes,
                base_key: loaded.request.base_path.clone(),
            })
            .collect();
        Ok(RuntimeStats {
            memory_bytes: stats.iter().map(|m| m.memory_bytes).sum(),
            models: stats,
            queue_depth: self.in_flight.load(Ordering::Relaxed),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooling_follows_sentence_transformers() {
        let tokens = vec![vec![1.0, -2.0], vec![3.0, 4.0]];
        assert_eq!(pool(Pooling::Mean, &tokens), vec![2.0, 1.0]);
        assert_eq!(pool(Pooling::Cls, &tokens), vec![1.0, -2.0]);
        assert_eq!(pool(Pooling::LastToken, &tokens), vec![3.0, 4.0]);
        assert_eq!(pool(Pooling::Max, &tokens), vec![3.0, 4.0]);
        let sqrt = pool(Pooling::MeanSqrtLen, &tokens);
        assert!((sqrt[0] - 4.0 / 2f32.sqrt()).abs() < 1e-6);
        assert_eq!(normalised(vec![3.0, 4.0]), vec![0.6, 0.8]);
        assert_eq!(normalised(vec![0.0, 0.0]), vec![0.0, 0.0]);
    }

    #[test]
    fn batches_stay_under_the_token_budget() {
        let lengths = [10, 200, 30, 200, 5];
        let batches = plan_batches(&lengths, 400, 32);
        let mut seen: Vec<usize> = batches.iter().flatten().copied().collect();
        seen.sort();
        assert_eq!(seen, vec![0, 1, 2, 3, 4]);
        for batch in &batches {
            let widest = batch.iter().map(|&i| lengths[i]).max().unwrap();
            assert!(
                batch.len() == 1 || widest * batch.len() <= 400,
                "{batches:?}"
            );
        }
        assert_eq!(plan_batches(&[1; 5], 1000, 2).len(), 3);
    }
}
