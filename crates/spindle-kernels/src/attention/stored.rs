//! The element types the KV cache stores (f32, f16 and Q8_0 blocks), and
//! how attention reads their values as f32: one at a time ([`KvElem::value`],
//! the scalar path) or eight in a register ([`KvElem::load8`], AVX2).
//!
//! Widening is exact for all three (an f16 is an f32 with fewer bits; a Q8_0
//! value is an f16 scale times an int8, whose product fits f32's mantissa),
//! so the scalar and SIMD paths give the same values.

use half::f16;
use half::slice::HalfFloatSliceExt;

/// An element type of stored keys and values. A stored row of `n` values
/// is `n / VALUES` elements.
pub trait KvElem: Copy + Send + Sync + 'static {
    /// Values per element: 1, or 32 for a block type.
    const VALUES: usize;
    /// The element that holds zeros.
    const ZERO: Self;

    /// The `n` values of `src` (`n / VALUES` elements) as f32, into `dst`
    /// (`n` long). For tools and tests; attention widens in registers.
    fn widen(src: &[Self], dst: &mut [f32]) {
        for (i, d) in dst.iter_mut().enumerate() {
            *d = Self::value(src, i);
        }
    }

    /// `src` stored as elements into `dst` (`src.len() / VALUES` elements).
    fn store(src: &[f32], dst: &mut [Self]);

    /// Value `i` of a stored row, as f32.
    fn value(row: &[Self], i: usize) -> f32;

    /// Values `i..i+8` of a stored row (`i` a multiple of 8).
    ///
    /// # Safety
    /// AVX2 and F16C available; `i + 8` values within `row`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(row: &[Self], i: usize) -> std::arch::x86_64::__m256;
}

impl KvElem for f32 {
    const VALUES: usize = 1;
    const ZERO: f32 = 0.0;

    fn store(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }

    #[inline(always)]
    fn value(row: &[f32], i: usize) -> f32 {
        row[i]
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(row: &[f32], i: usize) -> std::arch::x86_64::__m256 {
        debug_assert!(i + 8 <= row.len());
        // SAFETY: the caller keeps i + 8 within the row.
        unsafe { std::arch::x86_64::_mm256_loadu_ps(row.as_ptr().add(i)) }
    }
}

impl KvElem for f16 {
    const VALUES: usize = 1;
    const ZERO: f16 = f16::ZERO;

    fn store(src: &[f32], dst: &mut [f16]) {
        // The slice conversion finds F16C at run time (7x faster than
        // `f16::from_f32` one value at a time in this build); both round to
        // nearest even, so the bits are the same.
        let n = dst.len().min(src.len());
        dst[..n].convert_from_f32_slice(&src[..n]);
    }

    #[inline(always)]
    fn value(row: &[f16], i: usize) -> f32 {
        row[i].to_f32()
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(row: &[f16], i: usize) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        debug_assert!(i + 8 <= row.len());
        // SAFETY: the caller keeps i + 8 within the row and has F16C.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(row.as_ptr().add(i) as *const __m128i)) }
    }
}

/// 32 values as an f16 scale and 32 int8: value `i` is `d * qs[i]` (GGUF's
/// Q8_0 block, 34 bytes), for about half the memory of f16.
#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(C)]
pub struct BlockQ8 {
    pub d: f16,
    pub qs: [i8; 32],
}

impl BlockQ8 {
    /// Quantizes 32 values: scale `max |x| / 127` (rounded to f16), each
    /// value rounded to the nearest multiple of the f32 scale, as GGUF's
    /// Q8_0 is made.
    pub fn quantize(x: &[f32]) -> BlockQ8 {
        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0i8; 32];
        for (q, v) in qs.iter_mut().zip(x) {
            *q = (v * id).round().clamp(-127.0, 127.0) as i8;
        }
        BlockQ8 {
            d: f16::from_f32(d),
            qs,
        }
    }

    /// The 32 values as f32, into `out`.
    pub fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for (o, &q) in out.iter_mut().zip(&self.qs) {
            *o = d * q as f32;
        }
    }
}

impl KvElem for BlockQ8 {
    const VALUES: usize = 32;
    const ZERO: BlockQ8 = BlockQ8 {
        d: f16::ZERO,
        qs: [0; 32],
    };

    fn store(src: &[f32], dst: &mut [BlockQ8]) {
        for (b, x) in dst.iter_mut().zip(src.chunks_exact(32)) {
            *b = BlockQ8::quantize(x);
        }
    }

    #[inline(always)]
    fn value(row: &[BlockQ8], i: usize) -> f32 {
        let b = &row[i / 32];
        b.d.to_f32() * b.qs[i % 32] as f32
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(row: &[BlockQ8], i: usize) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        let b = &row[i / 32];
        // SAFETY: i is a multiple of 8, so the 8 bytes lie inside one block;
        // the caller has AVX2.
        unsafe {
            let q = _mm_loadl_epi64(b.qs.as_ptr().add(i % 32) as *const __m128i);
            let x = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
            _mm256_mul_ps(_mm256_set1_ps(b.d.to_f32()), x)
        }
    }
}
