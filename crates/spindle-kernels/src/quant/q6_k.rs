//! Q6_K: super-blocks of 256 values in 16 sub-blocks of 16.
//!
//! Layout (210 bytes): 128 bytes `ql` of low nibbles, 64 bytes `qh` of high
//! 2-bit pairs, 16 signed 8-bit scales, f16 `d`. The super-block is two halves
//! of 128; half `h` uses `ql[64h..64h+64]`, `qh[32h..32h+32]`. Within a half,
//! value `l` (0..32) of group `g` (0..4) is
//!
//! * g0: `ql[l]` low nibble, `qh[l]` bits 0..2
//! * g1: `ql[l+32]` low nibble, `qh[l]` bits 2..4
//! * g2: `ql[l]` high nibble, `qh[l]` bits 4..6
//! * g3: `ql[l+32]` high nibble, `qh[l]` bits 6..8
//!
//! and the 6-bit `u` stands for `d * scale[k] * (u - 32)`, `k` = index / 16.

use super::q8_act::ActRow;
use super::{arr, f16_le, fold_scaled};
use crate::simd::tree8;

/// Bytes per super-block.
pub const BLOCK_BYTES: usize = 210;

/// The 6-bit unsigned value `l` (0..32) of group `g` of half `h`.
#[inline]
fn value(block: &[u8], h: usize, g: usize, l: usize) -> u8 {
    let ql = &block[64 * h..64 * h + 64];
    let qh = block[128 + 32 * h + l];
    let nibble = match g {
        0 => ql[l] & 0x0F,
        1 => ql[l + 32] & 0x0F,
        2 => ql[l] >> 4,
        _ => ql[l + 32] >> 4,
    };
    nibble | (((qh >> (2 * g)) & 3) << 4)
}

/// The signed 8-bit scale of sub-block `k` (0..16).
#[inline]
fn scale(block: &[u8], k: usize) -> i8 {
    block[192 + k] as i8
}

/// Scalar reference dequantization; `src` is whole super-blocks, `dst` 256
/// values per super-block.
pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (block, out) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(256)) {
        let d = f16_le(*arr::<2>(&block[208..]));
        for h in 0..2 {
            for g in 0..4 {
                for l in 0..32 {
                    let i = 128 * h + 32 * g + l;
                    let ds = d * scale(block, i / 16) as f32;
                    out[i] = ds * (value(block, h, g, l) as i32 - 32) as f32;
                }
            }
        }
    }
}

/// `sum_k scale[k] * dot_k` of one super-block with 256 activation values.
fn int_dot(block: &[u8], aq: &[i8]) -> i32 {
    let mut sums = [0i32; 16];
    for h in 0..2 {
        for g in 0..4 {
            for l in 0..32 {
                let i = 128 * h + 32 * g + l;
                sums[i / 16] += (value(block, h, g, l) as i32 - 32) * aq[i] as i32;
            }
        }
    }
    (0..16).map(|k| scale(block, k) as i32 * sums[k]).sum()
}

/// Scalar reference: dot of one weight row with one `Block256` activation
/// row. Super-block `s` folds into lane `s % 8`.
pub(crate) fn dot_scalar(w: &[u8], a: ActRow<'_>) -> f32 {
    let mut lanes = [0.0f32; 8];
    for (s, ((block, aq), &da)) in w
        .chunks_exact(BLOCK_BYTES)
        .zip(a.qs.chunks_exact(256))
        .zip(a.d)
        .enumerate()
    {
        let d = f16_le(*arr::<2>(&block[208..]));
        fold_scaled(&mut lanes[s % 8], d, da, int_dot(block, aq));
    }
    tree8(&lanes)
}

