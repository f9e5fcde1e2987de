//! `POST /tokenize` and `POST /detokenize` (llama.cpp's and vLLM's
//! shapes).

use axum::body::Bytes;
use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};

use crate::body::parse;
use crate::error::ApiError;
use crate::models::check_model;
use crate::openai::{DetokenizeRequest, TokenizeRequest};
use crate::prompts::{chat_prompt, template_kwargs, untokenizable};
use crate::Shared;

pub(crate) async fn tokenize(
    State(state): State<Shared>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
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
        (None, Some(m)) => {
            let kwargs = template_kwargs(&state, req.chat_template_kwargs.as_ref(), None)?;
            chat_prompt(&state, m, None, &kwargs)?
        }
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

pub(crate) async fn detokenize(
    State(state): State<Shared>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
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
