//! An exact shortcut through a large Q8_0 output head: an upper bound on
//! every logit from a copy of the head at a quarter of the bits, so that only
//! the few tokens whose bound can still win need their exact logits.
//!
//! The head's logit of token `i` for an activation row is, in exact
//! arithmetic, `Σ_b dw_ib · dx_b · Σ_k q_ibk · x_bk` (Q8_0 weights `q` with
//! scales `dw`, int8 activations `x` with scales `dx`). The screen splits
//! each weight integer as `q = 16·hi + lo` with `hi` in `-8..=7` (stored as a
//! nibble) and `lo` small, so the logit is the screen's value `s_i` (the
//! same sum with `16·hi`) plus the residual `ρ_i · y`, where `ρ_i` is the
//! residual row (`dw · lo`) and `y` the dequantized activation.
//!
//! The residual is bounded without computing it: with an orthonormal basis
//! `P` of the directions hidden states mostly lie in (calibrated at build
//! from real hidden states), `ρ·y = (Pρ)·(Py) + ρ⊥·y⊥` and
//! `|ρ⊥·y⊥| ≤ ‖ρ⊥‖ ‖y⊥‖` (Cauchy-Schwarz). `Pρ_i` and `‖ρ⊥_i‖` are stored
//! per token, so the bound costs `rank + 1` multiply-adds per token. A margin
//! of `2e-5 · max‖w‖ · ‖y‖` covers the float rounding of the head's own sum
//! and of this screen (both far below `1e-5` of that), so
//! `ub_i ≥ logit_i` as the head computes it, on every ISA.
//!
//! Reading 4 bits instead of 8 (plus the scales and `rank + 1` floats per
//! token) halves the bytes of the head, which is most of a decode pass of a
//! small model: docs/PERF.md §32.

use crate::error::KernelError;
use crate::matmul::WeightView;
use crate::quant::panels::panel_row;
use crate::quant::q8_act::{ActRounding, QuantizedActs};
use crate::quant::vertical::q8_0_vertical_block;
use crate::quant::WeightLayout;
use crate::simd::Isa;
use crate::threadpool::ThreadPool;
use spindle_formats::{GgmlType, Storage};

/// Directions of the basis `P`.
pub const SCREEN_RANK: usize = 8;

/// Relative allowance for float rounding (see the module docs).
const ROUNDING_MARGIN: f64 = 2e-5;

/// The screen of one Q8_0 head (see the module docs).
pub struct HeadScreen {
    rows: usize,
    cols: usize,
    blocks: usize,
    /// Block pairs per token (two blocks share 32 bytes of nibbles).
    pairs: usize,
    /// Per token, `pairs * 32` bytes: byte `j` of pair `p` holds `hi + 8` of
    /// value `j` of block `2p` in its low nibble and of block `2p + 1` in its
    /// high nibble.
    /// (In anonymous memory advised to huge pages, as the weights are: a
    /// stream over 4 KiB pages stalls at every page, docs/PERF.md §4.)
    nibbles: Storage,
    /// Per token, `scale_stride` f16 scales (the head's own), zero padded,
    /// as little-endian bytes (in huge pages too).
    scales: Storage,
    scale_stride: usize,
    /// `rank` orthonormal rows of `cols` values.
    basis: Vec<f32>,
    rank: usize,
    /// `proj[k * rows + i]`: basis row `k` dotted with token `i`'s residual.
    proj: Vec<f32>,
    /// `‖ρ⊥_i‖`, rounded up.
    resid: Vec<f32>,
    /// The largest `‖w_i‖` of the head.
    w_norm_max: f64,
    /// 1 for the sound bound; tests shrink it to show the bound matters.
    slack_scale: f32,
}

/// The screen's answer for `n` activation rows.
#[derive(Debug, Clone, Default)]
pub struct ScreenBounds {
    pub vocab: usize,
    /// `ub[r * vocab + i] ≥ logit_i` of row `r`, as the head computes it.
    pub ub: Vec<f32>,
    /// Per row, the token of the largest estimate `s_i + (Pρ_i)·(Py)`: a
    /// likely winner, whose exact logit starts the search.
    pub likeliest: Vec<u32>,
}

