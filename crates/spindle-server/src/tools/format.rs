//! How a model writes tool calls: the format its chat template teaches
//! (Hermes/Qwen `<tool_call>` blocks, Llama 3.x JSON calls, Mistral
//! `[TOOL_CALLS]`, gpt-oss's harmony messages to `functions.NAME`), or
//! Spindle's generic JSON form for templates without tools, and the grammar
//! that makes a required call valid in that format.

use serde_json::{json, Value};
use spindle_engine::constraint::{close_objects, Grammar};
use spindle_model::chat_template::{ChatMessage, ChatTemplate};
use spindle_model::tokenizer::Tokenizer;

use super::{Function, ToolChoice, ToolRequest};

/// A fixed piece of a call format (`<tool_call>`, `[TOOL_CALLS]`): a
/// special token where the vocabulary has one (special tokens are left out
/// of decoded text, so the reply reader re-inserts it by id).
#[derive(Debug, Clone, PartialEq)]
pub struct Marker {
    pub text: String,
    pub special_id: Option<u32>,
}

impl Marker {
    fn new(tokenizer: &Tokenizer, text: &str) -> Marker {
        let special_id = tokenizer
            .token_to_id(text)
            .filter(|&id| tokenizer.is_special(id));
        Marker {
            text: text.to_string(),
            special_id,
        }
    }

    /// The marker in llguidance's Lark: the token by id, or the literal text.
    fn lark(&self) -> String {
        match self.special_id {
            Some(id) => format!("<[{id}]>"),
            None => serde_json::to_string(&self.text).expect("a string serializes"),
        }
    }
}

/// The special tokens that frame gpt-oss's messages.
#[derive(Debug, Clone, PartialEq)]
pub struct HarmonyMarkers {
    pub start: Marker,
    pub channel: Marker,
    pub constrain: Marker,
    pub message: Marker,
    pub call: Marker,
    pub end: Marker,
}

impl HarmonyMarkers {
    fn new(tokenizer: &Tokenizer) -> HarmonyMarkers {
        let m = |text| Marker::new(tokenizer, text);
        HarmonyMarkers {
            start: m("<|start|>"),
            channel: m("<|channel|>"),
            constrain: m("<|constrain|>"),
            message: m("<|message|>"),
            call: m("<|call|>"),
            end: m("<|end|>"),
        }
    }

    /// Every marker, in the order they appear in a message.
    pub fn all(&self) -> [&Marker; 6] {
        [
            &self.start,
            &self.channel,
            &self.constrain,
            &self.message,
            &self.call,
            &self.end,
        ]
    }

    /// The markers, when the vocabulary has those that frame a message as
    /// special tokens (gpt-oss's).
    pub fn of(tokenizer: &Tokenizer) -> Option<HarmonyMarkers> {
        let h = HarmonyMarkers::new(tokenizer);
        [&h.start, &h.channel, &h.message, &h.end]
            .iter()
            .all(|m| m.special_id.is_some())
            .then_some(h)
    }
}

/// The call format of one model.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolFormat {
    /// Hermes and Qwen: `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`,
    /// one block per call.
    Hermes { open: Marker, close: Marker },
    /// Llama 3.x: one `{"name": ..., "parameters": {...}}`, perhaps after
    /// `<|python_tag|>`.
    Llama3 { python_tag: Marker },
    /// Mistral: `[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]`.
    Mistral { marker: Marker },
    /// gpt-oss (harmony): a message to the function, its name in the
    /// header and its arguments the body:
    /// `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>`
    /// as the model writes it, or `to=functions.NAME<|channel|>commentary
    /// json<|message|>{...}<|call|>` as the template writes past calls (after
    /// `<|start|>assistant`). Analysis messages before the call are dropped.
    Harmony(Box<HarmonyMarkers>),
    /// Spindle's own, for templates without tools: the reply is only
    /// `{"tool_calls": [{"name": ..., "arguments": {...}}, ...]}`.
    Generic,
}

impl ToolFormat {
    /// The format `template` teaches: recognised by the markers it writes
    /// when it receives `tools`; [`ToolFormat::Generic`] when it takes no
    /// tools or writes none of them.
    pub fn of(template: &ChatTemplate, tokenizer: &Tokenizer) -> ToolFormat {
        if !template.takes_tools() {
            return ToolFormat::Generic;
        }
        let src = template.source();
        if src.contains("<tool_call>") {
            ToolFormat::Hermes {
                open: Marker::new(tokenizer, "<tool_call>"),
                close: Marker::new(tokenizer, "</tool_call>"),
            }
        } else if src.contains("<|channel|>") && src.contains("<|call|>") {
            ToolFormat::Harmony(Box::new(HarmonyMarkers::new(tokenizer)))
        } else if src.contains("[TOOL_CALLS]") {
            ToolFormat::Mistral {
                marker: Marker::new(tokenizer, "[TOOL_CALLS]"),
            }
        } else if src.contains("<|python_tag|>") || src.contains("<|start_header_id|>") {
            ToolFormat::Llama3 {
                python_tag: Marker::new(tokenizer, "<|python_tag|>"),
            }
        } else {
            ToolFormat::Generic
        }
    }

