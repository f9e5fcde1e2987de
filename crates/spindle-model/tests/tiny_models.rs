//! Every architecture against logits and greedy tokens computed by Hugging
//! Face `transformers` on the same random weights (scripts/make_tiny_models.py),
//! from both the safetensors directory and the GGUF conversion.

mod common_tiny;
use common_tiny::*;

use spindle_model::{Batch, Row};

#[test]
fn logits_match_transformers_within_1e_3() {
    for arch in ARCHS {
        let r = reference(arch);
        for (kind, path) in sources(arch) {
            let m = load(&path, 2);
            assert_eq!(m.model.config.vocab_size, r.vocab_size, "{arch} {kind}");
            for (pi, p) in r.prompts.iter().enumerate() {
                let got = prefill_logits(&m, &p.ids);
                for (pos, (g, want)) in got.iter().zip(&p.logits).enumerate() {
                    let err = rel_err(g, want);
                    assert!(
                        err < 1e-3,
                        "{arch} {kind} prompt {pi} position {pos}: relative error {err}"
                    );
                }
            }
        }
    }
}

#[test]
fn greedy_decoding_matches_transformers() {
    for arch in ARCHS {
        let r = reference(arch);
        for (kind, path) in sources(arch) {
            let m = load(&path, 2);
            for (pi, p) in r.prompts.iter().enumerate() {
                let mut cache = kv(&m, 256);
                let seq = cache.add_sequence().unwrap();
                let mut batch = Batch::new();
                let rows = batch.push_chain(seq, 0, &p.ids, |i| i + 1 == p.ids.len());
                let mut logits = m
                    .model
                    .forward(&batch, &mut cache)
                    .unwrap()
                    .row(p.ids.len() - 1)
                    .unwrap()
                    .to_vec();
                cache.commit(seq, &rows.collect::<Vec<_>>()).unwrap();
                for (step, (&want, &margin)) in p.greedy.iter().zip(&p.greedy_margin).enumerate() {
                    let got = argmax(&logits);
                    if margin > 1e-4 {
                        assert_eq!(
                            got, want,
                            "{arch} {kind} prompt {pi} step {step} (margin {margin})"
                        );
                    }
                    // Follow the reference path so later steps stay comparable.
                    let mut b = Batch::new();
                    b.push(Row {
                        token: want,
                        pos: cache.seq_len(seq),
                        seq,
                        parent: None,
                        logits: true,
                    });
                    logits = m
                        .model
                        .forward(&b, &mut cache)
                        .unwrap()
                        .row(0)
                        .unwrap()
                        .to_vec();
                    cache.commit(seq, &[0]).unwrap();
                }
            }
        }
    }
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// A NaN or an infinity in a norm is a load error naming the tensor, not a
/// model that answers uniform probabilities.
#[test]
fn non_finite_norms_are_a_load_error() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tiny/llama/model.gguf");
    let info = spindle_formats::GgufFile::open(&src).unwrap();
    let t = info
        .tensor("output_norm.weight")
        .expect("the tiny model has an output norm")
        .clone();
    assert_eq!(t.type_id, 0, "an F32 norm");
    for (k, bad) in [(3usize, f32::NAN), (0, f32::INFINITY)] {
        let mut bytes = std::fs::read(&src).unwrap();
        let at = t.offset as usize + 4 * k;
        bytes[at..at + 4].copy_from_slice(&bad.to_le_bytes());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.gguf");
        std::fs::write(&path, &bytes).unwrap();
        let e = spindle_model::load(&path, 1)
            .err()
            .expect("the corrupt model is refused")
            .to_string();
        assert!(
            e.contains("output_norm.weight") && e.contains(&format!("element {k}")),
            "{e}"
        );
    }
}

/// A NaN in a weight matrix is not read at load (that would read every
/// weight), but the full scan finds it and names the tensor and element.
#[test]
fn the_full_weight_scan_names_a_non_finite_value() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tiny/llama/model.gguf");
    let whole = spindle_model::check_weights(&src).expect("the fixture is sound");
    let info = spindle_formats::GgufFile::open(&src).unwrap();
    assert_eq!(whole.tensors, info.tensors().len());
    let t = info.tensor("blk.1.attn_q.weight").unwrap().clone();
    assert_eq!(t.type_id, 0, "an F32 matrix");
    let mut bytes = std::fs::read(&src).unwrap();
    let k = 77usize;
    let at = t.offset as usize + 4 * k;
    bytes[at..at + 4].copy_from_slice(&f32::INFINITY.to_le_bytes());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.gguf");
    std::fs::write(&path, &bytes).unwrap();
    let e = spindle_model::check_weights(&path)
        .expect_err("the scan finds it")
        .to_string();
    assert!(
        e.contains("blk.1.attn_q.weight") && e.contains(&format!("element {k}")),
        "{e}"
    );
}

