//! Float matrices for many rows at once (an encoder's batch of texts): the
//! weights widened to f32 at load and packed k-major in panels of 16 output
//! columns, multiplied by a register tile of activation rows x panels, each
//! activation broadcast against a panel's 16 columns.
//!
//! The contract every path keeps: output `(i, j)` is one fused
//! multiply-add chain over `k` in index order, starting from zero,
//! `acc = fma(x[i][k], w[j][k], acc)`. There is no lane split and no
//! reduction tree, so a row's result depends only on its own values, and
//! the scalar, AVX2 and AVX-512 paths give the same bits. The row-major
//! float kernels of `quant::float` split k over 32 lanes instead: they
//! serve the decoder, whose one-row passes stream the weights, and reduce
//! every dot across lanes, which at an encoder's short rows (k = 384)
//! costs a quarter of the multiply-adds; here nothing is reduced.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::simd::Isa;
use crate::{KernelError, ThreadPool};

/// Output columns per panel: one AVX-512 register, two AVX2 ones.
pub const PANEL: usize = 16;
/// Panels per task (64 columns: an AVX-512 tile's width).
const GROUP: usize = 4;
/// Activation rows per task (a multiple of the tiles' 6 rows).
const ROW_CHUNK: usize = 96;
/// Activation rows per register tile.
const TILE_ROWS: usize = 6;

/// A `rows x cols` float matrix (`rows` outputs, each a dot over `cols`),
/// packed for [`matmul_panels`]: panel `p` holds output columns
/// `16p..16p + 16`, as `cols` runs of 16 floats (element `(k, c)` at
/// `p * cols * 16 + k * 16 + c`); columns past `rows` are zero.
pub struct PanelMatrix {
    rows: usize,
    cols: usize,
    data: Vec<f32>,
}

impl PanelMatrix {
    /// Packs the matrix whose row `r` (`cols` floats) `row(r, dst)` writes.
    pub fn from_rows<E>(
        rows: usize,
        cols: usize,
        mut row: impl FnMut(usize, &mut [f32]) -> Result<(), E>,
    ) -> Result<PanelMatrix, E> {
        let panels = rows.div_ceil(PANEL);
        let mut data = vec![0.0f32; panels * PANEL * cols];
        let mut buf = vec![0.0f32; cols];
        for r in 0..rows {
            row(r, &mut buf)?;
            let (p, c) = (r / PANEL, r % PANEL);
            let panel = &mut data[p * PANEL * cols..(p + 1) * PANEL * cols];
            for (k, &v) in buf.iter().enumerate() {
                panel[k * PANEL + c] = v;
            }
        }
        Ok(PanelMatrix { rows, cols, data })
    }

    /// Output columns (the matrix's rows).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The length of each dot.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes held.
    pub fn n_bytes(&self) -> usize {
        self.data.len() * 4
    }

    fn panels(&self) -> usize {
        self.rows.div_ceil(PANEL)
    }
}

/// `out[i * m.rows() + j] = x[i] · row j of m` for `n` activation rows
/// (`x` row-major, `m.cols()` each), spread over `pool`; the same bits on
/// every ISA and thread count (module docs).
pub fn matmul_panels(
    isa: Isa,
    m: &PanelMatrix,
    x: &[f32],
    n: usize,
    out: &mut [f32],
    pool: &ThreadPool,
) -> Result<(), KernelError> {
    let (rows, cols) = (m.rows, m.cols);
    if x.len() < n * cols {
        return Err(KernelError::size(
            "panel matmul activations",
            n * cols,
            x.len(),
        ));
    }
    if out.len() < n * rows {
        return Err(KernelError::size(
            "panel matmul output",
            n * rows,
            out.len(),
        ));
    }
    if n == 0 || rows == 0 {
        return Ok(());
    }
    let groups = m.panels().div_ceil(GROUP);
    let chunks = n.div_ceil(ROW_CHUNK);
    let tasks = groups * chunks;
    let shared = SharedOut {
        ptr: out.as_mut_ptr(),
    };
    let next = AtomicUsize::new(0);
    let run = |_: usize, _: usize| loop {
        let t = next.fetch_add(1, Ordering::Relaxed);
        if t >= tasks {
            break;
        }
        // Consecutive tasks share a group of panels, which stays in L2.
        let (g, c) = (t / chunks, t % chunks);
        let p0 = g * GROUP;
        let np = GROUP.min(m.panels() - p0);
        let i0 = c * ROW_CHUNK;
        let i1 = n.min(i0 + ROW_CHUNK);
        let mut i = i0;
        while i < i1 {
            let rt = TILE_ROWS.min(i1 - i);
            let tile = Tile {
                x: x[i * cols..].as_ptr(),
                w: m.data[p0 * PANEL * cols..].as_ptr(),
                cols,
                rows_out: rows,
                out: shared.at(i * rows + p0 * PANEL),
                valid: rows - p0 * PANEL,
            };
            // SAFETY: the tile reads `rt` activation rows from row `i < n`
            // and `np` panels from `p0`, all inside `x` and `m.data`
            // (checked above); it writes output rows `i..i + rt`, columns
            // of this task's group only, which no other task writes, inside
            // `out` (checked above), which outlives `pool.run`.
            unsafe { run_tile(isa, &tile, rt, np) };
            i += rt;
        }
    };
    if tasks == 1 || pool.n_threads() == 1 {
        run(0, 1);
    } else {
        pool.run(&run);
    }
    Ok(())
}

