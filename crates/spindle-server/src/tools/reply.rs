//! Calls read back out of a reply. A reply holds calls when, after white
//! space, it begins with its format's opening and parses whole, every call
//! naming an offered function; anything else is text. Streaming holds text
//! back only while it may still turn out to be calls, so streamed and
//! whole replies read the same.

use serde_json::{json, Value};

use super::format::{HarmonyMarkers, ToolFormat};

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
        ToolFormat::Harmony(h) => harmony_calls(h, text)?,
    };
    calls_of(objects, key, names, format)
}

/// The calls of a harmony reply, as `{"name", "arguments"}` objects: each
/// message `HEADER<|message|>BODY` ends at `<|call|>`, `<|end|>` or the
/// reply's end (a stop token is not in the text), and the next begins with
/// `<|start|>assistant`. Analysis messages are passed over; any other
/// message (text for the user) makes the reply text.
fn harmony_calls(h: &HarmonyMarkers, text: &str) -> Option<Vec<Value>> {
    let mut calls = Vec::new();
    let mut rest = text;
    loop {
        let (header, after) = rest.split_once(h.message.text.as_str())?;
        let ends = [h.call.text.as_str(), h.end.text.as_str()];
        let (body, next) = ends
            .iter()
            .filter_map(|e| after.find(e).map(|i| (i, e.len())))
            .min()
            .map_or((after, ""), |(i, n)| (&after[..i], &after[i + n..]));
        let (channel, recipient) = harmony_header(h, header);
        match recipient.and_then(|r| r.strip_prefix("functions.")) {
            Some(name) => calls.push(json!({
                "name": name,
                "arguments": serde_json::from_str::<Value>(body.trim()).ok()?,
            })),
            None if channel == Some("analysis") => {}
            None => return None,
        }
        let next = next.trim_start();
        if next.is_empty() {
            return Some(calls);
        }
        rest = next
            .strip_prefix(h.start.text.as_str())?
            .trim_start()
            .strip_prefix("assistant")?;
    }
}

/// A harmony header's channel (`<|channel|>NAME`) and recipient
/// (`to=NAME`), in whichever order they come.
pub(crate) fn harmony_header<'a>(
    h: &HarmonyMarkers,
    header: &'a str,
) -> (Option<&'a str>, Option<&'a str>) {
    let word = |s: &'a str| {
        let end = s
            .find(|c: char| c.is_whitespace() || c == '<')
            .unwrap_or(s.len());
        Some(&s[..end]).filter(|w| !w.is_empty())
    };
    let channel = header
        .split_once(h.channel.text.as_str())
        .and_then(|(_, c)| word(c));
    let recipient = header.split_once("to=").and_then(|(_, r)| word(r));
    (channel, recipient)
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

/// The calls a reply has completed so far, read as it grows: each call is
/// counted once its JSON object closes, before the list around it ends. A
/// reply cut short (by the token limit, or ended early) keeps those calls.
#[derive(Debug, Clone, Default)]
struct CallScan {
    /// Byte offset in the reply where reading goes on.
    pos: usize,
    /// Whether the list's opening has been read.
    opened: bool,
    /// The calls' objects, in order.
    calls: Vec<Value>,
    /// Set once the list closed or the text stopped reading as calls.
    over: bool,
    /// Where the call being written begins (its object not closed yet).
    pending: Option<usize>,
}

/// One literal matched at the start of a text.
enum Lit<'a> {
    /// Matched: the text after it.
    Yes(&'a str),
    /// The text is shorter than the literal and begins it: wait.
    Partial,
    No,
}

fn lit<'a>(text: &'a str, literal: &str) -> Lit<'a> {
    let t = text.trim_start();
    match t.strip_prefix(literal) {
        Some(rest) => Lit::Yes(rest),
        None if literal.starts_with(t) => Lit::Partial,
        None => Lit::No,
    }
}

/// Literals in a row, white space allowed between them.
fn lits<'a>(text: &'a str, literals: &[&str]) -> Lit<'a> {
    let mut rest = text;
    for l in literals {
        match lit(rest, l) {
            Lit::Yes(r) => rest = r,
            other => return other,
        }
    }
    Lit::Yes(rest)
}

