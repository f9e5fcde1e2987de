//! Drafts from the grammar, on a small real tokenizer: the run a JSON
//! schema forces, and the guesses that a value ends here followed by the
//! run forced after it. llguidance decides what is valid; these tests check
//! that the branches Spindle builds from it are exactly those.

use std::path::Path;

use serde_json::json;
use spindle_engine::constraint::{Constraint, Grammar, GrammarCompiler};
use spindle_model::tokenizer::Tokenizer;

fn tokenizer() -> Tokenizer {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../spindle-model/tests/fixtures/tokenizer/hf_qwen2");
    Tokenizer::from_hf_dir(&dir).expect("the fixture tokenizer loads")
}

/// A matcher for `schema` that has consumed the tokens of `prefix`.
fn after(tok: &Tokenizer, schema: serde_json::Value, prefix: &str) -> Constraint {
    let compiler = GrammarCompiler::new(tok).unwrap();
    let mut c = compiler.compile(&Grammar::JsonSchema(schema)).unwrap();
    for id in tok.encode(prefix, false, false).unwrap() {
        c.consume(id);
    }
    c
}

fn texts(tok: &Tokenizer, branches: &[Vec<u32>]) -> Vec<String> {
    branches.iter().map(|b| tok.decode(b).unwrap()).collect()
}

#[test]
fn a_value_end_is_drafted_with_the_run_it_forces() {
    let tok = tokenizer();
    let schema = json!({"type": "object", "properties": {
        "a": {"type": "string"}, "b": {"type": "integer"}, "c": {"type": "array", "items": {"type": "string"}}},
        "required": ["a", "b", "c"], "additionalProperties": false});
    // Inside the first string: closing it forces the next key.
    let c = after(&tok, schema.clone(), r#"{"a": "xy"#);
    let got = texts(&tok, &c.closers(&[], 16));
    assert!(got.contains(&r#"", "b": "#.to_string()), "{got:?}");
    assert!(got.iter().all(|t| t.ends_with(r#""b": "#)), "{got:?}");
    // The depth bounds a branch.
    for b in c.closers(&[], 2) {
        assert!(b.len() <= 2);
    }
    // After digits: a comma ends the number and forces the next key.
    let c = after(&tok, schema.clone(), r#"{"a": "x", "b": 12"#);
    let got = texts(&tok, &c.closers(&[], 16));
    assert!(got.contains(&r#", "c": ["#.to_string()), "{got:?}");
    // The forced run itself: `forced` then a closer after it.
    let mut c = after(&tok, schema.clone(), r#"{"a"#);
    let forced = c.forced();
    // (The opening quote is left to the model: it may merge with the text
    // after it into one token.)
    assert_eq!(tok.decode(&forced).unwrap(), r#"": "#);
    // A quote there opens the string, after which nothing is forced.
    assert!(c.closers(&forced, 16).is_empty());
}

#[test]
fn a_value_end_with_a_free_choice_after_it_is_not_drafted_alone() {
    let tok = tokenizer();
    // In an array of strings, a closing quote is followed by `,` or `]`:
    // nothing forced, so a bare `"` would save no pass.
    let schema = json!({"type": "array", "items": {"type": "string"}});
    let c = after(&tok, schema, r#"["x"#);
    for b in c.closers(&[], 16) {
        assert!(b.len() > 1, "{:?}", tok.decode(&b));
    }
    // Past the end of the grammar nothing is guessed.
    let schema = json!({"type": "integer", "minimum": 0, "maximum": 9});
    let c = after(&tok, schema, "7");
    assert!(c.closers(&[], 16).is_empty());
}

/// The token step draws without the mask first and computes it only when
/// that token is forbidden. That must choose exactly what drawing under the
/// mask chooses: checked here against masking every time, over random
/// logits, greedy and sampled, at every step of a JSON reply.
#[test]
fn drawing_before_masking_chooses_what_masking_chooses() {
    use spindle_engine::generate::{next_token, FullRow, Next, TokenRules};
    use spindle_engine::{sample, SamplerConfig};

    let tok = tokenizer();
    let schema = json!({"type": "object", "properties": {
        "a": {"type": "string", "maxLength": 6}, "b": {"type": "integer"}},
        "required": ["a", "b"], "additionalProperties": false});
    let vocab = tok.vocab_size();
    let stop = tok.stop_ids();
    let mut state = 0x9e3779b97f4a7c15u64;
    let mut rand = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32
    };
    for (seed, temperature) in [(0, 0.0), (1, 1.0), (2, 0.7), (3, 1.3)] {
        let sampler = SamplerConfig {
            temperature,
            seed,
            ..SamplerConfig::default()
        };
        let rules = TokenRules {
            sampler: &sampler,
            stop_ids: &stop,
            logit_bias: &[],
            max_tokens: 40,
            max_len: 1 << 20,
            needs_logits: false,
        };
        let compiler = GrammarCompiler::new(&tok).unwrap();
        let mut lazy = compiler
            .compile(&Grammar::JsonSchema(schema.clone()))
            .unwrap();
        let mut masked = lazy.clone();
        let mut history = vec![1u32];
        let mut generated = 0;
        for _ in 0..40 {
            // Random logits; every other step one allowed token stands out
            // (a model that agrees with the grammar), so both paths run.
            let mut logits: Vec<f32> = (0..vocab).map(|_| 8.0 * rand()).collect();
            if rand() < 0.5 {
                let mut probe = logits.clone();
                if masked.mask_logits(&mut probe, &stop) {
                    let allowed: Vec<usize> =
                        (0..vocab).filter(|&i| probe[i].is_finite()).collect();
                    let pick = allowed[(rand() * allowed.len() as f32) as usize % allowed.len()];
                    logits[pick] += 30.0;
                }
            }
            let mut adjusted = logits.clone();
            let want = if masked.mask_logits(&mut adjusted, &stop) {
                Some(sample(&sampler, &adjusted, &history, history.len()))
            } else {
                None
            };
            let mut h = history.clone();
            let got = next_token(
                &rules,
                &mut FullRow(&logits),
                &mut h,
                &mut generated,
                Some(&mut lazy),
                &mut |_, _| true,
            )
            .unwrap();
            // What the step emitted (nothing when it ended at a stop token
            // or because the grammar allowed nothing more).
            let emitted = (h.len() > history.len()).then(|| *h.last().unwrap());
            match (want, emitted) {
                (Some(w), Some(g)) => assert_eq!(w, g, "temperature {temperature}"),
                (Some(w), None) => assert!(stop.contains(&w), "ended instead of {w}"),
                (None, None) => {}
                (None, Some(g)) => panic!("the mask ended the output, the step chose {g}"),
            }
            let Some(t) = emitted else { break };
            masked.consume(t);
            history = h;
            if matches!(got, Next::End(_)) {
                break;
            }
        }
        // (The reference computed two masks a step on the biased ones.)
        assert!(
            lazy.timing.masks < masked.timing.masks / 2,
            "{:?} vs {:?}",
            lazy.timing,
            masked.timing
        );
    }
}
