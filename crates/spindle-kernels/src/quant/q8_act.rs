//! Activation quantization: f32 rows to symmetric int8 blocks, the right-hand
//! side of every quantized matmul.
//!
//! By default one format, [`ActFormat::Block32`], for every quantized weight
//! type: blocks of 32 values, one f32 scale each (like ggml's Q8_0, with an
//! f32 scale), plus each block's sum of quantized values. The K types (whose
//! super-blocks are 256 values) use it too: a scale per 32 values keeps
//! outlier-heavy activations far more accurate than one per 256 (ggml's Q8_K).
//!
//! [`ActRounding::Ggml`] rounds as llama.cpp does instead, for side-by-side
//! checks: the types ggml multiplies with Q8_K get [`ActFormat::Super256`],
//! one scale per 256 values, stored in the same per-32 layout (the scale
//! repeated for each of its 8 blocks), so every kernel reads it unchanged;
//! the others get [`ActFormat::Block32F16`], whose scales are rounded to f16
//! as ggml's Q8_0 stores them.
//!
//! A block with largest magnitude `amax` gets scale `d = amax / 127` and values
//! `q = round_ties_even(x * 127 / amax)`, always in `-127..=127` (never -128,
//! which the AVX2 sign trick relies on). The layout is struct-of-arrays: all
//! quantized values of a row are contiguous, then the scales, then the sums.

use crate::error::KernelError;
use crate::simd::{detected_isa, Isa};
use spindle_formats::GgmlType;

/// The block shape activations are quantized to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ActFormat {
    /// 32 values per f32 scale, with per-32 sums.
    #[default]
    Block32,
    /// 256 values per f32 scale (ggml's Q8_K rounding), laid out as
    /// `Block32`: one entry of [`ActRow::d`] and of [`ActRow::bsums`] per 32
    /// values, the scale repeated across its 8 blocks.
    Super256,
    /// `Block32` with each scale rounded to f16 (ggml's Q8_0 and Q8_1
    /// store theirs so); the values are the same as `Block32`'s.
    Block32F16,
}

impl ActFormat {
    /// Values per entry of [`ActRow::d`] and [`ActRow::bsums`] (the layout
    /// every kernel reads).
    pub fn block_len(self) -> usize {
        32
    }

    /// Values that share one scale (what a row's length must be a multiple
    /// of).
    pub fn scale_len(self) -> usize {
        match self {
            ActFormat::Block32 | ActFormat::Block32F16 => 32,
            ActFormat::Super256 => 256,
        }
    }

    /// The activation format quantized weights of type `ty` are multiplied
    /// with, or `None` for float weights (which use f32 activations).
    pub fn for_weights(ty: GgmlType) -> Option<ActFormat> {
        super::registry::of(ty).act
    }
}

/// How activations are rounded to int8 for quantized weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ActRounding {
    /// One scale per 32 values for every quantized type (the most exact).
    #[default]
    Block32,
    /// As llama.cpp (ggml) rounds: one scale per 256 values for the types it
    /// multiplies with Q8_K (the K-quants Q2_K..Q6_K, the i-quants but
    /// IQ4_NL, TQ1_0/TQ2_0), one f16 scale per 32 for the rest. For
    /// comparing the two engines number for number; coarser on
    /// outlier-heavy activations.
    Ggml,
}

impl ActRounding {
    /// The activation format weights of type `ty` are multiplied with under
    /// this rounding, or `None` for float weights.
    pub fn format_for(self, ty: GgmlType) -> Option<ActFormat> {
        let entry = super::registry::of(ty);
        match self {
            ActRounding::Block32 => entry.act,
            ActRounding::Ggml => entry.ggml_act,
        }
    }
}

impl std::str::FromStr for ActRounding {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "block32" => Ok(ActRounding::Block32),
            "ggml" => Ok(ActRounding::Ggml),
            other => Err(format!(
                "unknown activation rounding {other:?}: use block32 (the default) or ggml"
            )),
        }
    }
}

/// One quantized activation row, borrowed.
#[derive(Debug, Clone, Copy)]
pub struct ActRow<'a> {
    /// `cols` quantized values.
    pub qs: &'a [i8],
    /// One scale per block.
    pub d: &'a [f32],
    /// The sum of each block's quantized values (one per block).
    pub bsums: &'a [i16],
}

/// A batch of quantized activation rows. Reusable: `quantize` keeps the
/// buffers, so repeated calls with the same or smaller shapes do not allocate.
#[derive(Debug, Default, Clone)]
pub struct QuantizedActs {
    format: ActFormat,
    n: usize,
    cols: usize,
    qs: Vec<i8>,
    d: Vec<f32>,
    bsums: Vec<i16>,
}

impl QuantizedActs {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// Quantizes `n` rows of `cols` values (`x` is row-major, `n * cols`
    /// long). `cols` must be a multiple of the format's block length.
    pub fn quantize(
        &mut self,
        format: ActFormat,
        x: &[f32],
        n: usize,
        cols: usize,
    ) -> Result<(), KernelError> {
        self.quantize_with_isa(detected_isa(), format, x, n, cols)
    }

