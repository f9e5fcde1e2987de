//! Whole plans: speed ceilings and crossovers worked out by hand, memory
//! limits, the activation terms, the JSON shape and the table.

mod common;
use common::config;

use spindle_plan::{
    activation_terms, kv_crossover_ctx, plan, Device, EngineProfile, KvType, ModelShape, Phase,
    Plan, PlanRequest, WeightFormat, WeightStats,
};

/// Llama-3.1-8B in BF16: 8,030,261,248 parameters = 16,060,522,496 bytes;
/// embedding and head 128256 * 4096 * 2 = 1,050,673,152 bytes each; decoder
/// matmuls per layer 4096*4096*2 (q, o) + 1024*4096*2 (k, v) + 3*4096*14336
/// = 218,103,808, times 32 layers = 6,979,321,856.
fn llama_8b_bf16() -> ModelShape {
    let mut s = config("llama-3.1-8b");
    s.weights = WeightStats {
        format: WeightFormat::Safetensors,
        bytes: 16_060_522_496,
        by_type: [("BF16".to_string(), 16_060_522_496)].into_iter().collect(),
        tensors: 291,
        embedding_bytes: 1_050_673_152,
        output_head_bytes: 1_050_673_152,
        head_type: Some("BF16".into()),
        non_language_bytes: 0,
        layer_matmul_params: 6_979_321_856,
        expert_bytes: 0,
        expert_matmul_params: 0,
        vector_params: 266_240,
        quantized_matmuls: false,
        file_overhead_bytes: 0,
    };
    s
}

fn close(got: f64, want: f64) {
    assert!(
        (got - want).abs() <= 1e-9 * want.abs(),
        "got {got}, want {want}"
    );
}

#[test]
fn llama_8b_ceilings_and_crossovers_by_hand() {
    let s = llama_8b_bf16();
    let h100 = Device::parse("h100").unwrap();
    let p = plan(
        &s,
        &PlanRequest::new(8192, 8, KvType::F16, h100),
        &EngineProfile::cpu_with_threads(2),
    );
    // Weights read per step: 16,060,522,496 - untied embedding 1,050,673,152.
    let w = 15_009_849_344.0;
    assert_eq!(p.weights_read_per_step_bytes, 15_009_849_344);
    // KV per sequence at 8192: 131072 * 8192 = 1,073,741,824.
    assert_eq!(p.kv_read_per_seq_bytes, 1_073_741_824);
    let kv = 1_073_741_824.0;
    // batch 1: 3350e9 / (w + kv) = 208.29; batch 8: 8 * 3350e9 / (w + 8 kv) = 1135.6.
    close(p.decode_tokens_per_s.batch_1, 3350e9 / (w + kv));
    close(p.decode_tokens_per_s.batch_b, 8.0 * 3350e9 / (w + 8.0 * kv));
    assert!((p.decode_tokens_per_s.batch_1 - 208.29).abs() < 0.01);
    assert!((p.decode_tokens_per_s.batch_b - 1135.60).abs() < 0.01);

    // q8_0 KV: 69632 bytes/token, 570,425,344 per sequence at 8192.
    let kv8 = 69_632.0 * 8192.0;
    close(
        p.q8_kv_gain.batch_b,
        (8.0 * 3350e9 / (w + 8.0 * kv8)) / (8.0 * 3350e9 / (w + 8.0 * kv)),
    );
    assert!((p.q8_kv_gain.batch_b - 1.2057).abs() < 1e-3);

    // Crossover: the smallest ctx with B * 131072 * ctx >= w:
    // ceil(15,009,849,344 / 131072) = 114517; / 8 -> 14315; / 32 -> 3579.
    assert_eq!(p.kv_crossover_ctx.batch_1, Some(114_517));
    assert_eq!(p.kv_crossover_ctx.batch_8, Some(14_315));
    assert_eq!(p.kv_crossover_ctx.batch_32, Some(3579));
    // (114516 * 131072 = 15,009,841,152 < w <= 114517 * 131072 = 15,009,972,224.)

    // Prefill of 2048 tokens: 2 * 6,979,321,856 * 2048 = 2.8587e13 matmul
    // FLOPs; attention 4 * 32 heads * 128 * (2048 * 2049 / 2) * 32 layers
    // = 1.1000e12; at 989 TFLOPS: 0.030017 s, longer than one weight read
    // (15.0e9 / 3350e9 = 0.0045 s), so 2048 / 0.030017 = 68227 tokens/s.
    let flops =
        2.0 * 6_979_321_856.0 * 2048.0 + 4.0 * 32.0 * 128.0 * (2048.0 * 2049.0 / 2.0) * 32.0;
    close(p.prefill_tokens_per_s, 2048.0 / (flops / 989e12));
    assert!((p.prefill_tokens_per_s - 68_226.8).abs() < 0.1);
}

