//! Float weights: F32, F16 and BF16 (little-endian), dotted with f32
//! activations in f32.
//!
//! Element `k` of a dot accumulates into lane `k % 32` with a fused
//! multiply-add; the lanes are then reduced with [`tree32`]. The AVX2 path
//! keeps the 32 lanes in four vectors and does exactly the same operations, so
//! both paths agree bit for bit.

use super::arr;
use super::kernels::Kernel;
use super::registry::QuantType;
use crate::out_ptr::OutPtr;
use crate::simd::{tree32, Isa};
use spindle_formats::GgmlType;

/// The float types' entries in the kernels' registry: f32 activations, no
/// block scales.
const fn float_type(
    ty: GgmlType,
    dequantize: fn(&[u8], &mut [f32]),
    kernels: fn(Isa) -> Option<Kernel>,
) -> QuantType {
    QuantType {
        ty,
        dequantize,
        scale_offsets: &[],
        act: None,
        ggml_act: None,
        kernels,
        vertical: None,
    }
}

pub(crate) const F32_TYPE: QuantType = float_type(GgmlType::F32, dequantize_f32, kernels::<F32>);
pub(crate) const F16_TYPE: QuantType = float_type(GgmlType::F16, dequantize_f16, kernels::<F16>);
pub(crate) const BF16_TYPE: QuantType =
    float_type(GgmlType::BF16, dequantize_bf16, kernels::<Bf16>);

/// The kernels of float weights of element `E` on `isa`: one-row scalar or
/// AVX2 (which AVX-512 machines run too), multi-row scalar, AVX2 or the
/// AVX-512 tile (same lanes, same bits).
fn kernels<E: FloatElem>(isa: Isa) -> Option<Kernel> {
    Some(match isa {
        Isa::Scalar => Kernel::Float(rows_scalar::<E>, range_scalar::<E>),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => Kernel::Float(avx2::rows::<E>, avx2::range::<E>),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni | Isa::Amx => Kernel::Float(avx2::rows::<E>, avx512::range::<E>),
        #[allow(unreachable_patterns)]
        _ => return None,
    })
}

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
    /// AVX2, FMA and F16C available; `p..p + 8 * BYTES` readable.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8_avx2(p: *const u8) -> std::arch::x86_64::__m256;

    /// Sixteen elements from `p`, widened to f32.
    ///
    /// # Safety
    /// AVX-512F available; `p..p + 16 * BYTES` readable.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16_avx512(p: *const u8) -> std::arch::x86_64::__m512;
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

    /// # Safety
    /// As [`FloatElem::load8_avx2`]: AVX2, FMA and F16C available;
    /// `p..p + 8 * BYTES` readable.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8_avx2(p: *const u8) -> std::arch::x86_64::__m256 {
        unsafe { crate::simd::avx2::load_ps(p.cast()) }
    }

    /// # Safety
    /// As [`FloatElem::load16_avx512`].
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load16_avx512(p: *const u8) -> std::arch::x86_64::__m512 {
        unsafe { std::arch::x86_64::_mm512_loadu_ps(p.cast()) }
    }
}

impl FloatElem for F16 {
    const BYTES: usize = 2;

    #[inline]
    fn get(bytes: &[u8]) -> f32 {
        super::f16_le(*arr::<2>(bytes))
    }

    /// # Safety
    /// As [`FloatElem::load8_avx2`]: AVX2, FMA and F16C available;
    /// `p..p + 8 * BYTES` readable.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8_avx2(p: *const u8) -> std::arch::x86_64::__m256 {
        unsafe {
            use std::arch::x86_64::*;
            _mm256_cvtph_ps(crate::simd::avx2::load_128(p))
        }
    }

    /// # Safety
    /// As [`FloatElem::load16_avx512`].
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load16_avx512(p: *const u8) -> std::arch::x86_64::__m512 {
        unsafe {
            use std::arch::x86_64::*;
            _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()))
        }
    }
}

impl FloatElem for Bf16 {
    const BYTES: usize = 2;

    #[inline]
    fn get(bytes: &[u8]) -> f32 {
        f32::from_bits((u16::from_le_bytes(*arr::<2>(bytes)) as u32) << 16)
    }

