//! all-MiniLM-L6-v2 (a 6-layer BERT) as sentence-transformers runs it, from
//! its safetensors directory and from the GGUFs llama.cpp's converter
//! writes: the same token ids as the `tokenizers` library, vectors within
//! 1e-5 of sentence-transformers' in cosine, and a text's vector the same
//! bits alone, in a batch of 64 mixed lengths, and on every ISA.
//!
//! References (`tests/fixtures/embeddings/`, by
//! `scripts/make_embedding_fixtures.py --refs`): sentence-transformers'
//! vectors for the 200 sentences of `sentences.json` and `tokenizers`' ids.
//! The model comes from `spindle pull all-minilm-l6-v2`, the GGUFs from
//! `scripts/make_embedding_fixtures.py` (checked there to be byte for byte
//! what llama.cpp's converter writes). Without them the tests say so and
//! pass, unless `SPINDLE_REQUIRE_MODEL=1` (CI).

use std::path::{Path, PathBuf};

use spindle_kernels::simd::available_isas;
use spindle_model::encoder::{load_encoder, EncoderInput, EncoderOptions, LoadedEncoder};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/embeddings");
const DIM: usize = 384;

fn model_dir() -> PathBuf {
    let home = std::env::var_os("SPINDLE_HOME").map_or_else(
        || PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/spindle"),
        PathBuf::from,
    );
    home.join("models/all-MiniLM-L6-v2")
}

fn gguf(kind: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../target/embed/minilm-{kind}.gguf"))
}

/// Every form of the model that is present; a missing one fails under
/// `SPINDLE_REQUIRE_MODEL=1`.
fn models() -> Vec<(String, LoadedEncoder)> {
    let required = std::env::var("SPINDLE_REQUIRE_MODEL").ok().as_deref() == Some("1");
    let mut out = Vec::new();
    for (name, path, hint) in [
        ("safetensors", model_dir(), "spindle pull all-minilm-l6-v2"),
        (
            "gguf-f32",
            gguf("f32"),
            "python3 scripts/make_embedding_fixtures.py",
        ),
        (
            "gguf-f16",
            gguf("f16"),
            "python3 scripts/make_embedding_fixtures.py",
        ),
    ] {
        if !path.exists() {
            let msg = format!("{name}: {} is missing ({hint})", path.display());
            assert!(!required, "{msg}");
            eprintln!("skipped: {msg}");
            continue;
        }
        let loaded = load_encoder(&path, 2, EncoderOptions::default())
            .unwrap_or_else(|e| panic!("{name}: {} does not load: {e}", path.display()));
        out.push((name.to_string(), loaded));
    }
    out
}

fn sentences() -> Vec<String> {
    serde_json::from_str(&std::fs::read_to_string(format!("{FIXTURES}/sentences.json")).unwrap())
        .unwrap()
}