impl HeadScreen {
    /// Builds the screen of `w` (a Q8_0 head), its basis from the hidden
    /// states `calibration` (rows of `w.cols` values; empty gives rank 0).
    pub fn build(
        w: &WeightView<'_>,
        calibration: &[f32],
        pool: &ThreadPool,
    ) -> Result<HeadScreen, KernelError> {
        if w.ty != GgmlType::Q8_0 {
            return Err(KernelError::unsupported(format!(
                "a head screen over {} weights (only Q8_0)",
                w.ty
            )));
        }
        WeightView::new(w.ty, w.rows, w.cols, w.data)?;
        let (rows, cols) = (w.rows, w.cols);
        let blocks = cols / 32;
        let pairs = blocks.div_ceil(2);
        let scale_stride = blocks.div_ceil(8) * 8;
        let basis = principal_basis(calibration, cols, SCREEN_RANK);
        let rank = basis.len() / cols.max(1);
        let mut nibbles = vec![0x88u8; rows * pairs * 32];
        let mut scales = vec![0u16; rows * scale_stride];
        let mut proj = vec![0f32; rank * rows];
        let mut resid = vec![0f32; rows];
        let mut norms = vec![0f64; rows];
        let row_bytes = w.row_bytes();
        // A head the loader rewrote with the layers: its blocks read in place
        // (vertical), or each row gathered as the file has it (panels).
        let vertical = w.layout == WeightLayout::Vertical;
        let panels = w.layout == WeightLayout::Panels;
        if panels {
            crate::quant::panels::check_shape(w.ty, w.rows, w.cols)?;
        }
        {
            let nib = Shared(nibbles.as_mut_ptr());
            let sc = Shared(scales.as_mut_ptr());
            let pj = Shared(proj.as_mut_ptr());
            let rs = Shared(resid.as_mut_ptr());
            let nm = Shared(norms.as_mut_ptr());
            let basis64: Vec<f64> = basis.iter().map(|&v| v as f64).collect();
            let basis64 = &basis64;
            pool.run(&|t, nt| {
                let (r0, r1) = split(rows, t, nt);
                let mut rho = vec![0f64; cols];
                let mut file_row = vec![0u8; if panels { row_bytes } else { 0 }];
                for i in r0..r1 {
                    let src = if panels {
                        panel_row(w.ty, cols, w.data, i, &mut file_row)
                            .expect("a validated matrix in panels has every row");
                        &file_row[..]
                    } else {
                        &w.data[i * row_bytes..(i + 1) * row_bytes]
                    };
                    // SAFETY: token i is written by this thread only (the
                    // ranges of `split` are disjoint) and every index is in
                    // bounds of the buffers sized above.
                    unsafe {
                        let nib = nib.at(i * pairs * 32);
                        let mut w2 = 0f64;
                        for b in 0..blocks {
                            let (bits, qs) = if vertical {
                                q8_0_vertical_block(src, blocks, b)
                            } else {
                                let blk = &src[b * 34..(b + 1) * 34];
                                let mut qs = [0i8; 32];
                                for (q, &byte) in qs.iter_mut().zip(&blk[2..]) {
                                    *q = byte as i8;
                                }
                                (u16::from_le_bytes([blk[0], blk[1]]), qs)
                            };
                            *sc.at(i * scale_stride + b) = bits;
                            let d = half::f16::from_bits(bits).to_f32() as f64;
                            for k in 0..32 {
                                let q = qs[k] as i32;
                                let hi = ((q + 8) >> 4).clamp(-8, 7);
                                let lo = q - 16 * hi;
                                rho[b * 32 + k] = d * lo as f64;
                                w2 += (d * q as f64).powi(2);
                                let byte = nib.add((b / 2) * 32 + k);
                                let n = (hi + 8) as u8;
                                *byte = if b % 2 == 0 {
                                    (*byte & 0xF0) | n
                                } else {
                                    (*byte & 0x0F) | (n << 4)
                                };
                            }
                        }
                        let full = dot_f64(&rho, &rho);
                        let mut r2 = full;
                        for k in 0..rank {
                            let c = dot_f64(&basis64[k * cols..(k + 1) * cols], &rho);
                            *pj.at(k * rows + i) = c as f32;
                            r2 -= c * c;
                        }
                        // The basis is orthonormal only to rounding: keep a
                        // part of ‖ρ‖ for that, and round up.
                        let perp = r2.max(0.0).sqrt() + 1e-6 * full.sqrt();
                        *rs.at(i) = (perp * (1.0 + 1e-6)) as f32;
                        *nm.at(i) = w2.sqrt();
                    }
                }
            });
        }
        let w_norm_max = norms.iter().copied().fold(0.0, f64::max);
        let huge = |bytes: &[u8]| {
            Storage::resident_copy(bytes, None).unwrap_or_else(|_| Storage::from_slice(bytes))
        };
        let nibbles = huge(&nibbles);
        let scale_bytes: Vec<u8> = scales.iter().flat_map(|v| v.to_le_bytes()).collect();
        drop(scales);
        let scales = huge(&scale_bytes);
        Ok(HeadScreen {
            rows,
            cols,
            blocks,
            pairs,
            nibbles,
            scales,
            scale_stride,
            basis,
            rank,
            proj,
            resid,
            w_norm_max,
            slack_scale: 1.0,
        })
    }

