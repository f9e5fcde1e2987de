//! Constrained decoding on the real model: under a JSON schema or a regular
//! expression the output parses and obeys it, speculative decoding (with
//! the grammar's forced tokens drafted) emits exactly what plain decoding
//! emits under the same grammar, greedy and sampled, alone and in a batch,
//! and grammars that do not compile are refused before anything runs.

mod common;

use serde_json::{json, Value};
use spindle_engine::constraint::{Grammar, GrammarCompiler};
use spindle_engine::scheduler::{spawn_engine, EngineConfig, Request, RequestParams};
use spindle_engine::speculative::{generate_speculative, NgramDrafter, TreeBudget};
use spindle_engine::{generate, GenerateOutput, GenerateRequest, SamplerConfig};
use spindle_model::tokenizer::Tokenizer;
use spindle_model::LoadedModel;

fn load() -> Option<LoadedModel> {
    let path = common::real_model()?;
    Some(spindle_model::load(&path, 2).expect("the real model loads"))
}

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 24},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "role": {"enum": ["admin", "editor", "viewer"]},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3}
        },
        "required": ["name", "age", "role", "tags"],
        "additionalProperties": false
    })
}

/// Checks `v` against [`schema`] by hand, the way the schema reads.
fn obeys_schema(v: &Value) -> Result<(), String> {
    let o = v.as_object().ok_or("not an object")?;
    let keys: Vec<&str> = o.keys().map(String::as_str).collect();
    for k in &keys {
        if !["name", "age", "role", "tags"].contains(k) {
            return Err(format!("extra key {k}"));
        }
    }
    let name = o.get("name").and_then(Value::as_str).ok_or("name")?;
    if name.is_empty() || name.chars().count() > 24 {
        return Err(format!("name {name:?}"));
    }
    let age = o.get("age").and_then(Value::as_i64).ok_or("age")?;
    if !(0..=120).contains(&age) {
        return Err(format!("age {age}"));
    }
    let role = o.get("role").and_then(Value::as_str).ok_or("role")?;
    if !["admin", "editor", "viewer"].contains(&role) {
        return Err(format!("role {role}"));
    }
    let tags = o.get("tags").and_then(Value::as_array).ok_or("tags")?;
    if tags.len() > 3
        || tags
            .iter()
            .any(|t| t.as_str().is_none_or(|s| s.chars().count() > 12))
    {
        return Err(format!("tags {tags:?}"));
    }
    Ok(())
}

fn request(tok: &Tokenizer, prompt: &str, sampler: SamplerConfig) -> GenerateRequest {
    GenerateRequest {
        prompt: tok.encode(prompt, true, false).unwrap(),
        max_tokens: 96,
        sampler,
        stop_ids: tok.stop_ids(),
        constraint: None,
    }
}

fn plain(m: &LoadedModel, req: &GenerateRequest) -> GenerateOutput {
    let mut kv = m.model.new_kv_cache(m.model.default_kv_type(), 512, 1);
    generate(&m.model, &mut kv, req, |_| true).unwrap()
}

fn speculative(m: &LoadedModel, req: &GenerateRequest, policy: TreeBudget) -> GenerateOutput {
    let mut kv = m.model.new_kv_cache(m.model.default_kv_type(), 512, 1);
    let mut policy = policy;
    let mut drafter = NgramDrafter::default();
    generate_speculative(&m.model, &mut kv, req, &mut drafter, &mut policy, |_| true).unwrap()
}

#[test]
fn schema_constrained_output_obeys_and_speculation_changes_nothing() {
    let Some(m) = load() else { return };
    let tok = m.tokenizer.as_ref().unwrap();
    let compiler = GrammarCompiler::new(tok).unwrap();
    let constraint = compiler.compile(&Grammar::JsonSchema(schema())).unwrap();
    let prompts = [
        "The new staff directory entry, as JSON:\n",
        "Record for the user who signed up today:\n",
    ];
    for (i, p) in prompts.iter().enumerate() {
        for sampler in [SamplerConfig::default(), common::nucleus(7 + i as u64)] {
            let mut req = request(tok, p, sampler.clone());
            req.constraint = Some(constraint.clone());
            let want = plain(&m, &req);
            let text = tok.decode(&want.tokens).unwrap();
            let v: Value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{text:?} does not parse: {e}"));
            obeys_schema(&v).unwrap_or_else(|e| panic!("{text:?}: {e}"));
            assert_eq!(want.finish.as_str(), "stop", "{text:?}");
            for policy in [TreeBudget::new(16), TreeBudget::fixed(16)] {
                let got = speculative(&m, &req, policy);
                assert_eq!(got.tokens, want.tokens, "{p:?} {sampler:?}");
                assert_eq!(got.finish, want.finish);
            }
            // The schema's keys and punctuation are forced: drafted for
            // free, and the grammar drafts each value's end with the run it
            // forces after it, so a reply commits several tokens per pass.
            // (How many depends on how much of it is free text: 2.91 and
            // 2.12 on these two greedy replies; issue 14 asks for 2.)
            let fixed = speculative(&m, &req, TreeBudget::fixed(16));
            eprintln!(
                "{p:?}: {} tokens in {} passes ({:.2} per pass), {} drafted, {} accepted: {text}",
                fixed.stats.gen_tokens,
                fixed.stats.decode_passes + 1,
                fixed.stats.tokens_per_pass(),
                fixed.stats.drafted,
                fixed.stats.accepted
            );
            if sampler.is_greedy() {
                assert!(fixed.stats.tokens_per_pass() >= 2.0, "{:?}", fixed.stats);
            }
        }
    }
}

