//! The fused multiply-add update that folds partials. The scalar and AVX2
//! versions perform the same operation per element, so their results are
//! bit-identical.

use crate::simd::Isa;

/// `out[i] = w * v[i] + out[i]`, fused, on every ISA.
#[inline]
pub fn axpy(isa: Isa, w: f32, v: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if isa.uses_avx2() {
        // SAFETY: the caller chose Avx2 only when the CPU has AVX2 and FMA.
        return unsafe { avx2::axpy(w, v, out) };
    }
    let _ = isa;
    for (o, &x) in out.iter_mut().zip(v) {
        *o = w.mul_add(x, *o);
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// [`super::axpy`] in AVX2.
    ///
    /// # Safety
    /// AVX2 and FMA available.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn axpy(w: f32, v: &[f32], out: &mut [f32]) {
        let n = v.len().min(out.len());
        let full = n / 8 * 8;
        let wv = _mm256_set1_ps(w);
        let mut i = 0;
        while i < full {
            // SAFETY: i + 8 <= full <= len of both slices.
            unsafe {
                let o = out.as_mut_ptr().add(i);
                _mm256_storeu_ps(
                    o,
                    _mm256_fmadd_ps(wv, _mm256_loadu_ps(v.as_ptr().add(i)), _mm256_loadu_ps(o)),
                );
            }
            i += 8;
        }
        for j in full..n {
            out[j] = w.mul_add(v[j], out[j]);
        }
    }
}
