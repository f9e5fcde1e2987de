//! The tool-call formats of real chat templates, read back from the calls
//! those templates write: each family's template (from
//! spindle-model/tests/fixtures/chat_templates/families.json, rendered by
//! `transformers`) names its format, and the assistant turn it renders for
//! a call parses, whole and streamed, to the call's name and arguments.

use std::path::Path;

use serde_json::{json, Value};
use spindle_model::chat_template::ChatTemplate;
use spindle_model::tokenizer::Tokenizer;
use spindle_server::tools::{parse_reply, HarmonyMarkers, Marker, ReplyWatch, ToolFormat};

fn reference() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../spindle-model/tests/fixtures/chat_templates/families.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The format `family`'s template teaches. The markers' special ids come
/// from a small fixture vocabulary: replies here are text, so only the
/// markers' texts matter.
fn format_of(refs: &Value, family: &str) -> ToolFormat {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../spindle-model/tests/fixtures/tokenizer/hf_qwen2");
    let tok = Tokenizer::from_hf_dir(&dir).unwrap();
    let source = refs["families"][family]["template"].as_str().unwrap();
    ToolFormat::of(&ChatTemplate::new(source).unwrap(), &tok)
}

fn names(refs: &Value) -> Vec<String> {
    refs["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap().to_string())
        .collect()
}

/// The text of `family`'s rendering of `conversation` from the first
/// `open` after the last user turn's text to the next `close`: the
/// assistant's calls, as the model would write them after the
/// generation prompt.
fn call_turn(refs: &Value, family: &str, conversation: &str, open: &str, close: &str) -> String {
    let case = refs["families"][family]["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["conversation"] == conversation && c["tools"] == true)
        .unwrap();
    let text = case["text"]
        .as_str()
        .expect("the template renders the calls");
    let user = refs["conversations"][conversation]
        .as_array()
        .unwrap()
        .iter()
        .rfind(|m| m["role"] == "user")
        .unwrap()["content"]
        .as_str()
        .unwrap();
    let after_user = &text[text.find(user).unwrap() + user.len()..];
    let turn = &after_user[after_user.find(open).unwrap() + open.len()..];
    turn[..turn.find(close).unwrap()].to_string()
}

/// The calls of `conversation`'s assistant turn: (name, arguments).
fn expected_calls(refs: &Value, conversation: &str) -> Vec<(String, Value)> {
    let turn = refs["conversations"][conversation]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m.get("tool_calls").is_some())
        .unwrap();
    turn["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["function"]["name"].as_str().unwrap().to_string(),
                c["function"]["arguments"].clone(),
            )
        })
        .collect()
}

/// `reply` read as calls, whole and streamed in pieces of a few chars.
fn read_back(format: &ToolFormat, reply: &str, names: &[String]) -> Vec<(String, Value)> {
    let parsed = |calls: Vec<spindle_server::tools::ParsedCall>| -> Vec<(String, Value)> {
        calls
            .into_iter()
            .map(|c| (c.name, serde_json::from_str(&c.arguments).unwrap()))
            .collect()
    };
    let whole = parse_reply(format, reply, names)
        .unwrap_or_else(|| panic!("{} reads no calls in {reply:?}", format.name()));
    let whole = parsed(whole);
    for step in [1, 4, 17] {
        let mut w = ReplyWatch::new(format.clone(), names.to_vec(), false);
        let chars: Vec<char> = reply.chars().collect();
        let mut out = String::new();
        for piece in chars.chunks(step) {
            out.push_str(&w.push(None, &piece.iter().collect::<String>()));
        }
        let end = w.finish(false);
        assert_eq!(out + &end.text, "", "{reply:?}: no text goes out");
        assert_eq!(parsed(end.calls), whole, "{reply:?} streamed by {step}");
    }
    whole
}

#[test]
fn each_template_names_its_format() {
    let refs = reference();
    for (family, want) in [
        ("llama3_1_tools", "llama3-json"),
        ("llama3_2", "llama3-json"),
        ("qwen3", "hermes"),
        ("gpt_oss", "harmony"),
        ("mistral_nemo", "mistral"),
        // Templates that take no tools: Spindle's generic form.
        ("llama3", "generic-json"),
        ("llama3_1", "generic-json"),
        ("gemma3", "generic-json"),
        ("deepseek_v3", "generic-json"),
    ] {
        assert_eq!(format_of(&refs, family).name(), want, "{family}");
    }
}

