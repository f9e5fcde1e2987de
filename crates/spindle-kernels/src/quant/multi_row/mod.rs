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
use crate::out_ptr::OutPtr;
use crate::simd::tree8;
use std::cell::RefCell;

/// How many tiles ahead the multi-row loops prefetch weight rows: with few
/// activation rows a tile takes ~50 ns, less than a trip to DRAM (the
/// head's 4-row matmul: 6.4 ms one tile ahead, 4.4 ms four ahead).
pub(crate) const TILES_AHEAD: usize = 4;
/// Weight rows per register tile.
pub(crate) const MR: usize = 4;
/// Activation rows per register tile.
pub(crate) const NR: usize = 2;

/// Aim for chunks of packed activation rows of about this many bytes (L2
/// resident while every weight tile of a thread runs against them).
const ACT_CHUNK_BYTES: usize = 160 * 1024;
/// But never fewer rows than this: every chunk streams the whole matrix
/// from memory again and unpacks each of its tiles again, so chunks of a
/// few long rows (8 rows of 14,336 values at 160 KiB) cost more in weight
/// traffic than activations read from L3 instead of L2 do (an 8B model's
/// `ffn_down` at 512 rows: 79-134 GMAC/s in chunks of 8, 223-278 in chunks
/// of 128; docs/PERF.md §51).
const MIN_CHUNK_ROWS: usize = 128;

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
    pub(crate) const ZERO: ActGroup = ActGroup {
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
    /// As [`pack_group`](Self::pack_group), with AVX-512 F/BW/VL available
    /// too (the VNNI kernel's machines).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
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
/// `bytes_per_row` bytes as the kernel reads them: about [`ACT_CHUNK_BYTES`],
/// at least [`MIN_CHUNK_ROWS`].
pub(crate) fn act_chunk_rows(bytes_per_row: usize) -> usize {
    ((ACT_CHUNK_BYTES / bytes_per_row.max(1)) / NR * NR).max(MIN_CHUNK_ROWS)
}

/// Bytes of one packed activation row of `cols` values (AVX2 path).
pub(crate) fn packed_row_bytes(cols: usize) -> usize {
    (cols / 32).div_ceil(8) * std::mem::size_of::<ActGroup>()
}

/// Most cache lines asked for in one burst. A tile of 4 Q6_K rows of 2,048
/// values is 105 lines; asked for all at once as the tile started, a cold
/// 16-row call took 251 us against 227 in bursts (one thread, docs/PERF.md
/// §58), likely more requests than one core keeps in flight.
const LINES_PER_BURST: usize = 32;

/// The weight rows a tile asks for, into L2, a few tiles ahead of their
/// use, in bursts of at most [`LINES_PER_BURST`] lines: the first as the
/// tile starts ([`for_each_tile`] asks for it), the others spread over the
/// tile's compute by its visitor ([`Ahead::rest`]).
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub(crate) struct Ahead<'a> {
    data: &'a [u8],
    start: usize,
    end: usize,
}

#[cfg(target_arch = "x86_64")]
impl Ahead<'_> {
    fn lines(&self) -> usize {
        (self.end - self.start).div_ceil(64)
    }

    fn bursts(&self) -> usize {
        self.lines().div_ceil(LINES_PER_BURST).max(1)
    }

    /// Asks for bursts `b0..b1`.
    #[inline(always)]
    fn ask(&self, b0: usize, b1: usize) {
        let (lines, bursts) = (self.lines(), self.bursts());
        let line = |b: usize| self.start + 64 * (b * lines / bursts);
        crate::quant::prefetch_range_l2(self.data, line(b0), line(b1).min(self.end));
    }

    /// The first burst (the whole tile ahead when it fits one).
    #[inline(always)]
    fn first(&self) {
        self.ask(0, 1)
    }

    /// Step `k` of `steps` of the tile's compute: its share of the bursts
    /// after the first (all of them when `steps` is 1).
    #[inline(always)]
    pub(crate) fn rest(&self, k: usize, steps: usize) {
        let (more, steps) = (self.bursts() - 1, steps.max(1));
        if more > 0 && k < steps {
            self.ask(1 + k * more / steps, 1 + (k + 1) * more / steps);
        }
    }
}

/// The loop every SIMD multi-row path shares: activation rows `i0..i1` in
/// chunks of `chunk` rows; against each chunk, weight rows `r0..r1` in tiles
/// of up to [`MR`]: `visit(data, t0, rt, c0, c1, ahead)` for tile rows `t0..t0 +
/// rt` of `data` (the matrix's rows up to `r1`) and activation rows
/// `c0..c1`; the rows a few tiles ahead are asked for, into L2, the
/// first burst before the visit and the rest by the visitor as it runs.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn for_each_tile(
    job: &QuantJob<'_>,
    chunk: usize,
    (r0, r1): (usize, usize),
    (i0, i1): (usize, usize),
    mut visit: impl FnMut(&[u8], usize, usize, usize, usize, Ahead<'_>),
) {
    let data = &job.data[..r1 * job.row_bytes];
    let mut c0 = i0;
    while c0 < i1 {
        let c1 = (c0 + chunk).min(i1);
        let mut t0 = r0;
        while t0 < r1 {
            let rt = (r1 - t0).min(MR);
            // The tile `TILES_AHEAD` on, if the range has all of it.
            let start = (t0 + TILES_AHEAD * MR) * job.row_bytes;
            let end = (t0 + (TILES_AHEAD + 1) * MR) * job.row_bytes;
            let (start, end) = if end <= data.len() {
                (start, end)
            } else {
                (0, 0)
            };
            let ahead = Ahead { data, start, end };
            ahead.first();
            visit(data, t0, rt, c0, c1, ahead);
            t0 += rt;
        }
        c0 = c1;
    }
}

/// [`for_each_tile`] with each tile packed once into this thread's buffer
/// by `pack(row, out, rt)` (group `g` of the tile's row `r` at `out + r + g
/// * rt`), then `run(tile, rt, t0, c0, c1, ahead)`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn for_each_packed_tile(
    job: &QuantJob<'_>,
    chunk: usize,
    rows: (usize, usize),
    acts: (usize, usize),
    pack: impl Fn(*const u8, *mut WGroup, usize),
    mut run: impl FnMut(*const WGroup, usize, usize, usize, usize, Ahead<'_>),
) {
    let ng = (job.cols / 32).div_ceil(8);
    with_buffer(&WTILE, MR * ng, WGroup::ZERO, |buf| {
        for_each_tile(job, chunk, rows, acts, |data, t0, rt, c0, c1, ahead| {
            for r in 0..rt {
                let row = data[(t0 + r) * job.row_bytes..].as_ptr();
                // The buffer holds MR * ng groups: room for rt * ng.
                pack(row, buf[r..].as_mut_ptr(), rt);
            }
            run(buf.as_ptr(), rt, t0, c0, c1, ahead);
        });
    });
}

#[cfg(target_arch = "x86_64")]
pub(crate) use avx2::{pack_act_group, pack_acts, range_avx2, store_group, store_vertical};

#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
pub(crate) use amx::{amx_chunk_row_bytes, pack_acts_amx, range_amx, AMX_TILE_ROWS};
#[cfg(target_arch = "x86_64")]
mod vnni;
#[cfg(target_arch = "x86_64")]
pub(crate) use vnni::{
    pack_acts_vnni, range_vnni, range_vnni_q8_0_in_place, range_vnni_vertical, store_vertical_512,
};

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
mod avx2;