/// The output buffer, written by tasks at disjoint elements.
struct SharedOut {
    ptr: *mut f32,
}

// SAFETY: tasks write disjoint elements (each output column group and row
// chunk belongs to one task), and the buffer outlives the `pool.run` call.
unsafe impl Sync for SharedOut {}

impl SharedOut {
    /// Where output element `e` lies (a pointer only; writing is the
    /// caller's business).
    fn at(&self, e: usize) -> *mut f32 {
        self.ptr.wrapping_add(e)
    }
}

/// One register tile's operands: activation rows from `x` (`cols` apart),
/// panels from `w` (`cols * PANEL` apart), outputs at `out` (`rows_out`
/// apart), of which the first `valid` columns exist.
struct Tile {
    x: *const f32,
    w: *const f32,
    cols: usize,
    rows_out: usize,
    out: *mut f32,
    valid: usize,
}

/// # Safety
/// `rt <= TILE_ROWS` activation rows and `np <= GROUP` panels readable at
/// the tile's pointers; output rows `0..rt`, columns `0..min(valid, 16 np)`
/// writable and owned by the caller; `isa` available.
unsafe fn run_tile(isa: Isa, t: &Tile, rt: usize, np: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        if isa.uses_avx512() {
            // SAFETY: the caller's contract, and AVX-512 paths are chosen
            // only where the CPU has AVX-512F.
            return unsafe { avx512::run(t, rt, np) };
        }
        if isa.uses_avx2() {
            // SAFETY: as above, for AVX2 and FMA.
            return unsafe { avx2::run(t, rt, np) };
        }
    }
    let _ = isa;
    // SAFETY: the caller's contract.
    unsafe { scalar(t, rt, np) }
}

