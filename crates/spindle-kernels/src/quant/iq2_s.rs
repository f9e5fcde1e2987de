//! IQ2_S: super-blocks of 256 values; each group of 8 values is a row of a
//! 1024-entry grid (magnitudes 8, 25, 43) with 8 explicit sign bits, and
//! each 16 values have a 4-bit scale `s`.
//!
//! Layout (82 bytes): f16 `d`, 32 bytes of grid index low bits, 32 sign
//! bytes, 8 bytes of index high bits (group `k`: bits `2(k % 4)..` of byte
//! `k / 4`), 8 bytes of scales as in IQ2_XS. Value and dots as IQ2_XS.

use super::decoded::BlockDecode;
use super::grid;
use super::iq_grids::IQ2S_GRID;
use super::multi_row::{Decoded, Fold};
use super::{arr, f16_le};

/// Bytes per super-block.
pub const BLOCK_BYTES: usize = 82;

/// Group `k`'s (0..32) grid row and sign byte.
#[inline(always)]
fn group(block: &[u8], k: usize) -> (u64, u8) {
    let high = ((block[66 + k / 4] >> (2 * (k % 4))) & 3) as usize;
    let index = block[2 + k] as usize | (high << 8);
    (IQ2S_GRID[index], block[34 + k])
}

/// The 4-bit scale of values `16j..16j + 16`.
#[inline(always)]
fn scale(block: &[u8], j: usize) -> u8 {
    (block[74 + j / 2] >> (4 * (j % 2))) & 0x0F
}

/// Scalar reference dequantization.
pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (block, out) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(256)) {
        let d = f16_le(*arr::<2>(block));
        for (n, o) in out.iter_mut().enumerate() {
            let db = d * (0.5 + scale(block, n / 16) as f32) * 0.25;
            let (row, signs) = group(block, n / 8);
            *o = grid::scaled(db, grid::value(row, n % 8), signs, n % 8);
        }
    }
}

pub(crate) struct Iq2S;

impl BlockDecode for Iq2S {
    const FOLD: Fold = Fold::Q6;
    const SIGNED: bool = true;
    const STEPS: usize = 2;
    const BLOCK_LEN: usize = 256;
    const BLOCK_BYTES: usize = BLOCK_BYTES;

    #[inline(always)]
    fn decode(block: &[u8], out: &mut [Decoded]) {
        let d = f16_le(*arr::<2>(block));
        for (t, o) in out.iter_mut().enumerate().take(8) {
            o.v = std::array::from_fn(|l| {
                let (row, signs) = group(block, 4 * t + l / 8);
                grid::signed(grid::value(row, l % 8), signs, l % 8)
            });
            o.f0 = d * 0.125;
            o.sc = [0, 1].map(|h| (2 * scale(block, 2 * t + h) + 1) as i8);
        }
    }

    const SIMD_VALUES: bool = true;

    #[inline(always)]
    fn decode_terms(block: &[u8], out: &mut [Decoded]) {
        let d = f16_le(*arr::<2>(block));
        for (t, o) in out.iter_mut().enumerate().take(8) {
            o.f0 = d * 0.125;
            o.sc = [0, 1].map(|h| (2 * scale(block, 2 * t + h) + 1) as i8);
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
        // Written out: `array::from_fn` here is not inlined (perf).
        let (g0, g1, g2, g3) = (
            group(block, 4 * t),
            group(block, 4 * t + 1),
            group(block, 4 * t + 2),
            group(block, 4 * t + 3),
        );
        unsafe { grid::signed_rows_avx2([g0.0, g1.0, g2.0, g3.0], [g0.1, g1.1, g2.1, g3.1]) }
    }
}
