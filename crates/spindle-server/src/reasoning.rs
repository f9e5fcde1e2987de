//! A reasoning model's thinking, apart from its answer: chat replies carry
//! it as `reasoning_content` (whole and streamed, as llama.cpp's server and
//! DeepSeek's API name it) and `content` keeps only the answer.
//!
//! Two ways models write it:
//! - a `<think>...</think>` block at the start of the reply (Qwen3,
//!   DeepSeek-R1, QwQ); a template whose generation prompt already opened
//!   the block (`...<think>\n`) starts the reply inside it;
//! - gpt-oss's harmony messages: `<|channel|>analysis<|message|>...<|end|>`
//!   is thinking, `<|start|>assistant<|channel|>final<|message|>...` the
//!   answer, and a message to `functions.NAME` a call, passed on (markers
//!   and all) to the tool-call reader.
//!
//! The split reads the reply token by token and holds back only what may
//! still be a tag, so streamed and whole replies split the same way.
//! Newlines around the thinking are dropped as the templates drop them
//! when they render a past turn (`reasoning_content.strip('\n')`, the
//! answer's leading newlines).

use std::sync::Arc;

use spindle_engine::constraint::Grammar;
use spindle_model::tokenizer::Tokenizer;

use crate::tools::{HarmonyMarkers, Marker};

/// A marker as a Lark item: its token where it is special, else its text.
fn lit(m: &Marker) -> String {
    match m.special_id {
        Some(id) => format!("<[{id}]>"),
        None => serde_json::to_string(&m.text).expect("a string serializes"),
    }
}

/// How this model writes its thinking.
#[derive(Debug, Clone, PartialEq)]
pub enum ReasoningFormat {
    Think { open: Marker, close: Marker },
    Harmony(Box<HarmonyMarkers>),
}

impl ReasoningFormat {
    /// The format the vocabulary has the tokens of: harmony's markers, or
    /// `<think>` and `</think>`; `None` for models that do not reason apart.
    pub fn of(tokenizer: &Tokenizer) -> Option<ReasoningFormat> {
        if let Some(h) = HarmonyMarkers::of(tokenizer) {
            return Some(ReasoningFormat::Harmony(Box::new(h)));
        }
        let open = tokenizer.token_to_id("<think>")?;
        let close = tokenizer.token_to_id("</think>")?;
        let marker = |text: &str, id: u32| Marker {
            text: text.to_string(),
            special_id: tokenizer.is_special(id).then_some(id),
        };
        Some(ReasoningFormat::Think {
            open: marker("<think>", open),
            close: marker("</think>", close),
        })
    }

