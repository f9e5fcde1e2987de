//! Q8_0 and Q5_0 matrices in panels of 16 rows: the layout of a multi-row
//! tile with the outputs in the lanes. One `vpdpbusd` multiplies step `k` of
//! 16 rows (4 values each) by 4 bytes of an activation row broadcast to
//! every lane, so a tile needs no lane reduction and no shuffles, and the
//! fold of each block is 3 operations per 8 `vpdpbusd` (PERF §48-49). The
//! loader puts a Q8_0 output head in this layout on AVX-512 VNNI machines,
//! and Q5_0 layer matrices when asked (`SPINDLE_LAYER_PANELS=1`, PERF §56).
//!
//! Panel `p` holds rows `16p..16p + 16`; its block `b` is at `(p * nb + b) *
//! 16 * B` bytes (`B` the file's bytes of one block: sizes equal the
//! file's). A block starts with the 16 rows' f16 scales (row `i`'s at byte
//! `2i`); then each step `k` (0..8) gives, at byte `4i + v` of a 64-byte
//! vector, value `4k + v` of row `i`'s block in its unsigned form `u`:
//!
//! - Q8_0 (`B` = 34): 8 vectors of bytes `u = s + 128`, step `k`'s at byte
//!   `32 + 64k`;
//! - Q5_0 (`B` = 22): `u` is the stored 5-bit value (`s + 16`); 4 vectors
//!   of nibbles at byte `32 + 64v`, bits 0..4 of step `v` in the low
//!   nibbles and of step `v + 4` in the high ones, then 8 little-endian u64
//!   masks at byte `288 + 8k`, bit `4i + v` of mask `k` being bit 4 of that
//!   value (one `vpaddb` under the mask puts it back).
//!
//! [`from_panels`] gives the file's bytes back, and [`panel_row`] one row of
//! them (the readers of single rows: the tied embedding lookup, the head's
//! screen, `logits_of`).
//!
//! # Bit-identical to the other paths
//!
//! Every path folds block `b`'s exact integer dot into lane `b % 8` with
//! `fold_scaled` (blocks in order, lanes from zero) and adds the 8 lanes as
//! `tree8`. Here each of a tile's registers holds 16 outputs, and the
//! kernel visits the blocks of one lane class at a time (`j, j + 8, j + 16,
//! ...`, in order) into its own register, then adds the 8 classes'
//! registers in `tree8`'s order: the same operations on the same values.
//! The integer dot is `sum u x - offset * sum x` (offset 128 or 16), exact
//! in any order.

use super::block32::Block32;
use super::multi_row::QuantJob;
use super::q5_0;
use crate::error::KernelError;
use spindle_formats::GgmlType;

/// Rows in a panel: the lanes of one 512-bit register of f32 or i32.
pub const PANEL_ROWS: usize = 16;

/// The file's bytes of one block of `ty`, for the types panels hold.
fn block_bytes(ty: GgmlType) -> Option<usize> {
    matches!(ty, GgmlType::Q8_0 | GgmlType::Q5_0).then(|| ty.block_bytes())
}

/// Whether a matrix of this type and shape can be held in panels.
pub fn panels_supported(ty: GgmlType, rows: usize, cols: usize) -> bool {
    block_bytes(ty).is_some()
        && rows > 0
        && rows.is_multiple_of(PANEL_ROWS)
        && cols > 0
        && cols.is_multiple_of(32)
}

/// [`panels_supported`] as an error that says what panels hold.
pub(crate) fn check_shape(ty: GgmlType, rows: usize, cols: usize) -> Result<(), KernelError> {
    if panels_supported(ty, rows, cols) {
        return Ok(());
    }
    Err(KernelError::unsupported(format!(
        "panels of 16 rows for {ty} {rows} x {cols} (Q8_0 or Q5_0, rows a multiple of 16)"
    )))
}

/// Blocks per row and bytes of a file block, after checking that `len`
/// bytes are such a matrix.
fn blocks(
    ty: GgmlType,
    rows: usize,
    cols: usize,
    len: usize,
) -> Result<(usize, usize), KernelError> {
    check_shape(ty, rows, cols)?;
    let (nb, bb) = (cols / 32, block_bytes(ty).unwrap_or(0));
    if len != rows * nb * bb {
        return Err(KernelError::size(
            format!("{ty} weight bytes ({rows} x {cols})"),
            rows * nb * bb,
            len,
        ));
    }
    Ok((nb, bb))
}

