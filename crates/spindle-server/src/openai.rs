//! Request bodies of the OpenAI API, as far as Spindle honours them. Unknown
//! fields are ignored (clients send many); a known field of the wrong type
//! is a 400.

use std::collections::HashMap;

use serde::Deserialize;

/// Sampling and stopping fields shared by completions and chat completions.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SamplingFields {
    pub max_tokens: Option<u64>,
    pub max_completion_tokens: Option<u64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub n: Option<u32>,
    pub stop: Option<Stop>,
    pub seed: Option<i64>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub logit_bias: Option<HashMap<String, f32>>,
    pub ignore_eos: Option<bool>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub user: Option<String>,
    /// OpenAI's structured output: `text`, `json_object` or `json_schema`.
    pub response_format: Option<ResponseFormat>,
    /// llama.cpp's extensions: a JSON schema, a Lark grammar, a regular
    /// expression the output must match.
    pub json_schema: Option<serde_json::Value>,
    pub grammar: Option<String>,
    pub regex: Option<String>,
    /// Spindle's extension: `false` runs this request without drafts
    /// (the same tokens; for comparing, or where drafts do not pay).
    pub speculation: Option<bool>,
    /// `none` leaves a reasoning model's thinking in `content`; `auto`
    /// (the server's default, `--reasoning-format`) gives it apart as
    /// `reasoning_content` (llama.cpp's request field of the same name).
    pub reasoning_format: Option<String>,
    /// Functions the model may call (chat only), `tool_choice` (`none`,
    /// `auto`, `required`, or `{"type": "function", "function": {"name"}}`)
    /// and whether one reply may hold several calls. Checked by hand in
    /// `tools::ToolRequest::parse`, so each mistake gets its own message.
    pub tools: Option<serde_json::Value>,
    pub tool_choice: Option<serde_json::Value>,
    pub parallel_tool_calls: Option<bool>,
    /// Fields that would change the output and that Spindle does not
    /// honour: refused with a 400 naming them, never dropped.
    pub functions: Option<serde_json::Value>,
    pub function_call: Option<serde_json::Value>,
    pub best_of: Option<u32>,
    pub audio: Option<serde_json::Value>,
    pub modalities: Option<Vec<String>>,
    pub prediction: Option<serde_json::Value>,
}

/// `response_format` of a request.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponseFormat {
    Text,
    JsonObject,
    JsonSchema { json_schema: JsonSchemaFormat },
}

/// `response_format.json_schema`.
#[derive(Debug, Clone, Deserialize)]
pub struct JsonSchemaFormat {
    pub name: Option<String>,
    pub schema: Option<serde_json::Value>,
    pub strict: Option<bool>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

impl Stop {
    pub fn strings(&self) -> Vec<String> {
        match self {
            Stop::One(s) => vec![s.clone()],
            Stop::Many(v) => v.clone(),
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    pub model: String,
    pub prompt: Prompt,
    /// Log-probabilities of this many alternatives per token (0-20).
    pub logprobs: Option<u32>,
    pub echo: Option<bool>,
    pub suffix: Option<String>,
    #[serde(flatten)]
    pub sampling: SamplingFields,
}

/// A completions prompt: text, or token ids (one prompt per request).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<u32>),
}

#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    pub model: String,
    pub messages: Vec<ChatMessageIn>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<u32>,
    /// Further variables for the chat template (vLLM's and llama.cpp's
    /// field): Qwen3's `enable_thinking`, gpt-oss's `reasoning_effort`, ...
    pub chat_template_kwargs: Option<serde_json::Value>,
    /// OpenAI's reasoning effort (`low`, `medium`, `high`, ...), given to
    /// the template as `reasoning_effort` (gpt-oss's template reads it).
    pub reasoning_effort: Option<String>,
    #[serde(flatten)]
    pub sampling: SamplingFields,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ChatMessageIn {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
    /// An assistant turn's calls (a follow-up request carries them back).
    #[serde(default)]
    pub tool_calls: Option<Vec<ToolCallIn>>,
    /// A `tool` turn: the call it answers.
    #[serde(default)]
    pub tool_call_id: Option<String>,
    /// A `tool` turn: the function's name.
    #[serde(default)]
    pub name: Option<String>,
    /// An assistant turn's thinking, as replies gave it (`reasoning` is
    /// vLLM's name for it); templates that show past thinking render it.
    #[serde(default, alias = "reasoning")]
    pub reasoning_content: Option<String>,
}

/// One call in an assistant turn of the conversation.
#[derive(Debug, Clone, Deserialize)]
pub struct ToolCallIn {
    pub id: String,
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    pub function: FunctionCallIn,
}

/// `tool_calls[].function`: `arguments` is a JSON text, as OpenAI sends it.
#[derive(Debug, Clone, Deserialize)]
pub struct FunctionCallIn {
    pub name: String,
    pub arguments: String,
}

/// Message content: a string, or parts of which the text ones are used.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct TokenizeRequest {
    pub model: Option<String>,
    pub prompt: Option<String>,
    pub messages: Option<Vec<ChatMessageIn>>,
    pub add_special_tokens: Option<bool>,
    /// Whether control-token text in `prompt` (`<bos>`, `<start_of_turn>`)
    /// becomes those tokens (default) or is tokenized as plain text (as
    /// llama.cpp's `parse_special: false`).
    pub parse_special: Option<bool>,
    /// As in a chat request, for `messages`.
    pub chat_template_kwargs: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct DetokenizeRequest {
    pub model: Option<String>,
    pub tokens: Vec<u32>,
}
