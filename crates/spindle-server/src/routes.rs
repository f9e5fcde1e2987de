//! The endpoints.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, MethodRouter};
use axum::{Extension, Json, Router};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use spindle_engine::scheduler::TokenLogprobs;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::access::Access;
use crate::error::ApiError;
use crate::generation::{self, Choice, DraftCounts, Job};
use crate::openai::{
    ChatMessageIn, ChatRequest, CompletionRequest, DetokenizeRequest, Prompt, TokenizeRequest,
};
use crate::tools::{self, ParsedCall, ReplyWatch, ToolRequest};
use crate::AppState;

pub(crate) type Shared = Arc<AppState>;

/// One endpoint: its path, whether it needs the API key, its handlers.
struct Endpoint {
    path: &'static str,
    keyed: bool,
    route: fn() -> MethodRouter<Shared>,
}

/// Every endpoint. The router and the list in the 404 body are both built
/// from it, so they cannot disagree.
const ENDPOINTS: &[Endpoint] = &[
    Endpoint {
        path: "/v1/models",
        keyed: true,
        route: || get(models),
    },
    Endpoint {
        path: "/v1/completions",
        keyed: true,
        route: || post(completions),
    },
    Endpoint {
        path: "/v1/chat/completions",
        keyed: true,
        route: || post(chat_completions),
    },
    Endpoint {
        path: "/v1/decide",
        keyed: true,
        route: || post(crate::decide::decide),
    },
    Endpoint {
        path: "/v1/embeddings",
        keyed: true,
        route: || post(crate::embeddings::embeddings),
    },
    Endpoint {
        path: "/v1/rerank",
        keyed: true,
        route: || post(crate::embeddings::rerank),
    },
    Endpoint {
        path: "/tokenize",
        keyed: true,
        route: || post(tokenize),
    },
    Endpoint {
        path: "/detokenize",
        keyed: true,
        route: || post(detokenize),
    },
    Endpoint {
        path: "/props",
        keyed: true,
        route: || get(crate::props::props),
    },
    Endpoint {
        path: "/health",
        keyed: false,
        route: || get(|| async { Json(health_body()) }),
    },
    Endpoint {
        path: "/metrics",
        keyed: false,
        route: || get(metrics),
    },
];

/// The 404 message: every endpoint, from [`ENDPOINTS`].
fn not_found_message() -> String {
    let paths: Vec<&str> = ENDPOINTS.iter().map(|e| e.path).collect();
    format!("no such endpoint: see {}", paths.join(", "))
}

/// Every route; `/health` and `/metrics` need no key. Each request is
/// logged (outermost, so refusals by the layers below are logged too),
/// and with `--cors-origin` preflights are answered before the key check.
pub fn router(state: Shared) -> Router {
    let mut guarded = Router::new();
    let mut open = Router::new();
    for e in ENDPOINTS {
        if e.keyed {
            guarded = guarded.route(e.path, (e.route)());
        } else {
            open = open.route(e.path, (e.route)());
        }
    }
    let guarded = guarded.route_layer(middleware::from_fn_with_state(state.clone(), require_key));
    let not_found = not_found_message();
    let mut app = open
        .merge(guarded)
        .fallback(move || async move { ApiError::new(StatusCode::NOT_FOUND, not_found) })
        .layer(middleware::from_fn_with_state(state.clone(), read_request))
        .layer(middleware::map_response(openai_errors));
    if let Some(cors) = state.cors.layer() {
        app = app.layer(cors);
    }
    app.layer(middleware::from_fn(crate::access::log_access))
        .with_state(state)
}

/// What `/health` answers while the server runs.
pub(crate) fn health_body() -> Value {
    json!({"status": "ok"})
}

/// Header fields a request may carry, and their bytes all together; past
/// either it is refused with 431.
const MAX_HEADERS: usize = 100;
const MAX_HEADER_BYTES: usize = 32 * 1024;
/// A request body's most bytes (axum's default limit for `Json`).
const MAX_BODY_BYTES: usize = 2 * 1024 * 1024;

