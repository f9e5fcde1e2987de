//! Quantized blocks: dequantization (the readable scalar reference for each
//! type) and the per-type dot-product kernels that `matmul` dispatches to.
//!
//! Block layouts follow GGUF/ggml. Each type lives in its own file, with its
//! scalar reference code and, beside it, its SIMD version.
//!
//! Dot products against activations quantized by [`q8_act`] are exact in
//! integers per block; see `crate::simd` for the fixed float reduction order
//! every path shares.

pub mod finite;
pub mod float;
pub mod iq1_m;
pub mod iq1_s;
pub mod iq2_s;
pub mod iq2_xs;
pub mod iq2_xxs;
pub mod iq3_s;
pub mod iq3_xxs;
pub mod iq4_nl;
pub mod iq4_xs;
pub(crate) mod kernels;
pub mod mxfp4;
pub mod panels;
pub mod q1_0;
pub mod q2_0;
pub mod q2_k;
pub mod q3_k;
pub mod q4_0;
pub mod q4_1;
pub mod q4_k;
pub mod q5_0;
pub mod q5_1;
pub mod q5_k;
pub mod q6_k;
pub mod q8_0;
pub mod q8_act;
pub(crate) mod registry;
pub mod tq1_0;
pub mod tq2_0;
pub mod vertical;

use crate::error::KernelError;
use crate::simd::tree8;
use q8_act::ActRow;
use spindle_formats::GgmlType;

/// How a matrix's bytes are ordered: the file's order, or one the loader
/// rewrote for the VNNI kernels (any other path converts back first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WeightLayout {
    /// As in the GGUF file.
    #[default]
    Gguf,
    /// Rewritten by [`vertical::to_vertical`].
    Vertical,
    /// Q8_0 or Q5_0 in panels of 16 rows ([`panels::to_panels`]).
    Panels,
}

/// Dequantizes `dst.len()` values of type `ty` from `src`.
///
/// `dst.len()` must be a whole number of blocks and `src` exactly
/// `ty.bytes_for(dst.len())` bytes. This is the scalar reference
/// implementation.
pub fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), KernelError> {
    let expected = checked_bytes(ty, dst.len(), "dequantize destination")?;
    if src.len() != expected {
        return Err(KernelError::size(
            format!("dequantize {ty} source bytes"),
            expected,
            src.len(),
        ));
    }
    (registry::of(ty).dequantize)(src, dst);
    Ok(())
}

/// Bytes taken by `n` values of `ty`, or an error naming `what` when `n` is
/// not a whole number of blocks (or the size overflows).
pub(crate) fn checked_bytes(ty: GgmlType, n: usize, what: &str) -> Result<usize, KernelError> {
    let block_len = ty.block_len();
    if !n.is_multiple_of(block_len) {
        return Err(KernelError::NotBlockAligned {
            what: format!("{what} ({ty})"),
            len: n,
            block_len,
        });
    }
    ty.bytes_for(n as u64)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| KernelError::unsupported(format!("{what}: {n} values of {ty} overflow")))
}

/// The f32 value of the little-endian f16 at `bytes[0..2]`.
#[inline]
pub(crate) fn f16_le(bytes: [u8; 2]) -> f32 {
    half::f16::from_bits(u16::from_le_bytes(bytes)).to_f32()
}

/// The first `N` bytes of `s` as an array. Callers pass slices they have
/// already sized (block chunks), so the length check never fails in practice;
/// it compiles away once the chunk size is a constant.
#[inline(always)]
pub(crate) fn arr<const N: usize>(s: &[u8]) -> &[u8; N] {
    match s.get(..N).map(<&[u8; N]>::try_from) {
        Some(Ok(a)) => a,
        _ => panic!("block slice shorter than {N} bytes (kernel invariant)"),
    }
}

/// Unpacks the 8 six-bit scales and 8 six-bit mins of a Q4_K/Q5_K super-block
/// from their 12 packed bytes.
///
/// Bytes 0..4 hold scales 0..4 in their low 6 bits, bytes 4..8 mins 0..4;
/// bytes 8..12 hold the low 4 bits of scales 4..8 (low nibble) and mins 4..8
/// (high nibble), whose top 2 bits sit in the top bits of bytes 0..8.
#[inline]
pub(crate) fn k_scales_mins(p: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut mn = [0u8; 8];
    for j in 0..4 {
        sc[j] = p[j] & 63;
        mn[j] = p[j + 4] & 63;
        sc[j + 4] = (p[j + 8] & 0x0F) | ((p[j] >> 6) << 4);
        mn[j + 4] = (p[j + 8] >> 4) | ((p[j + 4] >> 6) << 4);
    }
    (sc, mn)
}

