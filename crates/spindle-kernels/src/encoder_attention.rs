//! Full (bidirectional) attention inside one sequence, for encoders (BERT):
//! every row sees every row of its own sequence and nothing else.
//!
//! One head of one sequence at a time, from contiguous per-head copies: the
//! queries and values row by row, the keys transposed (`kt[c * keys_stride(len) + j]`),
//! so that both inner loops are plain `y += a * x` over a row and vectorise
//! without reordering a sum. Each score is summed over the head's
//! dimensions in index order, the exponentials in 8 lanes reduced by
//! `tree8`, each output over the keys in position order: a row's result
//! depends only on its sequence, and every ISA gives the scalar bits
//! ([`compiled_per_isa`]).

use crate::simd::{compiled_per_isa, tree8};
use crate::softmax::exp_nonpositive;

/// One head of one text: its rows, the head's width, the score scale, and
/// the distance between rows of `q`, `v` and `out` (they may be columns of
/// wider rows, as a head's are of a layer's Q, K, V rows).
#[derive(Debug, Clone, Copy)]
pub struct HeadShape {
    pub len: usize,
    pub head_dim: usize,
    pub scale: f32,
    pub q_stride: usize,
    pub v_stride: usize,
    pub out_stride: usize,
}

/// Every head of one text: `qkv` holds its `len` rows of Q, K and V (each
/// `h` wide, `heads` heads of `h / heads` columns), `out` its `len` output
/// rows of `h`. Queries and values are read in place, each head's keys
/// transposed into scratch, each head by [`full_attention_head`] with the
/// scale `1 / sqrt(head width)`.
pub fn text_attention(
    isa: crate::simd::Isa,
    qkv: &[f32],
    len: usize,
    heads: usize,
    out: &mut [f32],
) {
    if len == 0 {
        return;
    }
    let h = out.len() / len;
    let d = h / heads.max(1);
    assert!(d * heads == h && qkv.len() >= len * 3 * h && out.len() == len * h);
    let keys = keys_stride(len);
    let mut kt = vec![0.0f32; keys * d];
    let mut scores = vec![0.0f32; scores_len(len)];
    let shape = HeadShape {
        len,
        head_dim: d,
        scale: 1.0 / (d as f32).sqrt(),
        q_stride: 3 * h,
        v_stride: 3 * h,
        out_stride: h,
    };
    for head in 0..heads {
        let at = head * d;
        for i in 0..len {
            let k = &qkv[i * 3 * h + h + at..i * 3 * h + h + at + d];
            for (c, &kv) in k.iter().enumerate() {
                kt[c * keys + i] = kv;
            }
        }
        full_attention_head(
            isa,
            &qkv[at..],
            &kt,
            &qkv[2 * h + at..],
            shape,
            &mut scores,
            &mut out[at..],
        );
    }
}

/// `out[i] = softmax_j(scale * q[i] · k[j]) · v` for the `len` rows of one
/// head: row `i` of `q`, `v` and `out` starts at `i` times its stride and
/// is `head_dim` long, `kt` is `head_dim x keys_stride(len)`, `scores` at
/// least [`scores_len`] long (scratch).
pub fn full_attention_head(
    isa: crate::simd::Isa,
    q: &[f32],
    kt: &[f32],
    v: &[f32],
    shape: HeadShape,
    scores: &mut [f32],
    out: &mut [f32],
) {
    check_shapes(q, kt, v, shape, scores, out);
    #[cfg(target_arch = "x86_64")]
    if isa.uses_avx512() && shape.head_dim.is_multiple_of(BLOCK) {
        // SAFETY: AVX-512 paths are chosen only on CPUs with AVX-512F/BW/VL;
        // the buffers' sizes are checked above.
        return unsafe { avx512::full_attention_head(q, kt, v, shape, scores, out) };
    }
    portable_full_attention_head(isa, q, kt, v, shape, scores, out);
}

