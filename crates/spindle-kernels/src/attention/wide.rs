//! Many rows that see the keys of one chunk (a prompt's rows), computed
//! together as two small matrix products: every key and value is widened
//! once for all the rows and heads, and each register of keys or values is
//! used by six query vectors at once.
//!
//! The arithmetic per output is exactly `kernel.rs`'s, so a row gives the
//! same bits here as alone:
//! - a score's lane `l` is the chain of fused multiply-adds over elements
//!   `l, l + 8, l + 16, ...` from zero, and the eight lanes are added as
//!   [`crate::simd::tree8`] adds them. Here the keys lie in the lanes (a
//!   block of keys transposed so that one register holds element `e` of 16
//!   keys, or 8 on AVX2); the eight chains run one after another and are
//!   then added in tree8's order;
//! - a weighted value is the chain of fused multiply-adds over the keys a
//!   row sees, in key order, from the partial's current value. A key a row
//!   does not see is skipped, not weighted by zero, so a value that is not
//!   finite there cannot reach it.
//!
//! AVX-512 and AVX2; the scalar path takes `kernel.rs`'s loops row by row.

use std::ops::Range;

use super::{HeadGroup, KvElem};
use crate::simd::{compiled_per_isa, tree8, Isa};

/// Fewest rows that share a chunk for the transposition to pay.
pub(super) const MIN_ROWS: usize = 4;

/// Keys widened (and transposed) at a time.
const KEYS: usize = 64;
/// Query vectors per register tile.
const QN: usize = 6;

/// Whether this path runs for `group` on `isa`.
pub(super) fn fits(isa: Isa, group: &HeadGroup) -> bool {
    cfg!(target_arch = "x86_64")
        && isa.uses_avx2()
        && group.head_dim.is_multiple_of(64)
        && group.kv_offset.is_multiple_of(8)
}

/// Buffers reused between calls: a block of keys transposed, a block of
/// values widened, and the eight chains of a tile of scores.
#[derive(Default)]
pub(super) struct WideScratch {
    keys_t: Vec<f32>,
    values: Vec<f32>,
    /// `chains[(l * QN + qi) * KEYS + j]`: lane `l`'s chain of query `qi`
    /// against key `j` of the block.
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
    assert!(fits(isa, group), "the wide attention path needs AVX2");
    let (d, off, n) = (group.head_dim, group.kv_offset, keys.len());
    assert!(out.len() >= queries.len() * n);
    assert!(queries.iter().all(|q| q.len() >= d));
    assert!(keys.iter().all(|k| k.len() * E::VALUES >= off + d));
    scratch.keys_t.resize(KEYS * d, 0.0);
    scratch.chains.resize(8 * QN * KEYS, 0.0);
    let mut j0 = 0;
    while j0 < n {
        // SAFETY: `fits` holds, so the CPU has AVX2, FMA and F16C (and
        // AVX-512F/BW/VL for the AVX-512 paths); the shapes are checked above and
        // the scratch sized for them.
        unsafe { kernels::transpose_keys(isa, group, keys, j0, &mut scratch.keys_t) };
        let m = (n - j0).min(KEYS);
        let mut q0 = 0;
        while q0 < queries.len() {
            let qs = &queries[q0..(q0 + QN).min(queries.len())];
            // SAFETY: as above.
            unsafe { kernels::score_tile(isa, d, qs, &scratch.keys_t, &mut scratch.chains) };
            for qi in 0..qs.len() {
                let chain = |l: usize| &scratch.chains[(l * QN + qi) * KEYS..][..m];
                let row = (q0 + qi) * n + j0;
                combine_chains(isa, std::array::from_fn(chain), &mut out[row..row + m]);
            }
            q0 += QN;
        }
        j0 += KEYS;
    }
}

compiled_per_isa! {
    /// `out[j]` = the eight chains of key `j` added in [`tree8`]'s order
    /// (plain adds: the same bits on every path).
    fn combine_chains(chains: [&[f32]; 8], out: &mut [f32]) = combine_body;
}

