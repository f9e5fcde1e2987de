//! Constrained decoding on the tiny random models (vocabulary 256), with a
//! byte-level vocabulary made for them: under a JSON schema the output
//! parses and obeys it, and speculative decoding (alone, adaptive and
//! fixed budgets) and the serving loop (8 requests at once, trees on) emit
//! exactly what plain constrained decoding emits, greedy and sampled, with
//! and without top-p (the two ways a token step meets the mask).

mod common;

use common::tiny;
use serde_json::{json, Value};
use spindle_engine::constraint::{Constraint, Grammar, GrammarCompiler};
use spindle_engine::scheduler::{spawn_engine, EngineConfig, Request, RequestParams};
use spindle_engine::speculative::{generate_speculative, NgramDrafter, TreeBudget};
use spindle_engine::{generate, GenerateRequest, SamplerConfig};
use spindle_model::tokenizer::{GgufVocab, Tokenizer};
use spindle_model::LoadedModel;

/// GPT-2's printable stand-in for each byte (byte-level BPE token text).
fn byte_char(b: u8) -> char {
    let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
    if printable(b) {
        return b as char;
    }
    let offset = (0..b).filter(|&c| !printable(c)).count() as u32;
    char::from_u32(256 + offset).expect("a valid char")
}

/// One token per byte; byte 0 is the end-of-text control token.
fn byte_tokenizer() -> Tokenizer {
    let mut types = vec![1; 256];
    types[0] = 3;
    let v = GgufVocab {
        model: "gpt2".into(),
        tokens: (0..=255u8).map(|b| byte_char(b).to_string()).collect(),
        token_types: Some(types),
        merges: Some(Vec::new()),
        eos_id: Some(0),
        ..GgufVocab::default()
    };
    Tokenizer::from_gguf_vocab(v).expect("a byte vocabulary")
}

fn schema() -> Value {
    json!({"type": "object", "properties": {
        "a": {"type": "string", "maxLength": 6},
        "n": {"type": "integer", "minimum": 0, "maximum": 999},
        "e": {"enum": ["x", "yy", "zzz"]}},
        "required": ["a", "n", "e"], "additionalProperties": false})
}

fn obeys(tok: &Tokenizer, tokens: &[u32]) -> Result<(), String> {
    let text = tok.decode(tokens).map_err(|e| e.to_string())?;
    let v: Value = serde_json::from_str(&text).map_err(|e| format!("{text:?}: {e}"))?;
    let a = v["a"].as_str().ok_or("a")?;
    let n = v["n"].as_u64().ok_or("n")?;
    let e = v["e"].as_str().ok_or("e")?;
    let keys = v.as_object().ok_or("object")?.len();
    if a.chars().count() > 6 || n > 999 || !["x", "yy", "zzz"].contains(&e) || keys != 3 {
        return Err(format!("{text:?} breaks the schema"));
    }
    Ok(())
}

fn samplers(i: u64) -> [SamplerConfig; 3] {
    [
        SamplerConfig::default(),
        SamplerConfig {
            temperature: 1.0,
            seed: 40 + i,
            ..SamplerConfig::default()
        },
        SamplerConfig {
            temperature: 0.8,
            top_p: 0.9,
            seed: 70 + i,
            ..SamplerConfig::default()
        },
    ]
}

fn prompt(i: u64) -> Vec<u32> {
    (0..10 + i as u32 % 4)
        .map(|k| 32 + (k * 13 + i as u32 * 5) % 90)
        .collect()
}

fn request(i: u64, sampler: SamplerConfig, c: &Constraint) -> GenerateRequest {
    GenerateRequest {
        prompt: prompt(i),
        max_tokens: 60,
        sampler,
        stop_ids: vec![0],
        constraint: Some(c.clone()),
    }
}

fn plain(m: &LoadedModel, req: &GenerateRequest) -> Vec<u32> {
    let mut kv = m.model.new_kv_cache(m.model.default_kv_type(), 128, 1);
    generate(&m.model, &mut kv, req, |_| true).unwrap().tokens
}

