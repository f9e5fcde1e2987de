//! Calls read back out of a reply. A reply holds calls when, after white
//! space, it begins with its format's opening and parses whole, every call
//! naming an offered function; anything else is text. Streaming holds text
//! back only while it may still turn out to be calls, so streamed and
//! whole replies read the same.

use serde_json::Value;

use super::format::ToolFormat;

/// One call of a reply, as the API returns it.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedCall {
    pub id: String,
    pub name: String,
    /// The arguments as a JSON text (an object).
    pub arguments: String,
}

/// The calls `text` holds in `format`, each naming one of `names`; `None`
/// when it is not (wholly) calls.
pub fn parse_reply(format: &ToolFormat, text: &str, names: &[String]) -> Option<Vec<ParsedCall>> {
    let text = text.trim();
    let key = format.arguments_key();
    let objects: Vec<Value> = match format {
        ToolFormat::Generic => {
            let v: Value = serde_json::from_str(text).ok()?;
            let obj = v.as_object()?;
            if obj.len() != 1 {
                return None;
            }
            obj.get("tool_calls")?.as_array()?.clone()
        }
        ToolFormat::Hermes { open, close } => {
            let mut rest = text;
            let mut calls = Vec::new();
            while !rest.is_empty() {
                let body = rest.strip_prefix(open.text.as_str())?;
                // The last block may be cut by the end of the turn.
                let (inside, after) = body.split_once(close.text.as_str()).unwrap_or((body, ""));
                calls.push(serde_json::from_str(inside.trim()).ok()?);
                rest = after.trim_start();
            }
            calls
        }
        ToolFormat::Llama3 { python_tag } => {
            let body = text
                .strip_prefix(python_tag.text.as_str())
                .unwrap_or(text)
                .trim();
            // Several calls are separated by `;`.
            let mut rest = body;
            let mut calls = Vec::new();
            while !rest.is_empty() {
                let mut values = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
                calls.push(values.next()?.ok()?);
                let after = rest[values.byte_offset()..].trim_start();
                rest = match after.strip_prefix(';') {
                    Some(next) => next.trim_start(),
                    None if after.is_empty() => after,
                    None => return None,
                };
            }
            calls
        }
        ToolFormat::Mistral { marker } => {
            let body = text.strip_prefix(marker.text.as_str())?.trim();
            serde_json::from_str::<Value>(body)
                .ok()?
                .as_array()?
                .clone()
        }
    };
    calls_of(objects, key, names, format)
}

/// Each object as a call: a known `name`, object arguments under `key`.
fn calls_of(
    objects: Vec<Value>,
    key: &str,
    names: &[String],
    format: &ToolFormat,
) -> Option<Vec<ParsedCall>> {
    if objects.is_empty() {
        return None;
    }
    objects
        .into_iter()
        .map(|o| {
            let name = o.get("name")?.as_str()?;
            if !names.iter().any(|n| n == name) {
                return None;
            }
            let args = o.get(key).or_else(|| o.get("arguments"))?;
            if !args.is_object() {
                return None;
            }
            Some(ParsedCall {
                id: call_id(format),
                name: name.to_string(),
                arguments: args.to_string(),
            })
        })
        .collect()
}

/// A fresh call id: Mistral's templates want nine letters and digits.
fn call_id(format: &ToolFormat) -> String {
    const ALNUM: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    match format {
        ToolFormat::Mistral { .. } => (0..9)
            .map(|_| ALNUM[(rand::random::<u32>() as usize) % ALNUM.len()] as char)
            .collect(),
        _ => format!("call_{:016x}", rand::random::<u64>()),
    }
}

/// Whether a reply may still turn out to be calls.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Watch {
    /// Not known yet: text is held back.
    Undecided,
    /// Calls (a required or named choice, or an opening was seen): held
    /// until the end, then parsed.
    Calls,
    /// Plain text: passed through.
    Text,
}

/// Watches one choice's text as it is generated.
#[derive(Debug, Clone)]
pub struct ReplyWatch {
    format: ToolFormat,
    names: Vec<String>,
    state: Watch,
    held: String,
}

impl ReplyWatch {
    /// `required`: the grammar forces calls, so nothing is text.
    pub fn new(format: ToolFormat, names: Vec<String>, required: bool) -> ReplyWatch {
        ReplyWatch {
            format,
            names,
            state: if required {
                Watch::Calls
            } else {
                Watch::Undecided
            },
            held: String::new(),
        }
    }

    /// Takes the text of one token (`id`, for the special markers decoding
    /// leaves out); returns the text that can go to the client now.
    pub fn push(&mut self, id: Option<u32>, text: &str) -> String {
        if let Some(m) = id.and_then(|id| self.format.special_marker(id)) {
            self.held.push_str(m);
        }
        self.held.push_str(text);
        match self.state {
            Watch::Text => std::mem::take(&mut self.held),
            Watch::Calls => String::new(),
            Watch::Undecided => {
                let t = self.held.trim_start();
                if t.is_empty() {
                    return String::new();
                }
                let openings = self.format.openings();
                if openings.iter().any(|o| t.starts_with(o)) {
                    self.state = Watch::Calls;
                    String::new()
                } else if openings.iter().any(|o| o.starts_with(t)) {
                    String::new()
                } else {
                    self.state = Watch::Text;
                    std::mem::take(&mut self.held)
                }
            }
        }
    }

    /// At the end of the reply: the text still held (when it is not calls)
    /// and the calls.
    pub fn finish(&mut self) -> (String, Vec<ParsedCall>) {
        let held = std::mem::take(&mut self.held);
        if self.state != Watch::Text {
            if let Some(calls) = parse_reply(&self.format, &held, &self.names) {
                return (String::new(), calls);
            }
        }
        (held, Vec::new())
    }
}