/// Panics unless the buffers hold what [`full_attention_head`] reads and
/// writes.
fn check_shapes(q: &[f32], kt: &[f32], v: &[f32], shape: HeadShape, scores: &[f32], out: &[f32]) {
    let HeadShape {
        len,
        head_dim,
        q_stride,
        v_stride,
        out_stride,
        ..
    } = shape;
    let end = |stride: usize| (len - 1) * stride + head_dim;
    assert!(len > 0 && q.len() >= end(q_stride) && v.len() >= end(v_stride));
    assert!(kt.len() >= keys_stride(len) * head_dim && out.len() >= end(out_stride));
    assert!(scores.len() >= scores_len(len));
    assert!(head_dim <= q_stride && head_dim <= v_stride && head_dim <= out_stride);
}

compiled_per_isa! {
    /// [`full_attention_head`] in plain code, vectorised by the compiler.
    fn portable_full_attention_head(
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
        q_stride,
        v_stride,
        out_stride,
    } = shape;
    // Keys padded to whole blocks: the padding's scores are computed with
    // the rest and never read.
    let keys = keys_stride(len);
    // Queries in groups of four: each key or value row is loaded once for
    // the group, while each query's sums keep their own order.
    let mut i = 0;
    while i < len {
        let g = (len - i).min(QUERIES);
        let (s0, rest) = scores.split_at_mut(keys);
        let (s1, rest) = rest.split_at_mut(keys);
        let (s2, rest) = rest.split_at_mut(keys);
        let s3 = &mut rest[..keys];
        let mut s = [s0, s1, s2, s3];
        let qs: [&[f32]; QUERIES] = std::array::from_fn(|t| {
            let at = (i + t.min(g - 1)) * q_stride;
            &q[at..at + head_dim]
        });
        // Keys in blocks of 16 whose sums stay in registers while the
        // dimensions go by: each score is summed over the dimensions in
        // order.
        for jb in (0..keys).step_by(BLOCK) {
            let mut acc = [[0.0f32; BLOCK]; QUERIES];
            for c in 0..head_dim {
                let k: &[f32; BLOCK] = kt[c * keys + jb..c * keys + jb + BLOCK]
                    .try_into()
                    .expect("a block");
                for (a, qt) in acc.iter_mut().zip(&qs) {
                    let qc = qt[c];
                    for (x, &kv) in a.iter_mut().zip(k) {
                        *x += qc * kv;
                    }
                }
            }
            for (row, a) in s.iter_mut().zip(&acc) {
                row[jb..jb + BLOCK].copy_from_slice(a);
            }
        }
        let inv = softmax_rows(&mut s, len, scale);
        let row = |j: usize| &v[j * v_stride..j * v_stride + head_dim];
        if head_dim.is_multiple_of(BLOCK) {
            // Each block of 16 dimensions of the four outputs in registers
            // while the keys go by (in order).
            for cb in (0..head_dim).step_by(BLOCK) {
                let mut acc = [[0.0f32; BLOCK]; QUERIES];
                for j in 0..len {
                    let vj: &[f32; BLOCK] = row(j)[cb..cb + BLOCK].try_into().expect("a block");
                    for (a, sr) in acc.iter_mut().zip(&s) {
                        let p = sr[j];
                        for (y, &x) in a.iter_mut().zip(vj) {
                            *y += p * x;
                        }
                    }
                }
                for t in 0..g {
                    let ot = &mut out[(i + t) * out_stride + cb..(i + t) * out_stride + cb + BLOCK];
                    for (y, &a) in ot.iter_mut().zip(&acc[t]) {
                        *y = a * inv[t];
                    }
                }
            }
        } else {
            for t in 0..g {
                let ot = &mut out[(i + t) * out_stride..(i + t) * out_stride + head_dim];
                ot.fill(0.0);
                for (j, &p) in s[t][..len].iter().enumerate() {
                    for (y, &x) in ot.iter_mut().zip(row(j)) {
                        *y += p * x;
                    }
                }
                for y in ot.iter_mut() {
                    *y *= inv[t];
                }
            }
        }
        i += g;
    }
}

