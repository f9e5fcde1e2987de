//! The AVX2 multi-row micro-kernel and the packing of weights and
//! activations it reads (the VNNI kernel in `vnni.rs` reuses the weight
//! packing).

use super::{act_chunk_rows, ActGroup, Fold, MultiRow, QuantJob, WGroup};
use super::{MR, NR};
use crate::quant::q8_act::{ActRow, QuantizedActs};
use crate::simd::avx2::*;
use std::arch::x86_64::*;
use std::ptr::addr_of;

/// Stores 8 vectors `v[j]` (32 values of block `j`) vertically at `dst`:
/// 32 bytes per step `k`, whose 32-bit lane `j` is bytes `4k..4k+4` of
/// `v[j]` (an 8x8 transpose of 32-bit words).
///
/// # Safety
/// AVX2, FMA and F16C available; `dst..dst + 256` writable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn store_vertical(v: &[__m256i; 8], dst: *mut u8) {
    unsafe {
        let t0 = _mm256_unpacklo_epi32(v[0], v[1]);
        let t1 = _mm256_unpackhi_epi32(v[0], v[1]);
        let t2 = _mm256_unpacklo_epi32(v[2], v[3]);
        let t3 = _mm256_unpackhi_epi32(v[2], v[3]);
        let t4 = _mm256_unpacklo_epi32(v[4], v[5]);
        let t5 = _mm256_unpackhi_epi32(v[4], v[5]);
        let t6 = _mm256_unpacklo_epi32(v[6], v[7]);
        let t7 = _mm256_unpackhi_epi32(v[6], v[7]);
        // u_k: word k of blocks 0..4 (low half), word k + 4 (high half).
        let u0 = _mm256_unpacklo_epi64(t0, t2);
        let u1 = _mm256_unpackhi_epi64(t0, t2);
        let u2 = _mm256_unpacklo_epi64(t1, t3);
        let u3 = _mm256_unpackhi_epi64(t1, t3);
        let u4 = _mm256_unpacklo_epi64(t4, t6);
        let u5 = _mm256_unpackhi_epi64(t4, t6);
        let u6 = _mm256_unpacklo_epi64(t5, t7);
        let u7 = _mm256_unpackhi_epi64(t5, t7);
        let steps = [
            _mm256_permute2x128_si256(u0, u4, 0x20),
            _mm256_permute2x128_si256(u1, u5, 0x20),
            _mm256_permute2x128_si256(u2, u6, 0x20),
            _mm256_permute2x128_si256(u3, u7, 0x20),
            _mm256_permute2x128_si256(u0, u4, 0x31),
            _mm256_permute2x128_si256(u1, u5, 0x31),
            _mm256_permute2x128_si256(u2, u6, 0x31),
            _mm256_permute2x128_si256(u3, u7, 0x31),
        ];
        for (k, s) in steps.iter().enumerate() {
            _mm256_storeu_si256(dst.add(32 * k).cast(), *s);
        }
    }
}

/// [`tree8_ps`] of 8 vectors at once, with the same additions in the same
/// order: lanes `[t0, t2, t4, t6, t1, t3, t5, t7]`, `t_j = tree8(v[j])`.
///
/// # Safety
/// AVX2, FMA and F16C available.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn tree8_x8(v: &[__m256; 8]) -> __m256 {
    // h = l[0..4] + l[4..8] of v[2k] (low half) and v[2k + 1] (high).
    let mut h = [_mm256_setzero_ps(); 4];
    for (k, h) in h.iter_mut().enumerate() {
        let (a, b) = (v[2 * k], v[2 * k + 1]);
        *h = _mm256_add_ps(
            _mm256_permute2f128_ps(a, b, 0x20),
            _mm256_permute2f128_ps(a, b, 0x31),
        );
    }
    // q = [h0 + h2, h1 + h3] of each: [q0, q2 | q1, q3] of v[4m..4m + 4].
    let q01 = _mm256_add_ps(
        _mm256_shuffle_ps(h[0], h[1], 0x44),
        _mm256_shuffle_ps(h[0], h[1], 0xEE),
    );
    let q23 = _mm256_add_ps(
        _mm256_shuffle_ps(h[2], h[3], 0x44),
        _mm256_shuffle_ps(h[2], h[3], 0xEE),
    );
    // q0 + q1.
    _mm256_add_ps(
        _mm256_shuffle_ps(q01, q23, 0x88),
        _mm256_shuffle_ps(q01, q23, 0xDD),
    )
}