/// Checks a request's headers against the limits and reads its body, all of
/// it within `--body-timeout`, before any handler sees it: a client that
/// sends its body slowly, or never, gets 408 instead of holding a
/// connection and a task.
async fn read_request(State(state): State<Shared>, req: Request, next: Next) -> Response {
    let headers = req.headers();
    let header_bytes: usize = headers
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len() + 4)
        .sum();
    if headers.len() > MAX_HEADERS || header_bytes > MAX_HEADER_BYTES {
        return ApiError::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            format!(
                "the request's headers are too large ({} fields, {header_bytes} bytes): at most {MAX_HEADERS} fields and {} KiB",
                headers.len(),
                MAX_HEADER_BYTES / 1024
            ),
        )
        .into_response();
    }
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "the request body is over the {} MiB limit",
                MAX_BODY_BYTES >> 20
            ),
        )
        .into_response()
    };
    // A body declared too large is not kept, only read past (see
    // `read_body`).
    let declared_too_large = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        .is_some_and(|n| n > MAX_BODY_BYTES as u64);
    let keep = (!declared_too_large).then_some(MAX_BODY_BYTES);
    let (parts, body) = req.into_parts();
    let timeout = state.connections.body_timeout;
    let mut stopping = state.stopping.subscribe();
    let read = tokio::select! {
        read = tokio::time::timeout(timeout, read_body(body, keep)) => read,
        // A shutdown does not wait on a body that may never come.
        _ = crate::connections::stopped(&mut stopping) => {
            return ApiError {
                retry_after: Some(1),
                ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the server is shutting down")
            }
            .into_response();
        }
    };
    match read {
        Err(_) if declared_too_large => too_large(),
        Err(_) => ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the request body did not arrive within {} s (--body-timeout)",
                timeout.as_secs_f64()
            ),
        )
        .into_response(),
        Ok(BodyRead::TooLarge) => too_large(),
        Ok(BodyRead::Broken) => ApiError::bad_request(
            "the request body could not be read: the connection closed before it ended",
        )
        .into_response(),
        Ok(BodyRead::Whole(bytes)) => {
            next.run(Request::from_parts(parts, axum::body::Body::from(bytes)))
                .await
        }
    }
}

/// A body read past its limit is still read, up to this many bytes, and
/// dropped: a client still sending gets to read the 413 rather than a
/// reset connection.
const MAX_BODY_DRAINED: usize = 16 * 1024 * 1024;

enum BodyRead {
    Whole(Bytes),
    TooLarge,
    Broken,
}

/// Reads `body`, keeping at most `keep` bytes; a longer body (any body
/// when `keep` is `None`) is read on, to [`MAX_BODY_DRAINED`], and
/// reported too large.
async fn read_body(mut body: axum::body::Body, keep: Option<usize>) -> BodyRead {
    let limit = keep.unwrap_or(0);
    use http_body_util::BodyExt;
    let mut kept = Vec::new();
    let mut seen = 0usize;
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            return BodyRead::Broken;
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        seen += data.len();
        if keep.is_some() && seen <= limit {
            kept.extend_from_slice(&data);
        } else if seen > MAX_BODY_DRAINED {
            return BodyRead::TooLarge;
        } else {
            kept = Vec::new();
        }
    }
    if keep.is_none() || seen > limit {
        return BodyRead::TooLarge;
    }
    BodyRead::Whole(Bytes::from(kept))
}

/// Errors that axum itself answers (a wrong method, a body over the limit)
/// get OpenAI-style JSON bodies too, as every other error does.
async fn openai_errors(resp: Response) -> Response {
    let status = resp.status();
    let json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || json {
        return resp;
    }
    let message = match status {
        StatusCode::METHOD_NOT_ALLOWED => {
            "this endpoint does not take that method (the Allow header says which it takes)"
        }
        StatusCode::PAYLOAD_TOO_LARGE => "the request body is over the 2 MiB limit",
        s => s.canonical_reason().unwrap_or("the request failed"),
    };
    let mut out = ApiError::new(status, message).into_response();
    if let Some(allow) = resp.headers().get(header::ALLOW) {
        out.headers_mut().insert(header::ALLOW, allow.clone());
    }
    out
}

