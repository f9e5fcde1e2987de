//! Block types computed through their decoded form: each 32-value block
//! decodes to small integers plus the float terms of one multi-row
//! [`Fold`], and every kernel (scalar, AVX2) works from that decode with the
//! shared micro-kernels of [`multi_row`](super::multi_row).
//!
//! A type is then one decoder beside its reference dequantizer; its dot
//! products are the tested micro-kernels', so the scalar and AVX2 paths agree
//! bit for bit by construction. The float terms are decoded in scalar code,
//! the values too unless the type has an AVX2 decoder (`SIMD_VALUES`): a
//! small, uniform implementation for a little speed. One activation row
//! (decode) dots each decoded block directly ([`rows_avx2`]); more rows go
//! through the multi-row kernel.

use super::kernels::{scalar_multi, Kernel, QuantRowsFn};
use super::multi_row::{fold_decoded_scalar, Decoded, Fold, MultiRow, WGroup};
use super::q8_act::{ActFormat, ActRow};
use crate::simd::{tree8, Isa};
use std::marker::PhantomData;

/// The kernels of a type computed through its decoded blocks on `isa`:
/// one-row scalar, AVX2, or on AVX-512 VNNI machines with the 8-block
/// fold's dots by `vpdpbusd`; multi-row scalar, or AVX2 on every x86 path
/// (Q2's half sums have no VNNI form; same results, not yet tuned for
/// VNNI).
pub(crate) fn kernels<T: BlockDecode>(isa: Isa) -> Option<Kernel> {
    let (one_row, multi) = match isa {
        Isa::Scalar => (
            rows_scalar::<T> as QuantRowsFn,
            scalar_multi::<ByDecode<T>>(),
        ),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => (
            rows_avx2::<T> as QuantRowsFn,
            super::kernels::avx2_multi::<ByDecode<T>>(),
        ),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni | Isa::Amx => (
            rows_avx512vnni::<T> as QuantRowsFn,
            super::kernels::avx2_multi::<ByDecode<T>>(),
        ),
        #[allow(unreachable_patterns)]
        _ => return None,
    };
    Some(Kernel::Quant(ActFormat::Block32, one_row, multi))
}

/// A block type defined by how its blocks decode.
pub(crate) trait BlockDecode {
    /// How a decoded block's exact integer dot becomes a float term.
    const FOLD: Fold;
    /// Whether decoded values are signed (dotted with the sign trick).
    const SIGNED: bool;
    /// Steps of `maddubs` pair sums accumulated before widening: a divisor
    /// of 8 (of 4 for `Q6` and `Q2` folds, whose scales change every 4
    /// steps) with `steps * 2 * max|v| * 127 <= 32767`, see
    /// [`multi_row`](super::multi_row).
    const STEPS: usize;
    /// Values in one storage block: 32, 64, 128 or 256 (a divisor of 256).
    const BLOCK_LEN: usize;
    /// Bytes in one storage block.
    const BLOCK_BYTES: usize;

    /// Decodes one storage block (`BLOCK_BYTES` long) into its `BLOCK_LEN /
    /// 32` blocks of 32 values.
    fn decode(block: &[u8], out: &mut [Decoded]);

    /// Whether [`values_avx2`](Self::values_avx2) decodes values (and
    /// [`decode_terms`](Self::decode_terms) leaves them out).
    const SIMD_VALUES: bool = false;

    /// [`decode`](Self::decode) without the values, for types whose values
    /// the AVX2 paths decode with [`values_avx2`](Self::values_avx2).
    fn decode_terms(block: &[u8], out: &mut [Decoded]) {
        Self::decode(block, out);
    }

    /// AVX2: the values of block `j` (0..`BLOCK_LEN / 32`) of the storage
    /// block at `p`, as [`decode`](Self::decode) writes them to `v`. Only
    /// called where `SIMD_VALUES`.
    ///
    /// # Safety
    /// AVX2, FMA and F16C available; `p..p + BLOCK_BYTES` readable.
    #[cfg(target_arch = "x86_64")]
    unsafe fn values_avx2(p: *const u8, j: usize) -> std::arch::x86_64::__m256i {
        let _ = (p, j);
        unreachable!("values_avx2 of a type without SIMD_VALUES")
    }
}