/// Stores the first 4 vectors `v[j]` (32 values of block `j`) in the half
/// layout at `dst`: 32 bytes per step `k` (0..4), whose 64-bit lane `j` is
/// bytes `8k..8k+8` of `v[j]`.
///
/// # Safety
/// AVX2, FMA and F16C available; `dst..dst + 128` writable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn store_half(v: &[__m256i; 8], dst: *mut u8) {
    unsafe {
        let t0 = _mm256_unpacklo_epi64(v[0], v[1]);
        let t1 = _mm256_unpackhi_epi64(v[0], v[1]);
        let t2 = _mm256_unpacklo_epi64(v[2], v[3]);
        let t3 = _mm256_unpackhi_epi64(v[2], v[3]);
        let steps = [
            _mm256_permute2x128_si256(t0, t2, 0x20),
            _mm256_permute2x128_si256(t1, t3, 0x20),
            _mm256_permute2x128_si256(t0, t2, 0x31),
            _mm256_permute2x128_si256(t1, t3, 0x31),
        ];
        for (k, s) in steps.iter().enumerate() {
            _mm256_storeu_si256(dst.add(32 * k).cast(), *s);
        }
    }
}

/// Stores a group's 8 block vectors: vertically, or in the half layout
/// when only the first `m <= 4` blocks are valid (the last group of a
/// row).
///
/// # Safety
/// AVX2, FMA and F16C available; `dst..dst + 256` writable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn store_group(v: &[__m256i; 8], m: usize, dst: *mut u8) {
    unsafe {
        if m <= 4 {
            store_half(v, dst)
        } else {
            store_vertical(v, dst)
        }
    }
}

/// Packs every activation row of `acts` (blocks of 32) into `out`:
/// `ceil(nb / 8)` groups per row, row after row.
///
/// # Safety
/// AVX2, FMA and F16C available.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn pack_acts<T: MultiRow>(acts: &QuantizedActs, out: &mut Vec<ActGroup>) {
    unsafe { pack_acts_offset::<T>(acts, out, T::OFFSET) }
}

/// [`pack_acts`] with the weights' values taken as `u - offset`: `corr`
/// is `offset * bsum`.
///
/// # Safety
/// AVX2, FMA and F16C available.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn pack_acts_offset<T: MultiRow>(
    acts: &QuantizedActs,
    out: &mut Vec<ActGroup>,
    offset: i32,
) {
    unsafe {
        let nb = acts.cols() / 32;
        let ng = nb.div_ceil(8);
        out.resize(acts.n() * ng, ActGroup::ZERO);
        for (i, groups) in out.chunks_exact_mut(ng.max(1)).enumerate() {
            let Some(a) = acts.row(i) else { return };
            for (g, ag) in groups.iter_mut().enumerate() {
                pack_act_group(a, g, offset, ag);
                if matches!(T::FOLD, Fold::Q2) {
                    ag.corr = low_half_sums(a, g);
                }
            }
        }
    }
}

/// Packs group `g` of activation row `a` into `ag`, as [`pack_acts_offset`].
///
/// # Safety
/// AVX2, FMA and F16C available; `8 * g` is below `a`'s block count.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn pack_act_group(a: ActRow<'_>, g: usize, offset: i32, ag: &mut ActGroup) {
    unsafe {
        let nb = a.qs.len() / 32;
        let mut v = [_mm256_setzero_si256(); 8];
        for (j, vj) in v.iter_mut().enumerate() {
            let b = 8 * g + j;
            if b < nb {
                // In bounds: `a.qs` holds `nb` blocks of 32.
                *vj = load_256(a.qs.as_ptr().add(32 * b).cast());
                ag.d[j] = a.d[b];
                ag.corr[j] = offset * a.bsums[b] as i32;
                ag.asum[j] = a.bsums[b] as f32;
            } else {
                ag.d[j] = 0.0;
                ag.corr[j] = 0;
                ag.asum[j] = 0.0;
            }
        }
        store_group(&v, nb - 8 * g, ag.qs.as_mut_ptr().cast());
    }
}