/// Writes row `i`'s file block `src` into panel block `dst`.
fn put_row(ty: GgmlType, src: &[u8], i: usize, dst: &mut [u8]) {
    dst[2 * i..2 * i + 2].copy_from_slice(&src[..2]);
    if ty == GgmlType::Q8_0 {
        for k in 0..8 {
            let v = u32::from_le_bytes(src[2 + 4 * k..6 + 4 * k].try_into().unwrap());
            // `s + 128` is the byte with its top bit flipped.
            let at = 32 + 64 * k + 4 * i;
            dst[at..at + 4].copy_from_slice(&(v ^ 0x8080_8080).to_le_bytes());
        }
        return;
    }
    // The stored 5-bit values: the format's signed values plus 16.
    let u = <q5_0::Q5_0 as Block32>::values(src).map(|s| (s + 16) as u8);
    for k in 0..8 {
        for v in 0..4 {
            let value = u[4 * k + v];
            let at = 32 + 64 * (k % 4) + 4 * i + v;
            let shift = 4 * (k / 4);
            dst[at] = (dst[at] & !(0x0F << shift)) | ((value & 0x0F) << shift);
            let bit = 4 * i + v;
            let mask = 288 + 8 * k + bit / 8;
            dst[mask] = (dst[mask] & !(1 << (bit % 8))) | ((value >> 4) << (bit % 8));
        }
    }
}

/// Row `i`'s file block, from panel block `src` into `dst`.
fn get_row(ty: GgmlType, src: &[u8], i: usize, dst: &mut [u8]) {
    dst[..2].copy_from_slice(&src[2 * i..2 * i + 2]);
    if ty == GgmlType::Q8_0 {
        for k in 0..8 {
            let at = 32 + 64 * k + 4 * i;
            let v = u32::from_le_bytes(src[at..at + 4].try_into().unwrap());
            dst[2 + 4 * k..6 + 4 * k].copy_from_slice(&(v ^ 0x8080_8080).to_le_bytes());
        }
        return;
    }
    let mut qh = 0u32;
    let mut qs = [0u8; 16];
    for k in 0..8 {
        for v in 0..4 {
            let j = 4 * k + v;
            let nibble = (src[32 + 64 * (k % 4) + 4 * i + v] >> (4 * (k / 4))) & 0x0F;
            let bit = 4 * i + v;
            let high = (src[288 + 8 * k + bit / 8] >> (bit % 8)) & 1;
            qh |= (high as u32) << j;
            qs[j % 16] |= nibble << (4 * (j / 16));
        }
    }
    dst[2..6].copy_from_slice(&qh.to_le_bytes());
    dst[6..22].copy_from_slice(&qs);
}

/// Rewrites a Q8_0 or Q5_0 matrix (the file's bytes) into panels, in place.
pub fn to_panels(
    ty: GgmlType,
    rows: usize,
    cols: usize,
    data: &mut [u8],
) -> Result<(), KernelError> {
    let (nb, bb) = blocks(ty, rows, cols, data.len())?;
    let block = PANEL_ROWS * bb;
    let mut file = vec![0u8; block * nb];
    for panel in data.chunks_exact_mut(block * nb) {
        file.copy_from_slice(panel);
        for b in 0..nb {
            let dst = &mut panel[b * block..(b + 1) * block];
            for i in 0..PANEL_ROWS {
                put_row(ty, &file[(i * nb + b) * bb..(i * nb + b + 1) * bb], i, dst);
            }
        }
    }
    Ok(())
}

/// Row `r` of a `ty` matrix in panels, as the file has it (`cols / 32`
/// blocks into `dst`).
pub fn panel_row(
    ty: GgmlType,
    cols: usize,
    data: &[u8],
    r: usize,
    dst: &mut [u8],
) -> Result<(), KernelError> {
    let nb = cols / 32;
    let bb = block_bytes(ty)
        .ok_or_else(|| KernelError::unsupported(format!("{ty} matrices in panels")))?;
    let block = PANEL_ROWS * bb;
    let (p, i) = (r / PANEL_ROWS, r % PANEL_ROWS);
    let panel = data
        .get(p * block * nb..(p + 1) * block * nb)
        .filter(|_| cols.is_multiple_of(32))
        .ok_or_else(|| KernelError::unsupported(format!("row {r} of a panel matrix of {cols}")))?;
    if dst.len() != nb * bb {
        return Err(KernelError::size(
            format!("{ty} row bytes"),
            nb * bb,
            dst.len(),
        ));
    }
    for (b, out) in dst.chunks_exact_mut(bb).enumerate() {
        get_row(ty, &panel[b * block..(b + 1) * block], i, out);
    }
    Ok(())
}

