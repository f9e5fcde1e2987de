//! `POST /v1/completions` and `POST /v1/chat/completions`: a request
//! checked and turned into a job, then answered whole or as a stream.

use std::convert::Infallible;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::access::Access;
use crate::body::parse;
use crate::error::ApiError;
use crate::generation::{self, DraftCounts, GrammarFrame, Job};
use crate::keys::tenant;
use crate::models::check_model;
use crate::openai::{ChatRequest, CompletionRequest};
use crate::prompts::{chat_prompt, completion_prompt, echo_text, template_kwargs};
use crate::replies::{choice_json, usage, Kind};
use crate::tools::{ReplyWatch, ToolRequest};
use crate::Shared;

pub(crate) async fn completions(
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
        GrammarFrame::default(),
    )?;
    respond(state, job, &req.sampling, Kind::Completion, echo, access).await
}

pub(crate) async fn chat_completions(
    State(state): State<Shared>,
    Extension(access): Extension<Access>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req: ChatRequest = parse(&body)?;
    check_model(&state, &req.model)?;
    let tools = ToolRequest::parse(&req.sampling)?;
    let kwargs = template_kwargs(
        &state,
        req.chat_template_kwargs.as_ref(),
        req.reasoning_effort.as_deref(),
    )?;
    let prompt = chat_prompt(&state, &req.messages, tools.as_ref(), &kwargs)?;
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
    // With a grammar the reply is calls, nothing else (after any thinking).
    let required = tool_grammar.is_some();
    let reasoning = match req.sampling.reasoning_format.as_deref() {
        None | Some("auto" | "deepseek") => state.reasoning.as_ref(),
        Some("none") => None,
        Some(other) => {
            return Err(ApiError::invalid(
                "reasoning_format",
                format!("reasoning_format must be auto or none, got '{other}'"),
            ))
        }
    };
    // A call or a JSON reply of a reasoning model may think first: its
    // grammar is wrapped, and the reply read from its start as any other.
    let opened = reasoning.is_some_and(|r| r.opened_by(&state.tokenizer, &prompt));
    let frame = GrammarFrame {
        tools: tool_grammar,
        thinking: reasoning.map(|r| (r, opened)),
    };
    let mut job = generation::build_job(
        &state,
        &req.sampling,
        prompt,
        usize::MAX,
        logprobs,
        tenant(&headers),
        frame,
    )?;
    job.watch = tools.as_ref().filter(|t| t.offered()).map(|t| {
        let names = t.callable().iter().map(|f| f.name.clone()).collect();
        ReplyWatch::new(state.tool_format.clone(), names, required)
    });
    job.reasoning = reasoning.map(|r| {
        // A grammar decides where a reply starts, unless it is a wrapped
        // one, which starts where the prompt left off.
        let constrained = job.params.constraint.is_some() && !job.thinks_first;
        r.split(
            &state.tokenizer,
            &job.prompt,
            job.watch.is_some(),
            constrained,
        )
    });
    respond(state, job, &req.sampling, Kind::Chat, None, access).await
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