    /// [`quantize`](Self::quantize) on a chosen ISA (all ISAs give the same
    /// bits); an ISA this CPU lacks is an error.
    pub fn quantize_with_isa(
        &mut self,
        isa: Isa,
        format: ActFormat,
        x: &[f32],
        n: usize,
        cols: usize,
    ) -> Result<(), KernelError> {
        self.quantize_on(isa, format, x, n, cols, None)
    }

    /// [`quantize_with_isa`](Self::quantize_with_isa), its rows split over
    /// `pool`'s threads when the batch is large (every row is quantized by
    /// the same operations whoever takes it: the same bits).
    pub fn quantize_on(
        &mut self,
        isa: Isa,
        format: ActFormat,
        x: &[f32],
        n: usize,
        cols: usize,
        pool: Option<&crate::threadpool::ThreadPool>,
    ) -> Result<(), KernelError> {
        if !isa.is_available() {
            return Err(KernelError::unsupported(format!("ISA {isa} on this CPU")));
        }
        let bl = format.block_len();
        let group = format.scale_len();
        if !cols.is_multiple_of(group) {
            return Err(KernelError::NotBlockAligned {
                what: "activation row".into(),
                len: cols,
                block_len: group,
            });
        }
        let total = n
            .checked_mul(cols)
            .ok_or_else(|| KernelError::unsupported("activation batch size overflows"))?;
        if x.len() != total {
            return Err(KernelError::size(
                "activation values (n * cols)",
                total,
                x.len(),
            ));
        }
        self.format = format;
        self.n = n;
        self.cols = cols;
        self.qs.resize(total, 0);
        self.d.resize(total / bl, 0.0);
        self.bsums.resize(total / bl, 0);

        match pool {
            Some(pool) if pool.n_threads() > 1 && total >= PARALLEL_VALUES => {
                // Whole rows per thread; each part's buffers are disjoint.
                let parts = Parts {
                    qs: self.qs.as_mut_ptr(),
                    d: self.d.as_mut_ptr(),
                    bsums: self.bsums.as_mut_ptr(),
                };
                let nb = cols / bl;
                // Borrowed whole (not its fields), so the closure is Sync.
                let parts = &parts;
                pool.run(&|t, nt| {
                    let share = crate::threadpool::row_share(n, t, nt);
                    let (r0, r1) = (share.start, share.end);
                    if r0 == r1 {
                        return;
                    }
                    let x = &x[r0 * cols..r1 * cols];
                    // SAFETY: the ranges of rows r0..r1 of the three buffers
                    // (sized above) are this thread's alone, and the buffers
                    // outlive `pool.run`.
                    let (qs, d, bsums) = unsafe {
                        (
                            std::slice::from_raw_parts_mut(parts.qs.add(r0 * cols), x.len()),
                            std::slice::from_raw_parts_mut(parts.d.add(r0 * nb), (r1 - r0) * nb),
                            std::slice::from_raw_parts_mut(
                                parts.bsums.add(r0 * nb),
                                (r1 - r0) * nb,
                            ),
                        )
                    };
                    quantize_rows(isa, format, x, qs, d, bsums);
                });
            }
            _ => quantize_rows(isa, format, x, &mut self.qs, &mut self.d, &mut self.bsums),
        }
        Ok(())
    }

    /// The format of the last `quantize`.
    pub fn format(&self) -> ActFormat {
        self.format
    }

    /// Rows in the batch.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Values per row.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Row `i`, or `None` when out of range.
    pub fn row(&self, i: usize) -> Option<ActRow<'_>> {
        if i >= self.n {
            return None;
        }
        let bl = self.format.block_len();
        let nb = self.cols / bl;
        Some(ActRow {
            qs: &self.qs[i * self.cols..(i + 1) * self.cols],
            d: &self.d[i * nb..(i + 1) * nb],
            bsums: &self.bsums[i * nb..(i + 1) * nb],
        })
    }

    /// The values row `i` stands for (`q * d`, in f32), for tests and
    /// references.
    pub fn dequantize_row(&self, i: usize, dst: &mut [f32]) -> Result<(), KernelError> {
        let row = self
            .row(i)
            .ok_or_else(|| KernelError::size("activation row index (< n)", self.n, i))?;
        if dst.len() != self.cols {
            return Err(KernelError::size(
                "dequantized activation row",
                self.cols,
                dst.len(),
            ));
        }
        let bl = self.format.block_len();
        for ((qb, &d), out) in row
            .qs
            .chunks_exact(bl)
            .zip(row.d)
            .zip(dst.chunks_exact_mut(bl))
        {
            for (&q, o) in qb.iter().zip(out) {
                *o = q as f32 * d;
            }
        }
        Ok(())
    }
}

/// From this many values on, [`QuantizedActs::quantize_on`] splits rows
/// over the pool (below, waking it costs more).
const PARALLEL_VALUES: usize = 64 * 1024;

/// The three buffers of a batch being quantized, shared by the threads of
/// one `pool.run`, each writing only its own rows.
struct Parts {
    qs: *mut i8,
    d: *mut f32,
    bsums: *mut i16,
}

