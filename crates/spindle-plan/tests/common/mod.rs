//! Writers of header-only model files, and fixture configs, for tests.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use spindle_formats::HfConfig;
use spindle_plan::ModelShape;

/// Bytes per element of the dtypes the tests use.
fn dtype_size(dtype: &str) -> u64 {
    match dtype {
        "F32" | "I32" => 4,
        "F16" | "BF16" => 2,
        "I64" => 8,
        other => panic!("test dtype {other}"),
    }
}

/// The JSON header of a safetensors file holding `tensors` (name, dtype,
/// shape) back to back, and the length of the data it describes.
pub fn safetensors_header(tensors: &[(&str, &str, &[u64])]) -> (Vec<u8>, u64) {
    let mut map = serde_json::Map::new();
    map.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
    let mut at = 0u64;
    for (name, dtype, shape) in tensors {
        let bytes = shape.iter().product::<u64>() * dtype_size(dtype);
        map.insert(
            name.to_string(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [at, at + bytes]}),
        );
        at += bytes;
    }
    (serde_json::to_vec(&map).unwrap(), at)
}

/// Writes a header-only safetensors file: the 8-byte length and the JSON,
/// without the data it describes. Returns the data length left out.
pub fn write_header_only(path: &Path, tensors: &[(&str, &str, &[u64])]) -> u64 {
    let (json, data_len) = safetensors_header(tensors);
    let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&json);
    std::fs::write(path, bytes).unwrap();
    data_len
}

/// A tiny Llama: 2 layers, hidden 64, 4 heads of 16, 2 KV heads, FFN 128,
/// vocabulary 1000, a separate head.
pub const TINY_CONFIG: &str = r#"{
    "model_type": "llama",
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 1000,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": false
}"#;

/// The tensors of [`TINY_CONFIG`] in Hugging Face names: BF16 matrices but
/// F16 v_proj, F32 norms, and an I64 buffer.
pub fn tiny_tensors() -> Vec<(String, &'static str, Vec<u64>)> {
    let mut t: Vec<(String, &'static str, Vec<u64>)> = vec![
        ("model.embed_tokens.weight".into(), "BF16", vec![1000, 64]),
        ("lm_head.weight".into(), "BF16", vec![1000, 64]),
        ("model.norm.weight".into(), "F32", vec![64]),
        ("model.rope_cache".into(), "I64", vec![2, 4]),
    ];
    for l in 0..2 {
        let p = |s: &str| format!("model.layers.{l}.{s}");
        t.push((p("self_attn.q_proj.weight"), "BF16", vec![64, 64]));
        t.push((p("self_attn.k_proj.weight"), "BF16", vec![32, 64]));
        t.push((p("self_attn.v_proj.weight"), "F16", vec![32, 64]));
        t.push((p("self_attn.o_proj.weight"), "BF16", vec![64, 64]));
        t.push((p("mlp.gate_proj.weight"), "BF16", vec![128, 64]));
        t.push((p("mlp.up_proj.weight"), "BF16", vec![128, 64]));
        t.push((p("mlp.down_proj.weight"), "BF16", vec![64, 128]));
        t.push((p("input_layernorm.weight"), "F32", vec![64]));
        t.push((p("post_attention_layernorm.weight"), "F32", vec![64]));
    }
    t
}

pub fn as_refs<'a>(
    t: &'a [(String, &'static str, Vec<u64>)],
) -> Vec<(&'a str, &'a str, &'a [u64])> {
    t.iter()
        .map(|(n, d, s)| (n.as_str(), *d, s.as_slice()))
        .collect()
}

/// The shape of a published `config.json` kept in `tests/fixtures/NAME/`.
pub fn config(name: &str) -> ModelShape {
    let path: PathBuf = [
        env!("CARGO_MANIFEST_DIR"),
        "tests",
        "fixtures",
        name,
        "config.json",
    ]
    .iter()
    .collect();
    let cfg = HfConfig::load(&path).expect("fixture config parses");
    ModelShape::from_hf_config(&cfg, name).expect("fixture config plans")
}
