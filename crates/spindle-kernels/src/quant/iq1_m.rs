//! IQ1_M: super-blocks of 256 values; each group of 8 values is a row of the
//! IQ1_S grid (-1, 0, 1) shifted by its own delta of plus or minus 1/8, and
//! each 16 values have a 3-bit scale `s`.
//!
//! Layout (56 bytes): 32 bytes of grid index low bits, 16 bytes of nibbles
//! (group `k`: nibble `k % 2` of byte `k / 2`; bits 0..3 the index's high
//! bits, bit 3 the delta's sign), then 4 little-endian u16 holding the 16
//! scales (scale `j`: bits `3(j % 4)..` of word `j / 4`) and, in their top
//! nibbles, the f16 `d`. Value: `d * (2s + 1) * (grid + delta)`. Dots fold
//! as `Q6` on `8 * (grid + delta)` with integer scales `2s + 1` and `d / 8`.

use super::arr;
use super::decoded;
use super::decoded::BlockDecode;
use super::grid;
use super::iq1_s::{eighths, DELTA};
use super::iq_grids::IQ1S_GRID;
use super::multi_row::{Decoded, Fold};
use super::registry::QuantType;
use spindle_formats::GgmlType;

/// This type's entry in the kernels' registry.
pub(crate) const TYPE: QuantType = QuantType::quantized(
    GgmlType::IQ1_M,
    dequantize,
    // Its f16 is spread over four words: the full scan (--check-weights) finds it.
    &[],
    true,
    decoded::kernels::<Iq1M>,
);

/// Bytes per super-block.
pub const BLOCK_BYTES: usize = 56;

/// The 4 scale words.
#[inline]
fn words(block: &[u8]) -> [u16; 4] {
    std::array::from_fn(|i| u16::from_le_bytes(*arr::<2>(&block[48 + 2 * i..])))
}

/// The super-block scale, spread over the top nibbles of the scale words.
#[inline]
fn super_scale(w: [u16; 4]) -> f32 {
    let bits = (w[0] >> 12) | ((w[1] >> 8) & 0x00F0) | ((w[2] >> 4) & 0x0F00) | (w[3] & 0xF000);
    half::f16::from_bits(bits).to_f32()
}

/// The 3-bit scale `s` of values `16j..16j + 16`.
#[inline]
fn scale(w: [u16; 4], j: usize) -> u16 {
    (w[j / 4] >> (3 * (j % 4))) & 7
}

/// Group `k`'s (0..32) grid row and whether its delta is negative.
#[inline]
fn group(block: &[u8], k: usize) -> (u64, bool) {
    let nibble = (block[32 + k / 2] >> (4 * (k % 2))) & 0x0F;
    let index = block[k] as usize | (((nibble & 7) as usize) << 8);
    (IQ1S_GRID[index], nibble & 8 != 0)
}

/// Scalar reference dequantization (as gguf-py: `dl * (grid + delta)`).
pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (block, out) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(256)) {
        let w = words(block);
        let d = super_scale(w);
        for (n, o) in out.iter_mut().enumerate() {
            let dl = d * (2 * scale(w, n / 16) + 1) as f32;
            let (row, neg) = group(block, n / 8);
            let delta = if neg { -DELTA } else { DELTA };
            *o = dl * (grid::value(row, n % 8) as f32 + delta);
        }
    }
}

pub(crate) struct Iq1M;

impl BlockDecode for Iq1M {
    const FOLD: Fold = Fold::Q6;
    const SIGNED: bool = true;
    const STEPS: usize = 4;
    const BLOCK_LEN: usize = 256;
    const BLOCK_BYTES: usize = BLOCK_BYTES;

    #[inline(always)]
    fn decode(block: &[u8], out: &mut [Decoded]) {
        let w = words(block);
        let d = super_scale(w);
        for (t, o) in out.iter_mut().enumerate().take(8) {
            o.v = std::array::from_fn(|l| {
                let (row, neg) = group(block, 4 * t + l / 8);
                eighths(grid::value(row, l % 8), neg)
            });
            o.f0 = d * 0.125;
            o.sc = [0, 1].map(|h| (2 * scale(w, 2 * t + h) + 1) as i8);
        }
    }
}
