//! The HTTP runtime: an existing engine (infinity, TEI, vLLM, SGLang `--is-embedding`) reached
//! over its OpenAI-compatible embeddings API, or an endpoint model (an external embeddings or
//! Cohere/Jina-style rerank API registered with `taskfleet model add --endpoint`), so a fleet can
//! use either as a worker while taskfleet keeps the queue, the registry and the evals.
//!
//! The engine owns the weights. A placement's folder that holds an endpoint record
//! ([`endpoint`](super::endpoint)) names its own URL, model ids per side (queries, documents),
//! `input_type`s and key variable; any other folder is served by the worker's engine
//! (`--http-base-url`): `load` then only checks that the engine serves a model (the one
//! `--http-model` names, else the only one it lists). LoRA adapters are refused: an engine
//! cannot apply them. `infer` adds the placement's query/passage prefix, cuts texts into requests
//! of at most `max_batch` inputs and runs at most `max_concurrency` of them at once. `score`
//! embeds the query and the documents and answers their cosines (a bi-encoder), or, for a rerank
//! endpoint, posts `{url}/rerank` and answers its `relevance_score`s in document order. Engine
//! answers map to the protocol's codes: unreachable, timed out, 429 and 502-504 are retryable
//! (`RUNTIME_UNAVAILABLE`, answered to the caller at once: another worker would meet the same
//! engine); 400/413/422 are the input's fault (`BAD_REQUEST`); any other failure or a malformed
//! answer is `INFER_FAILED`.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;

use super::endpoint::{EndpointKind, EndpointRecord};
use super::{
    check_deadline, embeddings, failure, not_loaded, prefix, reload, Backend, RuntimeInfo,
    RuntimeStats, Terms, CAP_EMBED, CAP_SCORE,
};
use crate::error::{Error, Result};
use crate::protocol::{
    Code, Embeddings, ErrorBody, InferItem, LoadRequest, ModelStats, ScoreItem, Scores, TextKind,
};

#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// Base URL of the worker's engine, as OpenAI clients take it: requests go to
    /// `{base_url}/embeddings` and `{base_url}/models` (e.g. `http://127.0.0.1:7997` for
    /// infinity, `http://host:8000/v1` for vLLM). `None`: this worker serves endpoint models
    /// only, each at the URL of its record.
    pub base_url: Option<String>,
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

/// Where one model key's requests go.
#[derive(Clone)]
struct Target {
    base_url: String,
    api_key: Option<String>,
    kind: EndpointKind,
    /// (model id, input_type) for queries and for passages.
    query: (String, Option<String>),
    passage: (String, Option<String>),
}

impl Target {
    fn side(&self, kind: TextKind) -> &(String, Option<String>) {
        match kind {
            TextKind::Query => &self.query,
            TextKind::Passage => &self.passage,
        }
    }
}

struct Loaded {
    request: LoadRequest,
    target: Arc<Target>,
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
    #[serde(skip_serializing_if = "Option::is_none")]
    input_type: Option<&'a str>,
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

#[derive(Serialize)]
struct RerankRequest<'a> {
    model: &'a str,
    query: &'a str,
    documents: &'a [String],
    top_n: usize,
    return_documents: bool,
}

#[derive(Deserialize)]
struct RerankResponse {
    results: Vec<RerankRow>,
}

