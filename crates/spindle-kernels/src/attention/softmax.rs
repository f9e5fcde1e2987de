//! One head's chunk of scores turned into softmax weights: scaled (and
//! soft-capped), their max, `exp(score - max)` and the sum of those.
//!
//! The arithmetic is written once, in plain operations, and compiled per
//! ISA by [`compiled_per_isa`]: every path gives the same bits. The exponential is [`crate::softmax::exp_nonpositive`],
//! a polynomial, not libm's `expf`, which cannot be vectorised: a prompt
//! at long context takes one exponential per (row, head, key), as many as
//! it takes 32 fused multiply-adds.
//!
//! Fixed order: the max over lanes is exact in any order; the sum adds key
//! `j` into lane `j % 8`, in key order, and reduces the lanes by
//! [`tree8`].

use crate::simd::{compiled_per_isa, tree8};
use crate::softmax::exp_nonpositive;

compiled_per_isa! {
    /// Scales `scores` by `scale` (then soft-caps them), replaces each by
    /// `exp(score - max)` and returns `(max, sum)`. `scores` must not be
    /// empty.
    pub(super) fn weights(scores: &mut [f32], scale: f32, softcap: Option<f32>) -> (f32, f32) = weights_body;
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