impl CallScan {
    /// The call being written when the reply was cut off, as far as it
    /// got: its name, once written whole, and its arguments' text so far
    /// (not valid JSON), as OpenAI returns a call cut by the token limit.
    fn unfinished(&self, format: &ToolFormat, text: &str) -> Option<(String, String)> {
        let body = &text[self.pending?..];
        let Lit::Yes(rest) = lits(body, &["{", "\"name\"", ":"]) else {
            return None;
        };
        let rest = rest.trim_start();
        let mut values = serde_json::Deserializer::from_str(rest).into_iter::<String>();
        let name = values.next()?.ok()?;
        let rest = &rest[values.byte_offset()..];
        let key = format!("\"{}\"", format.arguments_key());
        let Lit::Yes(args) = lits(rest, &[",", &key, ":"]) else {
            return None;
        };
        Some((name, args.trim_start().to_string()))
    }

    /// Reads on in `text` (the whole reply so far, which only grows).
    fn advance(&mut self, format: &ToolFormat, text: &str) {
        while !self.over {
            let rest = &text[self.pos..];
            // What comes before the next call: the list's opening, or the
            // separator after the call before.
            let before: Vec<&str> = match (format, self.opened) {
                (ToolFormat::Generic, false) => vec!["{", "\"tool_calls\"", ":", "["],
                (ToolFormat::Mistral { marker }, false) => vec![marker.text.as_str(), "["],
                (ToolFormat::Llama3 { python_tag }, false) => match lit(rest, &python_tag.text) {
                    Lit::Partial => return,
                    _ => vec![python_tag.text.as_str()],
                },
                (ToolFormat::Hermes { open, .. }, false) => vec![open.text.as_str()],
                (ToolFormat::Harmony(h), _) => return self.advance_harmony(h, text),
                (ToolFormat::Generic | ToolFormat::Mistral { .. }, true) => {
                    if let Lit::Yes(_) = lit(rest, "]") {
                        self.over = true;
                        return;
                    }
                    vec![","]
                }
                (ToolFormat::Llama3 { .. }, true) => vec![";"],
                (ToolFormat::Hermes { open, close }, true) => {
                    vec![close.text.as_str(), open.text.as_str()]
                }
            };
            let body = match (format, self.opened, lits(rest, &before)) {
                (_, _, Lit::Yes(body)) => body,
                (_, _, Lit::Partial) => return,
                // The Llama 3 tag is optional before the first call.
                (ToolFormat::Llama3 { .. }, false, Lit::No) => rest,
                (_, _, Lit::No) => {
                    self.over = true;
                    return;
                }
            };
            let start = text.len() - body.trim_start().len();
            let mut values =
                serde_json::Deserializer::from_str(&text[start..]).into_iter::<Value>();
            match values.next() {
                Some(Ok(v)) if v.is_object() => {
                    self.calls.push(v);
                    self.pos = start + values.byte_offset();
                    self.opened = true;
                    self.pending = None;
                }
                Some(Err(e)) if e.is_eof() => {
                    self.pending = Some(start);
                    return;
                }
                None => return,
                Some(_) => {
                    self.over = true;
                    return;
                }
            }
        }
    }

    /// [`CallScan::advance`] for harmony: a call is its header (up to
    /// `<|message|>`, the name in it) and its arguments; `<|call|>` ends the
    /// turn, so one call is all a reply holds.
    fn advance_harmony(&mut self, h: &HarmonyMarkers, text: &str) {
        if self.over {
            return;
        }
        if self.opened {
            // After the call only its `<|call|>` may follow.
            let rest = text[self.pos..].trim_start();
            if !h.call.text.starts_with(rest) && !rest.starts_with(h.call.text.as_str()) {
                self.over = true;
            }
            return;
        }
        let rest = &text[self.pos..];
        let Some((header, _)) = rest.split_once(h.message.text.as_str()) else {
            return;
        };
        let Some(name) = harmony_header(h, header)
            .1
            .and_then(|r| r.strip_prefix("functions."))
        else {
            self.over = true;
            return;
        };
        let start = self.pos + header.len() + h.message.text.len();
        let args = text[start..].trim_start();
        let start = text.len() - args.len();
        let mut values = serde_json::Deserializer::from_str(args).into_iter::<Value>();
        match values.next() {
            Some(Ok(v)) if v.is_object() => {
                self.calls.push(json!({"name": name, "arguments": v}));
                self.pos = start + values.byte_offset();
                self.opened = true;
                self.pending = None;
            }
            // The arguments are still being written.
            Some(Err(e)) if e.is_eof() => {}
            None => {}
            Some(_) => self.over = true,
        }
    }
}