#[inline(always)]
fn combine_body(c: [&[f32]; 8], out: &mut [f32]) {
    for (j, o) in out.iter_mut().enumerate() {
        *o = tree8(&std::array::from_fn(|l| c[l][j]));
    }
}

/// Adds `sum_{j in seen[qi]} p[qi * n + j] * values[j]` into each query's
/// weighted values `acc[qi]` (`head_dim` floats), keys in order.
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
    assert!(fits(isa, group), "the wide attention path needs AVX2");
    let (d, off, n) = (group.head_dim, group.kv_offset, values.len());
    assert!(p.len() >= acc.len() * n && seen.len() == acc.len());
    assert!(seen.iter().all(|r| r.start <= r.end && r.end <= n));
    assert!(acc.iter().all(|a| a.len() >= d));
    assert!(values.iter().all(|v| v.len() * E::VALUES >= off + d));
    scratch.values.resize(KEYS * d, 0.0);
    let mut j0 = 0;
    while j0 < n {
        let m = (n - j0).min(KEYS);
        // SAFETY: as in `scores`.
        unsafe { kernels::widen_values(group, &values[j0..j0 + m], &mut scratch.values) };
        let mut q0 = 0;
        while q0 < acc.len() {
            let q1 = (q0 + QN).min(acc.len());
            // Runs of keys that the same queries of the tile see: the
            // block's ends and every query's, inside the block.
            let mut cuts = [j0 + m; 2 * QN + 2];
            cuts[0] = j0;
            let ends = seen[q0..q1].iter().flat_map(|r| [r.start, r.end]);
            for (slot, c) in cuts[2..].iter_mut().zip(ends) {
                *slot = c.clamp(j0, j0 + m);
            }
            cuts.sort_unstable();
            for run in cuts.windows(2).filter(|w| w[0] < w[1]) {
                let (a, b) = (run[0], run[1]);
                let sees: [bool; QN] = std::array::from_fn(|i| {
                    seen.get(q0 + i)
                        .is_some_and(|r| q0 + i < q1 && r.start <= a && b <= r.end)
                });
                if !sees.contains(&true) {
                    continue;
                }
                let run = kernels::ValueRun {
                    vw: &scratch.values[(a - j0) * d..(b - j0) * d],
                    d,
                    p,
                    first: (q0, a, n),
                    sees,
                };
                // SAFETY: as in `scores`; `run` lies inside `p` and the
                // widened block.
                unsafe { kernels::value_tiles(isa, &run, &mut acc[q0..q1]) };
            }
            q0 = q1;
        }
        j0 += KEYS;
    }
}

#[cfg(target_arch = "x86_64")]
mod kernels {
    use std::arch::x86_64::*;

    use super::{HeadGroup, KvElem, Query, KEYS, QN};
    use crate::simd::Isa;