    /// Tokens (rows of the head).
    pub fn vocab(&self) -> usize {
        self.rows
    }

    /// Directions of the basis actually built.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Memory the screen holds.
    pub fn bytes(&self) -> usize {
        self.nibbles.len()
            + self.scales.len()
            + 4 * (self.basis.len() + self.proj.len() + self.resid.len())
    }

    /// Bytes one row's screen reads: what a decode pass reads instead of
    /// the head.
    pub fn bytes_per_pass(&self) -> usize {
        self.nibbles.len() + self.scales.len() + 4 * (self.proj.len() + self.resid.len())
    }

    /// Scales the Cauchy-Schwarz part of the bound. Anything below 1 makes
    /// the bound unsound: for tests that show the exactness checks can fail.
    pub fn set_slack_scale(&mut self, s: f32) {
        self.slack_scale = s;
    }

    /// Upper bounds on every logit of `n` activation rows `x` (row-major,
    /// `n * cols`), rounded to int8 as the head's matmul rounds them
    /// (`rounding`), on `isa`.
    pub fn bounds(
        &self,
        isa: Isa,
        rounding: ActRounding,
        x: &[f32],
        n: usize,
        pool: &ThreadPool,
    ) -> Result<ScreenBounds, KernelError> {
        if x.len() != n * self.cols {
            return Err(KernelError::size(
                "screen input (n * cols)",
                n * self.cols,
                x.len(),
            ));
        }
        if !isa.is_available() {
            return Err(KernelError::unsupported(format!("ISA {isa} on this CPU")));
        }
        let format = rounding
            .format_for(GgmlType::Q8_0)
            .expect("Q8_0 is quantized");
        let mut acts = QuantizedActs::new();
        acts.quantize_with_isa(isa, format, x, n, self.cols)?;
        let mut rows = Vec::with_capacity(n);
        for r in 0..n {
            rows.push(self.prepare_row(&acts, r)?);
        }
        let mut out = ScreenBounds {
            vocab: self.rows,
            ub: vec![0f32; n * self.rows],
            likeliest: vec![0; n],
        };
        let best = std::sync::Mutex::new(vec![(f32::NEG_INFINITY, 0u32); n]);
        {
            let ub = Shared(out.ub.as_mut_ptr());
            let rows = &rows;
            let best = &best;
            pool.run(&|t, nt| {
                let (t0, t1) = split(self.rows, t, nt);
                let mut mine = vec![(f32::NEG_INFINITY, 0u32); n];
                let mut s = vec![0f32; TILE * n];
                let mut start = t0;
                while start < t1 {
                    let end = (start + TILE).min(t1);
                    let len = end - start;
                    for group in (0..n).step_by(GROUP) {
                        let g = &rows[group..(group + GROUP).min(n)];
                        let sg = &mut s[group * TILE..];
                        // SAFETY: the ISA was checked available above.
                        unsafe { self.screen_tile(isa, g, start, end, sg) };
                    }
                    for (r, row) in rows.iter().enumerate() {
                        // SAFETY: tokens start..end of every row belong to
                        // this thread (disjoint ranges of `split`).
                        let dst = unsafe {
                            std::slice::from_raw_parts_mut(ub.at(r * self.rows + start), len)
                        };
                        let b = self.finish(isa, row, start, &s[r * TILE..r * TILE + len], dst);
                        if b.0 > mine[r].0 {
                            mine[r] = b;
                        }
                    }
                    start = end;
                }
                let mut best = best.lock().unwrap_or_else(|p| p.into_inner());
                for (b, m) in best.iter_mut().zip(mine) {
                    if m.0 > b.0 || (m.0 == b.0 && m.1 < b.1) {
                        *b = m;
                    }
                }
            });
        }
        let best = best.into_inner().unwrap_or_else(|p| p.into_inner());
        out.likeliest = best.into_iter().map(|b| b.1).collect();
        Ok(out)
    }

