//! Q4_K: super-blocks of 256 values in 8 sub-blocks of 32.
//!
//! Layout (144 bytes): f16 `d`, f16 `dmin`, 12 bytes of packed 6-bit scales and
//! mins (see [`k_scales_mins`]), 128 bytes of 4-bit values. Values come in 4
//! chunks of 64: chunk `c` is bytes `32c..32c+32` of the values, whose low
//! nibbles are sub-block `2c` and high nibbles sub-block `2c+1`. Value `q` of
//! sub-block `j` stands for `d * scale[j] * q - dmin * min[j]`.
//!
//! Dot products take `Block32` activations: sub-block `j` of super-block `s`
//! meets activation block `b = 8s + j` (its own scale and sum) and folds into
//! lane `b % 8`, so a super-block fills the 8 lanes once (see
//! [`fold_scaled_min`](super::fold_scaled_min)).

use super::kernels::{block32_act, Kernel, OneRow};
use super::multi_row::{Decoded, Fold, MultiRow};
use super::q8_act::ActRow;
use super::registry::QuantType;
use super::{arr, f16_le, k_dot_scalar, k_scales_mins};
use crate::simd::Isa;
use spindle_formats::GgmlType;

/// This type's entry in the kernels' registry.
pub(crate) const TYPE: QuantType = QuantType {
    #[cfg(target_arch = "x86_64")]
    vertical: Some(super::kernels::vertical::<Q4K>),
    ..QuantType::quantized(GgmlType::Q4_K, dequantize, &[0, 2], true, kernels)
};

/// The kernels on `isa`: one-row scalar and AVX2 (which AVX-512 machines
/// run too), multi-row scalar, AVX2 and `vpdpbusd zmm`.
pub(crate) fn kernels(isa: Isa) -> Option<Kernel> {
    block32_act::<Q4K>(
        isa,
        OneRow {
            scalar: rows_scalar,
            #[cfg(target_arch = "x86_64")]
            avx2: avx2::rows,
            #[cfg(target_arch = "x86_64")]
            avx512: avx2::rows,
        },
    )
}

/// Bytes per super-block.
pub const BLOCK_BYTES: usize = 144;

/// Scalar reference dequantization; `src` is whole super-blocks, `dst` 256
/// values per super-block.
pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (block, out) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(256)) {
        let d = f16_le(*arr::<2>(block));
        let dmin = f16_le(*arr::<2>(&block[2..]));
        let (sc, mn) = k_scales_mins(arr::<12>(&block[4..]));
        let qs = &block[16..144];
        for c in 0..4 {
            let (d_lo, m_lo) = (d * sc[2 * c] as f32, dmin * mn[2 * c] as f32);
            let (d_hi, m_hi) = (d * sc[2 * c + 1] as f32, dmin * mn[2 * c + 1] as f32);
            for l in 0..32 {
                let q = qs[32 * c + l];
                out[64 * c + l] = d_lo * (q & 0x0F) as f32 - m_lo;
                out[64 * c + 32 + l] = d_hi * (q >> 4) as f32 - m_hi;
            }
        }
    }
}

/// The unsigned 4-bit value `l` (0..32) of sub-block `j` (0..8).
#[inline]
fn value(block: &[u8], j: usize, l: usize) -> u8 {
    let q = block[16 + 32 * (j / 2) + l];
    if j.is_multiple_of(2) {
        q & 0x0F
    } else {
        q >> 4
    }
}

/// Scalar reference: dot of one weight row with one `Block32` activation row.
pub(crate) fn dot_scalar(w: &[u8], a: ActRow<'_>) -> f32 {
    k_dot_scalar(w, BLOCK_BYTES, a, value)
}

/// Scalar: `out[r] = dot(row r of w, a)`.
pub(crate) fn rows_scalar(w: &[u8], row_bytes: usize, a: ActRow<'_>, out: &mut [f32]) {
    for (row, o) in w.chunks_exact(row_bytes).zip(out.iter_mut()) {
        *o = dot_scalar(row, a);
    }
}

/// Decodes the super-blocks of a Q4_K/Q5_K row into 32-value sub-blocks:
/// `value(block, j, l)` as in [`k_dot_scalar`], `d * scale` and `dmin * min`.
pub(crate) fn k_decode_row(
    row: &[u8],
    block_bytes: usize,
    out: &mut [Decoded],
    value: impl Fn(&[u8], usize, usize) -> u8,
) {
    for (block, o) in row.chunks_exact(block_bytes).zip(out.chunks_exact_mut(8)) {
        let d = f16_le(*arr::<2>(block));
        let dmin = f16_le(*arr::<2>(&block[2..]));
        let (sc, mn) = k_scales_mins(arr::<12>(&block[4..]));
        for (j, o) in o.iter_mut().enumerate() {
            o.v = std::array::from_fn(|l| value(block, j, l) as i8);
            o.f0 = d * sc[j] as f32;
            o.f1 = dmin * mn[j] as f32;
        }
    }
}