/// Each score row's first `len` scores scaled and turned into
/// `exp(score - max)`; returns `1 / sum` of each row (summed in 8 lanes,
/// reduced by `tree8`).
#[inline(always)]
fn softmax_rows(s: &mut [&mut [f32]; QUERIES], len: usize, scale: f32) -> [f32; QUERIES] {
    let mut inv = [0.0f32; QUERIES];
    for (row, inv) in s.iter_mut().zip(inv.iter_mut()) {
        let row = &mut row[..len];
        // The maximum in 16 lanes (exact in any order, so vectorised).
        let mut lanes = [f32::NEG_INFINITY; BLOCK];
        for chunk in row.chunks_mut(BLOCK) {
            for (l, x) in lanes.iter_mut().zip(chunk) {
                *x *= scale;
                *l = l.max(*x);
            }
        }
        let max = lanes.iter().fold(f32::NEG_INFINITY, |m, &l| m.max(l));
        let mut lanes = [0.0f32; 8];
        for chunk in row.chunks_mut(8) {
            for (l, x) in lanes.iter_mut().zip(chunk) {
                *x = exp_nonpositive(*x - max);
                *l += *x;
            }
        }
        *inv = 1.0 / tree8(&lanes);
    }
    inv
}

/// The same operations in the same order as the portable body, its two
/// loops written with AVX-512 intrinsics: scores for 32 keys and outputs
/// for 32 dimensions at a time where the text and head allow (eight
/// independent sums in registers), pointers instead of checked slices.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{keys_stride, softmax_rows, HeadShape, BLOCK, QUERIES};
    use std::arch::x86_64::*;

    /// # Safety
    /// AVX-512F/BW/VL available; buffers as `check_shapes` requires;
    /// `head_dim` a multiple of 16.
    #[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl")]
    pub(super) unsafe fn full_attention_head(
        q: &[f32],
        kt: &[f32],
        v: &[f32],
        shape: HeadShape,
        scores: &mut [f32],
        out: &mut [f32],
    ) {
        let HeadShape {
            len,
            head_dim: d,
            scale,
            q_stride,
            v_stride,
            out_stride,
        } = shape;
        let keys = keys_stride(len);
        let mut i = 0;
        while i < len {
            let g = (len - i).min(QUERIES);
            let qs: [*const f32; QUERIES] =
                std::array::from_fn(|t| q[(i + t.min(g - 1)) * q_stride..].as_ptr());
            let sp = scores.as_mut_ptr();
            let mut jb = 0;
            // SAFETY (both loops): key blocks `jb..jb + 16 <= keys` of the
            // `d` rows of `kt`, the first `d` values of query rows below
            // `len`, score rows of `keys` values, value rows below `len`
            // and output rows of the group: all inside the checked buffers.
            unsafe {
                while jb + 2 * BLOCK <= keys {
                    score_block::<2>(&qs, kt.as_ptr().add(jb), keys, d, sp.add(jb), keys);
                    jb += 2 * BLOCK;
                }
                if jb < keys {
                    score_block::<1>(&qs, kt.as_ptr().add(jb), keys, d, sp.add(jb), keys);
                }
            }
            let (s0, rest) = scores.split_at_mut(keys);
            let (s1, rest) = rest.split_at_mut(keys);
            let (s2, rest) = rest.split_at_mut(keys);
            let mut s = [s0, s1, s2, &mut rest[..keys]];
            let inv = softmax_rows(&mut s, len, scale);
            let job = ValueJob {
                s: scores.as_ptr(),
                stride: keys,
                v_stride,
                len,
                inv,
                g,
                o_stride: out_stride,
            };
            let mut cb = 0;
            while cb < d {
                let wide = cb + 2 * BLOCK <= d;
                // SAFETY: dimensions `cb..cb + 16 or 32 <= d` of the value
                // rows below `len` and of the group's output rows.
                unsafe {
                    let v = v.as_ptr().add(cb);
                    let o = out.as_mut_ptr().add(i * out_stride + cb);
                    if wide {
                        weigh_values::<2>(&job, v, o);
                    } else {
                        weigh_values::<1>(&job, v, o);
                    }
                }
                cb += if wide { 2 * BLOCK } else { BLOCK };
            }
            i += g;
        }
    }

    /// Scores of the four queries against `16 B` keys: `kt` at the block's
    /// first key (rows `keys` apart), written to the score rows at `s`
    /// (`stride` apart). Each score `sum += q[c] * k[c]` over `c` in order.
    ///
    /// # Safety
    /// As [`full_attention_head`], for this block.
    #[inline]
    #[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl")]
    unsafe fn score_block<const B: usize>(
        qs: &[*const f32; QUERIES],
        kt: *const f32,
        keys: usize,
        d: usize,
        s: *mut f32,
        stride: usize,
    ) {
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); B]; QUERIES];
            for c in 0..d {
                let mut k = [_mm512_setzero_ps(); B];
                for (b, k) in k.iter_mut().enumerate() {
                    *k = _mm512_loadu_ps(kt.add(c * keys + b * BLOCK));
                }
                for (acc, &qt) in acc.iter_mut().zip(qs) {
                    let qc = _mm512_set1_ps(*qt.add(c));
                    for (a, &k) in acc.iter_mut().zip(&k) {
                        *a = _mm512_add_ps(*a, _mm512_mul_ps(qc, k));
                    }
                }
            }
            for (t, acc) in acc.iter().enumerate() {
                for (b, &a) in acc.iter().enumerate() {
                    _mm512_storeu_ps(s.add(t * stride + b * BLOCK), a);
                }
            }
        }
    }

    /// What [`weigh_values`] reads besides the values: the scores at `s`
    /// (rows `stride` apart, the first `len` used), each query's `inv`, how
    /// many queries the group has (`g`), and the output rows' stride.
    #[derive(Clone, Copy)]
    struct ValueJob {
        s: *const f32,
        stride: usize,
        v_stride: usize,
        len: usize,
        inv: [f32; QUERIES],
        g: usize,
        o_stride: usize,
    }

    /// Dimensions `16 B` of the group's outputs from `v` (at the first
    /// dimension, rows `v_stride` apart): `sum += p[j] * v[j]` over the keys
    /// in order, times the query's `inv`, written for the first `g` queries
    /// at `o` (rows `o_stride` apart).
    ///
    /// # Safety
    /// As [`full_attention_head`], for these dimensions.
    #[inline]
    #[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl")]
    unsafe fn weigh_values<const B: usize>(job: &ValueJob, v: *const f32, o: *mut f32) {
        let ValueJob {
            s,
            stride,
            v_stride,
            len,
            inv,
            g,
            o_stride,
        } = *job;
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); B]; QUERIES];
            for j in 0..len {
                let mut x = [_mm512_setzero_ps(); B];
                for (b, x) in x.iter_mut().enumerate() {
                    *x = _mm512_loadu_ps(v.add(j * v_stride + b * BLOCK));
                }
                for (t, acc) in acc.iter_mut().enumerate() {
                    let p = _mm512_set1_ps(*s.add(t * stride + j));
                    for (a, &x) in acc.iter_mut().zip(&x) {
                        *a = _mm512_add_ps(*a, _mm512_mul_ps(p, x));
                    }
                }
            }
            for (t, acc) in acc.iter().enumerate().take(g) {
                let inv = _mm512_set1_ps(inv[t]);
                for (b, &a) in acc.iter().enumerate() {
                    _mm512_storeu_ps(o.add(t * o_stride + b * BLOCK), _mm512_mul_ps(a, inv));
                }
            }
        }
    }
}