    /// One activation row's quantities: its int8 values padded to whole
    /// pairs, per-block scales for the screen, the block-sum correction of
    /// the nibbles' offset, `Py` and the bound's row factors.
    fn prepare_row(&self, acts: &QuantizedActs, r: usize) -> Result<ScreenRow, KernelError> {
        let a = acts
            .row(r)
            .ok_or_else(|| KernelError::size("activation row", acts.n(), r))?;
        let mut qs = vec![0i8; self.pairs * 64];
        qs[..self.cols].copy_from_slice(a.qs);
        let mut xs = vec![0f32; self.scale_stride];
        let mut off = vec![0f32; self.scale_stride];
        for b in 0..self.blocks {
            xs[b] = a.d[b] * 16.0;
            off[b] = -8.0 * a.bsums[b] as f32 * xs[b];
        }
        let mut y = vec![0f32; self.cols];
        acts.dequantize_row(r, &mut y)?;
        let y_norm = y.iter().map(|&v| (v as f64).powi(2)).sum::<f64>().sqrt();
        let mut z = vec![0f32; self.rank];
        let mut z2 = 0f64;
        for (k, zk) in z.iter_mut().enumerate() {
            let p = &self.basis[k * self.cols..(k + 1) * self.cols];
            let v: f64 = p.iter().zip(&y).map(|(&a, &b)| a as f64 * b as f64).sum();
            *zk = v as f32;
            z2 += v * v;
        }
        let y_perp = (y_norm * y_norm - z2).max(0.0).sqrt() + 1e-6 * y_norm;
        let slack = (y_perp * (1.0 + 1e-5)) as f32 * self.slack_scale;
        let margin = (ROUNDING_MARGIN * self.w_norm_max * y_norm) as f32;
        Ok(ScreenRow {
            qs,
            xs,
            off,
            z,
            slack,
            margin,
        })
    }

