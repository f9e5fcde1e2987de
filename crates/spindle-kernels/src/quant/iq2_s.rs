//! IQ2_S: super-blocks of 256 values; each group of 8 values is a row of a
//! 1024-entry grid (magnitudes 8, 25, 43) with 8 explicit sign bits, and
//! each 16 values have a 4-bit scale `s`.
//!
//! Layout (82 bytes): f16 `d`, 32 bytes of grid index low bits, 32 sign
//! bytes, 8 bytes of index high bits (group `k`: bits `2(k % 4)..` of byte
//! `k / 4`), 8 bytes of scales as in IQ2_XS. Value and dots as IQ2_XS.

use super::decoded;
use super::iq2_xs::{dequantize_layout, Iq2, Iq2Layout};
use super::iq_grids::IQ2S_GRID;
use super::registry::QuantType;
use spindle_formats::GgmlType;

/// This type's entry in the kernels' registry.
pub(crate) const TYPE: QuantType = QuantType::quantized(
    GgmlType::IQ2_S,
    dequantize,
    &[0],
    true,
    decoded::kernels::<Iq2S>,
);

/// Bytes per super-block.
pub const BLOCK_BYTES: usize = 82;

/// IQ2_S's layout.
pub(crate) struct SLayout;

impl Iq2Layout for SLayout {
    const BLOCK_BYTES: usize = BLOCK_BYTES;

    #[inline(always)]
    fn group(block: &[u8], k: usize) -> (u64, u8) {
        let high = ((block[66 + k / 4] >> (2 * (k % 4))) & 3) as usize;
        let index = block[2 + k] as usize | (high << 8);
        (IQ2S_GRID[index], block[34 + k])
    }

    #[inline(always)]
    fn scale(block: &[u8], j: usize) -> u8 {
        (block[74 + j / 2] >> (4 * (j % 2))) & 0x0F
    }
}

pub(crate) type Iq2S = Iq2<SLayout>;

/// Scalar reference dequantization.
pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    dequantize_layout::<SLayout>(src, dst)
}
