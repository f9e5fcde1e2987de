//! Chat templates: a conversation to the prompt text a model was tuned on.
//!
//! Templates are Jinja, rendered with minijinja under Hugging Face's
//! conventions: `trim_blocks` and `lstrip_blocks`, the variables `messages`,
//! `add_generation_prompt`, `bos_token`, `eos_token`, `tools` (the
//! functions a model may call, `none` when there are none), `documents`
//! and any further keyword arguments, the functions `raise_exception(msg)`
//! and `strftime_now(fmt)` (on a clock [`ChatTemplate::set_clock`] can
//! fix), a `tojson` filter that writes JSON as Python's `json.dumps` does
//! (floats included), and Python string and dict methods (`.strip()`,
//! `.startswith()`, `.split()`, `.items()`, ...). Real templates render as
//! `transformers` renders them (tests/chat_template_families.rs).
//!
//! A rendered prompt often starts with the BOS token's text (Gemma's and
//! Llama 3's templates write `{{ bos_token }}`): encode it with
//! [`Tokenizer::encode_chat_prompt`], which parses special tokens and adds
//! BOS only when the text does not already start with it.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error, ErrorKind};
use serde::{Deserialize, Serialize};

use crate::tokenizer::Tokenizer;

/// One turn of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant` (templates with tools know `tool` too).
    pub role: String,
    pub content: String,
    /// An assistant turn's calls, as templates with tools read them:
    /// `{"id", "type": "function", "function": {"name", "arguments"}}` with
    /// `arguments` an object (as Hugging Face passes them), not a string.
    /// Left out of the template's view when there are none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<serde_json::Value>>,
    /// A `tool` turn: the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// A `tool` turn: the function that answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// An assistant turn's reasoning, apart from its answer, under the
    /// name Qwen3's and DeepSeek's templates read...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// ...and the one gpt-oss's template reads (its analysis channel).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            ..ChatMessage::default()
        }
    }
}

/// Why a template could not be compiled or rendered.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// The template source is not valid Jinja.
    #[error("chat template does not compile: {0}")]
    Syntax(String),
    /// The template called `raise_exception`, e.g. because roles do not alternate.
    #[error("chat template refused the conversation: {0}")]
    Raised(String),
    /// Rendering failed for another reason.
    #[error("chat template failed to render: {0}")]
    Render(String),
}

const NAME: &str = "chat";
/// Prefix of the error a template's `raise_exception` produces.
const RAISED: &str = "raise_exception: ";
/// Enough instructions for any sane template, not for a runaway loop.
const FUEL: u64 = 50_000_000;

/// A compiled chat template.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
}

impl ChatTemplate {
    /// Compiles a Jinja chat template (as found in `tokenizer.chat_template`
    /// or `tokenizer_config.json`).
    pub fn new(source: &str) -> Result<ChatTemplate, TemplateError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_fuel(Some(FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(NAME, source.to_string())
            .map_err(|e| TemplateError::Syntax(describe(&e)))?;
        Ok(ChatTemplate {
            env,
            source: source.to_string(),
        })
    }

    /// A built-in template for a model family name (a
    /// [`Tokenizer::family_hint`] or a plain name): `gemma*` → Gemma's turns
    /// with the system message folded into the first user turn; `qwen*`,
    /// `chatml` → ChatML; `llama3`, `llama-bpe` → Llama 3 headers;
    /// `mistral`, `llama`, `llama2` → `[INST]`. `None` for other names.
    pub fn builtin(family: &str) -> Option<ChatTemplate> {
        let source = builtin_source(family)?;
        // The built-in sources are tested to compile.
        ChatTemplate::new(source).ok()
    }

    /// The template to use with `tokenizer`: the file's own when it has one
    /// that compiles; else a built-in chosen by the special tokens the
    /// vocabulary has (`<start_of_turn>`, `<|im_start|>`,
    /// `<|start_header_id|>`, `[INST]`), else by [`Tokenizer::family_hint`];
    /// else ChatML.
    pub fn for_tokenizer(tokenizer: &Tokenizer) -> ChatTemplate {
        if let Some(source) = tokenizer.chat_template() {
            match ChatTemplate::new(source) {
                Ok(t) => return t,
                Err(e) => tracing::warn!("the model's own {e}; using a built-in template"),
            }
        }
        const MARKERS: &[(&str, &str)] = &[
            ("<start_of_turn>", "gemma"),
            ("<|im_start|>", "chatml"),
            ("<|start_header_id|>", "llama3"),
            ("[INST]", "mistral"),
        ];
        MARKERS
            .iter()
            .find(|(marker, _)| tokenizer.token_to_id(marker).is_some())
            .and_then(|(_, family)| ChatTemplate::builtin(family))
            .or_else(|| tokenizer.family_hint().and_then(ChatTemplate::builtin))
            .or_else(|| ChatTemplate::builtin("chatml"))
            .unwrap_or_else(|| ChatTemplate::new("").expect("an empty template compiles"))
    }

    /// The template's Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether the template reads `tools` (it describes callable functions
    /// to the model itself, in the model's own format).
    pub fn takes_tools(&self) -> bool {
        self.source.contains("tools")
    }

    /// Renders `messages`. With `add_generation_prompt`, the text ends with
    /// the start of an assistant turn for the model to complete.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        bos_token: &str,
        eos_token: &str,
    ) -> Result<String, TemplateError> {
        self.render_with_tools(messages, None, add_generation_prompt, bos_token, eos_token)
    }

