//! From a validated request to choices: `n` engine requests, each driven by
//! its own task that turns tokens into text (cut at stop strings) and sends
//! [`Piece`]s on one channel. Streaming writes the pieces out as they come;
//! otherwise they are gathered into whole choices. Dropping the channel's
//! receiver (the client went away) ends the tasks, which drops the engine
//! receivers, which cancels the sequences.

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use spindle_engine::scheduler::{Event, Request, RequestParams, SubmitError, TokenLogprobs};
use spindle_engine::{FinishReason, SamplerConfig};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::access::Access;
use crate::error::ApiError;
use crate::openai::{ResponseFormat, SamplingFields};
use crate::reasoning::{ReasoningFormat, ReasoningSplit};
use crate::text::TextStream;
use crate::tools::{ParsedCall, ReplyWatch};
use crate::AppState;
use spindle_engine::constraint::{Constraint, Grammar};

/// Most choices per request.
const MAX_N: u32 = 16;
/// Most alternatives per token in log-probabilities.
const MAX_TOP_LOGPROBS: u32 = 20;

/// What to run: one prompt, `n` times.
pub struct Job {
    pub prompt: Vec<u32>,
    pub params: RequestParams,
    pub stops: Vec<String>,
    pub n: usize,
    pub tenant: String,
    /// Reads tool calls out of each choice (chat requests that offer tools).
    pub watch: Option<ReplyWatch>,
    /// Reads a reasoning model's thinking out of each choice (chat).
    pub reasoning: Option<ReasoningSplit>,
    /// The grammar lets the reply think before what it holds it to (so the
    /// reply starts where the prompt left off, as an unconstrained one).
    pub thinks_first: bool,
    /// The request's access-log entry, which each choice adds its tokens to.
    pub access: Option<Access>,
}

/// Drafted tokens a request's passes verified, how many were kept, and
/// the passes that chose its tokens (`usage.drafted`, `usage.accepted`,
/// `usage.passes`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DraftCounts {
    pub drafted: usize,
    pub accepted: usize,
    pub passes: usize,
}

impl DraftCounts {
    /// One pass's counts.
    fn pass(drafted: usize, accepted: usize) -> DraftCounts {
        DraftCounts {
            drafted,
            accepted,
            passes: 1,
        }
    }
}

impl std::ops::AddAssign for DraftCounts {
    fn add_assign(&mut self, o: DraftCounts) {
        self.drafted += o.drafted;
        self.accepted += o.accepted;
        self.passes += o.passes;
    }
}

/// Part of a choice, in order: deltas, then one `Done` or `Failed`.
#[derive(Debug)]
pub enum Piece {
    Delta {
        index: usize,
        text: String,
        tokens: Vec<(u32, Option<TokenLogprobs>)>,
    },
    /// Thinking, apart from the answer (`reasoning_content`).
    Reasoning {
        index: usize,
        text: String,
    },
    /// The calls a choice made (just before its `Done`).
    ToolCalls {
        index: usize,
        calls: Vec<ParsedCall>,
    },
    Done {
        index: usize,
        finish_reason: &'static str,
        completion_tokens: usize,
        drafts: DraftCounts,
    },
    Failed {
        error: ApiError,
    },
}

/// What a chat request adds to the grammar its fields ask for.
#[derive(Default)]
pub struct GrammarFrame<'a> {
    /// The grammar a required or named tool call imposes.
    pub tools: Option<Grammar>,
    /// A reasoning model's format, and whether the prompt opened its
    /// thinking: a call's or a JSON reply's grammar then lets the reply
    /// think first ([`ReasoningFormat::after_thinking`]).
    pub thinking: Option<(&'a ReasoningFormat, bool)>,
}

