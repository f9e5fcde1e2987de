//! IQ4_NL: blocks of 32 values, `d * K[q]` with 4-bit indices into a fixed
//! non-linear codebook `K`.
//!
//! Layout (18 bytes): f16 `d`, 16 bytes of nibbles as in Q4_1. Dots fold as
//! `Block32` on the codebook values (-127..=113, dotted with the sign trick).

use super::decoded;
use super::decoded::BlockDecode;
use super::multi_row::{Decoded, Fold};
use super::q4_1::nibble;
use super::registry::QuantType;
use super::{arr, f16_le};
use spindle_formats::GgmlType;

/// This type's entry in the kernels' registry.
pub(crate) const TYPE: QuantType = QuantType::quantized(
    GgmlType::IQ4_NL,
    dequantize,
    &[0],
    false,
    decoded::kernels::<Iq4Nl>,
);

/// Bytes per block.
pub const BLOCK_BYTES: usize = 18;

/// The codebook shared with IQ4_XS (ggml's `kvalues_iq4nl`).
pub(crate) const KVALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// Scalar reference dequantization.
pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (block, out) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(32)) {
        let d = f16_le(*arr::<2>(block));
        for (l, o) in out.iter_mut().enumerate() {
            *o = d * KVALUES[nibble(&block[2..], l) as usize] as f32;
        }
    }
}

pub(crate) struct Iq4Nl;

impl BlockDecode for Iq4Nl {
    const FOLD: Fold = Fold::Block32;
    const SIGNED: bool = true;
    // Magnitudes up to 127: one step before widening.
    const STEPS: usize = 1;
    const BLOCK_LEN: usize = 32;
    const BLOCK_BYTES: usize = BLOCK_BYTES;

    #[inline(always)]
    fn decode(block: &[u8], out: &mut [Decoded]) {
        Self::decode_terms(block, out);
        out[0].v = std::array::from_fn(|l| KVALUES[nibble(&block[2..], l) as usize]);
    }

    const SIMD_VALUES: bool = true;

    #[inline(always)]
    fn decode_terms(block: &[u8], out: &mut [Decoded]) {
        out[0].f0 = f16_le(*arr::<2>(block));
    }

    /// # Safety
    /// As [`BlockDecode::values_avx2`].
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn values_avx2(p: *const u8, _j: usize) -> std::arch::x86_64::__m256i {
        unsafe { codebook_avx2(p.add(2)) }
    }
}

/// AVX2: the 32 codebook values of the 16 nibble bytes at `qs` (value `l`
/// as in [`nibble`]).
///
/// # Safety
/// AVX2, FMA and F16C available; `qs..qs + 16` readable.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn codebook_avx2(qs: *const u8) -> std::arch::x86_64::__m256i {
    unsafe { table_avx2(&KVALUES, qs) }
}

/// AVX2: the 32 values `table[nibble]` of the 16 nibble bytes at `qs`
/// (value `l` as in [`nibble`]): one `pshufb` lookup (IQ4_NL, MXFP4).
///
/// # Safety
/// AVX2, FMA and F16C available; `qs..qs + 16` readable.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn table_avx2(table: &[i8; 16], qs: *const u8) -> std::arch::x86_64::__m256i {
    use crate::simd::avx2::{load_128, nibbles_16};
    use std::arch::x86_64::*;
    unsafe {
        let table = _mm256_broadcastsi128_si256(load_128(table.as_ptr().cast()));
        _mm256_shuffle_epi8(table, nibbles_16(load_128(qs)))
    }
}