async fn require_key(State(state): State<Shared>, req: Request, next: Next) -> Response {
    if let Some(key) = &state.api_key {
        let given = bearer(req.headers());
        if !given.as_deref().is_some_and(|g| same_key(g, key)) {
            let msg = match given {
                None => "missing API key: send the header 'Authorization: Bearer <key>'",
                Some(_) => "incorrect API key",
            };
            return ApiError::new(StatusCode::UNAUTHORIZED, msg).into_response();
        }
    }
    next.run(req).await
}

/// The credentials of a `Bearer` authorization (the scheme is
/// case-insensitive, as HTTP schemes are).
pub(crate) fn bearer(headers: &HeaderMap) -> Option<String> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?.trim();
    let (scheme, key) = v.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| key.trim().to_string())
}

/// Compares keys in time that does not depend on where they differ, so a
/// client cannot find the key a byte at a time by timing refusals.
fn same_key(given: &str, key: &str) -> bool {
    let (a, b) = (given.as_bytes(), key.as_bytes());
    let mut diff = (a.len() != b.len()) as u8;
    for i in 0..a.len().max(b.len()) {
        diff |= a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0);
    }
    std::hint::black_box(diff) == 0
}

/// The tenant of a request: its API key, or everyone's.
pub(crate) fn tenant(headers: &HeaderMap) -> String {
    bearer(headers).unwrap_or_else(|| "default".into())
}

pub(crate) fn parse<T: DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")))
}

pub(crate) fn check_model(state: &AppState, model: &str) -> Result<(), ApiError> {
    if model == state.model_name {
        Ok(())
    } else {
        Err(ApiError {
            param: Some("model"),
            ..ApiError::new(
                StatusCode::NOT_FOUND,
                format!(
                    "the model '{model}' does not exist: this server serves '{}'",
                    state.model_name
                ),
            )
        })
    }
}

async fn models(State(state): State<Shared>) -> Json<Value> {
    let mut data = vec![json!({
        "id": state.model_name,
        "object": "model",
        "created": state.created,
        "owned_by": "spindle",
        "max_model_len": state.engine.ctx,
    })];
    if let Some(e) = &state.embedder {
        let e = e.embedder();
        data.push(json!({
            "id": e.name,
            "object": "model",
            "created": state.created,
            "owned_by": "spindle",
            "max_model_len": e.max_tokens(),
            "embedding_dimensions": e.dimensions(),
            "cross_encoder": e.is_cross_encoder(),
        }));
    }
    Json(json!({"object": "list", "data": data}))
}

async fn metrics(State(state): State<Shared>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.engine.metrics.render(&state.model_name)
            + &crate::memory::render(&state)
            + &state
                .embedder
                .as_ref()
                .map(crate::embeddings::render_metrics)
                .unwrap_or_default(),
    )
}

/// The tokenizer refused the text or ids of request field `param`.
fn untokenizable(
    param: &'static str,
) -> impl Fn(spindle_model::tokenizer::TokenizerError) -> ApiError {
    move |e| {
        ApiError::invalid(
            param,
            format!("the tokenizer cannot take this {param}: {e}"),
        )
    }
}

/// Refuses a text of `bytes` bytes for field `param` when even at the
/// vocabulary's longest token per token it would not fit the context:
/// before tokenizing it (a megabyte prompt costs time to tokenize).
fn refuse_unfitting(state: &AppState, param: &'static str, bytes: usize) -> Result<(), ApiError> {
    let ctx = state.engine.ctx;
    let at_least = bytes.div_ceil(state.longest_token);
    if at_least > ctx {
        return Err(ApiError::invalid(
            param,
            format!(
                "the {param} has at least {at_least} tokens ({bytes} bytes, at most {} bytes a token), more than the context of {ctx}: shorten it",
                state.longest_token
            ),
        ));
    }
    Ok(())
}