    /// # Safety
    /// As [`FloatElem::load8_avx2`]: AVX2, FMA and F16C available;
    /// `p..p + 8 * BYTES` readable.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8_avx2(p: *const u8) -> std::arch::x86_64::__m256 {
        unsafe {
            use std::arch::x86_64::*;
            let h = crate::simd::avx2::load_128(p);
            _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
        }
    }

    /// # Safety
    /// As [`FloatElem::load16_avx512`].
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load16_avx512(p: *const u8) -> std::arch::x86_64::__m512 {
        unsafe {
            use std::arch::x86_64::*;
            let h = _mm256_loadu_si256(p.cast());
            _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
        }
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

/// A multi-row float matmul: weight rows, `n` activation rows `x` (row-major,
/// `cols` each) and where results go (`out[i * rows + r]`).
pub(crate) struct FloatJob<'a> {
    pub data: &'a [u8],
    pub row_bytes: usize,
    pub rows: usize,
    pub cols: usize,
    pub x: &'a [f32],
    pub out: &'a OutPtr,
}

/// Computes outputs of weight rows `r0..r1` against activation rows `i0..i1`.
pub(crate) type FloatRangeFn = unsafe fn(&FloatJob<'_>, usize, usize, usize, usize);

/// Activation rows per scalar pass over a weight row.
const SCALAR_ROWS: usize = 4;

/// Scalar multi-row: each weight element is read once per [`SCALAR_ROWS`]
/// activation rows; per output element, the operations of [`dot_scalar`].
///
/// # Safety
/// The caller owns output elements `(i, r)` for `i` in `i0..i1`, `r` in
/// `r0..r1` (no other thread writes them), as [`OutPtr::set`] requires.
/// (Reads are bounds-checked.)
pub(crate) unsafe fn range_scalar<E: FloatElem>(
    job: &FloatJob<'_>,
    r0: usize,
    r1: usize,
    i0: usize,
    i1: usize,
) {
    let cols = job.cols;
    for r in r0..r1 {
        let row = &job.data[r * job.row_bytes..(r + 1) * job.row_bytes];
        let mut i = i0;
        while i < i1 {
            let ct = (i1 - i).min(SCALAR_ROWS);
            let xs = &job.x[i * cols..(i + ct) * cols];
            let mut lanes = [[0.0f32; 32]; SCALAR_ROWS];
            for (k, b) in row.chunks_exact(E::BYTES).enumerate() {
                let wv = E::get(b);
                for (c, l) in lanes[..ct].iter_mut().enumerate() {
                    let lane = &mut l[k % 32];
                    *lane = wv.mul_add(xs[c * cols + k], *lane);
                }
            }
            for (c, l) in lanes[..ct].iter().enumerate() {
                // SAFETY: the caller owns output `(i + c, r)`.
                unsafe { job.out.set((i + c) * job.rows + r, tree32(l)) };
            }
            i += ct;
        }
    }
}

/// Where the rows of an `R x C` register tile start: weight rows `r..r + R`
/// and activation rows `i..i + C` of `job` (pointers only; the kernels read
/// them under their own safety contracts).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn tile_rows<const R: usize, const C: usize>(
    job: &FloatJob<'_>,
    r: usize,
    i: usize,
) -> ([*const u8; R], [*const f32; C]) {
    (
        std::array::from_fn(|t| job.data.as_ptr().wrapping_add((r + t) * job.row_bytes)),
        std::array::from_fn(|c| job.x.as_ptr().wrapping_add((i + c) * job.cols)),
    )
}