    /// [`ChatTemplate::render`] with the functions the model may call
    /// (`[{"type": "function", "function": {"name", "description",
    /// "parameters"}}]`), for templates that describe them.
    pub fn render_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
        bos_token: &str,
        eos_token: &str,
    ) -> Result<String, TemplateError> {
        self.render_with_kwargs(
            messages,
            tools,
            add_generation_prompt,
            Some(bos_token),
            Some(eos_token),
            &serde_json::Map::new(),
        )
    }

    /// The most general render, as `transformers`' `apply_chat_template`
    /// calls a template: a token the tokenizer lacks is left undefined (not
    /// an empty string), `documents` is `none`, and `kwargs` are further
    /// variables (`enable_thinking`, `reasoning_effort`, `date_string`,
    /// ...), which may replace the token texts but not the conversation.
    pub fn render_with_kwargs(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
        bos_token: Option<&str>,
        eos_token: Option<&str>,
        kwargs: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, TemplateError> {
        let template = self
            .env
            .get_template(NAME)
            .map_err(|e| TemplateError::Render(describe(&e)))?;
        let mut vars: BTreeMap<String, Value> = BTreeMap::new();
        if let Some(bos) = bos_token {
            vars.insert("bos_token".into(), Value::from(bos));
        }
        if let Some(eos) = eos_token {
            vars.insert("eos_token".into(), Value::from(eos));
        }
        for (k, v) in kwargs {
            vars.insert(k.clone(), Value::from_serialize(v));
        }
        vars.insert("messages".into(), Value::from_serialize(messages));
        vars.insert("tools".into(), Value::from_serialize(tools));
        vars.insert("documents".into(), Value::from(()));
        vars.insert(
            "add_generation_prompt".into(),
            Value::from(add_generation_prompt),
        );
        template.render(Value::from(vars)).map_err(|e| {
            let text = describe(&e);
            match find_raised(&e) {
                Some(msg) => TemplateError::Raised(msg),
                None => TemplateError::Render(text),
            }
        })
    }

    /// [`ChatTemplate::render`] with `tokenizer`'s BOS and EOS texts.
    pub fn render_for(
        &self,
        tokenizer: &Tokenizer,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        self.render_tools_for(tokenizer, messages, None, add_generation_prompt)
    }

    /// [`ChatTemplate::render_with_tools`] with `tokenizer`'s BOS and EOS texts.
    pub fn render_tools_for(
        &self,
        tokenizer: &Tokenizer,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        self.render_kwargs_for(
            tokenizer,
            messages,
            tools,
            add_generation_prompt,
            &serde_json::Map::new(),
        )
    }

    /// [`ChatTemplate::render_with_kwargs`] with `tokenizer`'s BOS and EOS
    /// texts (undefined where it has none, as in `transformers`).
    pub fn render_kwargs_for(
        &self,
        tokenizer: &Tokenizer,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
        kwargs: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, TemplateError> {
        self.render_with_kwargs(
            messages,
            tools,
            add_generation_prompt,
            tokenizer.bos_token().as_deref(),
            tokenizer.eos_token().as_deref(),
            kwargs,
        )
    }

    /// Sets the clock `strftime_now` reads: `Some(unix seconds)` for a fixed
    /// time (reproducible prompts, tests), `None` for the current time.
    pub fn set_clock(&mut self, unix_secs: Option<i64>) {
        match unix_secs {
            Some(secs) => self
                .env
                .add_function("strftime_now", move |format: String| {
                    strftime(secs, &format)
                }),
            None => self.env.add_function("strftime_now", strftime_now),
        }
    }
}

/// An error with its chain of causes, on one line.
fn describe(e: &Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// The message of a `raise_exception` call somewhere in `e`'s chain.
fn find_raised(e: &Error) -> Option<String> {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = current {
        if let Some(j) = err.downcast_ref::<Error>() {
            if let Some(msg) = j.detail().and_then(|d| d.strip_prefix(RAISED)) {
                return Some(msg.to_string());
            }
        }
        current = err.source();
    }
    None
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!("{RAISED}{message}"),
    ))
}