fn reference_vectors() -> Vec<Vec<f32>> {
    let bytes = std::fs::read(format!("{FIXTURES}/minilm_st.f32")).unwrap();
    let all: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    all.chunks_exact(DIM).map(<[f32]>::to_vec).collect()
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum();
    let na: f64 = a.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

#[test]
fn token_ids_are_the_tokenizers_librarys() {
    let want: Vec<Vec<u32>> = serde_json::from_str(
        &std::fs::read_to_string(format!("{FIXTURES}/minilm_ids.json")).unwrap(),
    )
    .unwrap();
    for (name, m) in models() {
        for (i, (s, ids)) in sentences().iter().zip(&want).enumerate() {
            let got = m.tokenizer.encode(s).unwrap();
            assert_eq!(&got.ids, ids, "{name}: sentence {i} {s:?}");
            assert!(got.type_ids.iter().all(|&t| t == 0));
        }
    }
}

#[test]
fn vectors_match_sentence_transformers() {
    let refs = reference_vectors();
    let texts = sentences();
    for (name, m) in models() {
        let encoded: Vec<_> = texts
            .iter()
            .map(|s| m.tokenizer.encode(s).unwrap())
            .collect();
        let inputs: Vec<EncoderInput<'_>> = encoded
            .iter()
            .map(|e| EncoderInput {
                ids: &e.ids,
                type_ids: Some(&e.type_ids),
            })
            .collect();
        let mut worst = (1.0f64, 0);
        for (start, chunk) in inputs.chunks(50).enumerate() {
            for (j, v) in m.encoder.embed(chunk).unwrap().iter().enumerate() {
                let i = start * 50 + j;
                assert_eq!(v.len(), DIM);
                let norm: f64 = v.iter().map(|&x| (x as f64).powi(2)).sum::<f64>();
                assert!(
                    (norm - 1.0).abs() < 1e-5,
                    "{name}: sentence {i} is not unit length"
                );
                let c = cosine(v, &refs[i]);
                if c < worst.0 {
                    worst = (c, i);
                }
            }
        }
        eprintln!("{name}: worst cosine {:.7} (sentence {})", worst.0, worst.1);
        assert!(
            worst.0 >= 0.99999,
            "{name}: sentence {} {:?} has cosine {} with sentence-transformers' vector",
            worst.1,
            texts[worst.1],
            worst.0
        );
    }
}

#[test]
fn a_texts_vector_does_not_depend_on_its_batch_or_isa() {
    let texts = sentences();
    for (name, mut m) in models() {
        // 64 texts of mixed lengths, the longest and shortest among them.
        let mut picked: Vec<usize> = (0..texts.len()).step_by(3).take(62).collect();
        picked.extend([31, 22]);
        let encoded: Vec<_> = picked
            .iter()
            .map(|&i| m.tokenizer.encode(&texts[i]).unwrap())
            .collect();
        let inputs: Vec<EncoderInput<'_>> = encoded
            .iter()
            .map(|e| EncoderInput {
                ids: &e.ids,
                type_ids: None,
            })
            .collect();
        let batch = m.encoder.embed(&inputs).unwrap();
        for isa in available_isas() {
            m.encoder.set_isa(isa).unwrap();
            for (j, input) in inputs.iter().enumerate().step_by(7) {
                let alone = m.encoder.embed(std::slice::from_ref(input)).unwrap();
                assert_eq!(
                    alone[0], batch[j],
                    "{name} on {isa}: text {} alone differs from its batch",
                    picked[j]
                );
            }
        }
    }
}

#[test]
fn bad_inputs_are_refused_with_a_reason() {
    let Some((_, m)) = models().into_iter().next() else {
        return;
    };
    let long = vec![101u32; 600];
    let err = m
        .encoder
        .embed(&[EncoderInput {
            ids: &long,
            type_ids: None,
        }])
        .unwrap_err();
    assert!(
        err.to_string().contains("over the model's limit of 512"),
        "{err}"
    );
    let err = m
        .encoder
        .embed(&[EncoderInput {
            ids: &[],
            type_ids: None,
        }])
        .unwrap_err();
    assert!(err.to_string().contains("no tokens"), "{err}");
    let err = m
        .encoder
        .embed(&[EncoderInput {
            ids: &[101, 99_999],
            type_ids: None,
        }])
        .unwrap_err();
    assert!(err.to_string().contains("past the vocabulary"), "{err}");
    assert!(m
        .encoder
        .classify(&[EncoderInput {
            ids: &[101, 102],
            type_ids: None
        }])
        .is_err());
}

/// A tiny BertForSequenceClassification (random weights, made by
/// `scripts/make_cross_encoder_fixture.py`): its pair scores and their
/// order equal transformers'.
#[test]
fn a_cross_encoder_scores_pairs_as_transformers_does() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny/bert-cross-encoder");
    let refs: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("refs.json")).unwrap()).unwrap();
    let m = load_encoder(&dir, 2, EncoderOptions::default()).unwrap();
    assert_eq!(m.encoder.config.classifier_labels, Some(1));
    let query = refs["query"].as_str().unwrap();
    let docs: Vec<&str> = refs["documents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap())
        .collect();
    let pairs: Vec<_> = docs
        .iter()
        .map(|d| m.tokenizer.encode_pair(query, d).unwrap())
        .collect();
    for (p, want) in pairs.iter().zip(refs["pairs"].as_array().unwrap()) {
        let ids: Vec<u32> = serde_json::from_value(want["ids"].clone()).unwrap();
        let types: Vec<u32> = serde_json::from_value(want["type_ids"].clone()).unwrap();
        assert_eq!((&p.ids, &p.type_ids), (&ids, &types));
    }
    let inputs: Vec<EncoderInput<'_>> = pairs
        .iter()
        .map(|e| EncoderInput {
            ids: &e.ids,
            type_ids: Some(&e.type_ids),
        })
        .collect();
    let scores: Vec<f32> = m
        .encoder
        .classify(&inputs)
        .unwrap()
        .into_iter()
        .map(|s| s[0])
        .collect();
    for (i, (got, want)) in scores
        .iter()
        .zip(refs["logits"].as_array().unwrap())
        .enumerate()
    {
        let want = want.as_f64().unwrap();
        assert!(
            (*got as f64 - want).abs() < 1e-4,
            "document {i}: {got} vs transformers' {want}"
        );
    }
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
    let want: Vec<usize> = serde_json::from_value(refs["order"].clone()).unwrap();
    assert_eq!(order, want);
}
