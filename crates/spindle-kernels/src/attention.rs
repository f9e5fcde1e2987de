//! Attention of one query head over the keys a row may see.
//!
//! A row sees a window of its sequence's committed KV plus a list of rows of
//! the current pass (its ancestors and itself). Keys are visited in position
//! order, one at a time, so a row's result depends only on the keys it sees:
//! the same whether it runs alone, in a batch or inside a token tree.

use half::f16;

use crate::simd::Isa;

/// An element type the KV cache can hold.
pub trait KvElem: Copy + Send + Sync + 'static {
    fn from_f32(v: f32) -> Self;
    /// Widens a slice to f32 (exact for both types; SIMD where the CPU has it).
    fn load(src: &[Self], dst: &mut [f32]);
}

impl KvElem for f32 {
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v
    }
    #[inline(always)]
    fn load(src: &[Self], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
}

impl KvElem for f16 {
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
    #[inline(always)]
    fn load(src: &[Self], dst: &mut [f32]) {
        use half::slice::HalfFloatSliceExt;
        src.convert_to_f32_slice(dst);
    }
}

/// Keys and values laid out as rows of `stride` elements.
#[derive(Clone, Copy)]
pub struct KvRows<'a, E> {
    pub k: &'a [E],
    pub v: &'a [E],
    pub stride: usize,
}

/// The query heads of one row that share a KV head (GQA/MQA group).
pub struct GroupQuery<'a> {
    /// `heads * head_dim` values, rotated.
    pub q: &'a [f32],
    pub head_dim: usize,
    /// Offset of the shared KV head inside a KV row.
    pub kv_offset: usize,
    /// Score multiplier (`1/sqrt(d)` or the model's own).
    pub scale: f32,
    /// Gemma 2's attention soft-cap.
    pub softcap: Option<f32>,
}

/// Attends every head of `query` over `committed` rows `ctx_range`, then the
/// pass rows `tail_rows` (in position order). Each key and value row is read
/// once and used by every head of the group. K/V arrive as f32 (widened once
/// per pass from the cache's storage type with [`KvElem::load`]). Writes
/// `heads * head_dim` values into `out`; `scratch` is reused between calls.
///
/// Per head, the operations are the same whatever the group size, the ISA or
/// where the keys come from: scores in key order, a two-pass softmax, values
/// accumulated in key order with fused multiply-adds.
#[allow(clippy::too_many_arguments)]
pub fn attend_group(
    isa: Isa,
    query: &GroupQuery<'_>,
    committed: KvRows<'_, f32>,
    ctx_range: std::ops::Range<usize>,
    tail: KvRows<'_, f32>,
    tail_rows: &[usize],
    scratch: &mut Vec<f32>,
    out: &mut [f32],
) {
    let d = query.head_dim;
    let heads = query.q.len() / d;
    let nk = ctx_range.len() + tail_rows.len();
    let off = query.kv_offset;
    let rows = |values: bool| {
        let (c, t) = if values {
            (committed.v, tail.v)
        } else {
            (committed.k, tail.k)
        };
        ctx_range
            .clone()
            .map(move |r| head_of(c, r * committed.stride + off, d))
            .chain(
                tail_rows
                    .iter()
                    .map(move |&r| head_of(t, r * tail.stride + off, d)),
            )
    };
    scratch.clear();
    scratch.resize(heads * nk, 0.0);
    for (j, row) in rows(false).enumerate() {
        for h in 0..heads {
            let mut s = dot(isa, &query.q[h * d..(h + 1) * d], row) * query.scale;
            if let Some(cap) = query.softcap {
                s = (s / cap).tanh() * cap;
            }
            scratch[h * nk + j] = s;
        }
    }
    for h in 0..heads {
        let sc = &mut scratch[h * nk..(h + 1) * nk];
        let max = sc.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0.0f32;
        for s in sc.iter_mut() {
            *s = (*s - max).exp();
            sum += *s;
        }
        let inv = 1.0 / sum;
        sc.iter_mut().for_each(|s| *s *= inv);
    }
    let values: Vec<&[f32]> = rows(true).collect();
    for h in 0..heads {
        weighted_sum(
            isa,
            &scratch[h * nk..(h + 1) * nk],
            &values,
            &mut out[h * d..(h + 1) * d],
        );
    }
}