/// Turns the shared sampling fields into engine parameters, checking every
/// value. `default_max` applies when the request sets no token limit;
/// `tool_grammar` is the grammar a required tool call imposes.
pub fn build_job(
    state: &AppState,
    f: &SamplingFields,
    prompt: Vec<u32>,
    default_max: usize,
    logprobs: Option<u32>,
    tenant: String,
    frame: GrammarFrame<'_>,
) -> Result<Job, ApiError> {
    let ctx = state.engine.ctx;
    // The engine checks the prompt and the context when the job is
    // submitted (one place for every caller); here only what the API adds.
    let max_tokens = match f.max_completion_tokens.or(f.max_tokens) {
        Some(0) => {
            return Err(ApiError::invalid(
                "max_tokens",
                "max_tokens must be at least 1",
            ))
        }
        Some(m) => m.min(u32::MAX as u64) as usize,
        None => default_max.min(ctx.saturating_sub(prompt.len())).max(1),
    };
    let temperature = f.temperature.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::invalid(
            "temperature",
            format!("temperature must be between 0 and 2, got {temperature}"),
        ));
    }
    let top_p = f.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::invalid(
            "top_p",
            format!("top_p must be in (0, 1], got {top_p}"),
        ));
    }
    let top_k = match f.top_k.unwrap_or(0) {
        k if k <= 0 => 0,
        k => k as usize,
    };
    let min_p = f.min_p.unwrap_or(0.0);
    if !(0.0..=1.0).contains(&min_p) {
        return Err(ApiError::invalid(
            "min_p",
            format!("min_p must be in [0, 1], got {min_p}"),
        ));
    }
    for (name, v) in [
        ("presence_penalty", f.presence_penalty),
        ("frequency_penalty", f.frequency_penalty),
    ] {
        if let Some(v) = v {
            if !(-2.0..=2.0).contains(&v) {
                return Err(ApiError::invalid(
                    name,
                    format!("{name} must be between -2 and 2, got {v}"),
                ));
            }
        }
    }
    let repetition_penalty = f.repetition_penalty.unwrap_or(1.0);
    if !(repetition_penalty > 0.0 && repetition_penalty.is_finite()) {
        return Err(ApiError::invalid(
            "repetition_penalty",
            format!("repetition_penalty must be positive, got {repetition_penalty}"),
        ));
    }
    let n = f.n.unwrap_or(1);
    if !(1..=MAX_N).contains(&n) {
        return Err(ApiError::invalid(
            "n",
            format!("n must be between 1 and {MAX_N}, got {n}"),
        ));
    }
    if let Some(k) = logprobs {
        if k > MAX_TOP_LOGPROBS {
            return Err(ApiError::invalid(
                "logprobs",
                format!("at most {MAX_TOP_LOGPROBS} log-probabilities per token, got {k}"),
            ));
        }
    }
    let vocab = state.tokenizer.vocab_size();
    let mut logit_bias = Vec::new();
    for (k, &b) in f.logit_bias.iter().flatten() {
        let id: u32 = k
            .parse()
            .ok()
            .filter(|&id: &u32| (id as usize) < vocab)
            .ok_or_else(|| {
                ApiError::invalid(
                    "logit_bias",
                    format!("logit_bias keys must be token ids below {vocab}, got {k:?}"),
                )
            })?;
        if !(-100.0..=100.0).contains(&b) {
            return Err(ApiError::invalid(
                "logit_bias",
                format!("logit_bias values must be between -100 and 100, got {b}"),
            ));
        }
        logit_bias.push((id, b));
    }
    let stops = f.stop.as_ref().map(|s| s.strings()).unwrap_or_default();
    if stops.len() > 4 {
        return Err(ApiError::invalid("stop", "at most 4 stop strings"));
    }
    let seed = match f.seed {
        Some(s) => s as u64,
        None => rand::random(),
    };
    let sampler = SamplerConfig {
        temperature,
        top_k,
        top_p,
        min_p,
        repetition_penalty,
        presence_penalty: f.presence_penalty.unwrap_or(0.0),
        frequency_penalty: f.frequency_penalty.unwrap_or(0.0),
        seed,
        ..SamplerConfig::default()
    };
    refuse_unhonoured(f)?;
    let (constraint, thinks_first) = constraint(state, f, frame)?;
    let stop_ids = if f.ignore_eos.unwrap_or(false) {
        Vec::new()
    } else {
        state.tokenizer.stop_ids()
    };
    Ok(Job {
        prompt,
        params: RequestParams {
            max_tokens,
            sampler,
            stop_ids,
            logit_bias,
            logprobs: logprobs.map(|k| k as usize),
            constraint,
            speculate: f.speculation.unwrap_or(true),
        },
        stops,
        n: n as usize,
        tenant: f.user.clone().unwrap_or(tenant),
        watch: None,
        reasoning: None,
        thinks_first,
        access: None,
    })
}

