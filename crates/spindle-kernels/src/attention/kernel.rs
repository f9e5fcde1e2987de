//! The two inner loops of a chunk: scores of every (head, key), and the
//! weighted sum of the values, reading keys and values in their stored type
//! and widening them in registers.
//!
//! The operations per output are fixed, whatever the path:
//! - a score is `sum(q[e] * k[e])` with element `e` in lane `e % 8` (fused
//!   multiply-adds in element order), the eight lanes reduced by `tree8`
//!   (`simd.rs`, the reduction every float dot uses);
//! - a weighted value is `sum_j p[j] * v[j][e]`, fused multiply-adds in key
//!   order from the partial's current value (zero).
//!
//! The AVX2 path keeps the accumulators in registers: scores for two keys
//! and up to four heads at once (each key's eight values widened once for
//! all heads), values for a tile of 16 dimensions and up to four heads while
//! the keys stream by. Heads of more than four, or sizes that are not a
//! multiple of 8, take the scalar path, which gives the same bits.

use super::{HeadGroup, KvElem};
use crate::simd::{tree8, Isa};

/// Scores (without the scale) of every head against every key:
/// `out[h * n + j]`, for `n = keys.len()`. `values` (the same keys' value
/// rows) are only prefetched, so that [`values`] finds them in cache.
pub(super) fn scores<E: KvElem>(
    isa: Isa,
    group: &HeadGroup,
    q: &[f32],
    keys: &[&[E]],
    values: &[&[E]],
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if isa.uses_avx512() && fits_avx2(group) {
        // SAFETY: the AVX-512 paths are chosen only on CPUs with AVX2, FMA, F16C and
        // AVX-512F; the rows are checked inside.
        return unsafe { avx512::scores(group, q, keys, values, out) };
    }
    #[cfg(target_arch = "x86_64")]
    if isa.uses_avx2() && fits_avx2(group) {
        // SAFETY: Avx2 is chosen only on CPUs with AVX2, FMA and F16C; the
        // head's values lie in every row (checked by the slicing below).
        return unsafe { avx2::scores(group, q, keys, values, out) };
    }
    let _ = values;
    let _ = isa;
    let (d, off, n) = (group.head_dim, group.kv_offset, keys.len());
    for (j, key) in keys.iter().enumerate() {
        for h in 0..group.heads {
            let qh = &q[h * d..(h + 1) * d];
            let mut lanes = [0.0f32; 8];
            for (e, &qe) in qh.iter().enumerate() {
                lanes[e % 8] = qe.mul_add(E::value(key, off + e), lanes[e % 8]);
            }
            out[h * n + j] = tree8(&lanes);
        }
    }
}