/// Phi-3's LongRoPE takes the long factors once the cache is longer than
/// the original context (4096 in the fixture), as llama.cpp does; the
/// reference is the fixture script's float64 pass with those factors.
#[test]
fn phi3_long_rope_switches_factors_with_the_cache_length() {
    #[derive(serde::Deserialize)]
    struct Long {
        prompts: Vec<LongPrompt>,
    }
    #[derive(serde::Deserialize)]
    struct LongPrompt {
        ids: Vec<u32>,
        long_rope_logits: Option<Vec<Vec<f32>>>,
        logits: Vec<Vec<f32>>,
    }
    let text = std::fs::read_to_string(fixture_dir("phi3").join("reference.json")).unwrap();
    let r: Long = serde_json::from_str(&text).unwrap();
    let p = &r.prompts[0];
    let want_long = p.long_rope_logits.as_ref().expect("long_rope_logits");
    for (kind, path) in sources("phi3") {
        let m = load(&path, 2);
        let run = |max_len: usize| {
            let cache = m.model.new_kv_cache(m.model.default_kv_type(), max_len, 1);
            prefill_logits_in(&m, &p.ids, cache)
        };
        for (max_len, want) in [(4096, &p.logits), (4097, want_long)] {
            let got = run(max_len);
            for (g, w) in got.iter().zip(want) {
                let e = rel_err(g, w);
                assert!(e < 1e-3, "{kind}: cache {max_len}: rel err {e}");
            }
        }
        // The two factor sets give clearly different logits.
        assert!(rel_err(&p.logits[4], &want_long[4]) > 1e-2);
    }
}

/// The mixture-of-experts models quantized as published files are (4-bit
/// experts: Q4_0 for Qwen3-MoE, MXFP4 for gpt-oss; Q8_0 attention and head;
/// each expert a slice of a quantized stacked tensor) against float64
/// passes over gguf-py's dequantization of the same file: tightly against
/// the pass that rounds each quantized matrix's input to int8 as the
/// engines do (with f32 KV, as the references keep K and V exact).
#[test]
fn quantized_moe_files_match_their_dequantized_reference() {
    #[derive(serde::Deserialize)]
    struct Quant {
        prompts: Vec<QuantPrompt>,
    }
    #[derive(serde::Deserialize)]
    struct QuantPrompt {
        ids: Vec<u32>,
        logits: Vec<Vec<f32>>,
        logits_int8_acts: Vec<Vec<f32>>,
    }
    for arch in ["qwen3moe", "gpt-oss"] {
        let dir = fixture_dir(arch);
        let text = std::fs::read_to_string(dir.join("reference-quant.json")).unwrap();
        let r: Quant = serde_json::from_str(&text).unwrap();
        let m = load(&dir.join("model-quant.gguf"), 2);
        let (mut emulated, mut exact) = (0.0f32, 0.0f32);
        for p in &r.prompts {
            // f32 KV: the references keep K and V exact.
            let cache = m.model.new_kv_cache(spindle_model::KvType::F32, 256, 1);
            let got = prefill_logits_in(&m, &p.ids, cache);
            for ((g, e), x) in got.iter().zip(&p.logits_int8_acts).zip(&p.logits) {
                emulated = emulated.max(rel_err(g, e));
                exact = exact.max(rel_err(g, x));
            }
        }
        eprintln!("{arch}: quantized, relative error {emulated:.1e} to the int8 pass, {exact:.1e} to the exact one");
        assert!(
            emulated < 1e-4,
            "{arch}: {emulated} from the int8-activation reference"
        );
        // (The int8 rounding moves logits by about 2% here, and may flip a
        // close routing choice: the exact pass is a reading, not a bound.)
        assert!(exact > 1e-3, "{arch}: int8 activations should show");
    }
}

/// A mixture with shared experts (not run yet) is refused naming the
/// tensor, not loaded without them.
#[test]
fn shared_experts_are_refused_by_name() {
    let mut bytes = std::fs::read(fixture_dir("qwen3moe").join("model.gguf")).unwrap();
    let (from, to) = (b"blk.0.ffn_up_exps.weight", b"blk.0.ffn_up_shexp.weigh");
    let at = bytes
        .windows(from.len())
        .position(|w| w == from)
        .expect("tensor name in the header");
    bytes[at..at + from.len()].copy_from_slice(to);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shared.gguf");
    std::fs::write(&path, bytes).unwrap();
    let err = spindle_model::load(&path, 1)
        .err()
        .expect("refused")
        .to_string();
    assert!(
        err.contains("blk.0.ffn_up_shexp.weigh") && err.contains("shared expert"),
        "{err}"
    );
}
