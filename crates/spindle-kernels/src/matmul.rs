// One file (about 850 lines) on purpose: the entry point, the kernel table
// and the work split are one argument. Each output element is computed by
// one thread with the same operations (batch invariance, below), and the
// soundness of every `unsafe` call here (ISA checked in `check_call`,
// outputs disjoint by the split, `OutPtr`) rests on all three together.

//! `out = x · Wᵀ` for a weight matrix in any supported type.
//!
//! Quantized weights: each activation row is quantized once per call to int8
//! blocks ([`ActFormat`]), each block dot is an exact int32, scaled and folded
//! into f32 lanes in a fixed order. Float weights (F32/F16/BF16): an f32 dot
//! with the f32 activations.
//!
//! One activation row (decode): work is split by weight rows; each thread
//! takes a contiguous range and, tile by tile, runs the row against the tile.
//!
//! Several rows (prefill, batches, verification): the multi-row kernels of
//! `quant::multi_row` (and [`float`]) decode each weight block once per chunk
//! of activation rows and multiply it against register tiles of 4 weight rows
//! x 2 activation rows. The threads take work items (a chunk of activation
//! rows x a block of weight-row tiles) from a shared counter; activations are
//! quantized (and packed) once per call, before the split.
//!
//! **Batch invariance**: `out[i, r]` is computed by one thread, by the same
//! code, reducing in the same order whatever `n`, the other rows of `x`, or the
//! thread count; scalar and AVX2 paths perform the same float operations, so
//! results are bit-identical across all of these.

use crate::error::KernelError;
use crate::out_ptr::OutPtr;
use crate::quant::kernels::{FloatRowsFn, Grain, Kernel, QuantMulti, QuantRowsFn};
use crate::quant::multi_row::{self, ActGroup, QuantJob, QuantRangeFn};
use crate::quant::panels::{check_shape as check_panels, from_panels};
use crate::quant::q8_act::{ActFormat, ActRounding, QuantizedActs};
use crate::quant::vertical::{from_vertical, vertical_supported};
use crate::quant::WeightLayout;
use crate::quant::{checked_bytes, float, registry};
use crate::simd::{detected_isa, Isa};
use crate::threadpool::{row_share, ThreadPool};
use spindle_formats::GgmlType;
use std::cell::RefCell;

/// A row-major weight matrix borrowed from model storage: row `r` (output
/// feature `r`) is bytes `r * row_bytes .. (r + 1) * row_bytes`.
#[derive(Debug, Clone, Copy)]
pub struct WeightView<'a> {
    pub ty: GgmlType,
    /// Output features.
    pub rows: usize,
    /// Input features (a multiple of the type's block length).
    pub cols: usize,
    pub data: &'a [u8],
    /// How `data` is ordered (the file's order unless rewritten at load).
    pub layout: WeightLayout,
}

impl<'a> WeightView<'a> {
    /// Checks that `cols` is whole blocks and `data` is exactly
    /// `rows * row_bytes` bytes.
    pub fn new(
        ty: GgmlType,
        rows: usize,
        cols: usize,
        data: &'a [u8],
    ) -> Result<Self, KernelError> {
        let w = WeightView {
            ty,
            rows,
            cols,
            data,
            layout: WeightLayout::Gguf,
        };
        w.validate()?;
        Ok(w)
    }

    /// The same matrix, its bytes in `layout` (checked by `matmul`: a
    /// vertical matrix must be one [`vertical_supported`] allows).
    pub fn with_layout(self, layout: WeightLayout) -> Self {
        WeightView { layout, ..self }
    }

    /// Bytes per row: `ty.bytes_for(cols)`. Meaningful once validated (0 when
    /// `cols` is not whole blocks).
    pub fn row_bytes(&self) -> usize {
        checked_bytes(self.ty, self.cols, "weight row").unwrap_or(0)
    }