#[derive(Deserialize)]
struct RerankRow {
    index: usize,
    relevance_score: f32,
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
        if let Some(url) = &config.base_url {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(Error::Config(format!(
                    "--http-base-url {url:?} must start with http:// or https://"
                )));
            }
        }
        let client = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .timeout(config.request_timeout)
            .build()
            .map_err(|e| Error::Config(format!("cannot build the HTTP client: {e}")))?;
        Ok(Self {
            permits: Semaphore::new(config.max_concurrency),
            config: HttpConfig {
                base_url: config
                    .base_url
                    .map(|url| url.trim_end_matches('/').to_string()),
                ..config
            },
            client,
            models: Mutex::new(HashMap::new()),
            in_flight: AtomicU32::new(0),
        })
    }

    fn authorised(
        request: reqwest::RequestBuilder,
        api_key: &Option<String>,
    ) -> reqwest::RequestBuilder {
        match api_key {
            Some(key) => request.bearer_auth(key),
            None => request,
        }
    }

    /// The engine's model ids, or `None` when it has no `/models` route.
    async fn served_models(&self, base_url: &str) -> Result<Option<Vec<String>>> {
        let request = self.client.get(format!("{base_url}/models"));
        let response = Self::authorised(request, &self.config.api_key)
            .send()
            .await
            .map_err(|e| unreachable_engine(base_url, &e))?;
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

    async fn resolve_model(&self, base_url: &str, wanted: Option<&String>) -> Result<String> {
        let served = self.served_models(base_url).await?;
        match (wanted, served) {
            (Some(model), Some(served)) if !served.contains(model) => Err(failure(
                Code::LoadFailed,
                format!(
                    "the engine at {base_url} does not serve model {model:?} (it serves \
                     {served:?})"
                ),
            )),
            (Some(model), _) => Ok(model.clone()),
            (None, Some(served)) if served.len() == 1 => Ok(served[0].clone()),
            (None, served) => Err(failure(
                Code::LoadFailed,
                format!(
                    "the engine at {base_url} serves {}: name one with --http-model \
                     (--endpoint-model for an endpoint model)",
                    match served {
                        Some(list) => format!("{list:?}"),
                        None => "no model list".into(),
                    }
                ),
            )),
        }
    }

    /// The target of a load: its folder's endpoint record, else the worker's engine.
    async fn target(&self, request: &LoadRequest) -> Result<Target> {
        if let Some(record) = EndpointRecord::read(Path::new(&request.base_path))? {
            let url = record.url.trim_end_matches('/').to_string();
            let default = match (&record.model, &record.query.model, &record.document.model) {
                (Some(model), _, _) => Some(model.clone()),
                // Both sides name their model: nothing to ask the API.
                (None, Some(_), Some(_)) => None,
                (None, _, _) if record.kind == EndpointKind::Rerank => None,
                (None, _, _) => Some(self.resolve_model(&url, None).await?),
            };
            let side = |side: &super::endpoint::Side| {
                (
                    side.model
                        .clone()
                        .or_else(|| default.clone())
                        .unwrap_or_default(),
                    side.input_type.clone(),
                )
            };
            return Ok(Target {
                api_key: record.api_key()?,
                kind: record.kind,
                query: side(&record.query),
                passage: side(&record.document),
                base_url: url,
            });
        }
        let Some(base_url) = self.config.base_url.clone() else {
            return Err(failure(
                Code::LoadFailed,
                format!(
                    "{} is not an endpoint model and this http worker has no --http-base-url \
                     to serve it with",
                    request.model_key
                ),
            ));
        };
        let model = self
            .resolve_model(&base_url, self.config.model.as_ref())
            .await?;
        Ok(Target {
            api_key: self.config.api_key.clone(),
            kind: EndpointKind::Embedding,
            query: (model.clone(), None),
            passage: (model, None),
            base_url,
        })
    }

    fn loaded(&self, model_key: &str) -> Result<(LoadRequest, Arc<Target>)> {
        let models = self.models.lock().expect("models lock");
        let loaded = models.get(model_key).ok_or_else(|| not_loaded(model_key))?;
        Ok((loaded.request.clone(), loaded.target.clone()))
    }

    /// One `/embeddings` call for at most `max_batch` texts of one side, rows in input order.
    async fn embed_chunk(
        &self,
        target: &Target,
        kind: TextKind,
        texts: &[String],
    ) -> Result<Vec<Vec<f32>>> {
        let (model, input_type) = target.side(kind);
        let body = EmbeddingsRequest {
            model,
            input: texts,
            encoding_format: "float",
            input_type: input_type.as_deref(),
        };
        let url = format!("{}/embeddings", target.base_url);
        let response = self
            .post(&target.base_url, &target.api_key, url, &body)
            .await?;
        let body: EmbeddingsResponse = response.json().await.map_err(|e| {
            failure(
                Code::InferFailed,
                format!("the engine's answer is not OpenAI-shaped: {e}"),
            )
        })?;
        rows_in_order(body.data, texts.len())
    }

    /// One `/rerank` call: a score per document, in document order.
    async fn rerank_chunk(
        &self,
        target: &Target,
        query: &str,
        documents: &[String],
    ) -> Result<Vec<f32>> {
        let body = RerankRequest {
            model: &target.query.0,
            query,
            documents,
            top_n: documents.len(),
            return_documents: false,
        };
        let url = format!("{}/rerank", target.base_url);
        let response = self
            .post(&target.base_url, &target.api_key, url, &body)
            .await?;
        let body: RerankResponse = response.json().await.map_err(|e| {
            failure(
                Code::InferFailed,
                format!("the engine's answer is not Cohere/Jina-shaped: {e}"),
            )
        })?;
        scores_in_order(body.results, documents.len())
    }

    async fn post<T: Serialize>(
        &self,
        base_url: &str,
        api_key: &Option<String>,
        url: String,
        body: &T,
    ) -> Result<reqwest::Response> {
        let _permit = self.permits.acquire().await.expect("never closed");
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        let sent = Self::authorised(self.client.post(url), api_key)
            .json(body)
            .send()
            .await;
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        checked(sent.map_err(|e| unreachable_engine(base_url, &e))?).await
    }

    /// Vectors of `texts` of one side, cut into requests of `max_batch`, in input order.
    async fn embed_all(
        &self,
        target: &Target,
        kind: TextKind,
        texts: &[String],
    ) -> Result<Vec<Vec<f32>>> {
        let chunks = texts
            .chunks(self.config.max_batch)
            .map(|chunk| self.embed_chunk(target, kind, chunk));
        Ok(futures::future::try_join_all(chunks)
            .await?
            .into_iter()
            .flatten()
            .collect())
    }

    async fn score_item(&self, item: &ScoreItem) -> Result<Vec<f32>> {
        let (request, target) = self.loaded(&item.model_key)?;
        if item.passages.is_empty() {
            return Ok(Vec::new());
        }
        let passages: Vec<String> = item
            .passages
            .iter()
            .map(|p| format!("{}{p}", request.passage_prefix))
            .collect();
        let query = format!("{}{}", request.query_prefix, item.query);
        if target.kind == EndpointKind::Rerank {
            let chunks = passages
                .chunks(self.config.max_batch)
                .map(|chunk| self.rerank_chunk(&target, &query, chunk));
            return Ok(futures::future::try_join_all(chunks)
                .await?
                .into_iter()
                .flatten()
                .collect());
        }
        let (queries, documents) = futures::future::try_join(
            self.embed_chunk(&target, TextKind::Query, std::slice::from_ref(&query)),
            self.embed_all(&target, TextKind::Passage, &passages),
        )
        .await?;
        Ok(cosines(&queries[0], &documents))
    }
}

