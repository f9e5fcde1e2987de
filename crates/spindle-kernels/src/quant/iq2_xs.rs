//! IQ2_XS: super-blocks of 256 values; each group of 8 values is a row of
//! a 512-entry grid (magnitudes 8, 25, 43) with signs, and each 16 values
//! have a 4-bit scale `s`.
//!
//! Layout (74 bytes): f16 `d`, 32 little-endian u16 (per group of 8: a
//! 9-bit grid index and a 7-bit sign index into [`KSIGNS`]), 8 bytes of
//! scales (16 values `j`: byte `j / 2`, nibble `j % 2`). Value: `d * (0.5 +
//! s) * 0.25 * grid * sign`. Dots fold as `Q6` with the integer scales `2s
//! + 1` and `d / 8`, the same products.

use super::decoded;
use super::decoded::BlockDecode;
use super::grid;
use super::iq_grids::{IQ2XS_GRID, KSIGNS};
use super::multi_row::{Decoded, Fold};
use super::registry::QuantType;
use super::{arr, f16_le};
use spindle_formats::GgmlType;
use std::marker::PhantomData;

/// This type's entry in the kernels' registry.
pub(crate) const TYPE: QuantType = QuantType::quantized(
    GgmlType::IQ2_XS,
    dequantize,
    &[0],
    true,
    decoded::kernels::<Iq2Xs>,
);

/// Bytes per super-block.
pub const BLOCK_BYTES: usize = 74;

/// Where an IQ2_XS-shaped super-block (f16 `d` first, a grid row and sign
/// byte per group of 8, a 4-bit scale per 16 values) keeps its fields:
/// IQ2_XS and IQ2_S differ only in this.
pub(crate) trait Iq2Layout {
    const BLOCK_BYTES: usize;
    /// Group `k`'s (0..32) grid row and sign byte.
    fn group(block: &[u8], k: usize) -> (u64, u8);
    /// The 4-bit scale of values `16j..16j + 16`.
    fn scale(block: &[u8], j: usize) -> u8;
}

/// IQ2_XS's layout.
pub(crate) struct XsLayout;

impl Iq2Layout for XsLayout {
    const BLOCK_BYTES: usize = BLOCK_BYTES;

    #[inline(always)]
    fn group(block: &[u8], k: usize) -> (u64, u8) {
        let q = u16::from_le_bytes(*arr::<2>(&block[2 + 2 * k..]));
        (IQ2XS_GRID[(q & 511) as usize], KSIGNS[(q >> 9) as usize])
    }

    #[inline(always)]
    fn scale(block: &[u8], j: usize) -> u8 {
        (block[66 + j / 2] >> (4 * (j % 2))) & 0x0F
    }
}

/// Scalar reference dequantization of a layout `L` super-block.
pub(crate) fn dequantize_layout<L: Iq2Layout>(src: &[u8], dst: &mut [f32]) {
    for (block, out) in src
        .chunks_exact(L::BLOCK_BYTES)
        .zip(dst.chunks_exact_mut(256))
    {
        let d = f16_le(*arr::<2>(block));
        for (n, o) in out.iter_mut().enumerate() {
            let db = d * (0.5 + L::scale(block, n / 16) as f32) * 0.25;
            let (row, signs) = L::group(block, n / 8);
            *o = grid::scaled(db, grid::value(row, n % 8), signs, n % 8);
        }
    }
}

/// Scalar reference dequantization.
pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    dequantize_layout::<XsLayout>(src, dst)
}

/// The decoded form of a layout `L` type.
pub(crate) struct Iq2<L>(PhantomData<L>);

pub(crate) type Iq2Xs = Iq2<XsLayout>;

impl<L: Iq2Layout> BlockDecode for Iq2<L> {
    const FOLD: Fold = Fold::Q6;
    const SIGNED: bool = true;
    const STEPS: usize = 2;
    const BLOCK_LEN: usize = 256;
    const BLOCK_BYTES: usize = L::BLOCK_BYTES;

    #[inline(always)]
    fn decode(block: &[u8], out: &mut [Decoded]) {
        Self::decode_terms(block, out);
        for (t, o) in out.iter_mut().enumerate().take(8) {
            o.v = std::array::from_fn(|l| {
                let (row, signs) = L::group(block, 4 * t + l / 8);
                grid::signed(grid::value(row, l % 8), signs, l % 8)
            });
        }
    }

    const SIMD_VALUES: bool = true;

    #[inline(always)]
    fn decode_terms(block: &[u8], out: &mut [Decoded]) {
        let d = f16_le(*arr::<2>(block));
        for (t, o) in out.iter_mut().enumerate().take(8) {
            o.f0 = d * 0.125;
            o.sc = [0, 1].map(|h| (2 * L::scale(block, 2 * t + h) + 1) as i8);
        }
    }

    /// # Safety
    /// As [`BlockDecode::values_avx2`].
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn values_avx2(p: *const u8, t: usize) -> std::arch::x86_64::__m256i {
        // SAFETY: the caller vouches for a whole storage block at `p`.
        let block = unsafe { std::slice::from_raw_parts(p, L::BLOCK_BYTES) };
        // Written out: `array::from_fn` here is not inlined (perf).
        let (g0, g1, g2, g3) = (
            L::group(block, 4 * t),
            L::group(block, 4 * t + 1),
            L::group(block, 4 * t + 2),
            L::group(block, 4 * t + 3),
        );
        unsafe { grid::signed_rows_avx2([g0.0, g1.0, g2.0, g3.0], [g0.1, g1.1, g2.1, g3.1]) }
    }
}
