//! IQ2_XXS: super-blocks of 256 values in 8 sub-blocks of 32; each group of
//! 8 values is a row of a 256-entry grid (magnitudes 8, 25, 43) with signs.
//!
//! Layout (66 bytes): f16 `d`, then per sub-block two little-endian u32:
//! the first holds 4 grid indices (one byte per group of 8), the second 4
//! sign indices of 7 bits (into [`KSIGNS`]) and the 4-bit scale `ls` in its
//! top bits. Value: `d * (0.5 + ls) * 0.25 * grid * sign`. Dots fold as
//! `Block32` with that scale.

use super::decoded;
use super::decoded::BlockDecode;
use super::grid;
use super::iq_grids::{IQ2XXS_GRID, KSIGNS};
use super::multi_row::{Decoded, Fold};
use super::registry::QuantType;
use super::{arr, f16_le};
use spindle_formats::GgmlType;

/// This type's entry in the kernels' registry.
pub(crate) const TYPE: QuantType = QuantType::quantized(
    GgmlType::IQ2_XXS,
    dequantize,
    &[0],
    true,
    decoded::kernels::<Iq2Xxs>,
);

/// Bytes per super-block.
pub const BLOCK_BYTES: usize = 66;

/// Sub-block `t`'s scale `d * (0.5 + ls) * 0.25`.
#[inline(always)]
fn sub_scale(block: &[u8], t: usize) -> f32 {
    let d = f16_le(*arr::<2>(block));
    let aux = u32::from_le_bytes(*arr::<4>(&block[2 + 8 * t + 4..]));
    d * (0.5 + (aux >> 28) as f32) * 0.25
}

/// Sub-block `t`'s scale, grid rows and sign bytes.
#[inline(always)]
fn sub_block(block: &[u8], t: usize) -> (f32, [u64; 4], [u8; 4]) {
    let q = &block[2 + 8 * t..];
    let aux = u32::from_le_bytes(*arr::<4>(&q[4..]));
    let db = sub_scale(block, t);
    let rows = std::array::from_fn(|k| IQ2XXS_GRID[q[k] as usize]);
    let signs = std::array::from_fn(|k| KSIGNS[((aux >> (7 * k)) & 0x7F) as usize]);
    (db, rows, signs)
}

/// Scalar reference dequantization.
pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (block, out) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(256)) {
        for (t, sub) in out.chunks_exact_mut(32).enumerate() {
            let (db, rows, signs) = sub_block(block, t);
            for (l, o) in sub.iter_mut().enumerate() {
                let (k, i) = (l / 8, l % 8);
                *o = grid::scaled(db, grid::value(rows[k], i), signs[k], i);
            }
        }
    }
}

pub(crate) struct Iq2Xxs;

impl BlockDecode for Iq2Xxs {
    const FOLD: Fold = Fold::Block32;
    const SIGNED: bool = true;
    // Magnitudes up to 43: 2 * 2 * 43 * 127 fits int16.
    const STEPS: usize = 2;
    const BLOCK_LEN: usize = 256;
    const BLOCK_BYTES: usize = BLOCK_BYTES;

    #[inline(always)]
    fn decode(block: &[u8], out: &mut [Decoded]) {
        for (t, o) in out.iter_mut().enumerate().take(8) {
            let (db, rows, signs) = sub_block(block, t);
            o.v = std::array::from_fn(|l| {
                let (k, i) = (l / 8, l % 8);
                grid::signed(grid::value(rows[k], i), signs[k], i)
            });
            o.f0 = db;
        }
    }

    const SIMD_VALUES: bool = true;

    #[inline(always)]
    fn decode_terms(block: &[u8], out: &mut [Decoded]) {
        for (t, o) in out.iter_mut().enumerate().take(8) {
            o.f0 = sub_scale(block, t);
        }
    }

    /// # Safety
    /// As [`BlockDecode::values_avx2`].
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn values_avx2(p: *const u8, t: usize) -> std::arch::x86_64::__m256i {
        // SAFETY: the caller vouches for a whole storage block at `p`.
        let block = unsafe { std::slice::from_raw_parts(p, BLOCK_BYTES) };
        let (_, rows, signs) = sub_block(block, t);
        unsafe { grid::signed_rows_avx2(rows, signs) }
    }
}
