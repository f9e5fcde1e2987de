//! Tool calling: the functions a chat request offers, the conversation's
//! earlier calls and results, the grammar that makes `required` and named
//! choices always produce a valid call, and the calls read back out of the
//! reply.
//!
//! The model's own format is used where its chat template has one
//! ([`ToolFormat`]); Gemma 3's has none, so Spindle describes the functions
//! in the system turn and the model answers in a documented JSON form
//! (`{"tool_calls": [{"name": ..., "arguments": {...}}]}`), enforced by the
//! grammar whenever a call is required.

mod format;
mod reply;

use serde_json::{json, Value};
use spindle_engine::constraint::Grammar;
use spindle_model::chat_template::ChatMessage;

use crate::error::ApiError;
use crate::openai::{ChatMessageIn, Content, SamplingFields};

pub use format::{HarmonyMarkers, Marker, ToolFormat};
pub(crate) use reply::harmony_header;
pub use reply::{parse_reply, ParsedCall, ReplyEnd, ReplyWatch, Watch};

/// A function the model may call.
#[derive(Debug, Clone)]
pub struct Function {
    pub name: String,
    pub description: Option<String>,
    /// Its arguments' JSON schema (an object schema).
    pub parameters: Value,
}

/// What `tool_choice` asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolChoice {
    /// The model answers in text; the functions are not offered.
    None,
    /// The model chooses between text and calls.
    Auto,
    /// At least one call.
    Required,
    /// A call of this function.
    Named(String),
}

/// The tool part of a chat request, checked.
#[derive(Debug, Clone)]
pub struct ToolRequest {
    pub functions: Vec<Function>,
    pub choice: ToolChoice,
    /// Whether one reply may hold several calls.
    pub parallel: bool,
}

impl ToolRequest {
    /// The request's `tools`, `tool_choice` and `parallel_tool_calls`;
    /// `None` when no function is offered.
    pub fn parse(f: &SamplingFields) -> Result<Option<ToolRequest>, ApiError> {
        let functions = match &f.tools {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(tools)) => tools
                .iter()
                .enumerate()
                .map(|(i, t)| function(i, t))
                .collect::<Result<Vec<_>, _>>()?,
            Some(_) => return Err(ApiError::invalid("tools", "tools must be a list")),
        };
        for (i, a) in functions.iter().enumerate() {
            if functions[..i].iter().any(|b| b.name == a.name) {
                return Err(ApiError::invalid(
                    "tools",
                    format!("two tools are named '{}'", a.name),
                ));
            }
        }
        let choice = match &f.tool_choice {
            None | Some(Value::Null) => ToolChoice::Auto,
            Some(Value::String(s)) => match s.as_str() {
                "none" => ToolChoice::None,
                "auto" => ToolChoice::Auto,
                "required" => ToolChoice::Required,
                other => {
                    return Err(ApiError::invalid(
                        "tool_choice",
                        format!("tool_choice must be none, auto, required or {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, got '{other}'"),
                    ))
                }
            },
            Some(v) => {
                let name = v
                    .pointer("/function/name")
                    .and_then(Value::as_str)
                    .filter(|_| v.get("type").and_then(Value::as_str) == Some("function"))
                    .ok_or_else(|| {
                        ApiError::invalid(
                            "tool_choice",
                            "a named tool_choice is {\"type\": \"function\", \"function\": {\"name\": ...}}",
                        )
                    })?;
                if !functions.iter().any(|t| t.name == name) {
                    return Err(ApiError::invalid(
                        "tool_choice",
                        format!("tool_choice names '{name}', which is not among the tools"),
                    ));
                }
                ToolChoice::Named(name.to_string())
            }
        };
        if functions.is_empty() {
            return match choice {
                ToolChoice::None | ToolChoice::Auto => Ok(None),
                _ => Err(ApiError::invalid(
                    "tool_choice",
                    "tool_choice asks for a call, but no tools were given",
                )),
            };
        }
        Ok(Some(ToolRequest {
            functions,
            choice,
            parallel: f.parallel_tool_calls.unwrap_or(true),
        }))
    }

    /// Whether the functions are offered at all (`tool_choice` is not `none`).
    pub fn offered(&self) -> bool {
        self.choice != ToolChoice::None
    }

    /// The functions a call may name.
    pub fn callable(&self) -> Vec<&Function> {
        match &self.choice {
            ToolChoice::Named(n) => self.functions.iter().filter(|f| &f.name == n).collect(),
            _ => self.functions.iter().collect(),
        }
    }

    /// The grammar every reply must match: a call in `format`, when one is
    /// required or named; none for `auto` (the model may answer in text).
    pub fn grammar(&self, format: &ToolFormat) -> Option<Grammar> {
        match self.choice {
            ToolChoice::Required | ToolChoice::Named(_) => Some(format.call_grammar(
                &self.callable(),
                self.parallel && matches!(self.choice, ToolChoice::Required),
            )),
            ToolChoice::None | ToolChoice::Auto => None,
        }
    }

    /// The tools as the chat template receives them.
    pub fn template_tools(&self) -> Value {
        Value::Array(
            self.functions
                .iter()
                .map(|f| {
                    let mut function = json!({"name": f.name, "parameters": f.parameters});
                    if let Some(d) = &f.description {
                        function["description"] = json!(d);
                    }
                    json!({"type": "function", "function": function})
                })
                .collect(),
        )
    }
}

