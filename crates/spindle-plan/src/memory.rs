//! Where the bytes go: KV cache, activations and workspace, overhead, and
//! the largest context and batch that fit.
//!
//! The activation terms follow how the engine allocates (spindle-model's
//! `forward.rs`, spindle-kernels' matmul and attention): one term per buffer,
//! named after it, so a term that drifts from the code is easy to find. Every
//! buffer is counted as live at once: the big ones are (they are kept from
//! pass to pass at their largest size), the transient ones are small.

use serde::{Deserialize, Serialize};

use crate::plan::KvType;
use crate::profile::EngineProfile;
use crate::shape::ModelShape;
use crate::source::WeightFormat;

/// One named allocation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Term {
    pub name: String,
    pub bytes: u64,
    /// When it is live.
    pub phase: Phase,
}

/// When an activation term is live: kept from pass to pass, or only during
/// the prefill chunk, or only during the decode pass (the two never overlap).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Always,
    Prefill,
    Decode,
}

/// Product of `xs`, saturating (absurd requests must not wrap around to
/// small numbers that "fit").
fn mul(xs: &[u64]) -> u64 {
    xs.iter().fold(1u64, |a, &x| a.saturating_mul(x))
}

const F32: u64 = 4;
/// Bytes of one `ActPair` (spindle-kernels quant/multi_row/vnni.rs): a group
/// of 8 blocks of two activation rows, 512 int8 values, 16 f32 scales, 16
/// i32 corrections, 16 f32 sums, 32 i32 half sums. The AVX2 path's
/// `ActGroup` (one row: 256 + 3 * 32 bytes) takes less; the planner counts
/// the larger.
const ACT_PAIR_BYTES: u64 = 512 + 64 + 64 + 64 + 128;
/// Bytes of one `WGroup` (same file): 256 u8 + 8 f32 + 8 f32 + 256 i8 + 32 i16.
const W_GROUP_BYTES: u64 = 256 + 32 + 32 + 256 + 64;
/// Weight rows per register tile of the AVX2 multi-row kernels (`MR`).
const TILE_ROWS: u64 = 4;
/// Positions per attention chunk (spindle-kernels attention `CHUNK`).
const ATTENTION_CHUNK: u64 = 256;
/// Rows per attention tile (spindle-model forward/attention.rs `TILE_ROWS`).
const ATTENTION_TILE_ROWS: u64 = 32;
/// forward/attention.rs SPLIT_PARTIALS_BYTES: the most a pass of too few
/// tiles for the threads spends on chunk partials.
const ATTENTION_SPLIT_PARTIALS: u64 = 8 << 20;
/// Keys the wide attention kernels widen at a time (spindle-kernels
/// attention/wide.rs `KEYS`), and the query vectors of their register tile.
const ATTENTION_WIDE_KEYS: u64 = 64;
const ATTENTION_WIDE_QUERIES: u64 = 6;

