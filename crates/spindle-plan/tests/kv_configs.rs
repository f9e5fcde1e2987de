//! KV sizes of public model configs against numbers worked out by hand.
//! Per token and layer, K and V each take kv_heads x head_dim elements.

mod common;
use common::config;

use spindle_formats::HfConfig;
use spindle_plan::{Family, KvType, ModelShape};

/// KV bytes `batch` sequences at `ctx` attend over (each layer's visible
/// positions): what the config says, before the engine rounds to blocks.
fn visible(s: &ModelShape, ctx: u64, batch: u64, kv: KvType) -> u64 {
    s.kv_read_bytes_per_seq(ctx, kv) * batch
}

/// The engine's pool holds whole 16-token blocks: a sliding window of 1024
/// spans 65 of them, and a context of 1000 takes 63.
#[test]
fn the_pool_rounds_to_blocks() {
    let s = config("gemma-3-27b");
    // 10 * 8192 * 32768 + 52 * 8192 * 1040.
    assert_eq!(s.kv_bytes(32_768, 1, KvType::F16), 3_127_377_920);
    let q = config("qwen3-8b");
    // 147456 * 1008 * 3.
    assert_eq!(q.kv_bytes(1000, 3, KvType::F16), 445_906_944);
}

#[test]
fn llama_3_1_8b() {
    let s = config("llama-3.1-8b");
    assert_eq!(s.family, Family::Llama);
    assert_eq!((s.n_layers, s.n_kv_heads, s.head_dim), (32, 8, 128));
    assert_eq!(s.context_length, 131_072);
    assert!(!s.tied_embeddings);
    assert_eq!(s.sliding_layers(), 0);
    // 2 * 32 layers * 8 heads * 128 * 2 bytes = 131072 bytes/token.
    assert_eq!(s.kv_bytes_per_token(KvType::F16), 131_072);
    // q8_0: 8 * 128 = 1024 values = 32 blocks of 34 bytes = 1088; 2 * 32 * 1088 = 69632.
    assert_eq!(s.kv_bytes_per_token(KvType::Q8_0), 69_632);
    // 131072 * 8192 tokens = 1 GiB.
    assert_eq!(visible(&s, 8192, 1, KvType::F16), 1_073_741_824);
    // 131072 * 131072 tokens * 4 sequences = 64 GiB.
    assert_eq!(visible(&s, 131_072, 4, KvType::F16), 68_719_476_736);
}

#[test]
fn llama_3_1_70b() {
    let s = config("llama-3.1-70b");
    assert_eq!(
        (s.n_layers, s.n_heads, s.n_kv_heads, s.head_dim),
        (80, 64, 8, 128)
    );
    // 2 * 80 * 8 * 128 * 2 = 327680 bytes/token.
    assert_eq!(s.kv_bytes_per_token(KvType::F16), 327_680);
    // 327680 * 4096 = 1342177280 (1.25 GiB).
    assert_eq!(visible(&s, 4096, 1, KvType::F16), 1_342_177_280);
    // 327680 * 32768 * 8 = 85899345920 (80 GiB: a whole H100 for KV alone).
    assert_eq!(visible(&s, 32_768, 8, KvType::F16), 85_899_345_920);
}

#[test]
fn mistral_7b_v0_1_slides_on_every_layer() {
    let s = config("mistral-7b-v0.1");
    assert_eq!(s.sliding_window, Some(4096));
    assert_eq!(s.sliding_layers(), 32);
    // head_dim absent: 4096 / 32 = 128. 2 * 32 * 8 * 128 * 2 = 131072 bytes/token.
    assert_eq!(s.head_dim, 128);
    assert_eq!(s.kv_bytes_per_token(KvType::F16), 131_072);
    // Inside the window: 131072 * 2048 = 268435456.
    assert_eq!(visible(&s, 2048, 1, KvType::F16), 268_435_456);
    // Past it every layer holds 4096 tokens: 131072 * 4096 * 2 sequences = 1073741824.
    assert_eq!(visible(&s, 32_768, 2, KvType::F16), 1_073_741_824);
}

#[test]
fn qwen3_8b_does_not_slide() {
    let s = config("qwen3-8b");
    assert_eq!(s.family, Family::Qwen3);
    assert_eq!(s.sliding_window, None);
    assert_eq!(s.sliding_layers(), 0);
    // Explicit head_dim 128. 2 * 36 * 8 * 128 * 2 = 147456 bytes/token.
    assert_eq!(s.kv_bytes_per_token(KvType::F16), 147_456);
    // 147456 * 40960 = 6039797760.
    assert_eq!(visible(&s, 40_960, 1, KvType::F16), 6_039_797_760);
    // 147456 * 1000 * 3 = 442368000.
    assert_eq!(visible(&s, 1000, 3, KvType::F16), 442_368_000);
}

