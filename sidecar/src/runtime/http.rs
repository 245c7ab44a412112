//! The HTTP runtime: an existing engine (infinity, TEI, vLLM, SGLang `--is-embedding`) reached
//! over its OpenAI-compatible embeddings API, so a fleet can use it as a worker while taskfleet
//! keeps the queue, the registry and the evals.
//!
//! The engine owns the weights: `load` only checks that the engine serves a model (the one
//! `--http-model` names, else the only one it lists) and refuses LoRA adapters, which it cannot
//! apply. `infer` adds the placement's query/passage prefix, cuts texts into requests of at most
//! `max_batch` inputs and runs at most `max_concurrency` of them at once. Engine answers map to
//! the protocol's codes: unreachable, timed out, 429 and 502-504 are retryable
//! (`RUNTIME_UNAVAILABLE`); 400/413/422 are the input's fault (`BAD_REQUEST`); any other
//! failure or a malformed answer is `INFER_FAILED`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;

use super::{
    check_deadline, embeddings, failure, not_loaded, prefix, reload, Backend, RuntimeInfo,
    RuntimeStats, CAP_EMBED,
};
use crate::error::{Error, Result};
use crate::protocol::{Code, Embeddings, ErrorBody, InferItem, LoadRequest, ModelStats};

#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// Base URL of the OpenAI-compatible API, as OpenAI clients take it: requests go to
    /// `{base_url}/embeddings` and `{base_url}/models` (e.g. `http://127.0.0.1:7997` for
    /// infinity, `http://host:8000/v1` for vLLM).
    pub base_url: String,
    /// The engine's model id; `None`: the only model the engine lists.
    pub model: Option<String>,
    pub api_key: Option<String>,
    /// Requests in flight to the engine at once.
    pub max_concurrency: usize,
    /// Inputs per request.
    pub max_batch: usize,
    pub connect_timeout: Duration,
    pub request_timeout: Duration,
}

struct Loaded {
    request: LoadRequest,
    remote_model: String,
}

pub struct HttpRuntime {
    config: HttpConfig,
    client: reqwest::Client,
    permits: Semaphore,
    models: Mutex<HashMap<String, Loaded>>,
    in_flight: AtomicU32,
}

#[derive(Serialize)]
struct EmbeddingsRequest<'a> {
    model: &'a str,
    input: &'a [String],
    encoding_format: &'static str,
}

#[derive(Deserialize)]
struct EmbeddingsResponse {
    data: Vec<EmbeddingRow>,
}

#[derive(Deserialize)]
struct EmbeddingRow {
    embedding: Vec<f32>,
    index: usize,
}

#[derive(Deserialize)]
struct ModelList {
    data: Vec<ModelEntry>,
}

#[derive(Deserialize)]
struct ModelEntry {
    id: String,
}

impl HttpRuntime {
    pub fn new(config: HttpConfig) -> Result<Self> {
        if config.max_concurrency == 0 || config.max_batch == 0 {
            return Err(Error::Config(
                "--http-max-concurrency and --http-max-batch must be above 0".into(),
            ));
        }
        if !(config.base_url.starts_with("http://") || config.base_url.starts_with("https://")) {
            return Err(Error::Config(format!(
                "--http-base-url {:?} must start with http:// or https://",
                config.base_url
            )));
        }
        let client = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .timeout(config.request_timeout)
            .build()
            .map_err(|e| Error::Config(format!("cannot build the HTTP client: {e}")))?;
        Ok(Self {
            permits: Semaphore::new(config.max_concurrency),
            config: HttpConfig {
                base_url: config.base_url.trim_end_matches('/').to_string(),
                ..config
            },
            client,
            models: Mutex::new(HashMap::new()),
            in_flight: AtomicU32::new(0),
        })
    }

    fn url(&self, path: &str) -> String {
        format!("{}/{path}", self.config.base_url)
    }

    fn authorised(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.config.api_key {
            Some(key) => request.bearer_auth(key),
            None => request,
        }
    }

    /// The engine's model ids, or `None` when it has no `/models` route.
    async fn served_models(&self) -> Result<Option<Vec<String>>> {
        let response = self
            .authorised(self.client.get(self.url("models")))
            .send()
            .await
            .map_err(|e| unreachable_engine(&self.config.base_url, &e))?;
        if response.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let response = checked(response).await?;
        let list: ModelList = response.json().await.map_err(|e| {
            failure(
                Code::LoadFailed,
                format!("the engine's model list is not OpenAI-shaped: {e}"),
            )
        })?;
        Ok(Some(list.data.into_iter().map(|m| m.id).collect()))
    }

    async fn resolve_model(&self) -> Result<String> {
        let served = self.served_models().await?;
        match (&self.config.model, served) {
            (Some(model), Some(served)) if !served.contains(model) => Err(failure(
                Code::LoadFailed,
                format!(
                    "the engine at {} does not serve model {model:?} (it serves {served:?})",
                    self.config.base_url
                ),
            )),
            (Some(model), _) => Ok(model.clone()),
            (None, Some(served)) if served.len() == 1 => Ok(served[0].clone()),
            (None, served) => Err(failure(
                Code::LoadFailed,
                format!(
                    "the engine at {} serves {}: name one with --http-model",
                    self.config.base_url,
                    match served {
                        Some(list) => format!("{list:?}"),
                        None => "no model list".into(),
                    }
                ),
            )),
        }
    }