// SAFETY: the threads write disjoint row ranges (see `quantize_on`), and
// the buffers outlive the `pool.run` that uses them.
unsafe impl Sync for Parts {}

/// Quantizes whole rows `x` into `qs`, `d` and `bsums` (the rows' parts of
/// the batch's buffers): the same operations whichever rows a call gets.
/// The ISA was checked available by the caller.
fn quantize_rows(
    isa: Isa,
    format: ActFormat,
    x: &[f32],
    qs: &mut [i8],
    d: &mut [f32],
    bsums: &mut [i16],
) {
    let bl = format.block_len();
    let group = format.scale_len();
    // One scale per `group` values into the front of `d`, then spread over
    // the group's blocks (back to front: a group's entries never overwrite
    // a scale not yet spread).
    let groups = x.len() / group;
    let scales = &mut d[..groups];
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the caller checked the ISA (AVX2 for these paths).
        Isa::Avx2 | Isa::Avx512Vnni | Isa::Amx => unsafe {
            avx2::quantize_blocks(x, qs, scales, group)
        },
        _ => {
            for ((xb, qb), d) in x
                .chunks_exact(group)
                .zip(qs.chunks_exact_mut(group))
                .zip(scales.iter_mut())
            {
                *d = quantize_block(xb, qb);
            }
        }
    }
    if format == ActFormat::Block32F16 {
        for d in scales.iter_mut() {
            *d = half::f16::from_f32(*d).to_f32();
        }
    }
    let per_group = group / bl;
    if per_group > 1 {
        for g in (0..groups).rev() {
            let v = d[g];
            d[g * per_group..(g + 1) * per_group].fill(v);
        }
    }
    for (run, s) in qs.chunks_exact(bl).zip(bsums.iter_mut()) {
        // At most 32 * 127 in magnitude.
        *s = run.iter().map(|&q| q as i16).sum();
    }
}

/// Quantizes one block, returning its scale (scalar reference).
fn quantize_block(x: &[f32], q: &mut [i8]) -> f32 {
    // NaN values are ignored by `max`.
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let (d, id) = scales(amax);
    for (&v, q) in x.iter().zip(q.iter_mut()) {
        // NaN becomes 0 through the saturating cast; the clamp keeps -128 out.
        *q = (v * id).round_ties_even().clamp(-127.0, 127.0) as i8;
    }
    d
}

/// The block scale `d` and its inverse multiplier for a block maximum.
#[inline]
fn scales(amax: f32) -> (f32, f32) {
    let id = if amax > 0.0 { 127.0 / amax } else { 0.0 };
    (amax / 127.0, id)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use crate::simd::avx2::load_ps;
    use std::arch::x86_64::*;

    /// AVX2 version of the scalar block loop, bit-identical to it: the same
    /// maximum (exact), the same `x * id` products, ties-to-even rounding,
    /// NaN to 0 and the same clamp.
    ///
    /// # Safety
    /// AVX2, FMA and F16C available. (The shapes, `bl` a multiple of 32 and
    /// `x.len() == q.len() == d.len() * bl`, are asserted.)
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn quantize_blocks(x: &[f32], q: &mut [i8], d: &mut [f32], bl: usize) {
        unsafe {
            assert!(bl.is_multiple_of(32) && x.len() == q.len() && x.len() == d.len() * bl);
            let sign = _mm256_set1_ps(-0.0);
            let hi = _mm256_set1_ps(127.0);
            let lo = _mm256_set1_ps(-127.0);
            let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
            for ((xb, qb), d) in x.chunks_exact(bl).zip(q.chunks_exact_mut(bl)).zip(d) {
                let xp = xb.as_ptr();
                let mut m = _mm256_setzero_ps();
                for k in (0..bl).step_by(8) {
                    // max(v, m) returns m when v is NaN: NaN is ignored.
                    m = _mm256_max_ps(_mm256_andnot_ps(sign, load_ps(xp.add(k))), m);
                }
                let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
                let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
                let amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_shuffle_ps(m2, m2, 1)));
                let (scale, id) = super::scales(amax);
                *d = scale;
                let idv = _mm256_set1_ps(id);
                let qp = qb.as_mut_ptr();
                for k in (0..bl).step_by(32) {
                    let mut ints = [_mm256_setzero_si256(); 4];
                    for (j, out) in ints.iter_mut().enumerate() {
                        let v = _mm256_mul_ps(load_ps(xp.add(k + 8 * j)), idv);
                        let r = _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                        let r = _mm256_and_ps(r, _mm256_cmp_ps(r, r, _CMP_ORD_Q));
                        let r = _mm256_max_ps(_mm256_min_ps(r, hi), lo);
                        *out = _mm256_cvtps_epi32(r);
                    }
                    // Saturating packs interleave the 128-bit halves; undo that.
                    let w01 = _mm256_packs_epi32(ints[0], ints[1]);
                    let w23 = _mm256_packs_epi32(ints[2], ints[3]);
                    let b = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(w01, w23), order);
                    // In bounds: `qb` has `bl` bytes and `k + 32 <= bl`.
                    _mm256_storeu_si256(qp.add(k).cast(), b);
                }
            }
        }
    }
}