/// How a reply ended, as [`ReplyWatch::finish`] reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplyEnd {
    /// Text still held back (when the reply is not calls).
    pub text: String,
    pub calls: Vec<ParsedCall>,
    /// The calls are those completed before the reply was cut short (its
    /// last call unfinished, or a repeated call left out).
    pub cut: bool,
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
    scan: CallScan,
    /// A completed call repeated an earlier one word for word.
    repeated: bool,
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
            scan: CallScan::default(),
            repeated: false,
        }
    }

    /// Whether the reply should end now: a call repeated an earlier call of
    /// the same reply, name and arguments alike. A small model at low
    /// temperature, free to add calls, tends to cycle through the same
    /// calls until the token limit; the first repeat is where that shows.
    /// The reply then holds the calls before it.
    pub fn ended(&self) -> bool {
        self.repeated
    }

    /// Reads the calls completed so far; notes a repeat.
    fn read_calls(&mut self) {
        if self.state != Watch::Calls || self.repeated {
            return;
        }
        let before = self.scan.calls.len();
        self.scan.advance(&self.format, &self.held);
        for i in before..self.scan.calls.len() {
            if self.scan.calls[..i].contains(&self.scan.calls[i]) {
                self.scan.calls.truncate(i);
                self.repeated = true;
                return;
            }
        }
    }

    /// Takes the text of one token (`id`, for the special markers decoding
    /// leaves out); returns the text that can go to the client now.
    pub fn push(&mut self, id: Option<u32>, text: &str) -> String {
        let text_plain = self.state == Watch::Text && self.format.marks_text();
        if let Some(m) = id.and_then(|id| self.format.special_marker(id)) {
            if !text_plain {
                self.held.push_str(m);
            }
        }
        self.held.push_str(text);
        match self.state {
            Watch::Text => std::mem::take(&mut self.held),
            Watch::Calls => {
                self.read_calls();
                String::new()
            }
            Watch::Undecided => {
                let t = self.held.trim_start();
                if t.is_empty() {
                    return String::new();
                }
                let openings = self.format.openings();
                if openings.iter().any(|o| t.starts_with(o)) {
                    self.state = Watch::Calls;
                    self.read_calls();
                    String::new()
                } else if openings.iter().any(|o| o.starts_with(t)) {
                    String::new()
                } else {
                    self.state = Watch::Text;
                    let held = std::mem::take(&mut self.held);
                    self.without_markers(&held)
                }
            }
        }
    }

    /// Held text that turned out not to be calls, as decoding gives it
    /// where the format's markers frame text too ([`ToolFormat::marks_text`]).
    fn without_markers(&self, text: &str) -> String {
        if self.format.marks_text() {
            self.format.without_markers(text)
        } else {
            text.to_string()
        }
    }

    /// At the end of the reply: the text still held (when it is not calls)
    /// and the calls: the whole reply's, or, when it was cut short, those
    /// it completed.
    /// `cut_off`: generation stopped at the token limit, so an unfinished
    /// last call is returned as far as it got.
    pub fn finish(&mut self, cut_off: bool) -> ReplyEnd {
        let held = std::mem::take(&mut self.held);
        if self.state != Watch::Text {
            if !self.repeated {
                if let Some(calls) = parse_reply(&self.format, &held, &self.names) {
                    return ReplyEnd {
                        text: String::new(),
                        calls,
                        cut: false,
                    };
                }
            }
            // Salvaged only from a reply that ran out while it still read
            // as calls (not one whose list closed and then went wrong).
            let objects = std::mem::take(&mut self.scan.calls);
            let salvage = self.repeated || !self.scan.over;
            let key = self.format.arguments_key();
            let mut calls = salvage
                .then(|| calls_of(objects, key, &self.names, &self.format))
                .flatten()
                .unwrap_or_default();
            let unfinished = (cut_off && salvage && !self.repeated)
                .then(|| self.scan.unfinished(&self.format, &held))
                .flatten()
                .filter(|(name, _)| self.names.contains(name));
            if let Some((name, arguments)) = unfinished {
                calls.push(ParsedCall {
                    id: call_id(&self.format),
                    name,
                    arguments,
                });
            }
            if !calls.is_empty() {
                return ReplyEnd {
                    text: String::new(),
                    calls,
                    cut: true,
                };
            }
        }
        ReplyEnd {
            text: self.without_markers(&held),
            calls: Vec::new(),
            cut: false,
        }
    }
}