/// Fields that would change the output and that Spindle does not honour:
/// a 400 naming the field, so the client learns it at once instead of
/// getting an answer to another question.
fn refuse_unhonoured(f: &SamplingFields) -> Result<(), ApiError> {
    if f.functions.is_some() || f.function_call.is_some() {
        let field = if f.functions.is_some() {
            "functions"
        } else {
            "function_call"
        };
        return Err(ApiError::invalid(
            field,
            "the legacy functions API is not supported: send tools and tool_choice",
        ));
    }
    if f.best_of.is_some_and(|b| b > f.n.unwrap_or(1).max(1)) {
        return Err(ApiError::invalid(
            "best_of",
            "best_of is not supported: ask for n choices and pick among them",
        ));
    }
    if f.audio.is_some() {
        return Err(ApiError::invalid("audio", "audio output is not supported"));
    }
    if let Some(m) = f.modalities.iter().flatten().find(|m| *m != "text") {
        return Err(ApiError::invalid(
            "modalities",
            format!("only text output is supported, not {m}"),
        ));
    }
    if f.prediction.is_some() {
        return Err(ApiError::invalid(
            "prediction",
            "predicted outputs are not supported",
        ));
    }
    Ok(())
}

/// Completions take no tools (they are a chat feature): refused, never
/// silently dropped.
pub fn refuse_tools(f: &SamplingFields) -> Result<(), ApiError> {
    let offered = match &f.tools {
        None | Some(serde_json::Value::Null) => false,
        Some(t) => t.as_array().is_none_or(|t| !t.is_empty()),
    };
    if offered {
        return Err(ApiError::invalid(
            "tools",
            "tools are offered through /v1/chat/completions, not /v1/completions",
        ));
    }
    Ok(())
}

