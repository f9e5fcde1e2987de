//! The JSON of replies: OpenAI's choice, usage, tool call and
//! log-probability objects, shared by whole and streamed responses.

use serde_json::{json, Value};
use spindle_engine::scheduler::TokenLogprobs;

use crate::generation::{Choice, DraftCounts};
use crate::tools::ParsedCall;
use crate::AppState;

/// What `/health` answers while the server runs.
pub(crate) fn health_body() -> Value {
    json!({"status": "ok"})
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

/// OpenAI's usage object, with Spindle's speculation counts beside it:
/// `drafted` tokens verified for the request and `accepted` of them kept
/// (0 and 0 with `--spec off`), and the `passes` that chose its tokens
/// (completion tokens per pass: what speculation bought).
pub(crate) fn usage(prompt: usize, completion: usize, drafts: DraftCounts) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "drafted": drafts.drafted,
        "accepted": drafts.accepted,
        "passes": drafts.passes,
    })
}

/// One choice of a whole response; a completion's text follows `echo`
/// (the prompt, when the request asked for it).
pub(crate) fn choice_json(
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
            if !c.reasoning.is_empty() {
                message["reasoning_content"] = json!(c.reasoning);
            }
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
