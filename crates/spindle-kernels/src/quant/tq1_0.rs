//! TQ1_0: ternary super-blocks of 256 values `d * t`, `t` in -1..=1, packed
//! five (or four) trits to a byte in base 3.
//!
//! Layout (54 bytes): 48 bytes `qs`, 4 bytes `qh`, f16 `d`. A byte holds
//! trits as a fixed-point fraction: trit `k` of byte `q` is `((q * 3^k mod
//! 256) * 3) >> 8`, minus 1. Values 0..160 are trit `n / 32` of `qs[n %
//! 32]`; 160..240 trit `m / 16` of `qs[32 + m % 16]` (`m = n - 160`);
//! 240..256 trit `m / 4` of `qh[m % 4]` (`m = n - 240`). Dots fold as
//! `Block32` with scale `d`.

use super::decoded;
use super::registry::QuantType;
use super::tq2_0::{dequantize_ternary, Ternary, Tq};
use spindle_formats::GgmlType;

/// This type's entry in the kernels' registry.
pub(crate) const TYPE: QuantType = QuantType::quantized(
    GgmlType::TQ1_0,
    dequantize,
    &[52],
    true,
    decoded::kernels::<Tq1_0>,
);

/// Bytes per super-block.
pub const BLOCK_BYTES: usize = 54;

const POW3: [u8; 5] = [1, 3, 9, 27, 81];

/// Trit `k` of byte `q`, as -1..=1.
#[inline]
fn trit(q: u8, k: usize) -> i8 {
    let shifted = q.wrapping_mul(POW3[k]) as u16;
    ((shifted * 3) >> 8) as i8 - 1
}

/// TQ1_0's packing.
pub(crate) struct Tq1Packing;

impl Ternary for Tq1Packing {
    const BLOCK_BYTES: usize = BLOCK_BYTES;
    const D_AT: usize = 52;

    #[inline(always)]
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
}

pub(crate) type Tq1_0 = Tq<Tq1Packing>;

/// Scalar reference dequantization.
pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    dequantize_ternary::<Tq1Packing>(src, dst)
}