/// Prompt ids of a completions request.
fn completion_prompt(state: &AppState, prompt: &Prompt) -> Result<Vec<u32>, ApiError> {
    let tok = &state.tokenizer;
    let text = match prompt {
        Prompt::Text(t) => t.clone(),
        Prompt::Texts(v) if v.len() == 1 => v[0].clone(),
        Prompt::Texts(_) => {
            return Err(ApiError::invalid(
                "prompt",
                "give one prompt per request (a string, or a list of token ids)",
            ))
        }
        // The engine checks the ids when the job is submitted.
        Prompt::Ids(ids) => return Ok(ids.clone()),
    };
    refuse_unfitting(state, "prompt", text.len())?;
    tok.encode(&text, tok.add_bos_default(), true)
        .map_err(untokenizable("prompt"))
}

/// Prompt ids of a chat: the conversation (with its tool calls and
/// results) and the offered tools, through the chat template.
fn chat_prompt(
    state: &AppState,
    messages: &[ChatMessageIn],
    tools: Option<&ToolRequest>,
) -> Result<Vec<u32>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid("messages", "messages is empty"));
    }
    let (msgs, template_tools) = tools::conversation(messages, tools, &state.tool_format)?;
    let rendered = state
        .template
        .render_tools_for(&state.tokenizer, &msgs, template_tools.as_ref(), true)
        .map_err(|e| ApiError::invalid("messages", format!("the chat template failed: {e}")))?;
    refuse_unfitting(state, "messages", rendered.len())?;
    // What users and tools wrote stays text: special-token text in a
    // message never becomes a control token.
    let texts: Vec<&str> = msgs.iter().map(|m| m.content.as_str()).collect();
    state
        .tokenizer
        .encode_chat_prompt_guarded(&rendered, &texts)
        .map_err(untokenizable("messages"))
}

async fn completions(
    State(state): State<Shared>,
    Extension(access): Extension<Access>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req: CompletionRequest = parse(&body)?;
    check_model(&state, &req.model)?;
    let echo = match (req.echo.unwrap_or(false), req.logprobs) {
        (false, _) => None,
        (true, Some(_)) => {
            return Err(ApiError::invalid(
                "echo",
                "echo with logprobs is not supported (the prompt's log-probabilities are not computed): drop one of them",
            ))
        }
        (true, None) => Some(echo_text(&state, &req.prompt)?),
    };
    if req.suffix.is_some() {
        return Err(ApiError::invalid("suffix", "suffix is not supported"));
    }
    generation::refuse_tools(&req.sampling)?;
    let prompt = completion_prompt(&state, &req.prompt)?;
    let job = generation::build_job(
        &state,
        &req.sampling,
        prompt,
        16,
        req.logprobs,
        tenant(&headers),
        None,
    )?;
    respond(state, job, &req.sampling, Kind::Completion, echo, access).await
}

/// The prompt as `echo` repeats it before the completion: the text given,
/// or the text of the ids given.
fn echo_text(state: &AppState, prompt: &Prompt) -> Result<String, ApiError> {
    match prompt {
        Prompt::Text(t) => Ok(t.clone()),
        Prompt::Texts(ts) => Ok(ts.concat()),
        Prompt::Ids(ids) => state.tokenizer.decode(ids).map_err(untokenizable("prompt")),
    }
}

async fn chat_completions(
    State(state): State<Shared>,
    Extension(access): Extension<Access>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req: ChatRequest = parse(&body)?;
    check_model(&state, &req.model)?;
    let tools = ToolRequest::parse(&req.sampling)?;
    let prompt = chat_prompt(&state, &req.messages, tools.as_ref())?;
    let logprobs = match (req.logprobs.unwrap_or(false), req.top_logprobs) {
        (true, k) => Some(k.unwrap_or(0)),
        (false, Some(_)) => {
            return Err(ApiError::invalid(
                "top_logprobs",
                "top_logprobs needs logprobs: true",
            ))
        }
        (false, None) => None,
    };
    let tool_grammar = tools.as_ref().and_then(|t| t.grammar(&state.tool_format));
    // With a grammar the reply is calls, nothing else.
    let required = tool_grammar.is_some();
    let mut job = generation::build_job(
        &state,
        &req.sampling,
        prompt,
        usize::MAX,
        logprobs,
        tenant(&headers),
        tool_grammar,
    )?;
    job.watch = tools.as_ref().filter(|t| t.offered()).map(|t| {
        let names = t.callable().iter().map(|f| f.name.clone()).collect();
        ReplyWatch::new(state.tool_format.clone(), names, required)
    });
    respond(state, job, &req.sampling, Kind::Chat, None, access).await
}