#[test]
fn gemma_3_27b_every_sixth_layer_global() {
    let s = config("gemma-3-27b");
    assert_eq!(s.family, Family::Gemma3);
    assert_eq!((s.n_layers, s.n_kv_heads, s.head_dim), (62, 16, 128));
    // Left to transformers' defaults in the published config.
    assert_eq!((s.vocab_size, s.context_length), (262_208, 131_072));
    assert!(s.tied_embeddings);
    // Global layers 5, 11, ..., 59: 10 of them; 52 slide with window 1024.
    let globals: Vec<usize> = (0..62).filter(|&l| !s.layer_sliding[l]).collect();
    assert_eq!(globals, vec![5, 11, 17, 23, 29, 35, 41, 47, 53, 59]);
    assert_eq!(s.sliding_window, Some(1024));
    // Per layer and token: 2 * 16 * 128 * 2 = 8192; 62 layers: 507904 bytes/token.
    assert_eq!(s.kv_bytes_per_token(KvType::F16), 507_904);
    // ctx 32768: 10 * 8192 * 32768 + 52 * 8192 * 1024 = 2684354560 + 436207616.
    assert_eq!(visible(&s, 32_768, 1, KvType::F16), 3_120_562_176);
    // ctx 131072: 10 * 8192 * 131072 + 52 * 8192 * 1024 = 10737418240 + 436207616.
    assert_eq!(visible(&s, 131_072, 1, KvType::F16), 11_173_625_856);
    // ctx 512 is inside the window: 507904 * 512 * 4 sequences = 1040187392.
    assert_eq!(visible(&s, 512, 4, KvType::F16), 1_040_187_392);
}

#[test]
fn gemma_2_9b_even_layers_slide() {
    let s = config("gemma-2-9b");
    assert_eq!(s.family, Family::Gemma2);
    assert_eq!(s.sliding_layers(), 21);
    assert!(s.layer_sliding[0] && !s.layer_sliding[1] && s.layer_sliding[40]);
    // 2 * 42 * 8 * 256 * 2 = 344064 bytes/token (8192 per layer).
    assert_eq!(s.kv_bytes_per_token(KvType::F16), 344_064);
    // ctx 8192: 21 * 8192 * 8192 + 21 * 8192 * 4096 = 1409286144 + 704643072.
    assert_eq!(visible(&s, 8192, 1, KvType::F16), 2_113_929_216);
    // ctx 2048, inside the window: 344064 * 2048 * 2 = 1409286144.
    assert_eq!(visible(&s, 2048, 2, KvType::F16), 1_409_286_144);
    // q8_0 at ctx 8192: per layer row 8 * 256 = 2048 values = 64 blocks * 34 = 2176,
    // times 2 (K, V) = 4352; 21 * 4352 * 8192 + 21 * 4352 * 4096 = 748683264 + 374341632.
    assert_eq!(visible(&s, 8192, 1, KvType::Q8_0), 1_123_024_896);
}

#[test]
fn layer_types_list_wins_over_the_family_pattern() {
    let cfg = HfConfig::from_value(serde_json::json!({
        "model_type": "gemma3_text",
        "num_hidden_layers": 4,
        "hidden_size": 64,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "intermediate_size": 128,
        "vocab_size": 100,
        "sliding_window": 16,
        "layer_types": ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]
    }));
    let s = ModelShape::from_hf_config(&cfg, "tiny").unwrap();
    assert_eq!(s.layer_sliding, vec![false, true, true, false]);
    // ctx 100: per layer row 2 * 32 * 2 = 128 bytes; 2 * 100 + 2 * 16 = 232 rows.
    assert_eq!(visible(&s, 100, 1, KvType::F16), 128 * 232);
}

#[test]
fn qwen2_with_sliding_window_on_is_still_full_attention_as_the_engine_runs_it() {
    // The engine does not slide Qwen layers without a `layer_types` list.
    let cfg = HfConfig::from_value(serde_json::json!({
        "model_type": "qwen2",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 100,
        "sliding_window": 16,
        "use_sliding_window": true
    }));
    let s = ModelShape::from_hf_config(&cfg, "tiny").unwrap();
    assert_eq!(s.sliding_layers(), 0);
    assert_eq!(s.sliding_window, None);
    // No num_key_value_heads: one per query head; head_dim 64 / 2 = 32.
    assert_eq!(s.kv_bytes_per_token(KvType::F16), 2 * 2 * 2 * 32 * 2);
}

#[test]
fn missing_keys_are_named() {
    let cfg = HfConfig::from_value(serde_json::json!({
        "model_type": "llama",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "intermediate_size": 128,
        "vocab_size": 100
    }));
    let err = ModelShape::from_hf_config(&cfg, "tiny")
        .unwrap_err()
        .to_string();
    assert!(err.contains("num_attention_heads"), "{err}");
    let cfg = HfConfig::from_value(serde_json::json!({"num_hidden_layers": 2}));
    let err = ModelShape::from_hf_config(&cfg, "tiny")
        .unwrap_err()
        .to_string();
    assert!(err.contains("model_type"), "{err}");
    let cfg = HfConfig::from_value(serde_json::json!({
        "model_type": "llama",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 0,
        "intermediate_size": 128,
        "vocab_size": 100
    }));
    let err = ModelShape::from_hf_config(&cfg, "tiny")
        .unwrap_err()
        .to_string();
    assert!(err.contains("it is 0"), "{err}");
}
