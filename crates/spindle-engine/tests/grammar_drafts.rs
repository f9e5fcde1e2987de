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
