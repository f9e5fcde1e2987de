//! TQ2_0: ternary super-blocks of 256 values `d * t`, `t` in -1..=1, two
//! bits each.
//!
//! Layout (66 bytes): 64 bytes of 2-bit codes, then f16 `d`. Value `n` is
//! bits `2k..2k+2` of byte `32c + i` minus 1, for `n = 128c + 32k + i`.
//! Dots fold as `Block32` with scale `d` for each 32-value block.

use super::decoded::BlockDecode;
use super::multi_row::{Decoded, Fold};
use super::{arr, f16_le};

/// Bytes per super-block.
pub const BLOCK_BYTES: usize = 66;

/// Ternary value `n` (0..256) of `block`.
#[inline]
fn value(block: &[u8], n: usize) -> i8 {
    let (c, k, i) = (n / 128, (n % 128) / 32, n % 32);
    ((block[32 * c + i] >> (2 * k)) & 3) as i8 - 1
}

/// Scalar reference dequantization.
pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (block, out) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(256)) {
        let d = f16_le(*arr::<2>(&block[64..]));
        for (n, o) in out.iter_mut().enumerate() {
            *o = d * value(block, n) as f32;
        }
    }
}

pub(crate) struct Tq2_0;

impl BlockDecode for Tq2_0 {
    const FOLD: Fold = Fold::Block32;
    const SIGNED: bool = true;
    const STEPS: usize = 8;
    const BLOCK_LEN: usize = 256;
    const BLOCK_BYTES: usize = BLOCK_BYTES;

    #[inline(always)]
    fn decode(block: &[u8], out: &mut [Decoded]) {
        let d = f16_le(*arr::<2>(&block[64..]));
        for (t, o) in out.iter_mut().enumerate().take(8) {
            o.v = std::array::from_fn(|l| value(block, 32 * t + l));
            o.f0 = d;
        }
    }
}
