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
