//! Request prompts to token ids: a completion's text or ids, a chat
//! through the model's template, refused early when they cannot fit.

use crate::error::ApiError;
use crate::openai::{ChatMessageIn, Prompt};
use crate::tools::{self, ToolRequest};
use crate::AppState;

/// The tokenizer refused the text or ids of request field `param`.
pub(crate) fn untokenizable(
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
pub(crate) fn refuse_unfitting(
    state: &AppState,
    param: &'static str,
    bytes: usize,
) -> Result<(), ApiError> {
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
pub(crate) fn completion_prompt(state: &AppState, prompt: &Prompt) -> Result<Vec<u32>, ApiError> {
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

/// Variables a template may not be given from outside: the conversation
/// and what the server sets itself.
pub(crate) const RESERVED_TEMPLATE_VARS: &[&str] = &[
    "messages",
    "tools",
    "documents",
    "add_generation_prompt",
    "bos_token",
    "eos_token",
];

/// The chat template's further variables: the server's defaults
/// (`--chat-template-kwargs`), then the request's `chat_template_kwargs`
/// (an object), then its `reasoning_effort`. Refused: anything but an
/// object, and names that would replace the conversation.
pub(crate) fn template_kwargs(
    state: &AppState,
    given: Option<&serde_json::Value>,
    reasoning_effort: Option<&str>,
) -> Result<serde_json::Map<String, serde_json::Value>, ApiError> {
    let mut kwargs = state.template_kwargs.clone();
    match given {
        None | Some(serde_json::Value::Null) => {}
        Some(serde_json::Value::Object(m)) => {
            if let Some(k) = m
                .keys()
                .find(|k| RESERVED_TEMPLATE_VARS.contains(&k.as_str()))
            {
                return Err(ApiError::invalid(
                    "chat_template_kwargs",
                    format!(
                        "chat_template_kwargs may not set '{k}' (the request's own fields set it)"
                    ),
                ));
            }
            kwargs.extend(m.clone());
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "chat_template_kwargs",
                "chat_template_kwargs must be an object of template variables",
            ))
        }
    }
    if let Some(e) = reasoning_effort {
        kwargs.insert("reasoning_effort".into(), serde_json::Value::from(e));
    }
    Ok(kwargs)
}

/// Prompt ids of a chat: the conversation (with its tool calls and
/// results) and the offered tools, through the chat template with its
/// further variables `kwargs`.
pub(crate) fn chat_prompt(
    state: &AppState,
    messages: &[ChatMessageIn],
    tools: Option<&ToolRequest>,
    kwargs: &serde_json::Map<String, serde_json::Value>,
) -> Result<Vec<u32>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid("messages", "messages is empty"));
    }
    let (msgs, template_tools) = tools::conversation(messages, tools, &state.tool_format)?;
    let rendered = state
        .template
        .render_kwargs_for(
            &state.tokenizer,
            &msgs,
            template_tools.as_ref(),
            true,
            kwargs,
        )
        .map_err(|e| ApiError::invalid("messages", format!("the chat template failed: {e}")))?;
    refuse_unfitting(state, "messages", rendered.len())?;
    // What users and tools wrote stays text: special-token text in a
    // message never becomes a control token.
    let texts: Vec<&str> = msgs
        .iter()
        .flat_map(|m| std::iter::once(m.content.as_str()).chain(m.reasoning_content.as_deref()))
        .collect();
    state
        .tokenizer
        .encode_chat_prompt_guarded(&rendered, &texts)
        .map_err(untokenizable("messages"))
}

/// The prompt as `echo` repeats it before the completion: the text given,
/// or the text of the ids given.
pub(crate) fn echo_text(state: &AppState, prompt: &Prompt) -> Result<String, ApiError> {
    match prompt {
        Prompt::Text(t) => Ok(t.clone()),
        Prompt::Texts(ts) => Ok(ts.concat()),
        Prompt::Ids(ids) => state.tokenizer.decode(ids).map_err(untokenizable("prompt")),
    }
}
