//! Q2_K: super-blocks of 256 values in 16 sub-blocks of 16, `d * sc * q -
//! dmin * m` with 2-bit `q` and a 4-bit scale `sc` and min `m` per
//! sub-block.
//!
//! Layout (84 bytes): 16 bytes of scales (low nibble `sc`, high nibble `m`,
//! sub-block `j` in byte `j`), 64 bytes of 2-bit codes (value `n` is bits
//! `2k..2k+2` of byte `32c + i`, `n = 128c + 32k + i`), f16 `d`, f16 `dmin`.
//!
//! Dots fold as [`Fold::Q2`]: a 32-value block meets sub-blocks `2t` and
//! `2t + 1`; its exact integer dot carries their scales, its min term their
//! mins times the half-block activation sums.

use super::decoded::BlockDecode;
use super::multi_row::{Decoded, Fold};
use super::{arr, f16_le};

/// Bytes per super-block.
pub const BLOCK_BYTES: usize = 84;

/// The 2-bit value `n` (0..256) of `block`.
#[inline]
fn value(block: &[u8], n: usize) -> u8 {
    let (c, k, i) = (n / 128, (n % 128) / 32, n % 32);
    (block[16 + 32 * c + i] >> (2 * k)) & 3
}

/// Scalar reference dequantization (as gguf-py: `(d * sc) * q - dmin * m`).
pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (block, out) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(256)) {
        let d = f16_le(*arr::<2>(&block[80..]));
        let dmin = f16_le(*arr::<2>(&block[82..]));
        for (n, o) in out.iter_mut().enumerate() {
            let s = block[n / 16];
            let dl = d * (s & 0x0F) as f32;
            let ml = dmin * (s >> 4) as f32;
            *o = dl * value(block, n) as f32 - ml;
        }
    }
}

pub(crate) struct Q2K;

impl BlockDecode for Q2K {
    const FOLD: Fold = Fold::Q2;
    const SIGNED: bool = false;
    // Four steps are one 16-value sub-block (the scale widening needs it).
    const STEPS: usize = 4;
    const BLOCK_LEN: usize = 256;
    const BLOCK_BYTES: usize = BLOCK_BYTES;

    fn decode(block: &[u8], out: &mut [Decoded]) {
        let d = f16_le(*arr::<2>(&block[80..]));
        let dmin = f16_le(*arr::<2>(&block[82..]));
        for (t, o) in out.iter_mut().enumerate().take(8) {
            o.v = std::array::from_fn(|l| value(block, 32 * t + l) as i8);
            o.f0 = d;
            o.f1 = dmin;
            let (lo, hi) = (block[2 * t], block[2 * t + 1]);
            o.sc = [(lo & 0x0F) as i8, (hi & 0x0F) as i8];
            o.mn = [lo >> 4, hi >> 4];
        }
    }
}
