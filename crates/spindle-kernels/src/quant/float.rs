//! Float weights: F32, F16 and BF16 (little-endian), dotted with f32
//! activations in f32.
//!
//! Element `k` of a dot accumulates into lane `k % 32` with a fused
//! multiply-add; the lanes are then reduced with [`tree32`]. The AVX2 path
//! keeps the 32 lanes in four vectors and does exactly the same operations, so
//! both paths agree bit for bit.

use super::arr;
use crate::simd::tree32;

/// Scalar reference: F32 bytes to f32 (bit-exact copy).
pub(crate) fn dequantize_f32(src: &[u8], dst: &mut [f32]) {
    for (b, o) in src.chunks_exact(4).zip(dst.iter_mut()) {
        *o = F32::get(b);
    }
}

/// Scalar reference: F16 to f32 (exact).
pub(crate) fn dequantize_f16(src: &[u8], dst: &mut [f32]) {
    for (b, o) in src.chunks_exact(2).zip(dst.iter_mut()) {
        *o = F16::get(b);
    }
}

/// Scalar reference: BF16 to f32 (exact: the bits shifted up by 16).
pub(crate) fn dequantize_bf16(src: &[u8], dst: &mut [f32]) {
    for (b, o) in src.chunks_exact(2).zip(dst.iter_mut()) {
        *o = Bf16::get(b);
    }
}

/// A float element type of the weights.
pub(crate) trait FloatElem {
    /// Bytes per element.
    const BYTES: usize;

    /// The value of the element in `bytes[..BYTES]`.
    fn get(bytes: &[u8]) -> f32;

    /// Eight elements from `p`, widened to f32.
    ///
    /// # Safety
    /// AVX2 and F16C must be available; `p..p + 8 * BYTES` readable.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8_avx2(p: *const u8) -> std::arch::x86_64::__m256;
}

/// F32 weights.
pub(crate) struct F32;
/// F16 weights.
pub(crate) struct F16;
/// BF16 weights.
pub(crate) struct Bf16;

impl FloatElem for F32 {
    const BYTES: usize = 4;

    #[inline]
    fn get(bytes: &[u8]) -> f32 {
        f32::from_le_bytes(*arr::<4>(bytes))
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8_avx2(p: *const u8) -> std::arch::x86_64::__m256 {
        crate::simd::avx2::load_ps(p.cast())
    }
}

impl FloatElem for F16 {
    const BYTES: usize = 2;

    #[inline]
    fn get(bytes: &[u8]) -> f32 {
        super::f16_le(*arr::<2>(bytes))
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8_avx2(p: *const u8) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        _mm256_cvtph_ps(crate::simd::avx2::load_128(p))
    }
}

impl FloatElem for Bf16 {
    const BYTES: usize = 2;

    #[inline]
    fn get(bytes: &[u8]) -> f32 {
        f32::from_bits((u16::from_le_bytes(*arr::<2>(bytes)) as u32) << 16)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8_avx2(p: *const u8) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        let h = crate::simd::avx2::load_128(p);
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
    }
}

/// Scalar reference: dot of one weight row (`x.len()` elements of `E`) with
/// `x`.
pub(crate) fn dot_scalar<E: FloatElem>(w: &[u8], x: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 32];
    for (k, (b, &xv)) in w.chunks_exact(E::BYTES).zip(x).enumerate() {
        let lane = &mut lanes[k % 32];
        *lane = E::get(b).mul_add(xv, *lane);
    }
    tree32(&lanes)
}

/// Scalar: `out[r] = dot(row r of w, x)`.
pub(crate) fn rows_scalar<E: FloatElem>(w: &[u8], row_bytes: usize, x: &[f32], out: &mut [f32]) {
    for (row, o) in w.chunks_exact(row_bytes).zip(out.iter_mut()) {
        *o = dot_scalar::<E>(row, x);
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use super::FloatElem;
    use crate::simd::avx2::{lanes_ps, load_ps};
    use crate::simd::tree32;
    use std::arch::x86_64::*;

    /// AVX2 dot of one row; bit-identical to [`super::dot_scalar`].
    ///
    /// # Safety
    /// AVX2, FMA and F16C must be available; `w` holds at least `x.len()`
    /// elements.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot<E: FloatElem>(w: &[u8], x: &[f32]) -> f32 {
        let n = x.len();
        let full = n / 32 * 32;
        let wp = w.as_ptr();
        let xp = x.as_ptr();
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut k = 0;
        while k < full {
            for (j, a) in acc.iter_mut().enumerate() {
                let wv = E::load8_avx2(wp.add((k + 8 * j) * E::BYTES));
                *a = _mm256_fmadd_ps(wv, load_ps(xp.add(k + 8 * j)), *a);
            }
            k += 32;
        }
        let mut lanes = [0.0f32; 32];
        for (j, a) in acc.iter().enumerate() {
            lanes[8 * j..8 * j + 8].copy_from_slice(&lanes_ps(*a));
        }
        for (j, (b, &xv)) in w[full * E::BYTES..n * E::BYTES]
            .chunks_exact(E::BYTES)
            .zip(&x[full..])
            .enumerate()
        {
            lanes[j] = E::get(b).mul_add(xv, lanes[j]);
        }
        tree32(&lanes)
    }

    /// AVX2: `out[r] = dot(row r of w, x)`.
    ///
    /// # Safety
    /// AVX2, FMA and F16C must be available.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn rows<E: FloatElem>(
        w: &[u8],
        row_bytes: usize,
        x: &[f32],
        out: &mut [f32],
    ) {
        assert!(
            row_bytes == x.len() * E::BYTES && w.len() >= out.len() * row_bytes,
            "float kernel: inconsistent shapes"
        );
        for (row, o) in w.chunks_exact(row_bytes).zip(out.iter_mut()) {
            *o = dot::<E>(row, x);
        }
    }
}
