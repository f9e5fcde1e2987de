//! Speed ceilings from bytes and arithmetic.
//!
//! Decoding is memory-bound: a step streams every weight once, however many
//! sequences it advances, and each sequence's KV once. Prefill is
//! compute-bound: every prompt token goes through every matmul.

use crate::device::Device;
use crate::plan::KvType;
use crate::shape::ModelShape;

/// Decode ceiling in tokens/s with `batch` sequences at context `ctx`:
/// `batch x bandwidth / (weights read per step + batch x KV per sequence)`.
/// A mixture-of-experts step reads the shared weights and the experts its
/// rows are expected to choose ([`ModelShape::decode_read_bytes`]).
/// The KV per sequence is what the step's last token reads, sliding layers
/// reading only their window.
pub fn decode_tokens_per_s(
    shape: &ModelShape,
    ctx: u64,
    batch: u64,
    kv: KvType,
    device: &Device,
) -> f64 {
    let weights = shape.decode_read_bytes(batch) as f64;
    let kv_bytes = shape.kv_read_bytes_per_seq(ctx, kv) as f64;
    let bytes = weights + batch as f64 * kv_bytes;
    if bytes <= 0.0 {
        return 0.0;
    }
    batch as f64 * device.bandwidth_bytes_s() / bytes
}

/// Attention FLOPs of a causal prefill of `tokens` tokens from position 0:
/// per layer and query head, `4 x head_dim` per visible key (2 for q.k, 2
/// for the weighted value sum), row `i` seeing `min(i + 1, window)` keys.
pub fn attention_flops(shape: &ModelShape, tokens: u64) -> f64 {
    let t = tokens as f64;
    let per_key = 4.0 * shape.n_heads as f64 * shape.head_dim as f64;
    let keys = |window: Option<u64>| match window {
        Some(w) if w < tokens => {
            let w = w as f64;
            w * (w + 1.0) / 2.0 + (t - w) * w
        }
        _ => t * (t + 1.0) / 2.0,
    };
    let sliding = shape.sliding_layers() as f64;
    let global = shape.global_layers() as f64;
    per_key * (global * keys(None) + sliding * keys(shape.sliding_window))
}

/// Prefill ceiling in tokens/s for a chunk of `tokens` tokens from
/// position 0. Assumptions: matmuls cost `2 x params` FLOPs per token for
/// the decoder layers' matrices (the output head runs for the last row
/// only, and the embedding is a lookup, so neither is counted), attention
/// adds [`attention_flops`], and the device reaches its peak rate on both.
/// The chunk must also stream the weights once, so the time is the larger
/// of the compute and memory times (a roofline).
pub fn prefill_tokens_per_s(shape: &ModelShape, tokens: u64, device: &Device) -> f64 {
    if tokens == 0 {
        return 0.0;
    }
    let matmul = 2.0 * shape.active_matmul_params() as f64 * tokens as f64;
    let compute_s = (matmul + attention_flops(shape, tokens)) / device.flops();
    let memory_s = shape.decode_read_bytes(tokens) as f64 / device.bandwidth_bytes_s();
    let seconds = compute_s.max(memory_s);
    if seconds <= 0.0 {
        return 0.0;
    }
    tokens as f64 / seconds
}

/// The smallest context at which a decode step with `batch` sequences reads
/// at least as many KV bytes as weight bytes (`batch x KV per sequence >=
/// weights read per step`), or `None` when it never does: every layer
/// slides and the windows together hold less than the weights.
pub fn kv_crossover_ctx(shape: &ModelShape, batch: u64, kv: KvType) -> Option<u64> {
    let weights = shape.decode_read_bytes(batch);
    let reads = |ctx: u64| shape.kv_read_bytes_per_seq(ctx, kv).saturating_mul(batch);
    let row = shape.kv_layer_row_bytes(kv);
    if batch == 0 || row == 0 {
        return None;
    }
    // KV reads grow with ctx until every layer's cache is full: forever with
    // a global layer, up to the window when all layers slide.
    let hi = if shape.global_layers() > 0 {
        // Global layers alone reach the weights by this context.
        let per_ctx = row
            .saturating_mul(shape.global_layers())
            .saturating_mul(batch);
        weights.div_ceil(per_ctx).max(1)
    } else {
        shape.sliding_window.unwrap_or(0).max(1)
    };
    if reads(hi) < weights {
        return None;
    }
    // The smallest ctx in 1..=hi whose reads reach the weights.
    let (mut lo, mut hi) = (1u64, hi);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if reads(mid) >= weights {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    Some(lo)
}
