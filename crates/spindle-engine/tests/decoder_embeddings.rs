//! A decoder as an embedder (`embed_with_decoder`): the tiny Llama's pooled
//! final hidden states, mean and last, from GGUF and safetensors, equal
//! transformers' (`tests/fixtures/tiny/llama/pooled.json`, by
//! `scripts/make_decoder_pooling_refs.py`), and a text's vector is the same
//! alone or beside others in a pass.

use std::path::Path;

use spindle_engine::embed::embed_with_decoder;
use spindle_model::encoder::Pooling;
use spindle_model::{KvCache, KvType};

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum();
    let na: f64 = a.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

#[test]
fn pooled_hidden_states_match_transformers() {
    let dir =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../spindle-model/tests/fixtures/tiny/llama");
    let refs: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("pooled.json")).unwrap()).unwrap();
    let prompts = refs["prompts"].as_array().unwrap();
    let ids: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| serde_json::from_value(p["ids"].clone()).unwrap())
        .collect();
    for path in [dir.join("model.gguf"), dir.clone()] {
        let loaded = spindle_model::load(&path, 2).unwrap();
        let longest = ids.iter().map(Vec::len).max().unwrap();
        let mut kv = KvCache::new(loaded.model.kv_layout(KvType::F32, longest, 8));
        for (pooling, key) in [(Pooling::Mean, "mean"), (Pooling::Last, "last")] {
            let all = embed_with_decoder(&loaded.model, &mut kv, &ids, pooling, true, 512).unwrap();
            for (i, (v, p)) in all.iter().zip(prompts).enumerate() {
                let want: Vec<f32> = serde_json::from_value(p[key].clone()).unwrap();
                let c = cosine(v, &want);
                assert!(
                    c > 0.99999,
                    "{} {key}: prompt {i} cosine {c}",
                    path.display()
                );
                let alone =
                    embed_with_decoder(&loaded.model, &mut kv, &ids[i..=i], pooling, true, 512)
                        .unwrap();
                assert_eq!(
                    alone[0],
                    *v,
                    "{} {key}: prompt {i} alone differs",
                    path.display()
                );
            }
            assert_eq!(kv.free_sequences(), 8, "sequences are given back");
        }
    }
}
