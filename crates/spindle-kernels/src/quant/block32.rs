//! The dot product shared by the 32-value block types (Q8_0, Q4_0, Q5_0)
//! against [`ActFormat::Block32`](super::q8_act::ActFormat) activations.
//!
//! Each block is an f16 scale (bytes 0..2) and 32 signed integer values. Block
//! `b` contributes `fma(dw * da, isum_b, lane[b % 8])`, where `isum_b` is the
//! exact int32 dot of the block's integers; lanes are then reduced with
//! [`tree8`]. The scalar and AVX2 paths do exactly these float operations, so
//! they agree bit for bit.
//!
//! AVX2 takes blocks 8 at a time (the 8 integer dots transposed into one
//! vector, one fused multiply-add for 8 lanes), then a half group of 4, then
//! single blocks. Q8_0 values use the `maddubs` sign trick; Q4_0/Q5_0 values
//! are multiplied as unsigned `u = q + OFFSET` and `OFFSET * sum(a)` is taken
//! off using the activation block sums, which is the same integer.

use super::kernels::{block32_act, Kernel, OneRow};
use super::multi_row::{Decoded, Fold, MultiRow};
use super::q8_act::ActRow;
use super::{arr, f16_le};
use crate::simd::tree8;
use crate::simd::Isa;

/// A 32-value block type with an f16 scale in bytes 0..2.
pub(crate) trait Block32 {
    /// Bytes per block.
    const BYTES: usize;

    /// The block's 32 signed integer values (scalar reference decode).
    /// `block` is exactly `BYTES` long.
    fn values(block: &[u8]) -> [i8; 32];

    /// 0 when the values span the signed byte range (dotted with the sign
    /// trick); else the values are `u - OFFSET` with `0 <= u < 32`, and SIMD
    /// code multiplies the unsigned `u` and subtracts `OFFSET * sum(a)`.
    const OFFSET: i32;

    /// Multi-row kernel: `maddubs` steps whose int16 pair sums fit before
    /// widening (see [`super::multi_row`]): 8 for 4-bit `u`, 4 for 5-bit, 1 for
    /// full bytes.
    const STEPS: usize;

    /// The block at `p` as 32 bytes: the signed values when `OFFSET == 0`,
    /// else the unsigned `u = value + OFFSET`.
    ///
    /// # Safety
    /// AVX2, FMA and F16C available; `p..p + BYTES` readable.
    #[cfg(target_arch = "x86_64")]
    unsafe fn values_avx2(p: *const u8) -> std::arch::x86_64::__m256i;
}

/// The kernels of a 32-value block type on `isa`: one-row kernels scalar,
/// AVX2 (`maddubs`) and, on AVX-512 VNNI machines, with `vpdpbusd ymm` (the
/// Q8_0 head turns compute-bound above ~45 GB/s on two AVX2 cores);
/// multi-row kernels scalar, AVX2 and `vpdpbusd zmm`. The tile unit runs
/// only vertical matrices (their entry's `vertical`).
pub(crate) fn kernels<B: Block32>(isa: Isa) -> Option<Kernel> {
    block32_act::<B>(
        isa,
        OneRow {
            scalar: rows_scalar::<B>,
            #[cfg(target_arch = "x86_64")]
            avx2: avx2::rows::<B>,
            #[cfg(target_arch = "x86_64")]
            avx512: avx2::rows_vnni::<B>,
        },
    )
}

/// Scalar reference: dot of one weight row (whole blocks of `B`) with one
/// quantized activation row.
pub(crate) fn dot_scalar<B: Block32>(w: &[u8], a: ActRow<'_>) -> f32 {
    let mut lanes = [0.0f32; 8];
    for (b, ((block, aq), &da)) in w
        .chunks_exact(B::BYTES)
        .zip(a.qs.chunks_exact(32))
        .zip(a.d)
        .enumerate()
    {
        let dw = f16_le(*arr::<2>(block));
        let isum: i32 = B::values(block)
            .iter()
            .zip(aq)
            .map(|(&q, &y)| q as i32 * y as i32)
            .sum();
        let lane = &mut lanes[b % 8];
        *lane = (dw * da).mul_add(isum as f32, *lane);
    }
    tree8(&lanes)
}

/// Scalar: `out[r] = dot(row r of w, a)` for each of `out.len()` rows.
pub(crate) fn rows_scalar<B: Block32>(w: &[u8], row_bytes: usize, a: ActRow<'_>, out: &mut [f32]) {
    for (row, o) in w.chunks_exact(row_bytes).zip(out.iter_mut()) {
        *o = dot_scalar::<B>(row, a);
    }
}

