//! TQ1_0: ternary super-blocks of 256 values `d * t`, `t` in -1..=1, packed
//! five (or four) trits to a byte in base 3.
//!
//! Layout (54 bytes): 48 bytes `qs`, 4 bytes `qh`, f16 `d`. A byte holds
//! trits as a fixed-point fraction: trit `k` of byte `q` is `((q * 3^k mod
//! 256) * 3) >> 8`, minus 1. Values 0..160 are trit `n / 32` of `qs[n %
//! 32]`; 160..240 trit `m / 16` of `qs[32 + m % 16]` (`m = n - 160`);
//! 240..256 trit `m / 4` of `qh[m % 4]` (`m = n - 240`). Dots fold as
//! `Block32` with scale `d`.

use super::decoded::BlockDecode;
use super::multi_row::{Decoded, Fold};
use super::{arr, f16_le};

/// Bytes per super-block.
pub const BLOCK_BYTES: usize = 54;

const POW3: [u8; 5] = [1, 3, 9, 27, 81];

/// Trit `k` of byte `q`, as -1..=1.
#[inline]
fn trit(q: u8, k: usize) -> i8 {
    let shifted = q.wrapping_mul(POW3[k]) as u16;
    ((shifted * 3) >> 8) as i8 - 1
}

/// Ternary value `n` (0..256) of `block`.
#[inline]
fn value(block: &[u8], n: usize) -> i8 {
    if n < 160 {
        trit(block[n % 32], n / 32)
    } else if n < 240 {
        let m = n - 160;
        trit(block[32 + m % 16], m / 16)
    } else {
        let m = n - 240;
        trit(block[48 + m % 4], m / 4)
    }
}

/// Scalar reference dequantization.
pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (block, out) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(256)) {
        let d = f16_le(*arr::<2>(&block[52..]));
        for (n, o) in out.iter_mut().enumerate() {
            *o = d * value(block, n) as f32;
        }
    }
}

pub(crate) struct Tq1_0;

impl BlockDecode for Tq1_0 {
    const FOLD: Fold = Fold::Block32;
    const SIGNED: bool = true;
    const STEPS: usize = 8;
    const BLOCK_LEN: usize = 256;
    const BLOCK_BYTES: usize = BLOCK_BYTES;

    #[inline(always)]
    fn decode(block: &[u8], out: &mut [Decoded]) {
        let d = f16_le(*arr::<2>(&block[52..]));
        for (t, o) in out.iter_mut().enumerate().take(8) {
            o.v = std::array::from_fn(|l| value(block, 32 * t + l));
            o.f0 = d;
        }
    }
}