/// `tools[i]`, checked: a function with a name and an object schema.
fn function(i: usize, t: &Value) -> Result<Function, ApiError> {
    let bad = |why: &str| ApiError::invalid("tools", format!("tools[{i}]: {why}"));
    if t.get("type").and_then(Value::as_str) != Some("function") {
        return Err(bad("only tools of type \"function\" are supported"));
    }
    let f = t
        .get("function")
        .filter(|f| f.is_object())
        .ok_or_else(|| bad("function is missing"))?;
    let name = f
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("function.name is missing"))?;
    let name_ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.');
    if !name_ok {
        return Err(bad(
            "function.name must be 1 to 64 letters, digits, '_', '-' or '.'",
        ));
    }
    let parameters = match f.get("parameters") {
        None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
        Some(p) if p.is_object() => p.clone(),
        Some(_) => return Err(bad("function.parameters must be a JSON schema object")),
    };
    let description = match f.get("description") {
        None | Some(Value::Null) => None,
        Some(Value::String(d)) => Some(d.clone()),
        Some(_) => return Err(bad("function.description must be a string")),
    };
    Ok(Function {
        name: name.to_string(),
        description,
        parameters,
    })
}

/// The conversation as the chat template receives it, checked: assistant
/// calls with JSON arguments, tool results that answer an earlier call.
/// For a template without tools, calls and results are written into the
/// turns in [`ToolFormat::Generic`]'s form and the functions described in
/// the system turn. Returns the messages and the `tools` for the template.
pub fn conversation(
    messages: &[ChatMessageIn],
    tools: Option<&ToolRequest>,
    format: &ToolFormat,
) -> Result<(Vec<ChatMessage>, Option<Value>), ApiError> {
    let mut out: Vec<ChatMessage> = Vec::with_capacity(messages.len() + 1);
    let mut call_ids: Vec<(String, String)> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        let bad = |why: String| ApiError::invalid("messages", format!("messages[{i}]: {why}"));
        if let Some(Content::Parts(parts)) = &m.content {
            if let Some(p) = parts.iter().find(|p| p.kind != "text") {
                return Err(bad(format!(
                    "content part of type '{}' is not supported: only text parts are supported until Spindle serves multimodal models",
                    p.kind
                )));
            }
        }
        let content = text_of(m.content.as_ref());
        let mut msg = ChatMessage::new(m.role.clone(), content);
        if let Some(r) = m.reasoning_content.as_ref().filter(|r| !r.is_empty()) {
            if m.role != "assistant" {
                return Err(bad(format!(
                    "only assistant messages carry reasoning_content, not {}",
                    m.role
                )));
            }
            msg.reasoning_content = Some(r.clone());
            msg.thinking = Some(r.clone());
        }
        if let Some(calls) = &m.tool_calls {
            if m.role != "assistant" {
                return Err(bad(format!(
                    "only assistant messages carry tool_calls, not {}",
                    m.role
                )));
            }
            let mut rendered = Vec::with_capacity(calls.len());
            for (k, c) in calls.iter().enumerate() {
                if c.kind.as_deref().is_some_and(|t| t != "function") {
                    return Err(bad(format!("tool_calls[{k}].type must be \"function\"")));
                }
                if c.id.is_empty() || c.function.name.is_empty() {
                    return Err(bad(format!(
                        "tool_calls[{k}] needs an id and a function.name"
                    )));
                }
                let arguments: Value =
                    serde_json::from_str(&c.function.arguments).map_err(|e| {
                        bad(format!(
                            "tool_calls[{k}].function.arguments is not JSON ({e})"
                        ))
                    })?;
                call_ids.push((c.id.clone(), c.function.name.clone()));
                rendered.push(json!({
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.function.name, "arguments": arguments},
                }));
            }
            msg.tool_calls = Some(rendered);
        }
        if m.role == "tool" {
            let id = m
                .tool_call_id
                .as_deref()
                .ok_or_else(|| bad("a tool message needs tool_call_id".into()))?;
            let Some((_, name)) = call_ids.iter().find(|(c, _)| c == id) else {
                return Err(bad(format!(
                    "tool_call_id '{id}' answers no earlier assistant tool call"
                )));
            };
            msg.tool_call_id = Some(id.to_string());
            msg.name = Some(m.name.clone().unwrap_or_else(|| name.clone()));
        } else if m.tool_call_id.is_some() {
            return Err(bad("only tool messages carry tool_call_id".into()));
        }
        out.push(msg);
    }
    let offered = tools.filter(|t| t.offered());
    if format.native() {
        return Ok((out, offered.map(ToolRequest::template_tools)));
    }
    let mut out = format::write_generic(out);
    if let Some(t) = offered {
        format::describe_generic(&mut out, t);
    }
    Ok((out, None))
}

/// Message content as text: a string, or its text parts joined.
pub fn text_of(content: Option<&Content>) -> String {
    match content {
        None => String::new(),
        Some(Content::Text(t)) => t.clone(),
        Some(Content::Parts(parts)) => parts
            .iter()
            .filter(|p| p.kind == "text")
            .filter_map(|p| p.text.clone())
            .collect::<Vec<_>>()
            .join("\n"),
    }
}