/// Python's `json.dumps(value, ensure_ascii=False, indent=indent)`, as
/// transformers' `tojson`; `sort_keys` is honoured too.
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => {
            if let Some(s) = v.as_str() {
                Some(s.to_string())
            } else {
                let n = i64::try_from(v.clone()).map_err(|_| {
                    Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: indent must be an integer",
                    )
                })?;
                Some(" ".repeat(n.clamp(0, 64) as usize))
            }
        }
    };
    let mut out = String::new();
    py_json(
        &value,
        indent.as_deref(),
        sort_keys.unwrap_or(false),
        0,
        &mut out,
    )?;
    Ok(Value::from_safe_string(out))
}

/// Writes `v` as JSON the way Python's `json.dumps` lays it out, keeping the
/// order of map keys (`sort` sorts them).
fn py_json(
    v: &Value,
    indent: Option<&str>,
    sort: bool,
    level: usize,
    out: &mut String,
) -> Result<(), Error> {
    use minijinja::value::ValueKind;
    if level > 256 {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "tojson: value nested too deeply",
        ));
    }
    let newline = |out: &mut String, level: usize| {
        if let Some(ind) = indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(ind);
            }
        }
    };
    let item_sep = if indent.is_some() { "," } else { ", " };
    match v.kind() {
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, level + 1);
                py_json(item, indent, sort, level + 1, out)?;
            }
            if !items.is_empty() {
                newline(out, level);
            }
            out.push(']');
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if sort {
                keys.sort();
            }
            out.push('{');
            for (i, key) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, level + 1);
                let name = match key.as_str() {
                    Some(s) => s.to_string(),
                    None => key.to_string(),
                };
                out.push_str(&serde_json::Value::String(name).to_string());
                out.push_str(": ");
                py_json(&v.get_item(key)?, indent, sort, level + 1, out)?;
            }
            if !keys.is_empty() {
                newline(out, level);
            }
            out.push('}');
        }
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Number if !v.is_integer() => {
            let x = f64::try_from(v.clone())?;
            out.push_str(&py_float(x));
        }
        _ => {
            let json = serde_json::to_string(v)
                .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
            out.push_str(&json);
        }
    }
    Ok(())
}

/// A float as Python's `repr` (and so `json.dumps`) writes it: the shortest
/// digits that read back, in positional form for exponents from -4 to 15
/// (`2.0`, `0.0001`), else scientific with a signed two-digit exponent
/// (`1e-05`, `1.5e+16`); `NaN` and `Infinity` as `json.dumps` allows them.
fn py_float(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    // Rust's `{:e}` gives the same shortest digits: `d[.ddd]e[-]x`.
    let sci = format!("{:e}", x.abs());
    let (mantissa, exp) = sci.split_once('e').expect("{:e} has an exponent");
    let exp: i32 = exp.parse().expect("{:e} has an integer exponent");
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let sign = if x.is_sign_negative() { "-" } else { "" };
    if (-4..16).contains(&exp) {
        let point = exp + 1;
        let body = if point <= 0 {
            format!("0.{}{digits}", "0".repeat((-point) as usize))
        } else if point as usize >= digits.len() {
            format!("{digits}{}.0", "0".repeat(point as usize - digits.len()))
        } else {
            format!(
                "{}.{}",
                &digits[..point as usize],
                &digits[point as usize..]
            )
        };
        format!("{sign}{body}")
    } else {
        let exp_sign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{mantissa}e{exp_sign}{:02}", exp.abs())
    }
}

