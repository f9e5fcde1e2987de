//! One head's chunk of scores turned into softmax weights: scaled (and
//! soft-capped), their max, `exp(score - max)` and the sum of those.
//!
//! The arithmetic is written once, in plain operations (no fused
//! multiply-add, which Rust never forms on its own), and compiled three
//! times: as is, and inside functions that enable AVX2 or AVX-512, where
//! the compiler vectorises the same operations. Every path therefore gives
//! the same bits. The exponential is [`crate::softmax::exp_nonpositive`],
//! a polynomial, not libm's `expf`, which cannot be vectorised: a prompt
//! at long context takes one exponential per (row, head, key), as many as
//! it takes 32 fused multiply-adds.
//!
//! Fixed order: the max over lanes is exact in any order; the sum adds key
//! `j` into lane `j % 8`, in key order, and reduces the lanes by
//! [`tree8`].

use crate::simd::{tree8, Isa};
use crate::softmax::exp_nonpositive;

/// Scales `scores` by `scale` (then soft-caps them), replaces each by
/// `exp(score - max)` and returns `(max, sum)`. `scores` must not be empty.
pub(super) fn weights(
    isa: Isa,
    scores: &mut [f32],
    scale: f32,
    softcap: Option<f32>,
) -> (f32, f32) {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512Vnni {
        // SAFETY: Avx512Vnni is chosen only on CPUs with AVX-512F/BW/VL and AVX2.
        return unsafe { weights_avx512(scores, scale, softcap) };
    }
    #[cfg(target_arch = "x86_64")]
    if isa.uses_avx2() {
        // SAFETY: Avx2 is chosen only on CPUs with AVX2 and FMA.
        return unsafe { weights_avx2(scores, scale, softcap) };
    }
    let _ = isa;
    weights_body(scores, scale, softcap)
}

/// # Safety
/// AVX-512F/BW/VL and AVX2 available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
unsafe fn weights_avx512(scores: &mut [f32], scale: f32, softcap: Option<f32>) -> (f32, f32) {
    weights_body(scores, scale, softcap)
}

/// # Safety
/// AVX2 available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn weights_avx2(scores: &mut [f32], scale: f32, softcap: Option<f32>) -> (f32, f32) {
    weights_body(scores, scale, softcap)
}

#[inline(always)]
fn weights_body(scores: &mut [f32], scale: f32, softcap: Option<f32>) -> (f32, f32) {
    for s in scores.iter_mut() {
        *s *= scale;
    }
    if let Some(cap) = softcap {
        for s in scores.iter_mut() {
            *s = (*s / cap).tanh() * cap;
        }
    }
    let mut lanes = [f32::NEG_INFINITY; 8];
    let mut blocks = scores.chunks_exact(8);
    for b in &mut blocks {
        for (l, &s) in lanes.iter_mut().zip(b) {
            *l = l.max(s);
        }
    }
    for (l, &s) in lanes.iter_mut().zip(blocks.remainder()) {
        *l = l.max(s);
    }
    let max = lanes.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    for s in scores.iter_mut() {
        *s = exp_nonpositive(*s - max);
    }
    let mut lanes = [0.0f32; 8];
    let mut blocks = scores.chunks_exact(8);
    for b in &mut blocks {
        for (l, &s) in lanes.iter_mut().zip(b) {
            *l += s;
        }
    }
    for (l, &s) in lanes.iter_mut().zip(blocks.remainder()) {
        *l += s;
    }
    (max, tree8(&lanes))
}