/// Writes an `R x C` tile's dots: weight row `r + t` against activation row
/// `i + c`.
///
/// # Safety
/// The caller owns those output elements ([`OutPtr::set`]).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn write_tile<const R: usize, const C: usize>(
    job: &FloatJob<'_>,
    r: usize,
    i: usize,
    res: &[[f32; C]; R],
) {
    for (t, row) in res.iter().enumerate() {
        for (c, &v) in row.iter().enumerate() {
            // SAFETY: the caller owns output `(i + c, r + t)`.
            unsafe { job.out.set((i + c) * job.rows + r + t, v) };
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use super::{FloatElem, FloatJob};
    use crate::simd::avx2::{lanes_ps, load_ps};
    use crate::simd::tree32;
    use std::arch::x86_64::*;

    /// Weight rows per register tile.
    const MR: usize = 4;
    /// Activation rows per register tile.
    const NR: usize = 2;

    /// The `R x C` tile of dots of weight rows `w[r]` with activation rows
    /// `x[c]` (`n` elements each), lane by lane as [`dot`]: for each of the 4
    /// lane vectors, the fused multiply-adds of its elements in order, then the
    /// tail elements and [`tree32`].
    ///
    /// # Safety
    /// AVX2, FMA and F16C available; `w[r]` holds `n` elements of `E`, `x[c]`
    /// `n` floats.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tile<E: FloatElem, const R: usize, const C: usize>(
        w: &[*const u8; R],
        x: &[*const f32; C],
        n: usize,
    ) -> [[f32; C]; R] {
        unsafe {
            let full = n / 32 * 32;
            let mut lanes = [[[0.0f32; 32]; C]; R];
            for j in 0..4 {
                let mut acc = [[_mm256_setzero_ps(); C]; R];
                let mut k = 8 * j;
                while k < full {
                    let mut xv = [_mm256_setzero_ps(); C];
                    for (c, v) in xv.iter_mut().enumerate() {
                        *v = load_ps(x[c].add(k));
                    }
                    for r in 0..R {
                        let wv = E::load8_avx2(w[r].add(k * E::BYTES));
                        for c in 0..C {
                            acc[r][c] = _mm256_fmadd_ps(wv, xv[c], acc[r][c]);
                        }
                    }
                    k += 32;
                }
                for r in 0..R {
                    for c in 0..C {
                        lanes[r][c][8 * j..8 * j + 8].copy_from_slice(&lanes_ps(acc[r][c]));
                    }
                }
            }
            let mut out = [[0.0f32; C]; R];
            for r in 0..R {
                for c in 0..C {
                    let l = &mut lanes[r][c];
                    for (t, lane) in l[..n - full].iter_mut().enumerate() {
                        let b =
                            std::slice::from_raw_parts(w[r].add((full + t) * E::BYTES), E::BYTES);
                        *lane = E::get(b).mul_add(*x[c].add(full + t), *lane);
                    }
                    out[r][c] = tree32(l);
                }
            }
            out
        }
    }

    /// Runs the `R x C` tile at weight rows `r..r + R`, activation rows
    /// `i..i + C`, writing the outputs.
    ///
    /// # Safety
    /// AVX2, FMA and F16C available; `job`'s shapes are consistent (as
    /// [`range`] asserts) and weight rows `r..r + R` and activation rows
    /// `i..i + C` exist; the caller owns those output elements.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn run_tile<E: FloatElem, const R: usize, const C: usize>(
        job: &FloatJob<'_>,
        r: usize,
        i: usize,
    ) {
        unsafe {
            let (w, x) = super::tile_rows::<R, C>(job, r, i);
            let res = tile::<E, R, C>(&w, &x, job.cols);
            super::write_tile(job, r, i, &res);
        }
    }

    /// AVX2 multi-row: weight rows `r0..r1` x activation rows `i0..i1` in
    /// register tiles of 4 x 2, activation rows in L2-sized chunks.
    ///
    /// # Safety
    /// AVX2, FMA and F16C available; the caller owns output elements `(i, r)`
    /// for `i` in `i0..i1`, `r` in `r0..r1`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn range<E: FloatElem>(
        job: &FloatJob<'_>,
        r0: usize,
        r1: usize,
        i0: usize,
        i1: usize,
    ) {
        unsafe {
            assert!(
                job.row_bytes == job.cols * E::BYTES
                    && job.data.len() >= r1 * job.row_bytes
                    && job.x.len() >= i1 * job.cols,
                "float kernel: inconsistent shapes"
            );
            // Activation rows in chunks that stay in L2 while every weight tile
            // runs against them.
            let chunk = crate::quant::multi_row::act_chunk_rows(4 * job.cols);
            let mut c0 = i0;
            while c0 < i1 {
                let c1 = (c0 + chunk).min(i1);
                let mut t0 = r0;
                while t0 < r1 {
                    let rt = (r1 - t0).min(MR);
                    let mut i = c0;
                    while i < c1 {
                        let ct = (c1 - i).min(NR);
                        if rt == MR && ct == NR {
                            run_tile::<E, MR, NR>(job, t0, i);
                        } else if rt == MR {
                            for c in 0..ct {
                                run_tile::<E, MR, 1>(job, t0, i + c);
                            }
                        } else if ct == NR {
                            for r in 0..rt {
                                run_tile::<E, 1, NR>(job, t0 + r, i);
                            }
                        } else {
                            for r in 0..rt {
                                for c in 0..ct {
                                    run_tile::<E, 1, 1>(job, t0 + r, i + c);
                                }
                            }
                        }
                        i += ct;
                    }
                    t0 += rt;
                }
                c0 = c1;
            }
        }
    }

    /// AVX2 dot of one row; bit-identical to [`super::dot_scalar`].
    ///
    /// # Safety
    /// AVX2, FMA and F16C must be available; `w` holds at least `x.len()`
    /// elements.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot<E: FloatElem>(w: &[u8], x: &[f32]) -> f32 {
        unsafe {
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
        unsafe {
            assert!(
                row_bytes == x.len() * E::BYTES && w.len() >= out.len() * row_bytes,
                "float kernel: inconsistent shapes"
            );
            for (row, o) in w.chunks_exact(row_bytes).zip(out.iter_mut()) {
                *o = dot::<E>(row, x);
            }
        }
    }
}