    pub fn name(&self) -> &'static str {
        match self {
            ReasoningFormat::Think { .. } => "think-tags",
            ReasoningFormat::Harmony(_) => "harmony",
        }
    }

    /// Whether `prompt` (ids) ends in an open `<think>`, so that the reply
    /// starts inside the thinking (DeepSeek-R1's template opens it).
    pub fn opened_by(&self, tokenizer: &Tokenizer, prompt: &[u32]) -> bool {
        let ReasoningFormat::Think { open, .. } = self else {
            return false;
        };
        let last = prompt.iter().rev().find(|&&id| {
            tokenizer
                .token_to_piece(id)
                .is_some_and(|p| !p.trim().is_empty())
        });
        last.is_some() && last.copied() == tokenizer.token_to_id(&open.text)
    }

    /// A Lark grammar for a reply that may think first and then writes
    /// `json` (a `%json` item): `<think>...</think>` then the JSON, or
    /// the JSON alone (the thinking only, then the JSON, when the prompt
    /// `opened` the block); harmony: an analysis message, then the final
    /// message's JSON, or the final message alone. So `response_format`
    /// leaves a reasoning model its thinking, as vLLM does.
    pub fn json_after_thinking(&self, json: &str, opened: bool) -> String {
        let (before, rules) = self.thinking(opened);
        let answer = match self {
            ReasoningFormat::Think { .. } => "json".to_string(),
            ReasoningFormat::Harmony(h) => {
                format!("{} \"final\" {} json", lit(&h.channel), lit(&h.message))
            }
        };
        format!("start: {before} {answer}\n{rules}json: {json}\n")
    }

    /// [`ReasoningFormat::json_after_thinking`] for a required tool call:
    /// `calls` is the body of the call grammar's `start` rule and the rules
    /// after it (a harmony call is a message of its own, after the analysis
    /// message).
    pub fn calls_after_thinking(&self, calls: &str, opened: bool) -> String {
        let (before, rules) = self.thinking(opened);
        format!("start: {before} calls\n{rules}calls:{calls}")
    }

    /// `grammar` (a call's, or a JSON reply's) wrapped so that the reply may
    /// think first: a Lark grammar through
    /// [`ReasoningFormat::calls_after_thinking`], a JSON one through
    /// [`ReasoningFormat::json_after_thinking`]; `None` for one that cannot
    /// be composed (a regex, a Lark grammar not led by its `start` rule).
    pub fn after_thinking(&self, grammar: &Grammar, opened: bool) -> Option<Grammar> {
        let lark = match grammar {
            Grammar::Lark(l) => self.calls_after_thinking(l.strip_prefix("start:")?, opened),
            json => self.json_after_thinking(&json.json_lark()?, opened),
        };
        Some(Grammar::Lark(lark))
    }

    /// What may come before the answer in `start`, and the rules it names.
    fn thinking(&self, opened: bool) -> (String, String) {
        match self {
            ReasoningFormat::Think { open, close } => {
                // Thinking text up to the closing tag: a lazy match ended by
                // the tag's text, or free text then the tag's token.
                let thought = match close.special_id {
                    Some(_) => format!("thought: /(?s:.*)/ {}", lit(close)),
                    None => format!("thought[suffix={}]: /(?s:.*)/", lit(close)),
                };
                let before = if opened {
                    "thought SP?".to_string()
                } else {
                    format!("({} thought SP?)?", lit(open))
                };
                (before, format!("{thought}\nSP: /[ \\t\\r\\n]+/\n"))
            }
            ReasoningFormat::Harmony(h) => (
                "analysis?".to_string(),
                format!(
                    "analysis: {ch} \"analysis\" {msg} /(?s:.*)/ {end} {st} \"assistant\"\n",
                    ch = lit(&h.channel),
                    msg = lit(&h.message),
                    end = lit(&h.end),
                    st = lit(&h.start),
                ),
            ),
        }
    }

    /// A split for one reply to `prompt` (its ids: a prompt that ends in an
    /// open `<think>` starts the reply inside the thinking, unless the
    /// reply is `constrained` by a grammar, which decides what it is).
    /// `calls`: the reply goes on to the tool-call reader, which reads
    /// harmony's calls with their markers.
    pub fn split(
        &self,
        tokenizer: &Tokenizer,
        prompt: &[u32],
        calls: bool,
        constrained: bool,
    ) -> ReasoningSplit {
        let state = match self {
            ReasoningFormat::Think { .. } if !constrained && self.opened_by(tokenizer, prompt) => {
                State::Thinking
            }
            ReasoningFormat::Think { .. } => State::Start,
            ReasoningFormat::Harmony(_) => State::Header,
        };
        ReasoningSplit {
            format: Arc::new(self.clone()),
            state,
            held: String::new(),
            calls,
            reasoning_begun: false,
            answer_begun: false,
        }
    }
}

/// What one token of the reply adds to each part.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Split {
    pub reasoning: String,
    pub content: String,
    /// The token, when its text went to `content` whole (the tool-call
    /// reader puts back special markers by id).
    pub content_id: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum State {
    /// `<think>`: nothing but white space or the start of the tag yet.
    Start,
    /// Inside the thinking (`<think>`), or a harmony analysis message.
    Thinking,
    /// The answer: after `</think>`, or a harmony message to the user.
    Answer,
    /// Harmony: a message's header, up to `<|message|>` (in `held`).
    Header,
    /// Harmony: a call's body, passed on to the call reader.
    Call,
    /// Harmony: text outside any message frame (a model that does not
    /// write harmony): all of it is the answer.
    Unframed,
}

/// Longest harmony header before the text is taken as unframed.
const MAX_HEADER: usize = 256;