/// Marker type for the multi-row kernels.
pub(crate) struct Q4K;

impl MultiRow for Q4K {
    const FOLD: Fold = Fold::KMin;
    const SIGNED: bool = false;
    // 4-bit values: 8 steps of pair sums stay below 8 * 2 * 15 * 127.
    const STEPS: usize = 8;
    const OFFSET: i32 = 0;

    fn row_bytes(nb: usize) -> usize {
        nb / 8 * BLOCK_BYTES
    }

    fn decode_row(row: &[u8], out: &mut [Decoded]) {
        k_decode_row(row, BLOCK_BYTES, out, value);
    }

    /// # Safety
    /// As [`MultiRow::pack_group`]: AVX2, FMA and F16C available; `row`
    /// covers `nb` blocks and `8 * g < nb`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn pack_group(row: *const u8, g: usize, _nb: usize, out: &mut super::multi_row::WGroup) {
        unsafe { avx2::pack_group(row.add(g * BLOCK_BYTES), out) }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use super::BLOCK_BYTES;
    use crate::quant::multi_row::{store_vertical, WGroup};
    use crate::quant::q8_act::ActRow;
    use crate::simd::avx2::*;
    use std::arch::x86_64::*;

    /// The 8 scales (bytes 0..8) and 8 mins (bytes 8..16) of the Q4_K/Q5_K
    /// super-block at `bp`: [`k_scales_mins`](crate::quant::k_scales_mins),
    /// unpacked a 32-bit word at a time.
    ///
    /// # Safety
    /// AVX2, FMA and F16C available; `bp + 4..bp + 16` readable.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn scales_mins(bp: *const u8) -> __m128i {
        unsafe {
            let word =
                |k: usize| u32::from_le_bytes(std::ptr::read_unaligned(bp.add(4 + 4 * k).cast()));
            let (p0, p1, p2) = (word(0), word(1), word(2));
            let (low6, low4, top2) = (0x3F3F_3F3F, 0x0F0F_0F0F, 0x0303_0303);
            let sc_lo = p0 & low6;
            let sc_hi = (p2 & low4) | (((p0 >> 6) & top2) << 4);
            let mn_lo = p1 & low6;
            let mn_hi = ((p2 >> 4) & low4) | (((p1 >> 6) & top2) << 4);
            _mm_setr_epi32(sc_lo as i32, sc_hi as i32, mn_lo as i32, mn_hi as i32)
        }
    }

    /// Folds the 8 exact sub-block dots `isum` (lane `j`: sub-block `j`) of the
    /// Q4_K/Q5_K super-block at `bp` into `acc`, lane `j` exactly as
    /// [`fold_scaled_min`](crate::quant::fold_scaled_min) with activation
    /// scale `da[j]` and sum `bs[j]`.
    ///
    /// # Safety
    /// AVX2, FMA and F16C available; `bp..bp + 16`, `da..da + 8` and
    /// `bs..bs + 8` readable.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn fold_super(
        acc: __m256,
        bp: *const u8,
        isum: __m256i,
        da: *const f32,
        bs: *const i16,
    ) -> __m256 {
        unsafe {
            // Lane 0: d, lane 1: dmin (exact conversions).
            let dd = _mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(
                bp.cast::<i32>(),
            )));
            let d = _mm256_broadcastss_ps(dd);
            let dmin = _mm256_broadcastss_ps(_mm_movehdup_ps(dd));
            let sm = scales_mins(bp);
            let ds = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sm)));
            let mins = _mm256_cvtepu8_epi32(_mm_unpackhi_epi64(sm, sm));
            let dm = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(mins));
            let asum = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(load_128(bs.cast())));
            let inner = _mm256_fmsub_ps(ds, _mm256_cvtepi32_ps(isum), _mm256_mul_ps(dm, asum));
            _mm256_fmadd_ps(load_ps(da), inner, acc)
        }
    }

    /// The scale terms of the Q4_K/Q5_K super-block at `bp` for the multi-row
    /// kernel: `f0[j] = d * scale[j]`, `f1[j] = dmin * min[j]`, computed as in
    /// [`fold_super`].
    ///
    /// # Safety
    /// AVX2, FMA and F16C available; `bp..bp + 16` readable.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn k_params(bp: *const u8, out: &mut WGroup) {
        unsafe {
            let dd = _mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(
                bp.cast::<i32>(),
            )));
            let d = _mm256_broadcastss_ps(dd);
            let dmin = _mm256_broadcastss_ps(_mm_movehdup_ps(dd));
            let sm = scales_mins(bp);
            let ds = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sm)));
            let mins = _mm256_cvtepu8_epi32(_mm_unpackhi_epi64(sm, sm));
            let dm = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(mins));
            _mm256_storeu_ps(out.f0.as_mut_ptr(), ds);
            _mm256_storeu_ps(out.f1.as_mut_ptr(), dm);
        }
    }

    /// Packs the super-block at `bp` for the multi-row kernel.
    ///
    /// # Safety
    /// AVX2, FMA and F16C available; `bp..bp + BLOCK_BYTES` readable.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn pack_group(bp: *const u8, out: &mut WGroup) {
        unsafe {
            let low4 = _mm256_set1_epi8(0x0F);
            let mut v = [_mm256_setzero_si256(); 8];
            for c in 0..4 {
                let q = load_256(bp.add(16 + 32 * c));
                v[2 * c] = _mm256_and_si256(q, low4);
                v[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
            }
            store_vertical(&v, out.u.as_mut_ptr());
            k_params(bp, out);
        }
    }

    /// The 8 exact dots of the super-block at `bp`'s sub-blocks (unsigned
    /// values, no scales) with the 256 values at `aq`; lane `j`: sub-block `j`.
    ///
    /// # Safety
    /// AVX2, FMA and F16C available; `bp..bp + BLOCK_BYTES` and
    /// `aq..aq + 256` readable.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn int_dots(bp: *const u8, aq: *const i8) -> __m256i {
        unsafe {
            let low4 = _mm256_set1_epi8(0x0F);
            let ones = _mm256_set1_epi16(1);
            let mut p = [_mm256_setzero_si256(); 8];
            for c in 0..4 {
                let q = load_256(bp.add(16 + 32 * c));
                let lo = _mm256_and_si256(q, low4);
                let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
                let y_lo = load_256(aq.add(64 * c).cast());
                let y_hi = load_256(aq.add(64 * c + 32).cast());
                p[2 * c] = _mm256_madd_epi16(dot_u8_i8_pairs(lo, y_lo), ones);
                p[2 * c + 1] = _mm256_madd_epi16(dot_u8_i8_pairs(hi, y_hi), ones);
            }
            transpose_sum_8(p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7])
        }
    }

    /// AVX2: `out[r] = dot(row r of w, a)`, bit-identical to
    /// [`super::dot_scalar`].
    ///
    /// # Safety
    /// AVX2, FMA and F16C must be available.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn rows(w: &[u8], row_bytes: usize, a: ActRow<'_>, out: &mut [f32]) {
        unsafe {
            let nb = a.d.len();
            let ns = nb / 8;
            assert!(
                nb.is_multiple_of(8)
                    && row_bytes == ns * BLOCK_BYTES
                    && a.qs.len() == nb * 32
                    && a.bsums.len() == nb
                    && w.len() >= out.len() * row_bytes,
                "Q4_K kernel: inconsistent shapes"
            );
            let (qs, d, bs) = (a.qs.as_ptr(), a.d.as_ptr(), a.bsums.as_ptr());
            for (row, o) in w.chunks_exact(row_bytes).zip(out.iter_mut()) {
                let mut acc = _mm256_setzero_ps();
                for s in 0..ns {
                    // In bounds: checked above.
                    let bp = row.as_ptr().add(s * BLOCK_BYTES);
                    let isum = int_dots(bp, qs.add(256 * s));
                    acc = fold_super(acc, bp, isum, d.add(8 * s), bs.add(8 * s));
                }
                *o = tree8_ps(acc);
            }
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use crate::simd::Isa;

    #[test]
    fn word_wise_scales_match_reference() {
        if !Isa::Avx2.is_available() {
            return;
        }
        let mut x = 0x9E37_79B9u32;
        for _ in 0..1000 {
            let mut block = [0u8; 16];
            for b in &mut block {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                *b = x as u8;
            }
            let (sc, mn) = crate::quant::k_scales_mins(crate::quant::arr::<12>(&block[4..]));
            let mut got = [0u8; 16];
            // SAFETY: AVX2 checked above; `block` is 16 bytes, `got` bounds the store.
            unsafe {
                let v = super::avx2::scales_mins(block.as_ptr());
                std::arch::x86_64::_mm_storeu_si128(got.as_mut_ptr().cast(), v);
            }
            assert_eq!(got[..8], sc);
            assert_eq!(got[8..], mn);
        }
    }
}