/// Adds `sum_j p[h * n + j] * values[j]` into each head's weighted values
/// in `part` (`head_dim + 2` floats per head; the first `head_dim`).
pub(super) fn values<E: KvElem>(
    isa: Isa,
    group: &HeadGroup,
    p: &[f32],
    values: &[&[E]],
    part: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if isa.uses_avx512() && fits_avx2(group) {
        // SAFETY: as in `scores`.
        return unsafe { avx512::values(group, p, values, part) };
    }
    #[cfg(target_arch = "x86_64")]
    if isa.uses_avx2() && fits_avx2(group) {
        // SAFETY: as in `scores`.
        return unsafe { avx2::values(group, p, values, part) };
    }
    let _ = isa;
    let (d, off, n) = (group.head_dim, group.kv_offset, values.len());
    for h in 0..group.heads {
        let acc = &mut part[h * (d + 2)..h * (d + 2) + d];
        for (e, a) in acc.iter_mut().enumerate() {
            let mut x = *a;
            for (j, v) in values.iter().enumerate() {
                x = p[h * n + j].mul_add(E::value(v, off + e), x);
            }
            *a = x;
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn fits_avx2(group: &HeadGroup) -> bool {
    group.head_dim.is_multiple_of(8) && group.kv_offset.is_multiple_of(8)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{HeadGroup, KvElem};

    /// How many keys ahead the scores loop prefetches key rows.
    pub(super) const AHEAD: usize = 8;

    /// Asks for the cache lines of one head's values in a stored row.
    #[inline(always)]
    pub(super) fn prefetch_head<E: KvElem>(row: &[E], off: usize, d: usize) {
        let bytes = std::mem::size_of_val(row);
        let values = row.len() * E::VALUES;
        let (from, to) = (off * bytes / values, (off + d) * bytes / values);
        let base = row.as_ptr() as *const i8;
        let mut at = from & !63;
        while at < to {
            // SAFETY: a prefetch never faults; `at` is inside the row's bytes
            // or at most 63 bytes before its start (the start of its line).
            unsafe { _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(at)) };
            at += 64;
        }
    }

    /// The eight lanes reduced as [`crate::simd::tree8`] reduces them.
    #[inline(always)]
    pub(super) fn reduce(v: __m256) -> f32 {
        // SAFETY: the callers run with AVX2, FMA and F16C enabled.
        unsafe { crate::simd::avx2::tree8_ps(v) }
    }

    /// [`super::scores`]: heads in groups of up to four, keys in pairs.
    ///
    /// # Safety
    /// AVX2, FMA and F16C available; `head_dim` and `kv_offset` multiples of 8.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn scores<E: KvElem>(
        group: &HeadGroup,
        q: &[f32],
        keys: &[&[E]],
        values: &[&[E]],
        out: &mut [f32],
    ) {
        let mut h0 = 0;
        while h0 < group.heads {
            let hn = (group.heads - h0).min(4);
            // Only the first pass over the keys prefetches.
            let values = if h0 == 0 { values } else { &[] };
            // SAFETY: the caller's promises, passed on.
            unsafe {
                match hn {
                    4 => scores_heads::<E, 4>(group, h0, q, keys, values, out),
                    3 => scores_heads::<E, 3>(group, h0, q, keys, values, out),
                    2 => scores_heads::<E, 2>(group, h0, q, keys, values, out),
                    _ => scores_heads::<E, 1>(group, h0, q, keys, values, out),
                }
            }
            h0 += hn;
        }
    }

    /// Scores of heads `h0..h0+H` against every key.
    ///
    /// # Safety
    /// As [`scores`].
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scores_heads<E: KvElem, const H: usize>(
        group: &HeadGroup,
        h0: usize,
        q: &[f32],
        keys: &[&[E]],
        values: &[&[E]],
        out: &mut [f32],
    ) {
        let (d, off, n) = (group.head_dim, group.kv_offset, keys.len());
        assert!(q.len() >= (h0 + H) * d && out.len() >= group.heads * n);
        for key in keys {
            assert!(key.len() * E::VALUES >= off + d, "a key row too short");
        }
        let prefetch = |j: usize| {
            for i in j..j + 2 {
                if let Some(k) = keys.get(i + AHEAD) {
                    prefetch_head(k, off, d);
                }
                if let Some(v) = values.get(i) {
                    prefetch_head(v, off, d);
                }
            }
        };
        if !values.is_empty() {
            for k in keys.iter().take(AHEAD) {
                prefetch_head(k, off, d);
            }
        }
        let qp = q.as_ptr();
        let mut j = 0;
        while j + 2 <= n {
            if !values.is_empty() {
                prefetch(j);
            }
            let (ka, kb) = (keys[j], keys[j + 1]);
            let mut acc = [[_mm256_setzero_ps(); 2]; H];
            let mut e = 0;
            while e < d {
                // SAFETY: off + e + 8 <= off + d, inside both rows (checked
                // above); q holds heads h0..h0+H (checked above).
                unsafe {
                    let (xa, xb) = (E::load8(ka, off + e), E::load8(kb, off + e));
                    for (h, a) in acc.iter_mut().enumerate() {
                        let qv = _mm256_loadu_ps(qp.add((h0 + h) * d + e));
                        a[0] = _mm256_fmadd_ps(qv, xa, a[0]);
                        a[1] = _mm256_fmadd_ps(qv, xb, a[1]);
                    }
                }
                e += 8;
            }
            for (h, a) in acc.iter().enumerate() {
                out[(h0 + h) * n + j] = reduce(a[0]);
                out[(h0 + h) * n + j + 1] = reduce(a[1]);
            }
            j += 2;
        }
        if j < n {
            // SAFETY: as above.
            let last = unsafe { score_one::<E, H>(group, h0, q, keys[j]) };
            for (h, &x) in last.iter().enumerate() {
                out[(h0 + h) * n + j] = x;
            }
        }
    }

    /// Scores of heads `h0..h0+H` against one key (a pass's odd last key).
    ///
    /// # Safety
    /// AVX2, FMA and F16C available; `q` holds heads `h0..h0+H` and `key`
    /// covers `kv_offset + head_dim` values, a multiple of 8 each.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn score_one<E: KvElem, const H: usize>(
        group: &HeadGroup,
        h0: usize,
        q: &[f32],
        key: &[E],
    ) -> [f32; H] {
        let (d, off) = (group.head_dim, group.kv_offset);
        let qp = q.as_ptr();
        let mut acc = [_mm256_setzero_ps(); H];
        let mut e = 0;
        while e < d {
            // SAFETY: off + e + 8 <= off + d, inside the row; q holds heads
            // h0..h0+H (the caller's promises).
            unsafe {
                let x = E::load8(key, off + e);
                for (h, a) in acc.iter_mut().enumerate() {
                    let qv = _mm256_loadu_ps(qp.add((h0 + h) * d + e));
                    *a = _mm256_fmadd_ps(qv, x, *a);
                }
            }
            e += 8;
        }
        acc.map(reduce)
    }

    /// [`super::values`]: heads in groups of up to four, dimensions in
    /// tiles of 16 (and one of 8 where `head_dim` leaves it).
    ///
    /// # Safety
    /// As [`scores`].
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn values<E: KvElem>(
        group: &HeadGroup,
        p: &[f32],
        values: &[&[E]],
        part: &mut [f32],
    ) {
        let (d, off, n) = (group.head_dim, group.kv_offset, values.len());
        assert!(p.len() >= group.heads * n && part.len() >= group.heads * (d + 2));
        for v in values {
            assert!(v.len() * E::VALUES >= off + d, "a value row too short");
        }
        let mut h0 = 0;
        while h0 < group.heads {
            let hn = (group.heads - h0).min(4);
            let mut t = 0;
            while t < d {
                let wide = d - t >= 16;
                // SAFETY: the checks above, and t + 8 (or 16) <= d.
                unsafe {
                    match (hn, wide) {
                        (4, true) => values_tile::<E, 4, 2>(group, h0, t, p, values, part),
                        (3, true) => values_tile::<E, 3, 2>(group, h0, t, p, values, part),
                        (2, true) => values_tile::<E, 2, 2>(group, h0, t, p, values, part),
                        (_, true) => values_tile::<E, 1, 2>(group, h0, t, p, values, part),
                        (4, false) => values_tile::<E, 4, 1>(group, h0, t, p, values, part),
                        (3, false) => values_tile::<E, 3, 1>(group, h0, t, p, values, part),
                        (2, false) => values_tile::<E, 2, 1>(group, h0, t, p, values, part),
                        (_, false) => values_tile::<E, 1, 1>(group, h0, t, p, values, part),
                    }
                }
                t += if wide { 16 } else { 8 };
            }
            h0 += hn;
        }
    }

    /// Dimensions `t..t + 8W` of heads `h0..h0+H`, every key.
    ///
    /// # Safety
    /// As [`values`], with `t + 8W <= head_dim`.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn values_tile<E: KvElem, const H: usize, const W: usize>(
        group: &HeadGroup,
        h0: usize,
        t: usize,
        p: &[f32],
        values: &[&[E]],
        part: &mut [f32],
    ) {
        let (d, off, n) = (group.head_dim, group.kv_offset, values.len());
        let at = |h: usize| (h0 + h) * (d + 2) + t;
        let mut acc = [[_mm256_setzero_ps(); W]; H];
        for (h, a) in acc.iter_mut().enumerate() {
            for (w, x) in a.iter_mut().enumerate() {
                // SAFETY: at(h) + 8w + 8 <= (h0+h)*(d+2) + d, inside `part`.
                *x = unsafe { _mm256_loadu_ps(part.as_ptr().add(at(h) + 8 * w)) };
            }
        }
        let pp = p.as_ptr();
        for (j, v) in values.iter().enumerate() {
            let mut x = [_mm256_setzero_ps(); W];
            for (w, xv) in x.iter_mut().enumerate() {
                // SAFETY: off + t + 8w + 8 <= off + d, inside the row.
                *xv = unsafe { E::load8(v, off + t + 8 * w) };
            }
            for (h, a) in acc.iter_mut().enumerate() {
                // SAFETY: (h0 + h) * n + j < heads * n <= p.len().
                let pb = _mm256_set1_ps(unsafe { *pp.add((h0 + h) * n + j) });
                for (w, aw) in a.iter_mut().enumerate() {
                    *aw = _mm256_fmadd_ps(pb, x[w], *aw);
                }
            }
        }
        for (h, a) in acc.iter().enumerate() {
            for (w, x) in a.iter().enumerate() {
                // SAFETY: as for the loads.
                unsafe { _mm256_storeu_ps(part.as_mut_ptr().add(at(h) + 8 * w), *x) };
            }
        }
    }
}