/// Splits one reply (see the module's docs).
#[derive(Debug, Clone)]
pub struct ReasoningSplit {
    /// Shared by the choices' splits, and read on every token.
    format: Arc<ReasoningFormat>,
    state: State,
    /// Text that may still be a tag (or a harmony header).
    held: String,
    calls: bool,
    /// Whether thinking text has been given out (its leading newlines are
    /// dropped), and likewise the answer's.
    reasoning_begun: bool,
    answer_begun: bool,
}

impl ReasoningSplit {
    /// Reads token `id` (`None` for text held back by the stop-string cut)
    /// whose text is `text`.
    pub fn push(&mut self, id: Option<u32>, text: &str) -> Split {
        let mut out = Split::default();
        let format = Arc::clone(&self.format);
        match &*format {
            ReasoningFormat::Think { open, close } => self.think(open, close, id, text, &mut out),
            ReasoningFormat::Harmony(h) => self.harmony(h, id, text, &mut out),
        }
        out
    }

    /// The reply ended: what was held back, where it belongs (an open
    /// `<think>` block is all thinking).
    pub fn finish(&mut self) -> Split {
        let mut out = Split::default();
        let held = std::mem::take(&mut self.held);
        match self.state {
            State::Thinking => self.reason(held.trim_end_matches('\n'), &mut out),
            State::Header => {
                // A header never completed: the text in it, without markers.
                if let ReasoningFormat::Harmony(h) = &*self.format {
                    let text = without_harmony_markers(h, &held);
                    self.answer(&text, &mut out);
                }
            }
            State::Call => out.content = held,
            _ => self.answer(&held, &mut out),
        }
        out
    }

    fn reason(&mut self, text: &str, out: &mut Split) {
        append_part(&mut self.reasoning_begun, text, &mut out.reasoning);
    }

    fn answer(&mut self, text: &str, out: &mut Split) {
        append_part(&mut self.answer_begun, text, &mut out.content);
    }

    fn think(
        &mut self,
        open: &Marker,
        close: &Marker,
        id: Option<u32>,
        text: &str,
        out: &mut Split,
    ) {
        match self.state {
            State::Start => {
                if id.is_some() && id == open.special_id {
                    self.state = State::Thinking;
                    self.held.clear();
                    return;
                }
                self.held.push_str(text);
                let t = self.held.trim_start();
                if let Some(rest) = t.strip_prefix(open.text.as_str()) {
                    let rest = rest.to_string();
                    self.held.clear();
                    self.state = State::Thinking;
                    self.think(open, close, None, &rest, out);
                } else if t.is_empty() && text.is_empty() && id.is_some() {
                    // A special token (a tool-call marker, say) opens the
                    // reply: it is the answer.
                    self.state = State::Answer;
                    self.held.clear();
                    out.content_id = id;
                } else if t.is_empty() || open.text.starts_with(t) {
                    // White space, or the tag's beginning: wait.
                } else {
                    self.state = State::Answer;
                    let held = std::mem::take(&mut self.held);
                    // The whole reply so far is this token's text and white
                    // space: the reader may take the id with it.
                    if held == text {
                        out.content_id = id;
                    }
                    self.answer(&held, out);
                }
            }
            State::Thinking => {
                if id.is_some() && id == close.special_id {
                    let held = std::mem::take(&mut self.held);
                    self.reason(held.trim_end_matches('\n'), out);
                    self.state = State::Answer;
                    return;
                }
                self.held.push_str(text);
                if let Some(at) = self.held.find(close.text.as_str()) {
                    let rest = self.held[at + close.text.len()..].to_string();
                    let before = self.held[..at].trim_end_matches('\n').to_string();
                    self.held.clear();
                    self.reason(&before, out);
                    self.state = State::Answer;
                    self.answer(&rest, out);
                    return;
                }
                // Keep what may be the start of the closing tag, and
                // newlines that may come just before it.
                let keep = tail_that_may_begin(&self.held, &close.text);
                let cut = self.held[..self.held.len() - keep]
                    .trim_end_matches('\n')
                    .len();
                let give: String = self.held.drain(..cut).collect();
                self.reason(&give, out);
            }
            State::Answer => {
                if !self.answer_begun && text.is_empty() {
                    out.content_id = id;
                    return;
                }
                let before = self.answer_begun;
                self.answer(text, out);
                if before || out.content == text {
                    out.content_id = id;
                }
            }
            _ => self.answer(text, out),
        }
    }