    /// Whether the chat template itself describes the tools and renders
    /// calls and results.
    pub fn native(&self) -> bool {
        !matches!(self, ToolFormat::Generic)
    }

    pub fn name(&self) -> &'static str {
        match self {
            ToolFormat::Hermes { .. } => "hermes",
            ToolFormat::Llama3 { .. } => "llama3-json",
            ToolFormat::Mistral { .. } => "mistral",
            ToolFormat::Harmony(_) => "harmony",
            ToolFormat::Generic => "generic-json",
        }
    }

    /// The text of marker token `id`, which decoding leaves out of the text
    /// (a special token); `None` for any other token.
    pub fn special_marker(&self, id: u32) -> Option<&str> {
        self.markers()
            .into_iter()
            .find(|m| m.special_id == Some(id))
            .map(|m| m.text.as_str())
    }

    fn markers(&self) -> Vec<&Marker> {
        match self {
            ToolFormat::Hermes { open, close } => vec![open, close],
            ToolFormat::Llama3 { python_tag } => vec![python_tag],
            ToolFormat::Mistral { marker } => vec![marker],
            ToolFormat::Harmony(h) => h.all().to_vec(),
            ToolFormat::Generic => Vec::new(),
        }
    }

    /// `text` less the special markers put back by id, as decoding gives it.
    pub fn without_markers(&self, text: &str) -> String {
        let mut out = text.to_string();
        for m in self.markers() {
            if m.special_id.is_some() {
                out = out.replace(m.text.as_str(), "");
            }
        }
        out
    }

    /// How a reply that holds calls begins (after white space).
    pub fn openings(&self) -> Vec<&str> {
        match self {
            ToolFormat::Hermes { open, .. } => vec![open.text.as_str()],
            ToolFormat::Llama3 { python_tag } => vec![python_tag.text.as_str(), "{"],
            ToolFormat::Mistral { marker } => vec![marker.text.as_str()],
            // Every harmony message opens with `<|channel|>`: only one to a
            // function is held back as a call.
            ToolFormat::Harmony(_) => vec![HARMONY_CALL, "to=functions."],
            ToolFormat::Generic => vec!["{"],
        }
    }

    /// Whether the markers frame text replies too (harmony's channels), so
    /// that text must be read without them, as decoding leaves them out.
    pub fn marks_text(&self) -> bool {
        matches!(self, ToolFormat::Harmony(_))
    }

    /// The key of a call's arguments in this format.
    pub fn arguments_key(&self) -> &'static str {
        match self {
            ToolFormat::Llama3 { .. } => "parameters",
            _ => "arguments",
        }
    }

    /// A grammar whose every sentence is a valid call (or, with `several`,
    /// one or more calls) of one of `functions`, arguments matching the
    /// function's schema.
    pub fn call_grammar(&self, functions: &[&Function], several: bool) -> Grammar {
        let call = call_schema(functions, self.arguments_key());
        let list = |call: Value| {
            let mut list = json!({"type": "array", "items": call, "minItems": 1});
            if !several {
                list["maxItems"] = json!(1);
            }
            list
        };
        match self {
            ToolFormat::Generic => Grammar::JsonSchema(json!({
                "type": "object",
                "properties": {"tool_calls": list(call)},
                "required": ["tool_calls"],
                "additionalProperties": false,
            })),
            ToolFormat::Llama3 { .. } => Grammar::JsonSchema(call),
            ToolFormat::Hermes { open, close } => {
                let block = format!(
                    "call: {} \"\\n\" %json {} \"\\n\" {}",
                    open.lark(),
                    lark_json(call),
                    close.lark()
                );
                let start = if several {
                    "start: call (\"\\n\" call)*"
                } else {
                    "start: call"
                };
                Grammar::Lark(format!("{start}\n{block}\n"))
            }
            ToolFormat::Mistral { marker } => Grammar::Lark(format!(
                "start: {} \" \" %json {}\n",
                marker.lark(),
                lark_json(list(call))
            )),
            // One message per call (`<|call|>` ends the turn): the name in
            // the header, the schema of that function's arguments after it.
            ToolFormat::Harmony(h) => {
                let calls: Vec<String> = functions
                    .iter()
                    .map(|f| {
                        format!(
                            "{} {} {} \"json\" {} %json {}",
                            h.channel.lark(),
                            serde_json::to_string(&format!("commentary to=functions.{} ", f.name))
                                .expect("a string serializes"),
                            h.constrain.lark(),
                            h.message.lark(),
                            lark_json(close_objects(f.parameters.clone()))
                        )
                    })
                    .collect();
                Grammar::Lark(format!("start: {}\n", calls.join(" | ")))
            }
        }
    }
}

