//! Q4_0: blocks of 32 values; an f16 scale `d` then 16 bytes of 4-bit values.
//! Byte `j` holds value `j` in its low nibble and value `j + 16` in its high
//! nibble; a nibble `n` stands for `d * (n - 8)`.

use super::block32;
use super::block32::Block32;
use super::registry::QuantType;
use super::{arr, f16_le};
use spindle_formats::GgmlType;

/// This type's entry in the kernels' registry.
pub(crate) const TYPE: QuantType = QuantType {
    #[cfg(target_arch = "x86_64")]
    vertical: Some(super::kernels::vertical::<Q4_0>),
    ..QuantType::quantized(
        GgmlType::Q4_0,
        dequantize,
        &[0],
        false,
        block32::kernels::<Q4_0>,
    )
};

/// Bytes per block.
pub const BLOCK_BYTES: usize = 18;

/// Scalar reference dequantization; `src` is whole blocks, `dst` 32 values per
/// block.
pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (block, out) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(32)) {
        let d = f16_le(*arr::<2>(block));
        for (i, v) in Q4_0::values(block).into_iter().enumerate() {
            out[i] = d * v as f32;
        }
    }
}

/// Marker type for the shared 32-block kernels.
pub(crate) struct Q4_0;

impl Block32 for Q4_0 {
    const BYTES: usize = BLOCK_BYTES;
    const STEPS: usize = 8;
    const OFFSET: i32 = 8;

    #[inline]
    fn values(block: &[u8]) -> [i8; 32] {
        let qs = arr::<16>(&block[2..]);
        let mut v = [0i8; 32];
        for j in 0..16 {
            v[j] = (qs[j] & 0x0F) as i8 - 8;
            v[j + 16] = (qs[j] >> 4) as i8 - 8;
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
            use crate::simd::avx2::{load_128, nibbles_16};
            // Unsigned: the kernel takes off 8 * sum(a).
            nibbles_16(load_128(p.add(2)))
        }
    }
}