/// AVX-512 multi-row: the same lanes as [`avx2`], sixteen of them per
/// register (lanes 0-15 and 16-31 of each dot in two registers), so a
/// register tile of 4 weight rows x 2 activation rows keeps all 32 lanes of
/// its 8 dots in 16 registers and reads every row contiguously (4 x 3,
/// 3 x 3 and 6 x 2 measured 40-45% slower: their accumulators and operands
/// spill). F16 and BF16 tiles are widened to f32 once per chunk of
/// activation rows. Each lane
/// gets the same fused multiply-adds in the same order as on every other
/// path, and the lanes are reduced as [`tree32`] does: bit for bit the
/// scalar result.
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512 {
    use super::{FloatElem, FloatJob};
    use crate::simd::avx2::tree8_ps;
    use std::arch::x86_64::*;

    const MR: usize = 4;
    const NR: usize = 2;

    /// # Safety
    /// AVX2, FMA, F16C and AVX-512F available; `w[r]` holds `n` elements of
    /// `E` and `x[c]` `n` floats, `n` a multiple of 32.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    unsafe fn tile<E: FloatElem, const R: usize, const C: usize>(
        w: &[*const u8; R],
        x: &[*const f32; C],
        n: usize,
    ) -> [[f32; C]; R] {
        unsafe {
            let mut lo = [[_mm512_setzero_ps(); C]; R];
            let mut hi = [[_mm512_setzero_ps(); C]; R];
            let mut k = 0;
            while k < n {
                let mut xl = [_mm512_setzero_ps(); C];
                let mut xh = [_mm512_setzero_ps(); C];
                for c in 0..C {
                    xl[c] = _mm512_loadu_ps(x[c].add(k));
                    xh[c] = _mm512_loadu_ps(x[c].add(k + 16));
                }
                for r in 0..R {
                    let wl = E::load16_avx512(w[r].add(k * E::BYTES));
                    let wh = E::load16_avx512(w[r].add((k + 16) * E::BYTES));
                    for c in 0..C {
                        lo[r][c] = _mm512_fmadd_ps(wl, xl[c], lo[r][c]);
                        hi[r][c] = _mm512_fmadd_ps(wh, xh[c], hi[r][c]);
                    }
                }
                k += 32;
            }
            let mut out = [[0.0f32; C]; R];
            for r in 0..R {
                for c in 0..C {
                    // tree32's first step, (l[j] + l[j+8]) + (l[j+16] + l[j+24]),
                    // as whole registers, then tree8.
                    let a = _mm256_add_ps(
                        _mm512_castps512_ps256(lo[r][c]),
                        _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(lo[r][c]), 1)),
                    );
                    let b = _mm256_add_ps(
                        _mm512_castps512_ps256(hi[r][c]),
                        _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(hi[r][c]), 1)),
                    );
                    out[r][c] = tree8_ps(_mm256_add_ps(a, b));
                }
            }
            out
        }
    }

    /// # Safety
    /// As [`tile`]; weight rows `r..r + R` and activation rows `i..i + C`
    /// exist and the caller owns those outputs.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    unsafe fn run_tile<E: FloatElem, const R: usize, const C: usize>(
        job: &FloatJob<'_>,
        r: usize,
        i: usize,
    ) {
        unsafe {
            let (w, x) = super::tile_rows::<R, C>(job, r, i);
            let res = tile::<E, R, C>(&w, &x, job.cols);
            super::write_tile(job, r, i, &res);
        }
    }

    /// The `rt x ct` tile at weight rows `r..`, activation rows `i..`.
    ///
    /// # Safety
    /// As [`run_tile`].
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    unsafe fn run_any<E: FloatElem>(job: &FloatJob<'_>, r: usize, rt: usize, i: usize, ct: usize) {
        unsafe {
            match (rt, ct) {
                (4, 2) => run_tile::<E, 4, 2>(job, r, i),
                (4, _) => run_tile::<E, 4, 1>(job, r, i),
                (3, 2) => run_tile::<E, 3, 2>(job, r, i),
                (3, _) => run_tile::<E, 3, 1>(job, r, i),
                (2, 2) => run_tile::<E, 2, 2>(job, r, i),
                (2, _) => run_tile::<E, 2, 1>(job, r, i),
                (_, 2) => run_tile::<E, 1, 2>(job, r, i),
                _ => run_tile::<E, 1, 1>(job, r, i),
            }
        }
    }

    /// [`run_any`] for weight rows `r..r + rt` of `job` widened to f32 in
    /// `wide` (`MR` rows of `job.cols`; rows past `rt` are read and their
    /// results dropped).
    ///
    /// # Safety
    /// As [`run_tile`]; `wide` holds `MR * job.cols` floats.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    unsafe fn run_widened(
        job: &FloatJob<'_>,
        wide: *const f32,
        r: usize,
        rt: usize,
        i: usize,
        ct: usize,
    ) {
        unsafe {
            let mut w = [wide.cast::<u8>(); MR];
            for (t, p) in w.iter_mut().enumerate() {
                *p = p.add(t * job.cols * 4);
            }
            // Rows past `ct` repeat the last one; their results are dropped.
            let mut x = [job.x.as_ptr(); NR];
            for (c, p) in x.iter_mut().enumerate() {
                *p = p.add((i + c.min(ct - 1)) * job.cols);
            }
            let res = tile::<super::F32, MR, NR>(&w, &x, job.cols);
            for (t, row) in res.iter().enumerate().take(rt) {
                for (c, &v) in row.iter().enumerate().take(ct) {
                    job.out.set((i + c) * job.rows + r + t, v);
                }
            }
        }
    }

    /// Weight rows `r0..r1` x activation rows `i0..i1`; rows whose length
    /// is not a multiple of 32 go to [`super::avx2::range`] (same bits).
    ///
    /// # Safety
    /// AVX2, FMA, F16C and AVX-512F available; the caller owns output
    /// elements `(i, r)` for `i` in `i0..i1`, `r` in `r0..r1`.
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    pub(crate) unsafe fn range<E: FloatElem>(
        job: &FloatJob<'_>,
        r0: usize,
        r1: usize,
        i0: usize,
        i1: usize,
    ) {
        unsafe {
            if !job.cols.is_multiple_of(32) {
                return super::avx2::range::<E>(job, r0, r1, i0, i1);
            }
            assert!(
                job.row_bytes == job.cols * E::BYTES
                    && job.data.len() >= r1 * job.row_bytes
                    && job.x.len() >= i1 * job.cols,
                "float kernel: inconsistent shapes"
            );
            let chunk = crate::quant::multi_row::act_chunk_rows(4 * job.cols);
            // F16 and BF16 tiles are widened to f32 once per chunk of
            // activation rows (exactly: both convert without rounding), not
            // once per pair of rows: the conversions would cost more than
            // the multiply-adds.
            let widen = E::BYTES != 4;
            let mut wide = vec![0.0f32; if widen { MR * job.cols } else { 0 }];
            let mut c0 = i0;
            while c0 < i1 {
                let c1 = (c0 + chunk).min(i1);
                let mut t0 = r0;
                while t0 < r1 {
                    let rt = (r1 - t0).min(MR);
                    if widen {
                        for r in 0..rt {
                            let src = job.data.as_ptr().add((t0 + r) * job.row_bytes);
                            let dst = wide.as_mut_ptr().add(r * job.cols);
                            for k in (0..job.cols).step_by(16) {
                                _mm512_storeu_ps(
                                    dst.add(k),
                                    E::load16_avx512(src.add(k * E::BYTES)),
                                );
                            }
                        }
                    }
                    let mut i = c0;
                    while i < c1 {
                        let ct = (c1 - i).min(NR);
                        if widen {
                            run_widened(job, wide.as_ptr(), t0, rt, i, ct);
                        } else {
                            run_any::<E>(job, t0, rt, i, ct);
                        }
                        i += ct;
                    }
                    t0 += rt;
                }
                c0 = c1;
            }
        }
    }
}