/// How a model's harmony call opens.
const HARMONY_CALL: &str = "<|channel|>commentary to=functions.";

/// One call of any of `functions`: `{"name": <const>, <key>: <schema>}`.
fn call_schema(functions: &[&Function], key: &str) -> Value {
    let one = |f: &Function| {
        json!({
            "type": "object",
            "properties": {"name": {"const": f.name}, key: close_objects(f.parameters.clone())},
            "required": ["name", key],
            "additionalProperties": false,
        })
    };
    match functions {
        [f] => one(f),
        _ => json!({"anyOf": functions.iter().map(|f| one(f)).collect::<Vec<_>>()}),
    }
}

/// A schema for Lark's `%json`, laid out as top-level schemas are (one line,
/// `json.dumps` spacing), so punctuation and keys are forced tokens.
fn lark_json(mut schema: Value) -> String {
    schema["x-guidance"] = json!({
        "whitespace_flexible": false,
        "item_separator": ", ",
        "key_separator": ": ",
    });
    schema.to_string()
}

/// JSON as Python's `json.dumps` writes it (`", "` and `": "`): the layout
/// the generic grammar produces, so earlier calls in the conversation look
/// like the ones the model is asked to write.
pub fn dumps(v: &Value) -> String {
    match v {
        Value::Array(items) => {
            let parts: Vec<String> = items.iter().map(dumps).collect();
            format!("[{}]", parts.join(", "))
        }
        Value::Object(map) => {
            let parts: Vec<String> = map
                .iter()
                .map(|(k, v)| format!("{}: {}", Value::String(k.clone()), dumps(v)))
                .collect();
            format!("{{{}}}", parts.join(", "))
        }
        scalar => scalar.to_string(),
    }
}

/// Calls and results written into ordinary turns for a template without
/// tools: an assistant turn's calls as its generic JSON, and each run of
/// `tool` results as one user turn.
pub(super) fn write_generic(messages: Vec<ChatMessage>) -> Vec<ChatMessage> {
    let mut out: Vec<ChatMessage> = Vec::with_capacity(messages.len());
    let mut results: Vec<String> = Vec::new();
    let flush = |out: &mut Vec<ChatMessage>, results: &mut Vec<String>| {
        if !results.is_empty() {
            let text = format!("Function results:\n{}", results.join("\n"));
            out.push(ChatMessage::new("user", text));
            results.clear();
        }
    };
    for mut m in messages {
        if m.role == "tool" {
            let name = m.name.take().unwrap_or_default();
            results.push(dumps(&json!({"name": name, "content": m.content})));
            continue;
        }
        flush(&mut out, &mut results);
        if let Some(calls) = m.tool_calls.take() {
            let calls: Vec<Value> = calls
                .iter()
                .map(|c| {
                    json!({
                        "name": c.pointer("/function/name").cloned().unwrap_or(Value::Null),
                        "arguments": c.pointer("/function/arguments").cloned().unwrap_or(json!({})),
                    })
                })
                .collect();
            let text = dumps(&json!({ "tool_calls": calls }));
            m.content = if m.content.trim().is_empty() {
                text
            } else {
                format!("{}\n{text}", m.content.trim_end())
            };
        }
        out.push(m);
    }
    flush(&mut out, &mut results);
    out
}

/// Describes the functions and the generic call form in the system turn
/// (added first when the conversation has none).
pub(super) fn describe_generic(messages: &mut Vec<ChatMessage>, tools: &ToolRequest) {
    let mut text = String::from(
        "You can call functions. Each is given as JSON, with the JSON schema of its arguments:\n",
    );
    for f in &tools.functions {
        let mut d = json!({"name": f.name});
        if let Some(desc) = &f.description {
            d["description"] = json!(desc);
        }
        d["parameters"] = f.parameters.clone();
        text.push_str(&dumps(&d));
        text.push('\n');
    }
    text.push_str(
        "To call functions, reply with only this JSON and nothing else: \
         {\"tool_calls\": [{\"name\": \"<function name>\", \"arguments\": {<its arguments>}}]}",
    );
    match &tools.choice {
        ToolChoice::Required => text.push_str("\nCall at least one function now."),
        ToolChoice::Named(n) => text.push_str(&format!("\nCall the function {n} now.")),
        ToolChoice::Auto | ToolChoice::None => {
            text.push_str("\nIf no function is needed, answer in plain text.")
        }
    }
    match messages.first_mut() {
        Some(m) if m.role == "system" => {
            m.content = format!("{}\n\n{text}", m.content.trim_end());
        }
        _ => messages.insert(0, ChatMessage::new("system", text)),
    }
}
