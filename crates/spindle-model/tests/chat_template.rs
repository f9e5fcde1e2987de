//! Chat templates: built-ins, templates from source, errors.

use spindle_model::chat_template::{ChatMessage, ChatTemplate, TemplateError};

fn conversation() -> Vec<ChatMessage> {
    vec![
        ChatMessage::new("system", "You are terse."),
        ChatMessage::new("user", " Hi there \n"),
        ChatMessage::new("assistant", "Hello!"),
        ChatMessage::new("user", "How are you?"),
    ]
}

#[test]
fn gemma_builtin() {
    let t = ChatTemplate::builtin("gemma3").unwrap();
    let out = t.render(&conversation(), true, "<bos>", "<eos>").unwrap();
    assert_eq!(
        out,
        "<bos><start_of_turn>user\nYou are terse.\n\nHi there<end_of_turn>\n\
         <start_of_turn>model\nHello!<end_of_turn>\n\
         <start_of_turn>user\nHow are you?<end_of_turn>\n\
         <start_of_turn>model\n"
    );
    let out = t
        .render(&conversation()[1..2], false, "<bos>", "<eos>")
        .unwrap();
    assert_eq!(out, "<bos><start_of_turn>user\nHi there<end_of_turn>\n");
    // Roles must alternate, as in Gemma's own template.
    let bad = [ChatMessage::new("user", "a"), ChatMessage::new("user", "b")];
    match t.render(&bad, true, "<bos>", "<eos>") {
        Err(TemplateError::Raised(msg)) => assert!(msg.contains("alternate"), "{msg}"),
        other => panic!("expected a raised error, got {other:?}"),
    }
    assert_eq!(
        t.render(&[], true, "<bos>", "").unwrap(),
        "<bos><start_of_turn>model\n"
    );
}

#[test]
fn other_builtins() {
    let msgs = conversation();
    let chatml = ChatTemplate::builtin("qwen2").unwrap();
    assert_eq!(
        chatml.render(&msgs[..2], true, "", "").unwrap(),
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\n Hi there \n<|im_end|>\n\
         <|im_start|>assistant\n"
    );
    let llama3 = ChatTemplate::builtin("llama-bpe").unwrap();
    assert_eq!(
        llama3
            .render(&msgs[1..2], true, "<|begin_of_text|>", "")
            .unwrap(),
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>\
         <|start_header_id|>assistant<|end_header_id|>\n\n"
    );
    let mistral = ChatTemplate::builtin("mistral").unwrap();
    assert_eq!(
        mistral.render(&msgs, true, "<s>", "</s>").unwrap(),
        "<s>[INST] You are terse.\n\n Hi there \n [/INST]Hello!</s>[INST] How are you? [/INST]"
    );
    assert!(ChatTemplate::builtin("bert").is_none());
}

#[test]
fn template_from_source() {
    // ChatML as Qwen ships it, with a default system message.
    let source = "{%- if messages[0]['role'] != 'system' %}{{- '<|im_start|>system\\nYou are helpful.<|im_end|>\\n' }}{%- endif %}\n\
        {%- for message in messages %}\n\
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n\
        {%- endfor %}\n\
        {%- if add_generation_prompt %}\n\
        {{- '<|im_start|>assistant\\n' }}\n\
        {%- endif %}\n";
    let t = ChatTemplate::new(source).unwrap();
    assert_eq!(t.source(), source);
    let out = t
        .render(&[ChatMessage::new("user", "hi")], true, "", "")
        .unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn hf_conventions() {
    // trim_blocks / lstrip_blocks, as transformers renders.
    let t = ChatTemplate::new(
        "{% for m in messages %}\n  {% if true %}\n[{{ m.role }}]\n  {% endif %}\n{% endfor %}",
    )
    .unwrap();
    assert_eq!(
        t.render(&[ChatMessage::new("user", "x")], false, "", "")
            .unwrap(),
        "[user]\n"
    );
    // Python string methods.
    let t = ChatTemplate::new(
        "{{ messages[0].content.strip().upper() }}|{{ messages[0].content.startswith(' a') }}|\
         {{ messages[0].content.split(',')[-1] }}|{{ messages[0]['content'].lstrip() }}",
    )
    .unwrap();
    assert_eq!(
        t.render(&[ChatMessage::new("user", " a,b ")], false, "", "")
            .unwrap(),
        "A,B|True|b |a,b "
    );
    // tojson writes JSON as Python's json.dumps does, non-ASCII kept.
    let t =
        ChatTemplate::new("{{ messages | tojson }}|{{ messages[0] | tojson(indent=2) }}").unwrap();
    assert_eq!(
        t.render(&[ChatMessage::new("user", "é<\"")], false, "", "").unwrap(),
        "[{\"role\": \"user\", \"content\": \"é<\\\"\"}]|{\n  \"role\": \"user\",\n  \"content\": \"é<\\\"\"\n}"
    );
    // Loop controls and namespaces, common in newer templates.
    let t = ChatTemplate::new(
        "{% set ns = namespace(n=0) %}{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}\
         {% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}",
    )
    .unwrap();
    let two = [
        ChatMessage::new("user", "a"),
        ChatMessage::new("assistant", "b"),
    ];
    assert_eq!(t.render(&two, false, "", "").unwrap(), "1");
    // strftime_now gives a date.
    let t = ChatTemplate::new("{{ strftime_now('%Y') }}").unwrap();
    let year: i32 = t.render(&[], false, "", "").unwrap().parse().unwrap();
    assert!(year >= 2024);
}

#[test]
fn bad_templates_are_errors() {
    for source in [
        "{% for x in %}",
        "{{ unclosed",
        "{% if true %}no end",
        "{% endfor %}",
    ] {
        assert!(
            matches!(ChatTemplate::new(source), Err(TemplateError::Syntax(_))),
            "{source:?}"
        );
    }
    let msgs = [ChatMessage::new("user", "x")];
    for source in [
        "{{ raise_exception('nope') }}",
        "{{ messages[0].content.no_such_method() }}",
        "{{ 1 + 'a' }}",
        "{% for i in range(100000000) %}{% endfor %}",
    ] {
        let t = ChatTemplate::new(source).unwrap();
        assert!(t.render(&msgs, true, "", "").is_err(), "{source:?}");
    }
    match ChatTemplate::new("{{ raise_exception('nope') }}")
        .unwrap()
        .render(&msgs, true, "", "")
    {
        Err(TemplateError::Raised(m)) => assert_eq!(m, "nope"),
        other => panic!("{other:?}"),
    }
}
