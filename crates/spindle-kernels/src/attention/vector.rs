//! The float vector operations of attention: a dot product with one fixed
//! lane order and reduction tree, and a fused multiply-add update. The scalar
//! and AVX2 versions perform the same operations in the same order, so their
//! results are bit-identical.

use crate::simd::Isa;

/// `sum(q[i] * k[i])`: element `i` into lane `i % 32` with a fused
/// multiply-add, lanes reduced by a fixed tree ([`tree32`]). The same on every
/// ISA. Four independent 8-lane chains keep both FMA units busy.
#[inline]
pub fn dot(isa: Isa, q: &[f32], k: &[f32]) -> f32 {
    debug_assert_eq!(q.len(), k.len());
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 {
        // SAFETY: the caller chose Avx2 only when the CPU has AVX2 and FMA.
        return unsafe { avx2::dot(q, k) };
    }
    let _ = isa;
    let mut acc = [0.0f32; 32];
    for (i, (&a, &b)) in q.iter().zip(k).enumerate() {
        acc[i % 32] = a.mul_add(b, acc[i % 32]);
    }
    tree32(&acc)
}

/// Lanes `l`, `l+8`, `l+16`, `l+24` pairwise, then [`tree8`].
#[inline(always)]
fn tree32(a: &[f32; 32]) -> f32 {
    let mut v = [0.0f32; 8];
    for (l, x) in v.iter_mut().enumerate() {
        *x = (a[l] + a[l + 16]) + (a[l + 8] + a[l + 24]);
    }
    tree8(&v)
}

/// `out[i] = w * v[i] + out[i]`, fused, on every ISA.
#[inline]
pub fn axpy(isa: Isa, w: f32, v: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 {
        // SAFETY: as in `dot`.
        return unsafe { avx2::axpy(w, v, out) };
    }
    let _ = isa;
    for (o, &x) in out.iter_mut().zip(v) {
        *o = w.mul_add(x, *o);
    }
}

#[inline(always)]
fn tree8(a: &[f32; 8]) -> f32 {
    ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]))
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// [`super::dot`] in AVX2: the same lanes, fused multiply-adds and tree.
    ///
    /// # Safety
    /// AVX2 and FMA available.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dot(q: &[f32], k: &[f32]) -> f32 {
        let n = q.len().min(k.len());
        let full = n / 32 * 32;
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i < full {
            for (j, a) in acc.iter_mut().enumerate() {
                // SAFETY: i + 32 <= full <= len of both slices.
                let (x, y) = unsafe {
                    (
                        _mm256_loadu_ps(q.as_ptr().add(i + 8 * j)),
                        _mm256_loadu_ps(k.as_ptr().add(i + 8 * j)),
                    )
                };
                *a = _mm256_fmadd_ps(x, y, *a);
            }
            i += 32;
        }
        let mut lanes = [0.0f32; 32];
        for (j, a) in acc.iter().enumerate() {
            // SAFETY: lanes holds 32 floats.
            unsafe { _mm256_storeu_ps(lanes.as_mut_ptr().add(8 * j), *a) };
        }
        for j in full..n {
            lanes[j % 32] = q[j].mul_add(k[j], lanes[j % 32]);
        }
        super::tree32(&lanes)
    }

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
