//! `POST /v1/embeddings` (OpenAI's shape) and `POST /v1/rerank` (the shape
//! llama.cpp and Jina use), answered by the encoder `serve` hosts beside
//! its chat model (`--embedding-model`).

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::{Extension, Json};
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Value};
use spindle_engine::embed::{EmbedHandle, EmbedInput, EmbedOptions, JobKind};
use spindle_model::encoder::{normalize, EncodedText};

use crate::access::Access;
use crate::body::parse;
use crate::error::ApiError;
use crate::AppState;
use crate::Shared;

/// OpenAI's `input`: a string, strings, token ids, or lists of ids.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Input {
    One(String),
    Many(Vec<String>),
    Ids(Vec<u32>),
    ManyIds(Vec<Vec<u32>>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EmbeddingsBody {
    model: String,
    input: Input,
    #[serde(default)]
    encoding_format: Option<String>,
    #[serde(default)]
    dimensions: Option<usize>,
    #[serde(default)]
    user: Option<String>,
    /// Cut inputs over the model's limit instead of refusing them (an
    /// extension, as in llama.cpp and vLLM).
    #[serde(default)]
    truncate: bool,
}

/// A document: its text, or an object holding it (Jina's form).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Document {
    Text(String),
    Object { text: String },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RerankBody {
    model: String,
    query: String,
    documents: Vec<Document>,
    #[serde(default)]
    top_n: Option<usize>,
    #[serde(default)]
    return_documents: bool,
    #[serde(default)]
    truncate: bool,
    #[serde(default)]
    user: Option<String>,
}

/// The server's encoder, when `model` names it; a 400 naming the problem
/// when `model` is the chat model or the server has none, a 404 otherwise.
fn embedder_for<'a>(state: &'a AppState, model: &str) -> Result<&'a EmbedHandle, ApiError> {
    match &state.embedder {
        Some(e) if e.embedder().name == model => Ok(e),
        _ if model == state.model_name => Err(ApiError::invalid(
            "model",
            match &state.embedder {
                Some(e) => format!(
                    "'{model}' generates text and gives no embeddings: ask '{}', this server's embedding model",
                    e.embedder().name
                ),
                None => format!(
                    "'{model}' generates text and gives no embeddings, and this server hosts no embedding model: start it with --embedding-model"
                ),
            },
        )),
        Some(e) => Err(ApiError {
            param: Some("model"),
            ..ApiError::new(
                StatusCode::NOT_FOUND,
                format!(
                    "the model '{model}' does not exist: this server embeds with '{}'",
                    e.embedder().name
                ),
            )
        }),
        None => Err(ApiError {
            param: Some("model"),
            ..ApiError::new(
                StatusCode::NOT_FOUND,
                format!("the model '{model}' does not exist, and this server hosts no embedding model"),
            )
        }),
    }
}

/// Tokenizes off the async threads, queues, and waits for the results.
async fn run_job(
    state: &AppState,
    handle: &EmbedHandle,
    kind: JobKind,
    texts: Vec<EncodedText>,
) -> Result<Vec<Vec<f32>>, ApiError> {
    let rx = handle.submit(kind, texts).map_err(|e| match e.kind {
        spindle_engine::ErrorKind::Capacity => ApiError {
            retry_after: Some(1),
            ..ApiError::new(StatusCode::TOO_MANY_REQUESTS, e.message)
        },
        _ => ApiError::from(e),
    })?;
    match tokio::time::timeout(state.request_timeout, rx).await {
        Err(_) => Err(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "the embeddings took longer than the server's --request-timeout",
        )),
        Ok(Err(_)) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the embedder stopped",
        )),
        Ok(Ok(result)) => result.map_err(ApiError::from),
    }
}

async fn prepare_blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, spindle_engine::RequestError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|_| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "tokenizing failed"))?
        .map_err(ApiError::from)
}

pub async fn embeddings(
    State(state): State<Shared>,
    Extension(access): Extension<Access>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let body: EmbeddingsBody = parse(&body)?;
    let handle = embedder_for(&state, &body.model)?.clone();
    if let Some(u) = &body.user {
        access.set_user(u);
    }
    let base64 = match body.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::invalid(
                "encoding_format",
                format!("encoding_format '{other}': give float or base64"),
            ))
        }
    };
    let dim = handle.embedder().dimensions();
    let keep = match body.dimensions {
        None => dim,
        Some(d) if (1..=dim).contains(&d) => d,
        Some(d) => {
            return Err(ApiError::invalid(
                "dimensions",
                format!("dimensions {d}: this model's vectors have {dim}; give 1 to {dim}"),
            ))
        }
    };
    let inputs: Vec<EmbedInput> = match body.input {
        Input::One(s) => vec![EmbedInput::Text(s)],
        Input::Many(v) => v.into_iter().map(EmbedInput::Text).collect(),
        Input::Ids(ids) => vec![EmbedInput::Ids(ids)],
        Input::ManyIds(v) => v.into_iter().map(EmbedInput::Ids).collect(),
    };
    let options = EmbedOptions {
        truncate: body.truncate,
    };
    let embedder = handle.embedder().clone();
    let texts = prepare_blocking(move || embedder.prepare(&inputs, options, "input")).await?;
    let tokens: usize = texts.iter().map(|t| t.ids.len()).sum();
    access.set_prompt_tokens(tokens);
    let vectors = run_job(&state, &handle, JobKind::Embed, texts).await?;
    let normalized = handle.embedder().encoder.config.normalize;
    let data: Vec<Value> = vectors
        .into_iter()
        .enumerate()
        .map(|(index, mut v)| {
            if keep < v.len() {
                // Shortened as OpenAI shortens: cut, then back to unit length.
                v.truncate(keep);
                if normalized {
                    normalize(&mut v);
                }
            }
            let embedding = if base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                json!(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": index, "embedding": embedding})
        })
        .collect();
    Ok(Json(json!({
        "object": "list",
        "data": data,
        "model": handle.embedder().name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    })))
}