    /// A run of keys that each query of a tile sees all of or none of.
    pub(super) struct ValueRun<'a> {
        /// The run's widened values, `d` floats per key.
        pub vw: &'a [f32],
        pub d: usize,
        /// Weights, `p[qi * n + j]`.
        pub p: &'a [f32],
        /// The tile's first query, the run's first key, and `n`.
        pub first: (usize, usize, usize),
        pub sees: [bool; QN],
    }

    /// Values `0..KEYS` of a block of value rows, widened into `dst`
    /// (`d` floats per key).
    ///
    /// # Safety
    /// AVX2 and F16C available; every row holds `kv_offset + head_dim`
    /// values, a multiple of 8 each; `rows.len() <= KEYS`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn widen_values<E: KvElem>(
        group: &HeadGroup,
        rows: &[&[E]],
        dst: &mut [f32],
    ) {
        let (d, off) = (group.head_dim, group.kv_offset);
        assert!(dst.len() >= rows.len() * d);
        for (j, v) in rows.iter().enumerate() {
            let mut e = 0;
            while e < d {
                // SAFETY: off + e + 8 <= off + d inside the row; j * d + e + 8
                // <= dst.len().
                unsafe {
                    let x = E::load8(v, off + e);
                    _mm256_storeu_ps(dst.as_mut_ptr().add(j * d + e), x);
                }
                e += 8;
            }
        }
    }

    /// Keys `j0..j0 + KEYS` (zeros past the end) transposed into `dst`, in
    /// the ISA's layout for [`score_tile`].
    ///
    /// # Safety
    /// The ISA's features available; every key holds `kv_offset +
    /// head_dim` values, multiples of 8 (64 for head_dim); `dst` holds
    /// `KEYS * head_dim` floats.
    pub(super) unsafe fn transpose_keys<E: KvElem>(
        isa: Isa,
        group: &HeadGroup,
        keys: &[&[E]],
        j0: usize,
        dst: &mut [f32],
    ) {
        assert!(dst.len() >= KEYS * group.head_dim);
        // SAFETY: the caller's promises.
        unsafe {
            if isa.uses_avx512() {
                avx512::transpose_keys(group, keys, j0, dst)
            } else {
                avx2::transpose_keys(group, keys, j0, dst)
            }
        }
    }

    /// The eight chains of up to [`QN`] queries against a block of
    /// transposed keys, into `chains[(l * QN + qi) * KEYS + j]`.
    ///
    /// # Safety
    /// The ISA's features available; `keys_t` from [`transpose_keys`] for
    /// the same `d`; `chains` holds `8 * QN * KEYS` floats; every query `d`.
    pub(super) unsafe fn score_tile(
        isa: Isa,
        d: usize,
        qs: &[Query<'_>],
        keys_t: &[f32],
        chains: &mut [f32],
    ) {
        assert!(chains.len() >= 8 * QN * KEYS && keys_t.len() >= KEYS * d);
        assert!(qs.len() <= QN && qs.iter().all(|q| q.len() >= d));
        macro_rules! tile {
            ($m:ident) => {
                match qs.len() {
                    6 => $m::score_tile::<6>(d, qs, keys_t, chains),
                    5 => $m::score_tile::<5>(d, qs, keys_t, chains),
                    4 => $m::score_tile::<4>(d, qs, keys_t, chains),
                    3 => $m::score_tile::<3>(d, qs, keys_t, chains),
                    2 => $m::score_tile::<2>(d, qs, keys_t, chains),
                    _ => $m::score_tile::<1>(d, qs, keys_t, chains),
                }
            };
        }
        // SAFETY: the caller's promises and the checks above.
        unsafe {
            if isa.uses_avx512() {
                tile!(avx512)
            } else {
                tile!(avx2)
            }
        }
    }

    /// Adds one run's weighted values into the tile's accumulators, every
    /// dimension.
    ///
    /// # Safety
    /// The ISA's features available; `run.vw` holds whole keys, `run.p`
    /// the weights of `first.0 + acc.len()` queries over `first.2` keys,
    /// the run's keys among them; every `acc` holds `d` floats, `d` a
    /// multiple of 64.
    pub(super) unsafe fn value_tiles(isa: Isa, run: &ValueRun<'_>, acc: &mut [&mut [f32]]) {
        let (q0, a, n) = run.first;
        let keys = run.vw.len() / run.d;
        assert!(acc.len() <= QN && run.p.len() >= (q0 + acc.len()) * n && a + keys <= n);
        assert!(run.d.is_multiple_of(64) && acc.iter().all(|x| x.len() >= run.d));
        macro_rules! tiles {
            ($m:ident, $width:expr) => {{
                let mut t = 0;
                while t < run.d {
                    match acc.len() {
                        6 => $m::value_tile::<6>(run, t, acc),
                        5 => $m::value_tile::<5>(run, t, acc),
                        4 => $m::value_tile::<4>(run, t, acc),
                        3 => $m::value_tile::<3>(run, t, acc),
                        2 => $m::value_tile::<2>(run, t, acc),
                        _ => $m::value_tile::<1>(run, t, acc),
                    }
                    t += $width;
                }
            }};
        }
        // SAFETY: the caller's promises and the checks above.
        unsafe {
            if isa.uses_avx512() {
                tiles!(avx512, avx512::DIMS)
            } else {
                tiles!(avx2, avx2::DIMS)
            }
        }
    }

    /// AVX-512: registers of 16 keys or 16 dimensions, 6 queries x 4.
    mod avx512 {
        use std::arch::x86_64::*;

        use super::super::{HeadGroup, KvElem, Query, KEYS, QN};
        use super::ValueRun;

        /// Registers of 16 keys (or 16 dimensions) per register tile.
        const KV: usize = KEYS / 16;
        /// Dimensions per value tile.
        pub(super) const DIMS: usize = 16 * KV;

        /// Values `i..i + 16` of a stored row, widened.
        ///
        /// # Safety
        /// AVX-512F, AVX2 and F16C available; `i + 16` values within `row`,
        /// `i` a multiple of 8.
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
                // u[4g + c]: rows 4g..4g+4 of columns c, c+4, c+8, c+12,
                // one column per 128-bit lane.
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

        /// `dst[(e * KV + b) * 16 + i]` = element `e` of key `j0 + 16b + i`
        /// (one step of the scores loop reads one run of 256 bytes: keys
        /// far apart in memory would share cache sets).
        ///
        /// # Safety
        /// As [`super::transpose_keys`], with AVX-512F.
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
        pub(super) unsafe fn transpose_keys<E: KvElem>(
            group: &HeadGroup,
            keys: &[&[E]],
            j0: usize,
            dst: &mut [f32],
        ) {
            let (d, off) = (group.head_dim, group.kv_offset);
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
                        let at = ((e + c) * KV + b) * 16;
                        // SAFETY: at + 16 <= KEYS * d <= dst.len().
                        unsafe { _mm512_storeu_ps(dst.as_mut_ptr().add(at), *rc) };
                    }
                    e += 16;
                }
            }
        }

        /// # Safety
        /// As [`super::score_tile`], with AVX-512F; `qs.len() == Q`.
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
        pub(super) unsafe fn score_tile<const Q: usize>(
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
                    // SAFETY: (e * KV + b) * 16 + 16 <= KEYS * d; e < d for
                    // every query.
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
                        let at = (l * QN + qi) * KEYS + 16 * b;
                        // SAFETY: at + 16 <= 8 * QN * KEYS.
                        unsafe { _mm512_storeu_ps(chains.as_mut_ptr().add(at), *ab) };
                    }
                }
            }
        }

        /// Dimensions `t..t + DIMS` of the tile's queries over one run.
        ///
        /// # Safety
        /// As [`super::value_tiles`], with AVX-512F; `acc.len() == Q`,
        /// `t + DIMS <= d`.
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
        pub(super) unsafe fn value_tile<const Q: usize>(
            run: &ValueRun<'_>,
            t: usize,
            acc: &mut [&mut [f32]],
        ) {
            let ((q0, a0, n), d) = (run.first, run.d);
            let masks: [u16; Q] = std::array::from_fn(|qi| if run.sees[qi] { !0 } else { 0 });
            let mut a = [[_mm512_setzero_ps(); KV]; Q];
            for (qi, aq) in a.iter_mut().enumerate() {
                for (w, x) in aq.iter_mut().enumerate() {
                    // SAFETY: t + 16w + 16 <= d <= acc[qi].len().
                    *x = unsafe { _mm512_loadu_ps(acc[qi].as_ptr().add(t + 16 * w)) };
                }
            }
            let (vp, pp) = (run.vw.as_ptr(), run.p.as_ptr());
            for j in 0..run.vw.len() / d {
                // SAFETY: j * d + t + DIMS <= vw.len(); (q0 + qi) * n + a0 + j
                // < p.len() (the caller's promises).
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

    /// AVX2: registers of 8 keys or 8 dimensions, 6 queries x 2 (16
    /// registers in all).
    mod avx2 {
        use std::arch::x86_64::*;

        use super::super::{HeadGroup, KvElem, Query, KEYS, QN};
        use super::ValueRun;

        /// Registers of 8 keys in a block.
        const REGS: usize = KEYS / 8;
        /// Registers of keys (or dimensions) per register tile.
        const KV: usize = 2;
        /// Dimensions per value tile.
        pub(super) const DIMS: usize = 8 * KV;

        /// Transposes 8 registers of 8 lanes: `r[i]` lane `j` moves to
        /// `r[j]` lane `i`.
        #[inline(always)]
        fn transpose8(r: &mut [__m256; 8]) {
            // SAFETY: the callers run with AVX2 enabled.
            unsafe {
                let mut t = [_mm256_setzero_ps(); 8];
                for i in 0..4 {
                    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
                    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
                }
                // u[4g + c]: rows 4g..4g+4 of columns c and c+4.
                let mut u = [_mm256_setzero_ps(); 8];
                for g in 0..2 {
                    let (a, b, c, e) = (t[4 * g], t[4 * g + 2], t[4 * g + 1], t[4 * g + 3]);
                    u[4 * g] = _mm256_shuffle_ps::<0x44>(a, b);
                    u[4 * g + 1] = _mm256_shuffle_ps::<0xEE>(a, b);
                    u[4 * g + 2] = _mm256_shuffle_ps::<0x44>(c, e);
                    u[4 * g + 3] = _mm256_shuffle_ps::<0xEE>(c, e);
                }
                for c in 0..4 {
                    r[c] = _mm256_permute2f128_ps::<0x20>(u[c], u[4 + c]);
                    r[c + 4] = _mm256_permute2f128_ps::<0x31>(u[c], u[4 + c]);
                }
            }
        }

        /// `dst[(e * REGS + b) * 8 + i]` = element `e` of key `j0 + 8b + i`.
        ///
        /// # Safety
        /// As [`super::transpose_keys`], with AVX2, FMA and F16C.
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(super) unsafe fn transpose_keys<E: KvElem>(
            group: &HeadGroup,
            keys: &[&[E]],
            j0: usize,
            dst: &mut [f32],
        ) {
            let (d, off) = (group.head_dim, group.kv_offset);
            for b in 0..REGS {
                let mut e = 0;
                while e < d {
                    let mut r = [_mm256_setzero_ps(); 8];
                    for (i, ri) in r.iter_mut().enumerate() {
                        if let Some(k) = keys.get(j0 + 8 * b + i) {
                            // SAFETY: off + e + 8 <= off + d, inside the row.
                            *ri = unsafe { E::load8(k, off + e) };
                        }
                    }
                    transpose8(&mut r);
                    for (c, rc) in r.iter().enumerate() {
                        let at = ((e + c) * REGS + b) * 8;
                        // SAFETY: at + 8 <= KEYS * d <= dst.len().
                        unsafe { _mm256_storeu_ps(dst.as_mut_ptr().add(at), *rc) };
                    }
                    e += 8;
                }
            }
        }

        /// # Safety
        /// As [`super::score_tile`], with AVX2, FMA and F16C; `qs.len() == Q`.
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(super) unsafe fn score_tile<const Q: usize>(
            d: usize,
            qs: &[Query<'_>],
            keys_t: &[f32],
            chains: &mut [f32],
        ) {
            let kt = keys_t.as_ptr();
            let qp: [*const f32; Q] = std::array::from_fn(|i| qs[i].as_ptr());
            for b0 in (0..REGS).step_by(KV) {
                for l in 0..8 {
                    let mut acc = [[_mm256_setzero_ps(); KV]; Q];
                    let mut e = l;
                    while e < d {
                        // SAFETY: (e * REGS + b0 + b) * 8 + 8 <= KEYS * d; e < d
                        // for every query.
                        unsafe {
                            let k: [__m256; KV] = std::array::from_fn(|b| {
                                _mm256_loadu_ps(kt.add((e * REGS + b0 + b) * 8))
                            });
                            for (a, q) in acc.iter_mut().zip(qp) {
                                let x = _mm256_set1_ps(*q.add(e));
                                for (ab, kb) in a.iter_mut().zip(k) {
                                    *ab = _mm256_fmadd_ps(x, kb, *ab);
                                }
                            }
                        }
                        e += 8;
                    }
                    for (qi, a) in acc.iter().enumerate() {
                        for (b, ab) in a.iter().enumerate() {
                            let at = (l * QN + qi) * KEYS + 8 * (b0 + b);
                            // SAFETY: at + 8 <= 8 * QN * KEYS.
                            unsafe { _mm256_storeu_ps(chains.as_mut_ptr().add(at), *ab) };
                        }
                    }
                }
            }
        }

        /// Dimensions `t..t + DIMS` of the tile's queries over one run; a
        /// query that does not see the run is left alone.
        ///
        /// # Safety
        /// As [`super::value_tiles`], with AVX2 and FMA; `acc.len() == Q`,
        /// `t + DIMS <= d`.
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(super) unsafe fn value_tile<const Q: usize>(
            run: &ValueRun<'_>,
            t: usize,
            acc: &mut [&mut [f32]],
        ) {
            let ((q0, a0, n), d) = (run.first, run.d);
            let mut a = [[_mm256_setzero_ps(); KV]; Q];
            for (qi, aq) in a.iter_mut().enumerate() {
                for (w, x) in aq.iter_mut().enumerate() {
                    // SAFETY: t + 8w + 8 <= d <= acc[qi].len().
                    *x = unsafe { _mm256_loadu_ps(acc[qi].as_ptr().add(t + 8 * w)) };
                }
            }
            let (vp, pp) = (run.vw.as_ptr(), run.p.as_ptr());
            for j in 0..run.vw.len() / d {
                // SAFETY: j * d + t + DIMS <= vw.len(); (q0 + qi) * n + a0 + j
                // < p.len() (the caller's promises).
                unsafe {
                    let v: [__m256; KV] =
                        std::array::from_fn(|w| _mm256_loadu_ps(vp.add(j * d + t + 8 * w)));
                    for (qi, aq) in a.iter_mut().enumerate() {
                        if !run.sees[qi] {
                            continue;
                        }
                        let x = _mm256_set1_ps(*pp.add((q0 + qi) * n + a0 + j));
                        for (aw, vw) in aq.iter_mut().zip(v) {
                            *aw = _mm256_fmadd_ps(x, vw, *aw);
                        }
                    }
                }
            }
            for (qi, aq) in a.iter().enumerate() {
                for (w, x) in aq.iter().enumerate() {
                    // SAFETY: as for the loads.
                    unsafe { _mm256_storeu_ps(acc[qi].as_mut_ptr().add(t + 8 * w), *x) };
                }
            }
        }
    }
}

/// Non-x86 targets never take this path (`fits` is false there).
#[cfg(not(target_arch = "x86_64"))]
mod kernels {
    use super::{HeadGroup, KvElem, Query, QN};
    use crate::simd::Isa;

    pub(super) struct ValueRun<'a> {
        pub vw: &'a [f32],
        pub d: usize,
        pub p: &'a [f32],
        pub first: (usize, usize, usize),
        pub sees: [bool; QN],
    }

    pub(super) unsafe fn widen_values<E: KvElem>(_: &HeadGroup, _: &[&[E]], _: &mut [f32]) {
        unreachable!("the wide attention path runs on x86-64 only")
    }
    pub(super) unsafe fn transpose_keys<E: KvElem>(
        _: Isa,
        _: &HeadGroup,
        _: &[&[E]],
        _: usize,
        _: &mut [f32],
    ) {
        unreachable!("the wide attention path runs on x86-64 only")
    }
    pub(super) unsafe fn score_tile(_: Isa, _: usize, _: &[Query<'_>], _: &[f32], _: &mut [f32]) {
        unreachable!("the wide attention path runs on x86-64 only")
    }
    pub(super) unsafe fn value_tiles(_: Isa, _: &ValueRun<'_>, _: &mut [&mut [f32]]) {
        unreachable!("the wide attention path runs on x86-64 only")
    }
}
