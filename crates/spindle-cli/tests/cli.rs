//! The `spindle` binary end to end: bad input gives one clear line and a
//! non-zero exit; the real model's commands give well-formed output.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn spindle(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_spindle"))
        .args(args)
        .output()
        .expect("run spindle")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn fails_with(args: &[&str], needle: &str) {
    let o = spindle(args);
    let err = stderr(&o);
    assert!(!o.status.success(), "{args:?} should fail; stderr: {err}");
    assert!(
        err.contains(needle),
        "{args:?}: stderr should mention '{needle}', got: {err}"
    );
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
}

fn tiny(arch: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../spindle-model/tests/fixtures/tiny")
        .join(arch)
}

fn tmp(name: &str, bytes: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("spindle-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn missing_file_is_a_clear_error() {
    fails_with(
        &["run", "-m", "/nonexistent/model.gguf", "-p", "hi"],
        "no such file",
    );
}

#[test]
fn a_file_that_is_not_a_model_is_a_clear_error() {
    let p = tmp(
        "notes.gguf",
        b"these are not the weights you are looking for",
    );
    fails_with(
        &["run", "-m", p.to_str().unwrap(), "-p", "hi"],
        "not a GGUF file",
    );
}

/// Runs spindle and kills it after 30 s, so that a command blocked on a FIFO
/// fails the test instead of hanging it.
#[cfg(unix)]
fn spindle_within_30s(args: &[&str]) -> Output {
    use std::time::{Duration, Instant};
    let mut child = Command::new(env!("CARGO_BIN_EXE_spindle"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run spindle");
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("spindle {args:?} hung");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

#[cfg(unix)]
#[test]
fn fifos_and_symlink_loops_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("model.gguf");
    let made = Command::new("mkfifo").arg(&fifo).status();
    assert!(made.is_ok_and(|s| s.success()), "mkfifo failed");
    let (a, b) = (dir.path().join("a.gguf"), dir.path().join("b.gguf"));
    std::os::unix::fs::symlink(&b, &a).unwrap();
    std::os::unix::fs::symlink(&a, &b).unwrap();
    for (path, needle) in [(&fifo, "is a FIFO (named pipe)"), (&a, "is a symlink loop")] {
        let m = path.to_str().unwrap();
        for args in [
            vec!["run", "-m", m, "-p", "hi"],
            vec!["run", "-m", m, "--ctx", "64", "-p", "hi"],
            vec!["tokenize", "-m", m, "hi"],
            vec!["plan", m],
        ] {
            let o = spindle_within_30s(&args);
            let err = stderr(&o);
            assert!(!o.status.success(), "{args:?} should fail; stderr: {err}");
            assert!(
                err.contains(needle),
                "{args:?}: want '{needle}', got: {err}"
            );
        }
    }
}

#[test]
fn truncated_model_is_a_clear_error() {
    let bytes = std::fs::read(tiny("gemma3").join("model.gguf")).unwrap();
    for cut in [bytes.len() / 2, 1000, 30] {
        let p = tmp(&format!("cut{cut}.gguf"), &bytes[..cut]);
        fails_with(
            &["score", "-m", p.to_str().unwrap(), "--ids", "1,2,3"],
            "truncated",
        );
    }
}

#[test]
fn unsupported_architecture_is_a_clear_error() {
    let mut bytes = std::fs::read(tiny("gemma3").join("model.gguf")).unwrap();
    // Rename the architecture value "gemma3" (its keys are renamed too, so the
    // file stays self-consistent for a model of architecture "gemmaX").
    let (from, to) = (b"gemma3", b"gemmaX");
    let mut i = 0;
    while i + from.len() <= bytes.len() {
        if &bytes[i..i + from.len()] == from {
            bytes[i..i + from.len()].copy_from_slice(to);
        }
        i += 1;
    }
    let p = tmp("arch.gguf", &bytes);
    fails_with(
        &["score", "-m", p.to_str().unwrap(), "--ids", "1,2,3"],
        "unsupported architecture 'gemmaX'",
    );
}

/// A minimal, self-consistent Llama GGUF v3 whose embedding is Q8_1 (an
/// activation type no model file should hold), a type Spindle does not
/// compute with.
fn gguf_with_q8_1() -> Vec<u8> {
    let mut b = Vec::new();
    let s = |b: &mut Vec<u8>, t: &str| {
        b.extend((t.len() as u64).to_le_bytes());
        b.extend(t.as_bytes());
    };
    let u32s = [
        ("llama.block_count", 0u32),
        ("llama.embedding_length", 32),
        ("llama.feed_forward_length", 32),
        ("llama.attention.head_count", 1),
    ];
    b.extend(b"GGUF");
    b.extend(3u32.to_le_bytes());
    b.extend(1u64.to_le_bytes()); // tensors
    b.extend((1 + u32s.len() as u64).to_le_bytes()); // kv
    s(&mut b, "general.architecture");
    b.extend(8u32.to_le_bytes()); // string
    s(&mut b, "llama");
    for (k, v) in u32s {
        s(&mut b, k);
        b.extend(4u32.to_le_bytes()); // uint32
        b.extend(v.to_le_bytes());
    }
    s(&mut b, "token_embd.weight");
    b.extend(2u32.to_le_bytes());
    b.extend(32u64.to_le_bytes());
    b.extend(4u64.to_le_bytes());
    b.extend(9u32.to_le_bytes()); // Q8_1
    b.extend(0u64.to_le_bytes());
    while b.len() % 32 != 0 {
        b.push(0);
    }
    b.extend(vec![0u8; 4 * 36]);
    b
}

#[test]
fn unsupported_tensor_type_names_the_tensor_and_type() {
    let p = tmp("q81.gguf", &gguf_with_q8_1());
    fails_with(
        &["score", "-m", p.to_str().unwrap(), "--ids", "1,2"],
        "token_embd.weight",
    );
    fails_with(
        &["score", "-m", p.to_str().unwrap(), "--ids", "1,2"],
        "Q8_1",
    );
}

#[test]
fn prompt_longer_than_the_context_is_a_clear_error() {
    let m = tiny("llama").join("model.gguf");
    fails_with(
        &[
            "score",
            "-m",
            m.to_str().unwrap(),
            "--ids",
            "1,2,3,4,5,6",
            "--ctx",
            "4",
        ],
        "context",
    );
}

#[test]
fn a_model_without_a_tokenizer_says_so() {
    let m = tiny("qwen3").join("model.gguf");
    fails_with(
        &["run", "-m", m.to_str().unwrap(), "-p", "hello"],
        "tokenizer",
    );
}

#[test]
fn bad_arguments_are_clear() {
    let m = tiny("llama").join("model.gguf");
    fails_with(
        &["score", "-m", m.to_str().unwrap(), "--ids", "1,x,3"],
        "'x' is not a token id",
    );
    fails_with(
        &["run", "-m", m.to_str().unwrap(), "-p", "a", "--temp=-1"],
        "--temp",
    );
    fails_with(
        &["score", "-m", m.to_str().unwrap(), "--ids", "1,999999"],
        "outside the vocabulary",
    );
    fails_with(
        &[
            "score",
            "-m",
            m.to_str().unwrap(),
            "--ids",
            "1,2",
            "--kv-type",
            "q4",
        ],
        "not one of f16, q8_0, f32",
    );
    fails_with(
        &[
            "run",
            "-m",
            m.to_str().unwrap(),
            "-p",
            "a",
            "--spec",
            "maybe",
        ],
        "not one of auto, ngram",
    );
    fails_with(
        &[
            "score",
            "-m",
            m.to_str().unwrap(),
            "--ids",
            "1,2",
            "--act-rounding",
            "q8k",
        ],
        "use block32 (the default) or ggml",
    );
    // gemma3's tiny KV rows have 16 values: not whole q8_0 blocks.
    let g = tiny("gemma3").join("model.gguf");
    fails_with(
        &[
            "score",
            "-m",
            g.to_str().unwrap(),
            "--ids",
            "1,2",
            "--kv-type",
            "q8_0",
        ],
        "blocks of 32",
    );
}

#[test]
fn score_on_token_ids_of_a_tiny_model() {
    let m = tiny("gemma2").join("model.gguf");
    let o = spindle(&[
        "score",
        "-m",
        m.to_str().unwrap(),
        "--ids",
        "5,17,99,3",
        "--top",
        "3",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["tokens"], serde_json::json!([5, 17, 99, 3]));
    let pos = v["positions"].as_array().unwrap();
    assert_eq!(pos.len(), 3);
    for (p, want) in pos.iter().zip([17, 99, 3]) {
        assert_eq!(p["id"], want);
        let lp = p["logprob"].as_f64().unwrap();
        assert!(lp < 0.0 && lp.is_finite());
        let top = p["top"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        assert!(top[0]["logprob"].as_f64().unwrap() >= lp);
    }
}

/// `--act-rounding ggml` reaches the kernels: on a quantized model the
/// log-probs move (f16 activation scales for Q4_0/Q8_0), by rounding only.
#[test]
fn act_rounding_ggml_changes_only_the_rounding() {
    let m = tiny("qwen3moe").join("model-quant.gguf");
    let logprobs = |rounding: &str| -> Vec<f64> {
        let o = spindle(&[
            "score",
            "-m",
            m.to_str().unwrap(),
            "--ids",
            "5,17,99,3,42,7",
            "--act-rounding",
            rounding,
            "--json",
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v["positions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["logprob"].as_f64().unwrap())
            .collect()
    };
    let (exact, ggml) = (logprobs("block32"), logprobs("ggml"));
    assert_eq!(exact.len(), 5);
    assert_ne!(exact, ggml, "ggml rounding left every log-prob unchanged");
    for (a, b) in exact.iter().zip(&ggml) {
        assert!((a - b).abs() < 5e-2, "{a} vs {b}");
    }
}

#[test]
fn an_empty_api_key_is_refused_at_start() {
    let model = tiny("qwen2").join("model.gguf");
    let m = model.to_str().unwrap();
    let why = "the API key is empty";
    fails_with(&["serve", "-m", m, "--api-key", ""], why);
    fails_with(&["serve", "-m", m, "--api-key", "  "], why);
    let o = Command::new(env!("CARGO_BIN_EXE_spindle"))
        .args(["serve", "-m", m])
        .env("SPINDLE_API_KEY", "")
        .output()
        .expect("run spindle");
    assert!(
        !o.status.success() && stderr(&o).contains(why),
        "{}",
        stderr(&o)
    );
    let empty = tmp("empty-key", b"\n");
    fails_with(
        &["serve", "-m", m, "--api-key-file", empty.to_str().unwrap()],
        why,
    );
    fails_with(
        &["serve", "-m", m, "--api-key-file", "/nonexistent/key"],
        "cannot read --api-key-file /nonexistent/key",
    );
}

/// `spindle bench` runs on the tiny mixture-of-experts models and counts
/// the bytes a decode pass reads from the router and the experts a token
/// uses, not from every expert.
#[test]
fn bench_runs_on_tiny_moe_models() {
    for arch in ["qwen3moe", "gpt-oss"] {
        let gguf = tiny(arch).join("model.gguf");
        let o = spindle(&[
            "bench",
            "-m",
            gguf.to_str().unwrap(),
            "-p",
            "32",
            "-n",
            "8",
            "-r",
            "1",
            "--rows",
            "1,4",
            "--json",
        ]);
        assert!(o.status.success(), "{arch}: {}", stderr(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("bench --json");
        let text = v.to_string();
        assert!(text.contains("tg") && text.contains("pp"), "{arch}: {text}");
        let file = std::fs::metadata(&gguf).unwrap().len() as f64;
        let read = find_number(&v, "bytes_per_decode_pass").expect("bytes_per_decode_pass");
        // A token reads 2 of the 8 (qwen3moe) or 2 of the 4 (gpt-oss) experts.
        assert!(read > 0.0 && read < 0.8 * file, "{arch}: {read} of {file}");
    }
}

/// `bench --rows --profile` times each row count's pass op by op: every
/// op of the pass is there, and the ops add up to the pass (the profile's
/// clock runs inside the timed passes, not around the context's prefill).
#[test]
fn bench_profiles_each_row_count_op_by_op() {
    let gguf = tiny("llama").join("model.gguf");
    let o = spindle(&[
        "bench",
        "-m",
        gguf.to_str().unwrap(),
        "-p",
        "0",
        "-n",
        "0",
        "-r",
        "3",
        "--rows",
        "1,4",
        "--rows-context",
        "40",
        "--profile",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("bench --json");
    let profiles = v["rows_pass_ops_s"].as_array().expect("rows_pass_ops_s");
    assert_eq!(profiles.len(), 2, "{v}");
    for (p, rows) in profiles.iter().zip(v["rows"].as_array().unwrap()) {
        assert_eq!(p["rows"], rows["rows"]);
        assert_eq!(p["context"], 40);
        let ops = p["ops"].as_array().unwrap();
        let names: Vec<&str> = ops.iter().map(|o| o["op"].as_str().unwrap()).collect();
        for op in ["output head", "attention", "matmul qkv", "matmul down"] {
            assert!(names.contains(&op), "{op} missing: {names:?}");
        }
        let total: f64 = ops.iter().map(|o| o["seconds"].as_f64().unwrap()).sum();
        let mean_s = rows["ms"]["mean"].as_f64().unwrap() / 1e3;
        assert!(
            total > 0.3 * mean_s && total <= 1.05 * mean_s,
            "ops {total} s against a {mean_s} s pass"
        );
    }
}

fn find_number(v: &serde_json::Value, key: &str) -> Option<f64> {
    match v {
        serde_json::Value::Object(m) => m
            .get(key)
            .and_then(|x| x.as_f64())
            .or_else(|| m.values().find_map(|x| find_number(x, key))),
        serde_json::Value::Array(a) => a.iter().find_map(|x| find_number(x, key)),
        _ => None,
    }
}

/// `tokenize` and `detokenize` read the tokenizer alone: their help lists
/// no threads, context or KV flags, which would do nothing there.
#[test]
fn tokenize_help_lists_only_the_flags_that_apply() {
    for cmd in ["tokenize", "detokenize"] {
        let o = spindle(&[cmd, "--help"]);
        assert!(o.status.success(), "{}", stderr(&o));
        let help = String::from_utf8_lossy(&o.stdout);
        for flag in [
            "--kv-type",
            "--ctx",
            "--kv-memory",
            "--threads",
            "--check-weights",
        ] {
            assert!(!help.contains(flag), "{cmd} --help lists {flag}: {help}");
        }
        assert!(
            help.contains("--model") && help.contains("--file"),
            "{help}"
        );
    }
    // Flags that do nothing elsewhere are hidden there too.
    let plan = spindle(&["plan", "--help"]);
    let help = String::from_utf8_lossy(&plan.stdout);
    assert!(
        !help.contains("--kv-memory") && help.contains("--ctx"),
        "{help}"
    );
    let bench = spindle(&["bench", "--help"]);
    let help = String::from_utf8_lossy(&bench.stdout);
    assert!(
        !help.contains("--ctx") && !help.contains("--kv-memory"),
        "{help}"
    );
    // serve's help says what its context default really is.
    let serve = spindle(&["serve", "--help"]);
    assert!(String::from_utf8_lossy(&serve.stdout).contains("default: 4096"));
}

/// Each flag's error names the flag: a missing draft model is a --spec
/// error, not the model loader's advice about -m.
#[test]
fn errors_name_the_flag_that_was_wrong() {
    let m = tiny("llama").join("model.gguf");
    let m = m.to_str().unwrap();
    for args in [
        vec!["run", "-m", m, "-p", "a", "--spec", "draft:/missing.gguf"],
        vec![
            "serve",
            "-m",
            m,
            "--port",
            "0",
            "--spec",
            "draft:/missing.gguf",
        ],
    ] {
        let o = spindle(&args);
        let err = stderr(&o);
        assert!(!o.status.success(), "{args:?}: {err}");
        assert!(
            err.contains("--spec draft:PATH: /missing.gguf") && err.contains("no such file"),
            "{args:?}: {err}"
        );
        assert!(!err.contains(" -m"), "{args:?} suggests -m: {err}");
    }
    fails_with(
        &["run", "-m", "/missing/model.gguf", "-p", "a"],
        "-m /missing/model.gguf: no such file",
    );
    fails_with(
        &["run", "-m", m, "-p", "a", "--grammar", "/missing.lark"],
        "--grammar /missing.lark: no such file",
    );
    fails_with(
        &["run", "-m", m, "-p", "a", "--json-schema", "/missing.json"],
        "--json-schema /missing.json: no such file",
    );
    let not_json = tmp("schema.json", b"{ not json");
    fails_with(
        &[
            "run",
            "-m",
            m,
            "-p",
            "a",
            "--json-schema",
            not_json.to_str().unwrap(),
        ],
        "--json-schema",
    );
    fails_with(&["run", "-m", m, "-f", "/missing.txt"], "-f /missing.txt");
    fails_with(&["run", "-m", m, "-p", "a", "--ctx", "0"], "--ctx");
    fails_with(&["plan", m, "--kv-type", "q4"], "--kv-type 'q4'");
    fails_with(
        &["perplexity", "-m", m, "-f", "/missing.txt"],
        "-f /missing.txt",
    );
    fails_with(&["tokenize", "-m", m], "no input");
}

/// `score --top K` lists K alternatives per position in text mode too.
#[test]
fn score_top_lists_that_many_alternatives() {
    let m = tiny("gemma2").join("model.gguf");
    let o = spindle(&[
        "score",
        "-m",
        m.to_str().unwrap(),
        "--ids",
        "5,17,99,3",
        "--top",
        "3",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let rows: Vec<&str> = out.lines().filter(|l| l.contains("top:")).collect();
    assert_eq!(rows.len(), 3, "{out}");
    for row in rows {
        let alternatives = row.split("top:").nth(1).unwrap().split(" | ").count();
        assert_eq!(alternatives, 3, "{row}");
    }
}