/// The sums of values 0..16 of each block of group `g` of activation
/// row `a` (0 past the row's end).
fn low_half_sums(a: ActRow<'_>, g: usize) -> [i32; 8] {
    let mut out = [0; 8];
    for (o, chunk) in out.iter_mut().zip(a.qs.chunks_exact(32).skip(8 * g)) {
        *o = chunk[..16].iter().map(|&q| q as i32).sum();
    }
    out
}

/// The exact int32 block dots of one group for each (weight row `r`,
/// activation row `c`) of a tile, over `$nsteps` steps: 8 for a full
/// group; 4 for a half group, whose 64-bit lanes then hold two partial
/// sums per block. (A macro: as a function, the compiler schedules the
/// unrolled tile badly.)
macro_rules! int_dots {
    ($T:ty, $R:expr, $C:expr, $nsteps:expr, $wg:expr, $ag:expr, $ones:expr) => {{
        let (wg, ag, ones) = ($wg, $ag, $ones);
        let phase = <$T>::STEPS.min($nsteps);
        let mut isum = [[_mm256_setzero_si256(); $C]; $R];
        let mut k0 = 0;
        while k0 < $nsteps {
            let mut acc = [[_mm256_setzero_si256(); $C]; $R];
            for k in k0..k0 + phase {
                let mut av = [_mm256_setzero_si256(); $C];
                for (c, v) in av.iter_mut().enumerate() {
                    *v = load_256(addr_of!((*ag[c]).qs).cast::<u8>().add(32 * k));
                }
                for r in 0..$R {
                    let wu = load_256(addr_of!((*wg[r]).u).cast::<u8>().add(32 * k));
                    let ws = if <$T>::SIGNED {
                        load_256(addr_of!((*wg[r]).s).cast::<u8>().add(32 * k))
                    } else {
                        wu
                    };
                    for c in 0..$C {
                        let y = if <$T>::SIGNED {
                            _mm256_sign_epi8(av[c], ws)
                        } else {
                            av[c]
                        };
                        let m = _mm256_maddubs_epi16(wu, y);
                        acc[r][c] = if phase == 1 {
                            _mm256_add_epi32(acc[r][c], _mm256_madd_epi16(m, ones))
                        } else {
                            _mm256_add_epi16(acc[r][c], m)
                        };
                    }
                }
            }
            for r in 0..$R {
                let widen = if matches!(<$T>::FOLD, Fold::Q6 | Fold::Q2) {
                    load_256(addr_of!((*wg[r]).sc[k0 / 4]).cast())
                } else {
                    ones
                };
                for c in 0..$C {
                    let t = if phase == 1 {
                        acc[r][c]
                    } else {
                        _mm256_madd_epi16(acc[r][c], widen)
                    };
                    isum[r][c] = _mm256_add_epi32(isum[r][c], t);
                }
            }
            k0 += phase;
        }
        isum
    }};
}