impl<B: Block32> MultiRow for B {
    const FOLD: Fold = Fold::Block32;
    const SIGNED: bool = B::OFFSET == 0;
    const STEPS: usize = B::STEPS;
    const OFFSET: i32 = B::OFFSET;

    fn row_bytes(nb: usize) -> usize {
        nb * B::BYTES
    }

    fn decode_row(row: &[u8], out: &mut [Decoded]) {
        for (block, o) in row.chunks_exact(B::BYTES).zip(out) {
            o.v = B::values(block);
            o.f0 = f16_le(*arr::<2>(block));
        }
    }

    /// # Safety
    /// As [`MultiRow::pack_group`]: AVX2, FMA and F16C available; `row`
    /// covers `nb` blocks and `8 * g < nb`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn pack_group(row: *const u8, g: usize, nb: usize, out: &mut super::multi_row::WGroup) {
        unsafe { avx2::pack_group::<B>(row, g, nb, out) }
    }

    /// # Safety
    /// As [`MultiRow::pack_group_unsigned`].
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
    unsafe fn pack_group_unsigned(
        row: *const u8,
        g: usize,
        nb: usize,
        out: &mut super::multi_row::WGroup,
    ) {
        unsafe { avx2::pack_group_unsigned::<B>(row, g, nb, out) }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use super::Block32;
    use crate::quant::multi_row::{store_group, WGroup};
    use crate::quant::q8_act::ActRow;
    use crate::simd::avx2::*;
    use std::arch::x86_64::*;

    /// The offset taken off the block dots: `OFFSET`, or on the VNNI path 128
    /// for signed types (dotted as `s + 128`).
    const fn vnni_offset<B: Block32, const VNNI: bool>() -> i32 {
        if VNNI && B::OFFSET == 0 {
            128
        } else {
            B::OFFSET
        }
    }

    /// The 8 int32 partial dots of the block at `w` with the 32 values at
    /// `a`; of `u = value + offset` where the offset is not 0 (see
    /// [`offset_fix`]). With `VNNI`, one `vpdpbusd` (signed values as
    /// `s + 128`).
    ///
    /// # Safety
    /// AVX2, FMA and F16C available (with `VNNI`, AVX-512 VL and VNNI too);
    /// `w..w + BYTES` and `a..a + 32` readable. Inlined into callers that
    /// enable those features.
    #[inline(always)]
    unsafe fn block_dot<B: Block32, const VNNI: bool>(w: *const u8, a: *const i8) -> __m256i {
        unsafe {
            let a = load_256(a.cast());
            if VNNI {
                let flip = _mm256_set1_epi8(if B::OFFSET == 0 { 0x80u8 as i8 } else { 0 });
                let u = _mm256_xor_si256(B::values_avx2(w), flip);
                _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, a)
            } else if B::OFFSET == 0 {
                dot_i8_i8(B::values_avx2(w), a)
            } else {
                // u < 32: pair sums stay below 2 * 31 * 127.
                _mm256_madd_epi16(dot_u8_i8_pairs(B::values_avx2(w), a), _mm256_set1_epi16(1))
            }
        }
    }

    /// The values of blocks `8g..8g + 8` of the row at `row` (those from `nb`
    /// on zero) as `values_avx2` gives them, each XORed with `flip`, and
    /// their scales into `f0`.
    ///
    /// # Safety
    /// AVX2, FMA and F16C available; `row` covers `nb` blocks.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn group_values<B: Block32>(
        row: *const u8,
        g: usize,
        nb: usize,
        flip: i8,
        f0: &mut [f32; 8],
    ) -> [__m256i; 8] {
        unsafe {
            let mut v = [_mm256_setzero_si256(); 8];
            for (j, vj) in v.iter_mut().enumerate() {
                let b = 8 * g + j;
                if b < nb {
                    let p = row.add(b * B::BYTES);
                    *vj = _mm256_xor_si256(B::values_avx2(p), _mm256_set1_epi8(flip));
                    f0[j] = half_to_f32(read_u16(p));
                } else {
                    f0[j] = 0.0;
                }
            }
            v
        }
    }

    /// Packs group `g` of the weight row at `row` (blocks `8g..8g + 8`, those
    /// from `nb` on zero) for the multi-row kernel: the unsigned values (or
    /// magnitudes and signed values when `OFFSET == 0`) and the scales; in
    /// the half layout when at most 4 blocks are left.
    ///
    /// # Safety
    /// AVX2, FMA and F16C available; `row` covers `nb` blocks.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn pack_group<B: Block32>(
        row: *const u8,
        g: usize,
        nb: usize,
        out: &mut WGroup,
    ) {
        unsafe {
            let mut v = group_values::<B>(row, g, nb, 0, &mut out.f0);
            // Valid blocks in this group; at most 4 only in a row's last group.
            let m = nb - 8 * g;
            if B::OFFSET == 0 {
                store_group(&v, m, out.s.as_mut_ptr().cast());
                for vj in &mut v {
                    *vj = _mm256_sign_epi8(*vj, *vj);
                }
            }
            store_group(&v, m, out.u.as_mut_ptr());
        }
    }

    /// [`pack_group`] for the VNNI kernel: the values as one unsigned
    /// operand (`value + OFFSET`, or `s + 128` for signed types), and the
    /// scales; a full group transposed by `vpermt2d`
    /// (`multi_row::store_vertical_512`).
    ///
    /// # Safety
    /// AVX2, FMA, F16C and AVX-512 F/BW/VL available; `row` covers `nb`
    /// blocks.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
    pub(super) unsafe fn pack_group_unsigned<B: Block32>(
        row: *const u8,
        g: usize,
        nb: usize,
        out: &mut WGroup,
    ) {
        unsafe {
            let flip = if B::OFFSET == 0 { 0x80u8 as i8 } else { 0 };
            let v = group_values::<B>(row, g, nb, flip, &mut out.f0);
            let m = nb - 8 * g;
            if m >= 8 {
                crate::quant::multi_row::store_vertical_512(&v, out.u.as_mut_ptr());
            } else {
                store_group(&v, m, out.u.as_mut_ptr());
            }
        }
    }

    /// Block sums of [`block_dot`] minus `OFFSET * sum(a)`: the exact dots of
    /// the values. `asum` holds the activation block sums (as int32).
    ///
    /// # Safety
    /// AVX2, FMA and F16C available.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn offset_fix<B: Block32, const VNNI: bool>(isum: __m256i, asum: __m256i) -> __m256i {
        let offset = vnni_offset::<B, VNNI>();
        if offset == 0 {
            isum
        } else {
            _mm256_sub_epi32(isum, _mm256_mullo_epi32(asum, _mm256_set1_epi32(offset)))
        }
    }

    /// Dot of one weight row (`nb` blocks at `w`) with one activation row
    /// (`nb * 32` values at `qs`, `nb` scales at `d`, `nb` block sums at
    /// `bs`). Blocks go 8 at a time, block `b` into lane `b % 8`:
    /// bit-identical to [`super::dot_scalar`].
    ///
    /// # Safety
    /// AVX2, FMA and F16C available (with `VNNI`, AVX-512 VL and VNNI too);
    /// the pointers cover `nb` blocks. Inlined into [`rows`] and
    /// [`rows_vnni`], which enable those features.
    #[inline(always)]
    unsafe fn dot<B: Block32, const VNNI: bool>(
        w: *const u8,
        qs: *const i8,
        d: *const f32,
        bs: *const i16,
        nb: usize,
    ) -> f32 {
        unsafe {
            let mut acc = _mm256_setzero_ps();
            let mut b = 0;
            while b + 8 <= nb {
                let wp = w.add(b * B::BYTES);
                let ap = qs.add(b * 32);
                let isum = transpose_sum_8(
                    block_dot::<B, VNNI>(wp, ap),
                    block_dot::<B, VNNI>(wp.add(B::BYTES), ap.add(32)),
                    block_dot::<B, VNNI>(wp.add(2 * B::BYTES), ap.add(64)),
                    block_dot::<B, VNNI>(wp.add(3 * B::BYTES), ap.add(96)),
                    block_dot::<B, VNNI>(wp.add(4 * B::BYTES), ap.add(128)),
                    block_dot::<B, VNNI>(wp.add(5 * B::BYTES), ap.add(160)),
                    block_dot::<B, VNNI>(wp.add(6 * B::BYTES), ap.add(192)),
                    block_dot::<B, VNNI>(wp.add(7 * B::BYTES), ap.add(224)),
                );
                let isum =
                    offset_fix::<B, VNNI>(isum, _mm256_cvtepi16_epi32(load_128(bs.add(b).cast())));
                let dw = _mm256_cvtph_ps(_mm_setr_epi16(
                    read_u16(wp) as i16,
                    read_u16(wp.add(B::BYTES)) as i16,
                    read_u16(wp.add(2 * B::BYTES)) as i16,
                    read_u16(wp.add(3 * B::BYTES)) as i16,
                    read_u16(wp.add(4 * B::BYTES)) as i16,
                    read_u16(wp.add(5 * B::BYTES)) as i16,
                    read_u16(wp.add(6 * B::BYTES)) as i16,
                    read_u16(wp.add(7 * B::BYTES)) as i16,
                ));
                let scale = _mm256_mul_ps(dw, load_ps(d.add(b)));
                acc = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(isum), acc);
                b += 8;
            }
            if b + 4 <= nb {
                // A half group: blocks b..b+4 into lanes 0..4; lanes 4..8 keep
                // their value.
                let wp = w.add(b * B::BYTES);
                let ap = qs.add(b * 32);
                let h01 = _mm256_hadd_epi32(
                    block_dot::<B, VNNI>(wp, ap),
                    block_dot::<B, VNNI>(wp.add(B::BYTES), ap.add(32)),
                );
                let h23 = _mm256_hadd_epi32(
                    block_dot::<B, VNNI>(wp.add(2 * B::BYTES), ap.add(64)),
                    block_dot::<B, VNNI>(wp.add(3 * B::BYTES), ap.add(96)),
                );
                let h = _mm256_hadd_epi32(h01, h23);
                let isum = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
                let isum = _mm256_castsi256_si128(offset_fix::<B, VNNI>(
                    _mm256_castsi128_si256(isum),
                    _mm256_setr_epi32(
                        *bs.add(b) as i32,
                        *bs.add(b + 1) as i32,
                        *bs.add(b + 2) as i32,
                        *bs.add(b + 3) as i32,
                        0,
                        0,
                        0,
                        0,
                    ),
                ));
                let dw = _mm_cvtph_ps(_mm_setr_epi16(
                    read_u16(wp) as i16,
                    read_u16(wp.add(B::BYTES)) as i16,
                    read_u16(wp.add(2 * B::BYTES)) as i16,
                    read_u16(wp.add(3 * B::BYTES)) as i16,
                    0,
                    0,
                    0,
                    0,
                ));
                let da = _mm_castsi128_ps(load_128(d.add(b).cast()));
                let low = _mm_fmadd_ps(
                    _mm_mul_ps(dw, da),
                    _mm_cvtepi32_ps(isum),
                    _mm256_castps256_ps128(acc),
                );
                acc = _mm256_insertf128_ps(acc, low, 0);
                b += 4;
            }
            if b < nb {
                // The last 1..3 blocks, one at a time into lanes 4.., with the
                // same float operations.
                let mut lanes = lanes_ps(acc);
                let mut lane = if nb % 8 >= 4 { 4 } else { 0 };
                while b < nb {
                    let wp = w.add(b * B::BYTES);
                    let isum = hsum_i32(block_dot::<B, VNNI>(wp, qs.add(b * 32)))
                        - vnni_offset::<B, VNNI>() * *bs.add(b) as i32;
                    let dw = half_to_f32(read_u16(wp));
                    crate::quant::fold_scaled(&mut lanes[lane], dw, *d.add(b), isum);
                    lane += 1;
                    b += 1;
                }
                return crate::simd::tree8(&lanes);
            }
            tree8_ps(acc)
        }
    }

    /// `out[r] = dot(row r of w, a)` for each of `out.len()` rows.
    ///
    /// # Safety
    /// As [`dot`]: inlined into [`rows`] and [`rows_vnni`], which enable the
    /// features it needs.
    #[inline(always)]
    unsafe fn rows_with<B: Block32, const VNNI: bool>(
        w: &[u8],
        row_bytes: usize,
        a: ActRow<'_>,
        out: &mut [f32],
    ) {
        unsafe {
            let nb = a.d.len();
            assert!(
                row_bytes == nb * B::BYTES
                    && a.qs.len() == nb * 32
                    && a.bsums.len() == nb
                    && w.len() >= out.len() * row_bytes,
                "block32 kernel: inconsistent shapes"
            );
            let (qs, d, bs) = (a.qs.as_ptr(), a.d.as_ptr(), a.bsums.as_ptr());
            for (r, o) in out.iter_mut().enumerate() {
                crate::quant::prefetch_row_ahead(w, r, row_bytes);
                // In bounds: checked above.
                *o = dot::<B, VNNI>(w.as_ptr().add(r * row_bytes), qs, d, bs, nb);
            }
        }
    }

    /// AVX2: `out[r] = dot(row r of w, a)` for each of `out.len()` rows.
    ///
    /// # Safety
    /// AVX2, FMA and F16C must be available.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn rows<B: Block32>(
        w: &[u8],
        row_bytes: usize,
        a: ActRow<'_>,
        out: &mut [f32],
    ) {
        unsafe { rows_with::<B, false>(w, row_bytes, a, out) }
    }

    /// [`rows`] with the block dots in `vpdpbusd` (256-bit, AVX-512 VL).
    ///
    /// # Safety
    /// AVX2, FMA, F16C and AVX-512 F/BW/VL/VNNI must be available.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(crate) unsafe fn rows_vnni<B: Block32>(
        w: &[u8],
        row_bytes: usize,
        a: ActRow<'_>,
        out: &mut [f32],
    ) {
        unsafe { rows_with::<B, true>(w, row_bytes, a, out) }
    }
}
