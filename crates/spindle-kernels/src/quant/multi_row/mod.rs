// One file (over 900 lines) on purpose: the folds (`Fold`, `fold_decoded`),
// the packed layouts (`WGroup`, `ActGroup`), the code that packs them and the
// micro-kernel that reads them are one contract, and the scalar path beside
// them must do the same float operations bit for bit. Kept together, a change
// to one is made and reviewed with the others (a new fold touches all four).

//! Multi-row quantized matmul: each weight block is decoded once per call (per
//! chunk of activation rows) and multiplied against many activation rows.
//!
//! # Bit-identical to the one-row kernels
//!
//! Every output element goes through exactly the float operations of the
//! one-row kernels ([`block32`](super::block32), [`q4_k`](super::q4_k), ...):
//! block `b`'s exact int32 dot `isum_b` is scaled and folded into lane `b % 8`
//! ([`Fold`]), blocks in order, then the 8 lanes are reduced with `tree8`. Only
//! the integer work is reorganised, and integer sums are exact in any order.
//!
//! # The AVX2 micro-kernel
//!
//! Blocks go 8 at a time (a *group*: 256 values, one K super-block). Both
//! sides are stored "vertically": step vector `k` (0..8) of a group holds, in
//! its 32-bit lane `j`, values `4k..4k+4` of block `j`. A `maddubs` of a weight
//! step with an activation step then adds 4 products of each of the 8 blocks
//! into that block's own lane, so 8 steps (plain vertical adds) give the 8
//! block dots side by side, ready for one vector fold into the 8 lanes. No
//! horizontal reduction is left in the inner loop.
//!
//! A row's last group with at most 4 blocks (a row of 20 blocks, as
//! Gemma's 640 columns) is stored in a *half* layout instead: 4 steps of 8
//! values per block (64-bit lanes), so no work is spent on padding.
//!
//! The int16 pair sums of `maddubs` are accumulated over [`MultiRow::STEPS`]
//! steps while they cannot overflow (4-bit values: 8 steps, 5-bit and Q6_K:
//! 4, Q8_0: 1), then widened to int32 with one `madd` (by ones, or for Q6_K by
//! the 16-value sub-block scales, which the first 4 steps and the last 4 cover
//! exactly).
//!
//! Weights are packed per tile of [`MR`] rows into [`WGroup`]s (values as the
//! unsigned `maddubs` operand, signed copies for sign-trick types, float scale
//! terms); activations once per call into [`ActGroup`]s. A tile of `MR` weight
//! rows x [`NR`] activation rows is register-blocked.
//!
//! The scalar path decodes each weight row once into [`Decoded`] blocks and
//! dots it with every activation row.

use super::q8_act::{ActRow, QuantizedActs};
use super::{fold_scaled, fold_scaled_min};
use crate::matmul::OutPtr;
use crate::simd::tree8;
use std::cell::RefCell;

/// Weight rows per register tile.
pub(crate) const MR: usize = 4;
/// Activation rows per register tile.
pub(crate) const NR: usize = 2;

/// Aim for chunks of packed activation rows of about this many bytes (L2
/// resident while every weight tile of a thread runs against them).
const ACT_CHUNK_BYTES: usize = 160 * 1024;

/// How a type's exact block dot becomes a float term of lane `b % 8`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fold {
    /// [`fold_scaled`] with the block scale `dw` (Q8_0, Q4_0, Q5_0).
    Block32,
    /// [`fold_scaled_min`] with sub-block scale `d * sc` and min `dmin * mn`
    /// (Q4_K, Q5_K).
    KMin,
    /// [`fold_scaled`] with the super-block scale `d`; the integer dot carries
    /// the two 16-value sub-block scales (Q6_K, Q3_K).
    Q6,
    /// [`fold_scaled_min`] with the super-block scale `d` and min `dmin`: the
    /// integer dot carries the two 16-value sub-block scales (as `Q6`), and
    /// the min term is the exact `mn[0] * sum(a[0..16]) + mn[1] *
    /// sum(a[16..32])` (Q2_K).
    Q2,
}

/// One 32-value weight block decoded for the scalar multi-row path.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Decoded {
    /// The integer values: signed for `Block32` and `Q6`, unsigned for
    /// `KMin`.
    pub v: [i8; 32],
    /// `Block32`: `dw`; `KMin`: `d * scale`; `Q6`: `d`.
    pub f0: f32,
    /// `KMin`: `dmin * min`.
    pub f1: f32,
    /// `Q6`, `Q2`: the scales of values 0..16 and 16..32.
    pub sc: [i8; 2],
    /// `Q2`: the mins of values 0..16 and 16..32.
    pub mn: [u8; 2],
}