/// Activation and workspace bytes of the engine's largest pass at context
/// `ctx` with `batch` sequences: a prefill chunk of `min(prefill_chunk,
/// ctx)` rows, or a decode pass of `batch` rows, whichever is larger.
pub fn activation_terms(
    shape: &ModelShape,
    ctx: u64,
    batch: u64,
    kv: KvType,
    prefill_chunk: u64,
    profile: &EngineProfile,
) -> Vec<Term> {
    if shape.is_encoder() {
        return encoder_activation_terms(shape, profile);
    }
    let (e, qd, kvd, ff, vocab) = (
        shape.n_embd,
        shape.q_dim(),
        shape.kv_dim(),
        shape.n_ff,
        shape.vocab_size,
    );
    // Rows of a prefill chunk (a chain), and of the largest pass.
    let chain = prefill_chunk.min(ctx).max(1);
    let n = chain.max(batch);
    // Rows asking for logits: every decoding sequence (a prefill chunk asks
    // only for its last row).
    let logit_rows = batch;
    // Committed positions one sequence's rows can see at `ctx`, over all layers.
    let visible = shape.max_visible_tokens(ctx);
    // Keys one attention task scores: the visible committed ones plus the
    // pass's own rows, never more than the context.
    let keys = visible.saturating_add(chain).min(ctx).max(1);
    let group = shape.n_heads / shape.n_kv_heads.max(1);
    // Widest matmul input row: wq/wk/wv/gate/up read n_embd, wo q_dim, down n_ff.
    // A mixture of experts runs its experts at their own width and keeps
    // no dense gate/up rows.
    let (ff, dense_ff) = match shape.experts {
        Some(x) => (x.n_ff, 0),
        None => (ff, ff),
    };
    let widest = e.max(qd).max(ff);
    let quant = shape.weights.quantized_matmuls;
    let threads = profile.threads;

    let mut terms = vec![
        // forward.rs PassBuffers: kept from pass to pass at their largest size.
        ("PassBuffers.h: residual stream, f32", mul(&[F32, n, e])),
        ("PassBuffers.xn: normed layer input, f32", mul(&[F32, n, e])),
        ("PassBuffers.q: queries, f32", mul(&[F32, n, qd])),
        ("PassBuffers.k: keys of the pass, f32", mul(&[F32, n, kvd])),
        (
            "PassBuffers.v: values of the pass, f32",
            mul(&[F32, n, kvd]),
        ),
        (
            "PassBuffers.attn: attention output, f32",
            mul(&[F32, n, qd]),
        ),
        ("PassBuffers.o: output projections, f32", mul(&[F32, n, e])),
        ("PassBuffers.gate: FFN gate, f32", mul(&[F32, n, dense_ff])),
        ("PassBuffers.up: FFN up, f32", mul(&[F32, n, dense_ff])),
        (
            "PassBuffers.hn: final-normed rows that want logits, f32",
            mul(&[F32, logit_rows, e]),
        ),
        // kv_cache.rs Scratch: every layer's K and V rows of the pass, stored type.
        (
            "KvCache.scratch: the pass's K/V rows, every layer",
            mul(&[2, shape.n_layers, n, kv.row_bytes(kvd)]),
        ),
    ];
    if let Some(x) = shape.experts {
        // forward/experts.rs ExpertBuffers: an expert's rows are at most
        // the pass's (every row may choose it).
        let (ne, k) = (x.n_experts, x.n_used);
        terms.extend([
            (
                "ExpertBuffers.logits: router logits, f32",
                mul(&[F32, n, ne]),
            ),
            (
                "ExpertBuffers.choices and members: each row's experts",
                mul(&[16 + 8, n, k]).saturating_add(mul(&[24, ne])),
            ),
            // ExpertScratch: one expert at a time holds up to all n rows;
            // experts run as tasks (at most 16 rows each, forward/experts.rs
            // ROWS_PER_EXPERT_TASK) keep one scratch per expert hit.
            (
                "ExpertScratch: experts' rows in and out and hidden rows, f32",
                mul(&[
                    2 * F32,
                    n.saturating_add(ne.min(n.saturating_mul(k)).saturating_mul(16)),
                    e + ff,
                ]),
            ),
            (
                "ExpertBuffers.slots: every chosen expert's output, f32",
                mul(&[F32, n, k, e]),
            ),
        ]);
    }
    if quant {
        terms.extend(int8_matmul_terms(n, widest, threads));
    }
    // forward/attention.rs reads K/V in place. A pass of few rows (fewer
    // than 4 x threads / KV heads) splits each row's keys into chunks that
    // run as separate tasks, each writing its partial (per query head: the
    // weighted values, max and sum) to a buffer that is folded afterwards;
    // so does a pass of too few tiles (of ATTENTION_TILE_ROWS chained rows)
    // for the threads, up to ATTENTION_SPLIT_PARTIALS bytes.
    let chunks = keys.div_ceil(ATTENTION_CHUNK) + 1;
    let partials = |rows: u64| {
        let n_kv = shape.n_kv_heads.max(1);
        let split = mul(&[F32, rows, shape.n_heads, shape.head_dim + 2, chunks])
            .saturating_add(mul(&[64, rows, n_kv, chunks]));
        if rows.saturating_mul(n_kv) < 4 * threads {
            split
        } else if rows.div_ceil(ATTENTION_TILE_ROWS).saturating_mul(n_kv) < threads {
            split.min(ATTENTION_SPLIT_PARTIALS)
        } else {
            0
        }
    };
    // Per running task (one per thread): its tile's fold states and one
    // chunk's partials, the scores of the tile's rows over a chunk, the
    // wide kernels' widened keys and values and score chains (counted on
    // every CPU: a few hundred KiB), and the chunk's key and value row
    // references (16 bytes each).
    let per_task = mul(&[2 * F32, ATTENTION_TILE_ROWS, group, shape.head_dim + 2])
        .saturating_add(mul(&[F32, ATTENTION_TILE_ROWS, group, ATTENTION_CHUNK]))
        .saturating_add(mul(&[2 * F32, ATTENTION_WIDE_KEYS, shape.head_dim]))
        .saturating_add(mul(&[F32, 8, ATTENTION_WIDE_QUERIES, ATTENTION_WIDE_KEYS]))
        .saturating_add(mul(&[2 * 16, ATTENTION_CHUNK]));
    let term = |name: &str, bytes, phase| Term {
        name: name.into(),
        bytes,
        phase,
    };
    let mut terms: Vec<Term> = terms
        .into_iter()
        .map(|(name, bytes)| term(name, bytes, Phase::Always))
        .collect();
    // Transients: the prefill chunk's per-row ancestor lists and attention
    // scratch are gone before the decode pass makes its logits and samples.
    terms.extend([
        // forward.rs RowPlan::path: a chain row lists all its ancestors.
        term(
            "RowPlan.path: each row's ancestors in the batch",
            mul(&[8, (chain * (chain + 1) / 2).max(batch)]),
            Phase::Prefill,
        ),
        term(
            "attention task scratch per thread: fold states, scores, key refs",
            mul(&[threads, per_task]).saturating_add(partials(chain)),
            Phase::Prefill,
        ),
        term(
            "attention partials of a decode pass's chunks",
            partials(batch),
            Phase::Decode,
        ),
        // forward.rs Hidden::data: forward_hidden's output, read by the head.
        term(
            "Hidden.data: final-normed rows that want logits, f32",
            mul(&[F32, logit_rows, e]),
            Phase::Decode,
        ),
        // forward.rs returns Logits::data, held while the rows are sampled;
        // once dropped, spare_logits.rs keeps the buffer (at most 32 MiB)
        // for the next pass's logits, so the two are the same memory and
        // are counted once.
        term(
            "Logits.data: logits of those rows, f32",
            mul(&[F32, logit_rows, vocab]),
            Phase::Decode,
        ),
        // sampler/mod.rs: a penalised copy (f32) and the (id, logit) candidates.
        term(
            "sampler: penalised logits and candidate list",
            mul(&[12, vocab]),
            Phase::Decode,
        ),
    ]);
    terms
}