/// AVX-512: the AVX2 loops with two 8-lane vectors in each register, so
/// every lane keeps its one sequence of fused multiply-adds. Scores put two
/// keys side by side (the same 8 query values in both halves); values put
/// 16 dimensions in one register.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::avx2::{prefetch_head, reduce, score_one, AHEAD};
    use super::{HeadGroup, KvElem};

    /// `lo` in lanes 0..8, `hi` in lanes 8..16.
    #[inline(always)]
    fn join(lo: __m256, hi: __m256) -> __m512 {
        // SAFETY: the callers run with AVX-512F enabled.
        unsafe {
            _mm512_castpd_ps(_mm512_insertf64x4::<1>(
                _mm512_castpd256_pd512(_mm256_castps_pd(lo)),
                _mm256_castps_pd(hi),
            ))
        }
    }

    /// Lanes 0..8 and 8..16.
    #[inline(always)]
    fn halves(v: __m512) -> (__m256, __m256) {
        // SAFETY: the callers run with AVX-512F enabled.
        unsafe {
            let d = _mm512_castps_pd(v);
            (
                _mm256_castpd_ps(_mm512_castpd512_pd256(d)),
                _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(d)),
            )
        }
    }

    /// [`super::scores`], keys in pairs, heads in groups of up to four.
    ///
    /// # Safety
    /// AVX2, FMA, F16C and AVX-512F available; `head_dim` and `kv_offset`
    /// multiples of 8.
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    pub(super) unsafe fn scores<E: KvElem>(
        group: &HeadGroup,
        q: &[f32],
        keys: &[&[E]],
        values: &[&[E]],
        out: &mut [f32],
    ) {
        let mut h0 = 0;
        while h0 < group.heads {
            let hn = (group.heads - h0).min(4);
            let values = if h0 == 0 { values } else { &[] };
            // SAFETY: the caller's promises, passed on.
            unsafe {
                match hn {
                    4 => scores_heads::<E, 4>(group, h0, q, keys, values, out),
                    3 => scores_heads::<E, 3>(group, h0, q, keys, values, out),
                    2 => scores_heads::<E, 2>(group, h0, q, keys, values, out),
                    _ => scores_heads::<E, 1>(group, h0, q, keys, values, out),
                }
            }
            h0 += hn;
        }
    }

    /// Scores of heads `h0..h0+H` against every key.
    ///
    /// # Safety
    /// As [`scores`].
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    unsafe fn scores_heads<E: KvElem, const H: usize>(
        group: &HeadGroup,
        h0: usize,
        q: &[f32],
        keys: &[&[E]],
        values: &[&[E]],
        out: &mut [f32],
    ) {
        let (d, off, n) = (group.head_dim, group.kv_offset, keys.len());
        assert!(q.len() >= (h0 + H) * d && out.len() >= group.heads * n);
        for key in keys {
            assert!(key.len() * E::VALUES >= off + d, "a key row too short");
        }
        if !values.is_empty() {
            for k in keys.iter().take(AHEAD) {
                prefetch_head(k, off, d);
            }
        }
        let qp = q.as_ptr();
        let mut j = 0;
        while j + 2 <= n {
            if !values.is_empty() {
                for i in j..j + 2 {
                    if let Some(k) = keys.get(i + AHEAD) {
                        prefetch_head(k, off, d);
                    }
                    if let Some(v) = values.get(i) {
                        prefetch_head(v, off, d);
                    }
                }
            }
            let (ka, kb) = (keys[j], keys[j + 1]);
            let mut acc = [_mm512_setzero_ps(); H];
            let mut e = 0;
            while e < d {
                // SAFETY: off + e + 8 <= off + d, inside both rows (checked
                // above); q holds heads h0..h0+H (checked above).
                unsafe {
                    let x = join(E::load8(ka, off + e), E::load8(kb, off + e));
                    for (h, a) in acc.iter_mut().enumerate() {
                        let qv = _mm256_loadu_ps(qp.add((h0 + h) * d + e));
                        *a = _mm512_fmadd_ps(join(qv, qv), x, *a);
                    }
                }
                e += 8;
            }
            for (h, a) in acc.iter().enumerate() {
                let (lo, hi) = halves(*a);
                out[(h0 + h) * n + j] = reduce(lo);
                out[(h0 + h) * n + j + 1] = reduce(hi);
            }
            j += 2;
        }
        if j < n {
            // SAFETY: as above.
            let last = unsafe { score_one::<E, H>(group, h0, q, keys[j]) };
            for (h, &x) in last.iter().enumerate() {
                out[(h0 + h) * n + j] = x;
            }
        }
    }

    /// [`super::values`]: heads in groups of up to four, dimensions in
    /// tiles of 32 and 16 (and one of 8, on the AVX2 loop, where `head_dim`
    /// leaves it).
    ///
    /// # Safety
    /// As [`scores`].
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    pub(super) unsafe fn values<E: KvElem>(
        group: &HeadGroup,
        p: &[f32],
        values: &[&[E]],
        part: &mut [f32],
    ) {
        let (d, off, n) = (group.head_dim, group.kv_offset, values.len());
        assert!(p.len() >= group.heads * n && part.len() >= group.heads * (d + 2));
        for v in values {
            assert!(v.len() * E::VALUES >= off + d, "a value row too short");
        }
        if d % 16 != 0 {
            // SAFETY: the caller's promises, which the AVX2 loop needs.
            return unsafe { super::avx2::values(group, p, values, part) };
        }
        let mut h0 = 0;
        while h0 < group.heads {
            let hn = (group.heads - h0).min(4);
            let mut t = 0;
            while t < d {
                let wide = d - t >= 32;
                // SAFETY: the checks above, and t + 16 (or 32) <= d.
                unsafe {
                    match (hn, wide) {
                        (4, true) => values_tile::<E, 4, 2>(group, h0, t, p, values, part),
                        (3, true) => values_tile::<E, 3, 2>(group, h0, t, p, values, part),
                        (2, true) => values_tile::<E, 2, 2>(group, h0, t, p, values, part),
                        (_, true) => values_tile::<E, 1, 2>(group, h0, t, p, values, part),
                        (4, false) => values_tile::<E, 4, 1>(group, h0, t, p, values, part),
                        (3, false) => values_tile::<E, 3, 1>(group, h0, t, p, values, part),
                        (2, false) => values_tile::<E, 2, 1>(group, h0, t, p, values, part),
                        (_, false) => values_tile::<E, 1, 1>(group, h0, t, p, values, part),
                    }
                }
                t += if wide { 32 } else { 16 };
            }
            h0 += hn;
        }
    }

    /// Dimensions `t..t + 16W` of heads `h0..h0+H`, every key.
    ///
    /// # Safety
    /// As [`values`], with `t + 16W <= head_dim`.
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    unsafe fn values_tile<E: KvElem, const H: usize, const W: usize>(
        group: &HeadGroup,
        h0: usize,
        t: usize,
        p: &[f32],
        values: &[&[E]],
        part: &mut [f32],
    ) {
        let (d, off, n) = (group.head_dim, group.kv_offset, values.len());
        let at = |h: usize| (h0 + h) * (d + 2) + t;
        let mut acc = [[_mm512_setzero_ps(); W]; H];
        for (h, a) in acc.iter_mut().enumerate() {
            for (w, x) in a.iter_mut().enumerate() {
                // SAFETY: at(h) + 16w + 16 <= (h0+h)*(d+2) + d, inside `part`.
                *x = unsafe { _mm512_loadu_ps(part.as_ptr().add(at(h) + 16 * w)) };
            }
        }
        let pp = p.as_ptr();
        for (j, v) in values.iter().enumerate() {
            let mut x = [_mm512_setzero_ps(); W];
            for (w, xv) in x.iter_mut().enumerate() {
                let e = off + t + 16 * w;
                // SAFETY: e + 16 <= off + d, inside the row.
                *xv = unsafe { join(E::load8(v, e), E::load8(v, e + 8)) };
            }
            for (h, a) in acc.iter_mut().enumerate() {
                // SAFETY: (h0 + h) * n + j < heads * n <= p.len().
                let pb = _mm512_set1_ps(unsafe { *pp.add((h0 + h) * n + j) });
                for (w, aw) in a.iter_mut().enumerate() {
                    *aw = _mm512_fmadd_ps(pb, x[w], *aw);
                }
            }
        }
        for (h, a) in acc.iter().enumerate() {
            for (w, x) in a.iter().enumerate() {
                // SAFETY: as for the loads.
                unsafe { _mm512_storeu_ps(part.as_mut_ptr().add(at(h) + 16 * w), *x) };
            }
        }
    }
}