/// A group of 8 weight blocks of one row, packed for the AVX2 micro-kernel.
#[repr(C, align(32))]
#[derive(Clone, Copy)]
pub(crate) struct WGroup {
    /// The unsigned `maddubs` operand, vertical: the values for unsigned
    /// types, their magnitudes for signed ones.
    pub u: [u8; 256],
    /// Per block: `Block32`: `dw`; `KMin`: `d * scale`; `Q6`: `d`.
    pub f0: [f32; 8],
    /// Per block: `KMin`: `dmin * min`.
    pub f1: [f32; 8],
    /// Signed types: the signed values, vertical (their signs are applied to
    /// the activations).
    pub s: [i8; 256],
    /// `Q6`, `Q2`: int16 multipliers widening the pair sums of steps 0..4
    /// (`sc[0]`) and 4..8 (`sc[1]`): both halves of 32-bit lane `j` hold the
    /// scale of block `j`'s values 0..16, resp. 16..32.
    pub sc: [[i16; 16]; 2],
    /// `Q2`: per block, the mins of values 0..16 (`mn[0]`) and 16..32.
    pub mn: [[i32; 8]; 2],
}

impl WGroup {
    pub(crate) const ZERO: WGroup = WGroup {
        u: [0; 256],
        f0: [0.0; 8],
        f1: [0.0; 8],
        s: [0; 256],
        sc: [[0; 16]; 2],
        mn: [[0; 8]; 2],
    };
}

/// A group of 8 activation blocks of one row, packed for the AVX2
/// micro-kernel. Blocks past the end of the row are zero.
#[repr(C, align(32))]
#[derive(Clone, Copy)]
pub(crate) struct ActGroup {
    /// The quantized values, vertical.
    pub qs: [i8; 256],
    /// Block scales.
    pub d: [f32; 8],
    /// `Block32`: `OFFSET * bsum`, taken off the dot of unsigned values;
    /// `Q2`: the sums of values 0..16 (those of 16..32 are `asum` minus
    /// these). One field for both keeps the group small for every type.
    pub corr: [i32; 8],
    /// `KMin`, `Q2`: the block sums as f32 (exact).
    pub asum: [f32; 8],
}

impl ActGroup {
    const ZERO: ActGroup = ActGroup {
        qs: [0; 256],
        d: [0.0; 8],
        corr: [0; 8],
        asum: [0.0; 8],
    };
}

/// A quantized weight type's multi-row kernel pieces.
pub(crate) trait MultiRow {
    const FOLD: Fold;
    /// Whether the packed values are signed (dotted with the sign trick).
    const SIGNED: bool;
    /// Steps (of 4 values per block) whose int16 pair sums are accumulated
    /// before widening: a divisor of 8.
    const STEPS: usize;
    /// `Block32` types stored unsigned: `u = value + OFFSET`.
    const OFFSET: i32;

    /// Bytes of a weight row of `nb` blocks of 32.
    fn row_bytes(nb: usize) -> usize;

    /// Decodes the `out.len()` blocks of one weight row.
    fn decode_row(row: &[u8], out: &mut [Decoded]);

    /// Packs group `g` (blocks `8g..min(8g + 8, nb)`, the rest zero) of the
    /// weight row at `row`.
    ///
    /// # Safety
    /// AVX2, FMA and F16C available; `row` covers `nb` blocks (a whole row,
    /// [`row_bytes(nb)`](Self::row_bytes) bytes) and `8 * g < nb`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn pack_group(row: *const u8, g: usize, nb: usize, out: &mut WGroup);

    /// Packs group `g` for the VNNI kernel: only `u`, `f0`, `f1` and `sc`
    /// are read there, and `u` holds signed types' values as `s + 128`
    /// (`vpdpbusd` multiplies unsigned by signed, with no saturation).
    ///
    /// # Safety
    /// As [`pack_group`](Self::pack_group).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn pack_group_unsigned(row: *const u8, g: usize, nb: usize, out: &mut WGroup) {
        unsafe {
            use std::arch::x86_64::*;
            Self::pack_group(row, g, nb, out);
            if Self::SIGNED {
                let flip = _mm256_set1_epi8(0x80u8 as i8);
                for k in 0..8 {
                    let s = _mm256_loadu_si256(out.s.as_ptr().add(32 * k).cast());
                    _mm256_storeu_si256(
                        out.u.as_mut_ptr().add(32 * k).cast(),
                        _mm256_xor_si256(s, flip),
                    );
                }
            }
        }
    }
}

/// Everything a multi-row range needs: the weights, the activations (plain
/// for the scalar path, packed for AVX2) and where results go
/// (`out[i * rows + r]`).
pub(crate) struct QuantJob<'a> {
    pub data: &'a [u8],
    pub row_bytes: usize,
    pub rows: usize,
    pub cols: usize,
    pub acts: &'a QuantizedActs,
    pub packed: &'a [ActGroup],
    pub out: &'a OutPtr,
}