    /// One `/embeddings` call for at most `max_batch` texts, rows in input order.
    async fn embed_chunk(&self, model: &str, texts: &[String]) -> Result<Vec<Vec<f32>>> {
        let _permit = self.permits.acquire().await.expect("never closed");
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        let sent = self
            .authorised(self.client.post(self.url("embeddings")))
            .json(&EmbeddingsRequest {
                model,
                input: texts,
                encoding_format: "float",
            })
            .send()
            .await;
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        let response =
            checked(sent.map_err(|e| unreachable_engine(&self.config.base_url, &e))?).await?;
        let body: EmbeddingsResponse = response.json().await.map_err(|e| {
            failure(
                Code::InferFailed,
                format!("the engine's answer is not OpenAI-shaped: {e}"),
            )
        })?;
        rows_in_order(body.data, texts.len())
    }
}

/// Rows sorted by their `index`, checked: one per input, equal dims, finite values.
fn rows_in_order(mut data: Vec<EmbeddingRow>, expected: usize) -> Result<Vec<Vec<f32>>> {
    data.sort_by_key(|row| row.index);
    let indices_ok = data.iter().enumerate().all(|(i, row)| row.index == i);
    if data.len() != expected || !indices_ok {
        return Err(failure(
            Code::InferFailed,
            format!(
                "the engine answered {} embeddings for {expected} inputs",
                data.len()
            ),
        ));
    }
    let dims = data.first().map(|row| row.embedding.len()).unwrap_or(0);
    for row in &data {
        if row.embedding.len() != dims || row.embedding.iter().any(|v| !v.is_finite()) {
            return Err(failure(
                Code::InferFailed,
                "the engine answered embeddings of unequal sizes or non-finite values",
            ));
        }
    }
    Ok(data.into_iter().map(|row| row.embedding).collect())
}

fn unreachable_engine(base_url: &str, error: &reqwest::Error) -> Error {
    let what = if error.is_timeout() {
        "timed out"
    } else {
        "unreachable"
    };
    Error::RuntimeUnavailable(format!("engine at {base_url} {what}: {error}"))
}

/// The response when its status is a success, else the protocol error it maps to.
async fn checked(response: reqwest::Response) -> Result<reqwest::Response> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let body = response.text().await.unwrap_or_default();
    let detail: String = body.chars().take(300).collect();
    let message = format!("engine answered {status}: {detail}");
    Err(match status.as_u16() {
        408 | 429 | 502 | 503 | 504 => Error::RuntimeUnavailable(message),
        400 | 413 | 422 => failure(Code::BadRequest, message),
        _ => Error::Runtime(
            ErrorBody::new(Code::InferFailed, &message).retryable(status.is_server_error()),
        ),
    })
}

#[async_trait]
impl Backend for HttpRuntime {
    fn info(&self) -> RuntimeInfo {
        RuntimeInfo {
            runtime: "http".into(),
            version: format!("openai-compatible {}", self.config.base_url),
            capabilities: vec![CAP_EMBED.into()],
        }
    }

    /// The engine answers HTTP at all (any status).
    async fn health(&self) -> Result<()> {
        self.authorised(self.client.get(self.url("models")))
            .send()
            .await
            .map(|_| ())
            .map_err(|e| unreachable_engine(&self.config.base_url, &e))
    }

    async fn load(&self, request: LoadRequest) -> Result<u64> {
        if let Some(adapter) = &request.adapter_path {
            return Err(failure(
                Code::LoadFailed,
                format!(
                    "the http runtime serves the engine's model as it is and cannot apply the \
                     LoRA adapter {adapter}; place this candidate on a torch or candle worker"
                ),
            ));
        }
        {
            let models = self.models.lock().expect("models lock");
            if let Some(loaded) = models.get(&request.model_key) {
                return reload(&loaded.request, &request);
            }
        }
        let remote_model = self.resolve_model().await?;
        tracing::info!(model_key = %request.model_key, %remote_model, "http model ready");
        self.models.lock().expect("models lock").insert(
            request.model_key.clone(),
            Loaded {
                request,
                remote_model,
            },
        );
        Ok(0)
    }

    async fn unload(&self, model_key: &str) -> Result<u64> {
        match self.models.lock().expect("models lock").remove(model_key) {
            Some(_) => Ok(0),
            None => Err(not_loaded(model_key)),
        }
    }