/// The file's bytes of a matrix in panels, into `dst`.
pub fn from_panels(
    ty: GgmlType,
    rows: usize,
    cols: usize,
    src: &[u8],
    dst: &mut [u8],
) -> Result<(), KernelError> {
    let (nb, bb) = blocks(ty, rows, cols, src.len())?;
    if dst.len() != src.len() {
        return Err(KernelError::size(
            format!("{ty} weight bytes"),
            src.len(),
            dst.len(),
        ));
    }
    for (r, row) in dst.chunks_exact_mut(nb * bb).enumerate() {
        panel_row(ty, cols, src, r, row)?;
    }
    Ok(())
}

#[cfg(target_arch = "x86_64")]
pub(crate) use vnni::{range_vnni_panels, PanelQ5_0, PanelQ8_0};

#[cfg(target_arch = "x86_64")]
mod vnni {
    use super::{QuantJob, PANEL_ROWS};
    use std::arch::x86_64::*;
    use std::mem::MaybeUninit;

    /// How a type's panel blocks give the tile its step vectors.
    pub(crate) trait PanelType {
        /// Bytes of one panel block (16 rows' blocks).
        const BLOCK: usize;
        /// `u - s`: the tile's sums start at `-OFFSET * sum x`.
        const OFFSET: i32;
        /// Step `k` (0..8) of the block at `wb`: value `4k + v` of row `i`
        /// as `u` at byte `4i + v`.
        ///
        /// # Safety
        /// AVX-512 F/BW available; `wb` is a whole panel block.
        unsafe fn step(wb: *const u8, k: usize) -> __m512i;
    }

    /// Q8_0: the steps are stored as they are used.
    pub(crate) struct PanelQ8_0;

    impl PanelType for PanelQ8_0 {
        const BLOCK: usize = PANEL_ROWS * 34;
        const OFFSET: i32 = 128;

        #[inline(always)]
        unsafe fn step(wb: *const u8, k: usize) -> __m512i {
            unsafe { _mm512_loadu_si512(wb.add(32 + 64 * k).cast()) }
        }
    }

    /// Q5_0: a step's nibbles, and its fifth bits added under a mask.
    pub(crate) struct PanelQ5_0;

    impl PanelType for PanelQ5_0 {
        const BLOCK: usize = PANEL_ROWS * 22;
        const OFFSET: i32 = 16;

        #[inline(always)]
        unsafe fn step(wb: *const u8, k: usize) -> __m512i {
            unsafe {
                let v = _mm512_loadu_si512(wb.add(32 + 64 * (k % 4)).cast());
                let v = if k < 4 { v } else { _mm512_srli_epi16(v, 4) };
                let nibbles = _mm512_and_si512(v, _mm512_set1_epi8(0x0F));
                let fifth = wb.add(288 + 8 * k).cast::<u64>().read_unaligned();
                _mm512_mask_add_epi8(nibbles, fifth, nibbles, _mm512_set1_epi8(16))
            }
        }
    }

    /// Activation rows per register tile.
    const RA: usize = 6;
    /// Panel pairs ahead whose bytes a tile asks into L2 while it runs.
    const PAIRS_AHEAD: usize = 4;