    fn validate(&self) -> Result<usize, KernelError> {
        let row_bytes = checked_bytes(self.ty, self.cols, "weight row")?;
        let total = row_bytes
            .checked_mul(self.rows)
            .ok_or_else(|| KernelError::unsupported("weight matrix size overflows"))?;
        if self.layout == WeightLayout::Vertical && !vertical_supported(self.ty, self.cols) {
            return Err(KernelError::unsupported(format!(
                "vertical layout for {} rows of {}",
                self.ty, self.cols
            )));
        }
        if self.layout == WeightLayout::Panels {
            check_panels(self.ty, self.rows, self.cols)?;
        }
        if self.data.len() != total {
            return Err(KernelError::size(
                format!("{} weight bytes ({} x {})", self.ty, self.rows, self.cols),
                total,
                self.data.len(),
            ));
        }
        Ok(row_bytes)
    }
}

/// `out[i * w.rows + r] = dot(row r of w, row i of x)` for `x` of `n` rows of
/// `w.cols` values, on the best ISA ([`detected_isa`]).
pub fn matmul(
    w: &WeightView<'_>,
    x: &[f32],
    n: usize,
    out: &mut [f32],
    pool: &ThreadPool,
) -> Result<(), KernelError> {
    matmul_with_isa(detected_isa(), w, x, n, out, pool)
}

/// [`matmul`] on a chosen ISA; an ISA this CPU lacks is an error.
pub fn matmul_with_isa(
    isa: Isa,
    w: &WeightView<'_>,
    x: &[f32],
    n: usize,
    out: &mut [f32],
    pool: &ThreadPool,
) -> Result<(), KernelError> {
    matmul_with(isa, ActRounding::default(), w, x, n, out, pool)
}

/// [`matmul_with_isa`] with activations rounded as `rounding` says (for
/// quantized weights; float weights always multiply f32 activations).
pub fn matmul_with(
    isa: Isa,
    rounding: ActRounding,
    w: &WeightView<'_>,
    x: &[f32],
    n: usize,
    out: &mut [f32],
    pool: &ThreadPool,
) -> Result<(), KernelError> {
    matmul_shared(isa, rounding, &mut [(*w, out)], x, n, pool)
}