/// Scalar: `out[r] = dot(row r of w, a)`.
pub(crate) fn rows_scalar(w: &[u8], row_bytes: usize, a: ActRow<'_>, out: &mut [f32]) {
    for (row, o) in w.chunks_exact(row_bytes).zip(out.iter_mut()) {
        *o = dot_scalar(row, a);
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use super::BLOCK_BYTES;
    use crate::quant::q8_act::ActRow;
    use crate::quant::{arr, f16_le, fold_scaled};
    use crate::simd::avx2::*;
    use crate::simd::tree8;
    use std::arch::x86_64::*;

    /// `pshufb` controls spreading int16 scale `2g` over the low 128-bit lane
    /// and scale `2g + 1` over the high one.
    const SCALE_PAIR: [__m256i; 4] = {
        const fn ctrl(g: usize) -> __m256i {
            let lo = (4 * g) as u8;
            let mut b = [0u8; 32];
            let mut i = 0;
            while i < 16 {
                b[i] = lo + (i % 2) as u8;
                b[16 + i] = lo + 2 + (i % 2) as u8;
                i += 1;
            }
            // SAFETY: 32 bytes reinterpreted as a 256-bit vector.
            unsafe { std::mem::transmute::<[u8; 32], __m256i>(b) }
        }
        [ctrl(0), ctrl(1), ctrl(2), ctrl(3)]
    };

    /// `sum_k scale[k] * dot_k` of the super-block at `bp` with the 256
    /// values at `aq`, exact. The 6-bit values are multiplied unsigned; the
    /// `- 32` offset is taken off afterwards as `32 * sum_k scale[k] * asum_k`,
    /// from the activation's per-16 sums.
    ///
    /// # Safety
    /// AVX2 available; `bp..bp + BLOCK_BYTES` and `aq..aq + 256` readable.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn int_dot(bp: *const u8, scales: &[u8; 16], aq: *const i8, bsums: &[i16]) -> i32 {
        let low4 = _mm256_set1_epi8(0x0F);
        let mut acc = _mm256_setzero_si256();
        for h in 0..2 {
            let ql0 = load_256(bp.add(64 * h));
            let ql1 = load_256(bp.add(64 * h + 32));
            let qh = load_256(bp.add(128 + 32 * h));
            // The half's 8 scales as int16, in both 128-bit lanes.
            // (An 8-byte read: the block ends 2 bytes after the scales.)
            let sc8 = std::ptr::read_unaligned(bp.add(192 + 8 * h).cast::<i64>());
            let sc = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(_mm_cvtsi64_si128(sc8)));
            let q = [
                _mm256_or_si256(
                    _mm256_and_si256(ql0, low4),
                    _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(0x03)), 4),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(ql1, low4),
                    _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(0x0C)), 2),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4),
                    _mm256_and_si256(qh, _mm256_set1_epi8(0x30)),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4),
                    _mm256_srli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(0xC0u8 as i8)), 2),
                ),
            ];
            for (g, &qg) in q.iter().enumerate() {
                let y = load_256(aq.add(128 * h + 32 * g).cast());
                // Pair sums 0..8 cover values 0..16 (scale 2g of the half),
                // 8..16 the next 16 (scale 2g + 1): spread them to match.
                let scale = _mm256_shuffle_epi8(sc, SCALE_PAIR[g]);
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(dot_u8_i8_pairs(qg, y), scale));
            }
        }
        let mut offset = 0i32;
        for (k, &s) in scales.iter().enumerate() {
            offset += s as i8 as i32 * bsums[k] as i32;
        }
        hsum_i32(acc) - 32 * offset
    }

    /// AVX2 dot of one row; bit-identical to [`super::dot_scalar`].
    ///
    /// # Safety
    /// AVX2, FMA and F16C must be available; `w` is `a.d.len()` super-blocks.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot(w: &[u8], a: ActRow<'_>) -> f32 {
        let mut lanes = [0.0f32; 8];
        for (s, ((block, aq), (&da, bs))) in w
            .chunks_exact(BLOCK_BYTES)
            .zip(a.qs.chunks_exact(256))
            .zip(a.d.iter().zip(a.bsums.chunks_exact(16)))
            .enumerate()
        {
            let d = f16_le(*arr::<2>(&block[208..]));
            let isum = int_dot(block.as_ptr(), arr::<16>(&block[192..]), aq.as_ptr(), bs);
            fold_scaled(&mut lanes[s % 8], d, da, isum);
        }
        tree8(&lanes)
    }

    /// AVX2: `out[r] = dot(row r of w, a)`.
    ///
    /// # Safety
    /// AVX2, FMA and F16C must be available.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn rows(w: &[u8], row_bytes: usize, a: ActRow<'_>, out: &mut [f32]) {
        let nb = a.d.len();
        assert!(
            row_bytes == nb * BLOCK_BYTES
                && a.qs.len() == nb * 256
                && a.bsums.len() == nb * 16
                && w.len() >= out.len() * row_bytes,
            "Q6_K kernel: inconsistent shapes"
        );
        for (row, o) in w.chunks_exact(row_bytes).zip(out.iter_mut()) {
            *o = dot(row, a);
        }
    }
}