/// Queries computed together.
const QUERIES: usize = 4;
/// Keys (for scores) or dimensions (for outputs) summed in registers at once.
const BLOCK: usize = 16;

/// Scratch `scores` must hold this many values for a text of `len` rows.
pub fn scores_len(len: usize) -> usize {
    QUERIES * keys_stride(len)
}

/// The length of each row of `kt` (`head_dim` rows) for a text of `len`
/// rows: keys padded to a whole number of blocks (the padding's values are
/// never used).
pub fn keys_stride(len: usize) -> usize {
    len.next_multiple_of(BLOCK)
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
        for (len, d) in [(37, 32), (53, 24), (5, 64)] {
            check_shape(len, d);
        }
    }

    fn check_shape(len: usize, d: usize) {
        let q = data(len * d, 1);
        let k = data(len * d, 2);
        let v = data(len * d, 3);
        let keys = keys_stride(len);
        // The padding is never read: NaN there would show.
        let mut kt = vec![f32::NAN; keys * d];
        for j in 0..len {
            for c in 0..d {
                kt[c * keys + j] = k[j * d + c];
            }
        }
        let shape = HeadShape {
            len,
            head_dim: d,
            scale: 1.0 / (d as f32).sqrt(),
            q_stride: d,
            v_stride: d,
            out_stride: d,
        };
        let scale = shape.scale;
        let mut scores = vec![0.0; scores_len(len)];
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