/// `out[e] = sum_j w[j] * values[j][e]`, accumulated from 0 in key order with
/// fused multiply-adds (the same per element as repeated [`axpy`]).
pub fn weighted_sum(isa: Isa, w: &[f32], values: &[&[f32]], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 && out.len().is_multiple_of(32) {
        // SAFETY: the caller chose Avx2 only when the CPU has AVX2 and FMA.
        return unsafe { avx2::weighted_sum(w, values, out) };
    }
    out.fill(0.0);
    for (&wj, v) in w.iter().zip(values) {
        axpy(isa, wj, v, out);
    }
}

#[inline(always)]
fn head_of<E>(rows: &[E], at: usize, d: usize) -> &[E] {
    &rows[at..at + d]
}

/// `sum(q[i] * k[i])`: element `i` into lane `i % 32` with a fused
/// multiply-add, lanes reduced by a fixed tree ([`tree32`]). The same on every
/// ISA. Four independent 8-lane chains keep both FMA units busy.
#[inline]
pub fn dot(isa: Isa, q: &[f32], k: &[f32]) -> f32 {
    debug_assert_eq!(q.len(), k.len());
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 {
        // SAFETY: the caller chose Avx2 only when the CPU has AVX2 and FMA.
        return unsafe { avx2::dot(q, k) };
    }
    let _ = isa;
    let mut acc = [0.0f32; 32];
    for (i, (&a, &b)) in q.iter().zip(k).enumerate() {
        acc[i % 32] = a.mul_add(b, acc[i % 32]);
    }
    tree32(&acc)
}

/// Lanes `l`, `l+8`, `l+16`, `l+24` pairwise, then [`tree8`].
#[inline(always)]
fn tree32(a: &[f32; 32]) -> f32 {
    let mut v = [0.0f32; 8];
    for (l, x) in v.iter_mut().enumerate() {
        *x = (a[l] + a[l + 16]) + (a[l + 8] + a[l + 24]);
    }
    tree8(&v)
}

/// `out[i] = w * v[i] + out[i]`, fused, on every ISA.
#[inline]
pub fn axpy(isa: Isa, w: f32, v: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 {
        // SAFETY: as in `dot`.
        return unsafe { avx2::axpy(w, v, out) };
    }
    let _ = isa;
    for (o, &x) in out.iter_mut().zip(v) {
        *o = w.mul_add(x, *o);
    }
}