/// Several matrices times the same activations, `parts[m].1 = x ·
/// parts[m].0ᵀ`, bit-identical to one [`matmul_with`] call per matrix.
/// Neighbouring matrices of one type, width and layout (a layer's query
/// and key projections, its gate and up projections) share one
/// quantization and packing of `x` and one run of the pool, whose threads
/// take their work from all of them: per call, that work was serial (the
/// packing) or a thread's wait at the end of a small matrix.
pub fn matmul_shared(
    isa: Isa,
    rounding: ActRounding,
    parts: &mut [(WeightView<'_>, &mut [f32])],
    x: &[f32],
    n: usize,
    pool: &ThreadPool,
) -> Result<(), KernelError> {
    for (w, out) in parts.iter() {
        check_call(isa, w, x, n, (out.len(), n, "matmul output (n * rows)"))?;
    }
    let alike = |a: &(WeightView<'_>, &mut [f32]), b: &(WeightView<'_>, &mut [f32])| {
        (a.0.ty, a.0.cols, a.0.layout) == (b.0.ty, b.0.cols, b.0.layout)
    };
    for group in parts.chunk_by_mut(alike) {
        matmul_group(isa, rounding, group, x, n, pool, None)?;
    }
    Ok(())
}

/// Checks one call's shapes and ISA: `out` is the output's length, the
/// rows of outputs it must hold, and what to call it in an error.
fn check_call(
    isa: Isa,
    w: &WeightView<'_>,
    x: &[f32],
    n: usize,
    (out_len, out_rows, what): (usize, usize, &str),
) -> Result<(), KernelError> {
    w.validate()?;
    let in_len = n
        .checked_mul(w.cols)
        .ok_or_else(|| KernelError::unsupported("activation size overflows"))?;
    if x.len() != in_len {
        return Err(KernelError::size(
            "matmul input (n * cols)",
            in_len,
            x.len(),
        ));
    }
    let want = out_rows
        .checked_mul(w.rows)
        .ok_or_else(|| KernelError::unsupported("output size overflows"))?;
    if out_len != want {
        return Err(KernelError::size(what, want, out_len));
    }
    if !isa.is_available() {
        return Err(KernelError::unsupported(format!("ISA {isa} on this CPU")));
    }
    Ok(())
}

/// `x · wᵀ` for the activation rows `keep` marks, into `out` (the `k`-th
/// kept row's outputs are `out[k * w.rows..(k + 1) * w.rows]`), while
/// every other row's outputs are handed to `visit(i, r0, values)` as they
/// are computed: `values` are outputs `r0..r0 + values.len()` of row `i`,
/// each output in exactly one piece, pieces in no particular order and
/// possibly on several threads at once. The same bits as [`matmul_with`].
///
/// For rows reduced as soon as they exist (the token a sampler picks from
/// an output head's logits): with several rows and a kernel that reads
/// packed activations, a visited row's outputs are never stored whole
/// (a 262k-token head writes 1 MB a row, read back from memory by the
/// sampler), and the reduction runs on every thread while its piece is in
/// cache. Otherwise every row is computed first and visited whole.
#[allow(clippy::too_many_arguments)]
pub fn matmul_visit(
    isa: Isa,
    rounding: ActRounding,
    w: &WeightView<'_>,
    x: &[f32],
    n: usize,
    keep: &[bool],
    out: &mut [f32],
    pool: &ThreadPool,
    visit: &(dyn Fn(usize, usize, &mut [f32]) + Sync),
) -> Result<(), KernelError> {
    if keep.len() != n {
        return Err(KernelError::size(
            "rows marked kept or visited",
            n,
            keep.len(),
        ));
    }
    let kept = keep.iter().filter(|&&k| k).count();
    check_call(
        isa,
        w,
        x,
        n,
        (out.len(), kept, "kept rows' outputs (kept * rows)"),
    )?;
    if kept == n {
        return matmul_with(isa, rounding, w, x, n, out, pool);
    }
    let mut kept_at = Vec::with_capacity(n);
    let mut k = 0;
    for &keep in keep {
        kept_at.push(keep.then(|| {
            k += 1;
            k - 1
        }));
    }
    if !visits_in_place(isa, rounding, w, n) {
        return with_scratch(&PIECES, Vec::new, |all| {
            all.resize(n * w.rows, 0.0);
            matmul_with(isa, rounding, w, x, n, all, pool)?;
            for (i, at) in kept_at.iter().enumerate() {
                let row = &mut all[i * w.rows..(i + 1) * w.rows];
                match at {
                    Some(k) => out[k * w.rows..(k + 1) * w.rows].copy_from_slice(row),
                    None => visit(i, 0, row),
                }
            }
            Ok(())
        });
    }
    let sink = Sink {
        kept_at,
        out: OutPtr::new(out),
        stride: w.rows,
        visit,
    };
    matmul_group(isa, rounding, &mut [(*w, &mut [])], x, n, pool, Some(&sink))
}

/// Whether [`matmul_visit`] computes `w`'s outputs piece by piece: several
/// rows, and a quantized kernel that reads packed activations from the
/// matrix's layout.
fn visits_in_place(isa: Isa, rounding: ActRounding, w: &WeightView<'_>, n: usize) -> bool {
    n >= MULTI_ROWS && w.rows > 0 && w.cols > 0 && shares_activations(isa, rounding, w, n)
}

/// Outputs a [`matmul_visit`] work item computes at most: 64 KiB of f32,
/// read back from L2 right after.
const VISIT_ITEM: usize = 64 * 1024;

/// Where a [`matmul_visit`]'s outputs go: kept rows into `out` (`stride`
/// values a row), the others to `visit`.
struct Sink<'a> {
    kept_at: Vec<Option<usize>>,
    out: OutPtr,
    stride: usize,
    visit: &'a (dyn Fn(usize, usize, &mut [f32]) + Sync),
}

impl Sink<'_> {
    /// One work item: `range` computes outputs `(i0..i1) x (r0..r1)` of
    /// `job` into this thread's scratch, then each row's piece is kept or
    /// visited.
    fn item(
        &self,
        range: QuantRangeFn,
        job: &QuantJob<'_>,
        r0: usize,
        r1: usize,
        i0: usize,
        i1: usize,
    ) {
        let cols = r1 - r0;
        let need = (i1 - i0) * cols;
        with_scratch(&PIECES, Vec::new, |buf| {
            if buf.len() < need {
                buf.resize(need, 0.0);
            }
            let buf = &mut buf[..need];
            let window = OutPtr::window(buf, self.stride, i0, r0, cols);
            let job = QuantJob {
                out: &window,
                ..*job
            };
            // SAFETY: as for every multi-row call in `matmul_group` (the
            // ISA checked, shapes checked, this item owns outputs (i0..i1)
            // x (r0..r1)); the window holds exactly those outputs.
            unsafe { range(&job, r0, r1, i0, i1) };
            for (i, piece) in (i0..i1).zip(buf.chunks_exact_mut(cols.max(1))) {
                match self.kept_at[i] {
                    // SAFETY: this item owns outputs r0..r1 of row i, which
                    // a kept row holds at `k * stride + r`.
                    Some(k) => {
                        unsafe { self.out.slice(k * self.stride + r0, cols) }.copy_from_slice(piece)
                    }
                    None => (self.visit)(i, r0, piece),
                }
            }
        });
    }
}

