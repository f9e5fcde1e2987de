//! IQ4_NL: blocks of 32 values, `d * K[q]` with 4-bit indices into a fixed
//! non-linear codebook `K`.
//!
//! Layout (18 bytes): f16 `d`, 16 bytes of nibbles as in Q4_1. Dots fold as
//! `Block32` on the codebook values (-127..=113, dotted with the sign trick).

use super::decoded::BlockDecode;
use super::multi_row::{Decoded, Fold};
use super::q4_1::nibble;
use super::{arr, f16_le};

/// Bytes per block.
pub const BLOCK_BYTES: usize = 18;

/// The codebook shared with IQ4_XS (ggml's `kvalues_iq4nl`).
pub(crate) const KVALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// Scalar reference dequantization.
pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (block, out) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(32)) {
        let d = f16_le(*arr::<2>(block));
        for (l, o) in out.iter_mut().enumerate() {
            *o = d * KVALUES[nibble(&block[2..], l) as usize] as f32;
        }
    }
}

pub(crate) struct Iq4Nl;

impl BlockDecode for Iq4Nl {
    const FOLD: Fold = Fold::Block32;
    const SIGNED: bool = true;
    // Magnitudes up to 127: one step before widening.
    const STEPS: usize = 1;
    const BLOCK_LEN: usize = 32;
    const BLOCK_BYTES: usize = BLOCK_BYTES;

    fn decode(block: &[u8], out: &mut [Decoded]) {
        let o = &mut out[0];
        o.v = std::array::from_fn(|l| KVALUES[nibble(&block[2..], l) as usize]);
        o.f0 = f16_le(*arr::<2>(block));
    }
}