    fn harmony(&mut self, h: &HarmonyMarkers, id: Option<u32>, text: &str, out: &mut Split) {
        let is = |m: &Marker| id.is_some() && id == m.special_id;
        match self.state {
            State::Header => {
                if is(&h.message) {
                    let header = std::mem::take(&mut self.held);
                    let header = strip_role(h, &header);
                    let (channel, recipient) = crate::tools::harmony_header(h, header);
                    self.state = if recipient.is_some_and(|r| r.starts_with("functions.")) {
                        if self.calls {
                            out.content = format!("{header}{}", h.message.text);
                        }
                        State::Call
                    } else if channel == Some("analysis") {
                        State::Thinking
                    } else {
                        State::Answer
                    };
                    return;
                }
                match marker_text(h, id) {
                    Some(m) => self.held.push_str(m),
                    None => self.held.push_str(text),
                }
                let framed = {
                    let t = strip_role(h, &self.held);
                    t.is_empty()
                        || t.starts_with(h.channel.text.as_str())
                        || t.starts_with("to=")
                        || h.channel.text.starts_with(t)
                        || "to=".starts_with(t)
                };
                if !framed || self.held.len() > MAX_HEADER {
                    self.state = State::Unframed;
                    let held = std::mem::take(&mut self.held);
                    let text = without_harmony_markers(h, &held);
                    self.answer(&text, out);
                }
            }
            State::Thinking | State::Answer | State::Call => {
                if is(&h.end) || is(&h.call) || is(&h.start) {
                    // The message ended; a new one may follow.
                    if self.state == State::Call && self.calls && is(&h.call) {
                        out.content.push_str(&h.call.text);
                    }
                    self.state = State::Header;
                    if is(&h.start) {
                        self.held.push_str(&h.start.text);
                    }
                    return;
                }
                match self.state {
                    State::Thinking => self.reason(text, out),
                    State::Answer => self.answer(text, out),
                    // A call's arguments (without the reader, as text).
                    _ => out.content.push_str(text),
                }
            }
            _ => self.answer(text, out),
        }
    }
}

/// Appends `text` to a part of the reply (`begun`: whether the part has
/// text yet; its leading newlines are dropped until it has).
fn append_part(begun: &mut bool, text: &str, part: &mut String) {
    let text = if *begun {
        text
    } else {
        text.trim_start_matches('\n')
    };
    if !text.is_empty() {
        *begun = true;
        part.push_str(text);
    }
}

/// The text of harmony marker `id`, if it is one.
fn marker_text(h: &HarmonyMarkers, id: Option<u32>) -> Option<&str> {
    h.all()
        .into_iter()
        .find(|m| id.is_some() && m.special_id == id)
        .map(|m| m.text.as_str())
}

/// A header less its opening `<|start|>assistant`.
fn strip_role<'a>(h: &HarmonyMarkers, header: &'a str) -> &'a str {
    let t = header.trim_start();
    let t = t
        .strip_prefix(h.start.text.as_str())
        .unwrap_or(t)
        .trim_start();
    t.strip_prefix("assistant").unwrap_or(t).trim_start()
}

fn without_harmony_markers(h: &HarmonyMarkers, text: &str) -> String {
    let mut out = text.to_string();
    for m in h.all() {
        out = out.replace(m.text.as_str(), "");
    }
    out
}

