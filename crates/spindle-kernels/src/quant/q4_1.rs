//! Q4_1: blocks of 32 values, `d * q + m` with 4-bit `q`.
//!
//! Layout (20 bytes): f16 `d`, f16 `m`, 16 bytes of nibbles (value `l` is
//! the low nibble of byte `l` for `l < 16`, the high nibble of byte `l - 16`
//! after). Dots fold as `KMin` with min `-m`: `fma(d, isum, m * sum(a))`.

use super::decoded::BlockDecode;
use super::multi_row::{Decoded, Fold};
use super::{arr, f16_le};

/// Bytes per block.
pub const BLOCK_BYTES: usize = 20;

/// Value `l` (0..32) of the 16 nibble bytes `qs`.
#[inline]
pub(crate) fn nibble(qs: &[u8], l: usize) -> u8 {
    if l < 16 {
        qs[l] & 0x0F
    } else {
        qs[l - 16] >> 4
    }
}

/// Scalar reference dequantization (as gguf-py: `d * q + m`, two roundings).
pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (block, out) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(32)) {
        let d = f16_le(*arr::<2>(block));
        let m = f16_le(*arr::<2>(&block[2..]));
        for (l, o) in out.iter_mut().enumerate() {
            *o = d * nibble(&block[4..], l) as f32 + m;
        }
    }
}

pub(crate) struct Q4_1;

impl BlockDecode for Q4_1 {
    const FOLD: Fold = Fold::KMin;
    const SIGNED: bool = false;
    // 4-bit values: 8 * 2 * 15 * 127 fits int16.
    const STEPS: usize = 8;
    const BLOCK_LEN: usize = 32;
    const BLOCK_BYTES: usize = BLOCK_BYTES;

    fn decode(block: &[u8], out: &mut [Decoded]) {
        let o = &mut out[0];
        o.v = std::array::from_fn(|l| nibble(&block[4..], l) as i8);
        o.f0 = f16_le(*arr::<2>(block));
        o.f1 = -f16_le(*arr::<2>(&block[2..]));
    }
}
