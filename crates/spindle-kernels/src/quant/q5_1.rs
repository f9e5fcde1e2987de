//! Q5_1: blocks of 32 values, `d * q + m` with 5-bit `q`.
//!
//! Layout (24 bytes): f16 `d`, f16 `m`, a little-endian u32 of high bits
//! (bit `l` for value `l`), 16 bytes of low nibbles as in Q4_1. Dots fold
//! as `KMin` with min `-m`.

use super::arr;
use super::decoded;
use super::decoded::BlockDecode;
use super::multi_row::{Decoded, Fold};
use super::q4_1::{dequantize_min, min_terms, nibble};
use super::registry::QuantType;
use spindle_formats::GgmlType;

/// This type's entry in the kernels' registry.
pub(crate) const TYPE: QuantType = QuantType::quantized(
    GgmlType::Q5_1,
    dequantize,
    &[0, 2],
    false,
    decoded::kernels::<Q5_1>,
);

/// Bytes per block.
pub const BLOCK_BYTES: usize = 24;

/// The 5-bit value `l` of `block`.
#[inline]
fn value(block: &[u8], l: usize) -> u8 {
    let qh = u32::from_le_bytes(*arr::<4>(&block[4..]));
    nibble(&block[8..], l) | ((((qh >> l) & 1) as u8) << 4)
}

/// Scalar reference dequantization (as gguf-py: `d * q + m`).
pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    dequantize_min(src, dst, BLOCK_BYTES, value);
}

pub(crate) struct Q5_1;

impl BlockDecode for Q5_1 {
    const FOLD: Fold = Fold::KMin;
    const SIGNED: bool = false;
    // 5-bit values: 4 * 2 * 31 * 127 fits int16.
    const STEPS: usize = 4;
    const BLOCK_LEN: usize = 32;
    const BLOCK_BYTES: usize = BLOCK_BYTES;

    #[inline(always)]
    fn decode(block: &[u8], out: &mut [Decoded]) {
        Self::decode_terms(block, out);
        out[0].v = std::array::from_fn(|l| value(block, l) as i8);
    }

    const SIMD_VALUES: bool = true;

    #[inline(always)]
    fn decode_terms(block: &[u8], out: &mut [Decoded]) {
        min_terms(block, out);
    }

    /// # Safety
    /// As [`BlockDecode::values_avx2`].
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn values_avx2(p: *const u8, _j: usize) -> std::arch::x86_64::__m256i {
        use crate::simd::avx2::{bits_to_bytes, load_128, nibbles_16};
        use std::arch::x86_64::*;
        unsafe {
            let qh = u32::from_le_bytes([*p.add(4), *p.add(5), *p.add(6), *p.add(7)]);
            let fifth = _mm256_and_si256(bits_to_bytes(qh), _mm256_set1_epi8(0x10));
            _mm256_or_si256(nibbles_16(load_128(p.add(8))), fifth)
        }
    }
}
