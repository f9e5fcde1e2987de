//! MXFP4 (OCP microscaling FP4): blocks of 32 E2M1 values sharing an E8M0
//! power-of-two scale.
//!
//! Layout (17 bytes): the scale byte `e`, then 16 bytes of nibbles as in
//! Q4_1, each an E2M1 code. As in ggml, the codes are held doubled (as the
//! integers -12..=12) and the scale halved: `2^(e - 128)`, so every value is
//! an exact integer times a power of two. Dots fold as `Block32`.

use super::decoded;
use super::decoded::BlockDecode;
use super::multi_row::{Decoded, Fold};
use super::q4_1::nibble;
use super::registry::QuantType;
use spindle_formats::GgmlType;

/// This type's entry in the kernels' registry.
pub(crate) const TYPE: QuantType = QuantType::quantized(
    GgmlType::MXFP4,
    dequantize,
    // Its scale is a power of two, finite for every byte.
    &[],
    false,
    decoded::kernels::<Mxfp4>,
);

/// Bytes per block.
pub const BLOCK_BYTES: usize = 17;

/// E2M1 codes, doubled (ggml's `kvalues_mxfp4`).
const KVALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Half the E8M0 scale `2^(e - 127)`, as ggml's `ggml_e8m0_to_fp32_half`
/// (subnormal for `e < 2`).
#[inline]
pub(crate) fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        (e as u32 - 1) << 23
    };
    f32::from_bits(bits)
}

/// Scalar reference dequantization.
pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (block, out) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(32)) {
        let d = e8m0_half(block[0]);
        for (l, o) in out.iter_mut().enumerate() {
            *o = d * KVALUES[nibble(&block[1..], l) as usize] as f32;
        }
    }
}

pub(crate) struct Mxfp4;

impl BlockDecode for Mxfp4 {
    const FOLD: Fold = Fold::Block32;
    const SIGNED: bool = true;
    // Magnitudes up to 12: 8 * 2 * 12 * 127 fits int16.
    const STEPS: usize = 8;
    const BLOCK_LEN: usize = 32;
    const BLOCK_BYTES: usize = BLOCK_BYTES;

    #[inline(always)]
    fn decode(block: &[u8], out: &mut [Decoded]) {
        Self::decode_terms(block, out);
        out[0].v = std::array::from_fn(|l| KVALUES[nibble(&block[1..], l) as usize]);
    }

    const SIMD_VALUES: bool = true;

    #[inline(always)]
    fn decode_terms(block: &[u8], out: &mut [Decoded]) {
        out[0].f0 = e8m0_half(block[0]);
    }

    /// # Safety
    /// As [`BlockDecode::values_avx2`].
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn values_avx2(p: *const u8, _j: usize) -> std::arch::x86_64::__m256i {
        unsafe { super::iq4_nl::table_avx2(&KVALUES, p.add(1)) }
    }
}