/// [`matmul_shared`] for matrices of one type, width and layout (checked);
/// with a `sink`, [`matmul_visit`] of one matrix whose kernel reads packed
/// activations ([`visits_in_place`]).
fn matmul_group(
    isa: Isa,
    rounding: ActRounding,
    parts: &mut [(WeightView<'_>, &mut [f32])],
    x: &[f32],
    n: usize,
    pool: &ThreadPool,
    sink: Option<&Sink<'_>>,
) -> Result<(), KernelError> {
    if parts.len() > 1 && !shares_activations(isa, rounding, &parts[0].0, n) {
        for (w, out) in parts.iter_mut() {
            matmul_group(isa, rounding, &mut [(*w, &mut **out)], x, n, pool, None)?;
        }
        return Ok(());
    }
    let w = parts[0].0;
    let row_bytes = w.row_bytes();
    if n == 0 || parts.iter().all(|(w, _)| w.rows == 0) {
        return Ok(());
    }
    if w.cols == 0 {
        parts.iter_mut().for_each(|(_, out)| out.fill(0.0));
        return Ok(());
    }
    // The tile unit pays from this many activation rows on (below, decoding
    // its weight tiles costs more than the products save); the VNNI path
    // gives the same bits.
    let isa = if isa == Isa::Amx && n < crate::amx::min_rows() {
        Isa::Avx512Vnni
    } else {
        isa
    };
    let vertical = match w.layout {
        WeightLayout::Gguf => None,
        WeightLayout::Vertical => match vertical_kernel(w.ty, isa, rounding) {
            Some(k) => Some(k),
            None => {
                // Only the VNNI kernel reads the layout: the others get the
                // file's bytes back (slow, exact).
                for (w, out) in parts.iter_mut() {
                    let mut gguf = vec![0u8; w.data.len()];
                    from_vertical(w.ty, w.cols, w.data, &mut gguf)?;
                    let w = WeightView::new(w.ty, w.rows, w.cols, &gguf)?;
                    matmul_with(isa, rounding, &w, x, n, out, pool)?;
                }
                return Ok(());
            }
        },
        WeightLayout::Panels => match panels_kernel(w.ty, isa, rounding) {
            Some(k) => Some(k),
            None => {
                // As for the vertical layout: the file's bytes back.
                for (w, out) in parts.iter_mut() {
                    let mut gguf = vec![0u8; w.data.len()];
                    from_panels(w.ty, w.rows, w.cols, w.data, &mut gguf)?;
                    let w = WeightView::new(w.ty, w.rows, w.cols, &gguf)?;
                    matmul_with(isa, rounding, &w, x, n, out, pool)?;
                }
                return Ok(());
            }
        },
    };

    let shape = |w: &WeightView<'_>| Shape {
        rows: w.rows,
        cols: w.cols,
        row_bytes,
        n,
    };
    let multi_rows = n >= MULTI_ROWS;
    match kernel_for(w.ty, isa)? {
        Kernel::Float(k, multi) => {
            // Float matrices never share (`shares_activations`): one part.
            let (w, out) = &mut parts[0];
            let shape = shape(w);
            let out = OutPtr::new(out);
            if multi_rows {
                let job = float::FloatJob {
                    data: w.data,
                    row_bytes,
                    rows: w.rows,
                    cols: w.cols,
                    x,
                    out: &out,
                };
                run_split_multi(
                    pool,
                    &[MultiPart {
                        shape: &shape,
                        weight_bytes: w.data.len(),
                        f: &|r0, r1, i0, i1| {
                            // SAFETY: the ISA was checked available; each call owns
                            // outputs (i0..i1) x (r0..r1), disjoint between calls
                            // (distinct work items); shapes were checked above.
                            unsafe { multi(&job, r0, r1, i0, i1) }
                        },
                    }],
                    Grain::of_rows(4 * w.cols),
                );
            } else {
                run_split(
                    pool,
                    &[(&shape, w.data.len(), &|r0, r1| {
                        float_range(k, w.data, &shape, x, &out, r0, r1)
                    })],
                );
            }
        }
        Kernel::Quant(format, one_row, multi) => {
            let format = rounding.format_for(w.ty).unwrap_or(format);
            // The kernel that reads packed activations, if any: the
            // multi-row one, or for vertical weights their one-row kernel
            // too; else the one-row kernel on the activations as they are.
            let packed_kernel = match (vertical, multi_rows) {
                (Some((one, _)), false) => Some(one),
                (Some((_, many)), true) => Some(many),
                (None, true) => Some(multi),
                (None, false) => None,
            };
            let shapes: Vec<Shape> = parts.iter().map(|(w, _)| shape(w)).collect();
            let outs: Vec<OutPtr> = parts.iter_mut().map(|(_, o)| OutPtr::new(o)).collect();
            let weights: Vec<&[u8]> = parts.iter().map(|(w, _)| w.data).collect();
            with_scratch(
                &ACTS,
                QuantizedActs::new,
                |acts| -> Result<(), KernelError> {
                    acts.quantize_on(isa, format, x, n, w.cols, Some(pool))?;
                    let acts = &*acts;
                    let Some(multi) = packed_kernel else {
                        let f: Vec<_> = (0..parts.len())
                            .map(|m| {
                                let (data, shape, out) = (weights[m], &shapes[m], &outs[m]);
                                move |r0, r1| quant_range(one_row, data, shape, acts, out, r0, r1)
                            })
                            .collect();
                        let jobs: Vec<SplitPart<'_>> = f
                            .iter()
                            .enumerate()
                            .map(|(m, f)| (&shapes[m], weights[m].len(), f as _))
                            .collect();
                        run_split(pool, &jobs);
                        return Ok(());
                    };
                    with_scratch(&PACKED, Vec::new, |packed| {
                        if let Some(pack) = multi.pack {
                            // SAFETY: `pack` is only set for ISAs checked above.
                            unsafe { pack(acts, packed) };
                        }
                        let jobs: Vec<QuantJob<'_>> = (0..parts.len())
                            .map(|m| QuantJob {
                                data: weights[m],
                                row_bytes,
                                rows: shapes[m].rows,
                                cols: w.cols,
                                acts,
                                packed,
                                out: &outs[m],
                            })
                            .collect();
                        let range = multi.range;
                        if let Some(sink) = sink {
                            // One matrix (`matmul_visit`), several rows.
                            let job = &jobs[0];
                            let f = |r0, r1, i0, i1| sink.item(range, job, r0, r1, i0, i1);
                            let part = MultiPart {
                                shape: &shapes[0],
                                weight_bytes: weights[0].len(),
                                f: &f,
                            };
                            let grain = (multi.grain)(w.cols);
                            run_split_multi_capped(pool, &[part], grain, Some(VISIT_ITEM));
                            return;
                        }
                        // SAFETY (of each call): as for the float kernels;
                        // `packed` holds the activations packed for this
                        // kernel when it needs them.
                        let calls: Vec<_> = jobs
                            .iter()
                            .map(|job| move |r0, r1, i0, i1| unsafe { range(job, r0, r1, i0, i1) })
                            .collect();
                        if !multi_rows {
                            // A one-row kernel that reads packed activations
                            // (vertical weights): split by weight rows; each
                            // call owns outputs r0..r1 of the one row.
                            let one: Vec<_> = calls
                                .iter()
                                .map(|f| move |r0, r1| f(r0, r1, 0, 1))
                                .collect();
                            let split: Vec<SplitPart<'_>> = one
                                .iter()
                                .enumerate()
                                .map(|(m, f)| (&shapes[m], weights[m].len(), f as _))
                                .collect();
                            run_split(pool, &split);
                            return;
                        }
                        let jobs: Vec<MultiPart<'_>> = calls
                            .iter()
                            .enumerate()
                            .map(|(m, f)| MultiPart {
                                shape: &shapes[m],
                                weight_bytes: weights[m].len(),
                                f,
                            })
                            .collect();
                        run_split_multi(pool, &jobs, (multi.grain)(w.cols));
                    });
                    Ok(())
                },
            )?;
        }
    }
    Ok(())
}

/// Whether matrices like `w` (one type, width and layout) can share their
/// activations' quantization and packing: quantized weights whose kernel
/// reads packed activations, or one-row kernels on the file's layout.
fn shares_activations(isa: Isa, rounding: ActRounding, w: &WeightView<'_>, n: usize) -> bool {
    let quantized = matches!(kernel_for(w.ty, isa), Ok(Kernel::Quant(..)));
    let readable = match w.layout {
        WeightLayout::Gguf => true,
        WeightLayout::Vertical => vertical_kernel(w.ty, isa, rounding).is_some(),
        WeightLayout::Panels => panels_kernel(w.ty, isa, rounding).is_some(),
    };
    quantized && readable && n > 0
}

/// Runs `f` with this thread's scratch value from `key` (a fresh one, from
/// `new`, for a re-entrant call, which is not expected).
fn with_scratch<V: 'static, R>(
    key: &'static std::thread::LocalKey<RefCell<V>>,
    new: impl FnOnce() -> V,
    f: impl FnOnce(&mut V) -> R,
) -> R {
    key.with(|cell| match cell.try_borrow_mut() {
        Ok(mut v) => f(&mut v),
        Err(_) => f(&mut new()),
    })
}

