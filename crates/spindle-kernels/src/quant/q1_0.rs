//! Q1_0: blocks of 128 values `±d`, one bit each (binary weights).
//!
//! Layout (18 bytes): f16 `d`, then 16 bytes of bits; value `n` is `+d`
//! when bit `n % 8` of byte `n / 8` is set, else `-d`. Dots fold as
//! `Block32` with scale `d` for each 32-value block, values `±1`.

use super::decoded;
use super::decoded::BlockDecode;
use super::multi_row::{Decoded, Fold};
use super::registry::QuantType;
use super::{arr, f16_le};
use spindle_formats::GgmlType;

/// This type's entry in the kernels' registry.
pub(crate) const TYPE: QuantType = QuantType::quantized(
    GgmlType::Q1_0,
    dequantize,
    &[0],
    false,
    decoded::kernels::<Q1_0>,
);

/// Bytes per block.
pub const BLOCK_BYTES: usize = 18;

/// Value `n` (0..128) of the 16 bit bytes `qs`, as `±1`.
#[inline(always)]
fn sign(qs: &[u8], n: usize) -> i8 {
    if (qs[n / 8] >> (n % 8)) & 1 == 1 {
        1
    } else {
        -1
    }
}

/// Scalar reference dequantization (as ggml: `d` or `-d`, exact).
pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (block, out) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(128)) {
        let d = f16_le(*arr::<2>(block));
        for (n, o) in out.iter_mut().enumerate() {
            *o = if sign(&block[2..], n) > 0 { d } else { -d };
        }
    }
}

pub(crate) struct Q1_0;

impl BlockDecode for Q1_0 {
    const FOLD: Fold = Fold::Block32;
    const SIGNED: bool = true;
    // |v| = 1: 8 * 2 * 127 fits int16.
    const STEPS: usize = 8;
    const BLOCK_LEN: usize = 128;
    const BLOCK_BYTES: usize = BLOCK_BYTES;

    #[inline(always)]
    fn decode(block: &[u8], out: &mut [Decoded]) {
        Self::decode_terms(block, out);
        for (t, o) in out.iter_mut().enumerate().take(4) {
            o.v = std::array::from_fn(|l| sign(&block[2..], 32 * t + l));
        }
    }

    const SIMD_VALUES: bool = true;

    #[inline(always)]
    fn decode_terms(block: &[u8], out: &mut [Decoded]) {
        let d = f16_le(*arr::<2>(block));
        for o in out.iter_mut().take(4) {
            o.f0 = d;
        }
    }

    /// Block `j`'s 32 bits (bytes `2 + 4j..2 + 4j + 4`) to `±1`: each byte
    /// broadcast to the 8 lanes it covers, tested against its lane's bit.
    ///
    /// # Safety
    /// As [`BlockDecode::values_avx2`].
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn values_avx2(p: *const u8, j: usize) -> std::arch::x86_64::__m256i {
        use std::arch::x86_64::*;
        unsafe {
            let bits = (p.add(2 + 4 * j) as *const u32).read_unaligned();
            let spread = _mm256_shuffle_epi8(
                _mm256_set1_epi32(bits as i32),
                _mm256_setr_epi8(
                    0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, //
                    2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
                ),
            );
            let lane_bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
            let clear =
                _mm256_cmpeq_epi8(_mm256_and_si256(spread, lane_bit), _mm256_setzero_si256());
            // Clear bits: -1 | 1 = -1; set bits: 0 | 1 = 1.
            _mm256_or_si256(clear, _mm256_set1_epi8(1))
        }
    }
}
