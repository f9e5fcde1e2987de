//! Shared helpers for tests on the tiny reference models (included with `mod`).
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use serde::Deserialize;
use spindle_model::{Batch, KvCache, LoadedModel};

pub const ARCHS: [&str; 10] = [
    "llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "qwen3moe", "mixtral", "phi3",
    "gpt-oss",
];

#[derive(Deserialize)]
pub struct Reference {
    pub arch: String,
    pub vocab_size: usize,
    pub prompts: Vec<RefPrompt>,
}

#[derive(Deserialize)]
pub struct RefPrompt {
    pub ids: Vec<u32>,
    pub logits: Vec<Vec<f32>>,
    pub greedy: Vec<u32>,
    pub greedy_margin: Vec<f32>,
}

pub fn fixture_dir(arch: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tiny")
        .join(arch)
}

pub fn reference(arch: &str) -> Reference {
    let text =
        std::fs::read_to_string(fixture_dir(arch).join("reference.json")).expect("reference.json");
    serde_json::from_str(&text).expect("reference parses")
}

/// The two encodings of each tiny model: safetensors directory and GGUF.
pub fn sources(arch: &str) -> [(&'static str, PathBuf); 2] {
    let dir = fixture_dir(arch);
    [
        ("safetensors", dir.clone()),
        ("gguf", dir.join("model.gguf")),
    ]
}

pub fn load(path: &Path, threads: usize) -> LoadedModel {
    spindle_model::load(path, threads).unwrap_or_else(|e| panic!("load {}: {e}", path.display()))
}

pub fn kv(m: &LoadedModel, max_len: usize) -> KvCache {
    m.model.new_kv_cache(m.model.default_kv_type(), max_len, 4)
}

/// Logits of every position of `ids` from one prefill pass on a fresh sequence.
pub fn prefill_logits(m: &LoadedModel, ids: &[u32]) -> Vec<Vec<f32>> {
    prefill_logits_in(m, ids, kv(m, 256))
}

/// [`prefill_logits`] in a cache of the caller's making.
pub fn prefill_logits_in(m: &LoadedModel, ids: &[u32], mut cache: KvCache) -> Vec<Vec<f32>> {
    let seq = cache.add_sequence().unwrap();
    let mut batch = Batch::new();
    batch.push_chain(seq, 0, ids, |_| true);
    let logits = m.model.forward(&batch, &mut cache).expect("forward");
    (0..ids.len())
        .map(|i| logits.row(i).unwrap().to_vec())
        .collect()
}

/// max |a - b| / max |b|
pub fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(1e-6);
    a.iter()
        .zip(b)
        .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()))
        / scale
}
