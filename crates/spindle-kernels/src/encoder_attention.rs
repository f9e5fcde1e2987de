//! Full (bidirectional) attention inside one sequence, for encoders (BERT):
//! every row sees every row of its own sequence and nothing else.
//!
//! One head of one sequence at a time, from contiguous per-head copies: the
//! queries and values row by row, the keys transposed (`kt[c * len + j]`),
//! so that both inner loops are plain `y += a * x` over a row and vectorise
//! without reordering a sum. Each score is summed over the head's
//! dimensions in index order, the exponentials in 8 lanes reduced by
//! `tree8`, each output over the keys in position order: a row's result
//! depends only on its sequence, and every ISA gives the scalar bits
//! ([`compiled_per_isa`]).

use crate::simd::{compiled_per_isa, tree8};
use crate::softmax::exp_nonpositive;

/// One head of one text: its rows, the head's width, the score scale.
#[derive(Debug, Clone, Copy)]
pub struct HeadShape {
    pub len: usize,
    pub head_dim: usize,
    pub scale: f32,
}

compiled_per_isa! {
    /// `out[i] = softmax_j(scale * q[i] · k[j]) · v` for the `len` rows of one
    /// head: `q`, `v` and `out` are `len x head_dim` row-major, `kt` is
    /// `head_dim x len`, `scores` at least `len` long (scratch).
    pub fn full_attention_head(
        q: &[f32],
        kt: &[f32],
        v: &[f32],
        shape: HeadShape,
        scores: &mut [f32],
        out: &mut [f32],
    ) = full_attention_head_body;
}

#[inline(always)]
fn full_attention_head_body(
    q: &[f32],
    kt: &[f32],
    v: &[f32],
    shape: HeadShape,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let HeadShape {
        len,
        head_dim,
        scale,
    } = shape;
    assert!(q.len() >= len * head_dim && v.len() >= len * head_dim);
    assert!(kt.len() >= len * head_dim && out.len() >= len * head_dim);
    let s = &mut scores[..len];
    for i in 0..len {
        let qi = &q[i * head_dim..(i + 1) * head_dim];
        s.fill(0.0);
        for (c, &qc) in qi.iter().enumerate() {
            let kc = &kt[c * len..(c + 1) * len];
            for (x, &k) in s.iter_mut().zip(kc) {
                *x += qc * k;
            }
        }
        let mut max = f32::NEG_INFINITY;
        for x in s.iter_mut() {
            *x *= scale;
            max = max.max(*x);
        }
        let mut lanes = [0.0f32; 8];
        for chunk in s.chunks_mut(8) {
            for (l, x) in lanes.iter_mut().zip(chunk) {
                *x = exp_nonpositive(*x - max);
                *l += *x;
            }
        }
        let inv = 1.0 / tree8(&lanes);
        let o = &mut out[i * head_dim..(i + 1) * head_dim];
        o.fill(0.0);
        for (j, &p) in s.iter().enumerate() {
            let vj = &v[j * head_dim..(j + 1) * head_dim];
            for (y, &x) in o.iter_mut().zip(vj) {
                *y += p * x;
            }
        }
        for y in o.iter_mut() {
            *y *= inv;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::{available_isas, Isa};

    fn data(n: usize, seed: u32) -> Vec<f32> {
        let mut x = seed.wrapping_mul(2_654_435_761);
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                (x % 2001) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn matches_f64_softmax_attention_on_every_path() {
        let (len, d) = (37, 32);
        let q = data(len * d, 1);
        let k = data(len * d, 2);
        let v = data(len * d, 3);
        let mut kt = vec![0.0; len * d];
        for j in 0..len {
            for c in 0..d {
                kt[c * len + j] = k[j * d + c];
            }
        }
        let shape = HeadShape {
            len,
            head_dim: d,
            scale: 1.0 / (d as f32).sqrt(),
        };
        let scale = shape.scale;
        let mut scores = vec![0.0; len];
        let mut want = vec![0.0; len * d];
        full_attention_head(Isa::Scalar, &q, &kt, &v, shape, &mut scores, &mut want);
        for i in 0..len {
            let s: Vec<f64> = (0..len)
                .map(|j| {
                    (0..d)
                        .map(|c| q[i * d + c] as f64 * k[j * d + c] as f64)
                        .sum::<f64>()
                        * scale as f64
                })
                .collect();
            let m = s.iter().cloned().fold(f64::MIN, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let z: f64 = e.iter().sum();
            for c in 0..d {
                let o: f64 = (0..len).map(|j| e[j] * v[j * d + c] as f64).sum::<f64>() / z;
                assert!((want[i * d + c] as f64 - o).abs() < 1e-5, "row {i} dim {c}");
            }
        }
        for isa in available_isas() {
            let mut got = vec![0.0; len * d];
            full_attention_head(isa, &q, &kt, &v, shape, &mut scores, &mut got);
            assert_eq!(got, want, "{isa}");
        }
    }
}
