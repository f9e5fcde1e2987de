//! Many rows that see the same keys of a chunk (a prompt's rows away from
//! the diagonal), computed together as two small matrix products: every key
//! and value is widened once for all the rows and heads, and each register
//! of keys or values is used by six query vectors at once.
//!
//! The arithmetic per output is exactly `kernel.rs`'s, so a row gives the
//! same bits here as alone:
//! - a score's lane `l` is the chain of fused multiply-adds over elements
//!   `l, l + 8, l + 16, ...` from zero, and the eight lanes are added as
//!   [`crate::simd::tree8`] adds them. Here the keys lie in the lanes (a
//!   16-key block transposed so that one register holds element `e` of 16
//!   keys); the eight chains run one after another and are added with
//!   vertical adds in tree8's order;
//! - a weighted value is the chain of fused multiply-adds over keys in key
//!   order, from the partial's current value.
//!
//! AVX-512 only: elsewhere the rows take `kernel.rs`'s loops one by one.

use std::ops::Range;

use super::{HeadGroup, KvElem};
use crate::simd::Isa;

/// Fewest rows that share a chunk for the transposition to pay.
pub(super) const MIN_ROWS: usize = 4;

/// Keys widened (and transposed) at a time: 4 registers of 16.
const KEYS: usize = 64;

/// Whether this path runs for `group` on `isa`.
pub(super) fn fits(isa: Isa, group: &HeadGroup) -> bool {
    isa == Isa::Avx512Vnni && group.head_dim.is_multiple_of(64) && group.kv_offset.is_multiple_of(8)
}

/// Buffers reused between calls: a block of keys transposed, a block of
/// values widened, and the eight chains of a tile of scores.
#[derive(Default)]
pub(super) struct WideScratch {
    keys_t: Vec<f32>,
    values: Vec<f32>,
    chains: Vec<f32>,
}

/// One query vector: a row's head, `head_dim` values.
pub(super) type Query<'a> = &'a [f32];