#[test]
fn a_regex_constrains_the_whole_output() {
    let Some(m) = load() else { return };
    let tok = m.tokenizer.as_ref().unwrap();
    let compiler = GrammarCompiler::new(tok).unwrap();
    let c = compiler
        .compile(&Grammar::Regex("[0-9]{3}-[0-9]{4}".into()))
        .unwrap();
    let mut req = request(tok, "Call us at", SamplerConfig::default());
    req.constraint = Some(c);
    let out = plain(&m, &req);
    let text = tok.decode(&out.tokens).unwrap();
    let b = text.as_bytes();
    assert!(
        b.len() == 8
            && b[3] == b'-'
            && b.iter()
                .enumerate()
                .all(|(i, c)| i == 3 || c.is_ascii_digit()),
        "{text:?}"
    );
    assert_eq!(
        speculative(&m, &req, TreeBudget::fixed(16)).tokens,
        out.tokens
    );
}

#[test]
fn grammars_that_do_not_compile_are_refused_with_the_reason() {
    let Some(m) = load() else { return };
    let compiler = GrammarCompiler::new(m.tokenizer.as_ref().unwrap()).unwrap();
    for (g, kind) in [
        (
            Grammar::JsonSchema(json!({"type": "no-such-type"})),
            "json_schema",
        ),
        (
            Grammar::JsonSchema(json!({"$ref": "#/$defs/missing"})),
            "json_schema",
        ),
        (Grammar::Regex("(unclosed".into()), "regex"),
        (Grammar::Lark("start: ( \"a\"".into()), "grammar"),
    ] {
        let e = compiler
            .compile(&g)
            .err()
            .unwrap_or_else(|| panic!("{g:?} compiled"));
        assert_eq!(e.kind, kind);
        assert!(!e.reason.is_empty());
    }
}

#[test]
fn constrained_requests_in_a_batch_equal_their_solo_runs() {
    let Some(m) = load() else { return };
    let tok = m.tokenizer.clone().unwrap();
    let compiler = GrammarCompiler::new(&tok).unwrap();
    let constraint = compiler.compile(&Grammar::JsonSchema(schema())).unwrap();
    let prompts: Vec<String> = (0..4)
        .map(|i| format!("Directory entry {i}, as JSON:\n"))
        .collect();
    let samplers: Vec<SamplerConfig> = (0..4)
        .map(|i| {
            if i % 2 == 0 {
                SamplerConfig::default()
            } else {
                common::nucleus(i)
            }
        })
        .collect();
    let solo: Vec<Vec<u32>> = (0..4)
        .map(|i| {
            let mut req = request(&tok, &prompts[i], samplers[i].clone());
            req.constraint = Some(constraint.clone());
            plain(&m, &req).tokens
        })
        .collect();
    let kv = m.model.new_kv_cache(m.model.default_kv_type(), 512, 4);
    let engine = spawn_engine(m.model, kv, EngineConfig::default());
    let mut rxs = Vec::new();
    for i in 0..4 {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        engine
            .submit(Request {
                prompt: tok.encode(&prompts[i], true, false).unwrap(),
                params: RequestParams {
                    max_tokens: 96,
                    sampler: samplers[i].clone(),
                    stop_ids: tok.stop_ids(),
                    logit_bias: Vec::new(),
                    logprobs: None,
                    constraint: Some(constraint.clone()),
                    speculate: true,
                },
                score: None,
                tenant: "t".into(),
                events: tx,
            })
            .unwrap();
        rxs.push(rx);
    }
    for (i, mut rx) in rxs.into_iter().enumerate() {
        let tokens = common::tokens_until_finished(&mut rx);
        assert_eq!(tokens, solo[i], "request {i}");
    }
}

/// An object schema that names its properties and says nothing of others
/// is closed, as llama.cpp's grammars and OpenAI's strict mode read it: a
/// key it does not name is refused (a small model otherwise repeats made-up
/// keys until `max_tokens`), nested objects too; `"additionalProperties":
/// true` keeps it open.
#[test]
fn objects_are_closed_unless_the_schema_opens_them() {
    let Some(m) = load() else { return };
    let tok = m.tokenizer.as_ref().unwrap();
    let compiler = GrammarCompiler::new(tok).unwrap();
    let allowed = |schema: Value, text: &str| {
        let ids = tok.encode(text, false, false).unwrap();
        let c = compiler.compile(&Grammar::JsonSchema(schema)).unwrap();
        let (valid, _) = c.fit_draft(&[], &ids);
        (valid, ids.len())
    };
    let named =
        json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]});
    let extra = r#"{"a": 1, "zz": 2}"#;
    let (valid, all) = allowed(named.clone(), r#"{"a": 1}"#);
    assert_eq!(valid, all, "the named key is allowed");
    let (valid, all) = allowed(named, extra);
    assert!(
        valid < all,
        "an unnamed key was allowed ({valid} of {all} tokens)"
    );
    let open = json!({"type": "object", "properties": {"a": {"type": "integer"}},
                      "required": ["a"], "additionalProperties": true});
    let (valid, all) = allowed(open, extra);
    assert_eq!(
        valid, all,
        "additionalProperties: true keeps the object open"
    );
    let nested = json!({"type": "object", "properties": {"o": {"type": "object",
                        "properties": {"a": {"type": "integer"}}}}, "required": ["o"]});
    let (valid, all) = allowed(nested, r#"{"o": {"a": 1, "zz": 2}}"#);
    assert!(valid < all, "an unnamed key of a nested object was allowed");
}
