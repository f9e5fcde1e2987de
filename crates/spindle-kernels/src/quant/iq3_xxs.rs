//! IQ3_XXS: super-blocks of 256 values in 8 sub-blocks of 32; each group of
//! 4 values is a row of a 256-entry grid (magnitudes 4, 12, ..., 62), with
//! signs per group of 8.
//!
//! Layout (98 bytes): f16 `d`, 64 grid indices (one byte per group of 4),
//! then per sub-block a little-endian u32 of 4 sign indices of 7 bits (into
//! [`KSIGNS`]) and the 4-bit scale `ls` in its top bits. Value: `d * (0.5 +
//! ls) * 0.5 * grid * sign`. Dots fold as `Block32` with that scale.

use super::decoded;
use super::decoded::BlockDecode;
use super::grid;
use super::iq_grids::{IQ3XXS_GRID, KSIGNS};
use super::multi_row::{Decoded, Fold};
use super::registry::QuantType;
use super::{arr, f16_le};
use spindle_formats::GgmlType;

/// This type's entry in the kernels' registry.
pub(crate) const TYPE: QuantType = QuantType::quantized(
    GgmlType::IQ3_XXS,
    dequantize,
    &[0],
    true,
    decoded::kernels::<Iq3Xxs>,
);

/// Bytes per super-block.
pub const BLOCK_BYTES: usize = 98;

/// Sub-block `t`'s scale and the magnitude and sign byte of its value `l`.
#[inline(always)]
fn sub_block(block: &[u8], t: usize) -> (f32, impl Fn(usize) -> (i8, u8) + '_) {
    let d = f16_le(*arr::<2>(block));
    let aux = u32::from_le_bytes(*arr::<4>(&block[66 + 4 * t..]));
    let db = d * (0.5 + (aux >> 28) as f32) * 0.5;
    let at = move |l: usize| {
        let row = IQ3XXS_GRID[block[2 + 8 * t + l / 4] as usize] as u64;
        let signs = KSIGNS[((aux >> (7 * (l / 8))) & 0x7F) as usize];
        (grid::value(row, l % 4), signs)
    };
    (db, at)
}

/// Scalar reference dequantization.
pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (block, out) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(256)) {
        for (t, sub) in out.chunks_exact_mut(32).enumerate() {
            let (db, at) = sub_block(block, t);
            for (l, o) in sub.iter_mut().enumerate() {
                let (m, signs) = at(l);
                *o = grid::scaled(db, m, signs, l % 8);
            }
        }
    }
}

pub(crate) struct Iq3Xxs;

impl BlockDecode for Iq3Xxs {
    const FOLD: Fold = Fold::Block32;
    const SIGNED: bool = true;
    // Magnitudes up to 62: 2 * 2 * 62 * 127 fits int16.
    const STEPS: usize = 2;
    const BLOCK_LEN: usize = 256;
    const BLOCK_BYTES: usize = BLOCK_BYTES;

    #[inline(always)]
    fn decode(block: &[u8], out: &mut [Decoded]) {
        for (t, o) in out.iter_mut().enumerate().take(8) {
            let (db, at) = sub_block(block, t);
            o.v = std::array::from_fn(|l| {
                let (m, signs) = at(l);
                grid::signed(m, signs, l % 8)
            });
            o.f0 = db;
        }
    }

    const SIMD_VALUES: bool = true;

    #[inline(always)]
    fn decode_terms(block: &[u8], out: &mut [Decoded]) {
        for (t, o) in out.iter_mut().enumerate().take(8) {
            o.f0 = sub_block(block, t).0;
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
        let aux = u32::from_le_bytes(*arr::<4>(&block[66 + 4 * t..]));
        // Two 4-value rows make the 8 values of one sign byte.
        let rows = std::array::from_fn(|k| {
            let row = |r: usize| IQ3XXS_GRID[block[2 + 8 * t + r] as usize] as u64;
            row(2 * k) | (row(2 * k + 1) << 32)
        });
        let signs = std::array::from_fn(|k| KSIGNS[((aux >> (7 * k)) & 0x7F) as usize]);
        unsafe { grid::signed_rows_avx2(rows, signs) }
    }
}