/// The `R x C` tile of dots of packed weight rows `w + r` (group `g` of
/// row `r` at `w + g * wstride + r`) with packed activation rows `a[c]`
/// (group `g` at `a[c] + g`), over `ng` groups whose last has `last`
/// valid blocks: the 8 float lanes of each `(r, c)`, to be reduced with
/// `tree8`.
///
/// # Safety
/// AVX2, FMA and F16C available; the pointers cover `ng` groups.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile<T: MultiRow, const R: usize, const C: usize>(
    w: *const WGroup,
    wstride: usize,
    a: &[*const ActGroup; C],
    ng: usize,
    last: usize,
) -> [[__m256; C]; R] {
    unsafe {
        let ones = _mm256_set1_epi16(1);
        let mut facc = [[_mm256_setzero_ps(); C]; R];
        for g in 0..ng {
            let mut wg = [w; R];
            for (r, p) in wg.iter_mut().enumerate() {
                *p = w.add(g * wstride + r);
            }
            let mut ag = *a;
            for p in ag.iter_mut() {
                *p = p.add(g);
            }
            let partial = g + 1 == ng && last < 8;
            let isum = if partial && last <= 4 {
                // Half layout: add each block's two partial sums and move
                // block j to lane j.
                let mut s = int_dots!(T, R, C, 4, &wg, &ag, ones);
                let idx = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
                for row in s.iter_mut() {
                    for v in row.iter_mut() {
                        let pairs = _mm256_add_epi32(*v, _mm256_shuffle_epi32(*v, 0b10_11_00_01));
                        *v = _mm256_permutevar8x32_epi32(pairs, idx);
                    }
                }
                s
            } else {
                int_dots!(T, R, C, 8, &wg, &ag, ones)
            };
            for r in 0..R {
                let f0 = load_ps(addr_of!((*wg[r]).f0).cast());
                for c in 0..C {
                    let da = load_ps(addr_of!((*ag[c]).d).cast());
                    let old = facc[r][c];
                    let new = match T::FOLD {
                        Fold::Block32 => {
                            let isum = if T::OFFSET != 0 {
                                let corr = load_256(addr_of!((*ag[c]).corr).cast());
                                _mm256_sub_epi32(isum[r][c], corr)
                            } else {
                                isum[r][c]
                            };
                            // fma(dw * da, isum, lane), as `fold_scaled`.
                            _mm256_fmadd_ps(_mm256_mul_ps(f0, da), _mm256_cvtepi32_ps(isum), old)
                        }
                        Fold::KMin => {
                            // As `fold_scaled_min` (and `q4_k::avx2::fold_super`).
                            let f1 = load_ps(addr_of!((*wg[r]).f1).cast());
                            let asum = load_ps(addr_of!((*ag[c]).asum).cast());
                            let inner = _mm256_fmsub_ps(
                                f0,
                                _mm256_cvtepi32_ps(isum[r][c]),
                                _mm256_mul_ps(f1, asum),
                            );
                            _mm256_fmadd_ps(da, inner, old)
                        }
                        Fold::Q6 => _mm256_fmadd_ps(
                            _mm256_mul_ps(f0, da),
                            _mm256_cvtepi32_ps(isum[r][c]),
                            old,
                        ),
                        Fold::Q2 => {
                            // As `fold_scaled_min` with the exact half-block
                            // min sum for `asum`.
                            let f1 = load_ps(addr_of!((*wg[r]).f1).cast());
                            let low_sum = load_256(addr_of!((*ag[c]).corr).cast());
                            let block_sum =
                                _mm256_cvtps_epi32(load_ps(addr_of!((*ag[c]).asum).cast()));
                            let lo = _mm256_mullo_epi32(
                                load_256(addr_of!((*wg[r]).mn[0]).cast()),
                                low_sum,
                            );
                            let hi = _mm256_mullo_epi32(
                                load_256(addr_of!((*wg[r]).mn[1]).cast()),
                                _mm256_sub_epi32(block_sum, low_sum),
                            );
                            let msum = _mm256_add_epi32(lo, hi);
                            let inner = _mm256_fmsub_ps(
                                f0,
                                _mm256_cvtepi32_ps(isum[r][c]),
                                _mm256_mul_ps(f1, _mm256_cvtepi32_ps(msum)),
                            );
                            _mm256_fmadd_ps(da, inner, old)
                        }
                    };
                    facc[r][c] = if partial {
                        // Lanes past the row's last block keep their value.
                        let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
                        let keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(last as i32), lane);
                        _mm256_blendv_ps(old, new, _mm256_castsi256_ps(keep))
                    } else {
                        new
                    };
                }
            }
        }
        facc
    }
}

