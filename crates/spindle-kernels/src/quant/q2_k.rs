//! Q2_K: super-blocks of 256 values in 16 sub-blocks of 16, `d * sc * q -
//! dmin * m` with 2-bit `q` and a 4-bit scale `sc` and min `m` per
//! sub-block.
//!
//! Layout (84 bytes): 16 bytes of scales (low nibble `sc`, high nibble `m`,
//! sub-block `j` in byte `j`), 64 bytes of 2-bit codes (value `n` is bits
//! `2k..2k+2` of byte `32c + i`, `n = 128c + 32k + i`), f16 `d`, f16 `dmin`.
//!
//! Dots fold as [`Fold::Q2`]: a 32-value block meets sub-blocks `2t` and
//! `2t + 1`; its exact integer dot carries their scales, its min term their
//! mins times the half-block activation sums.

use super::decoded;
use super::decoded::BlockDecode;
use super::multi_row::{Decoded, Fold};
use super::registry::QuantType;
use super::{arr, f16_le};
use spindle_formats::GgmlType;

/// This type's entry in the kernels' registry.
pub(crate) const TYPE: QuantType = QuantType::quantized(
    GgmlType::Q2_K,
    dequantize,
    // d and dmin after 16 scale bytes and 64 of codes.
    &[80, 82],
    true,
    decoded::kernels::<Q2K>,
);

/// Bytes per super-block.
pub const BLOCK_BYTES: usize = 84;

/// The 2-bit value `n` (0..256) of `block`.
#[inline]
fn value(block: &[u8], n: usize) -> u8 {
    let (c, k, i) = (n / 128, (n % 128) / 32, n % 32);
    (block[16 + 32 * c + i] >> (2 * k)) & 3
}

/// Scalar reference dequantization (as gguf-py: `(d * sc) * q - dmin * m`).
pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (block, out) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(256)) {
        let d = f16_le(*arr::<2>(&block[80..]));
        let dmin = f16_le(*arr::<2>(&block[82..]));
        for (n, o) in out.iter_mut().enumerate() {
            let s = block[n / 16];
            let dl = d * (s & 0x0F) as f32;
            let ml = dmin * (s >> 4) as f32;
            *o = dl * value(block, n) as f32 - ml;
        }
    }
}

pub(crate) struct Q2K;

impl BlockDecode for Q2K {
    const FOLD: Fold = Fold::Q2;
    const SIGNED: bool = false;
    // Four steps are one 16-value sub-block (the scale widening needs it).
    const STEPS: usize = 4;
    const BLOCK_LEN: usize = 256;
    const BLOCK_BYTES: usize = BLOCK_BYTES;

    #[inline(always)]
    fn decode(block: &[u8], out: &mut [Decoded]) {
        Self::decode_terms(block, out);
        for (t, o) in out.iter_mut().enumerate().take(8) {
            o.v = std::array::from_fn(|l| value(block, 32 * t + l) as i8);
        }
    }

    const SIMD_VALUES: bool = true;

    /// # Safety
    /// As [`BlockDecode::values_avx2`].
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn values_avx2(p: *const u8, t: usize) -> std::arch::x86_64::__m256i {
        unsafe { two_bit_avx2(p.add(16), t) }
    }

    #[inline(always)]
    fn decode_terms(block: &[u8], out: &mut [Decoded]) {
        let d = f16_le(*arr::<2>(&block[80..]));
        let dmin = f16_le(*arr::<2>(&block[82..]));
        for (t, o) in out.iter_mut().enumerate().take(8) {
            o.f0 = d;
            o.f1 = dmin;
            let (lo, hi) = (block[2 * t], block[2 * t + 1]);
            o.sc = [(lo & 0x0F) as i8, (hi & 0x0F) as i8];
            o.mn = [lo >> 4, hi >> 4];
        }
    }
}

/// AVX2: values `32t..32t + 32` of 2-bit codes laid out as in Q2_K and
/// Q3_K (value `n = 128c + 32k + i` in bits `2k..2k+2` of byte `32c + i` of
/// the 64 bytes at `qs`).
///
/// # Safety
/// AVX2, FMA and F16C available; `qs..qs + 64` readable; `t < 8`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn two_bit_avx2(qs: *const u8, t: usize) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    unsafe {
        let bytes = _mm256_loadu_si256(qs.add(32 * (t / 4)).cast());
        let shifted = _mm256_srl_epi16(bytes, _mm_cvtsi32_si128(2 * (t % 4) as i32));
        _mm256_and_si256(shifted, _mm256_set1_epi8(3))
    }
}
