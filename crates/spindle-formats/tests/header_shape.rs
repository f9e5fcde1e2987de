//! Header shapes of configs and GGUF headers, against what transformers
//! and llama.cpp make of them, worked out by hand from their semantics:
//!
//! - Gemma 2: layer `i` slides when `(i + 1) % 2 != 0` (the even layers).
//! - Gemma 3: layer `i` slides when `(i + 1) % sliding_window_pattern != 0`
//!   (pattern 6 when the config has none); an explicit `layer_types` wins.
//! - Mistral: every layer uses `sliding_window` when it is set.
//! - Qwen 2/3: `sliding_window` is dropped unless `use_sliding_window`.
//! - llama.cpp runs Llama and Mistral GGUFs with full attention.

mod common;

use common::{GgufBuilder, TensorSpec, GGML_F32};
use serde_json::json;
use spindle_formats::{
    ArchFamily, FormatError, GgufFile, HeaderShape, HeaderSource, HfConfig, MetaValue,
};

fn hf(v: serde_json::Value) -> HeaderShape {
    HeaderShape::from_hf(&HfConfig::from_value(v)).unwrap()
}

fn globals(s: &HeaderShape) -> Vec<usize> {
    (0..s.n_layers).filter(|&l| !s.layer_sliding[l]).collect()
}

fn gemma3_config(layers: usize) -> serde_json::Value {
    json!({
        "model_type": "gemma3_text",
        "num_hidden_layers": layers,
        "hidden_size": 640,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 256,
        "intermediate_size": 2048,
        "vocab_size": 262_144,
        "max_position_embeddings": 32_768,
        "sliding_window": 512
    })
}

#[test]
fn gemma3_without_a_pattern_is_global_every_sixth_layer() {
    let s = hf(gemma3_config(18));
    assert_eq!(s.family(), Some(ArchFamily::Gemma3));
    // (i + 1) % 6 == 0: layers 5, 11, 17.
    assert_eq!(globals(&s), vec![5, 11, 17]);
    assert_eq!(s.sliding_window, Some(512));
    assert_eq!((s.n_heads, s.n_kv_heads, s.head_dim), (4, 1, 256));
    assert_eq!((s.vocab_size, s.context_length), (Some(262_144), 32_768));
    // Gemma ties its head unless told otherwise.
    assert_eq!(s.tied_embeddings, Some(true));
}

#[test]
fn gemma3_sliding_window_pattern_sets_the_period() {
    let mut c = gemma3_config(8);
    c["sliding_window_pattern"] = json!(4);
    // (i + 1) % 4 == 0: layers 3 and 7.
    assert_eq!(globals(&hf(c)), vec![3, 7]);
    let mut c = gemma3_config(8);
    c["sliding_window_pattern"] = json!(0);
    let err = HeaderShape::from_hf(&HfConfig::from_value(c)).unwrap_err();
    assert!(
        matches!(&err, FormatError::BadHeaderValue { key, .. } if key == "sliding_window_pattern"),
        "{err}"
    );
}

#[test]
fn layer_types_win_over_the_pattern() {
    let mut c = gemma3_config(4);
    c["sliding_window_pattern"] = json!(2);
    c["layer_types"] = json!([
        "full_attention",
        "sliding_attention",
        "sliding_attention",
        "full_attention"
    ]);
    assert_eq!(hf(c).layer_sliding, vec![false, true, true, false]);
    // A list of the wrong length is not a per-layer list: the pattern (6) applies.
    let mut c = gemma3_config(6);
    c["layer_types"] = json!(["full_attention", "sliding_attention"]);
    assert_eq!(globals(&hf(c)), vec![5]);
}

#[test]
fn gemma3_multimodal_config_takes_text_config_and_transformers_defaults() {
    // The published multimodal configs leave vocabulary and context out of
    // `text_config`; transformers' Gemma3TextConfig defaults are 262208 and 131072.
    let s = hf(json!({
        "model_type": "gemma3",
        "tie_word_embeddings": false,
        "text_config": {
            "model_type": "gemma3_text",
            "num_hidden_layers": 12,
            "hidden_size": 2560,
            "num_attention_heads": 8,
            "num_key_value_heads": 4,
            "head_dim": 256,
            "intermediate_size": 10240,
            "sliding_window": 1024
        }
    }));
    assert_eq!(s.arch.name, "gemma3_text");
    assert_eq!((s.vocab_size, s.context_length), (Some(262_208), 131_072));
    assert_eq!(globals(&s), vec![5, 11]);
    // The top-level key counts when text_config has none.
    assert_eq!(s.tied_embeddings, Some(false));
}