#[test]
fn constrained_speculation_and_batches_equal_plain_constrained_decoding() {
    let tok = byte_tokenizer();
    let compiler = GrammarCompiler::new(&tok).unwrap();
    let c = compiler.compile(&Grammar::JsonSchema(schema())).unwrap();
    for arch in ["gemma3", "qwen2", "llama"] {
        let m = tiny(arch);
        let mut wants = Vec::new();
        let mut drafted = 0;
        for i in 0..8u64 {
            let sampler = samplers(i)[i as usize % 3].clone();
            let req = request(i, sampler, &c);
            let want = plain(&m, &req);
            obeys(&tok, &want).unwrap_or_else(|e| panic!("{arch} {i}: {e}"));
            for policy in [TreeBudget::new(16), TreeBudget::fixed(16)] {
                let mut kv = m.model.new_kv_cache(m.model.default_kv_type(), 128, 1);
                let mut policy = policy;
                let got = generate_speculative(
                    &m.model,
                    &mut kv,
                    &req,
                    &mut NgramDrafter::default(),
                    &mut policy,
                    |_| true,
                )
                .unwrap();
                assert_eq!(got.tokens, want, "{arch} request {i}, speculative");
                drafted += got.stats.drafted;
            }
            wants.push((req, want));
        }
        // Forced keys and guessed value ends were drafted, not just plain steps.
        assert!(drafted > 100, "{arch}: {drafted} drafted");
        // The same 8 requests at once in the serving loop, drafting.
        let config = EngineConfig {
            max_batch_tokens: 32,
            tree_budget: Some(8),
            fixed_tree_budget: true,
            ..EngineConfig::default()
        };
        let m2 = tiny(arch);
        let kv = m2.model.new_kv_cache(m2.model.default_kv_type(), 128, 8);
        let e = spawn_engine(m2.model, kv, config);
        let mut rxs = Vec::new();
        for (req, _) in &wants {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            e.submit(Request {
                prompt: req.prompt.clone(),
                params: RequestParams {
                    max_tokens: req.max_tokens,
                    sampler: req.sampler.clone(),
                    stop_ids: req.stop_ids.clone(),
                    logit_bias: Vec::new(),
                    logprobs: None,
                    constraint: req.constraint.clone(),
                    speculate: true,
                },
                tenant: "t".into(),
                score: None,
                events: tx,
            })
            .unwrap();
            rxs.push(rx);
        }
        for (i, mut rx) in rxs.into_iter().enumerate() {
            let got = common::tokens_until_finished(&mut rx);
            assert_eq!(got, wants[i].1, "{arch} request {i}, in the batch");
        }
    }
}

/// A model's output rows may run past its tokenizer's vocabulary (padding
/// rows: gpt-oss has 201,088 rows for 200,019 tokens). Asking the grammar
/// about such an id, as the greedy step does before it computes a mask,
/// must say no and leave the grammar as it was: the matcher takes an
/// unknown id as an error and stops, which ended replies at that token.
#[test]
fn ids_past_the_vocabulary_are_refused_without_ending_the_grammar() {
    let tok = byte_tokenizer();
    let compiler = GrammarCompiler::new(&tok).unwrap();
    let mut c = compiler
        .compile(&Grammar::Lark("start: \"ab\"".into()))
        .unwrap();
    let stops = tok.stop_ids();
    c.consume(u32::from(b'a'));
    for past in [256, 300, 1 << 20] {
        assert!(!c.allows(past, &stops), "{past}");
    }
    assert!(c.allows(u32::from(b'b'), &stops));
    let mut logits = vec![0.0f32; 300];
    assert!(c.mask_logits(&mut logits, &stops), "the grammar ended");
    let allowed: Vec<usize> = (0..300).filter(|&i| logits[i].is_finite()).collect();
    assert_eq!(allowed, [usize::from(b'b')]);
}