pub async fn rerank(
    State(state): State<Shared>,
    Extension(access): Extension<Access>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let body: RerankBody = parse(&body)?;
    let handle = embedder_for(&state, &body.model)?.clone();
    if let Some(u) = &body.user {
        access.set_user(u);
    }
    if body.documents.is_empty() {
        return Err(ApiError::invalid(
            "documents",
            "'documents' is empty: give at least one",
        ));
    }
    if body.query.is_empty() {
        return Err(ApiError::invalid("query", "'query' is an empty string"));
    }
    let documents: Vec<String> = body
        .documents
        .into_iter()
        .map(|d| match d {
            Document::Text(t) | Document::Object { text: t } => t,
        })
        .collect();
    let options = EmbedOptions {
        truncate: body.truncate,
    };
    let embedder = handle.embedder().clone();
    let (scores, tokens) = if embedder.is_cross_encoder() {
        // The model reads each query and document pair and scores it.
        let (query, docs) = (body.query.clone(), documents.clone());
        let pairs =
            prepare_blocking(move || embedder.prepare_pairs(&query, &docs, options)).await?;
        let tokens: usize = pairs.iter().map(|t| t.ids.len()).sum();
        let scores = run_job(&state, &handle, JobKind::ScorePairs, pairs).await?;
        (
            scores.into_iter().map(|s| s[0]).collect::<Vec<f32>>(),
            tokens,
        )
    } else {
        // A bi-encoder: the cosine of the query's vector with each document's.
        let mut inputs = vec![EmbedInput::Text(body.query.clone())];
        inputs.extend(documents.iter().cloned().map(EmbedInput::Text));
        let texts =
            prepare_blocking(move || embedder.prepare(&inputs, options, "documents")).await?;
        let tokens: usize = texts.iter().map(|t| t.ids.len()).sum();
        let mut vectors = run_job(&state, &handle, JobKind::Embed, texts).await?;
        for v in &mut vectors {
            normalize(v);
        }
        let query = vectors.remove(0);
        let scores = vectors
            .iter()
            .map(|d| d.iter().zip(&query).map(|(a, b)| a * b).sum::<f32>())
            .collect();
        (scores, tokens)
    };
    access.set_prompt_tokens(tokens);
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    order.truncate(body.top_n.unwrap_or(order.len()));
    let results: Vec<Value> = order
        .into_iter()
        .map(|i| {
            let mut r = json!({"index": i, "relevance_score": scores[i]});
            if body.return_documents {
                r["document"] = json!({"text": documents[i]});
            }
            r
        })
        .collect();
    Ok(Json(json!({
        "object": "list",
        "model": handle.embedder().name,
        "results": results,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    })))
}

/// The embedder's lines of `/metrics` (Prometheus text).
pub fn render_metrics(handle: &EmbedHandle) -> String {
    use std::sync::atomic::Ordering::Relaxed;
    let m = &handle.metrics;
    let model = &handle.embedder().name;
    let mut out = String::new();
    for (name, kind, help, value) in [
        (
            "spindle:embedding_requests_waiting",
            "gauge",
            "Embedding requests queued for a pass.",
            m.waiting.load(Relaxed) as f64,
        ),
        (
            "spindle:embedding_requests_running",
            "gauge",
            "Embedding requests in the pass now running.",
            m.running.load(Relaxed) as f64,
        ),
        (
            "spindle:embedding_requests_total",
            "counter",
            "Embedding and rerank requests answered.",
            m.requests.load(Relaxed) as f64,
        ),
        (
            "spindle:embedding_inputs_total",
            "counter",
            "Texts (or text pairs) embedded or scored.",
            m.texts.load(Relaxed) as f64,
        ),
        (
            "spindle:embedding_tokens_total",
            "counter",
            "Tokens run through the embedding model.",
            m.tokens.load(Relaxed) as f64,
        ),
        (
            "spindle:embedding_passes_total",
            "counter",
            "Passes of the embedding model.",
            m.passes.load(Relaxed) as f64,
        ),
        (
            "spindle:embedding_busy_seconds_total",
            "counter",
            "Seconds the embedding model spent in passes.",
            m.busy_us.load(Relaxed) as f64 / 1e6,
        ),
    ] {
        out += &format!("# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{{model_name=\"{model}\"}} {value}\n");
    }
    out
}
