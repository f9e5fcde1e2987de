//! Q5_1: blocks of 32 values, `d * q + m` with 5-bit `q`.
//!
//! Layout (24 bytes): f16 `d`, f16 `m`, a little-endian u32 of high bits
//! (bit `l` for value `l`), 16 bytes of low nibbles as in Q4_1. Dots fold
//! as `KMin` with min `-m`.

use super::decoded::BlockDecode;
use super::multi_row::{Decoded, Fold};
use super::q4_1::nibble;
use super::{arr, f16_le};

/// Bytes per block.
pub const BLOCK_BYTES: usize = 24;

/// The 5-bit value `l` of `block`.
#[inline]
fn value(block: &[u8], l: usize) -> u8 {
    let qh = u32::from_le_bytes(*arr::<4>(&block[4..]));
    nibble(&block[8..], l) | ((((qh >> l) & 1) as u8) << 4)
}

/// Scalar reference dequantization (as gguf-py: `d * q + m`).
pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (block, out) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(32)) {
        let d = f16_le(*arr::<2>(block));
        let m = f16_le(*arr::<2>(&block[2..]));
        for (l, o) in out.iter_mut().enumerate() {
            *o = d * value(block, l) as f32 + m;
        }
    }
}

pub(crate) struct Q5_1;

impl BlockDecode for Q5_1 {
    const FOLD: Fold = Fold::KMin;
    const SIGNED: bool = false;
    // 5-bit values: 4 * 2 * 31 * 127 fits int16.
    const STEPS: usize = 4;
    const BLOCK_LEN: usize = 32;
    const BLOCK_BYTES: usize = BLOCK_BYTES;

    fn decode(block: &[u8], out: &mut [Decoded]) {
        let o = &mut out[0];
        o.v = std::array::from_fn(|l| value(block, l) as i8);
        o.f0 = f16_le(*arr::<2>(block));
        o.f1 = -f16_le(*arr::<2>(&block[2..]));
    }
}