/// Cosine of `query` with each row (0 for a zero vector), computed in f64.
fn cosines(query: &[f32], rows: &[Vec<f32>]) -> Vec<f32> {
    let norm = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    let q = norm(query);
    rows.iter()
        .map(|row| {
            let dot: f64 = row
                .iter()
                .zip(query)
                .map(|(a, b)| f64::from(*a) * f64::from(*b))
                .sum();
            let n = q * norm(row);
            if n > 0.0 {
                (dot / n) as f32
            } else {
                0.0
            }
        })
        .collect()
}

/// Rerank scores in document order, checked: one per document, finite.
fn scores_in_order(mut rows: Vec<RerankRow>, expected: usize) -> Result<Vec<f32>> {
    rows.sort_by_key(|row| row.index);
    let ok = rows.len() == expected
        && rows.iter().enumerate().all(|(i, row)| row.index == i)
        && rows.iter().all(|row| row.relevance_score.is_finite());
    if !ok {
        return Err(failure(
            Code::InferFailed,
            format!(
                "the rerank API answered {} scores for {expected} documents (or a non-finite one)",
                rows.len()
            ),
        ));
    }
    Ok(rows.into_iter().map(|row| row.relevance_score).collect())
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
    Error::EngineUnavailable(format!("engine at {base_url} {what}: {error}"))
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
        408 | 429 | 502 | 503 | 504 => Error::EngineUnavailable(message),
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
            version: match &self.config.base_url {
                Some(url) => format!("openai-compatible {url}"),
                None => "endpoint models".into(),
            },
            capabilities: vec![CAP_EMBED.into(), CAP_SCORE.into()],
        }
    }

    /// The engine answers HTTP at all (any status); a worker of endpoint models only is
    /// healthy by itself (each endpoint answers for itself, per request).
    async fn health(&self) -> Result<()> {
        let Some(base_url) = &self.config.base_url else {
            return Ok(());
        };
        let request = self.client.get(format!("{base_url}/models"));
        Self::authorised(request, &self.config.api_key)
            .send()
            .await
            .map(|_| ())
            .map_err(|e| unreachable_engine(base_url, &e))
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
        let target = self.target(&request).await?;
        tracing::info!(
            model_key = %request.model_key,
            url = %target.base_url,
            query_model = %target.query.0,
            passage_model = %target.passage.0,
            "http model ready"
        );
        self.models.lock().expect("models lock").insert(
            request.model_key.clone(),
            Loaded {
                request,
                target: Arc::new(target),
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
        terms: Terms,
    ) -> Result<Vec<Embeddings>> {
        check_deadline(&batch_id, terms.deadline_ms)?;
        let mut plans = Vec::with_capacity(items.len());
        for item in &items {
            let (request, target) = self.loaded(&item.model_key)?;
            if target.kind == EndpointKind::Rerank {
                return Err(failure(
                    Code::BadRequest,
                    format!(
                        "model {:?} is a rerank API: it scores documents only (no embed)",
                        item.model_key
                    ),
                ));
            }
            let prefix = prefix(&request, item.kind);
            let texts: Vec<String> = item.texts.iter().map(|t| format!("{prefix}{t}")).collect();
            plans.push((target, item.kind, texts));
        }
        let chunks = plans.iter().flat_map(|(target, kind, texts)| {
            texts
                .chunks(self.config.max_batch)
                .map(move |chunk| self.embed_chunk(target, *kind, chunk))
        });
        let mut rows = futures::future::try_join_all(chunks)
            .await?
            .into_iter()
            .flatten();
        let mut results = Vec::with_capacity(plans.len());
        for (_, _, texts) in &plans {
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

    async fn score(
        &self,
        batch_id: String,
        items: Vec<ScoreItem>,
        terms: Terms,
    ) -> Result<Vec<Scores>> {
        check_deadline(&batch_id, terms.deadline_ms)?;
        let scored =
            futures::future::try_join_all(items.iter().map(|i| self.score_item(i))).await?;
        Ok(scored
            .into_iter()
            .map(|row| Scores {
                count: row.len() as u32,
                scores: serde_bytes::ByteBuf::from(
                    row.iter()
                        .flat_map(|v| v.to_le_bytes())
                        .collect::<Vec<u8>>(),
                ),
            })
            .collect())
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
                    base_key: format!("{} {}", loaded.target.base_url, loaded.target.query.0),
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
            base_url: Some("127.0.0.1:7997".into()),
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
            base_url: Some("http://127.0.0.1:7997".into()),
            max_batch: 0,
            ..config
        };
        assert!(matches!(HttpRuntime::new(zero), Err(Error::Config(_))));
    }

    fn runtime() -> HttpRuntime {
        HttpRuntime::new(HttpConfig {
            base_url: Some("http://127.0.0.1:9".into()),
            model: Some("m".into()),
            api_key: None,
            max_concurrency: 1,
            max_batch: 1,
            connect_timeout: Duration::from_secs(1),
            request_timeout: Duration::from_secs(1),
        })
        .unwrap()
    }

    /// An embedding engine cannot classify: the trait's default answers, before any request
    /// reaches the engine (nothing listens on the URL).
    #[tokio::test]
    async fn classify_is_an_unknown_op_and_score_needs_a_loaded_model() {
        let backend = runtime();
        assert!(backend.info().can(CAP_SCORE));
        let classify = backend
            .classify(
                "b".into(),
                vec![crate::protocol::ClassifyItem {
                    model_key: "m".into(),
                    texts: vec!["t".into()],
                }],
                Terms::default(),
            )
            .await;
        match classify {
            Err(Error::Runtime(body)) => {
                assert_eq!(body.code, "UNKNOWN_OP");
                assert!(!body.retryable);
                assert!(body.message.contains("http runtime cannot classify"));
            }
            other => panic!(
                "expected UNKNOWN_OP for classify, got {:?}",
                other.map(|_| ())
            ),
        }
        let score = backend
            .score(
                "b".into(),
                vec![ScoreItem {
                    model_key: "m".into(),
                    query: "q".into(),
                    passages: vec!["p".into()],
                }],
                Terms::default(),
            )
            .await;
        match score {
            Err(Error::Runtime(body)) => assert_eq!(body.code, "MODEL_NOT_LOADED"),
            other => panic!("expected MODEL_NOT_LOADED, got {:?}", other.map(|_| ())),
        }
    }

    #[test]
    fn cosines_are_normalised_and_a_zero_vector_scores_zero() {
        let got = cosines(
            &[3.0, 4.0],
            &[vec![3.0, 4.0], vec![-4.0, 3.0], vec![0.0, 0.0]],
        );
        assert!((got[0] - 1.0).abs() < 1e-7 && got[1].abs() < 1e-7 && got[2] == 0.0);
    }

    #[test]
    fn rerank_scores_come_back_in_document_order_or_not_at_all() {
        let row = |index, relevance_score| RerankRow {
            index,
            relevance_score,
        };
        assert_eq!(
            scores_in_order(vec![row(1, 0.2), row(0, 0.9)], 2).unwrap(),
            vec![0.9, 0.2]
        );
        assert!(scores_in_order(vec![row(0, 0.9)], 2).is_err());
        assert!(scores_in_order(vec![row(0, f32::NAN)], 1).is_err());
    }

    /// A folder without an endpoint record on a worker without an engine URL is refused in
    /// one line naming the key.
    #[tokio::test]
    async fn a_local_model_needs_the_workers_engine() {
        let backend = HttpRuntime::new(HttpConfig {
            base_url: None,
            ..runtime().config.clone()
        })
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let loaded = backend
            .load(LoadRequest {
                id: 1,
                model_key: "minilm".into(),
                base_path: dir.path().to_string_lossy().into_owned(),
                adapter_path: None,
                query_prefix: String::new(),
                passage_prefix: String::new(),
                max_seq_length: None,
                settings: None,
            })
            .await;
        match loaded {
            Err(Error::Runtime(body)) => {
                assert_eq!(body.code, "LOAD_FAILED");
                assert!(body.message.contains("minilm is not an endpoint model"));
            }
            other => panic!("expected LOAD_FAILED, got {other:?}"),
        }
    }
}
