//! Q8_0: blocks of 32 values; an f16 scale `d` then 32 signed bytes `q`.
//! Value `i` is `d * q[i]`.

use super::block32;
use super::block32::Block32;
use super::registry::QuantType;
use super::{arr, f16_le};
use spindle_formats::GgmlType;

/// This type's entry in the kernels' registry.
pub(crate) const TYPE: QuantType = QuantType {
    #[cfg(target_arch = "x86_64")]
    vertical: Some(vertical_kernels),
    ..QuantType::quantized(
        GgmlType::Q8_0,
        dequantize,
        &[0],
        false,
        block32::kernels::<Q8_0>,
    )
};

/// The vertical kernels, but for many rows on the VNNI path the kernel
/// that reads Q8_0's vertical groups in place (they are already the step
/// vectors; no packing per call).
#[cfg(target_arch = "x86_64")]
fn vertical_kernels(
    isa: crate::simd::Isa,
) -> Option<(super::kernels::QuantMulti, super::kernels::QuantMulti)> {
    let (one, mut many) = super::kernels::vertical::<Q8_0>(isa)?;
    if isa != crate::simd::Isa::Amx {
        many.range = super::multi_row::range_vnni_q8_0_in_place;
    }
    Some((one, many))
}

/// Bytes per block.
pub const BLOCK_BYTES: usize = 34;

/// Scalar reference dequantization; `src` is whole blocks, `dst` 32 values per
/// block.
pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (block, out) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(32)) {
        let d = f16_le(*arr::<2>(block));
        for (&q, o) in block[2..].iter().zip(out) {
            *o = d * (q as i8) as f32;
        }
    }
}

/// Marker type for the shared 32-block kernels.
pub(crate) struct Q8_0;

impl Block32 for Q8_0 {
    const BYTES: usize = BLOCK_BYTES;
    const STEPS: usize = 1;
    const OFFSET: i32 = 0;

    #[inline]
    fn values(block: &[u8]) -> [i8; 32] {
        arr::<32>(&block[2..]).map(|q| q as i8)
    }

    /// # Safety
    /// As [`Block32::values_avx2`]: AVX2, FMA and F16C available;
    /// `p..p + BYTES` readable.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn values_avx2(p: *const u8) -> std::arch::x86_64::__m256i {
        unsafe { crate::simd::avx2::load_256(p.add(2)) }
    }
}