    async fn infer(
        &self,
        batch_id: String,
        items: Vec<InferItem>,
        deadline_ms: Option<u64>,
    ) -> Result<Vec<Embeddings>> {
        check_deadline(&batch_id, deadline_ms)?;
        let mut plans = Vec::with_capacity(items.len());
        {
            let models = self.models.lock().expect("models lock");
            for item in &items {
                let loaded = models
                    .get(&item.model_key)
                    .ok_or_else(|| not_loaded(&item.model_key))?;
                let prefix = prefix(&loaded.request, item.kind);
                let texts: Vec<String> =
                    item.texts.iter().map(|t| format!("{prefix}{t}")).collect();
                plans.push((loaded.remote_model.clone(), texts));
            }
        }
        let chunks = plans.iter().flat_map(|(model, texts)| {
            texts
                .chunks(self.config.max_batch)
                .map(move |chunk| self.embed_chunk(model, chunk))
        });
        let mut rows = futures::future::try_join_all(chunks)
            .await?
            .into_iter()
            .flatten();
        let mut results = Vec::with_capacity(plans.len());
        for (_, texts) in &plans {
            let item_rows: Vec<Vec<f32>> = rows.by_ref().take(texts.len()).collect();
            let dims = item_rows.first().map(Vec::len).unwrap_or(0);
            if item_rows.iter().any(|row| row.len() != dims) {
                return Err(failure(
                    Code::InferFailed,
                    "the engine answered embeddings of unequal sizes",
                ));
            }
            results.push(embeddings(dims, &item_rows));
        }
        Ok(results)
    }

    async fn stats(&self) -> Result<RuntimeStats> {
        // The engine's memory is the engine's: nothing here counts against the worker's budget.
        let models = self.models.lock().expect("models lock");
        Ok(RuntimeStats {
            memory_bytes: 0,
            models: models
                .iter()
                .map(|(key, loaded)| ModelStats {
                    model_key: key.clone(),
                    memory_bytes: 0,
                    base_key: loaded.remote_model.clone(),
                })
                .collect(),
            queue_depth: self.in_flight.load(Ordering::Relaxed),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(index: usize, embedding: Vec<f32>) -> EmbeddingRow {
        EmbeddingRow { embedding, index }
    }

    #[test]
    fn rows_come_back_in_input_order() {
        let rows = rows_in_order(vec![row(1, vec![2.0]), row(0, vec![1.0])], 2).unwrap();
        assert_eq!(rows, vec![vec![1.0], vec![2.0]]);
    }

    #[test]
    fn a_short_or_ragged_answer_is_an_infer_failure() {
        for (data, expected) in [
            (vec![row(0, vec![1.0])], 2),
            (vec![row(0, vec![1.0]), row(0, vec![1.0])], 2),
            (vec![row(0, vec![1.0]), row(1, vec![1.0, 2.0])], 2),
            (vec![row(0, vec![f32::NAN])], 1),
        ] {
            match rows_in_order(data, expected) {
                Err(Error::Runtime(body)) => {
                    assert_eq!(body.code, "INFER_FAILED");
                    assert!(!body.retryable);
                }
                other => panic!("expected INFER_FAILED, got {:?}", other.map(|r| r.len())),
            }
        }
    }

    #[test]
    fn bad_settings_are_refused() {
        let config = HttpConfig {
            base_url: "127.0.0.1:7997".into(),
            model: None,
            api_key: None,
            max_concurrency: 4,
            max_batch: 32,
            connect_timeout: Duration::from_secs(1),
            request_timeout: Duration::from_secs(1),
        };
        assert!(matches!(
            HttpRuntime::new(config.clone()),
            Err(Error::Config(_))
        ));
        let zero = HttpConfig {
            base_url: "http://127.0.0.1:7997".into(),
            max_batch: 0,
            ..config
        };
        assert!(matches!(HttpRuntime::new(zero), Err(Error::Config(_))));
    }

    /// An embedding engine cannot score pairs or classify: the trait's default answers, before
    /// any request reaches the engine (nothing listens on the URL).
    #[tokio::test]
    async fn score_and_classify_are_unknown_ops() {
        let backend = HttpRuntime::new(HttpConfig {
            base_url: "http://127.0.0.1:9".into(),
            model: Some("m".into()),
            api_key: None,
            max_concurrency: 1,
            max_batch: 1,
            connect_timeout: Duration::from_secs(1),
            request_timeout: Duration::from_secs(1),
        })
        .unwrap();
        let score = backend
            .score(
                "b".into(),
                vec![crate::protocol::ScoreItem {
                    model_key: "m".into(),
                    query: "q".into(),
                    passages: vec!["p".into()],
                }],
                None,
            )
            .await;
        let classify = backend
            .classify(
                "b".into(),
                vec![crate::protocol::ClassifyItem {
                    model_key: "m".into(),
                    texts: vec!["t".into()],
                }],
                None,
            )
            .await;
        for (result, op) in [
            (score.map(|_| ()), "score"),
            (classify.map(|_| ()), "classify"),
        ] {
            match result {
                Err(Error::Runtime(body)) => {
                    assert_eq!(body.code, "UNKNOWN_OP");
                    assert!(!body.retryable);
                    assert!(body.message.contains(&format!("http runtime cannot {op}")));
                }
                other => panic!("expected UNKNOWN_OP for {op}, got {other:?}"),
            }
        }
    }
}