#[test]
fn gemma2_slides_even_layers() {
    let s = hf(json!({
        "model_type": "gemma2",
        "num_hidden_layers": 4,
        "hidden_size": 64,
        "num_attention_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 100,
        "sliding_window": 4096
    }));
    assert_eq!(s.layer_sliding, vec![true, false, true, false]);
    assert_eq!(s.sliding_window, Some(4096));
}

#[test]
fn qwen_windows_are_unused_unless_asked_for() {
    // Qwen2.5-7B: a window of 131072 with use_sliding_window false.
    let qwen = |extra: serde_json::Value| {
        let mut c = json!({
            "model_type": "qwen2",
            "num_hidden_layers": 4,
            "hidden_size": 64,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "intermediate_size": 128,
            "vocab_size": 152_064,
            "max_position_embeddings": 32_768,
            "sliding_window": 131_072,
            "max_window_layers": 2
        });
        for (k, v) in extra.as_object().unwrap() {
            c[k] = v.clone();
        }
        hf(c)
    };
    let s = qwen(json!({"use_sliding_window": false}));
    assert_eq!(
        (s.sliding_window, s.layer_sliding.clone()),
        (None, vec![false; 4])
    );
    // Without the key transformers' Qwen default is false too.
    assert_eq!(qwen(json!({})).sliding_window, None);
    // Asked for, it applies where `layer_types` says (transformers derives
    // that list from max_window_layers: layers 2 and 3 here).
    let s = qwen(json!({
        "use_sliding_window": true,
        "layer_types": ["full_attention", "full_attention", "sliding_attention", "sliding_attention"]
    }));
    assert_eq!(s.layer_sliding, vec![false, false, true, true]);
    assert_eq!(s.sliding_window, Some(131_072));
    // 64 / 4 heads = 16 per head; not tied by default.
    assert_eq!((s.head_dim, s.tied_embeddings), (16, Some(false)));
}

#[test]
fn mistral_config_slides_every_layer() {
    // Mistral 7B v0.1: window 4096, head_dim null (4096 / 32 = 128).
    let s = hf(json!({
        "model_type": "mistral",
        "num_hidden_layers": 32,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": null,
        "intermediate_size": 14336,
        "vocab_size": 32000,
        "max_position_embeddings": 32768,
        "sliding_window": 4096
    }));
    assert_eq!(s.head_dim, 128);
    assert_eq!(s.layer_sliding, vec![true; 32]);
    assert_eq!(s.sliding_window, Some(4096));
}

#[test]
fn config_errors_name_the_key() {
    let err = HeaderShape::from_hf(&HfConfig::from_value(json!({"num_hidden_layers": 2})));
    assert!(matches!(
        err,
        Err(FormatError::MissingHeaderKey { ref key, origin: HeaderSource::HfConfig, .. })
            if key == "model_type"
    ));
    let mut c = gemma3_config(2);
    c["num_attention_heads"] = json!(0);
    let err = HeaderShape::from_hf(&HfConfig::from_value(c))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("num_attention_heads") && err.contains("it is 0"),
        "{err}"
    );
    // Unknown families are read all the same.
    let mut c = gemma3_config(2);
    c["model_type"] = json!("mamba");
    let s = hf(c);
    assert_eq!((s.arch.name.as_str(), s.family()), ("mamba", None));
    assert_eq!((s.sliding_window, s.tied_embeddings), (Some(512), None));
}

fn u32v(v: u32) -> MetaValue {
    MetaValue::U32(v)
}

/// A GGUF header of `arch` with 4 layers and window 512; `embd` adds a
/// token embedding of 10 rows, `head` a separate output head.
fn gguf(arch: &str, embd: bool, head: bool) -> GgufBuilder {
    gguf_layers(arch, 4, embd, head)
}

