//! Tool calling below the HTTP layer: each format's call grammar accepts
//! exactly valid calls (walked token by token with llguidance), replies are
//! read back the same whole and streamed, and conversations with calls and
//! results render through templates with and without tools.

use std::path::Path;

use serde_json::{json, Value};
use spindle_engine::constraint::{Allowed, GrammarCompiler};
use spindle_model::chat_template::ChatTemplate;
use spindle_model::tokenizer::Tokenizer;
use spindle_server::openai::{ChatMessageIn, Content, FunctionCallIn, SamplingFields, ToolCallIn};
use spindle_server::tools::{self, parse_reply, ReplyWatch, ToolChoice, ToolFormat, ToolRequest};

fn tokenizer() -> Tokenizer {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../spindle-model/tests/fixtures/tokenizer/hf_qwen2");
    Tokenizer::from_hf_dir(&dir).expect("the fixture tokenizer loads")
}

fn tool_json() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Weather",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string", "maxLength": 20},
                "unit": {"enum": ["c", "f"]}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "now"}}
    ])
}

fn request(choice: Value) -> ToolRequest {
    let f = SamplingFields {
        tools: Some(tool_json()),
        tool_choice: Some(choice),
        ..SamplingFields::default()
    };
    ToolRequest::parse(&f).unwrap().unwrap()
}

fn names() -> Vec<String> {
    vec!["get_weather".into(), "now".into()]
}

/// A template that takes tools and writes `marker` (one of the formats'
/// openings) in its tool instructions.
fn format_for(marker: &str) -> ToolFormat {
    let src = format!("{{% if tools %}}use {marker}{{% endif %}}{{{{ messages[0].content }}}}");
    ToolFormat::of(&ChatTemplate::new(&src).unwrap(), &tokenizer())
}

#[test]
fn formats_are_recognised_from_the_template() {
    assert_eq!(format_for("<tool_call>").name(), "hermes");
    assert_eq!(format_for("[TOOL_CALLS]").name(), "mistral");
    assert_eq!(format_for("<|python_tag|>").name(), "llama3-json");
    assert_eq!(
        format_for("<|channel|>commentary <|call|>").name(),
        "harmony"
    );
    assert_eq!(format_for("nothing known").name(), "generic-json");
    // A template that never reads `tools` gets the generic format.
    let plain = ChatTemplate::builtin("chatml").unwrap();
    assert_eq!(ToolFormat::of(&plain, &tokenizer()), ToolFormat::Generic);
}

