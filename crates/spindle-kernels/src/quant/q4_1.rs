//! Q4_1: blocks of 32 values, `d * q + m` with 4-bit `q`.
//!
//! Layout (20 bytes): f16 `d`, f16 `m`, 16 bytes of nibbles (value `l` is
//! the low nibble of byte `l` for `l < 16`, the high nibble of byte `l - 16`
//! after). Dots fold as `KMin` with min `-m`: `fma(d, isum, m * sum(a))`.

use super::decoded;
use super::decoded::BlockDecode;
use super::multi_row::{Decoded, Fold};
use super::registry::QuantType;
use super::{arr, f16_le};
use spindle_formats::GgmlType;

/// This type's entry in the kernels' registry.
pub(crate) const TYPE: QuantType = QuantType::quantized(
    GgmlType::Q4_1,
    dequantize,
    &[0, 2],
    false,
    decoded::kernels::<Q4_1>,
);

/// Bytes per block.
pub const BLOCK_BYTES: usize = 20;

/// Value `l` (0..32) of the 16 nibble bytes `qs`.
#[inline]
pub(crate) fn nibble(qs: &[u8], l: usize) -> u8 {
    if l < 16 {
        qs[l] & 0x0F
    } else {
        qs[l - 16] >> 4
    }
}

/// Scalar reference dequantization of a `d`, `m` block type (Q4_1, Q5_1) of
/// `block_bytes` whose unsigned value `l` is `value(block, l)`: as gguf-py,
/// `d * q + m`, two roundings.
pub(crate) fn dequantize_min(
    src: &[u8],
    dst: &mut [f32],
    block_bytes: usize,
    value: impl Fn(&[u8], usize) -> u8,
) {
    for (block, out) in src.chunks_exact(block_bytes).zip(dst.chunks_exact_mut(32)) {
        let d = f16_le(*arr::<2>(block));
        let m = f16_le(*arr::<2>(&block[2..]));
        for (l, o) in out.iter_mut().enumerate() {
            *o = d * value(block, l) as f32 + m;
        }
    }
}

/// The float terms of a `d`, `m` block: `KMin` with scale `d`, min `-m`.
#[inline(always)]
pub(crate) fn min_terms(block: &[u8], out: &mut [Decoded]) {
    out[0].f0 = f16_le(*arr::<2>(block));
    out[0].f1 = -f16_le(*arr::<2>(&block[2..]));
}

/// Scalar reference dequantization.
pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    dequantize_min(src, dst, BLOCK_BYTES, |block, l| nibble(&block[4..], l));
}

pub(crate) struct Q4_1;

impl BlockDecode for Q4_1 {
    const FOLD: Fold = Fold::KMin;
    const SIGNED: bool = false;
    // 4-bit values: 8 * 2 * 15 * 127 fits int16.
    const STEPS: usize = 8;
    const BLOCK_LEN: usize = 32;
    const BLOCK_BYTES: usize = BLOCK_BYTES;

    #[inline(always)]
    fn decode(block: &[u8], out: &mut [Decoded]) {
        Self::decode_terms(block, out);
        out[0].v = std::array::from_fn(|l| nibble(&block[4..], l) as i8);
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
        use crate::simd::avx2::{load_128, nibbles_16};
        unsafe { nibbles_16(load_128(p.add(4))) }
    }
}
