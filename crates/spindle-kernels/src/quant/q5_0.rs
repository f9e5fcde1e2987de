//! Q5_0: blocks of 32 values; an f16 scale `d`, a little-endian u32 `qh` of
//! fifth bits, then 16 bytes of low nibbles. Byte `j` holds the low 4 bits of
//! value `j` (low nibble) and of value `j + 16` (high nibble); bit `i` of `qh`
//! is bit 4 of value `i`. A 5-bit value `u` stands for `d * (u - 16)`.

use super::block32;
use super::block32::Block32;
use super::registry::QuantType;
use super::{arr, f16_le};
use spindle_formats::GgmlType;

/// This type's entry in the kernels' registry.
pub(crate) const TYPE: QuantType = QuantType {
    #[cfg(target_arch = "x86_64")]
    vertical: Some(super::kernels::vertical::<Q5_0>),
    ..QuantType::quantized(
        GgmlType::Q5_0,
        dequantize,
        &[0],
        false,
        block32::kernels::<Q5_0>,
    )
};

/// Bytes per block.
pub const BLOCK_BYTES: usize = 22;

/// Scalar reference dequantization; `src` is whole blocks, `dst` 32 values per
/// block.
pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (block, out) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(32)) {
        let d = f16_le(*arr::<2>(block));
        for (i, v) in Q5_0::values(block).into_iter().enumerate() {
            out[i] = d * v as f32;
        }
    }
}

/// Marker type for the shared 32-block kernels.
pub(crate) struct Q5_0;

impl Block32 for Q5_0 {
    const BYTES: usize = BLOCK_BYTES;
    const STEPS: usize = 4;
    const OFFSET: i32 = 16;

    #[inline]
    fn values(block: &[u8]) -> [i8; 32] {
        let qh = u32::from_le_bytes(*arr::<4>(&block[2..]));
        let qs = arr::<16>(&block[6..]);
        let mut v = [0i8; 32];
        for j in 0..16 {
            let hi_lo = (((qh >> j) & 1) << 4) as u8;
            let hi_hi = (((qh >> (j + 16)) & 1) << 4) as u8;
            v[j] = ((qs[j] & 0x0F) | hi_lo) as i8 - 16;
            v[j + 16] = ((qs[j] >> 4) | hi_hi) as i8 - 16;
        }
        v
    }

    /// # Safety
    /// As [`Block32::values_avx2`]: AVX2, FMA and F16C available;
    /// `p..p + BYTES` readable.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn values_avx2(p: *const u8) -> std::arch::x86_64::__m256i {
        unsafe {
            use crate::simd::avx2::{bits_to_bytes, load_128, nibbles_16};
            use std::arch::x86_64::*;
            let qh = u32::from_le_bytes([*p.add(2), *p.add(3), *p.add(4), *p.add(5)]);
            let nibbles = nibbles_16(load_128(p.add(6)));
            // Unsigned u = nibble | fifth bit << 4; the kernel takes off
            // 16 * sum(a).
            let fifth = _mm256_and_si256(bits_to_bytes(qh), _mm256_set1_epi8(0x10));
            _mm256_or_si256(nibbles, fifth)
        }
    }
}
