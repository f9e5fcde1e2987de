//! IQ3_S: super-blocks of 256 values in 8 sub-blocks of 32; each group of 4
//! values is a row of a 512-entry grid (magnitudes 1, 3, ..., 15), with 8
//! explicit sign bits per group of 8.
//!
//! Layout (110 bytes): f16 `d`, 64 bytes of grid index low bits, 8 bytes of
//! their ninth bits (group `k`: bit `k % 8` of byte `k / 8`), 32 sign
//! bytes, 4 bytes of 4-bit scales `s` (sub-block `t`: byte `t / 2`, nibble
//! `t % 2`). Value: `d * (1 + 2s) * grid * sign`. Dots fold as `Block32`.

use super::decoded;
use super::decoded::BlockDecode;
use super::grid;
use super::iq_grids::IQ3S_GRID;
use super::multi_row::{Decoded, Fold};
use super::registry::QuantType;
use super::{arr, f16_le};
use spindle_formats::GgmlType;

/// This type's entry in the kernels' registry.
pub(crate) const TYPE: QuantType = QuantType::quantized(
    GgmlType::IQ3_S,
    dequantize,
    &[0],
    true,
    decoded::kernels::<Iq3S>,
);

/// Bytes per super-block.
pub const BLOCK_BYTES: usize = 110;

/// Sub-block `t`'s scale `d * (1 + 2s)`.
#[inline(always)]
fn sub_scale(block: &[u8], t: usize) -> f32 {
    let s = (block[106 + t / 2] >> (4 * (t % 2))) & 0x0F;
    f16_le(*arr::<2>(block)) * (1 + 2 * s) as f32
}

/// The magnitude and sign byte of value `n` (0..256).
#[inline(always)]
fn at(block: &[u8], n: usize) -> (i8, u8) {
    let k = n / 4;
    let high = ((block[66 + k / 8] >> (k % 8)) & 1) as usize;
    let row = IQ3S_GRID[block[2 + k] as usize | (high << 8)] as u64;
    (grid::value(row, n % 4), block[74 + n / 8])
}

/// Scalar reference dequantization.
pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (block, out) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(256)) {
        for (n, o) in out.iter_mut().enumerate() {
            let (m, signs) = at(block, n);
            *o = grid::scaled(sub_scale(block, n / 32), m, signs, n % 8);
        }
    }
}

pub(crate) struct Iq3S;

impl BlockDecode for Iq3S {
    const FOLD: Fold = Fold::Block32;
    const SIGNED: bool = true;
    const STEPS: usize = 8;
    const BLOCK_LEN: usize = 256;
    const BLOCK_BYTES: usize = BLOCK_BYTES;

    #[inline(always)]
    fn decode(block: &[u8], out: &mut [Decoded]) {
        for (t, o) in out.iter_mut().enumerate().take(8) {
            o.v = std::array::from_fn(|l| {
                let (m, signs) = at(block, 32 * t + l);
                grid::signed(m, signs, l % 8)
            });
            o.f0 = sub_scale(block, t);
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
        let row = |k: usize| {
            let high = ((block[66 + k / 8] >> (k % 8)) & 1) as usize;
            IQ3S_GRID[block[2 + k] as usize | (high << 8)] as u64
        };
        // Two 4-value rows make the 8 values of one sign byte.
        let rows = std::array::from_fn(|k| row(8 * t + 2 * k) | (row(8 * t + 2 * k + 1) << 32));
        let signs = std::array::from_fn(|k| block[74 + 4 * t + k]);
        unsafe { grid::signed_rows_avx2(rows, signs) }
    }
}