/// Computes outputs of weight rows `r0..r1` against activation rows `i0..i1`.
pub(crate) type QuantRangeFn = unsafe fn(&QuantJob<'_>, usize, usize, usize, usize);

/// Packs all activation rows for the AVX2 kernels of a type.
pub(crate) type PackActsFn = unsafe fn(&QuantizedActs, &mut Vec<ActGroup>);

/// Folds decoded block `blk`'s exact integer sums into `lane` as its type's
/// one-row kernel does. `dots` are the dots of its values 0..16 and 16..32
/// with activation block `b` of `a`; `half_sums` that block's sums of
/// values 0..16 and 16..32 (read by `Fold::Q2` only).
#[inline]
pub(crate) fn fold_decoded(
    fold: Fold,
    lane: &mut f32,
    blk: &Decoded,
    a: ActRow<'_>,
    b: usize,
    dots: [i32; 2],
    half_sums: [i32; 2],
) {
    let da = a.d[b];
    match fold {
        Fold::Block32 => fold_scaled(lane, blk.f0, da, dots[0] + dots[1]),
        Fold::KMin => fold_scaled_min(
            lane,
            blk.f0,
            blk.f1,
            da,
            dots[0] + dots[1],
            a.bsums[b] as i32,
        ),
        Fold::Q6 => {
            let isum = blk.sc[0] as i32 * dots[0] + blk.sc[1] as i32 * dots[1];
            fold_scaled(lane, blk.f0, da, isum);
        }
        Fold::Q2 => {
            let isum = blk.sc[0] as i32 * dots[0] + blk.sc[1] as i32 * dots[1];
            let msum = blk.mn[0] as i32 * half_sums[0] + blk.mn[1] as i32 * half_sums[1];
            fold_scaled_min(lane, blk.f0, blk.f1, da, isum, msum);
        }
    }
}

/// Scalar: the integer sums of decoded block `blk` with activation block
/// `b` of `a`, folded into `lane` by [`fold_decoded`].
#[inline]
pub(crate) fn fold_decoded_scalar(
    fold: Fold,
    lane: &mut f32,
    blk: &Decoded,
    a: ActRow<'_>,
    b: usize,
) {
    let aq = &a.qs[32 * b..32 * b + 32];
    let half = |h: usize, by: &dyn Fn(usize) -> i32| -> i32 {
        (16 * h..16 * h + 16).map(|l| by(l) * aq[l] as i32).sum()
    };
    let value = |l: usize| blk.v[l] as i32;
    let dots = [half(0, &value), half(1, &value)];
    let half_sums = if matches!(fold, Fold::Q2) {
        [half(0, &|_| 1), half(1, &|_| 1)]
    } else {
        [0, 0]
    };
    fold_decoded(fold, lane, blk, a, b, dots, half_sums);
}

/// Scalar multi-row dot of one decoded weight row with one activation row:
/// the float operations of the type's one-row scalar kernel.
fn dot_decoded<T: MultiRow>(w: &[Decoded], a: ActRow<'_>) -> f32 {
    let mut lanes = [0.0f32; 8];
    for (b, blk) in w.iter().enumerate() {
        fold_decoded_scalar(T::FOLD, &mut lanes[b % 8], blk, a, b);
    }
    tree8(&lanes)
}

thread_local! {
    /// Decoded weight row (scalar path), reused across calls on this thread.
    static DECODED: RefCell<Vec<Decoded>> = const { RefCell::new(Vec::new()) };
    /// Packed weight tile (AVX2 path), reused across calls on this thread.
    static WTILE: RefCell<Vec<WGroup>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with this thread's buffer from `key`, resized to `len` (a fresh
/// one should the buffer be in use by a re-entrant call).
fn with_buffer<E: Copy, R>(
    key: &'static std::thread::LocalKey<RefCell<Vec<E>>>,
    len: usize,
    zero: E,
    f: impl FnOnce(&mut [E]) -> R,
) -> R {
    key.with(|cell| match cell.try_borrow_mut() {
        Ok(mut v) => {
            v.resize(len, zero);
            f(&mut v)
        }
        Err(_) => f(&mut vec![zero; len]),
    })
}

/// Scalar: weight rows `r0..r1` x activation rows `i0..i1`; each weight row
/// is decoded once.
///
/// # Safety
/// The caller owns output elements `(i, r)` for `i` in `i0..i1`, `r` in
/// `r0..r1` (no other thread writes them), as [`OutPtr::set`] requires.
/// (Reads are bounds-checked.)
pub(crate) unsafe fn range_scalar<T: MultiRow>(
    job: &QuantJob<'_>,
    r0: usize,
    r1: usize,
    i0: usize,
    i1: usize,
) {
    let nb = job.cols / 32;
    with_buffer(&DECODED, nb, Decoded::default(), |dec| {
        for r in r0..r1 {
            let row = &job.data[r * job.row_bytes..(r + 1) * job.row_bytes];
            T::decode_row(row, dec);
            for i in i0..i1 {
                let Some(a) = job.acts.row(i) else { return };
                // SAFETY: the caller owns output `(i, r)`.
                unsafe { job.out.set(i * job.rows + r, dot_decoded::<T>(dec, a)) };
            }
        }
    });
}

/// Activation rows per chunk (a multiple of [`NR`]) for activation rows of
/// `bytes_per_row` bytes as the kernel reads them.
pub(crate) fn act_chunk_rows(bytes_per_row: usize) -> usize {
    ((ACT_CHUNK_BYTES / bytes_per_row.max(1)) / NR * NR).max(NR)
}

/// Bytes of one packed activation row of `cols` values (AVX2 path).
pub(crate) fn packed_row_bytes(cols: usize) -> usize {
    (cols / 32).div_ceil(8) * std::mem::size_of::<ActGroup>()
}

/// The loop both SIMD multi-row paths share: activation rows `i0..i1` in
/// chunks of `chunk` rows; against each chunk, weight rows `r0..r1` in tiles
/// of up to [`MR`], each packed once into this thread's buffer by
/// `pack(row, out, rt)` (group `g` of the tile's row `r` at `out + r + g *
/// rt`), then `run(tile, rt, t0, c0, c1)` for tile rows `t0..t0 + rt` and
/// activation rows `c0..c1`. Asks for the rows of a tile ahead while one
/// runs (the head streams 178 MB per call).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn for_each_packed_tile(
    job: &QuantJob<'_>,
    chunk: usize,
    (r0, r1): (usize, usize),
    (i0, i1): (usize, usize),
    pack: impl Fn(*const u8, *mut WGroup, usize),
    mut run: impl FnMut(*const WGroup, usize, usize, usize, usize),
) {
    let ng = (job.cols / 32).div_ceil(8);
    with_buffer(&WTILE, MR * ng, WGroup::ZERO, |buf| {
        let data = &job.data[..r1 * job.row_bytes];
        let mut c0 = i0;
        while c0 < i1 {
            let c1 = (c0 + chunk).min(i1);
            let mut t0 = r0;
            while t0 < r1 {
                let rt = (r1 - t0).min(MR);
                for r in 0..rt {
                    crate::quant::prefetch_row_ahead(data, t0 + r, job.row_bytes);
                    let row = data[(t0 + r) * job.row_bytes..].as_ptr();
                    // The buffer holds MR * ng groups: room for rt * ng.
                    pack(row, buf[r..].as_mut_ptr(), rt);
                }
                run(buf.as_ptr(), rt, t0, c0, c1);
                t0 += rt;
            }
            c0 = c1;
        }
    });
}

#[cfg(target_arch = "x86_64")]
pub(crate) use avx2::{pack_acts, range_avx2, store_group, store_vertical};

#[cfg(target_arch = "x86_64")]
mod vnni;
#[cfg(target_arch = "x86_64")]
pub(crate) use vnni::{pack_acts_vnni, range_vnni};

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use crate::simd::{tree8, Isa};

    #[test]
    fn tree8_x8_matches_tree8() {
        if !Isa::Avx2.is_available() {
            return;
        }
        let mut x = 0x2545_F491u32;
        for _ in 0..500 {
            let mut l = [[0.0f32; 8]; 8];
            for v in l.iter_mut().flatten() {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                *v = (x as f32 / u32::MAX as f32 - 0.5) * 10f32.powi((x % 9) as i32 - 4);
            }
            let mut got = [0.0f32; 8];
            // SAFETY: AVX2 checked above; the arrays bound the loads and the store.
            unsafe {
                use std::arch::x86_64::*;
                let v = l.map(|r| _mm256_loadu_ps(r.as_ptr()));
                _mm256_storeu_ps(got.as_mut_ptr(), super::avx2::tree8_x8(&v));
            }
            for (lane, j) in [0, 2, 4, 6, 1, 3, 5, 7].into_iter().enumerate() {
                assert_eq!(got[lane].to_bits(), tree8(&l[j]).to_bits());
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{act_chunk_rows, ActGroup, Fold, MultiRow, QuantJob, WGroup};
    use super::{MR, NR};
    use crate::quant::q8_act::{ActRow, QuantizedActs};
    use crate::simd::avx2::*;
    use std::arch::x86_64::*;
    use std::ptr::addr_of;

    /// Stores 8 vectors `v[j]` (32 values of block `j`) vertically at `dst`:
    /// 32 bytes per step `k`, whose 32-bit lane `j` is bytes `4k..4k+4` of
    /// `v[j]` (an 8x8 transpose of 32-bit words).
    ///
    /// # Safety
    /// AVX2, FMA and F16C available; `dst..dst + 256` writable.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn store_vertical(v: &[__m256i; 8], dst: *mut u8) {
        unsafe {
            let t0 = _mm256_unpacklo_epi32(v[0], v[1]);
            let t1 = _mm256_unpackhi_epi32(v[0], v[1]);
            let t2 = _mm256_unpacklo_epi32(v[2], v[3]);
            let t3 = _mm256_unpackhi_epi32(v[2], v[3]);
            let t4 = _mm256_unpacklo_epi32(v[4], v[5]);
            let t5 = _mm256_unpackhi_epi32(v[4], v[5]);
            let t6 = _mm256_unpacklo_epi32(v[6], v[7]);
            let t7 = _mm256_unpackhi_epi32(v[6], v[7]);
            // u_k: word k of blocks 0..4 (low half), word k + 4 (high half).
            let u0 = _mm256_unpacklo_epi64(t0, t2);
            let u1 = _mm256_unpackhi_epi64(t0, t2);
            let u2 = _mm256_unpacklo_epi64(t1, t3);
            let u3 = _mm256_unpackhi_epi64(t1, t3);
            let u4 = _mm256_unpacklo_epi64(t4, t6);
            let u5 = _mm256_unpackhi_epi64(t4, t6);
            let u6 = _mm256_unpacklo_epi64(t5, t7);
            let u7 = _mm256_unpackhi_epi64(t5, t7);
            let steps = [
                _mm256_permute2x128_si256(u0, u4, 0x20),
                _mm256_permute2x128_si256(u1, u5, 0x20),
                _mm256_permute2x128_si256(u2, u6, 0x20),
                _mm256_permute2x128_si256(u3, u7, 0x20),
                _mm256_permute2x128_si256(u0, u4, 0x31),
                _mm256_permute2x128_si256(u1, u5, 0x31),
                _mm256_permute2x128_si256(u2, u6, 0x31),
                _mm256_permute2x128_si256(u3, u7, 0x31),
            ];
            for (k, s) in steps.iter().enumerate() {
                _mm256_storeu_si256(dst.add(32 * k).cast(), *s);
            }
        }
    }

    /// [`tree8_ps`] of 8 vectors at once, with the same additions in the same
    /// order: lanes `[t0, t2, t4, t6, t1, t3, t5, t7]`, `t_j = tree8(v[j])`.
    ///
    /// # Safety
    /// AVX2, FMA and F16C available.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn tree8_x8(v: &[__m256; 8]) -> __m256 {
        // h = l[0..4] + l[4..8] of v[2k] (low half) and v[2k + 1] (high).
        let mut h = [_mm256_setzero_ps(); 4];
        for (k, h) in h.iter_mut().enumerate() {
            let (a, b) = (v[2 * k], v[2 * k + 1]);
            *h = _mm256_add_ps(
                _mm256_permute2f128_ps(a, b, 0x20),
                _mm256_permute2f128_ps(a, b, 0x31),
            );
        }
        // q = [h0 + h2, h1 + h3] of each: [q0, q2 | q1, q3] of v[4m..4m + 4].
        let q01 = _mm256_add_ps(
            _mm256_shuffle_ps(h[0], h[1], 0x44),
            _mm256_shuffle_ps(h[0], h[1], 0xEE),
        );
        let q23 = _mm256_add_ps(
            _mm256_shuffle_ps(h[2], h[3], 0x44),
            _mm256_shuffle_ps(h[2], h[3], 0xEE),
        );
        // q0 + q1.
        _mm256_add_ps(
            _mm256_shuffle_ps(q01, q23, 0x88),
            _mm256_shuffle_ps(q01, q23, 0xDD),
        )
    }

    /// Stores the first 4 vectors `v[j]` (32 values of block `j`) in the half
    /// layout at `dst`: 32 bytes per step `k` (0..4), whose 64-bit lane `j` is
    /// bytes `8k..8k+8` of `v[j]`.
    ///
    /// # Safety
    /// AVX2, FMA and F16C available; `dst..dst + 128` writable.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn store_half(v: &[__m256i; 8], dst: *mut u8) {
        unsafe {
            let t0 = _mm256_unpacklo_epi64(v[0], v[1]);
            let t1 = _mm256_unpackhi_epi64(v[0], v[1]);
            let t2 = _mm256_unpacklo_epi64(v[2], v[3]);
            let t3 = _mm256_unpackhi_epi64(v[2], v[3]);
            let steps = [
                _mm256_permute2x128_si256(t0, t2, 0x20),
                _mm256_permute2x128_si256(t1, t3, 0x20),
                _mm256_permute2x128_si256(t0, t2, 0x31),
                _mm256_permute2x128_si256(t1, t3, 0x31),
            ];
            for (k, s) in steps.iter().enumerate() {
                _mm256_storeu_si256(dst.add(32 * k).cast(), *s);
            }
        }
    }

    /// Stores a group's 8 block vectors: vertically, or in the half layout
    /// when only the first `m <= 4` blocks are valid (the last group of a
    /// row).
    ///
    /// # Safety
    /// AVX2, FMA and F16C available; `dst..dst + 256` writable.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn store_group(v: &[__m256i; 8], m: usize, dst: *mut u8) {
        unsafe {
            if m <= 4 {
                store_half(v, dst)
            } else {
                store_vertical(v, dst)
            }
        }
    }

    /// Packs every activation row of `acts` (blocks of 32) into `out`:
    /// `ceil(nb / 8)` groups per row, row after row.
    ///
    /// # Safety
    /// AVX2, FMA and F16C available.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn pack_acts<T: MultiRow>(acts: &QuantizedActs, out: &mut Vec<ActGroup>) {
        unsafe { pack_acts_offset::<T>(acts, out, T::OFFSET) }
    }

    /// [`pack_acts`] with the weights' values taken as `u - offset`: `corr`
    /// is `offset * bsum`.
    ///
    /// # Safety
    /// AVX2, FMA and F16C available.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn pack_acts_offset<T: MultiRow>(
        acts: &QuantizedActs,
        out: &mut Vec<ActGroup>,
        offset: i32,
    ) {
        unsafe {
            let nb = acts.cols() / 32;
            let ng = nb.div_ceil(8);
            out.resize(acts.n() * ng, ActGroup::ZERO);
            for (i, groups) in out.chunks_exact_mut(ng.max(1)).enumerate() {
                let Some(a) = acts.row(i) else { return };
                for (g, ag) in groups.iter_mut().enumerate() {
                    pack_act_group(a, g, offset, ag);
                    if matches!(T::FOLD, Fold::Q2) {
                        ag.corr = low_half_sums(a, g);
                    }
                }
            }
        }
    }

    /// Packs group `g` of activation row `a` into `ag`, as [`pack_acts_offset`].
    ///
    /// # Safety
    /// AVX2, FMA and F16C available; `8 * g` is below `a`'s block count.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn pack_act_group(a: ActRow<'_>, g: usize, offset: i32, ag: &mut ActGroup) {
        unsafe {
            let nb = a.qs.len() / 32;
            let mut v = [_mm256_setzero_si256(); 8];
            for (j, vj) in v.iter_mut().enumerate() {
                let b = 8 * g + j;
                if b < nb {
                    // In bounds: `a.qs` holds `nb` blocks of 32.
                    *vj = load_256(a.qs.as_ptr().add(32 * b).cast());
                    ag.d[j] = a.d[b];
                    ag.corr[j] = offset * a.bsums[b] as i32;
                    ag.asum[j] = a.bsums[b] as f32;
                } else {
                    ag.d[j] = 0.0;
                    ag.corr[j] = 0;
                    ag.asum[j] = 0.0;
                }
            }
            store_group(&v, nb - 8 * g, ag.qs.as_mut_ptr().cast());
        }
    }

    /// The sums of values 0..16 of each block of group `g` of activation
    /// row `a` (0 past the row's end).
    fn low_half_sums(a: ActRow<'_>, g: usize) -> [i32; 8] {
        let mut out = [0; 8];
        for (o, chunk) in out.iter_mut().zip(a.qs.chunks_exact(32).skip(8 * g)) {
            *o = chunk[..16].iter().map(|&q| q as i32).sum();
        }
        out
    }

    /// The exact int32 block dots of one group for each (weight row `r`,
    /// activation row `c`) of a tile, over `$nsteps` steps: 8 for a full
    /// group; 4 for a half group, whose 64-bit lanes then hold two partial
    /// sums per block. (A macro: as a function, the compiler schedules the
    /// unrolled tile badly.)
    macro_rules! int_dots {
        ($T:ty, $R:expr, $C:expr, $nsteps:expr, $wg:expr, $ag:expr, $ones:expr) => {{
            let (wg, ag, ones) = ($wg, $ag, $ones);
            let phase = <$T>::STEPS.min($nsteps);
            let mut isum = [[_mm256_setzero_si256(); $C]; $R];
            let mut k0 = 0;
            while k0 < $nsteps {
                let mut acc = [[_mm256_setzero_si256(); $C]; $R];
                for k in k0..k0 + phase {
                    let mut av = [_mm256_setzero_si256(); $C];
                    for (c, v) in av.iter_mut().enumerate() {
                        *v = load_256(addr_of!((*ag[c]).qs).cast::<u8>().add(32 * k));
                    }
                    for r in 0..$R {
                        let wu = load_256(addr_of!((*wg[r]).u).cast::<u8>().add(32 * k));
                        let ws = if <$T>::SIGNED {
                            load_256(addr_of!((*wg[r]).s).cast::<u8>().add(32 * k))
                        } else {
                            wu
                        };
                        for c in 0..$C {
                            let y = if <$T>::SIGNED {
                                _mm256_sign_epi8(av[c], ws)
                            } else {
                                av[c]
                            };
                            let m = _mm256_maddubs_epi16(wu, y);
                            acc[r][c] = if phase == 1 {
                                _mm256_add_epi32(acc[r][c], _mm256_madd_epi16(m, ones))
                            } else {
                                _mm256_add_epi16(acc[r][c], m)
                            };
                        }
                    }
                }
                for r in 0..$R {
                    let widen = if matches!(<$T>::FOLD, Fold::Q6 | Fold::Q2) {
                        load_256(addr_of!((*wg[r]).sc[k0 / 4]).cast())
                    } else {
                        ones
                    };
                    for c in 0..$C {
                        let t = if phase == 1 {
                            acc[r][c]
                        } else {
                            _mm256_madd_epi16(acc[r][c], widen)
                        };
                        isum[r][c] = _mm256_add_epi32(isum[r][c], t);
                    }
                }
                k0 += phase;
            }
            isum
        }};
    }

    /// The `R x C` tile of dots of packed weight rows `w + r` (group `g` of
    /// row `r` at `w + g * wstride + r`) with packed activation rows `a[c]`
    /// (group `g` at `a[c] + g`), over `ng` groups whose last has `last`
    /// valid blocks: the 8 float lanes of each `(r, c)`, to be reduced with
    /// `tree8`.
    ///
    /// # Safety
    /// AVX2, FMA and F16C available; the pointers cover `ng` groups.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tile<T: MultiRow, const R: usize, const C: usize>(
        w: *const WGroup,
        wstride: usize,
        a: &[*const ActGroup; C],
        ng: usize,
        last: usize,
    ) -> [[__m256; C]; R] {
        unsafe {
            let ones = _mm256_set1_epi16(1);
            let mut facc = [[_mm256_setzero_ps(); C]; R];
            for g in 0..ng {
                let mut wg = [w; R];
                for (r, p) in wg.iter_mut().enumerate() {
                    *p = w.add(g * wstride + r);
                }
                let mut ag = *a;
                for p in ag.iter_mut() {
                    *p = p.add(g);
                }
                let partial = g + 1 == ng && last < 8;
                let isum = if partial && last <= 4 {
                    // Half layout: add each block's two partial sums and move
                    // block j to lane j.
                    let mut s = int_dots!(T, R, C, 4, &wg, &ag, ones);
                    let idx = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
                    for row in s.iter_mut() {
                        for v in row.iter_mut() {
                            let pairs =
                                _mm256_add_epi32(*v, _mm256_shuffle_epi32(*v, 0b10_11_00_01));
                            *v = _mm256_permutevar8x32_epi32(pairs, idx);
                        }
                    }
                    s
                } else {
                    int_dots!(T, R, C, 8, &wg, &ag, ones)
                };
                for r in 0..R {
                    let f0 = load_ps(addr_of!((*wg[r]).f0).cast());
                    for c in 0..C {
                        let da = load_ps(addr_of!((*ag[c]).d).cast());
                        let old = facc[r][c];
                        let new = match T::FOLD {
                            Fold::Block32 => {
                                let isum = if T::OFFSET != 0 {
                                    let corr = load_256(addr_of!((*ag[c]).corr).cast());
                                    _mm256_sub_epi32(isum[r][c], corr)
                                } else {
                                    isum[r][c]
                                };
                                // fma(dw * da, isum, lane), as `fold_scaled`.
                                _mm256_fmadd_ps(
                                    _mm256_mul_ps(f0, da),
                                    _mm256_cvtepi32_ps(isum),
                                    old,
                                )
                            }
                            Fold::KMin => {
                                // As `fold_scaled_min` (and `q4_k::avx2::fold_super`).
                                let f1 = load_ps(addr_of!((*wg[r]).f1).cast());
                                let asum = load_ps(addr_of!((*ag[c]).asum).cast());
                                let inner = _mm256_fmsub_ps(
                                    f0,
                                    _mm256_cvtepi32_ps(isum[r][c]),
                                    _mm256_mul_ps(f1, asum),
                                );
                                _mm256_fmadd_ps(da, inner, old)
                            }
                            Fold::Q6 => _mm256_fmadd_ps(
                                _mm256_mul_ps(f0, da),
                                _mm256_cvtepi32_ps(isum[r][c]),
                                old,
                            ),
                            Fold::Q2 => {
                                // As `fold_scaled_min` with the exact half-block
                                // min sum for `asum`.
                                let f1 = load_ps(addr_of!((*wg[r]).f1).cast());
                                let low_sum = load_256(addr_of!((*ag[c]).corr).cast());
                                let block_sum =
                                    _mm256_cvtps_epi32(load_ps(addr_of!((*ag[c]).asum).cast()));
                                let lo = _mm256_mullo_epi32(
                                    load_256(addr_of!((*wg[r]).mn[0]).cast()),
                                    low_sum,
                                );
                                let hi = _mm256_mullo_epi32(
                                    load_256(addr_of!((*wg[r]).mn[1]).cast()),
                                    _mm256_sub_epi32(block_sum, low_sum),
                                );
                                let msum = _mm256_add_epi32(lo, hi);
                                let inner = _mm256_fmsub_ps(
                                    f0,
                                    _mm256_cvtepi32_ps(isum[r][c]),
                                    _mm256_mul_ps(f1, _mm256_cvtepi32_ps(msum)),
                                );
                                _mm256_fmadd_ps(da, inner, old)
                            }
                        };
                        facc[r][c] = if partial {
                            // Lanes past the row's last block keep their value.
                            let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
                            let keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(last as i32), lane);
                            _mm256_blendv_ps(old, new, _mm256_castsi256_ps(keep))
                        } else {
                            new
                        };
                    }
                }
            }
            facc
        }
    }

    /// Runs the `R x C` tile at weight rows `t0..t0 + R` (packed at `w`, row
    /// stride `wstride`) and activation rows `i..i + C`, writing the outputs.
    ///
    /// # Safety
    /// As [`tile`]: AVX2, FMA and F16C available, `w` covers `ng` groups of
    /// `R` rows at stride `wstride`, `job.packed` holds activation rows
    /// `i..i + C` (`ng` groups each); and the caller owns those output
    /// elements.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn run_tile<T: MultiRow, const R: usize, const C: usize>(
        job: &QuantJob<'_>,
        w: *const WGroup,
        wstride: usize,
        t0: usize,
        i: usize,
        ng: usize,
        last: usize,
    ) {
        unsafe {
            let mut a = [job.packed.as_ptr(); C];
            for (c, p) in a.iter_mut().enumerate() {
                *p = p.add((i + c) * ng);
            }
            let facc = tile::<T, R, C>(w, wstride, &a, ng, last);
            if R == 4 && C == 2 {
                // All 8 reductions at once; lanes 0..4: rows t0.. of activation
                // row i, lanes 4..8: of row i + 1.
                let mut v = [_mm256_setzero_ps(); 8];
                for (r, row) in facc.iter().enumerate() {
                    for (c, &f) in row.iter().enumerate() {
                        v[2 * r + c] = f;
                    }
                }
                let t = tree8_x8(&v);
                let lo = job.out.slice(i * job.rows + t0, 4);
                _mm_storeu_ps(lo.as_mut_ptr(), _mm256_castps256_ps128(t));
                let hi = job.out.slice((i + 1) * job.rows + t0, 4);
                _mm_storeu_ps(hi.as_mut_ptr(), _mm256_extractf128_ps(t, 1));
                return;
            }
            for (r, row) in facc.iter().enumerate() {
                for (c, &f) in row.iter().enumerate() {
                    job.out.set((i + c) * job.rows + t0 + r, tree8_ps(f));
                }
            }
        }
    }

    /// AVX2: weight rows `r0..r1` x activation rows `i0..i1`. Activation rows
    /// go in chunks that stay in L2; against each chunk, each tile of [`MR`]
    /// weight rows is packed once and run against the chunk `NR` rows at a
    /// time.
    ///
    /// # Safety
    /// AVX2, FMA and F16C available; `job.packed` is `pack_acts::<T>` of the
    /// activations; the caller owns output elements `(i, r)` for `i` in
    /// `i0..i1`, `r` in `r0..r1`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn range_avx2<T: MultiRow>(
        job: &QuantJob<'_>,
        r0: usize,
        r1: usize,
        i0: usize,
        i1: usize,
    ) {
        unsafe {
            let nb = job.cols / 32;
            let ng = nb.div_ceil(8);
            if ng == 0 {
                return;
            }
            let last = nb - 8 * (ng - 1);
            assert!(
                job.packed.len() >= i1 * ng
                    && job.row_bytes == T::row_bytes(nb)
                    && job.data.len() >= r1 * job.row_bytes,
                "multi-row kernel: inconsistent shapes"
            );
            let chunk = act_chunk_rows(ng * std::mem::size_of::<ActGroup>());
            let pack = |row: *const u8, out: *mut WGroup, stride: usize| {
                for g in 0..ng {
                    // `out` holds `ng * stride` groups; the row is whole.
                    T::pack_group(row, g, nb, &mut *out.add(g * stride));
                }
            };
            super::for_each_packed_tile(
                job,
                chunk,
                (r0, r1),
                (i0, i1),
                pack,
                |w, rt, t0, c0, c1| {
                    let mut i = c0;
                    while i < c1 {
                        let ct = (c1 - i).min(NR);
                        if rt == MR && ct == NR {
                            run_tile::<T, MR, NR>(job, w, rt, t0, i, ng, last);
                        } else if rt == MR {
                            for c in 0..ct {
                                run_tile::<T, MR, 1>(job, w, rt, t0, i + c, ng, last);
                            }
                        } else if ct == NR {
                            for r in 0..rt {
                                run_tile::<T, 1, NR>(job, w.add(r), rt, t0 + r, i, ng, last);
                            }
                        } else {
                            for r in 0..rt {
                                for c in 0..ct {
                                    let (t, ic) = (t0 + r, i + c);
                                    run_tile::<T, 1, 1>(job, w.add(r), rt, t, ic, ng, last);
                                }
                            }
                        }
                        i += ct;
                    }
                },
            );
        }
    }
}