    /// Weight rows `r0..r1` (a matrix in panels) x activation rows `i0..i1`:
    /// tiles of 2 panels x 6 rows, each panel's outputs written only where
    /// they fall in `r0..r1`.
    ///
    /// # Safety
    /// AVX2, FMA, F16C and AVX-512 F/BW/VL/VNNI available; `job.data` is a
    /// matrix of `T` of `job.rows x job.cols` in panels and `job.acts` its
    /// Block32 activations; the caller owns output elements `(i, r)` for `i`
    /// in `i0..i1`, `r` in `r0..r1`.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(crate) unsafe fn range_vnni_panels<T: PanelType>(
        job: &QuantJob<'_>,
        r0: usize,
        r1: usize,
        i0: usize,
        i1: usize,
    ) {
        unsafe {
            let nb = job.cols / 32;
            assert!(
                job.rows.is_multiple_of(PANEL_ROWS)
                    && r1 <= job.rows
                    && job.data.len() >= job.rows / PANEL_ROWS * nb * T::BLOCK
                    && i1 <= job.acts.n(),
                "panel kernel: inconsistent shapes"
            );
            let (p1, mut p) = (r1.div_ceil(PANEL_ROWS), r0 / PANEL_ROWS);
            while p < p1 {
                let two = p + 1 < p1;
                // Panels further on in the matrix (whoever computes them):
                // two whole ones, so the addresses stay inside it.
                let ahead = p + 2 * PAIRS_AHEAD;
                let in_matrix = ahead + 2 <= job.rows / PANEL_ROWS;
                // Every row tile over the pair asks for its share of the
                // blocks ahead (block `b` by tile `b % tiles`): the stream
                // runs through all of the pair's compute, not in a burst
                // during the first tile's (docs/PERF.md §57).
                let tiles = (i1 - i0).div_ceil(RA);
                let mut i = i0;
                while i < i1 {
                    let ct = (i1 - i).min(RA);
                    let t = Tile {
                        job,
                        nb,
                        panel: p,
                        row: i,
                        rows: (r0, r1),
                        prefetch: in_matrix.then_some(Prefetch {
                            panel: ahead,
                            share: (i - i0) / RA,
                            of: tiles,
                        }),
                    };
                    macro_rules! run {
                        ($($n:literal)*) => {
                            match (two, ct) {
                                $((true, $n) => t.run::<T, 2, $n>(),)*
                                $((false, $n) => t.run::<T, 1, $n>(),)*
                                _ => unreachable!("tiles have 1 to {RA} rows"),
                            }
                        };
                    }
                    run!(1 2 3 4 5 6);
                    i += ct;
                }
                p += if two { 2 } else { 1 };
            }
        }
    }

    /// One register tile: `PO` panels from `panel` on, activation rows from
    /// `row` on.
    struct Tile<'a, 'j> {
        job: &'a QuantJob<'j>,
        nb: usize,
        panel: usize,
        row: usize,
        /// Weight rows whose outputs this call owns.
        rows: (usize, usize),
        /// The panels whose blocks to ask into L2 alongside.
        prefetch: Option<Prefetch>,
    }

    /// Blocks of panels further on that a tile asks into L2: those of
    /// `panel` (and the next) whose index is `share` modulo `of`, each as
    /// the tile multiplies the same block of its own panels.
    struct Prefetch {
        panel: usize,
        share: usize,
        of: usize,
    }

    impl Tile<'_, '_> {
        /// # Safety
        /// As [`range_vnni_panels`]; panels `panel..panel + PO` and
        /// activation rows `row..row + RN` exist.
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        // Indexed loops over the register tile read as its coordinates.
        #[allow(clippy::needless_range_loop)]
        unsafe fn run<T: PanelType, const PO: usize, const RN: usize>(&self) {
            unsafe {
                let nb = self.nb;
                let w = self.job.data.as_ptr().add(self.panel * nb * T::BLOCK);
                // Rows follow each other in the activations' buffers
                // (`QuantizedActs::row`): row `row + r`'s values at `qs + r *
                // cols`, its block scales and sums at `d + r * nb`, `bs + r * nb`.
                let (first, last) = (
                    self.job
                        .acts
                        .row(self.row)
                        .expect("activation row in range"),
                    self.job
                        .acts
                        .row(self.row + RN - 1)
                        .expect("activation row in range"),
                );
                let cols = 32 * nb;
                assert!(
                    first.qs.len() == cols
                        && first.d.len() == nb
                        && first.bsums.len() == nb
                        && last.qs.as_ptr() == first.qs.as_ptr().add((RN - 1) * cols)
                        && last.d.as_ptr() == first.d.as_ptr().add((RN - 1) * nb)
                        && last.bsums.as_ptr() == first.bsums.as_ptr().add((RN - 1) * nb),
                    "panel kernel: activation rows not one after another"
                );
                let (qs, da, bs) = (
                    first.qs.as_ptr().cast::<u8>(),
                    first.d.as_ptr(),
                    first.bsums.as_ptr(),
                );
                let pre = self.prefetch.as_ref().map(|q| {
                    (
                        self.job.data.as_ptr().add(q.panel * nb * T::BLOCK),
                        q.share,
                        q.of,
                    )
                });
                // The 8 lane classes' registers, kept until the tree: each
                // written below before it is read (zeroing 8 x PO x RN
                // registers per tile was ~3% of a speculative server's time).
                let mut class = [[[MaybeUninit::<__m512>::uninit(); RN]; PO]; 8];
                for (j, class) in class.iter_mut().enumerate() {
                    if j >= nb {
                        // Classes with no block (rows under 8 blocks) add 0.
                        *class = [[MaybeUninit::new(_mm512_setzero_ps()); RN]; PO];
                        continue;
                    }
                    let mut facc = [[_mm512_setzero_ps(); RN]; PO];
                    let mut b = j;
                    while b < nb {
                        // Plain loops, not `array::from_fn`/`map`: where those
                        // were not inlined, the tile copied its registers
                        // through memory (the 16-row head 1.7x slower).
                        let mut wb = [w; PO];
                        for (o, wb) in wb.iter_mut().enumerate() {
                            *wb = w.add((o * nb + b) * T::BLOCK);
                        }
                        if let Some((pre, share, of)) = pre {
                            if b % of != share {
                                // Another tile's share.
                            } else {
                                for o in 0..PO {
                                    let at = pre.add((o * nb + b) * T::BLOCK);
                                    for line in (0..T::BLOCK).step_by(64) {
                                        _mm_prefetch(at.add(line).cast(), _MM_HINT_T1);
                                    }
                                }
                            }
                        }
                        // The offset: sum u x = sum s x + OFFSET sum x.
                        let mut acc = [[_mm512_setzero_si512(); RN]; PO];
                        for r in 0..RN {
                            let init = _mm512_set1_epi32(-T::OFFSET * *bs.add(r * nb + b) as i32);
                            for acc in acc.iter_mut() {
                                acc[r] = init;
                            }
                        }
                        for k in 0..8 {
                            let mut wv = [_mm512_setzero_si512(); PO];
                            for (wv, wb) in wv.iter_mut().zip(&wb) {
                                *wv = T::step(*wb, k);
                            }
                            for r in 0..RN {
                                let x = qs.add(r * cols + 32 * b + 4 * k).cast::<i32>();
                                let av = _mm512_set1_epi32(x.read_unaligned());
                                for (acc, wv) in acc.iter_mut().zip(&wv) {
                                    acc[r] = _mm512_dpbusd_epi32(acc[r], *wv, av);
                                }
                            }
                        }
                        // fma(dw * da, isum, lane), as `fold_scaled`.
                        for o in 0..PO {
                            let dw = _mm512_cvtph_ps(_mm256_loadu_si256(wb[o].cast()));
                            for r in 0..RN {
                                let s = _mm512_mul_ps(dw, _mm512_set1_ps(*da.add(r * nb + b)));
                                let isum = _mm512_cvtepi32_ps(acc[o][r]);
                                facc[o][r] = _mm512_fmadd_ps(s, isum, facc[o][r]);
                            }
                        }
                        b += 8;
                    }
                    for (class, facc) in class.iter_mut().zip(&facc) {
                        for (c, f) in class.iter_mut().zip(facc) {
                            *c = MaybeUninit::new(*f);
                        }
                    }
                }
                // `tree8`: (l0 + l4, l1 + l5, l2 + l6, l3 + l7), then pairs.
                let (r0, r1) = self.rows;
                for o in 0..PO {
                    let base = (self.panel + o) * PANEL_ROWS;
                    let (lo, hi) = (r0.max(base), r1.min(base + PANEL_ROWS));
                    if lo >= hi {
                        continue;
                    }
                    let keep = ((1u32 << (hi - base)) - (1u32 << (lo - base))) as __mmask16;
                    for r in 0..RN {
                        // SAFETY: every class was written above.
                        let l = |j: usize| class[j][o][r].assume_init();
                        let h = [
                            _mm512_add_ps(l(0), l(4)),
                            _mm512_add_ps(l(1), l(5)),
                            _mm512_add_ps(l(2), l(6)),
                            _mm512_add_ps(l(3), l(7)),
                        ];
                        let q = [_mm512_add_ps(h[0], h[2]), _mm512_add_ps(h[1], h[3])];
                        let v = _mm512_add_ps(q[0], q[1]);
                        let at = (self.row + r) * self.job.rows;
                        // SAFETY (of the slice): the caller owns outputs lo..hi of
                        // this activation row; the masked store writes only those.
                        let dst = self.job.out.slice(at + lo, hi - lo);
                        _mm512_mask_storeu_ps(dst.as_mut_ptr().wrapping_sub(lo - base), keep, v);
                    }
                }
            }
        }
    }
}