/// The grammar a request asks for (`response_format`, one of llama.cpp's
/// `json_schema`, `grammar` and `regex`, or a required tool call),
/// compiled: a grammar that does not compile is a 400 with the reason,
/// before anything runs. With whether it lets the reply think first.
fn constraint(
    state: &AppState,
    f: &SamplingFields,
    frame: GrammarFrame<'_>,
) -> Result<(Option<Constraint>, bool), ApiError> {
    let mut asked = Vec::new();
    if let Some(g) = frame.tools {
        asked.push(("tools", g));
    }
    match &f.response_format {
        None | Some(ResponseFormat::Text) => {}
        Some(ResponseFormat::JsonObject) => asked.push(("response_format", Grammar::JsonObject)),
        Some(ResponseFormat::JsonSchema { json_schema }) => {
            let schema = json_schema.schema.clone().ok_or_else(|| {
                ApiError::invalid(
                    "response_format",
                    "response_format.json_schema.schema is missing",
                )
            })?;
            asked.push(("response_format", Grammar::JsonSchema(schema)));
        }
    }
    if let Some(s) = &f.json_schema {
        asked.push(("json_schema", Grammar::JsonSchema(s.clone())));
    }
    if let Some(g) = &f.grammar {
        asked.push(("grammar", Grammar::Lark(g.clone())));
    }
    if let Some(r) = &f.regex {
        asked.push(("regex", Grammar::Regex(r.clone())));
    }
    let (param, mut grammar) = match asked.len() {
        0 => return Ok((None, false)),
        1 => asked.pop().expect("one"),
        _ => {
            let names: Vec<&str> = asked.iter().map(|a| a.0).collect();
            return Err(ApiError::invalid(
                asked[1].0,
                format!(
                    "give one of response_format, json_schema, grammar, regex and a required tool_choice; got {}",
                    names.join(", ")
                ),
            ));
        }
    };
    // A reasoning model thinks first, then calls or writes the JSON asked
    // for (a grammar of its own, `grammar` or `regex`, is taken as given).
    let wrapped = match frame.thinking {
        Some((format, opened)) if param == "tools" || grammar.json_lark().is_some() => {
            format.after_thinking(&grammar, opened)
        }
        _ => None,
    };
    let thinks_first = wrapped.is_some();
    if let Some(g) = wrapped {
        grammar = g;
    }
    let compiler = state.grammars.as_ref().ok_or_else(|| {
        ApiError::invalid(
            param,
            "structured output is not available for this model's vocabulary",
        )
    })?;
    compiler
        .compile(&grammar)
        .map(|c| (Some(c), thinks_first))
        .map_err(|e| ApiError::invalid(param, e.to_string()))
}

/// A refused submission as the client hears it: 429 with `Retry-After`
/// for a full queue, the engine's refusals by their kind.
pub fn submit_error(e: SubmitError) -> ApiError {
    match e {
        SubmitError::QueueFull { .. } => ApiError {
            retry_after: Some(1),
            ..ApiError::new(StatusCode::TOO_MANY_REQUESTS, e.to_string())
        },
        e => ApiError::from(e.request_error()),
    }
}

/// Submits the job's `n` requests and returns the channel their pieces
/// arrive on. Choice `i` samples with seed `seed + i`.
pub fn start(state: &Arc<AppState>, job: Job) -> Result<mpsc::Receiver<Piece>, ApiError> {
    let (tx, rx) = mpsc::channel(256);
    let deadline = Instant::now() + state.request_timeout;
    let mut receivers = Vec::with_capacity(job.n);
    for i in 0..job.n {
        let (etx, erx) = mpsc::unbounded_channel();
        let mut params = job.params.clone();
        params.sampler.seed = params.sampler.seed.wrapping_add(i as u64);
        let req = Request {
            prompt: job.prompt.clone(),
            params,
            tenant: job.tenant.clone(),
            score: None,
            events: etx,
        };
        state.engine.submit(req).map_err(submit_error)?;
        receivers.push(erx);
    }
    for (index, erx) in receivers.into_iter().enumerate() {
        let text = TextStream::new(&state.tokenizer, job.stops.clone());
        let out = ChoiceOut {
            index,
            text,
            reasoning: job.reasoning.clone(),
            watch: job.watch.clone(),
            tx: tx.clone(),
            access: job.access.clone(),
        };
        tokio::spawn(drive_choice(erx, out, deadline));
    }
    Ok(rx)
}

/// Where one choice's text goes: cut at stop strings, watched for tool
/// calls, sent as pieces.
struct ChoiceOut {
    index: usize,
    text: TextStream,
    reasoning: Option<ReasoningSplit>,
    watch: Option<ReplyWatch>,
    tx: mpsc::Sender<Piece>,
    access: Option<Access>,
}

impl ChoiceOut {
    /// Sends the text of one token (`id`; `None` for the held-back rest);
    /// `false` when nobody listens any more.
    async fn send_text(
        &mut self,
        id: Option<u32>,
        text: String,
        tokens: Vec<(u32, Option<TokenLogprobs>)>,
    ) -> bool {
        let (id, text) = match &mut self.reasoning {
            Some(r) => {
                let split = r.push(id, &text);
                if !self.send_reasoning(split.reasoning).await {
                    return false;
                }
                (split.content_id, split.content)
            }
            None => (id, text),
        };
        self.send_content(id, text, tokens).await
    }