#[test]
fn replies_parse_in_each_format() {
    let n = names();
    let generic = parse_reply(
        &ToolFormat::Generic,
        r#" {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}, {"name": "now", "arguments": {}}]}"#,
        &n,
    )
    .unwrap();
    assert_eq!(generic.len(), 2);
    assert_eq!(
        (generic[0].name.as_str(), generic[0].arguments.as_str()),
        ("get_weather", r#"{"city":"Oslo"}"#)
    );
    assert!(generic[0].id.starts_with("call_") && generic[0].id != generic[1].id);
    let hermes = format_for("<tool_call>");
    let text = "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\", \"unit\": \"c\"}}\n</tool_call>";
    let calls = parse_reply(&hermes, text, &n).unwrap();
    assert_eq!(calls[1].arguments, r#"{"city":"Rome","unit":"c"}"#);
    // The last block may be cut by the end of the turn.
    let cut = "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n";
    assert_eq!(parse_reply(&hermes, cut, &n).unwrap()[0].name, "now");
    let llama = format_for("<|python_tag|>");
    let calls = parse_reply(
        &llama,
        r#"{"name": "get_weather", "parameters": {"city": "Lima"}}; {"name": "now", "parameters": {}}"#,
        &n,
    )
    .unwrap();
    assert_eq!(
        calls.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
        ["get_weather", "now"]
    );
    let mistral = format_for("[TOOL_CALLS]");
    let calls = parse_reply(
        &mistral,
        r#"[TOOL_CALLS] [{"name": "now", "arguments": {}}]"#,
        &n,
    )
    .unwrap();
    assert_eq!(calls[0].id.len(), 9);
    assert!(calls[0].id.chars().all(|c| c.is_ascii_alphanumeric()));
    // Not calls: text, unknown names, arguments that are not objects,
    // anything after the calls.
    for (format, text) in [
        (&ToolFormat::Generic, "The weather is fine."),
        (
            &ToolFormat::Generic,
            r#"{"tool_calls": [{"name": "rm", "arguments": {}}]}"#,
        ),
        (
            &ToolFormat::Generic,
            r#"{"tool_calls": [{"name": "now", "arguments": "x"}]}"#,
        ),
        (
            &ToolFormat::Generic,
            r#"{"tool_calls": [{"name": "now", "arguments": {}}]} and more"#,
        ),
        (
            &hermes,
            "Sure. <tool_call>{\"name\": \"now\", \"arguments\": {}}",
        ),
        (&llama, r#"{"name": "now", "parameters": {}} trailing"#),
        (&mistral, r#"[{"name": "now", "arguments": {}}]"#),
    ] {
        assert_eq!(parse_reply(format, text, &n), None, "{text}");
    }
}

/// Streams `text` in pieces of `step` bytes; returns what went out as text
/// during and after the reply, and the calls.
fn stream(watch: &mut ReplyWatch, text: &str, step: usize) -> (String, Vec<String>) {
    let mut out = String::new();
    let chars: Vec<char> = text.chars().collect();
    for piece in chars.chunks(step) {
        out.push_str(&watch.push(None, &piece.iter().collect::<String>()));
    }
    let end = watch.finish(false);
    out.push_str(&end.text);
    (out, end.calls.into_iter().map(|c| c.arguments).collect())
}

#[test]
fn streamed_replies_read_as_whole_ones() {
    let call = r#"{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}]}"#;
    let texts = [
        call,
        "Plain words, no call.",
        r#"{"not": "a call"}"#,
        "  \n",
    ];
    for text in texts {
        let whole = parse_reply(&ToolFormat::Generic, text, &names());
        for step in [1, 3, 50] {
            let mut w = ReplyWatch::new(ToolFormat::Generic, names(), false);
            let (out, calls) = stream(&mut w, text, step);
            match &whole {
                Some(c) => {
                    assert_eq!(out, "", "{text}");
                    assert_eq!(
                        calls,
                        c.iter().map(|c| c.arguments.clone()).collect::<Vec<_>>()
                    );
                }
                None => {
                    assert_eq!(out, text, "text passes through whole");
                    assert!(calls.is_empty());
                }
            }
        }
    }
    // Text is released as soon as it cannot be a call.
    let mut w = ReplyWatch::new(ToolFormat::Generic, names(), false);
    assert_eq!(w.push(None, " "), "");
    assert_eq!(w.push(None, "Hi"), " Hi");
    // A special marker the decoder leaves out is put back by id.
    let hermes = ToolFormat::Hermes {
        open: tools_marker("<tool_call>", Some(7)),
        close: tools_marker("</tool_call>", Some(8)),
    };
    let mut w = ReplyWatch::new(hermes, names(), false);
    assert_eq!(w.push(Some(7), ""), "");
    w.push(None, "{\"name\": \"now\", \"arguments\": {}}");
    w.push(Some(8), "");
    let end = w.finish(false);
    assert_eq!((end.text.as_str(), end.calls.len()), ("", 1));
}

/// Streams `text` a few bytes at a time until the watch ends the reply;
/// returns the bytes it took.
fn push_until_ended(watch: &mut ReplyWatch, text: &str) -> usize {
    let mut taken = 0;
    for piece in text.as_bytes().chunks(3) {
        let piece = std::str::from_utf8(piece).unwrap();
        watch.push(None, piece);
        taken += piece.len();
        if watch.ended() {
            break;
        }
    }
    taken
}

#[test]
fn a_reply_that_repeats_a_call_ends_with_the_calls_before_it() {
    let a = r#"{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"}}"#;
    let b = r#"{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "f"}}"#;
    // A model cycling through the same two calls until the token limit.
    let looping = format!(r#"{{"tool_calls": [{a}, {b}, {a}, {b}, {a}, {b}"#);
    let mut w = ReplyWatch::new(ToolFormat::Generic, names(), true);
    let taken = push_until_ended(&mut w, &looping);
    assert!(w.ended());
    // It ends as soon as the third call closes, not at the limit.
    let third_ends = looping.find(&format!("{b}, {a}")).unwrap() + b.len() + 2 + a.len();
    assert!(
        taken >= third_ends && taken < third_ends + 3,
        "{taken} {third_ends}"
    );
    let end = w.finish(false);
    assert!(end.cut && end.text.is_empty());
    assert_eq!(
        end.calls
            .iter()
            .map(|c| c.arguments.as_str())
            .collect::<Vec<_>>(),
        [
            r#"{"city":"Oslo","unit":"c"}"#,
            r#"{"city":"Oslo","unit":"f"}"#
        ]
    );
    // The same in Hermes blocks; different calls do not end a reply.
    let hermes = format_for("<tool_call>");
    let block = |c: &str| format!("<tool_call>\n{c}\n</tool_call>\n");
    let mut w = ReplyWatch::new(hermes.clone(), names(), true);
    push_until_ended(&mut w, &(block(a) + &block(b) + &block(a)));
    assert!(w.ended());
    assert_eq!(w.finish(false).calls.len(), 2);
    let mut w = ReplyWatch::new(hermes, names(), true);
    push_until_ended(&mut w, &(block(a) + &block(b)));
    assert!(!w.ended());
    let end = w.finish(false);
    assert_eq!((end.calls.len(), end.cut), (2, false));
}

#[test]
fn a_reply_cut_by_the_token_limit_keeps_its_calls() {
    let done = r#"{"tool_calls": [{"name": "now", "arguments": {}}, "#;
    let unfinished = r#"{"name": "get_weather", "arguments": {"city": "Oslo is a city in"#;
    let text = format!("{done}{unfinished}");
    // Cut by the limit: the completed call, then the unfinished one as far
    // as it got (as OpenAI returns a call cut by max_tokens).
    let mut w = ReplyWatch::new(ToolFormat::Generic, names(), true);
    w.push(None, &text);
    let end = w.finish(true);
    assert!(end.cut && end.text.is_empty());
    let got: Vec<_> = end
        .calls
        .iter()
        .map(|c| (c.name.as_str(), c.arguments.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            ("now", "{}"),
            ("get_weather", r#"{"city": "Oslo is a city in"#)
        ]
    );
    // Ended any other way, only completed calls are calls.
    let mut w = ReplyWatch::new(ToolFormat::Generic, names(), true);
    w.push(None, &text);
    assert_eq!(w.finish(false).calls.len(), 1);
    // Before any call's name is whole there is no call to return: the text
    // comes back as text.
    let mut w = ReplyWatch::new(ToolFormat::Generic, names(), true);
    w.push(None, r#"{"tool_calls": [{"name": "get_w"#);
    let end = w.finish(true);
    assert!(end.calls.is_empty() && end.text.starts_with("{\"tool_calls\""));
    // A list that closed and then went on is text, as whole replies read.
    let mut w = ReplyWatch::new(ToolFormat::Generic, names(), false);
    w.push(
        None,
        r#"{"tool_calls": [{"name": "now", "arguments": {}}]} and more"#,
    );
    assert!(w.finish(true).calls.is_empty());
}

fn tools_marker(text: &str, special_id: Option<u32>) -> spindle_server::tools::Marker {
    spindle_server::tools::Marker {
        text: text.into(),
        special_id,
    }
}

/// Walks `text`'s tokens through a fresh matcher of `req`'s grammar in
/// `format`: whether every token was allowed and the grammar may end there.
fn grammar_accepts(req: &ToolRequest, format: &ToolFormat, text: &str) -> bool {
    let tok = tokenizer();
    let compiler = GrammarCompiler::new(&tok).unwrap();
    let grammar = req.grammar(format).expect("a required call has a grammar");
    let mut c = compiler
        .compile(&grammar)
        .expect("the call grammar compiles");
    for id in tok.encode(text, false, false).unwrap() {
        match c.allowed() {
            Allowed::Tokens { mask, .. } if mask.is_allowed(id) => c.consume(id),
            _ => return false,
        }
    }
    c.is_done()
        || matches!(
            c.allowed(),
            Allowed::Tokens { may_end: true, .. } | Allowed::Done
        )
}

#[test]
fn call_grammars_accept_exactly_valid_calls() {
    let named = request(json!({"type": "function", "function": {"name": "get_weather"}}));
    let required = request(json!("required"));
    let generic = ToolFormat::Generic;
    let ok =
        r#"{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"}}]}"#;
    assert!(grammar_accepts(&named, &generic, ok));
    // Another function, a made-up argument (the schema lists its
    // properties, so none other is allowed), a bad enum value, two calls
    // where one is named.
    for bad in [
        r#"{"tool_calls": [{"name": "now", "arguments": {}}]}"#,
        r#"{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo", "extra": 1}}]}"#,
        r#"{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "k"}}]}"#,
        r#"{"tool_calls": [{"name": "get_weather", "arguments": {"city": "A"}}, {"name": "get_weather", "arguments": {"city": "B"}}]}"#,
        "The weather is fine.",
    ] {
        assert!(!grammar_accepts(&named, &generic, bad), "{bad}");
    }
    let two = r#"{"tool_calls": [{"name": "now", "arguments": {}}, {"name": "get_weather", "arguments": {"city": "B"}}]}"#;
    assert!(grammar_accepts(&required, &generic, two));
    let hermes = format_for("<tool_call>");
    let block = "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
    assert!(grammar_accepts(&required, &hermes, block));
    assert!(grammar_accepts(
        &required,
        &hermes,
        &format!("{block}\n{block}")
    ));
    assert!(!grammar_accepts(
        &required,
        &hermes,
        "{\"name\": \"now\", \"arguments\": {}}"
    ));
    let llama = format_for("<|python_tag|>");
    assert!(grammar_accepts(
        &named,
        &llama,
        r#"{"name": "get_weather", "parameters": {"city": "Lima"}}"#
    ));
    let mistral = format_for("[TOOL_CALLS]");
    assert!(grammar_accepts(
        &required,
        &mistral,
        r#"[TOOL_CALLS] [{"name": "now", "arguments": {}}]"#
    ));
    let harmony = format_for("<|channel|> <|call|>");
    let weather = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Lima\"}";
    assert!(grammar_accepts(&named, &harmony, weather));
    assert!(grammar_accepts(
        &required,
        &harmony,
        "<|channel|>commentary to=functions.now <|constrain|>json<|message|>{}"
    ));
    for bad in [
        "<|channel|>commentary to=functions.now <|constrain|>json<|message|>{}",
        "<|channel|>final<|message|>Sunny.",
        "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"town\": \"Lima\"}",
    ] {
        assert!(!grammar_accepts(&named, &harmony, bad), "{bad}");
    }
    assert_eq!(parse_reply(&harmony, weather, &names()).unwrap().len(), 1);
    // What each grammar accepts reads back as calls.
    assert_eq!(parse_reply(&generic, two, &names()).unwrap().len(), 2);
    assert_eq!(parse_reply(&hermes, block, &names()).unwrap().len(), 1);
}

fn msg(role: &str, content: Option<&str>) -> ChatMessageIn {
    ChatMessageIn {
        role: role.into(),
        content: content.map(|c| Content::Text(c.into())),
        tool_calls: None,
        tool_call_id: None,
        name: None,
        reasoning_content: None,
    }
}

fn round_trip() -> Vec<ChatMessageIn> {
    let mut asked = msg("assistant", None);
    asked.tool_calls = Some(vec![ToolCallIn {
        id: "call_1".into(),
        kind: Some("function".into()),
        function: FunctionCallIn {
            name: "get_weather".into(),
            arguments: r#"{"city":"Oslo"}"#.into(),
        },
    }]);
    let mut result = msg("tool", Some("3 degrees"));
    result.tool_call_id = Some("call_1".into());
    vec![msg("user", Some("Weather in Oslo?")), asked, result]
}

#[test]
fn conversations_render_without_template_tools() {
    let req = request(json!("auto"));
    let (msgs, template_tools) =
        tools::conversation(&round_trip(), Some(&req), &ToolFormat::Generic).unwrap();
    assert!(template_tools.is_none());
    let gemma = ChatTemplate::builtin("gemma3").unwrap();
    let text = gemma.render(&msgs, true, "<bos>", "").unwrap();
    let system = text
        .split("Weather in Oslo?")
        .next()
        .expect("the system turn comes first");
    assert!(
        system.contains(
            r#"{"name": "get_weather", "description": "Weather", "parameters": {"type": "object""#
        ),
        "{system}"
    );
    assert!(
        system.contains(r#"{"tool_calls": [{"name": "<function name>""#),
        "{system}"
    );
    assert!(text.contains(
        "<start_of_turn>model\n{\"tool_calls\": [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}]}<end_of_turn>"
    ), "{text}");
    assert!(text.contains(
        "<start_of_turn>user\nFunction results:\n{\"name\": \"get_weather\", \"content\": \"3 degrees\"}<end_of_turn>\n<start_of_turn>model\n"
    ), "{text}");
    // With tool_choice none the functions are not described, but the
    // earlier call and result still render.
    let none = request(json!("none"));
    assert_eq!(none.choice, ToolChoice::None);
    let (msgs, _) = tools::conversation(&round_trip(), Some(&none), &ToolFormat::Generic).unwrap();
    let text = gemma.render(&msgs, true, "<bos>", "").unwrap();
    assert!(
        !text.contains("You can call functions") && text.contains("3 degrees"),
        "{text}"
    );
}

#[test]
fn conversations_render_through_template_tools() {
    // A Hermes-style template: it lists the tools and writes each call's
    // arguments (an object, as Hugging Face templates receive them) as JSON.
    let src = "{% if tools %}{% for t in tools %}[{{ t.function.name }}]{% endfor %}\n{% endif %}\
        {% for m in messages %}{% if m.role == 'tool' %}<tool_response>{{ m.content }}</tool_response>\
        {% elif m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}</tool_call>{% endfor %}\
        {% else %}{{ m.role }}: {{ m.content }}\n{% endif %}{% endfor %}";
    let template = ChatTemplate::new(src).unwrap();
    let format = ToolFormat::of(&template, &tokenizer());
    assert_eq!(format.name(), "hermes");
    let req = request(json!("auto"));
    let (msgs, template_tools) = tools::conversation(&round_trip(), Some(&req), &format).unwrap();
    let text = template
        .render_with_tools(&msgs, template_tools.as_ref(), true, "", "")
        .unwrap();
    // As Python's jinja2 renders it (trim_blocks eats the newline after
    // `{% endfor %}`).
    assert_eq!(
        text,
        "[get_weather][now]user: Weather in Oslo?\n\
         <tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}</tool_call>\
         <tool_response>3 degrees</tool_response>"
    );
}

#[test]
fn malformed_tool_messages_are_refused() {
    let format = ToolFormat::Generic;
    let mut unanswered = round_trip();
    unanswered[2].tool_call_id = Some("call_2".into());
    let mut no_id = round_trip();
    no_id[2].tool_call_id = None;
    let mut bad_args = round_trip();
    bad_args[1].tool_calls.as_mut().unwrap()[0]
        .function
        .arguments = "{oops".into();
    let mut user_calls = round_trip();
    user_calls[0].tool_calls = user_calls[1].tool_calls.clone();
    for (conv, needle) in [
        (unanswered, "answers no earlier"),
        (no_id, "needs tool_call_id"),
        (bad_args, "is not JSON"),
        (user_calls, "only assistant messages"),
    ] {
        let err = tools::conversation(&conv, None, &format).unwrap_err();
        assert_eq!(err.status.as_u16(), 400);
        assert!(err.message.contains(needle), "{}", err.message);
    }
}