/// Bytes at the end of `text` that are the beginning of `tag`.
fn tail_that_may_begin(text: &str, tag: &str) -> usize {
    (1..tag.len().min(text.len() + 1))
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n) && tag.starts_with(&text[text.len() - n..])
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn think() -> ReasoningFormat {
        ReasoningFormat::Think {
            open: Marker {
                text: "<think>".into(),
                special_id: None,
            },
            close: Marker {
                text: "</think>".into(),
                special_id: None,
            },
        }
    }

    fn split_pieces(format: &ReasoningFormat, inside: bool, pieces: &[&str]) -> (String, String) {
        let mut s = ReasoningSplit {
            format: Arc::new(format.clone()),
            state: if inside {
                State::Thinking
            } else {
                State::Start
            },
            held: String::new(),
            calls: false,
            reasoning_begun: false,
            answer_begun: false,
        };
        let (mut r, mut c) = (String::new(), String::new());
        for p in pieces {
            let o = s.push(Some(7), p);
            r += &o.reasoning;
            c += &o.content;
        }
        let o = s.finish();
        (r + &o.reasoning, c + &o.content)
    }

    /// Every way of cutting `text` into pieces of `n` bytes splits alike.
    fn every_chunking(inside: bool, text: &str, reasoning: &str, content: &str) {
        for n in 1..=text.len() {
            let chars: Vec<char> = text.chars().collect();
            let pieces: Vec<String> = chars.chunks(n).map(|c| c.iter().collect()).collect();
            let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
            let (r, c) = split_pieces(&think(), inside, &refs);
            assert_eq!(
                (r.as_str(), c.as_str()),
                (reasoning, content),
                "pieces of {n}: {text:?}"
            );
        }
    }

    #[test]
    fn think_blocks_split_alike_however_the_text_is_cut() {
        every_chunking(
            false,
            "<think>\nA, then B.\n</think>\n\nIt is C.",
            "A, then B.",
            "It is C.",
        );
        every_chunking(true, "\nA < B.\n\n</think>\n\nC", "A < B.", "C");
        every_chunking(
            false,
            "  It is C, no <think> here.",
            "",
            "  It is C, no <think> here.",
        );
        every_chunking(false, "<thin", "", "<thin");
        // Cut off while thinking: all of it is thinking.
        every_chunking(false, "<think>\nA, then </thi", "A, then </thi", "");
        every_chunking(false, "<think></think>C", "", "C");
    }
}

#[cfg(test)]
mod harmony_tests {
    use super::*;

    fn m(text: &str, id: u32) -> Marker {
        Marker {
            text: text.into(),
            special_id: Some(id),
        }
    }

    /// Token by token as the server reads them (markers have no text):
    /// analysis is thinking, the final message the answer, and a call's
    /// header and arguments go to the call reader with their markers.
    #[test]
    fn harmony_messages_split_by_channel() {
        let h = HarmonyMarkers {
            start: m("<|start|>", 1),
            channel: m("<|channel|>", 2),
            constrain: m("<|constrain|>", 3),
            message: m("<|message|>", 4),
            call: m("<|call|>", 5),
            end: m("<|end|>", 6),
        };
        let run = |calls: bool, tokens: &[(u32, &str)]| {
            let mut s = ReasoningSplit {
                format: Arc::new(ReasoningFormat::Harmony(Box::new(h.clone()))),
                state: State::Header,
                held: String::new(),
                calls,
                reasoning_begun: false,
                answer_begun: false,
            };
            let (mut r, mut c) = (String::new(), String::new());
            for &(id, t) in tokens.iter().chain([(0, "")].iter()) {
                let o = if id == 0 {
                    s.finish()
                } else {
                    s.push(Some(id), t)
                };
                r += &o.reasoning;
                c += &o.content;
            }
            (r, c)
        };
        let analysis = [
            (2, ""),
            (10, "analysis"),
            (4, ""),
            (11, "a"),
            (11, "bc"),
            (6, ""),
        ];
        let answer = [
            (1, ""),
            (12, "assistant"),
            (2, ""),
            (13, "final"),
            (4, ""),
            (14, "It is"),
        ];
        let both: Vec<(u32, &str)> = analysis.iter().chain(answer.iter()).copied().collect();
        assert_eq!(run(false, &both), ("abc".into(), "It is".into()));
        let call = [
            (1, ""),
            (12, "assistant"),
            (2, ""),
            (15, "commentary to=functions.f "),
            (3, ""),
            (16, "json"),
            (4, ""),
            (17, "{}"),
        ];
        let then_call: Vec<(u32, &str)> = analysis.iter().chain(call.iter()).copied().collect();
        assert_eq!(
            run(true, &then_call),
            (
                "abc".into(),
                "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}".into()
            )
        );
        // Text with no frame at all is the answer.
        assert_eq!(
            run(false, &[(20, "Hello"), (21, " there")]),
            (String::new(), "Hello there".into())
        );
    }
}
