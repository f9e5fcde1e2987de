//! Q2_0: blocks of 64 values `d * (q - 1)`, `q` two bits (values -1, 0, 1
//! or 2 times `d`).
//!
//! Layout (18 bytes): f16 `d`, then 16 bytes of codes; value `n` is bits
//! `2(n % 4)..2(n % 4) + 2` of byte `n / 4`. Dots fold as `Block32` with
//! scale `d` for each 32-value block.

use super::decoded;
use super::decoded::BlockDecode;
use super::multi_row::{Decoded, Fold};
use super::registry::QuantType;
use super::{arr, f16_le};
use spindle_formats::GgmlType;

/// This type's entry in the kernels' registry.
pub(crate) const TYPE: QuantType = QuantType::quantized(
    GgmlType::Q2_0,
    dequantize,
    &[0],
    false,
    decoded::kernels::<Q2_0>,
);

/// Bytes per block.
pub const BLOCK_BYTES: usize = 18;

/// Value `n` (0..64) of the 16 code bytes `qs`, as -1..=2.
#[inline(always)]
fn value(qs: &[u8], n: usize) -> i8 {
    ((qs[n / 4] >> (2 * (n % 4))) & 3) as i8 - 1
}

/// Scalar reference dequantization (as ggml: `(q - 1) * d`, one rounding).
pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (block, out) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(64)) {
        let d = f16_le(*arr::<2>(block));
        for (n, o) in out.iter_mut().enumerate() {
            *o = value(&block[2..], n) as f32 * d;
        }
    }
}

pub(crate) struct Q2_0;

impl BlockDecode for Q2_0 {
    const FOLD: Fold = Fold::Block32;
    const SIGNED: bool = true;
    // |v| <= 2: 8 * 2 * 2 * 127 fits int16.
    const STEPS: usize = 8;
    const BLOCK_LEN: usize = 64;
    const BLOCK_BYTES: usize = BLOCK_BYTES;

    #[inline(always)]
    fn decode(block: &[u8], out: &mut [Decoded]) {
        Self::decode_terms(block, out);
        for (t, o) in out.iter_mut().enumerate().take(2) {
            o.v = std::array::from_fn(|l| value(&block[2..], 32 * t + l));
        }
    }

    const SIMD_VALUES: bool = true;

    #[inline(always)]
    fn decode_terms(block: &[u8], out: &mut [Decoded]) {
        let d = f16_le(*arr::<2>(block));
        for o in out.iter_mut().take(2) {
            o.f0 = d;
        }
    }

    /// Block `j`'s 8 code bytes (`2 + 8j..2 + 8j + 8`) to 32 values: the
    /// four 2-bit fields of every byte masked out (`t_p = (b >> 2p) & 3`),
    /// then interleaved so byte `k` gives values `4k..4k + 4`, minus 1.
    ///
    /// # Safety
    /// As [`BlockDecode::values_avx2`].
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn values_avx2(p: *const u8, j: usize) -> std::arch::x86_64::__m256i {
        use std::arch::x86_64::*;
        unsafe {
            let x = _mm_loadl_epi64(p.add(2 + 8 * j).cast());
            let three = _mm_set1_epi8(3);
            // 16-bit shifts pull the upper byte's bits into the top of the
            // lower one; the mask keeps only each byte's own two bits.
            let t0 = _mm_and_si128(x, three);
            let t1 = _mm_and_si128(_mm_srli_epi16(x, 2), three);
            let t2 = _mm_and_si128(_mm_srli_epi16(x, 4), three);
            let t3 = _mm_and_si128(_mm_srli_epi16(x, 6), three);
            let t01 = _mm_unpacklo_epi8(t0, t1);
            let t23 = _mm_unpacklo_epi8(t2, t3);
            let lo = _mm_unpacklo_epi16(t01, t23);
            let hi = _mm_unpackhi_epi16(t01, t23);
            _mm256_sub_epi8(_mm256_set_m128i(hi, lo), _mm256_set1_epi8(1))
        }
    }
}