#[test]
fn sliding_models_cross_late_or_never() {
    // Mistral-7B-v0.1 in BF16: 14,483,464,192 bytes, embedding and head
    // 32000 * 4096 * 2 = 262,144,000 each: 14,221,320,192 read per step.
    let mut s = config("mistral-7b-v0.1");
    s.weights.bytes = 14_483_464_192;
    s.weights.embedding_bytes = 262_144_000;
    s.weights.output_head_bytes = 262_144_000;
    // Every layer slides (4096): a sequence never holds more than
    // 131072 * 4096 = 536,870,912 bytes of KV. 1 or 8 of them stay under
    // the weights (8 * 536,870,912 = 4.3e9), 32 pass them (17.2e9) at
    // ceil(14,221,320,192 / (32 * 131072)) = 3391.
    assert_eq!(kv_crossover_ctx(&s, 1, KvType::F16), None);
    assert_eq!(kv_crossover_ctx(&s, 8, KvType::F16), None);
    assert_eq!(kv_crossover_ctx(&s, 32, KvType::F16), Some(3391));

    // Gemma-3-27B with 54e9 bytes read per step (tied head). Past 1024,
    // a sequence holds 10 * 8192 * ctx + 52 * 8192 * 1024 (= 436,207,616):
    // B = 1: ceil((54e9 - 436,207,616) / 81920) = 653855;
    // B = 8: ceil((54e9 - 8 * 436,207,616) / (8 * 81920)) = 77073;
    // B = 32: ceil((54e9 - 32 * 436,207,616) / (32 * 81920)) = 15275.
    let mut g = config("gemma-3-27b");
    g.weights.bytes = 54_000_000_000;
    g.weights.embedding_bytes = 1_409_286_144;
    assert_eq!(kv_crossover_ctx(&g, 1, KvType::F16), Some(653_855));
    assert_eq!(kv_crossover_ctx(&g, 8, KvType::F16), Some(77_073));
    assert_eq!(kv_crossover_ctx(&g, 32, KvType::F16), Some(15_275));

    // Past the crossover the window caps decode KV reads: at batch 1 the
    // Mistral decode ceiling stops falling once ctx passes 4096.
    let h100 = Device::parse("h100").unwrap();
    let at = |ctx| {
        plan(
            &s,
            &PlanRequest::new(ctx, 1, KvType::F16, h100.clone()),
            &EngineProfile::cpu_with_threads(2),
        )
        .decode_tokens_per_s
        .batch_1
    };
    assert!(at(2048) > at(4096));
    assert_eq!(at(4096), at(32_768));
}

/// Gemma 3 270M's shape with its Q4_K_M weights (ANCHORS.md), built by hand.
fn gemma_270m() -> ModelShape {
    ModelShape {
        name: "gemma-3-270m".into(),
        family: spindle_plan::Family::Gemma3,
        n_layers: 18,
        n_embd: 640,
        n_heads: 4,
        n_kv_heads: 1,
        head_dim: 256,
        n_ff: 2048,
        vocab_size: 262_144,
        context_length: 32_768,
        sliding_window: Some(512),
        layer_sliding: (0..18).map(|l| (l + 1) % 6 != 0).collect(),
        tied_embeddings: true,
        experts: None,
        weights: WeightStats {
            format: WeightFormat::Gguf,
            bytes: 246_587_904,
            quantized_matmuls: true,
            ..WeightStats::empty()
        },
    }
}