/// Runs the `R x C` tile at weight rows `t0..t0 + R` (packed at `w`, row
/// stride `wstride`) and activation rows `i..i + C`, writing the outputs.
///
/// # Safety
/// As [`tile`]: AVX2, FMA and F16C available, `w` covers `ng` groups of
/// `R` rows at stride `wstride`, `job.packed` holds activation rows
/// `i..i + C` (`ng` groups each); and the caller owns those output
/// elements.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run_tile<T: MultiRow, const R: usize, const C: usize>(
    job: &QuantJob<'_>,
    w: *const WGroup,
    wstride: usize,
    t0: usize,
    i: usize,
    ng: usize,
    last: usize,
) {
    unsafe {
        let mut a = [job.packed.as_ptr(); C];
        for (c, p) in a.iter_mut().enumerate() {
            *p = p.add((i + c) * ng);
        }
        let facc = tile::<T, R, C>(w, wstride, &a, ng, last);
        if R == 4 && C == 2 {
            // All 8 reductions at once; lanes 0..4: rows t0.. of activation
            // row i, lanes 4..8: of row i + 1.
            let mut v = [_mm256_setzero_ps(); 8];
            for (r, row) in facc.iter().enumerate() {
                for (c, &f) in row.iter().enumerate() {
                    v[2 * r + c] = f;
                }
            }
            let t = tree8_x8(&v);
            let lo = job.out.slice(i * job.rows + t0, 4);
            _mm_storeu_ps(lo.as_mut_ptr(), _mm256_castps256_ps128(t));
            let hi = job.out.slice((i + 1) * job.rows + t0, 4);
            _mm_storeu_ps(hi.as_mut_ptr(), _mm256_extractf128_ps(t, 1));
            return;
        }
        for (r, row) in facc.iter().enumerate() {
            for (c, &f) in row.iter().enumerate() {
                job.out.set((i + c) * job.rows + t0 + r, tree8_ps(f));
            }
        }
    }
}

/// AVX2: weight rows `r0..r1` x activation rows `i0..i1`. Activation rows
/// go in chunks that stay in L2; against each chunk, each tile of [`MR`]
/// weight rows is packed once and run against the chunk `NR` rows at a
/// time.
///
/// # Safety
/// AVX2, FMA and F16C available; `job.packed` is `pack_acts::<T>` of the
/// activations; the caller owns output elements `(i, r)` for `i` in
/// `i0..i1`, `r` in `r0..r1`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn range_avx2<T: MultiRow>(
    job: &QuantJob<'_>,
    r0: usize,
    r1: usize,
    i0: usize,
    i1: usize,
) {
    unsafe {
        let nb = job.cols / 32;
        let ng = nb.div_ceil(8);
        if ng == 0 {
            return;
        }
        let last = nb - 8 * (ng - 1);
        assert!(
            job.packed.len() >= i1 * ng
                && job.row_bytes == T::row_bytes(nb)
                && job.data.len() >= r1 * job.row_bytes,
            "multi-row kernel: inconsistent shapes"
        );
        let chunk = act_chunk_rows(ng * std::mem::size_of::<ActGroup>());
        let pack = |row: *const u8, out: *mut WGroup, stride: usize| {
            for g in 0..ng {
                // `out` holds `ng * stride` groups; the row is whole.
                T::pack_group(row, g, nb, &mut *out.add(g * stride));
            }
        };
        super::for_each_packed_tile(
            job,
            chunk,
            (r0, r1),
            (i0, i1),
            pack,
            |w, rt, t0, c0, c1, ahead| {
                ahead.rest(0, 1);
                let mut i = c0;
                while i < c1 {
                    let ct = (c1 - i).min(NR);
                    if rt == MR && ct == NR {
                        run_tile::<T, MR, NR>(job, w, rt, t0, i, ng, last);
                    } else if rt == MR {
                        for c in 0..ct {
                            run_tile::<T, MR, 1>(job, w, rt, t0, i + c, ng, last);
                        }
                    } else if ct == NR {
                        for r in 0..rt {
                            run_tile::<T, 1, NR>(job, w.add(r), rt, t0 + r, i, ng, last);
                        }
                    } else {
                        for r in 0..rt {
                            for c in 0..ct {
                                let (t, ic) = (t0 + r, i + c);
                                run_tile::<T, 1, 1>(job, w.add(r), rt, t, ic, ng, last);
                            }
                        }
                    }
                    i += ct;
                }
            },
        );
    }
}
