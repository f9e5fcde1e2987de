//! IQ1_S: super-blocks of 256 values in 8 sub-blocks of 32; each group of 8
//! values is a row of a 2048-entry grid of -1, 0, 1, shifted by a delta of
//! plus or minus 1/8 per sub-block.
//!
//! Layout (50 bytes): f16 `d`, 32 bytes of grid index low bits, then per
//! sub-block a little-endian u16: bits `3k..3k+3` the high bits of group
//! `k`'s index, bits 12..15 the scale `s`, bit 15 the delta's sign. Value:
//! `d * (2s + 1) * (grid + delta)`. Dots fold as `Block32` on the integers
//! `8 * (grid + delta)` (odd, -9..=9) with scale `d * (2s + 1) / 8`.

use super::decoded;
use super::decoded::BlockDecode;
use super::grid;
use super::iq_grids::IQ1S_GRID;
use super::multi_row::{Decoded, Fold};
use super::registry::QuantType;
use super::{arr, f16_le};
use spindle_formats::GgmlType;

/// This type's entry in the kernels' registry.
pub(crate) const TYPE: QuantType = QuantType::quantized(
    GgmlType::IQ1_S,
    dequantize,
    &[0],
    true,
    decoded::kernels::<Iq1S>,
);

/// Bytes per super-block.
pub const BLOCK_BYTES: usize = 50;

/// The delta, 1/8, as gguf-py's `IQ1S_DELTA`.
pub(crate) const DELTA: f32 = 0.125;

/// Sub-block `t`'s scale `d * (2s + 1)`, whether its delta is negative, and
/// its 4 grid rows.
#[inline]
fn sub_block(block: &[u8], t: usize) -> (f32, bool, [u64; 4]) {
    let d = f16_le(*arr::<2>(block));
    let qh = u16::from_le_bytes(*arr::<2>(&block[34 + 2 * t..]));
    let dl = d * (2 * ((qh >> 12) & 7) + 1) as f32;
    let rows = std::array::from_fn(|k| {
        let index = block[2 + 4 * t + k] as usize | ((((qh >> (3 * k)) & 7) as usize) << 8);
        IQ1S_GRID[index]
    });
    (dl, qh & 0x8000 != 0, rows)
}

/// `8 * (g + delta)` for grid value `g`: exact odd integers.
#[inline]
pub(crate) fn eighths(g: i8, negative_delta: bool) -> i8 {
    8 * g + if negative_delta { -1 } else { 1 }
}

/// Scalar reference dequantization (as gguf-py: `dl * (grid + delta)`).
pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (block, out) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(256)) {
        for (t, sub) in out.chunks_exact_mut(32).enumerate() {
            let (dl, neg, rows) = sub_block(block, t);
            let delta = if neg { -DELTA } else { DELTA };
            for (l, o) in sub.iter_mut().enumerate() {
                *o = dl * (grid::value(rows[l / 8], l % 8) as f32 + delta);
            }
        }
    }
}

pub(crate) struct Iq1S;

impl BlockDecode for Iq1S {
    const FOLD: Fold = Fold::Block32;
    const SIGNED: bool = true;
    // Magnitudes up to 9: 8 * 2 * 9 * 127 fits int16.
    const STEPS: usize = 8;
    const BLOCK_LEN: usize = 256;
    const BLOCK_BYTES: usize = BLOCK_BYTES;

    #[inline(always)]
    fn decode(block: &[u8], out: &mut [Decoded]) {
        for (t, o) in out.iter_mut().enumerate().take(8) {
            let (dl, neg, rows) = sub_block(block, t);
            o.v = std::array::from_fn(|l| eighths(grid::value(rows[l / 8], l % 8), neg));
            o.f0 = dl * 0.125;
        }
    }
}