#[inline(always)]
fn tree8(a: &[f32; 8]) -> f32 {
    ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]))
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// [`super::dot`] in AVX2: the same lanes, fused multiply-adds and tree.
    ///
    /// # Safety
    /// AVX2 and FMA available.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dot(q: &[f32], k: &[f32]) -> f32 {
        let n = q.len().min(k.len());
        let full = n / 32 * 32;
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i < full {
            for (j, a) in acc.iter_mut().enumerate() {
                // SAFETY: i + 32 <= full <= len of both slices.
                let (x, y) = unsafe {
                    (
                        _mm256_loadu_ps(q.as_ptr().add(i + 8 * j)),
                        _mm256_loadu_ps(k.as_ptr().add(i + 8 * j)),
                    )
                };
                *a = _mm256_fmadd_ps(x, y, *a);
            }
            i += 32;
        }
        let mut lanes = [0.0f32; 32];
        for (j, a) in acc.iter().enumerate() {
            // SAFETY: lanes holds 32 floats.
            unsafe { _mm256_storeu_ps(lanes.as_mut_ptr().add(8 * j), *a) };
        }
        for j in full..n {
            lanes[j % 32] = q[j].mul_add(k[j], lanes[j % 32]);
        }
        super::tree32(&lanes)
    }

    /// [`super::weighted_sum`] in AVX2. Output chunks of 32 stay in
    /// registers while every key streams by.
    ///
    /// # Safety
    /// AVX2 and FMA available; `out.len()` a multiple of 32 (the stores into
    /// `out` are unchecked; each value row is sliced, so a short one panics).
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn weighted_sum(w: &[f32], values: &[&[f32]], out: &mut [f32]) {
        let d = out.len();
        for c in (0..d).step_by(32) {
            let mut acc = [_mm256_setzero_ps(); 4];
            for (&wj, v) in w.iter().zip(values) {
                let wv = _mm256_set1_ps(wj);
                let v = &v[c..c + 32];
                for (t, a) in acc.iter_mut().enumerate() {
                    // SAFETY: v holds 32 floats.
                    *a = _mm256_fmadd_ps(wv, unsafe { _mm256_loadu_ps(v.as_ptr().add(8 * t)) }, *a);
                }
            }
            for (t, a) in acc.iter().enumerate() {
                // SAFETY: c + 32 <= d.
                unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(c + 8 * t), *a) };
            }
        }
    }

    /// [`super::axpy`] in AVX2.
    ///
    /// # Safety
    /// AVX2 and FMA available.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn axpy(w: f32, v: &[f32], out: &mut [f32]) {
        let n = v.len().min(out.len());
        let full = n / 8 * 8;
        let wv = _mm256_set1_ps(w);
        let mut i = 0;
        while i < full {
            // SAFETY: i + 8 <= full <= len of both slices.
            unsafe {
                let o = out.as_mut_ptr().add(i);
                _mm256_storeu_ps(
                    o,
                    _mm256_fmadd_ps(wv, _mm256_loadu_ps(v.as_ptr().add(i)), _mm256_loadu_ps(o)),
                );
            }
            i += 8;
        }
        for j in full..n {
            out[j] = w.mul_add(v[j], out[j]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(q: &[f32], keys: &[Vec<f32>], vals: &[Vec<f32>], scale: f32) -> Vec<f64> {
        let s: Vec<f64> = keys
            .iter()
            .map(|k| {
                q.iter()
                    .zip(k)
                    .map(|(a, b)| (*a as f64) * (*b as f64))
                    .sum::<f64>()
                    * scale as f64
            })
            .collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
        let z: f64 = e.iter().sum();
        let mut out = vec![0.0f64; q.len()];
        for (w, v) in e.iter().zip(vals) {
            for (o, x) in out.iter_mut().zip(v) {
                *o += w / z * *x as f64;
            }
        }
        out
    }

    #[test]
    fn matches_reference_and_is_invariant_to_split_group_and_isa() {
        let (d, heads, n) = (12, 3, 7);
        let stride = 2 * d; // two KV heads; the group uses the second
        let mut seed = 1u32;
        let mut rnd = || {
            seed = seed.wrapping_mul(1664525).wrapping_add(1013904223);
            (seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        };
        let k: Vec<f32> = (0..n * stride).map(|_| rnd()).collect();
        let v: Vec<f32> = (0..n * stride).map(|_| rnd()).collect();
        let q: Vec<f32> = (0..heads * d).map(|_| rnd() * 4.0).collect();
        let all = KvRows {
            k: &k,
            v: &v,
            stride,
        };
        let run = |isa: Isa, q: &[f32], ctx: std::ops::Range<usize>, tail: &[usize]| {
            let gq = GroupQuery {
                q,
                head_dim: d,
                kv_offset: d,
                scale: 0.3,
                softcap: None,
            };
            let mut out = vec![0.0; q.len()];
            attend_group(isa, &gq, all, ctx, all, tail, &mut Vec::new(), &mut out);
            out
        };
        for isa in crate::simd::available_isas() {
            let a = run(isa, &q, 0..n, &[]);
            assert_eq!(
                a,
                run(isa, &q, 0..4, &[4, 5, 6]),
                "{isa}: committed/pass split changed bits"
            );
            assert_eq!(
                a,
                run(Isa::Scalar, &q, 0..n, &[]),
                "{isa} differs from scalar"
            );
            for h in 0..heads {
                let alone = run(isa, &q[h * d..(h + 1) * d], 0..n, &[]);
                assert_eq!(
                    alone,
                    a[h * d..(h + 1) * d],
                    "{isa}: head {h} depends on its group"
                );
                let keys: Vec<Vec<f32>> = (0..n)
                    .map(|r| k[r * stride + d..r * stride + 2 * d].to_vec())
                    .collect();
                let vals: Vec<Vec<f32>> = (0..n)
                    .map(|r| v[r * stride + d..r * stride + 2 * d].to_vec())
                    .collect();
                let want = reference(&q[h * d..(h + 1) * d], &keys, &vals, 0.3);
                for i in 0..d {
                    assert!(
                        (a[h * d + i] as f64 - want[i]).abs() < 1e-5,
                        "{isa} head {h} value {i}"
                    );
                }
            }
        }
    }
}
