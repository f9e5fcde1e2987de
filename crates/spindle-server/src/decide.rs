//! `POST /v1/decide`: the probability of every option of every question
//! about a state, from one pass (see `spindle_engine::decide`).

use std::time::Instant;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::{Extension, Json};
use serde_json::{json, Value};
use spindle_engine::decide::{parse_request, Answer, DecisionPlan, Form};
use spindle_engine::scheduler::Event;
use tokio::sync::mpsc;

use crate::access::Access;
use crate::body::parse;
use crate::error::ApiError;
use crate::generation::{new_id, submit_error};
use crate::keys::tenant;
use crate::models::check_model;
use crate::Shared;

pub async fn decide(
    State(state): State<Shared>,
    Extension(access): Extension<Access>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let started = Instant::now();
    let mut value: Value = parse(&body)?;
    let model = match value.get("model") {
        Some(Value::String(m)) => m.clone(),
        Some(_) => return Err(ApiError::invalid("model", "'model' must be a string")),
        None => return Err(ApiError::invalid("model", "give 'model': the model to ask")),
    };
    check_model(&state, &model)?;
    let user = match value.as_object_mut().and_then(|o| o.remove("user")) {
        Some(Value::String(u)) => Some(u),
        Some(_) => return Err(ApiError::invalid("user", "'user' must be a string")),
        None => None,
    };
    let (request, form) =
        parse_request(value).map_err(|e| ApiError::invalid("questions", e.to_string()))?;
    let plan = DecisionPlan::with_priors(
        &request,
        &state.tokenizer,
        &state.template,
        state.engine.ctx,
        Some(&state.priors),
    )
    .map_err(|e| ApiError::invalid("questions", e.to_string()))?;
    access.set_prompt_tokens(plan.prompt.len());
    if let Some(u) = &user {
        access.set_user(u);
    }
    let (tx, mut rx) = mpsc::unbounded_channel();
    let who = user.unwrap_or_else(|| tenant(&headers));
    state
        .engine
        .submit(plan.request(&who, tx))
        .map_err(submit_error)?;
    let deadline = tokio::time::Instant::now() + state.request_timeout;
    let mut scores = None;
    loop {
        let event = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .map_err(|_| {
                ApiError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    "the decision took longer than the server's --request-timeout",
                )
            })?;
        match event {
            Some(Event::Scores(s)) => scores = Some(s),
            Some(Event::Finished(_)) => break,
            Some(Event::Error(e)) => return Err(ApiError::from(e)),
            Some(Event::Token { .. } | Event::Speculated { .. }) => {}
            None => {
                return Err(ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the engine stopped",
                ))
            }
        }
    }
    let scores = scores
        .ok_or_else(|| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "no scores came back"))?;
    let answers = plan
        .answers_with(&scores, Some(&state.priors))
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    state.decisions.record(answers.len());
    let prompt = plan.prompt.len();
    let tree = plan.tree_rows();
    let mut out = json!({
        "id": new_id("decide-"),
        "object": "decision",
        "model": state.model_name,
        "questions": answers.iter().map(Answer::to_json).collect::<Vec<_>>(),
        "usage": {
            "prompt_tokens": prompt,
            "question_tokens": tree,
            "total_tokens": prompt + tree,
        },
        "timing_ms": started.elapsed().as_secs_f64() * 1e3,
    });
    if form == Form::Map {
        out["answers"] = Value::Object(
            answers
                .iter()
                .map(|a| (a.id.clone(), a.to_keyed_json()))
                .collect(),
        );
    }
    Ok(Json(out))
}

/// Decisions answered, for `/metrics` (the dashboard's decisions per
/// second).
#[derive(Debug, Default)]
pub struct DecisionCounts {
    requests: std::sync::atomic::AtomicU64,
    questions: std::sync::atomic::AtomicU64,
}

impl DecisionCounts {
    fn record(&self, questions: usize) {
        use std::sync::atomic::Ordering::Relaxed;
        self.requests.fetch_add(1, Relaxed);
        self.questions.fetch_add(questions as u64, Relaxed);
    }

    /// `spindle:decide_requests_total` and `spindle:decide_questions_total`.
    pub(crate) fn render(&self, model: &str) -> String {
        use std::sync::atomic::Ordering::Relaxed;
        let mut out = String::new();
        for (name, help, v) in [
            (
                "spindle:decide_requests_total",
                "Requests /v1/decide answered.",
                &self.requests,
            ),
            (
                "spindle:decide_questions_total",
                "Questions /v1/decide answered (a request asks one or more).",
                &self.questions,
            ),
        ] {
            out += &format!(
                "# HELP {name} {help}\n# TYPE {name} counter\n{name}{{model_name=\"{model}\"}} {}\n",
                v.load(Relaxed)
            );
        }
        out
    }
}
