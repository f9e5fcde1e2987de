//! The CLI on the real default model (skipped with a note when it is absent,
//! failing instead when SPINDLE_REQUIRE_MODEL=1, as in CI).

mod common;

use std::path::PathBuf;
use std::process::{Command, Output};

fn model() -> Option<PathBuf> {
    common::real_model()
}

fn spindle(args: &[&str]) -> Output {
    let o = Command::new(env!("CARGO_BIN_EXE_spindle"))
        .args(args)
        .output()
        .expect("run spindle");
    assert!(
        o.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

#[test]
fn run_json_has_the_documented_shape() {
    let Some(m) = model() else { return };
    let o = spindle(&[
        "run",
        "-m",
        m.to_str().unwrap(),
        "-p",
        "The capital of France is",
        "-n",
        "8",
        "--temp",
        "0",
        "--json",
        "-t",
        "2",
        "--spec",
        "off",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        v["prompt_tokens"],
        serde_json::json!([2, 818, 5279, 529, 7001, 563])
    );
    let tokens = v["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), 8);
    // The reference's first greedy token (margin 0.8 nats) is " the" (506).
    assert_eq!(tokens[0], 506);
    assert!(v["text"].as_str().unwrap().starts_with(" the"));
    let s = &v["stats"];
    assert!(s["prompt_tokens_per_s"].as_f64().unwrap() > 0.0);
    assert!(s["gen_tokens_per_s"].as_f64().unwrap() > 0.0);
    assert_eq!(s["passes"], 8);
    assert_eq!(s["tokens_per_pass"].as_f64().unwrap(), 1.0);
}

#[test]
fn seeded_sampling_is_reproducible() {
    let Some(m) = model() else { return };
    let args = [
        "run",
        "-m",
        m.to_str().unwrap(),
        "-p",
        "Once upon a time",
        "-n",
        "12",
        "--temp",
        "0.9",
        "--seed",
        "7",
        "--json",
    ];
    let a: serde_json::Value = serde_json::from_slice(&spindle(&args).stdout).unwrap();
    let b: serde_json::Value = serde_json::from_slice(&spindle(&args).stdout).unwrap();
    assert_eq!(a["tokens"], b["tokens"]);
}

#[test]
fn tokenize_and_detokenize_round_trip() {
    let Some(m) = model() else { return };
    let m = m.to_str().unwrap();
    let ids: Vec<u32> =
        serde_json::from_slice(&spindle(&["tokenize", "-m", m, "Hello world"]).stdout).unwrap();
    assert_eq!(ids, vec![2, 9259, 1902]);
    let no_bos: Vec<u32> =
        serde_json::from_slice(&spindle(&["tokenize", "-m", m, "--no-bos", "Hello world"]).stdout)
            .unwrap();
    assert_eq!(no_bos, vec![9259, 1902]);
    let special: Vec<u32> = serde_json::from_slice(
        &spindle(&["tokenize", "-m", m, "--no-bos", "<end_of_turn>"]).stdout,
    )
    .unwrap();
    assert_eq!(special, vec![106]);
    let plain: Vec<u32> = serde_json::from_slice(
        &spindle(&[
            "tokenize",
            "-m",
            m,
            "--no-bos",
            "--no-special",
            "<end_of_turn>",
        ])
        .stdout,
    )
    .unwrap();
    assert!(
        plain.len() > 1,
        "with --no-special the marker is plain text: {plain:?}"
    );
    let text = String::from_utf8(spindle(&["detokenize", "-m", m, "2,9259,1902"]).stdout).unwrap();
    assert_eq!(text.trim_end_matches('\n'), "Hello world");
}

#[test]
fn perplexity_json_and_context_errors() {
    let Some(m) = model() else { return };
    let m = m.to_str().unwrap();
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../spindle-model/tests/fixtures/real/score_text.txt"
    ))
    .unwrap();
    let file = std::env::temp_dir().join(format!("spindle-ppl-{}.txt", std::process::id()));
    std::fs::write(&file, &text).unwrap();
    let o = spindle(&[
        "perplexity",
        "-m",
        m,
        "-f",
        file.to_str().unwrap(),
        "-c",
        "64",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    // 254 tokens -> 3 chunks of 64, 31 scored tokens each.
    assert_eq!(v["chunks"], 3);
    assert_eq!(v["tokens_scored"], 93);
    let ppl = v["perplexity"].as_f64().unwrap();
    assert!(ppl > 1.0 && ppl < 200.0, "perplexity {ppl}");

    let o = Command::new(env!("CARGO_BIN_EXE_spindle"))
        .args([
            "run",
            "-m",
            m,
            "-f",
            file.to_str().unwrap(),
            "--ctx",
            "32",
            "-n",
            "4",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("context"), "{err}");
}

/// Speculative decoding (the default) emits plain decoding's tokens, greedy
/// and sampled, and reports its statistics. (How much it drafts depends on
/// measured pass times, so speed is left to `bench/spec`.)
#[test]
fn speculative_run_equals_plain_run() {
    let Some(m) = model() else { return };
    let prompt = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n    return a * b\n\ndef div(a, b):\n";
    for temp in ["0", "0.8"] {
        let run = |spec: &str| -> serde_json::Value {
            let o = spindle(&[
                "run",
                "-m",
                m.to_str().unwrap(),
                "-p",
                prompt,
                "-n",
                "96",
                "--temp",
                temp,
                "--seed",
                "3",
                "--json",
                "--spec",
                spec,
            ]);
            serde_json::from_slice(&o.stdout).unwrap()
        };
        let (plain, spec) = (run("off"), run("auto"));
        assert_eq!(spec["tokens"], plain["tokens"], "temp {temp}");
        let s = &spec["stats"];
        for key in [
            "passes",
            "tokens_per_pass",
            "drafted",
            "accepted",
            "acceptance_rate",
        ] {
            assert!(s[key].is_number(), "stats.{key}");
        }
        assert_eq!(plain["stats"]["drafted"], 0);
        assert!(s["accepted"].as_u64().unwrap() <= s["drafted"].as_u64().unwrap());
    }
}

/// `spindle decide`: flags and a request file give the same JSON answers
/// as `/v1/decide`; a bad request fails with the reason.
#[test]
fn decide_flags_and_request_files_agree() {
    let Some(m) = model() else { return };
    let m = m.to_str().unwrap();
    let state = "Every checkout request fails with HTTP 500 since 09:30.";
    let flags = spindle(&[
        "decide",
        "-m",
        m,
        "-t",
        "2",
        "--state",
        state,
        "--choice",
        "severity=critical,high,low",
        "--yes-no",
        "customers_affected",
        "--json",
    ]);
    let a: serde_json::Value = serde_json::from_slice(&flags.stdout).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("req.json");
    let req = serde_json::json!({
        "state": state,
        "questions": [
            {"id": "severity", "kind": "choice", "options": ["critical", "high", "low"]},
            {"id": "customers_affected", "kind": "yes_no"}
        ]
    });
    std::fs::write(&file, req.to_string()).unwrap();
    let from_file = spindle(&[
        "decide",
        "-m",
        m,
        "-t",
        "2",
        "-f",
        file.to_str().unwrap(),
        "--json",
    ]);
    let b: serde_json::Value = serde_json::from_slice(&from_file.stdout).unwrap();
    assert_eq!(a["questions"], b["questions"]);
    for q in a["questions"].as_array().unwrap() {
        let probs = q["probabilities"].as_object().unwrap();
        let sum: f64 = probs.values().map(|p| p.as_f64().unwrap()).sum();
        assert!((sum - 1.0).abs() < 1e-9);
        let selected = q["selected"].as_str().unwrap();
        assert_eq!(q["confidence"], probs[selected]);
    }
    let bad = Command::new(env!("CARGO_BIN_EXE_spindle"))
        .args(["decide", "-m", m, "--state", state, "--choice", "a=x,y,x"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("lists the option 'x' twice"));
}

/// A NaN block scale in a quantized matrix (one of the corrupt
/// files) is a load error naming the tensor and the block, and
/// `--check-weights` reports it as well; the sound file passes the scan.
#[test]
fn a_corrupt_block_scale_is_refused_at_load_and_by_the_scan() {
    let Some(m) = model() else { return };
    let o = spindle(&[
        "run",
        "-m",
        m.to_str().unwrap(),
        "--check-weights",
        "-n",
        "1",
        "-p",
        "Hi",
    ]);
    let log = String::from_utf8_lossy(&o.stderr);
    assert!(log.contains("all finite"), "{log}");

    let info = spindle_formats::GgufFile::open(&m).unwrap();
    let t = info.tensor("blk.2.ffn_gate.weight").unwrap().clone();
    let ty = t.ty().unwrap();
    use spindle_formats::GgmlType as T;
    assert!(
        matches!(ty, T::Q4_0 | T::Q5_0 | T::Q8_0 | T::Q4_K | T::Q5_K),
        "{ty}: the scale is the block's first two bytes"
    );
    let block_bytes = ty.block_bytes();
    let mut bytes = std::fs::read(&m).unwrap();
    let at = t.offset as usize + 7 * block_bytes;
    bytes[at..at + 2].copy_from_slice(&0x7e00u16.to_le_bytes()); // f16 NaN
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("corrupt.gguf");
    std::fs::write(&bad, &bytes).unwrap();
    drop(bytes);
    for extra in [&[][..], &["--check-weights"][..]] {
        let o = Command::new(env!("CARGO_BIN_EXE_spindle"))
            .args(["run", "-m", bad.to_str().unwrap(), "-n", "1", "-p", "Hi"])
            .args(extra)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{extra:?}: the corrupt file ran");
        assert!(
            err.contains("blk.2.ffn_gate.weight") && err.contains("block 7"),
            "{extra:?}: {err}"
        );
    }
}

/// Generation that stops because the context is full says so: `finish:
/// context` in the stats line, and a note beside `finish_reason: "length"`.
#[test]
fn run_says_when_the_context_is_full() {
    let Some(m) = model() else { return };
    let args = |json: bool| {
        let mut a = vec![
            "run",
            "-m",
            m.to_str().unwrap(),
            "-p",
            "The capital of France is",
            "-n",
            "100",
            "--ctx",
            "16",
            "--temp",
            "0",
            "-t",
            "2",
        ];
        if json {
            a.push("--json");
        }
        a.into_iter().map(String::from).collect::<Vec<_>>()
    };
    let a = args(false);
    let o = spindle(&a.iter().map(String::as_str).collect::<Vec<_>>());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("finish: context"), "{err}");
    assert!(err.contains("(set by --ctx)"), "the context and why: {err}");
    let a = args(true);
    let o = spindle(&a.iter().map(String::as_str).collect::<Vec<_>>());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["finish_reason"], "length");
    assert!(v["note"].as_str().unwrap().contains("context"), "{v}");
}

/// `tokenize -` reads standard input and `-f FILE` a file, byte for byte:
/// both give the ids of the same text given inline; `detokenize -` reads
/// ids from standard input.
#[test]
fn tokenize_reads_standard_input_and_files() {
    use std::io::Write;
    let Some(m) = model() else { return };
    let m = m.to_str().unwrap();
    let text = "Hello world,\nand a second line\n";
    let inline = spindle(&["tokenize", "-m", m, text]).stdout;
    let piped = |args: &[&str], input: &str| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_spindle"))
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
        let o = child.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        o.stdout
    };
    assert_eq!(piped(&["tokenize", "-m", m, "-"], text), inline);
    let file = std::env::temp_dir().join(format!("spindle-tok-{}.txt", std::process::id()));
    std::fs::write(&file, text).unwrap();
    let f = file.to_str().unwrap();
    assert_eq!(spindle(&["tokenize", "-m", m, "-f", f]).stdout, inline);
    assert_eq!(spindle(&["tokenize", "-m", m, "--file", f]).stdout, inline);
    assert_eq!(piped(&["tokenize", "-m", m, "-f", "-"], text), inline);
    let ids = String::from_utf8(inline).unwrap();
    let back = piped(&["detokenize", "-m", m, "-"], &ids);
    assert_eq!(String::from_utf8(back).unwrap(), format!("{text}\n"));
    // A file that is not UTF-8 (Latin-1) is tokenized as llama-tokenize
    // tokenizes its bytes (spindle-model's fixtures/tokenizer/vocab_gguf.json).
    let refs: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../spindle-model/tests/fixtures/tokenizer/vocab_gguf.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let case = &refs["gemma3_model"]["byte_cases"][0];
    let hex = case["hex"].as_str().unwrap();
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    std::fs::write(&file, &bytes).unwrap();
    let out = spindle(&["tokenize", "-m", m, "--no-bos", "-f", f]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(got, case["ids"], "{:?}", String::from_utf8_lossy(&bytes));
    let _ = std::fs::remove_file(&file);
}