#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Kind {
    Completion,
    Chat,
}

impl Kind {
    /// The `object` of a whole response, or of a streamed chunk.
    pub(crate) fn object(self, chunk: bool) -> &'static str {
        match (self, chunk) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Completion, _) => "text_completion",
        }
    }
}

async fn respond(
    state: Shared,
    mut job: Job,
    f: &crate::openai::SamplingFields,
    kind: Kind,
    echo: Option<String>,
    access: Access,
) -> Result<Response, ApiError> {
    let n = job.n;
    let prompt_tokens = job.prompt.len();
    access.set_prompt_tokens(prompt_tokens);
    access.start_generation();
    if let Some(u) = &f.user {
        access.set_user(u);
    }
    // The choices' tasks fill in the tokens as they generate them.
    job.access = Some(access);
    let want_logprobs = job.params.logprobs.is_some();
    let rx = generation::start(&state, job)?;
    let id = generation::new_id(match kind {
        Kind::Chat => "chatcmpl-",
        Kind::Completion => "cmpl-",
    });
    let created = generation::now_unix();
    if f.stream.unwrap_or(false) {
        let include_usage = f
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false);
        let stream = crate::stream::Streamer {
            state: state.clone(),
            kind,
            id,
            created,
            n,
            prompt_tokens,
            include_usage,
            want_logprobs,
            echo,
        };
        let (tx, out) = mpsc::channel::<Result<SseEvent, Infallible>>(64);
        tokio::spawn(stream.run(rx, tx));
        return Ok(Sse::new(ReceiverStream::new(out))
            .keep_alive(KeepAlive::default())
            .into_response());
    }
    let choices = generation::collect(rx, n).await?;
    let completion_tokens: usize = choices.iter().map(|c| c.completion_tokens).sum();
    let mut drafts = DraftCounts::default();
    for c in &choices {
        drafts += c.drafts;
    }
    let choices: Vec<Value> = choices
        .iter()
        .enumerate()
        .map(|(i, c)| choice_json(&state, kind, i, c, want_logprobs, echo.as_deref()))
        .collect();
    Ok(Json(json!({
        "id": id,
        "object": kind.object(false),
        "created": created,
        "model": state.model_name,
        "choices": choices,
        "usage": usage(prompt_tokens, completion_tokens, drafts),
    }))
    .into_response())
}

/// OpenAI's usage object, with Spindle's speculation counts beside it:
/// `drafted` tokens verified for the request and `accepted` of them kept
/// (0 and 0 with `--spec off`).
pub(crate) fn usage(prompt: usize, completion: usize, drafts: DraftCounts) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "drafted": drafts.drafted,
        "accepted": drafts.accepted,
    })
}

/// One choice of a whole response; a completion's text follows `echo`
/// (the prompt, when the request asked for it).
fn choice_json(
    state: &AppState,
    kind: Kind,
    index: usize,
    c: &Choice,
    logprobs: bool,
    echo: Option<&str>,
) -> Value {
    let lp = logprobs.then(|| logprobs_json(state, kind, &c.tokens, 0));
    match kind {
        Kind::Chat => {
            let mut message = json!({"role": "assistant", "content": c.text});
            if !c.tool_calls.is_empty() {
                if c.text.is_empty() {
                    message["content"] = Value::Null;
                }
                message["tool_calls"] = c
                    .tool_calls
                    .iter()
                    .map(|t| tool_call_json(t, None))
                    .collect();
            }
            json!({
                "index": index,
                "message": message,
                "logprobs": lp,
                "finish_reason": c.finish_reason,
            })
        }
        Kind::Completion => json!({
            "index": index,
            "text": format!("{}{}", echo.unwrap_or(""), c.text),
            "logprobs": lp,
            "finish_reason": c.finish_reason,
        }),
    }
}