    async fn send_reasoning(&mut self, text: String) -> bool {
        if text.is_empty() {
            return true;
        }
        let piece = Piece::Reasoning {
            index: self.index,
            text,
        };
        self.tx.send(piece).await.is_ok()
    }

    /// Sends answer text (after the reasoning split) through the tool-call
    /// reader.
    async fn send_content(
        &mut self,
        id: Option<u32>,
        text: String,
        tokens: Vec<(u32, Option<TokenLogprobs>)>,
    ) -> bool {
        let text = match &mut self.watch {
            Some(w) => w.push(id, &text),
            None => text,
        };
        if text.is_empty() && tokens.is_empty() {
            return true;
        }
        let piece = Piece::Delta {
            index: self.index,
            text,
            tokens,
        };
        self.tx.send(piece).await.is_ok()
    }

    /// Ends the choice: the rest of the text, its calls, then `Done`.
    async fn finish(
        mut self,
        finish_reason: &'static str,
        completion_tokens: usize,
        drafts: DraftCounts,
    ) {
        let rest = self.text.finish();
        if !self.send_text(None, rest, Vec::new()).await {
            return;
        }
        if let Some(mut r) = self.reasoning.take() {
            let split = r.finish();
            if !self.send_reasoning(split.reasoning).await
                || !self.send_content(None, split.content, Vec::new()).await
            {
                return;
            }
        }
        let mut finish_reason = finish_reason;
        if let Some(mut w) = self.watch.take() {
            let end = w.finish(finish_reason == "length");
            if !end.text.is_empty() && !self.send_content(None, end.text, Vec::new()).await {
                return;
            }
            let calls = end.calls;
            if !calls.is_empty() {
                // Calls cut off by the token limit say so; the ones it
                // completed are still returned, as calls.
                if !(end.cut && finish_reason == "length") {
                    finish_reason = "tool_calls";
                }
                let piece = Piece::ToolCalls {
                    index: self.index,
                    calls,
                };
                if self.tx.send(piece).await.is_err() {
                    return;
                }
            }
        }
        let _ = self
            .tx
            .send(Piece::Done {
                index: self.index,
                finish_reason,
                completion_tokens,
                drafts,
            })
            .await;
    }

    async fn fail(self, error: ApiError) {
        let _ = self.tx.send(Piece::Failed { error }).await;
    }
}

/// Relays one engine request's events as pieces (see [`relay`]) and adds
/// what it generated to the access log, however it ended.
async fn drive_choice(events: mpsc::UnboundedReceiver<Event>, out: ChoiceOut, deadline: Instant) {
    let access = out.access.clone();
    let (tokens, drafts) = relay(events, out, deadline).await;
    if let Some(a) = access {
        a.add_completion(tokens, drafts);
    }
}

