//! IQ4_XS: super-blocks of 256 values in 8 sub-blocks of 32, `d * (ls - 32)
//! * K[q]` with the IQ4_NL codebook and a 6-bit scale `ls` per sub-block.
//!
//! Layout (136 bytes): f16 `d`, a little-endian u16 of the scales' high 2
//! bits (bits `2j..2j+2` for sub-block `j`), 4 bytes of their low nibbles
//! (sub-block `j`: byte `j / 2`, nibble `j % 2`), then 16 nibble bytes per
//! sub-block as in IQ4_NL. Dots fold as `Block32` with scale `d * (ls -
//! 32)`, exact in f32.

use super::decoded;
use super::decoded::BlockDecode;
use super::iq4_nl::KVALUES;
use super::multi_row::{Decoded, Fold};
use super::q4_1::nibble;
use super::registry::QuantType;
use super::{arr, f16_le};
use spindle_formats::GgmlType;

/// This type's entry in the kernels' registry.
pub(crate) const TYPE: QuantType = QuantType::quantized(
    GgmlType::IQ4_XS,
    dequantize,
    &[0],
    true,
    decoded::kernels::<Iq4Xs>,
);

/// Bytes per super-block.
pub const BLOCK_BYTES: usize = 136;

/// The scale of sub-block `j` (0..8): `d * (ls - 32)`.
#[inline]
fn sub_scale(block: &[u8], j: usize) -> f32 {
    let d = f16_le(*arr::<2>(block));
    let high = u16::from_le_bytes(*arr::<2>(&block[2..]));
    let low = (block[4 + j / 2] >> (4 * (j % 2))) & 0x0F;
    let ls = low | ((((high >> (2 * j)) & 3) as u8) << 4);
    d * (ls as i32 - 32) as f32
}

/// The codebook value `l` (0..32) of sub-block `j`.
#[inline]
fn value(block: &[u8], j: usize, l: usize) -> i8 {
    KVALUES[nibble(&block[8 + 16 * j..], l) as usize]
}

/// Scalar reference dequantization.
pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (block, out) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(256)) {
        for (j, sub) in out.chunks_exact_mut(32).enumerate() {
            let dl = sub_scale(block, j);
            for (l, o) in sub.iter_mut().enumerate() {
                *o = dl * value(block, j, l) as f32;
            }
        }
    }
}

pub(crate) struct Iq4Xs;

impl BlockDecode for Iq4Xs {
    const FOLD: Fold = Fold::Block32;
    const SIGNED: bool = true;
    const STEPS: usize = 1;
    const BLOCK_LEN: usize = 256;
    const BLOCK_BYTES: usize = BLOCK_BYTES;

    #[inline(always)]
    fn decode(block: &[u8], out: &mut [Decoded]) {
        Self::decode_terms(block, out);
        for (j, o) in out.iter_mut().enumerate().take(8) {
            o.v = std::array::from_fn(|l| value(block, j, l));
        }
    }

    const SIMD_VALUES: bool = true;

    #[inline(always)]
    fn decode_terms(block: &[u8], out: &mut [Decoded]) {
        for (j, o) in out.iter_mut().enumerate().take(8) {
            o.f0 = sub_scale(block, j);
        }
    }

    /// # Safety
    /// As [`BlockDecode::values_avx2`].
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn values_avx2(p: *const u8, j: usize) -> std::arch::x86_64::__m256i {
        unsafe { super::iq4_nl::codebook_avx2(p.add(8 + 16 * j)) }
    }
}