/// The multi-row kernel pieces of a [`BlockDecode`] type.
pub(crate) struct ByDecode<T>(PhantomData<T>);

impl<T: BlockDecode> MultiRow for ByDecode<T> {
    const FOLD: Fold = T::FOLD;
    const SIGNED: bool = T::SIGNED;
    const STEPS: usize = T::STEPS;
    const OFFSET: i32 = 0;

    fn row_bytes(nb: usize) -> usize {
        nb / (T::BLOCK_LEN / 32) * T::BLOCK_BYTES
    }

    fn decode_row(row: &[u8], out: &mut [Decoded]) {
        let per = T::BLOCK_LEN / 32;
        for (block, o) in row
            .chunks_exact(T::BLOCK_BYTES)
            .zip(out.chunks_exact_mut(per))
        {
            T::decode(block, o);
        }
    }

    /// # Safety
    /// As [`MultiRow::pack_group`]: AVX2, FMA and F16C available; `row`
    /// covers `nb` blocks and `8 * g < nb`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn pack_group(row: *const u8, g: usize, nb: usize, out: &mut WGroup) {
        let per = T::BLOCK_LEN / 32;
        let m = (nb - 8 * g).min(8);
        let first = 8 * g / per;
        let count = m.div_ceil(per);
        // SAFETY: blocks `8g..8g + m` lie in the row of `nb` blocks the
        // caller vouches for; storage blocks never straddle a group (`per`
        // divides 8).
        let bytes = unsafe {
            std::slice::from_raw_parts(row.add(first * T::BLOCK_BYTES), count * T::BLOCK_BYTES)
        };
        let mut dec = [Decoded::default(); 8];
        for (k, block) in bytes.chunks_exact(T::BLOCK_BYTES).enumerate() {
            let blocks = &mut dec[k * per..(k + 1) * per];
            if T::SIMD_VALUES {
                T::decode_terms(block, blocks);
            } else {
                T::decode(block, blocks);
            }
        }
        // SAFETY: AVX2 is available (this function's contract); each
        // decoded block `b < m` lies in storage block `b / per` of `bytes`.
        unsafe {
            let values = std::array::from_fn(|b| {
                if b >= m {
                    std::arch::x86_64::_mm256_setzero_si256()
                } else if T::SIMD_VALUES {
                    T::values_avx2(bytes.as_ptr().add(b / per * T::BLOCK_BYTES), b % per)
                } else {
                    std::arch::x86_64::_mm256_loadu_si256(dec[b].v.as_ptr().cast())
                }
            });
            avx2::pack_decoded(&dec, &values, m, T::SIGNED, out)
        }
    }
}

/// Most 32-value blocks in one storage block.
const MAX_PER: usize = 8;