    /// `s[r * TILE + (i - t0)]` = the screen value of token `i` for row `r`
    /// of `rows` (at most [`GROUP`]), tokens `t0..t1`.
    ///
    /// # Safety
    /// `isa` must be available on this CPU.
    unsafe fn screen_tile(
        &self,
        isa: Isa,
        rows: &[ScreenRow],
        t0: usize,
        t1: usize,
        s: &mut [f32],
    ) {
        #[cfg(target_arch = "x86_64")]
        if isa.uses_avx512() {
            // SAFETY: the caller checked the ISA: AVX-512 F/BW/VL, VNNI,
            // AVX2, FMA and F16C.
            unsafe { self.screen_tile_vnni(rows, t0, t1, s) };
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if isa.uses_avx2() {
            // SAFETY: the caller checked the ISA; AVX2 paths have FMA and F16C.
            unsafe { self.screen_tile_avx2(rows, t0, t1, s) };
            return;
        }
        let _ = isa;
        self.screen_tile_scalar(rows, t0, t1, s);
    }

    fn screen_tile_scalar(&self, rows: &[ScreenRow], t0: usize, t1: usize, s: &mut [f32]) {
        let mut ws = vec![0f32; self.scale_stride];
        for i in t0..t1 {
            let sc = &self.scales[2 * i * self.scale_stride..2 * (i + 1) * self.scale_stride];
            for (w, bits) in ws.iter_mut().zip(sc.chunks_exact(2)) {
                *w = half::f16::from_bits(u16::from_le_bytes([bits[0], bits[1]])).to_f32();
            }
            let nib = &self.nibbles[i * self.pairs * 32..(i + 1) * self.pairs * 32];
            for (r, row) in rows.iter().enumerate() {
                let mut acc = 0f32;
                for p in 0..self.pairs {
                    let (mut d0, mut d1) = (0i32, 0i32);
                    for k in 0..32 {
                        let v = nib[p * 32 + k];
                        d0 += (v & 0x0F) as i32 * row.qs[p * 64 + k] as i32;
                        d1 += (v >> 4) as i32 * row.qs[p * 64 + 32 + k] as i32;
                    }
                    let b = 2 * p;
                    acc += d0 as f32 * (ws[b] * row.xs[b]);
                    if b + 1 < self.scale_stride {
                        acc += d1 as f32 * (ws[b + 1] * row.xs[b + 1]);
                    }
                }
                for (w, o) in ws.iter().zip(&row.off) {
                    acc += w * o;
                }
                s[r * TILE + (i - t0)] = acc;
            }
        }
    }

    /// # Safety
    /// AVX2, FMA and F16C must be available.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn screen_tile_avx2(&self, rows: &[ScreenRow], t0: usize, t1: usize, s: &mut [f32]) {
        // SAFETY: the caller's guarantee.
        unsafe { self.screen_tile_ymm::<false>(rows, t0, t1, s) }
    }