#[test]
fn calls_as_the_templates_write_them_read_back() {
    let refs = reference();
    let n = names(&refs);
    // (family, conversation, where the call turn opens and closes)
    let cases = [
        (
            "llama3_1_tools",
            "tool_call",
            "<|start_header_id|>assistant<|end_header_id|>\n\n",
            "<|eot_id|>",
        ),
        (
            "llama3_2",
            "tool_call",
            "<|start_header_id|>assistant<|end_header_id|>\n\n",
            "<|eot_id|>",
        ),
        (
            "qwen3",
            "tool_call",
            "<|im_start|>assistant\n",
            "<|im_end|>",
        ),
        (
            "qwen3",
            "parallel_tool_calls",
            "<|im_start|>assistant\n",
            "<|im_end|>",
        ),
        // `<|call|>` stops generation, so it is not in a reply.
        ("gpt_oss", "tool_call", "<|start|>assistant", "<|call|>"),
        ("mistral_nemo", "parallel_tool_calls", "[/INST]", "</s>"),
    ];
    for (family, conversation, open, close) in cases {
        let format = format_of(&refs, family);
        let reply = call_turn(&refs, family, conversation, open, close);
        let want = expected_calls(&refs, conversation);
        assert_eq!(
            read_back(&format, &reply, &n),
            want,
            "{family} {conversation}: {reply:?}"
        );
    }
}

fn marker(text: &str) -> Marker {
    Marker {
        text: text.into(),
        special_id: None,
    }
}

fn harmony() -> ToolFormat {
    ToolFormat::Harmony(Box::new(HarmonyMarkers {
        start: marker("<|start|>"),
        channel: marker("<|channel|>"),
        constrain: marker("<|constrain|>"),
        message: marker("<|message|>"),
        call: marker("<|call|>"),
        end: marker("<|end|>"),
    }))
}

#[test]
fn harmony_replies_as_the_model_writes_them() {
    let refs = reference();
    let n = names(&refs);
    let h = harmony();
    let paris = json!({"city": "Paris"});
    let call = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}";
    for reply in [
        call.to_string(),
        format!("{call}<|call|>"),
        // Reasoning first, when `<|end|>` does not stop the turn.
        format!("<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant{call}"),
        // No content type.
        "<|channel|>commentary to=functions.get_weather<|message|>{\"city\":\"Paris\"}".into(),
    ] {
        let calls = parse_reply(&h, &reply, &n).unwrap_or_else(|| panic!("{reply:?}"));
        assert_eq!(calls.len(), 1, "{reply:?}");
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(
            serde_json::from_str::<Value>(&calls[0].arguments).unwrap(),
            paris
        );
    }
    assert_eq!(read_back(&h, call, &n)[0].1, paris);
    for text in [
        "<|channel|>final<|message|>It is sunny.",
        "<|channel|>analysis<|message|>Thinking.",
        "<|channel|>commentary to=functions.unknown <|constrain|>json<|message|>{}",
        "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>[1]",
        "<|channel|>commentary<|message|>Let me look that up.",
    ] {
        assert_eq!(parse_reply(&h, text, &n), None, "{text}");
    }
}

#[test]
fn harmony_text_replies_stream_without_their_markers() {
    // The markers are special tokens: put back by id for reading calls,
    // left out of text as decoding leaves them out.
    let mut h = harmony();
    if let ToolFormat::Harmony(m) = &mut h {
        m.channel.special_id = Some(5);
        m.message.special_id = Some(6);
    }
    let mut w = ReplyWatch::new(h, vec!["get_weather".into()], false);
    let mut out = w.push(Some(5), "");
    out.push_str(&w.push(None, "final"));
    out.push_str(&w.push(Some(6), ""));
    out.push_str(&w.push(None, "It is sunny."));
    out.push_str(&w.finish(false).text);
    assert_eq!(out, "finalIt is sunny.");
}