thread_local! {
    /// Quantized activations, reused across calls on this thread.
    static ACTS: RefCell<QuantizedActs> = RefCell::new(QuantizedActs::new());
    /// The same, packed for the multi-row kernels.
    static PACKED: RefCell<Vec<ActGroup>> = const { RefCell::new(Vec::new()) };
    /// A [`matmul_visit`] work item's outputs (or, on its fallback, every
    /// output).
    static PIECES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// From this many activation rows on, the multi-row kernels run.
const MULTI_ROWS: usize = 2;

/// Below this many weight bytes times rows of `x`, one thread does the work
/// (waking the pool would cost more).
const SERIAL_WORK: usize = 48 * 1024;

/// Aim for weight tiles of about this many bytes (L1/L2 resident while every
/// activation row runs against them).
const TILE_BYTES: usize = 16 * 1024;

struct Shape {
    rows: usize,
    cols: usize,
    row_bytes: usize,
    n: usize,
}

/// The kernels of `ty` that read the vertical layout on `isa` with
/// activations rounded as `rounding` says, if there are (the VNNI and tile
/// kernels, with Block32 activations).
fn vertical_kernel(
    ty: GgmlType,
    isa: Isa,
    rounding: ActRounding,
) -> Option<(QuantMulti, QuantMulti)> {
    if rounding.format_for(ty) != Some(ActFormat::Block32) {
        return None;
    }
    (registry::of(ty).vertical?)(isa)
}

/// The kernel of a matrix in panels on an ISA (the VNNI paths), or `None`
/// where the matrix must be converted back.
fn panels_kernel(
    ty: GgmlType,
    isa: Isa,
    rounding: ActRounding,
) -> Option<(QuantMulti, QuantMulti)> {
    // (A view in panels is Q8_0 or Q5_0: `WeightView::validate`.)
    if rounding.format_for(ty) != Some(ActFormat::Block32) {
        return None;
    }
    crate::quant::kernels::panels(ty, isa)
}

/// The row kernels for a weight type on an ISA, from its registry entry.
/// Callers have checked that the ISA is available, which is what makes
/// calling the returned functions sound.
fn kernel_for(ty: GgmlType, isa: Isa) -> Result<Kernel, KernelError> {
    (registry::of(ty).kernels)(isa)
        .ok_or_else(|| KernelError::unsupported(format!("{ty} matmul on {isa}")))
}

/// One matrix of a [`run_split_multi`]: its shape, its weight bytes, and
/// `f(r0, r1, i0, i1)`, which computes its weight rows `r0..r1` x
/// activation rows `i0..i1`.
struct MultiPart<'a> {
    shape: &'a Shape,
    weight_bytes: usize,
    f: &'a (dyn Fn(usize, usize, usize, usize) + Sync),
}