#[test]
fn activation_terms_by_hand() {
    let s = gemma_270m();
    let terms = activation_terms(
        &s,
        4096,
        1,
        KvType::F16,
        2048,
        &EngineProfile::cpu_with_threads(2),
    );
    let bytes = |prefix: &str| {
        terms
            .iter()
            .find(|t| t.name.starts_with(prefix))
            .unwrap_or_else(|| panic!("no term {prefix}"))
            .bytes
    };
    // A 2048-row prefill chunk; n_embd 640, q 4 * 256 = 1024, kv 256, FFN 2048.
    assert_eq!(bytes("PassBuffers.h:"), 4 * 2048 * 640);
    assert_eq!(bytes("PassBuffers.q:"), 4 * 2048 * 1024);
    assert_eq!(bytes("PassBuffers.k:"), 4 * 2048 * 256);
    assert_eq!(bytes("PassBuffers.gate:"), 4 * 2048 * 2048);
    assert_eq!(bytes("Logits.data"), 4 * 262_144);
    assert_eq!(bytes("Hidden.data"), 4 * 640);
    // Scratch K and V of 2048 rows in 18 layers, f16: 2 * 18 * 2048 * 512.
    assert_eq!(bytes("KvCache.scratch"), 37_748_736);
    // Attention reads K/V in place: nothing is widened to f32.
    assert!(terms.iter().all(|t| !t.name.starts_with("KvViews")));
    // A 2048-row chain lists 2048 * 2049 / 2 ancestors of 8 bytes.
    assert_eq!(bytes("RowPlan.path"), 16_785_408);
    // Widest matmul input 2048 (FFN down): 2048 rows of int8 + 64 blocks * 6.
    assert_eq!(bytes("QuantizedActs"), 2048 * 2048 + 2048 * 64 * 6);
    // 8 ActPairs of 832 bytes (512 int8, 16 scales, 16 corrections, 16
    // sums, 32 half sums) per pair of rows.
    assert_eq!(bytes("PACKED"), 1024 * 8 * 832);
    // 2 threads * 4 rows * 8 WGroups of 640 bytes.
    assert_eq!(bytes("WTILE"), 40_960);
    // Per task (2 threads): two fold states of a 32-row tile (4 heads x
    // (256 + 2) floats each), the tile's scores over a 256-key chunk, 64
    // widened keys and 64 widened values of 256 floats, 8 score chains of
    // 6 queries x 64 keys, and 2 x 256 key references of 16 bytes. The
    // 2048-row chunk is too many rows to split its chunks into tasks, so it
    // holds no partials buffer.
    assert_eq!(
        bytes("attention task scratch"),
        2 * (2 * 4 * 32 * 4 * 258
            + 4 * 32 * 4 * 256
            + 2 * 4 * 64 * 256
            + 4 * 8 * 6 * 64
            + 2 * 16 * 256)
    );
    // One decode row has its 4096 keys split into 16 + 1 chunks, each a
    // partial of 4 heads x 258 floats and a 64-byte reference.
    assert_eq!(bytes("attention partials"), 4 * 4 * 258 * 17 + 64 * 17);
    let total: u64 = terms.iter().map(|t| t.bytes).sum();
    assert_eq!(total, 141_990_496);
    // The chunk's ancestor lists and attention scratch (16,785,408 +
    // 1,093,632) are gone before the decode pass's hidden rows, logits,
    // sampler and attention partials (2,560 + 1,048,576 + 3,145,728 +
    // 71,264) exist: the peak counts the larger set only.
    let phase = |p: Phase| -> u64 { terms.iter().filter(|t| t.phase == p).map(|t| t.bytes).sum() };
    assert_eq!(phase(Phase::Prefill), 17_879_040);
    assert_eq!(phase(Phase::Decode), 4_268_128);
    let p = plan(
        &s,
        &PlanRequest::new(4096, 1, KvType::F16, Device::parse("h100").unwrap()),
        &EngineProfile::cpu_with_threads(2),
    );
    assert_eq!(p.activation_bytes, 141_990_496 - 4_268_128);
}