    /// [`Self::screen_tile_avx2`] with `vpdpbusd ymm` for the byte dots.
    ///
    /// # Safety
    /// AVX-512 VL and VNNI, AVX2, FMA and F16C must be available.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn screen_tile_vnni(&self, rows: &[ScreenRow], t0: usize, t1: usize, s: &mut [f32]) {
        // SAFETY: the caller's guarantee.
        unsafe { self.screen_tile_ymm::<true>(rows, t0, t1, s) }
    }

    /// # Safety
    /// AVX2, FMA and F16C must be available, and with `VNNI` AVX-512 VL
    /// and VNNI.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn screen_tile_ymm<const VNNI: bool>(
        &self,
        rows: &[ScreenRow],
        t0: usize,
        t1: usize,
        s: &mut [f32],
    ) {
        use std::arch::x86_64::*;
        let nr = rows.len();
        debug_assert!(nr <= GROUP);
        let stride = self.scale_stride;
        let mut ws = vec![0f32; stride];
        let mut prod = vec![vec![0f32; stride]; GROUP];
        // SAFETY: the caller's guarantee (AVX2).
        let (mask, ones) = unsafe { (_mm256_set1_epi8(0x0F), _mm256_set1_epi16(1)) };
        for i in t0..t1 {
            // SAFETY (whole block): every pointer below stays inside its
            // buffer: token i < rows, pairs * 32 nibble bytes per token,
            // `stride` (a multiple of 8) scales per token, rows'
            // `qs` of pairs * 64 values and `xs`/`off` of `stride` values.
            unsafe {
                let sc = self.scales.as_ptr().add(2 * i * stride);
                for c in (0..stride).step_by(8) {
                    let h = _mm_loadu_si128(sc.add(2 * c) as *const __m128i);
                    _mm256_storeu_ps(ws.as_mut_ptr().add(c), _mm256_cvtph_ps(h));
                }
                let mut acc = [_mm256_setzero_ps(); GROUP];
                for (r, row) in rows.iter().enumerate() {
                    for c in (0..stride).step_by(8) {
                        let w = _mm256_loadu_ps(ws.as_ptr().add(c));
                        let x = _mm256_loadu_ps(row.xs.as_ptr().add(c));
                        let o = _mm256_loadu_ps(row.off.as_ptr().add(c));
                        _mm256_storeu_ps(prod[r].as_mut_ptr().add(c), _mm256_mul_ps(w, x));
                        acc[r] = _mm256_fmadd_ps(w, o, acc[r]);
                    }
                }
                let nib = self.nibbles.as_ptr().add(i * self.pairs * 32);
                for p in 0..self.pairs {
                    let v = _mm256_loadu_si256(nib.add(p * 32) as *const __m256i);
                    let lo = _mm256_and_si256(v, mask);
                    let hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
                    for r in 0..nr {
                        let q = rows[r].qs.as_ptr().add(p * 64);
                        let x0 = _mm256_loadu_si256(q as *const __m256i);
                        let x1 = _mm256_loadu_si256(q.add(32) as *const __m256i);
                        let (d0, d1) = if VNNI {
                            let z = _mm256_setzero_si256();
                            (
                                _mm256_dpbusd_epi32(z, lo, x0),
                                _mm256_dpbusd_epi32(z, hi, x1),
                            )
                        } else {
                            (
                                _mm256_madd_epi16(_mm256_maddubs_epi16(lo, x0), ones),
                                _mm256_madd_epi16(_mm256_maddubs_epi16(hi, x1), ones),
                            )
                        };
                        let s0 = _mm256_broadcast_ss(&prod[r][2 * p]);
                        let s1 = _mm256_broadcast_ss(&prod[r][2 * p + 1]);
                        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d0), s0, acc[r]);
                        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d1), s1, acc[r]);
                    }
                }
                for r in 0..nr {
                    let a = acc[r];
                    let h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
                    let h = _mm_add_ps(h, _mm_movehl_ps(h, h));
                    let h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
                    s[r * TILE + (i - t0)] = _mm_cvtss_f32(h);
                }
            }
        }
    }

    /// Turns screen values `s` of tokens `t0..` into bounds `ub` for `row`;
    /// returns the largest estimate and its token.
    fn finish(
        &self,
        isa: Isa,
        row: &ScreenRow,
        t0: usize,
        s: &[f32],
        ub: &mut [f32],
    ) -> (f32, u32) {
        let len = s.len();
        ub.copy_from_slice(s);
        for (k, &z) in row.z.iter().enumerate() {
            let p = &self.proj[k * self.rows + t0..k * self.rows + t0 + len];
            axpy(isa, z, p, ub);
        }
        let mut best = (f32::NEG_INFINITY, t0 as u32);
        for (j, &e) in ub.iter().enumerate() {
            if e > best.0 {
                best = (e, (t0 + j) as u32);
            }
        }
        add_slack(isa, &self.resid[t0..t0 + len], row.slack, row.margin, ub);
        best
    }
}

/// Tokens screened per tile (the screen values of a tile stay in cache).
const TILE: usize = 512;
/// Activation rows screened per pass over the nibbles.
const GROUP: usize = 4;

struct ScreenRow {
    qs: Vec<i8>,
    xs: Vec<f32>,
    off: Vec<f32>,
    z: Vec<f32>,
    slack: f32,
    margin: f32,
}

crate::simd::compiled_per_isa! {
    fn axpy(a: f32, x: &[f32], y: &mut [f32]) = axpy_body;
}