/// One call as OpenAI writes it; a streamed delta carries its `index`.
pub(crate) fn tool_call_json(c: &ParsedCall, index: Option<usize>) -> Value {
    let mut call = json!({
        "id": c.id,
        "type": "function",
        "function": {"name": c.name, "arguments": c.arguments},
    });
    if let Some(i) = index {
        call["index"] = json!(i);
    }
    call
}

/// Log-probabilities of `tokens` in the shape of `kind`'s API; completions
/// count text offsets from `offset`.
pub(crate) fn logprobs_json(
    state: &AppState,
    kind: Kind,
    tokens: &[(u32, Option<TokenLogprobs>)],
    mut offset: usize,
) -> Value {
    let tok = &state.tokenizer;
    let piece = |id: u32| tok.token_to_piece(id).unwrap_or_default();
    let bytes = |id: u32| tok.token_bytes(id).map(|b| b.to_vec()).unwrap_or_default();
    let with_lp = tokens
        .iter()
        .filter_map(|(id, lp)| lp.as_ref().map(|lp| (*id, lp)));
    match kind {
        Kind::Chat => {
            let content: Vec<Value> = with_lp
                .map(|(id, lp)| {
                    let top: Vec<Value> = lp
                        .top
                        .iter()
                        .map(|&(t, l)| json!({"token": piece(t), "logprob": l, "bytes": bytes(t)}))
                        .collect();
                    json!({"token": piece(id), "logprob": lp.logprob, "bytes": bytes(id), "top_logprobs": top})
                })
                .collect();
            json!({ "content": content })
        }
        Kind::Completion => {
            let (mut toks, mut lps, mut tops, mut offs) = (vec![], vec![], vec![], vec![]);
            for (id, lp) in with_lp {
                let p = piece(id);
                offs.push(offset);
                offset += p.len();
                toks.push(p);
                lps.push(lp.logprob);
                let top: serde_json::Map<String, Value> =
                    lp.top.iter().map(|&(t, l)| (piece(t), json!(l))).collect();
                tops.push(Value::Object(top));
            }
            json!({"tokens": toks, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offs})
        }
    }
}

async fn tokenize(State(state): State<Shared>, body: Bytes) -> Result<Json<Value>, ApiError> {
    let req: TokenizeRequest = parse(&body)?;
    if let Some(m) = &req.model {
        check_model(&state, m)?;
    }
    let tokens = match (&req.prompt, &req.messages) {
        (Some(p), None) => {
            let bos = req.add_special_tokens.unwrap_or(true) && state.tokenizer.add_bos_default();
            state
                .tokenizer
                .encode(p, bos, req.parse_special.unwrap_or(true))
                .map_err(untokenizable("prompt"))?
        }
        (None, Some(m)) => chat_prompt(&state, m, None)?,
        _ => {
            return Err(ApiError::bad_request(
                "give exactly one of 'prompt' (text) or 'messages' (a chat)",
            ))
        }
    };
    Ok(Json(json!({
        "count": tokens.len(),
        "max_model_len": state.engine.ctx,
        "tokens": tokens,
    })))
}

async fn detokenize(State(state): State<Shared>, body: Bytes) -> Result<Json<Value>, ApiError> {
    let req: DetokenizeRequest = parse(&body)?;
    if let Some(m) = &req.model {
        check_model(&state, m)?;
    }
    let vocab = state.tokenizer.vocab_size();
    if let Some(bad) = req.tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::invalid(
            "tokens",
            format!("token id {bad} is outside the vocabulary of {vocab}"),
        ));
    }
    let text = state
        .tokenizer
        .decode(&req.tokens)
        .map_err(untokenizable("tokens"))?;
    Ok(Json(json!({ "prompt": text })))
}
