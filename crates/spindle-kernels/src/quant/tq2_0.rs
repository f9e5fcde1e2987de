//! TQ2_0: ternary super-blocks of 256 values `d * t`, `t` in -1..=1, two
//! bits each.
//!
//! Layout (66 bytes): 64 bytes of 2-bit codes, then f16 `d`. Value `n` is
//! bits `2k..2k+2` of byte `32c + i` minus 1, for `n = 128c + 32k + i`.
//! Dots fold as `Block32` with scale `d` for each 32-value block.

use super::decoded;
use super::decoded::BlockDecode;
use super::multi_row::{Decoded, Fold};
use super::registry::QuantType;
use super::{arr, f16_le};
use spindle_formats::GgmlType;
use std::marker::PhantomData;

/// This type's entry in the kernels' registry.
pub(crate) const TYPE: QuantType = QuantType::quantized(
    GgmlType::TQ2_0,
    dequantize,
    &[64],
    true,
    decoded::kernels::<Tq2_0>,
);

/// Bytes per super-block.
pub const BLOCK_BYTES: usize = 66;

/// A ternary super-block layout: 256 values `d * t`, the f16 `d` at byte
/// `D_AT`. TQ1_0 and TQ2_0 differ only in how they pack the trits.
pub(crate) trait Ternary {
    const BLOCK_BYTES: usize;
    const D_AT: usize;
    /// Ternary value `n` (0..256) of `block`, as -1..=1.
    fn value(block: &[u8], n: usize) -> i8;
}

/// TQ2_0's packing.
pub(crate) struct Tq2Packing;

impl Ternary for Tq2Packing {
    const BLOCK_BYTES: usize = BLOCK_BYTES;
    const D_AT: usize = 64;

    #[inline(always)]
    fn value(block: &[u8], n: usize) -> i8 {
        let (c, k, i) = (n / 128, (n % 128) / 32, n % 32);
        ((block[32 * c + i] >> (2 * k)) & 3) as i8 - 1
    }
}

/// Scalar reference dequantization of a ternary layout.
pub(crate) fn dequantize_ternary<L: Ternary>(src: &[u8], dst: &mut [f32]) {
    for (block, out) in src
        .chunks_exact(L::BLOCK_BYTES)
        .zip(dst.chunks_exact_mut(256))
    {
        let d = f16_le(*arr::<2>(&block[L::D_AT..]));
        for (n, o) in out.iter_mut().enumerate() {
            *o = d * L::value(block, n) as f32;
        }
    }
}

/// Scalar reference dequantization.
pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    dequantize_ternary::<Tq2Packing>(src, dst)
}

/// The decoded form of a ternary layout `L`.
pub(crate) struct Tq<L>(PhantomData<L>);

pub(crate) type Tq2_0 = Tq<Tq2Packing>;

impl<L: Ternary> BlockDecode for Tq<L> {
    const FOLD: Fold = Fold::Block32;
    const SIGNED: bool = true;
    const STEPS: usize = 8;
    const BLOCK_LEN: usize = 256;
    const BLOCK_BYTES: usize = L::BLOCK_BYTES;

    #[inline(always)]
    fn decode(block: &[u8], out: &mut [Decoded]) {
        let d = f16_le(*arr::<2>(&block[L::D_AT..]));
        for (t, o) in out.iter_mut().enumerate().take(8) {
            o.v = std::array::from_fn(|l| L::value(block, 32 * t + l));
            o.f0 = d;
        }
    }
}