fn axpy_body(a: f32, x: &[f32], y: &mut [f32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

crate::simd::compiled_per_isa! {
    fn add_slack(resid: &[f32], slack: f32, margin: f32, ub: &mut [f32]) = add_slack_body;
}

fn add_slack_body(resid: &[f32], slack: f32, margin: f32, ub: &mut [f32]) {
    for (u, &r) in ub.iter_mut().zip(resid) {
        *u += r * slack + margin;
    }
}

/// A dot product in f64 over 8 partial sums (so that it vectorizes; f64
/// keeps it far inside the margins, whatever the order).
fn dot_f64(a: &[f64], b: &[f64]) -> f64 {
    let mut acc = [0f64; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let tail: f64 = ra.iter().zip(rb).map(|(x, y)| x * y).sum();
    acc.iter().sum::<f64>() + tail
}

/// A raw pointer the pool's threads share; each writes its own range.
#[derive(Clone, Copy)]
struct Shared<T>(*mut T);
impl<T> Shared<T> {
    /// The pointer `i` elements on (a method, so closures capture the
    /// wrapper, not the raw pointer).
    ///
    /// # Safety
    /// As [`pointer::add`]: `i` within the allocation.
    unsafe fn at(self, i: usize) -> *mut T {
        unsafe { self.0.add(i) }
    }
}

// SAFETY: used only for writes to ranges disjoint between threads.
unsafe impl<T> Send for Shared<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for Shared<T> {}

/// Tokens `[r0, r1)` of thread `t` of `nt`.
fn split(rows: usize, t: usize, nt: usize) -> (usize, usize) {
    let base = rows / nt;
    let extra = rows % nt;
    let start = t * base + t.min(extra);
    (start, start + base + usize::from(t < extra))
}

/// The `rank` leading eigenvectors of the second moment of `rows` (of
/// `cols` values), as orthonormal rows: subspace iteration from the first
/// rows. Empty when there is too little data.
fn principal_basis(rows: &[f32], cols: usize, rank: usize) -> Vec<f32> {
    let m = rows.len().checked_div(cols).unwrap_or(0);
    if m < rank || cols < rank {
        return Vec::new();
    }
    let mut c = vec![0f64; cols * cols];
    for h in rows.chunks_exact(cols) {
        for a in 0..cols {
            let ha = h[a] as f64;
            if ha == 0.0 {
                continue;
            }
            let ca = &mut c[a * cols..(a + 1) * cols];
            for (cb, &hb) in ca.iter_mut().zip(h) {
                *cb += ha * hb as f64;
            }
        }
    }
    let mut v: Vec<f64> = rows[..rank * cols].iter().map(|&x| x as f64).collect();
    orthonormalize(&mut v, cols);
    let mut next = vec![0f64; rank * cols];
    for _ in 0..60 {
        for k in 0..rank {
            let vk = &v[k * cols..(k + 1) * cols];
            for a in 0..cols {
                next[k * cols + a] = c[a * cols..(a + 1) * cols]
                    .iter()
                    .zip(vk)
                    .map(|(x, y)| x * y)
                    .sum();
            }
        }
        std::mem::swap(&mut v, &mut next);
        orthonormalize(&mut v, cols);
    }
    v.into_iter().map(|x| x as f32).collect()
}

/// Gram-Schmidt (twice) over the rows of `v`; a row that vanishes becomes 0.
fn orthonormalize(v: &mut [f64], cols: usize) {
    let rank = v.len() / cols;
    for _ in 0..2 {
        for k in 0..rank {
            for j in 0..k {
                let d: f64 = (0..cols).map(|a| v[k * cols + a] * v[j * cols + a]).sum();
                for a in 0..cols {
                    v[k * cols + a] -= d * v[j * cols + a];
                }
            }
            let n: f64 = (0..cols)
                .map(|a| v[k * cols + a].powi(2))
                .sum::<f64>()
                .sqrt();
            for a in 0..cols {
                v[k * cols + a] = if n > 0.0 { v[k * cols + a] / n } else { 0.0 };
            }
        }
    }
}