/// Scores (without the scale) of each query against every key:
/// `out[qi * n + j]` for `n = keys.len()`.
///
/// # Panics
/// If [`fits`] does not hold, or a slice is shorter than the shapes say.
pub(super) fn scores<E: KvElem>(
    isa: Isa,
    group: &HeadGroup,
    queries: &[Query<'_>],
    keys: &[&[E]],
    scratch: &mut WideScratch,
    out: &mut [f32],
) {
    assert!(fits(isa, group), "the wide attention path needs AVX-512");
    let (d, off, n) = (group.head_dim, group.kv_offset, keys.len());
    assert!(out.len() >= queries.len() * n);
    assert!(queries.iter().all(|q| q.len() >= d));
    assert!(keys.iter().all(|k| k.len() * E::VALUES >= off + d));
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `fits` holds, so the CPU has AVX-512F/BW/VL, AVX2, FMA and
    // F16C; the shapes are checked above.
    unsafe {
        avx512::scores(group, queries, keys, scratch, out)
    }
}

/// Adds `sum_{j in seen[qi]} p[qi * n + j] * values[j]` into each query's
/// weighted values `acc[qi]` (`head_dim` floats). A key outside a query's
/// range is skipped, not weighted by zero (a value that is not finite
/// there must not reach it).
///
/// # Panics
/// If [`fits`] does not hold, or a slice is shorter than the shapes say.
pub(super) fn values<E: KvElem>(
    isa: Isa,
    group: &HeadGroup,
    p: &[f32],
    seen: &[Range<usize>],
    values: &[&[E]],
    scratch: &mut WideScratch,
    acc: &mut [&mut [f32]],
) {
    assert!(fits(isa, group), "the wide attention path needs AVX-512");
    let (d, off, n) = (group.head_dim, group.kv_offset, values.len());
    assert!(p.len() >= acc.len() * n && seen.len() == acc.len());
    assert!(seen.iter().all(|r| r.start <= r.end && r.end <= n));
    assert!(acc.iter().all(|a| a.len() >= d));
    assert!(values.iter().all(|v| v.len() * E::VALUES >= off + d));
    #[cfg(target_arch = "x86_64")]
    // SAFETY: as in `scores`.
    unsafe {
        avx512::values(group, p, seen, values, scratch, acc)
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use std::ops::Range;

    use super::{HeadGroup, KvElem, Query, WideScratch, KEYS};

    /// Query vectors per register tile.
    const QN: usize = 6;
    /// Registers of 16 keys (or 16 dimensions) per register tile.
    const KV: usize = KEYS / 16;

    /// Values `i..i + 16` of a stored row, widened.
    ///
    /// # Safety
    /// AVX-512F, AVX2 and F16C available; `i + 16` values within `row`, `i`
    /// a multiple of 8.
    #[inline(always)]
    unsafe fn load16<E: KvElem>(row: &[E], i: usize) -> __m512 {
        // SAFETY: the caller's promises.
        unsafe {
            let (lo, hi) = (E::load8(row, i), E::load8(row, i + 8));
            _mm512_castpd_ps(_mm512_insertf64x4::<1>(
                _mm512_castpd256_pd512(_mm256_castps_pd(lo)),
                _mm256_castps_pd(hi),
            ))
        }
    }

    /// Transposes 16 registers of 16 lanes: `r[i]` lane `j` moves to
    /// `r[j]` lane `i`.
    #[inline(always)]
    fn transpose16(r: &mut [__m512; 16]) {
        // SAFETY: the callers run with AVX-512F enabled.
        unsafe {
            // Pairs of rows interleaved within 128-bit lanes.
            let mut t = [_mm512_setzero_ps(); 16];
            for i in 0..8 {
                t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
                t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
            }
            // u[4g + c]: rows 4g..4g+4 of columns c, c+4, c+8, c+12, one
            // column per 128-bit lane.
            let mut u = [_mm512_setzero_ps(); 16];
            for g in 0..4 {
                let pd = |x: __m512| _mm512_castps_pd(x);
                let (a, b, c, e) = (t[4 * g], t[4 * g + 2], t[4 * g + 1], t[4 * g + 3]);
                u[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(a), pd(b)));
                u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(a), pd(b)));
                u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(c), pd(e)));
                u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(c), pd(e)));
            }
            // Gather the four row groups' 128-bit lanes of each column.
            for c in 0..4 {
                let v0 = _mm512_shuffle_f32x4::<0x44>(u[c], u[4 + c]);
                let v1 = _mm512_shuffle_f32x4::<0xEE>(u[c], u[4 + c]);
                let w0 = _mm512_shuffle_f32x4::<0x44>(u[8 + c], u[12 + c]);
                let w1 = _mm512_shuffle_f32x4::<0xEE>(u[8 + c], u[12 + c]);
                r[c] = _mm512_shuffle_f32x4::<0x88>(v0, w0);
                r[c + 4] = _mm512_shuffle_f32x4::<0xDD>(v0, w0);
                r[c + 8] = _mm512_shuffle_f32x4::<0x88>(v1, w1);
                r[c + 12] = _mm512_shuffle_f32x4::<0xDD>(v1, w1);
            }
        }
    }

    /// Keys `j0..j0 + KEYS` (zeros past the end) transposed into
    /// `dst[(e * KV + b) * 16 + i]` = element `e` of key `j0 + 16b + i`
    /// (so one step of the scores loop reads one run of 256 bytes: keys
    /// far apart in memory would share cache sets).
    ///
    /// # Safety
    /// As [`super::scores`]'s checks, with AVX-512F, AVX2 and F16C.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
    unsafe fn transpose_keys<E: KvElem>(
        group: &HeadGroup,
        keys: &[&[E]],
        j0: usize,
        dst: &mut [f32],
    ) {
        let (d, off) = (group.head_dim, group.kv_offset);
        assert!(dst.len() >= KEYS * d);
        for b in 0..KV {
            let mut e = 0;
            while e < d {
                let mut r = [_mm512_setzero_ps(); 16];
                for (i, ri) in r.iter_mut().enumerate() {
                    if let Some(k) = keys.get(j0 + 16 * b + i) {
                        // SAFETY: off + e + 16 <= off + d, inside the row.
                        *ri = unsafe { load16(k, off + e) };
                    }
                }
                transpose16(&mut r);
                for (c, rc) in r.iter().enumerate() {
                    // SAFETY: ((e + c) * KV + b) * 16 + 16 <= KEYS * d.
                    unsafe { _mm512_storeu_ps(dst.as_mut_ptr().add(((e + c) * KV + b) * 16), *rc) };
                }
                e += 16;
            }
        }
    }

    /// # Safety
    /// As [`super::scores`]'s checks, with AVX-512F, AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
    pub(super) unsafe fn scores<E: KvElem>(
        group: &HeadGroup,
        queries: &[Query<'_>],
        keys: &[&[E]],
        scratch: &mut WideScratch,
        out: &mut [f32],
    ) {
        let (d, n) = (group.head_dim, keys.len());
        scratch.keys_t.resize(KEYS * d, 0.0);
        scratch.chains.resize(8 * QN * KEYS, 0.0);
        let mut j0 = 0;
        while j0 < n {
            // SAFETY: the caller's promises.
            unsafe { transpose_keys(group, keys, j0, &mut scratch.keys_t) };
            let mut q0 = 0;
            while q0 < queries.len() {
                let qs = &queries[q0..(q0 + QN).min(queries.len())];
                // SAFETY: as above; `keys_t` and `chains` sized above.
                unsafe {
                    match qs.len() {
                        6 => score_tile::<6>(d, qs, &scratch.keys_t, &mut scratch.chains),
                        5 => score_tile::<5>(d, qs, &scratch.keys_t, &mut scratch.chains),
                        4 => score_tile::<4>(d, qs, &scratch.keys_t, &mut scratch.chains),
                        3 => score_tile::<3>(d, qs, &scratch.keys_t, &mut scratch.chains),
                        2 => score_tile::<2>(d, qs, &scratch.keys_t, &mut scratch.chains),
                        _ => score_tile::<1>(d, qs, &scratch.keys_t, &mut scratch.chains),
                    }
                }
                // tree8's order over the chains: ((0+4)+(2+6))+((1+5)+(3+7)).
                let at = |l: usize, qi: usize, b: usize| ((l * QN + qi) * KV + b) * 16;
                let ch = scratch.chains.as_ptr();
                for qi in 0..qs.len() {
                    for b in 0..KV {
                        let first = j0 + 16 * b;
                        if first >= n {
                            break;
                        }
                        // SAFETY: every index is inside `chains` (8 * QN * KEYS).
                        let s = unsafe {
                            let c = |l: usize| _mm512_loadu_ps(ch.add(at(l, qi, b)));
                            let h0 = _mm512_add_ps(c(0), c(4));
                            let h1 = _mm512_add_ps(c(1), c(5));
                            let h2 = _mm512_add_ps(c(2), c(6));
                            let h3 = _mm512_add_ps(c(3), c(7));
                            _mm512_add_ps(_mm512_add_ps(h0, h2), _mm512_add_ps(h1, h3))
                        };
                        let mut lanes = [0.0f32; 16];
                        // SAFETY: 16 floats into a 16-float array.
                        unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), s) };
                        let m = (n - first).min(16);
                        let row = (q0 + qi) * n + first;
                        out[row..row + m].copy_from_slice(&lanes[..m]);
                    }
                }
                q0 += QN;
            }
            j0 += KEYS;
        }
    }

    /// The eight chains of `Q` queries against a block of transposed keys:
    /// `chains[((l * QN + qi) * KV + b) * 16 + i]`.
    ///
    /// # Safety
    /// AVX-512F and FMA available; `keys_t` holds `KEYS * d` floats,
    /// `chains` `8 * QN * KEYS`, every query `d`; `d` a multiple of 8.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
    unsafe fn score_tile<const Q: usize>(
        d: usize,
        qs: &[Query<'_>],
        keys_t: &[f32],
        chains: &mut [f32],
    ) {
        let kt = keys_t.as_ptr();
        let qp: [*const f32; Q] = std::array::from_fn(|i| qs[i].as_ptr());
        for l in 0..8 {
            let mut acc = [[_mm512_setzero_ps(); KV]; Q];
            let mut e = l;
            while e < d {
                // SAFETY: (e * KV + b) * 16 + 16 <= KEYS * d; e < d for every
                // query (the caller's promises).
                unsafe {
                    let k: [__m512; KV] =
                        std::array::from_fn(|b| _mm512_loadu_ps(kt.add((e * KV + b) * 16)));
                    for (a, q) in acc.iter_mut().zip(qp) {
                        let x = _mm512_set1_ps(*q.add(e));
                        for (ab, kb) in a.iter_mut().zip(k) {
                            *ab = _mm512_fmadd_ps(x, kb, *ab);
                        }
                    }
                }
                e += 8;
            }
            for (qi, a) in acc.iter().enumerate() {
                for (b, ab) in a.iter().enumerate() {
                    let at = ((l * QN + qi) * KV + b) * 16;
                    // SAFETY: at + 16 <= 8 * QN * KEYS.
                    unsafe { _mm512_storeu_ps(chains.as_mut_ptr().add(at), *ab) };
                }
            }
        }
    }

    /// # Safety
    /// As [`super::values`]'s checks, with AVX-512F, AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
    pub(super) unsafe fn values<E: KvElem>(
        group: &HeadGroup,
        p: &[f32],
        seen: &[Range<usize>],
        values: &[&[E]],
        scratch: &mut WideScratch,
        acc: &mut [&mut [f32]],
    ) {
        let (d, off, n) = (group.head_dim, group.kv_offset, values.len());
        scratch.values.resize(KEYS * d, 0.0);
        let mut j0 = 0;
        while j0 < n {
            let m = (n - j0).min(KEYS);
            for (j, v) in values[j0..j0 + m].iter().enumerate() {
                let mut e = 0;
                while e < d {
                    // SAFETY: off + e + 16 <= off + d inside the row;
                    // j * d + e + 16 <= KEYS * d.
                    unsafe {
                        let x = load16(v, off + e);
                        _mm512_storeu_ps(scratch.values.as_mut_ptr().add(j * d + e), x);
                    }
                    e += 16;
                }
            }
            let mut q0 = 0;
            while q0 < acc.len() {
                let q1 = (q0 + QN).min(acc.len());
                // Runs of keys that the same queries of the tile see: the
                // block's ends and every query's, inside the block.
                let mut cuts = vec![j0, j0 + m];
                for r in &seen[q0..q1] {
                    cuts.extend(
                        [r.start, r.end]
                            .into_iter()
                            .filter(|&c| c > j0 && c < j0 + m),
                    );
                }
                cuts.sort_unstable();
                cuts.dedup();
                for run in cuts.windows(2) {
                    let (a, b) = (run[0], run[1]);
                    let sees = |r: &Range<usize>| r.start <= a && b <= r.end;
                    if !seen[q0..q1].iter().any(sees) {
                        continue;
                    }
                    let masks: [u16; QN] = std::array::from_fn(|i| {
                        seen.get(q0 + i)
                            .filter(|r| q0 + i < q1 && sees(r))
                            .map_or(0, |_| !0)
                    });
                    let vw = &scratch.values[(a - j0) * d..(b - j0) * d];
                    let mut t = 0;
                    while t < d {
                        let tile = &mut acc[q0..q1];
                        let at = (q0, a, n);
                        // SAFETY: t + 64 <= d; p holds acc.len() * n weights.
                        unsafe {
                            match tile.len() {
                                6 => value_tile::<6>(d, t, vw, p, at, &masks, tile),
                                5 => value_tile::<5>(d, t, vw, p, at, &masks, tile),
                                4 => value_tile::<4>(d, t, vw, p, at, &masks, tile),
                                3 => value_tile::<3>(d, t, vw, p, at, &masks, tile),
                                2 => value_tile::<2>(d, t, vw, p, at, &masks, tile),
                                _ => value_tile::<1>(d, t, vw, p, at, &masks, tile),
                            }
                        }
                        t += 16 * KV;
                    }
                }
                q0 = q1;
            }
            j0 += KEYS;
        }
    }

    /// Dimensions `t..t + 64` of `Q` queries' weighted values over a run of
    /// widened values (`vw`, `d` floats per key, from key `a`), weights from
    /// `p[(q0 + qi) * n + a + j]`; query `qi` adds only where `masks[qi]`
    /// is set (all lanes or none).
    ///
    /// # Safety
    /// AVX-512F and FMA available; `t + 64 <= d`; every `acc` holds `d`
    /// floats; `p` holds `(q0 + Q) * n` floats; `a + vw.len() / d <= n`.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
    unsafe fn value_tile<const Q: usize>(
        d: usize,
        t: usize,
        vw: &[f32],
        p: &[f32],
        (q0, a0, n): (usize, usize, usize),
        masks: &[u16; QN],
        acc: &mut [&mut [f32]],
    ) {
        let mut a = [[_mm512_setzero_ps(); KV]; Q];
        for (qi, aq) in a.iter_mut().enumerate() {
            for (w, x) in aq.iter_mut().enumerate() {
                // SAFETY: t + 16w + 16 <= d <= acc[qi].len().
                *x = unsafe { _mm512_loadu_ps(acc[qi].as_ptr().add(t + 16 * w)) };
            }
        }
        let (vp, pp) = (vw.as_ptr(), p.as_ptr());
        for j in 0..vw.len() / d {
            // SAFETY: j * d + t + 64 <= vw.len(); (q0 + qi) * n + a0 + j < p.len().
            unsafe {
                let v: [__m512; KV] =
                    std::array::from_fn(|w| _mm512_loadu_ps(vp.add(j * d + t + 16 * w)));
                for (qi, aq) in a.iter_mut().enumerate() {
                    let x = _mm512_set1_ps(*pp.add((q0 + qi) * n + a0 + j));
                    for (aw, vw) in aq.iter_mut().zip(v) {
                        // Unset lanes keep the accumulator: no arithmetic.
                        *aw = _mm512_mask3_fmadd_ps(x, vw, *aw, masks[qi]);
                    }
                }
            }
        }
        for (qi, aq) in a.iter().enumerate() {
            for (w, x) in aq.iter().enumerate() {
                // SAFETY: as for the loads.
                unsafe { _mm512_storeu_ps(acc[qi].as_mut_ptr().add(t + 16 * w), *x) };
            }
        }
    }
}
