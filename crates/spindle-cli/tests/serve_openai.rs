//! `spindle serve` checked from outside with the official `openai` Python
//! client (tests/openai/check_server.py): endpoints, streaming, `n`, stop,
//! logprobs, seeds, every error case, concurrency equal to solo output,
//! disconnects, 429 and fuzzed bodies.
//!
//! The client comes from pip: CI installs it with
//! `python3 -m pip install --target target/pydeps openai` (see `.ci/run`);
//! `SPINDLE_PYDEPS` points elsewhere. Without it the test skips with a note,
//! except under `SPINDLE_REQUIRE_MODEL=1` (CI), where it fails.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// A server process, killed when dropped.
struct Server {
    child: Child,
    url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(model: &Path, extra: &[&str]) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_spindle"))
        .args(["serve", "-m"])
        .arg(model)
        .args(["--port", "0", "-t", "2"])
        .args(extra)
        // Errors only: the access log of thousands of checked requests
        // would bury check_server.py's report (serve_props checks the log).
        .env("SPINDLE_LOG", "error")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spindle serve starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("piped"))
        .read_line(&mut line)
        .expect("the server prints its URL");
    let url = line.trim().to_string();
    assert!(url.starts_with("http://127.0.0.1:"), "{url:?}");
    Server { child, url }
}

/// Whether python3 can import the client (from `pydeps` or its own paths).
fn client_available() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import openai, jsonschema"])
        .env("PYTHONPATH", common::pydeps())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        let fix = "python3 -m pip install --target target/pydeps openai jsonschema";
        assert!(
            std::env::var("SPINDLE_REQUIRE_MODEL").ok().as_deref() != Some("1"),
            "the openai Python client or jsonschema is missing: {fix}"
        );
        eprintln!("skipping: the openai Python client or jsonschema is missing ({fix})");
    }
    ok
}

/// `spindle run` output without speculation: the reference the server
/// (which speculates) must reproduce; greedy, or temperature 0.8, top-p 0.9,
/// seed 11 and no other filter.
fn solo(model: &Path, prompt: &str, greedy: bool) -> String {
    let sampling: &[&str] = if greedy {
        &["--temp", "0"]
    } else {
        &[
            "--temp", "0.8", "--top-p", "0.9", "--top-k", "0", "--min-p", "0", "--seed", "11",
        ]
    };
    let mut args = vec!["-p", prompt, "-n", "24"];
    args.extend(sampling);
    run_text(model, &args)
}

/// The text of `spindle run -m MODEL ARGS --spec off --json`.
fn run_text(model: &Path, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_spindle"))
        .args(["run", "-m"])
        .arg(model)
        .args(args)
        .args(["--spec", "off", "--json"])
        .output()
        .expect("spindle run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["text"].as_str().unwrap().to_string()
}

/// `spindle run --spec off --json-schema` output (greedy, 64 tokens): what
/// the server, speculating, must give under the same schema.
fn solo_schema(model: &Path) -> String {
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "title": {"type": "string", "maxLength": 40},
            "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
            "genres": {"type": "array", "items": {"enum": ["drama", "comedy", "horror"]}, "maxItems": 2}
        },
        "required": ["title", "year", "genres"],
        "additionalProperties": false
    });
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("schema.json");
    std::fs::write(&file, schema.to_string()).unwrap();
    let prompt = "My favourite film, as JSON:";
    let path = file.to_str().expect("a UTF-8 temporary path");
    let text = run_text(
        model,
        &[
            "-p",
            prompt,
            "-n",
            "64",
            "--temp",
            "0",
            "--json-schema",
            path,
        ],
    );
    serde_json::json!({"prompt": prompt, "schema": schema, "text": text}).to_string()
}

#[test]
fn openai_client_against_a_live_server() {
    let Some(model) = common::real_model() else {
        return;
    };
    if !client_available() {
        return;
    }
    let prompts = ["The history of the bicycle begins", "def fibonacci(n):"];
    let reference = |greedy: bool| {
        let map: serde_json::Map<String, serde_json::Value> = prompts
            .iter()
            .map(|p| (p.to_string(), solo(&model, p, greedy).into()))
            .collect();
        serde_json::Value::Object(map).to_string()
    };
    let (greedy, sampled) = (reference(true), reference(false));
    let solo_schema = solo_schema(&model);
    let key = "test-key-123";
    let server = start(
        &model,
        &["--api-key", key, "--max-seqs", "8", "--ctx", "2048"],
    );
    let small = start(
        &model,
        &["--max-seqs", "1", "--max-waiting", "1", "--ctx", "512"],
    );
    let impatient = start(&model, &["--max-seqs", "1", "--request-timeout", "1"]);
    // A KV pool of 8 full-attention blocks (128 tokens) beside the sliding
    // windows of 4 sequences at --ctx 256: 4 x 15 layers x 256 tokens +
    // 3 layers x 128 tokens, at 1 KiB per layer and token.
    let pool = (4 * 15 * 256 + 3 * 128) * 1024;
    let tight = start(
        &model,
        &[
            "--max-seqs",
            "4",
            "--ctx",
            "256",
            "--kv-memory",
            &pool.to_string(),
        ],
    );
    // Every --spec mode `spindle run` takes: a draft model (here the model
    // itself, as a separate file would be), and the model with layers
    // skipped. Each slot gets its own drafter and draft KV.
    let draft_arg = format!("draft:{}", model.display());
    let drafting: Vec<(&str, Server)> = [("draft", draft_arg.as_str()), ("self", "self")]
        .into_iter()
        .map(|(mode, spec)| {
            let s = start(&model, &["--spec", spec, "--max-seqs", "4", "--ctx", "512"]);
            (mode, s)
        })
        .collect();
    let draft_urls = serde_json::Value::Object(
        drafting
            .iter()
            .map(|(mode, s)| (mode.to_string(), s.url.clone().into()))
            .collect(),
    )
    .to_string();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/openai/check_server.py");
    let status = Command::new("python3")
        .arg(&script)
        .env("PYTHONPATH", common::pydeps())
        .env("SPINDLE_URL", &server.url)
        .env("SPINDLE_KEY", key)
        .env("SPINDLE_SMALL_URL", &small.url)
        .env("SPINDLE_TIMEOUT_URL", &impatient.url)
        .env("SPINDLE_TIGHT_URL", &tight.url)
        .env("SPINDLE_MODEL", "gemma-3-270m-q4_k_m")
        .env("SPINDLE_SOLO", greedy)
        .env("SPINDLE_SOLO_SAMPLED", sampled)
        .env("SPINDLE_DRAFT_URLS", draft_urls)
        .env("SPINDLE_SOLO_SCHEMA", solo_schema)
        .status()
        .expect("python3 runs");
    assert!(
        status.success(),
        "check_server.py failed (its output is above)"
    );
}