/// The portable path: per output, `mul_add` (a fused multiply-add) over k.
///
/// # Safety
/// As [`run_tile`].
unsafe fn scalar(t: &Tile, rt: usize, np: usize) {
    for p in 0..np {
        let valid = t.valid.saturating_sub(p * PANEL).min(PANEL);
        // SAFETY: panel `p < np` is readable (caller).
        let w = unsafe { std::slice::from_raw_parts(t.w.add(p * t.cols * PANEL), t.cols * PANEL) };
        for r in 0..rt {
            // SAFETY: activation row `r < rt` is readable (caller).
            let x = unsafe { std::slice::from_raw_parts(t.x.add(r * t.cols), t.cols) };
            let mut acc = [0.0f32; PANEL];
            for (&xv, wk) in x.iter().zip(w.chunks_exact(PANEL)) {
                for (a, &wv) in acc.iter_mut().zip(wk) {
                    *a = xv.mul_add(wv, *a);
                }
            }
            for (c, &v) in acc[..valid].iter().enumerate() {
                // SAFETY: output `(r, 16p + c)` with `c < valid` is the caller's.
                unsafe { *t.out.add(r * t.rows_out + p * PANEL + c) = v };
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{Tile, PANEL};
    use std::arch::x86_64::*;

    /// # Safety
    /// As [`super::run_tile`], with AVX-512F available.
    #[target_feature(enable = "avx2,fma,avx512f")]
    pub(super) unsafe fn run(t: &Tile, rt: usize, np: usize) {
        unsafe {
            match (rt, np) {
                (6, 4) => tile::<6, 4>(t),
                (6, 3) => tile::<6, 3>(t),
                (6, 2) => tile::<6, 2>(t),
                (6, _) => tile::<6, 1>(t),
                (r, p) => {
                    // Edge tiles: one row at a time, as wide as the group.
                    for i in 0..r {
                        let row = Tile {
                            x: t.x.add(i * t.cols),
                            out: t.out.add(i * t.rows_out),
                            ..*t
                        };
                        match p {
                            4 => tile::<1, 4>(&row),
                            3 => tile::<1, 3>(&row),
                            2 => tile::<1, 2>(&row),
                            _ => tile::<1, 1>(&row),
                        }
                    }
                }
            }
        }
    }

    /// `R` rows x `P` panels: `R * P` accumulators, `P` weight loads and
    /// `R` broadcasts per k.
    ///
    /// # Safety
    /// As [`run`], for `R` rows and `P` panels.
    #[inline]
    #[target_feature(enable = "avx2,fma,avx512f")]
    unsafe fn tile<const R: usize, const P: usize>(t: &Tile) {
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); P]; R];
            let panel = t.cols * PANEL;
            for k in 0..t.cols {
                let mut w = [_mm512_setzero_ps(); P];
                for (p, w) in w.iter_mut().enumerate() {
                    *w = _mm512_loadu_ps(t.w.add(p * panel + k * PANEL));
                }
                for (r, acc) in acc.iter_mut().enumerate() {
                    let a = _mm512_set1_ps(*t.x.add(r * t.cols + k));
                    for (acc, &w) in acc.iter_mut().zip(&w) {
                        *acc = _mm512_fmadd_ps(a, w, *acc);
                    }
                }
            }
            for (r, acc) in acc.iter().enumerate() {
                for (p, &v) in acc.iter().enumerate() {
                    let valid = t.valid.saturating_sub(p * PANEL).min(PANEL);
                    let dst = t.out.add(r * t.rows_out + p * PANEL);
                    if valid == PANEL {
                        _mm512_storeu_ps(dst, v);
                    } else {
                        _mm512_mask_storeu_ps(dst, ((1u32 << valid) - 1) as u16, v);
                    }
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{Tile, PANEL};
    use std::arch::x86_64::*;

    /// # Safety
    /// As [`super::run_tile`], with AVX2 and FMA available.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn run(t: &Tile, rt: usize, np: usize) {
        unsafe {
            for p in 0..np {
                let one = Tile {
                    w: t.w.add(p * t.cols * PANEL),
                    out: t.out.add(p * PANEL),
                    valid: t.valid.saturating_sub(p * PANEL),
                    ..*t
                };
                match rt {
                    6 => tile::<6>(&one),
                    r => {
                        for i in 0..r {
                            tile::<1>(&Tile {
                                x: one.x.add(i * t.cols),
                                out: one.out.add(i * t.rows_out),
                                ..one
                            });
                        }
                    }
                }
            }
        }
    }

    /// `R` rows x one panel (two registers of 8 columns).
    ///
    /// # Safety
    /// As [`run`], for `R` rows and one panel.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile<const R: usize>(t: &Tile) {
        unsafe {
            let mut lo = [_mm256_setzero_ps(); R];
            let mut hi = [_mm256_setzero_ps(); R];
            for k in 0..t.cols {
                let wl = _mm256_loadu_ps(t.w.add(k * PANEL));
                let wh = _mm256_loadu_ps(t.w.add(k * PANEL + 8));
                for r in 0..R {
                    let a = _mm256_set1_ps(*t.x.add(r * t.cols + k));
                    lo[r] = _mm256_fmadd_ps(a, wl, lo[r]);
                    hi[r] = _mm256_fmadd_ps(a, wh, hi[r]);
                }
            }
            let valid = t.valid.min(PANEL);
            for r in 0..R {
                let dst = t.out.add(r * t.rows_out);
                if valid == PANEL {
                    _mm256_storeu_ps(dst, lo[r]);
                    _mm256_storeu_ps(dst.add(8), hi[r]);
                } else {
                    let mut buf = [0.0f32; PANEL];
                    _mm256_storeu_ps(buf.as_mut_ptr(), lo[r]);
                    _mm256_storeu_ps(buf.as_mut_ptr().add(8), hi[r]);
                    std::ptr::copy_nonoverlapping(buf.as_ptr(), dst, valid);
                }
            }
        }
    }
}
