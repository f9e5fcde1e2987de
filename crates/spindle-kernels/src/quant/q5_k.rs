//! Q5_K: super-blocks of 256 values in 8 sub-blocks of 32.
//!
//! Layout (176 bytes): f16 `d`, f16 `dmin`, 12 bytes of packed 6-bit scales and
//! mins (as Q4_K), 32 bytes `qh` of fifth bits, 128 bytes of low nibbles. As in
//! Q4_K, chunk `c` of 64 values is bytes `32c..32c+32` of the nibbles (low
//! nibbles: sub-block `2c`, high: `2c+1`); bit `j` of `qh[l]` is bit 4 of value
//! `l` of sub-block `j`. Value `q` of sub-block `j` stands for
//! `d * scale[j] * q - dmin * min[j]`.
//!
//! Dot products take `Block32` activations and fold exactly as Q4_K's: sub-block
//! `j` of super-block `s` into lane `(8s + j) % 8`.

use super::kernels::{block32_act, Kernel, OneRow};
use super::multi_row::{Decoded, Fold, MultiRow};
use super::q4_k::k_decode_row;
use super::q8_act::ActRow;
use super::registry::QuantType;
use super::{arr, f16_le, k_dot_scalar, k_scales_mins};
use crate::simd::Isa;
use spindle_formats::GgmlType;

/// This type's entry in the kernels' registry.
pub(crate) const TYPE: QuantType = QuantType {
    #[cfg(target_arch = "x86_64")]
    vertical: Some(super::kernels::vertical::<Q5K>),
    ..QuantType::quantized(GgmlType::Q5_K, dequantize, &[0, 2], true, kernels)
};

/// The kernels on `isa`: one-row scalar and AVX2 (which AVX-512 machines
/// run too), multi-row scalar, AVX2 and `vpdpbusd zmm`.
pub(crate) fn kernels(isa: Isa) -> Option<Kernel> {
    block32_act::<Q5K>(
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
pub const BLOCK_BYTES: usize = 176;

/// The 5-bit value `l` (0..32) of chunk `c`: low (`hi == false`, sub-block
/// `2c`) or high (sub-block `2c+1`).
#[inline]
fn value(block: &[u8], c: usize, l: usize, hi: bool) -> u8 {
    let qh = block[16 + l];
    let q = block[48 + 32 * c + l];
    if hi {
        (q >> 4) | (((qh >> (2 * c + 1)) & 1) << 4)
    } else {
        (q & 0x0F) | (((qh >> (2 * c)) & 1) << 4)
    }
}

/// Scalar reference dequantization; `src` is whole super-blocks, `dst` 256
/// values per super-block.
pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (block, out) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(256)) {
        let d = f16_le(*arr::<2>(block));
        let dmin = f16_le(*arr::<2>(&block[2..]));
        let (sc, mn) = k_scales_mins(arr::<12>(&block[4..]));
        for c in 0..4 {
            let (d_lo, m_lo) = (d * sc[2 * c] as f32, dmin * mn[2 * c] as f32);
            let (d_hi, m_hi) = (d * sc[2 * c + 1] as f32, dmin * mn[2 * c + 1] as f32);
            for l in 0..32 {
                out[64 * c + l] = d_lo * value(block, c, l, false) as f32 - m_lo;
                out[64 * c + 32 + l] = d_hi * value(block, c, l, true) as f32 - m_hi;
            }
        }
    }
}

/// Scalar reference: dot of one weight row with one `Block32` activation row.
pub(crate) fn dot_scalar(w: &[u8], a: ActRow<'_>) -> f32 {
    k_dot_scalar(w, BLOCK_BYTES, a, |block, j, l| {
        value(block, j / 2, l, j % 2 == 1)
    })
}

/// Scalar: `out[r] = dot(row r of w, a)`.
pub(crate) fn rows_scalar(w: &[u8], row_bytes: usize, a: ActRow<'_>, out: &mut [f32]) {
    for (row, o) in w.chunks_exact(row_bytes).zip(out.iter_mut()) {
        *o = dot_scalar(row, a);
    }
}

/// Marker type for the multi-row kernels.
pub(crate) struct Q5K;

impl MultiRow for Q5K {
    const FOLD: Fold = Fold::KMin;
    const SIGNED: bool = false;
    // 5-bit values: 4 steps of pair sums stay below 4 * 2 * 31 * 127.
    const STEPS: usize = 4;
    const OFFSET: i32 = 0;

    fn row_bytes(nb: usize) -> usize {
        nb / 8 * BLOCK_BYTES
    }

    fn decode_row(row: &[u8], out: &mut [Decoded]) {
        k_decode_row(row, BLOCK_BYTES, out, |block, j, l| {
            value(block, j / 2, l, j % 2 == 1)
        });
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
    use crate::quant::q4_k::avx2::{fold_super, k_params};
    use crate::quant::q8_act::ActRow;
    use crate::simd::avx2::*;
    use std::arch::x86_64::*;

    /// The 8 unsigned 5-bit sub-blocks of the super-block at `bp`.
    ///
    /// # Safety
    /// AVX2, FMA and F16C available; `bp..bp + BLOCK_BYTES` readable.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn values(bp: *const u8) -> [__m256i; 8] {
        unsafe {
            let low4 = _mm256_set1_epi8(0x0F);
            let one = _mm256_set1_epi8(1);
            let two = _mm256_set1_epi8(2);
            let mut qh = load_256(bp.add(16));
            let mut v = [_mm256_setzero_si256(); 8];
            for c in 0..4 {
                let q = load_256(bp.add(48 + 32 * c));
                v[2 * c] = _mm256_or_si256(
                    _mm256_and_si256(q, low4),
                    _mm256_slli_epi16(_mm256_and_si256(qh, one), 4),
                );
                v[2 * c + 1] = _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(q, 4), low4),
                    _mm256_slli_epi16(_mm256_and_si256(qh, two), 3),
                );
                qh = _mm256_srli_epi16(qh, 2);
            }
            v
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
            store_vertical(&values(bp), out.u.as_mut_ptr());
            k_params(bp, out);
        }
    }

    /// The 8 exact dots of the super-block at `bp`'s sub-blocks (unsigned
    /// 5-bit values, no scales) with the 256 values at `aq`; lane `j`:
    /// sub-block `j`.
    ///
    /// # Safety
    /// AVX2, FMA and F16C available; `bp..bp + BLOCK_BYTES` and
    /// `aq..aq + 256` readable.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn int_dots(bp: *const u8, aq: *const i8) -> __m256i {
        unsafe {
            let low4 = _mm256_set1_epi8(0x0F);
            let one = _mm256_set1_epi8(1);
            let two = _mm256_set1_epi8(2);
            let ones = _mm256_set1_epi16(1);
            // Shifted right by 2 per chunk: bits 0 and 1 of each byte are then the
            // fifth bits of the chunk's low and high sub-blocks.
            let mut qh = load_256(bp.add(16));
            let mut p = [_mm256_setzero_si256(); 8];
            for c in 0..4 {
                let q = load_256(bp.add(48 + 32 * c));
                let lo = _mm256_or_si256(
                    _mm256_and_si256(q, low4),
                    _mm256_slli_epi16(_mm256_and_si256(qh, one), 4),
                );
                let hi = _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(q, 4), low4),
                    _mm256_slli_epi16(_mm256_and_si256(qh, two), 3),
                );
                qh = _mm256_srli_epi16(qh, 2);
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
                "Q5_K kernel: inconsistent shapes"
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