/// Scalar one-row kernel: `out[r] = dot(row r of w, a)`, block by block as
/// the scalar multi-row path computes it (no buffer: each storage block is
/// decoded and folded in turn).
pub(crate) fn rows_scalar<T: BlockDecode>(
    w: &[u8],
    row_bytes: usize,
    a: ActRow<'_>,
    out: &mut [f32],
) {
    let per = T::BLOCK_LEN / 32;
    let mut dec = [Decoded::default(); MAX_PER];
    for (row, o) in w.chunks_exact(row_bytes).zip(out.iter_mut()) {
        let mut lanes = [0.0f32; 8];
        for (s, block) in row.chunks_exact(T::BLOCK_BYTES).enumerate() {
            T::decode(block, &mut dec[..per]);
            for (j, blk) in dec[..per].iter().enumerate() {
                let b = s * per + j;
                fold_decoded_scalar(T::FOLD, &mut lanes[b % 8], blk, a, b);
            }
        }
        *o = tree8(&lanes);
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) use avx2::{rows_avx2, rows_avx512vnni};

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::super::multi_row::{fold_decoded, store_group, Decoded, WGroup};
    use super::super::q8_act::ActRow;
    use super::{tree8, BlockDecode, MAX_PER};
    use std::arch::x86_64::*;

    /// AVX2 one-row kernel: each storage block decoded (scalar), each
    /// 32-value block's two half dots with the activations in SIMD (the
    /// `maddubs` sign trick), folded with the scalar [`fold_decoded`] in
    /// block order, as every other path folds them.
    ///
    /// # Safety
    /// AVX2, FMA and F16C available.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn rows_avx2<T: BlockDecode>(
        w: &[u8],
        row_bytes: usize,
        a: ActRow<'_>,
        out: &mut [f32],
    ) {
        unsafe { rows_body::<T, false>(w, row_bytes, a, out) }
    }

    /// [`rows_avx2`] with the 8-block fold's dots by `vpdpbusd` (exact
    /// int32 sums, as `maddubs` + `madd` give them here: no pair sum
    /// reaches int16's limit, `|v|, |a| <= 127`).
    ///
    /// # Safety
    /// AVX2, FMA, F16C, AVX-512 VL and VNNI available.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(crate) unsafe fn rows_avx512vnni<T: BlockDecode>(
        w: &[u8],
        row_bytes: usize,
        a: ActRow<'_>,
        out: &mut [f32],
    ) {
        unsafe { rows_body::<T, true>(w, row_bytes, a, out) }
    }

    /// The one-row kernel, inlined into its feature-enabled entry points.
    ///
    /// # Safety
    /// AVX2, FMA and F16C available (with `VNNI`, AVX-512 VL and VNNI too).
    #[inline(always)]
    unsafe fn rows_body<T: BlockDecode, const VNNI: bool>(
        w: &[u8],
        row_bytes: usize,
        a: ActRow<'_>,
        out: &mut [f32],
    ) {
        // SAFETY: the caller enabled the features; slices are checked.
        #[allow(unused_unsafe)]
        unsafe {
            let per = T::BLOCK_LEN / 32;
            let ones = _mm256_set1_epi16(1);
            let mut dec = [Decoded::default(); MAX_PER];
            // Types of one scale per 32 values whose values decode in SIMD
            // (IQ4_NL, MXFP4) fold 8 blocks at once: block b's lane is b % 8,
            // so 8 consecutive blocks fill the 8 lanes, each with the scalar
            // fold's operations (`fma(dw * da, isum, lane)`; the integer sums
            // are exact in any order).
            let eight_at_once =
                matches!(T::FOLD, super::Fold::Block32) && T::SIMD_VALUES && per == 1;
            for (row, o) in w.chunks_exact(row_bytes).zip(out.iter_mut()) {
                let mut lanes = [0.0f32; 8];
                let mut first = 0;
                if eight_at_once {
                    let nb = row.len() / T::BLOCK_BYTES;
                    let mut acc = _mm256_setzero_ps();
                    while first + 8 <= nb {
                        let mut prods = [_mm256_setzero_si256(); 8];
                        let mut dw = [0.0f32; 8];
                        for (i, prod) in prods.iter_mut().enumerate() {
                            let b = first + i;
                            let block = &row[b * T::BLOCK_BYTES..(b + 1) * T::BLOCK_BYTES];
                            T::decode_terms(block, &mut dec[..1]);
                            dw[i] = dec[0].f0;
                            // SAFETY: a whole storage block and 32 activation bytes.
                            let (v, y) = unsafe {
                                (
                                    T::values_avx2(block.as_ptr(), 0),
                                    _mm256_loadu_si256(a.qs[32 * b..32 * b + 32].as_ptr().cast()),
                                )
                            };
                            // SAFETY: the features of the entry point.
                            *prod = unsafe {
                                let (u, s) = (_mm256_abs_epi8(v), _mm256_sign_epi8(y, v));
                                if VNNI {
                                    _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s)
                                } else {
                                    _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), ones)
                                }
                            };
                        }
                        // SAFETY: the features of the entry point.
                        let isums = unsafe { sum8_each(&prods) };
                        // SAFETY: 8 floats each.
                        let scale = unsafe {
                            _mm256_mul_ps(
                                _mm256_loadu_ps(dw.as_ptr()),
                                _mm256_loadu_ps(a.d[first..first + 8].as_ptr()),
                            )
                        };
                        acc = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(isums), acc);
                        first += 8;
                    }
                    // SAFETY: 8 floats.
                    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc) };
                }
                for (s, block) in row.chunks_exact(T::BLOCK_BYTES).enumerate().skip(first) {
                    if T::SIMD_VALUES {
                        T::decode_terms(block, &mut dec[..per]);
                    } else {
                        T::decode(block, &mut dec[..per]);
                    }
                    for (j, blk) in dec[..per].iter().enumerate() {
                        let b = s * per + j;
                        let aq = &a.qs[32 * b..32 * b + 32];
                        // SAFETY: `blk.v` and `aq` are 32 bytes each, `block`
                        // is a whole storage block.
                        let (v, y) = unsafe {
                            (
                                if T::SIMD_VALUES {
                                    T::values_avx2(block.as_ptr(), j)
                                } else {
                                    _mm256_loadu_si256(blk.v.as_ptr().cast())
                                },
                                _mm256_loadu_si256(aq.as_ptr().cast()),
                            )
                        };
                        let prod = _mm256_madd_epi16(
                            _mm256_maddubs_epi16(_mm256_abs_epi8(v), _mm256_sign_epi8(y, v)),
                            ones,
                        );
                        let (lo, hi) = (
                            _mm256_castsi256_si128(prod),
                            _mm256_extracti128_si256(prod, 1),
                        );
                        // Folds without sub-block scales need only the sum of
                        // both halves: one horizontal sum.
                        let dots = if matches!(T::FOLD, super::Fold::Q6 | super::Fold::Q2) {
                            [sum4(lo), sum4(hi)]
                        } else {
                            [sum4(_mm_add_epi32(lo, hi)), 0]
                        };
                        let half_sums = if matches!(T::FOLD, super::Fold::Q2) {
                            let lo: i32 = aq[..16].iter().map(|&q| q as i32).sum();
                            [lo, a.bsums[b] as i32 - lo]
                        } else {
                            [0, 0]
                        };
                        fold_decoded(T::FOLD, &mut lanes[b % 8], blk, a, b, dots, half_sums);
                    }
                }
                *o = tree8(&lanes);
            }
        }
    }

    /// Lane `i` of the result: the sum of the 8 int32 lanes of `v[i]`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn sum8_each(v: &[__m256i; 8]) -> __m256i {
        let h01 = _mm256_hadd_epi32(v[0], v[1]);
        let h23 = _mm256_hadd_epi32(v[2], v[3]);
        let h45 = _mm256_hadd_epi32(v[4], v[5]);
        let h67 = _mm256_hadd_epi32(v[6], v[7]);
        // Per 128-bit half: the half-sums of v[0..4] and of v[4..8].
        let lo = _mm256_hadd_epi32(h01, h23);
        let hi = _mm256_hadd_epi32(h45, h67);
        _mm256_add_epi32(
            _mm256_permute2x128_si256(lo, hi, 0x20),
            _mm256_permute2x128_si256(lo, hi, 0x31),
        )
    }

    /// The sum of the 4 int32 lanes of `v`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn sum4(v: __m128i) -> i32 {
        let v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 0b01_00_11_10));
        let v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 0b10_11_00_01));
        _mm_cvtsi128_si32(v)
    }

    /// Packs 8 decoded blocks, with their `values` (the first `m` valid,
    /// the rest zero), into `out` for the AVX2 micro-kernel: magnitudes in
    /// `u` and the values in `s` for signed types, the values in `u` for
    /// unsigned ones.
    ///
    /// # Safety
    /// AVX2, FMA and F16C available.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn pack_decoded(
        dec: &[Decoded; 8],
        values: &[__m256i; 8],
        m: usize,
        signed: bool,
        out: &mut WGroup,
    ) {
        let mut u = [_mm256_setzero_si256(); 8];
        let s = *values;
        for (j, d) in dec.iter().enumerate() {
            let v = values[j];
            u[j] = if signed { _mm256_abs_epi8(v) } else { v };
            out.f0[j] = d.f0;
            out.f1[j] = d.f1;
            for h in 0..2 {
                out.sc[h][2 * j] = d.sc[h] as i16;
                out.sc[h][2 * j + 1] = d.sc[h] as i16;
                out.mn[h][j] = d.mn[h] as i32;
            }
        }
        // SAFETY: `out.u` and `out.s` are 256 bytes each.
        unsafe {
            store_group(&u, m, out.u.as_mut_ptr());
            if signed {
                store_group(&s, m, out.s.as_mut_ptr().cast());
            }
        }
    }
}