/// Relays one engine request's events as pieces until it ends, a stop
/// string appears, the deadline passes or nobody listens any more; returns
/// the tokens generated (as `usage` counts them) and the drafts verified.
async fn relay(
    mut events: mpsc::UnboundedReceiver<Event>,
    mut out: ChoiceOut,
    deadline: Instant,
) -> (usize, DraftCounts) {
    let mut generated = 0;
    let mut drafts = DraftCounts::default();
    loop {
        // A client that leaves while its request waits or runs is noticed
        // at once (not at the next token): dropping `events` cancels the
        // request, so the engine drops it before its next prefill or pass.
        let next = tokio::select! {
            e = tokio::time::timeout_at(deadline, events.recv()) => e,
            _ = out.tx.closed() => return (generated, drafts),
        };
        let event = match next {
            Ok(Some(e)) => e,
            Ok(None) => {
                let error = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the engine stopped");
                out.fail(error).await;
                return (generated, drafts);
            }
            Err(_) => {
                let error = ApiError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    "the request took longer than the server's --request-timeout",
                );
                out.fail(error).await;
                return (generated, drafts);
            }
        };
        match event {
            Event::Token { id, logprobs } => {
                if generated == 0 {
                    if let Some(a) = &out.access {
                        a.first_token();
                    }
                }
                generated += 1;
                let delta = out.text.push(id);
                if !out.send_text(Some(id), delta, vec![(id, logprobs)]).await {
                    return (generated, drafts);
                }
                // A stop string, or a tool-call reply that began to repeat
                // its calls, ends the choice here.
                let repeated = out.watch.as_ref().is_some_and(|w| w.ended());
                if out.text.stopped() || repeated {
                    // The pass's draft counts may have been sent already.
                    while let Ok(e) = events.try_recv() {
                        if let Event::Speculated { drafted, accepted } = e {
                            drafts += DraftCounts::pass(drafted, accepted);
                        }
                    }
                    // Dropping `events` cancels the sequence.
                    drop(events);
                    let reason = if repeated { "tool_calls" } else { "stop" };
                    out.finish(reason, generated, drafts).await;
                    return (generated, drafts);
                }
            }
            Event::Finished(f) => {
                let finish_reason = match f.reason {
                    FinishReason::Stop => "stop",
                    FinishReason::Length | FinishReason::Cancelled => "length",
                };
                out.finish(finish_reason, f.completion_tokens, drafts).await;
                return (f.completion_tokens, drafts);
            }
            Event::Speculated { drafted, accepted } => {
                drafts += DraftCounts::pass(drafted, accepted);
            }
            Event::Error(e) => {
                out.fail(ApiError::from(e)).await;
                return (generated, drafts);
            }
            // Only score requests (the decision endpoint) get scores.
            Event::Scores(_) => {}
        }
    }
}

/// A whole choice, gathered from its pieces.
#[derive(Debug, Default)]
pub struct Choice {
    pub text: String,
    /// Thinking, apart from `text` (`reasoning_content`).
    pub reasoning: String,
    pub tokens: Vec<(u32, Option<TokenLogprobs>)>,
    pub tool_calls: Vec<ParsedCall>,
    pub finish_reason: &'static str,
    pub completion_tokens: usize,
    pub drafts: DraftCounts,
}

/// Gathers every piece into `n` choices; the first failure wins.
pub async fn collect(mut rx: mpsc::Receiver<Piece>, n: usize) -> Result<Vec<Choice>, ApiError> {
    let mut choices: Vec<Choice> = (0..n).map(|_| Choice::default()).collect();
    let mut done = 0;
    while done < n {
        match rx.recv().await {
            Some(Piece::Delta {
                index,
                text,
                tokens,
            }) => {
                choices[index].text.push_str(&text);
                choices[index].tokens.extend(tokens);
            }
            Some(Piece::Reasoning { index, text }) => choices[index].reasoning.push_str(&text),
            Some(Piece::ToolCalls { index, calls }) => choices[index].tool_calls = calls,
            Some(Piece::Done {
                index,
                finish_reason,
                completion_tokens,
                drafts,
            }) => {
                choices[index].finish_reason = finish_reason;
                choices[index].completion_tokens = completion_tokens;
                choices[index].drafts = drafts;
                done += 1;
            }
            Some(Piece::Failed { error, .. }) => return Err(error),
            None => {
                return Err(ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "a choice ended without finishing",
                ))
            }
        }
    }
    Ok(choices)
}

/// Seconds since the Unix epoch (`created` fields).
pub fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A fresh id with `prefix` (`cmpl-`, `chatcmpl-`).
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}{:016x}", rand::random::<u64>())
}

pub fn default_timeout() -> Duration {
    Duration::from_secs(600)
}