pub(crate) mod block32;
pub(crate) mod decoded;
mod grid;
mod iq_grids;
pub(crate) mod multi_row;

/// Scalar reference dot of one Q4_K/Q5_K weight row (whole super-blocks of
/// `block_bytes`) with one activation row. `value(block, j, l)` is the
/// unsigned value `l` (0..32) of sub-block `j` (0..8). Sub-block `j` of
/// super-block `s` meets activation block `b = 8s + j` and folds into lane
/// `b % 8` with [`fold_scaled_min`].
pub(crate) fn k_dot_scalar(
    w: &[u8],
    block_bytes: usize,
    a: ActRow<'_>,
    value: impl Fn(&[u8], usize, usize) -> u8,
) -> f32 {
    let mut lanes = [0.0f32; 8];
    for (s, block) in w.chunks_exact(block_bytes).enumerate() {
        let d = f16_le(*arr::<2>(block));
        let dmin = f16_le(*arr::<2>(&block[2..]));
        let (sc, mn) = k_scales_mins(arr::<12>(&block[4..]));
        for j in 0..8 {
            let b = 8 * s + j;
            let aq = &a.qs[32 * b..32 * b + 32];
            let isum: i32 = (0..32)
                .map(|l| value(block, j, l) as i32 * aq[l] as i32)
                .sum();
            fold_scaled_min(
                &mut lanes[b % 8],
                d * sc[j] as f32,
                dmin * mn[j] as f32,
                a.d[b],
                isum,
                a.bsums[b] as i32,
            );
        }
    }
    tree8(&lanes)
}

/// Folds one block's exact integer dot into an f32 lane:
/// `lane = fma(dw * da, isum, lane)`. Shared by every path so they round
/// identically.
#[inline]
pub(crate) fn fold_scaled(lane: &mut f32, dw: f32, da: f32, isum: i32) {
    *lane = (dw * da).mul_add(isum as f32, *lane);
}

/// Folds one 32-value sub-block of a Q4_K/Q5_K super-block into an f32 lane:
/// `lane = fma(da, fma(ds, isum, -(dm * asum)), lane)`. Here `ds = d *
/// scale` and `dm = dmin * min` are the sub-block's scale and min (both
/// exact in f32), `da` the activation block's scale, `isum` the exact dot of
/// the sub-block's unsigned values with the activation block and `asum` the
/// activation block's sum. Shared by every path so they round identically.
#[inline]
pub(crate) fn fold_scaled_min(lane: &mut f32, ds: f32, dm: f32, da: f32, isum: i32, asum: i32) {
    let inner = ds.mul_add(isum as f32, -(dm * asum as f32));
    *lane = da.mul_add(inner, *lane);
}

/// Prefetches the cache lines of `w[start..end]` into L2 (nothing past
/// `w`'s end). Into L2, not L1: a multi-row tile runs against activation
/// rows that fill most of L1, and weights pulled into L1 ahead of time
/// evicted them (the output head's 16-row matmul took 15.4 ms with L1
/// prefetches, 11.1 ms with these; docs/PERF.md §40).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn prefetch_range_l2(w: &[u8], start: usize, end: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
    for off in (start..end.min(w.len())).step_by(64) {
        // SAFETY: the address is inside `w`; a prefetch has no
        // architectural effect and SSE is part of x86-64.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(w.as_ptr().add(off).cast()) };
    }
}

/// Prefetches rows `r..r + n` of `w` (rows of `row_bytes`) into L2, if
/// they all exist (the AMX tiles ask for their next rows this way).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn prefetch_rows_l2(w: &[u8], r: usize, n: usize, row_bytes: usize) {
    let (start, end) = (r * row_bytes, (r + n) * row_bytes);
    if end <= w.len() {
        prefetch_range_l2(w, start, end);
    }
}

/// How far ahead, in weight rows, the one-row kernels prefetch.
#[cfg(target_arch = "x86_64")]
const PREFETCH_ROWS: usize = 4;

/// Prefetches row `r + PREFETCH_ROWS` of `w` (rows of `row_bytes`), if there
/// is one. Decode streams every weight row exactly once; asking a few rows
/// early keeps more DRAM requests in flight (+10% decode, docs/PERF.md;
/// the K-quant kernels showed no gain from it).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn prefetch_row_ahead(w: &[u8], r: usize, row_bytes: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    let ahead = (r + PREFETCH_ROWS) * row_bytes;
    if ahead + row_bytes <= w.len() {
        for off in (0..row_bytes).step_by(64) {
            // SAFETY: the address is inside `w`; a prefetch has no
            // architectural effect and SSE is part of x86-64.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(w.as_ptr().add(ahead + off).cast()) };
        }
    }
}