#[test]
fn max_ctx_and_max_batch_are_the_last_that_fit() {
    let s = gemma_270m();
    let profile = EngineProfile::cpu_with_threads(2);
    let device = Device::parse("custom:0.75,26.9,0.2").unwrap();
    let req = PlanRequest::new(8192, 4, KvType::F16, device.clone());
    let p = plan(&s, &req, &profile);
    let total = |ctx, batch| {
        plan(
            &s,
            &PlanRequest::new(ctx, batch, KvType::F16, device.clone()),
            &profile,
        )
        .total_bytes
    };
    let mem = device.memory_bytes;
    assert!(p.max_ctx > 0 && p.max_ctx < s.context_length);
    assert!(total(p.max_ctx, 4) <= mem && total(p.max_ctx + 1, 4) > mem);
    assert!(p.max_batch > 0);
    assert!(total(8192, p.max_batch) <= mem && total(8192, p.max_batch + 1) > mem);
    assert_eq!(p.fits, p.total_bytes <= mem);
    assert_eq!(
        p.total_bytes,
        p.weights_bytes + p.kv_bytes + p.activation_bytes + p.overhead_bytes
    );

    // Roomy device: the context is capped by the model's own.
    let big = plan(
        &s,
        &PlanRequest::new(1024, 1, KvType::F16, Device::parse("h200").unwrap()),
        &profile,
    );
    assert_eq!(big.max_ctx, 32_768);
    assert!(big.fits);

    // Tiny device: nothing fits, and the plan says so rather than failing.
    let tiny = plan(
        &s,
        &PlanRequest::new(
            1024,
            1,
            KvType::F16,
            Device::parse("custom:0.1,1,1").unwrap(),
        ),
        &profile,
    );
    assert!(!tiny.fits);
    assert_eq!((tiny.max_ctx, tiny.max_batch), (0, 0));
    assert!(tiny.render_table().contains("DOES NOT FIT"));
}

#[test]
fn json_has_the_promised_shape() {
    let s = config("mistral-7b-v0.1");
    let mut s2 = s.clone();
    s2.weights.bytes = 14_483_464_192;
    let p = plan(
        &s2,
        &PlanRequest::new(4096, 4, KvType::Q8_0, Device::parse("l4").unwrap()),
        &EngineProfile::cpu_with_threads(2),
    );
    let v: serde_json::Value = serde_json::from_str(&p.to_json()).unwrap();
    for key in [
        "weights_bytes",
        "kv_bytes_per_token",
        "kv_bytes",
        "activation_bytes",
        "overhead_bytes",
        "total_bytes",
        "max_ctx",
        "max_batch",
    ] {
        assert!(v[key].is_u64(), "{key}: {}", v[key]);
    }
    assert!(v["weights_by_type"].is_object());
    assert!(v["fits"].is_boolean());
    assert!(v["decode_tokens_per_s"]["batch_1"].is_f64());
    assert!(v["decode_tokens_per_s"]["batch_b"].is_f64());
    assert!(v["prefill_tokens_per_s"].is_number());
    let cross = v["kv_crossover_ctx"].as_object().unwrap();
    assert_eq!(cross.keys().collect::<Vec<_>>(), ["1", "8", "32"]);
    // Every layer slides, and q8_0 windows are small: even 32 sequences hold
    // at most 32 * 69632 * 4096 = 9.1e9 bytes of KV, under the 14.5e9 of
    // weights, so no batch ever crosses: null.
    assert!(cross.values().all(|c| c.is_null()), "{cross:?}");
    assert_eq!(v["kv_type"], "q8_0");
    // And it reads back (floats to within JSON's decimal rounding).
    let back: Plan = serde_json::from_value(v).unwrap();
    assert_eq!(back.activation_terms, p.activation_terms);
    assert_eq!(back.kv_crossover_ctx, p.kv_crossover_ctx);
    assert_eq!(
        (back.total_bytes, back.max_batch),
        (p.total_bytes, p.max_batch)
    );
    close(back.prefill_tokens_per_s, p.prefill_tokens_per_s);

    // With f16 (twice the bytes), 32 sequences do cross.
    let p = plan(
        &s2,
        &PlanRequest::new(4096, 4, KvType::F16, Device::parse("l4").unwrap()),
        &EngineProfile::cpu_with_threads(2),
    );
    let v: serde_json::Value = serde_json::from_str(&p.to_json()).unwrap();
    assert!(v["kv_crossover_ctx"]["1"].is_null());
    assert!(v["kv_crossover_ctx"]["32"].is_u64());
    assert_eq!(v["kv_type"], "f16");
}