/// Runs a multi-row matmul of one or more matrices (the same activations,
/// the same `grain`) on the pool. The work is cut into items (a chunk of
/// activation rows of about L2 size, read as `act_row_bytes` per row, x a
/// block of whole weight-row tiles of one matrix), taken in order from a
/// shared counter so that a thread the OS holds up does not hold up the
/// others. When every thread has at least a chunk of rows of its own (a
/// prompt), each thread instead takes its own contiguous activation rows,
/// the ones it quantized and the row-wise steps give it, against every
/// weight row: the rows stay in its cache, and on its die, from step to
/// step (docs/PERF.md §50). Each output is still computed by exactly the
/// same operations, whoever takes it. Small problems run on the caller
/// alone.
fn run_split_multi(pool: &ThreadPool, parts: &[MultiPart<'_>], grain: Grain) {
    run_split_multi_capped(pool, parts, grain, None)
}

/// [`run_split_multi`]; with a `cap`, every item is shared (no thread
/// keeps rows of its own) and computes at most about `cap` outputs (whole
/// tiles, at least one).
fn run_split_multi_capped(
    pool: &ThreadPool,
    parts: &[MultiPart<'_>],
    grain: Grain,
    cap: Option<usize>,
) {
    let Some(n) = parts.first().map(|p| p.shape.n) else {
        return;
    };
    let Grain {
        act_row_bytes,
        act_rows,
        weight_rows,
    } = grain;
    let work = parts
        .iter()
        .map(|p| p.weight_bytes.saturating_mul(n))
        .fold(0usize, usize::saturating_add);
    let threads = pool.n_threads();
    // Chunks of activation rows of about L2 size.
    let own_chunk = multi_row::act_chunk_rows(act_row_bytes).next_multiple_of(act_rows);
    // With a cap: the tiles in a block that keep a chunk's outputs under it.
    let capped_tiles = cap.map(|cap| (cap / (own_chunk.min(n) * weight_rows)).max(1));
    if capped_tiles.is_none() && (threads <= 1 || work < SERIAL_WORK) {
        parts.iter().for_each(|p| (p.f)(0, p.shape.rows, 0, n));
        return;
    }
    // Blocks of weight-row tiles: about 4 per thread and chunk, in each
    // matrix; `(part, r0, r1)` of every block, matrix by matrix.
    let blocks: Vec<(usize, usize, usize)> = parts
        .iter()
        .enumerate()
        .flat_map(|(m, p)| {
            let rows = p.shape.rows;
            let tiles = rows.div_ceil(weight_rows);
            let block_tiles = capped_tiles.unwrap_or(tiles.div_ceil(4 * threads).max(1));
            (0..tiles.div_ceil(block_tiles)).map(move |b| {
                (
                    m,
                    (b * block_tiles * weight_rows).min(rows),
                    ((b + 1) * block_tiles * weight_rows).min(rows),
                )
            })
        })
        .collect();
    let run =
        |&(m, r0, r1): &(usize, usize, usize), i0: usize, i1: usize| (parts[m].f)(r0, r1, i0, i1);
    if capped_tiles.is_some() && (threads <= 1 || work < SERIAL_WORK) {
        for i0 in (0..n).step_by(own_chunk) {
            blocks
                .iter()
                .for_each(|b| run(b, i0, (i0 + own_chunk).min(n)));
        }
        return;
    }
    if cap.is_none() && n >= threads * own_chunk {
        pool.run(&|t, nt| {
            // The rows' share every step gives this thread, on the
            // kernel's row grain.
            let share = row_share(n, t, nt);
            let (a0, a1) = (
                share.start.next_multiple_of(act_rows).min(n),
                share.end.next_multiple_of(act_rows).min(n),
            );
            for i0 in (a0..a1).step_by(own_chunk) {
                for block in &blocks {
                    run(block, i0, (i0 + own_chunk).min(a1));
                }
            }
        });
        return;
    }
    // Shared items: smaller chunks when there are too few blocks to keep
    // every thread busy.
    let mut chunk = own_chunk;
    if cap.is_none() && blocks.len() < 2 * threads {
        let want_chunks = (2 * threads).div_ceil(blocks.len().max(1));
        chunk = chunk.min(n.div_ceil(want_chunks).next_multiple_of(act_rows));
    }
    let chunks = n.div_ceil(chunk);
    let items = chunks * blocks.len();
    pool.run_items(items, &|item| {
        let (c, b) = (item / blocks.len(), item % blocks.len());
        let i0 = c * chunk;
        run(&blocks[b], i0, (i0 + chunk).min(n));
    });
}

/// One matrix of a [`run_split`]: its shape, its weight bytes, and
/// `f(r0, r1)`, which computes its weight rows `r0..r1`.
type SplitPart<'a> = (&'a Shape, usize, &'a (dyn Fn(usize, usize) + Sync));

/// Splits each matrix's weight rows into one contiguous range per thread
/// and calls its `f(r0, r1)` for each, all matrices in one run of the
/// pool; small problems run on the caller alone.
fn run_split(pool: &ThreadPool, parts: &[SplitPart<'_>]) {
    let work = parts
        .iter()
        .map(|(shape, bytes, _)| bytes.saturating_mul(shape.n))
        .fold(0usize, usize::saturating_add);
    let most_rows = parts.iter().map(|(s, _, _)| s.rows).max().unwrap_or(0);
    if pool.n_threads().min(most_rows) <= 1 || work < SERIAL_WORK {
        parts.iter().for_each(|(shape, _, f)| f(0, shape.rows));
        return;
    }
    pool.run(&|t, nt| {
        for (shape, _, f) in parts {
            let nt = nt.min(shape.rows);
            if t < nt {
                let (r0, r1) = split(shape.rows, t, nt);
                f(r0, r1);
            }
        }
    });
}

/// Rows `[r0, r1)` of thread `t` of `nt`: contiguous, sizes differing by at
/// most one.
fn split(rows: usize, t: usize, nt: usize) -> (usize, usize) {
    let base = rows / nt;
    let extra = rows % nt;
    let start = t * base + t.min(extra);
    (start, start + base + usize::from(t < extra))
}

fn tile_rows(row_bytes: usize) -> usize {
    (TILE_BYTES / row_bytes.max(1)).clamp(1, 64)
}

fn float_range(
    k: FloatRowsFn,
    data: &[u8],
    shape: &Shape,
    x: &[f32],
    out: &OutPtr,
    r0: usize,
    r1: usize,
) {
    let tile = tile_rows(shape.row_bytes);
    let mut t0 = r0;
    while t0 < r1 {
        let t1 = (t0 + tile).min(r1);
        let w_tile = &data[t0 * shape.row_bytes..t1 * shape.row_bytes];
        for (i, x_row) in x.chunks_exact(shape.cols).enumerate() {
            // SAFETY: this thread owns weight rows [r0, r1), so output
            // elements [i*rows + t0, i*rows + t1) are written by no one else;
            // `check_call` checked `out.len() == n * rows`.
            let o = unsafe { out.slice(i * shape.rows + t0, t1 - t0) };
            // SAFETY: `kernel_for` only returns kernels for ISAs that
            // `check_call` checked are available; `w_tile` is `o.len()`
            // rows of `row_bytes`, each `x_row.len()` elements.
            unsafe { k(w_tile, shape.row_bytes, x_row, o) };
        }
        t0 = t1;
    }
}

fn quant_range(
    k: QuantRowsFn,
    data: &[u8],
    shape: &Shape,
    acts: &QuantizedActs,
    out: &OutPtr,
    r0: usize,
    r1: usize,
) {
    let tile = tile_rows(shape.row_bytes);
    let mut t0 = r0;
    while t0 < r1 {
        let t1 = (t0 + tile).min(r1);
        let w_tile = &data[t0 * shape.row_bytes..t1 * shape.row_bytes];
        for i in 0..shape.n {
            let Some(a) = acts.row(i) else { return };
            // SAFETY: as in `float_range`: disjoint output range of this
            // thread, bounds checked by the caller.
            let o = unsafe { out.slice(i * shape.rows + t0, t1 - t0) };
            // SAFETY: the ISA was checked available; `w_tile` is `o.len()`
            // rows of `row_bytes`, each as many blocks as `a` has scales.
            unsafe { k(w_tile, shape.row_bytes, a, o) };
        }
        t0 = t1;
    }
}