/// `strftime_now(format)`: the current UTC time, for templates that print
/// today's date (Llama 3.1+). Supports `%Y %m %d %e %B %b %A %a %H %M %S %j %%`.
fn strftime_now(format: String) -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    strftime(secs, &format)
}

fn strftime(secs: i64, format: &str) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
    ];
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let before = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = before[(month - 1) as usize] + day + i64::from(leap && month > 2);
    let weekday = DAYS[days.rem_euclid(7) as usize];
    let month_name = MONTHS[(month - 1) as usize];

    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&year.to_string()),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('e') => out.push_str(&format!("{day:>2}")),
            Some('B') => out.push_str(month_name),
            Some('b') => out.push_str(&month_name[..3]),
            Some('A') => out.push_str(weekday),
            Some('a') => out.push_str(&weekday[..3]),
            Some('H') => out.push_str(&format!("{:02}", rem / 3600)),
            Some('M') => out.push_str(&format!("{:02}", rem % 3600 / 60)),
            Some('S') => out.push_str(&format!("{:02}", rem % 60)),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

fn builtin_source(family: &str) -> Option<&'static str> {
    let f = family.to_ascii_lowercase();
    if f.contains("gemma") {
        Some(GEMMA)
    } else if f.contains("qwen") || f.contains("chatml") {
        Some(CHATML)
    } else if f.contains("llama3")
        || f.contains("llama-3")
        || f.contains("llama-bpe")
        || f.contains("llama-v3")
        || f.contains("smaug-bpe")
    {
        Some(LLAMA3)
    } else if f.contains("mistral") || f.contains("mixtral") || f == "llama" || f == "llama2" {
        Some(MISTRAL)
    } else {
        None
    }
}

/// Gemma: `user` and `model` turns; a system message opens the first user turn.
const GEMMA: &str = r#"{{- bos_token -}}
{%- if messages and messages[0]['role'] == 'system' -%}
    {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = '' -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') -}}
    {%- endif -%}
    {%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
    {{- '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') -}}
    {{- message['content'] | trim -}}
    {{- '<end_of_turn>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<start_of_turn>model\n' -}}
{%- endif -%}"#;

/// ChatML (Qwen): `<|im_start|>role\n...<|im_end|>\n`.
const CHATML: &str = r#"{%- for message in messages -%}
    {{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\n' -}}
{%- endif -%}"#;

/// Llama 3: header-delimited turns ending in `<|eot_id|>`.
const LLAMA3: &str = r#"{{- bos_token -}}
{%- for message in messages -%}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
{%- endif -%}"#;

/// Mistral / Llama 2: `[INST] user [/INST]answer</s>`; a system message opens
/// the first user turn.
const MISTRAL: &str = r#"{{- bos_token -}}
{%- if messages and messages[0]['role'] == 'system' -%}
    {%- set system = messages[0]['content'] + '\n\n' -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set system = '' -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') -}}
    {%- endif -%}
    {%- if message['role'] == 'user' -%}
        {{- '[INST] ' + (system if loop.first else '') + message['content'] + ' [/INST]' -}}
    {%- else -%}
        {{- message['content'] + eos_token -}}
    {%- endif -%}
{%- endfor -%}"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_compile() {
        for source in [GEMMA, CHATML, LLAMA3, MISTRAL] {
            ChatTemplate::new(source).unwrap();
        }
    }

    #[test]
    fn floats_as_python_writes_them() {
        let cases = [
            (2.0, "2.0"),
            (0.25, "0.25"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1e20, "1e+20"),
            (1.5e16, "1.5e+16"),
            (1e15, "1000000000000000.0"),
            (123.456, "123.456"),
            (-0.0, "-0.0"),
            (-2.5e-7, "-2.5e-07"),
            (0.1 + 0.2, "0.30000000000000004"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (f64::INFINITY, "Infinity"),
        ];
        for (x, want) in cases {
            assert_eq!(py_float(x), want, "{x}");
        }
    }

    #[test]
    fn strftime_known_dates() {
        assert_eq!(
            strftime(0, "%d %b %Y %A %H:%M:%S %j"),
            "01 Jan 1970 Thursday 00:00:00 001"
        );
        // 2024-02-29 12:34:56 UTC
        assert_eq!(
            strftime(1_709_210_096, "%Y-%m-%d %B %a %H:%M:%S %j %%"),
            "2024-02-29 February Thu 12:34:56 060 %"
        );
    }
}