#[test]
fn table_shows_units_and_verdict() {
    let s = llama_8b_bf16();
    let p = plan(
        &s,
        &PlanRequest::new(8192, 8, KvType::F16, Device::parse("h100").unwrap()),
        &EngineProfile::cpu_with_threads(2),
    );
    let t = p.render_table();
    assert!(t.contains("14.96 GiB"), "{t}"); // 16,060,522,496 bytes of weights
    assert!(t.contains("BF16"), "{t}");
    assert!(t.contains("8.00 GiB"), "{t}"); // KV: 1 GiB x 8 sequences
    assert!(t.contains("128.00 KiB per token"), "{t}");
    assert!(t.contains("fits"), "{t}");
    assert!(t.contains("ctx 114517 (batch 1)"), "{t}");
    assert!(
        t.contains("activations and overhead use the cpu engine profile"),
        "{t}"
    );
}

#[test]
fn zero_sizes_are_rejected_by_validate_and_planned_as_one() {
    let s = gemma_270m();
    let req = PlanRequest::new(0, 0, KvType::F16, Device::parse("h100").unwrap());
    assert!(req.validate().is_err());
    let p = plan(&s, &req, &EngineProfile::cpu_with_threads(2));
    assert_eq!((p.ctx, p.batch), (1, 1));
    assert!(p.notes.iter().any(|n| n.contains("planned as 1")));
    assert!(KvType::parse("q4").is_err());
    assert_eq!(KvType::parse("Q8_0").unwrap(), KvType::Q8_0);
}

/// all-MiniLM-L6-v2 as `spindle pull all-minilm-l6-v2` stores it (config
/// and safetensors headers; a BERT encoder of 6 layers, width 384, FFN 1536):
/// no KV cache, memory flat in ctx and batch, its float layer matrices
/// counted again as the f32 panels the float kernel packs (6 x (4 x 384^2
/// + 2 x 384 x 1536) floats), no head screen, and the note says what it is.
#[test]
fn an_encoder_plans_no_kv_and_its_packed_matrices() {
    let dir = std::env::var_os("SPINDLE_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".cache/spindle"))
        })
        .map(|h| h.join("models/all-MiniLM-L6-v2"));
    let Some(dir) = dir.filter(|d| d.join("model.safetensors").exists()) else {
        assert!(
            std::env::var("SPINDLE_REQUIRE_MODEL").ok().as_deref() != Some("1"),
            "all-MiniLM-L6-v2 is not pulled (spindle pull all-minilm-l6-v2)"
        );
        eprintln!("skipped: all-MiniLM-L6-v2 is not pulled");
        return;
    };
    let shape = ModelShape::from_path(&dir).unwrap();
    assert!(shape.is_encoder());
    let device = Device::parse("h100").unwrap();
    let at = |ctx, batch| {
        plan(
            &shape,
            &PlanRequest::new(ctx, batch, KvType::F16, device.clone()),
            &EngineProfile::cpu(),
        )
    };
    let p = at(512, 1);
    assert!(p.encoder);
    assert_eq!((p.kv_bytes, p.kv_bytes_per_token), (0, 0));
    assert_eq!(p.kv_read_per_seq_bytes, 0);
    assert_eq!(p.kv_crossover_ctx.batch_1, None);
    let panels = p
        .overhead_terms
        .iter()
        .find(|t| t.name.starts_with("encoder float matrices"))
        .expect("a term for the packed matrices");
    assert_eq!(panels.bytes, 4 * 6 * (4 * 384 * 384 + 2 * 384 * 1536));
    assert!(p
        .overhead_terms
        .iter()
        .all(|t| !t.name.starts_with("output head screen") || t.bytes == 0));
    assert_eq!(
        at(8, 1).total_bytes,
        at(512, 64).total_bytes,
        "memory flat in ctx and batch"
    );
    assert!(p.notes.iter().any(|n| n.starts_with("an encoder (BERT)")));
    assert!(!p.notes.iter().any(|n| n.contains("not one Spindle runs")));
    assert!(p.render_table().contains("any (texts run in passes"));
}