/// Rows of an encoder pass: `spindle embed`'s default `--embed-batch-tokens`
/// (texts are packed into passes of at most this many tokens, whatever the
/// batch).
pub const ENCODER_PASS_TOKENS: u64 = 2048;

/// What the int8 matmuls hold for a pass of `n` rows whose widest matmul
/// input is `widest` values, on `threads` threads.
fn int8_matmul_terms(n: u64, widest: u64, threads: u64) -> [(&'static str, u64); 3] {
    // matmul.rs PACKED: the same rows packed for the multi-row kernels, in
    // pairs on the VNNI path.
    let packed = if n >= 2 {
        mul(&[n.div_ceil(2), widest.div_ceil(256), ACT_PAIR_BYTES])
    } else {
        0
    };
    [
        // matmul.rs ACTS (calling thread): int8 values plus, per 32, an f32
        // scale and an i16 sum; sized by the widest input of the largest pass.
        (
            "QuantizedActs: int8 activations, scales and block sums",
            mul(&[n, widest]).saturating_add(mul(&[6, n, widest / 32])),
        ),
        (
            "PACKED: activations packed as ActPairs (VNNI) or ActGroups",
            packed,
        ),
        // quant/multi_row.rs WTILE: a tile of packed weight rows per thread.
        (
            "WTILE: packed weight tile per thread",
            mul(&[threads, TILE_ROWS, widest.div_ceil(256), W_GROUP_BYTES]),
        ),
    ]
}

/// An encoder pass's buffers (spindle-model `encoder/pass.rs`: the hidden
/// rows and `Buffers`), at [`ENCODER_PASS_TOKENS`] rows, and for quantized
/// matrices what the int8 matmuls hold; a text's attention scratch is small
/// beside them.
fn encoder_activation_terms(shape: &ModelShape, profile: &EngineProfile) -> Vec<Term> {
    let (n, h, ff) = (ENCODER_PASS_TOKENS, shape.n_embd, shape.n_ff);
    let mut terms = vec![
        ("encoder pass: hidden rows, f32", mul(&[F32, n, h])),
        (
            "encoder Buffers.qkv: Q, K, V rows, f32",
            mul(&[F32, n, 3 * h]),
        ),
        (
            "encoder Buffers.attn: attention output, f32",
            mul(&[F32, n, h]),
        ),
        ("encoder Buffers.proj: projections, f32", mul(&[F32, n, h])),
        ("encoder Buffers.up: FFN up, f32", mul(&[F32, n, ff])),
    ];
    if encoder_panel_bytes(shape) == 0 {
        terms.extend(int8_matmul_terms(n, h.max(ff), profile.threads));
    }
    terms
        .into_iter()
        .map(|(name, bytes)| Term {
            name: name.into(),
            bytes,
            phase: Phase::Always,
        })
        .collect()
}

/// An encoder's float layer matrices packed as f32 for its float kernel
/// (spindle-kernels `float_panels.rs`), held beside the file's copy: Q, K,
/// V, output, up and down of every layer. 0 for quantized files, whose
/// matrices the int8 kernels read in place.
pub fn encoder_panel_bytes(shape: &ModelShape) -> u64 {
    let float = ["F32", "F16", "BF16"];
    let w = &shape.weights;
    let float_bytes: u64 = float.iter().filter_map(|t| w.by_type.get(*t)).sum();
    if !shape.is_encoder() || float_bytes < w.bytes / 2 {
        return 0;
    }
    let (h, ff) = (shape.n_embd, shape.n_ff);
    let per_layer = (4 * h)
        .saturating_mul(h)
        .saturating_add((2 * h).saturating_mul(ff));
    mul(&[F32, shape.n_layers, per_layer])
}

/// Peak of activation terms: what is always live, plus the larger of the
/// two passes' transients.
pub(crate) fn activation_peak(terms: &[Term]) -> u64 {
    let of = |p: Phase| {
        terms
            .iter()
            .filter(|t| t.phase == p)
            .fold(0u64, |a, t| a.saturating_add(t.bytes))
    };
    of(Phase::Always).saturating_add(of(Phase::Prefill).max(of(Phase::Decode)))
}

/// What the engine holds besides weights, KV and activations.
pub fn overhead_terms(shape: &ModelShape, profile: &EngineProfile) -> Vec<Term> {
    let mut terms = fixed_overhead_terms(shape, profile);
    terms.insert(
        1,
        Term {
            name: "tokenizer, once built (calibrated per vocabulary entry)".into(),
            bytes: mul(&[profile.tokenizer_bytes_per_entry, shape.vocab_size]),
            phase: Phase::Always,
        },
    );
    terms.push(Term {
        name: "output head screen: a 4-bit copy of a Q8_0 head, its scales and bounds".into(),
        bytes: head_screen_bytes(shape),
        phase: Phase::Always,
    });
    if shape.is_encoder() {
        terms.push(Term {
            name: "encoder float matrices packed as f32 beside the file".into(),
            bytes: encoder_panel_bytes(shape),
            phase: Phase::Always,
        });
    }
    terms
}

/// What the engine's head screen holds (spindle-kernels `head_screen.rs`,
/// built at load for Q8_0 heads): per token, 32 bytes of nibbles per two
/// blocks of 32, the f16 scales padded to 8, and 9 f32 bound terms; plus
/// the 8 basis rows. 0 for other head types.
pub fn head_screen_bytes(shape: &ModelShape) -> u64 {
    if shape.weights.head_type.as_deref() != Some("Q8_0") || shape.is_encoder() {
        return 0;
    }
    let blocks = shape.n_embd / 32;
    let per_token = blocks.div_ceil(2) * 32 + blocks.div_ceil(8) * 8 * 2 + 9 * F32;
    mul(&[per_token, shape.vocab_size]).saturating_add(mul(&[8 * F32, shape.n_embd]))
}

/// The overhead that does not change while loading: runtime, the resident
/// file copy's header, f32 copies of norms.
fn fixed_overhead_terms(shape: &ModelShape, profile: &EngineProfile) -> Vec<Term> {
    let w = &shape.weights;
    let file_copy = if profile.resident_gguf_copy && w.format == WeightFormat::Gguf {
        w.file_overhead_bytes
    } else {
        0
    };
    let term = |name: &str, bytes| Term {
        name: name.into(),
        bytes,
        phase: Phase::Always,
    };
    vec![
        term(
            "runtime: binary, allocator, threads (calibrated constant)",
            profile.runtime_bytes,
        ),
        term(
            "GGUF header and padding in the resident file copy",
            file_copy,
        ),
        term(
            "f32 copies of norms and biases",
            mul(&[F32, w.vector_params]),
        ),
    ]
}

/// Peak while loading: the weights are read while the tokenizer is built
/// on another thread, whose transient peak is larger than what it keeps.
pub(crate) fn load_peak_bytes(shape: &ModelShape, profile: &EngineProfile) -> u64 {
    shape
        .weights
        .bytes
        .saturating_add(sum(&fixed_overhead_terms(shape, profile)))
        .saturating_add(mul(&[
            profile.tokenizer_build_bytes_per_entry,
            shape.vocab_size,
        ]))
}

/// Sum of a list of terms.
pub(crate) fn sum(terms: &[Term]) -> u64 {
    terms.iter().fold(0u64, |a, t| a.saturating_add(t.bytes))
}

/// Everything the engine needs at `ctx` x `batch`.
pub(crate) fn total_bytes(
    shape: &ModelShape,
    ctx: u64,
    batch: u64,
    kv: KvType,
    prefill_chunk: u64,
    profile: &EngineProfile,
) -> u64 {
    let running = shape
        .weights
        .bytes
        .saturating_add(shape.kv_bytes(ctx, batch, kv))
        .saturating_add(activation_peak(&activation_terms(
            shape,
            ctx,
            batch,
            kv,
            prefill_chunk,
            profile,
        )))
        .saturating_add(sum(&overhead_terms(shape, profile)));
    running.max(load_peak_bytes(shape, profile))
}

/// The largest `x` in `1..=hi` with `fits(x)`, for `fits` true up to some
/// point and false after; 0 when even 1 does not fit.
pub(crate) fn largest(hi: u64, fits: impl Fn(u64) -> bool) -> u64 {
    if hi == 0 || !fits(1) {
        return 0;
    }
    let (mut lo, mut hi) = (1u64, hi);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

/// Largest context (up to the model's) that fits `memory` at `batch`.
pub(crate) fn max_ctx(
    shape: &ModelShape,
    batch: u64,
    kv: KvType,
    prefill_chunk: u64,
    profile: &EngineProfile,
    memory: u64,
) -> u64 {
    largest(shape.context_length, |ctx| {
        total_bytes(shape, ctx, batch, kv, prefill_chunk, profile) <= memory
    })
}

/// Largest number of sequences that fits `memory` at `ctx`.
pub(crate) fn max_batch(
    shape: &ModelShape,
    ctx: u64,
    kv: KvType,
    prefill_chunk: u64,
    profile: &EngineProfile,
    memory: u64,
) -> u64 {
    // Every sequence adds at least its KV; a bound far past any real answer.
    const CAP: u64 = 1 << 40;
    largest(CAP, |batch| {
        total_bytes(shape, ctx, batch, kv, prefill_chunk, profile) <= memory
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn largest_finds_the_edge() {
        assert_eq!(largest(100, |x| x <= 37), 37);
        assert_eq!(largest(100, |_| true), 100);
        assert_eq!(largest(100, |_| false), 0);
        assert_eq!(largest(0, |_| true), 0);
        assert_eq!(largest(1 << 40, |x| x <= 123_456_789), 123_456_789);
    }

    #[test]
    fn mul_saturates() {
        assert_eq!(mul(&[2, 3, 7]), 42);
        assert_eq!(mul(&[u64::MAX, 2]), u64::MAX);
    }
}
