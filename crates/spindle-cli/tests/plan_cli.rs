//! `spindle plan` on the real default model: the JSON shape scripts rely on,
//! header-only planning, the prediction against measured peak memory, and
//! `run` refusing a context that cannot fit before it loads anything.

mod common;

use std::path::PathBuf;
use std::process::{Command, Output};

fn model() -> Option<PathBuf> {
    common::real_model()
}

fn spindle(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_spindle"))
        .args(args)
        .output()
        .expect("run spindle")
}

fn json(o: &Output) -> serde_json::Value {
    assert!(
        o.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).expect("JSON on stdout")
}

/// The documented keys and types, with values computed by hand for Gemma 3
/// 270M; a header-only copy of the file plans the same.
#[test]
fn plan_json_has_the_documented_shape_and_needs_only_headers() {
    let Some(m) = model() else { return };
    let full = json(&spindle(&[
        "plan",
        m.to_str().unwrap(),
        "--ctx",
        "4096",
        "--batch",
        "8",
        "--json",
    ]));
    for key in [
        "weights_bytes",
        "kv_bytes_per_token",
        "kv_bytes",
        "activation_bytes",
        "overhead_bytes",
        "total_bytes",
        "max_ctx",
        "max_batch",
        "prefill_tokens_per_s",
    ] {
        assert!(
            full[key].is_number(),
            "{key} is not a number: {}",
            full[key]
        );
    }
    assert!(full["fits"].is_boolean());
    assert!(full["weights_by_type"].is_object());
    assert!(full["decode_tokens_per_s"]["batch_1"].is_number());
    assert!(full["decode_tokens_per_s"]["batch_b"].is_number());
    for b in ["1", "8", "32"] {
        let c = &full["kv_crossover_ctx"][b];
        assert!(c.is_number() || c.is_null(), "crossover {b}: {c}");
    }
    // Exact, from tensor infos (ANCHORS.md's table).
    assert_eq!(full["weights_by_type"]["Q8_0"], 179_824_640u64);
    assert_eq!(full["weights_bytes"], 246_587_904u64);
    // 2 (K and V) x 18 layers x 1 KV head x 256 x 2 bytes.
    assert_eq!(full["kv_bytes_per_token"], 18_432u64);
    // 8 sequences x (3 global layers x 4096 + 15 sliding x 528 tokens) x
    // 2 x 256 x 2 bytes: a window of 512 spans 33 blocks of 16.
    assert_eq!(full["kv_bytes"], 8u64 * (3 * 4096 + 15 * 528) * 2 * 256 * 2);

    // Header only: cut the file right after the tensor infos (the data
    // offset is the file length less the data).
    let bytes = std::fs::read(&m).unwrap();
    let data_len: u64 = 246_587_904;
    let dir = tempfile::tempdir().unwrap();
    let header = dir.path().join("header-only.gguf");
    // The data section also holds alignment padding between tensors, so
    // keep a little more than the header: still far from the weights.
    let keep = (bytes.len() as u64 - data_len) as usize;
    std::fs::write(&header, &bytes[..keep]).unwrap();
    let cut = json(&spindle(&[
        "plan",
        header.to_str().unwrap(),
        "--ctx",
        "4096",
        "--batch",
        "8",
        "--json",
    ]));
    assert_eq!(cut["weights_by_type"], full["weights_by_type"]);
    assert_eq!(cut["kv_bytes"], full["kv_bytes"]);
}

/// The prediction against the process's measured peak resident memory, for
/// a context and batch where KV and activations matter (within 2%).
#[test]
fn plan_predicts_measured_peak_memory_within_2_percent() {
    let Some(m) = model() else { return };
    let v = json(&spindle(&[
        "plan",
        m.to_str().unwrap(),
        "--ctx",
        "4096",
        "--batch",
        "8",
        "--measure",
        "--json",
    ]));
    let err = v["measured"]["relative_error"].as_f64().unwrap();
    assert!(
        err.abs() < 0.02,
        "predicted {} against measured {}: {:+.2}%",
        v["total_bytes"],
        v["measured"]["peak_rss_bytes"],
        100.0 * err
    );
}

/// A context that cannot fit is refused up front, with the plan; a KV
/// budget picks the longest context it holds.
#[test]
fn run_refuses_a_context_that_cannot_fit() {
    let Some(m) = model() else { return };
    let m = m.to_str().unwrap();
    let o = spindle(&["run", "-m", m, "-p", "Hi", "-n", "1", "--ctx", "100000000"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("context needs") && err.contains("Plan for"),
        "{err}"
    );

    let o = spindle(&[
        "run",
        "-m",
        m,
        "-p",
        "Hi",
        "-n",
        "1",
        "--ctx",
        "4096",
        "--kv-memory",
        "1MiB",
    ]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--kv-memory grants 1.00 MiB"));

    // 16 MiB hold 3 global layers x N + 15 sliding x 528 tokens (33 blocks
    // of 16), at 1 KiB per token and layer (K and V, 256 f16 each):
    // N = (16384 - 7920) / 3 = 2821, in whole blocks 2816.
    let v = json(&spindle(&[
        "run",
        "-m",
        m,
        "-p",
        "Hi",
        "-n",
        "1",
        "--kv-memory",
        "16MiB",
        "--json",
    ]));
    assert_eq!(v["stats"]["ctx"], 2816);
}
