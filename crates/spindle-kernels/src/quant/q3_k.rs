//! Q3_K: super-blocks of 256 values in 16 sub-blocks of 16, `d * (s - 32) *
//! q` with `q` in -4..=3 and a 6-bit scale `s` per sub-block.
//!
//! Layout (110 bytes): 32 bytes `hmask`, 64 bytes of 2-bit low codes, 12
//! bytes of packed scales, f16 `d`. Value `n`: low bits `2k..2k+2` of byte
//! `32c + i` (`n = 128c + 32k + i`), minus 4 unless bit `n / 32` of
//! `hmask[n % 32]` is set. Scale `j`: nibble `j / 8` of byte `j % 8`, with
//! bits `2(j / 4)..` of byte `8 + j % 4` as its top 2 bits.
//!
//! Dots fold as [`Fold::Q6`]: the exact integer dot carries the two
//! sub-block scales of a 32-value block, scaled by `d`.

use super::decoded;
use super::decoded::BlockDecode;
use super::multi_row::{Decoded, Fold};
use super::registry::QuantType;
use super::{arr, f16_le};
use spindle_formats::GgmlType;

/// This type's entry in the kernels' registry.
pub(crate) const TYPE: QuantType = QuantType::quantized(
    GgmlType::Q3_K,
    dequantize,
    // d after 32 bytes of high bits, 64 of low bits, 12 of scales.
    &[108],
    true,
    decoded::kernels::<Q3K>,
);

/// Bytes per super-block.
pub const BLOCK_BYTES: usize = 110;

/// The value `n` (0..256) of `block`, in -4..=3.
#[inline]
fn value(block: &[u8], n: usize) -> i8 {
    let (c, k, i) = (n / 128, (n % 128) / 32, n % 32);
    let low = (block[32 + 32 * c + i] >> (2 * k)) & 3;
    let high = (block[n % 32] >> (n / 32)) & 1;
    low as i8 - if high == 0 { 4 } else { 0 }
}

/// The signed scale `s - 32` of sub-block `j` (0..16).
#[inline]
fn scale(block: &[u8], j: usize) -> i8 {
    let p = &block[96..108];
    let low = (p[j % 8] >> (4 * (j / 8))) & 0x0F;
    let high = (p[8 + j % 4] >> (2 * (j / 4))) & 3;
    (low | (high << 4)) as i8 - 32
}

/// Scalar reference dequantization (as gguf-py: `(d * scale) * q`).
pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (block, out) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(256)) {
        let d = f16_le(*arr::<2>(&block[108..]));
        for (n, o) in out.iter_mut().enumerate() {
            let dl = d * scale(block, n / 16) as f32;
            *o = dl * value(block, n) as f32;
        }
    }
}

pub(crate) struct Q3K;

impl BlockDecode for Q3K {
    const FOLD: Fold = Fold::Q6;
    const SIGNED: bool = true;
    const STEPS: usize = 4;
    const BLOCK_LEN: usize = 256;
    const BLOCK_BYTES: usize = BLOCK_BYTES;

    #[inline(always)]
    fn decode(block: &[u8], out: &mut [Decoded]) {
        Self::decode_terms(block, out);
        for (t, o) in out.iter_mut().enumerate().take(8) {
            o.v = std::array::from_fn(|l| value(block, 32 * t + l));
        }
    }

    const SIMD_VALUES: bool = true;

    /// # Safety
    /// As [`BlockDecode::values_avx2`].
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn values_avx2(p: *const u8, t: usize) -> std::arch::x86_64::__m256i {
        use std::arch::x86_64::*;
        unsafe {
            let low = super::q2_k::two_bit_avx2(p.add(32), t);
            // Bit `t` of each hmask byte clear: take 4 off.
            let hmask = _mm256_loadu_si256(p.cast());
            let bit = _mm256_set1_epi8((1u8 << t) as i8);
            let clear = _mm256_cmpeq_epi8(_mm256_and_si256(hmask, bit), _mm256_setzero_si256());
            _mm256_sub_epi8(low, _mm256_and_si256(clear, _mm256_set1_epi8(4)))
        }
    }

    #[inline(always)]
    fn decode_terms(block: &[u8], out: &mut [Decoded]) {
        let d = f16_le(*arr::<2>(&block[108..]));
        for (t, o) in out.iter_mut().enumerate().take(8) {
            o.f0 = d;
            o.sc = [scale(block, 2 * t), scale(block, 2 * t + 1)];
        }
    }
}