fn gguf_layers(arch: &str, layers: u32, embd: bool, head: bool) -> GgufBuilder {
    let k = |s: &str| format!("{arch}.{s}");
    let mut b = GgufBuilder::new()
        .kv("general.architecture", MetaValue::Str(arch.into()))
        .kv(&k("block_count"), u32v(layers))
        .kv(&k("embedding_length"), u32v(8))
        .kv(&k("attention.head_count"), u32v(2))
        .kv(&k("attention.head_count_kv"), u32v(1))
        .kv(&k("feed_forward_length"), u32v(16))
        .kv(&k("context_length"), u32v(8192))
        .kv(&k("attention.sliding_window"), u32v(512));
    if embd {
        b = b.tensor(TensorSpec::new(
            "token_embd.weight",
            &[8, 10],
            GGML_F32,
            vec![0; 320],
        ));
    }
    if head {
        b = b.tensor(TensorSpec::new(
            "output.weight",
            &[8, 10],
            GGML_F32,
            vec![0; 320],
        ));
    }
    b
}

fn gguf_shape(b: GgufBuilder) -> Result<HeaderShape, FormatError> {
    HeaderShape::from_gguf(&GgufFile::from_bytes(b.build())?)
}

#[test]
fn llama_and_mistral_gguf_run_without_sliding_layers() {
    for arch in ["llama", "mistral"] {
        let s = gguf_shape(gguf(arch, true, true)).unwrap();
        assert_eq!(s.layer_sliding, vec![false; 4], "{arch}");
        assert_eq!(s.sliding_window, None, "{arch}");
        // No key_length: 8 / 2 heads.
        assert_eq!((s.n_heads, s.n_kv_heads, s.head_dim), (2, 1, 4));
        assert_eq!((s.vocab_size, s.context_length), (Some(10), 8192));
        assert_eq!(s.tied_embeddings, Some(false));
    }
}

#[test]
fn gemma_ggufs_slide_as_llama_cpp_runs_them() {
    let s = gguf_shape(gguf("gemma2", true, false)).unwrap();
    assert_eq!(s.layer_sliding, vec![true, false, true, false]);
    assert_eq!(s.sliding_window, Some(512));
    assert_eq!(s.tied_embeddings, Some(true));
    // Gemma 3: the 6th layer is the first global one; with 4 all slide,
    // so with 12 layers 5 and 11 are global.
    let s = gguf_shape(gguf("gemma3", true, false)).unwrap();
    assert_eq!(s.layer_sliding, vec![true; 4]);
    let s = gguf_shape(gguf_layers("gemma3", 12, true, false)).unwrap();
    assert_eq!(globals(&s), vec![5, 11]);
}

#[test]
fn gguf_vocabulary_and_per_layer_arrays() {
    // No embedding: the tokenizer's token list, else a vocab_size key.
    let tokens = MetaValue::Array((0..7).map(|i| MetaValue::Str(format!("t{i}"))).collect());
    let b = gguf("llama", false, false).kv("tokenizer.ggml.tokens", tokens);
    assert_eq!(gguf_shape(b).unwrap().vocab_size, Some(7));
    let b = gguf("llama", false, false).kv("llama.vocab_size", u32v(9));
    assert_eq!(gguf_shape(b).unwrap().vocab_size, Some(9));
    assert_eq!(
        gguf_shape(gguf("llama", false, false)).unwrap().vocab_size,
        None
    );
    // A per-layer feed-forward array gives its first value.
    let mut b = gguf("llama", true, true);
    b.kvs.retain(|(k, _)| k != "llama.feed_forward_length");
    let b = b.kv(
        "llama.feed_forward_length",
        MetaValue::Array(vec![u32v(24); 4]),
    );
    assert_eq!(gguf_shape(b).unwrap().n_ff, 24);
}

#[test]
fn gguf_errors_name_the_key() {
    let mut b = gguf("llama", true, true);
    b.kvs.retain(|(k, _)| k != "llama.block_count");
    let err = gguf_shape(b).unwrap_err();
    assert!(
        matches!(&err, FormatError::MissingHeaderKey { key, origin: HeaderSource::Gguf, .. }
            if key == "llama.block_count"),
        "{err}"
    );
    assert!(err.to_string().contains("llama.cpp"), "{err}");
    let mut b = gguf("llama", true, true);
    b.kvs.retain(|(k, _)| k != "general.architecture");
    let err = gguf_shape(b).unwrap_err();
    assert!(
        matches!(&err, FormatError::MissingHeaderKey { key, .. } if key == "general.architecture"),
        "{err}"
    );
}
