//! The AVX-512 VNNI multi-row micro-kernel.
//!
//! Weights use the AVX2 packing ([`WGroup`]): step `k` of a group holds
//! values `4k..4k+4` of block `j` in 32-bit lane `j`, which is exactly the
//! operand shape of `vpdpbusd` (four u8 x i8 products summed into each int32
//! lane). Activations are packed two rows at a time ([`ActPair`]): step `k`
//! of rows `c` and `c + 1` side by side in one 512-bit vector. A weight step
//! broadcast to both halves and dotted with it gives the 8 block dots of
//! both (weight row, activation row) pairs at once, so the integer sums need
//! no reduction and the float fold runs on full registers.
//!
//! There is no int16 stage, so no saturation to steer around: signed weight
//! types (Q8_0, Q6_K) are dotted as `u = s + 128`, and the offset times the
//! activations' sum is taken off by starting the accumulators at its
//! negation, as for the offset types (Q4_0, Q5_0).
//!
//! # Bit-identical to the other paths
//!
//! The integer block dots are exact, and each is folded into lane `b % 8` by
//! the same float operations as on the AVX2 path (`fold_scaled`,
//! `fold_scaled_min`, in block order), two (weight row, activation row)
//! pairs per 512-bit register; the lanes are reduced with the same
//! `tree8_x8`.

use super::avx2::{pack_act_group, tree8_x8};
use super::{act_chunk_rows, ActGroup, Fold, MultiRow, QuantJob, WGroup, MR};
use crate::quant::q8_0::Q8_0;
use crate::quant::q8_act::{ActRow, QuantizedActs};
use crate::quant::vertical::simd::{unpack_group, VerticalType};
use std::arch::x86_64::*;
use std::ptr::addr_of;

/// One group (8 blocks) of two activation rows, interleaved for the VNNI
/// kernel. Lanes `0..8` of each 16-lane array belong to the first row,
/// `8..16` to the second.
#[repr(C, align(32))]
#[derive(Clone, Copy)]
struct ActPair {
    /// Step `k` of the first row at bytes `64k..64k + 32`, of the second at
    /// `64k + 32..64k + 64`.
    qs: [i8; 512],
    /// Block scales.
    d: [f32; 16],
    /// `Block32`: `-offset * bsum`, where the kernel's integer sum of block
    /// `j` sits (lane `j`; lane `2j` in the half layout, the odd lanes 0).
    init: [i32; 16],
    /// `KMin`: the block sums as f32.
    asum: [f32; 16],
    /// `Q6`: `-128 *` the half sums of values 0..16 (`[0]`) and 16..32.
    hinit: [[i32; 16]; 2],
}

// The pairs are stored in the `Vec<ActGroup>` that `matmul` keeps per
// thread, as many groups as cover their bytes.
const _: () = assert!(std::mem::align_of::<ActPair>() <= std::mem::align_of::<ActGroup>());

/// `ActGroup`s that hold `pairs` pairs.
fn room(pairs: usize) -> usize {
    (pairs * std::mem::size_of::<ActPair>()).div_ceil(std::mem::size_of::<ActGroup>())
}

/// `offset` times the sums of values 0..16 and 16..32 of the blocks of
/// group `g` of `a` (zero past the row's end).
fn half_sums(a: ActRow<'_>, g: usize, offset: i32) -> [[i32; 8]; 2] {
    let nb = a.qs.len() / 32;
    let mut out = [[0; 8]; 2];
    for j in 0..8 {
        let b = 8 * g + j;
        if b < nb {
            for (h, o) in out.iter_mut().enumerate() {
                let half = &a.qs[32 * b + 16 * h..32 * b + 16 * h + 16];
                o[j] = offset * half.iter().map(|&q| q as i32).sum::<i32>();
            }
        }
    }
    out
}

/// The offset that makes a type's packed values unsigned for `vpdpbusd`:
/// signed types are stored as `s + 128`; the others already are `value +
/// OFFSET`.
const fn offset<T: MultiRow>() -> i32 {
    if T::SIGNED {
        128
    } else {
        T::OFFSET
    }
}

/// Packs every activation row for the VNNI kernels of `T`: pair `p` (rows
/// `2p`, `2p + 1`; a missing last row is zero) group `g` is `ActPair` number
/// `p * ng + g` of `out`.
///
/// # Safety
/// AVX2, FMA, F16C and AVX-512 F/BW/VL/VNNI available.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::needless_range_loop)]
pub(crate) unsafe fn pack_acts_vnni<T: MultiRow>(acts: &QuantizedActs, out: &mut Vec<ActGroup>) {
    unsafe {
        let nb = acts.cols() / 32;
        let ng = nb.div_ceil(8);
        let pairs = acts.n().div_ceil(2);
        // Every byte of every pair is written below: only growth is zeroed
        // (clearing first zeroed the whole buffer, ~1% of a 16-row pass).
        out.resize(room(pairs * ng), ActGroup::ZERO);
        let dst = out.as_mut_ptr().cast::<ActPair>();
        let mut one = ActGroup::ZERO;
        for p in 0..pairs {
            for g in 0..ng {
                // `out` has room for `pairs * ng` pairs (and their alignment,
                // asserted above).
                let o = &mut *dst.add(p * ng + g);
                let half = nb - 8 * g <= 4;
                for s in 0..2 {
                    let mut hsum = [[0; 8]; 2];
                    match acts.row(2 * p + s) {
                        // Corrections negated: they start the accumulators.
                        Some(a) => {
                            pack_act_group(a, g, -offset::<T>(), &mut one);
                            if matches!(T::FOLD, Fold::Q6) {
                                hsum = half_sums(a, g, -offset::<T>());
                            }
                        }
                        None => one = ActGroup::ZERO,
                    }
                    for k in 0..8 {
                        o.qs[64 * k + 32 * s..64 * k + 32 * s + 32]
                            .copy_from_slice(&one.qs[32 * k..32 * k + 32]);
                    }
                    for j in 0..8 {
                        let l = 8 * s + j;
                        o.d[l] = one.d[j];
                        o.asum[l] = one.asum[j];
                        o.hinit[0][l] = hsum[0][j];
                        o.hinit[1][l] = hsum[1][j];
                        o.init[l] = 0;
                    }
                    for j in 0..8 {
                        let lane = if half { 2 * j } else { j };
                        if lane < 8 {
                            o.init[8 * s + lane] = one.corr[j];
                        }
                    }
                }
            }
        }
    }
}

/// Packs weight row `row` into groups `out[g * stride]` for the VNNI
/// kernel: the AVX2 packing, with signed values turned into `s + 128`.
///
/// # Safety
/// AVX2, FMA, F16C and AVX-512 F/BW/VL/VNNI available; `row` covers `nb`
/// blocks (a whole row) and `out` holds `ng * stride` groups.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn pack_row<T: MultiRow>(row: *const u8, nb: usize, out: *mut WGroup, stride: usize) {
    unsafe {
        for g in 0..nb.div_ceil(8) {
            let wg = &mut *out.add(g * stride);
            T::pack_group_unsigned(row, g, nb, wg);
        }
    }
}

/// Stores a full group's 8 block vectors vertically at `dst` (step `k` at
/// `dst + 32k`, its 32-bit lane `j` = dword `k` of block `j`): the bytes
/// [`super::store_vertical`] stores, by two rounds of `vpermt2d` over
/// block pairs instead of 24 AVX2 shuffles.
///
/// # Safety
/// AVX-512 F available; `dst..dst + 256` writable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn store_vertical_512(v: &[__m256i; 8], dst: *mut u8) {
    unsafe {
        // z[p] = blocks 2p (dwords 0..8) and 2p + 1 (8..16).
        let z = [0, 1, 2, 3]
            .map(|p| _mm512_inserti64x4(_mm512_castsi256_si512(v[2 * p]), v[2 * p + 1], 1));
        // Dword k of blocks 0..4 (of 4..8 from z[2], z[3]), for k in 0..4
        // (`lo`) and 4..8 (`hi`): [b0k b1k b2k b3k] for each k in turn.
        let lo = _mm512_setr_epi32(0, 8, 16, 24, 1, 9, 17, 25, 2, 10, 18, 26, 3, 11, 19, 27);
        let hi = _mm512_setr_epi32(4, 12, 20, 28, 5, 13, 21, 29, 6, 14, 22, 30, 7, 15, 23, 31);
        let t = [
            _mm512_permutex2var_epi32(z[0], lo, z[1]),
            _mm512_permutex2var_epi32(z[0], hi, z[1]),
            _mm512_permutex2var_epi32(z[2], lo, z[3]),
            _mm512_permutex2var_epi32(z[2], hi, z[3]),
        ];
        // Steps k, k + 1: the first 4 blocks from t[0 or 1], the last 4
        // from t[2 or 3].
        let even = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
        let odd = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
        let steps = [
            _mm512_permutex2var_epi32(t[0], even, t[2]),
            _mm512_permutex2var_epi32(t[0], odd, t[2]),
            _mm512_permutex2var_epi32(t[1], even, t[3]),
            _mm512_permutex2var_epi32(t[1], odd, t[3]),
        ];
        for (i, s) in steps.iter().enumerate() {
            _mm512_storeu_si512(dst.add(64 * i).cast(), *s);
        }
    }
}

/// Where a register tile reads its weight rows' groups: packed per call
/// ([`Packed`]) or straight from a matrix in the vertical layout
/// ([`InPlace`]).
trait WeightTile: Copy {
    /// Step `k` (32 bytes) of group `g` of tile row `r`; `half`: the row's
    /// last group, in the half layout.
    ///
    /// # Safety
    /// Row `r` and group `g` exist.
    unsafe fn step(self, r: usize, g: usize, half: bool, k: usize) -> *const u8;
    /// `f0` of group `g` of row `r` in both halves of a register.
    ///
    /// # Safety
    /// As [`WeightTile::step`]; AVX-512F available.
    unsafe fn f0(self, r: usize, g: usize, half: bool) -> __m512;
    /// `f1` (`KMin` types) of group `g` of row `r`, twice.
    ///
    /// # Safety
    /// As [`WeightTile::f0`].
    unsafe fn f1(self, r: usize, g: usize) -> __m512;
    /// The 32 bytes of `sc[h]` (`Q6`) of group `g` of row `r`.
    ///
    /// # Safety
    /// As [`WeightTile::step`].
    unsafe fn sc(self, r: usize, g: usize, h: usize) -> *const u8;
    /// The tile of rows from row `r` on.
    fn skip_rows(self, r: usize) -> Self;
}

/// Groups packed per call: group `g` of row `r` at `w + g * stride + r`.
#[derive(Clone, Copy)]
struct Packed {
    w: *const WGroup,
    stride: usize,
}

impl WeightTile for Packed {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn step(self, r: usize, g: usize, _half: bool, k: usize) -> *const u8 {
        unsafe {
            addr_of!((*self.w.add(g * self.stride + r)).u)
                .cast::<u8>()
                .add(32 * k)
        }
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn f0(self, r: usize, g: usize, _half: bool) -> __m512 {
        unsafe { twice_ps(addr_of!((*self.w.add(g * self.stride + r)).f0).cast()) }
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn f1(self, r: usize, g: usize) -> __m512 {
        unsafe { twice_ps(addr_of!((*self.w.add(g * self.stride + r)).f1).cast()) }
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn sc(self, r: usize, g: usize, h: usize) -> *const u8 {
        unsafe { addr_of!((*self.w.add(g * self.stride + r)).sc[h]).cast() }
    }
    fn skip_rows(self, r: usize) -> Self {
        Packed {
            w: self.w.wrapping_add(r),
            ..self
        }
    }
}

/// Q8_0 rows in the vertical layout, read where they lie: a group of `m`
/// blocks is its `m` f16 scales, then its byte plane, which is already
/// [`WGroup::u`] (`s + 128`, step order). Row `r` at `row + r * row_bytes`.
#[derive(Clone, Copy)]
struct InPlace {
    row: *const u8,
    row_bytes: usize,
}

impl InPlace {
    /// Group `g` of row `r` (every group before the last is a full one).
    #[inline(always)]
    unsafe fn group(self, r: usize, g: usize) -> *const u8 {
        unsafe { self.row.add(r * self.row_bytes + g * 8 * 34) }
    }
}

impl WeightTile for InPlace {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn step(self, r: usize, g: usize, half: bool, k: usize) -> *const u8 {
        unsafe {
            let m = if half { 4 } else { 8 };
            self.group(r, g).add(2 * m + 32 * k)
        }
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn f0(self, r: usize, g: usize, half: bool) -> __m512 {
        unsafe {
            let p = self.group(r, g);
            // As `block32_scales`: a half group's last 4 scales are 0.
            let h = if half {
                _mm_loadl_epi64(p.cast())
            } else {
                _mm_loadu_si128(p.cast())
            };
            let f = _mm256_cvtph_ps(h);
            _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(f)))
        }
    }
    // Only Q8_0 (a `Block32` fold) reads in place: these are never asked.
    unsafe fn f1(self, _r: usize, _g: usize) -> __m512 {
        unreachable!("Q8_0 has no mins")
    }
    unsafe fn sc(self, _r: usize, _g: usize, _h: usize) -> *const u8 {
        unreachable!("Q8_0 has no sub-block scales")
    }
    fn skip_rows(self, r: usize) -> Self {
        InPlace {
            row: self.row.wrapping_add(r * self.row_bytes),
            ..self
        }
    }
}

/// Activation rows per register tile: two pairs.
const NC: usize = 6;

/// The 8 floats at `p` in both halves of a 512-bit register.
///
/// # Safety
/// AVX-512F available; `p..p + 8` readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn twice_ps(p: *const f32) -> __m512 {
    unsafe { _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_loadu_pd(p.cast()))) }
}

/// The 32 bytes at `p` in both halves of a 512-bit register.
///
/// # Safety
/// AVX-512F available; `p..p + 32` readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn twice_si(p: *const u8) -> __m512i {
    unsafe { _mm512_broadcast_i64x4(_mm256_loadu_si256(p.cast())) }
}

/// The `R x 2P` tile of dots of packed weight rows (group `g` of row `r` at
/// `w + g * wstride + r`) with activation pairs `a[p]` (group `g` at `a[p] +
/// g`), over `ng` groups whose last has `last` valid blocks. Result `[r][p]`
/// holds the 8 float lanes of pair `p`'s first row (low half) and second
/// (high half), to be reduced with `tree8`.
///
/// # Safety
/// AVX2, FMA, F16C and AVX-512 F/BW/VL/VNNI available; the pointers cover
/// `ng` groups.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
// Indexed loops over the register tile read as the tile's coordinates.
#[allow(clippy::needless_range_loop)]
unsafe fn tile<T: MultiRow, S: WeightTile, const R: usize, const P: usize>(
    w: S,
    a: &[*const ActPair; P],
    ng: usize,
    last: usize,
) -> [[__m512; P]; R] {
    unsafe {
        let q6 = matches!(T::FOLD, Fold::Q6);
        let mut facc = [[_mm512_setzero_ps(); P]; R];
        for g in 0..ng {
            let mut ag = *a;
            for p in ag.iter_mut() {
                *p = p.add(g);
            }
            let partial = g + 1 == ng && last < 8;
            let half_layout = partial && last <= 4;
            let nsteps = if half_layout { 4 } else { 8 };
            // Accumulators start at the offset corrections. Q6_K (always a
            // full group) keeps values 0..16 (steps 0..4) and 16..32 apart.
            let mut acc = [[[_mm512_setzero_si512(); P]; R]; 2];
            for p in 0..P {
                let init = match T::FOLD {
                    Fold::Block32 if offset::<T>() != 0 => {
                        _mm512_loadu_si512(addr_of!((*ag[p]).init).cast())
                    }
                    _ => _mm512_setzero_si512(),
                };
                for r in 0..R {
                    acc[0][r][p] = init;
                }
                if q6 {
                    for h in 0..2 {
                        let init = _mm512_loadu_si512(addr_of!((*ag[p]).hinit[h]).cast());
                        for r in 0..R {
                            acc[h][r][p] = init;
                        }
                    }
                }
            }
            for k in 0..nsteps {
                let h = if q6 { k / 4 } else { 0 };
                let mut av = [_mm512_setzero_si512(); P];
                for (p, v) in av.iter_mut().enumerate() {
                    *v = _mm512_loadu_si512(addr_of!((*ag[p]).qs).cast::<u8>().add(64 * k).cast());
                }
                for r in 0..R {
                    let wv = twice_si(w.step(r, g, half_layout, k));
                    for p in 0..P {
                        acc[h][r][p] = _mm512_dpbusd_epi32(acc[h][r][p], wv, av[p]);
                    }
                }
            }
            let mut da = [_mm512_setzero_ps(); P];
            let mut asum = [_mm512_setzero_ps(); P];
            for p in 0..P {
                da[p] = _mm512_loadu_ps(addr_of!((*ag[p]).d).cast());
                if matches!(T::FOLD, Fold::KMin) {
                    asum[p] = _mm512_loadu_ps(addr_of!((*ag[p]).asum).cast());
                }
            }
            for r in 0..R {
                let f0 = w.f0(r, g, half_layout);
                for p in 0..P {
                    let mut isum = acc[0][r][p];
                    if half_layout {
                        // Each block's two partial sums (64-bit lane j) to lane j.
                        let pairs =
                            _mm512_add_epi32(isum, _mm512_shuffle_epi32(isum, 0b10_11_00_01));
                        let idx =
                            _mm512_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6, 8, 10, 12, 14, 8, 10, 12, 14);
                        isum = _mm512_permutexvar_epi32(idx, pairs);
                    }
                    let old = facc[r][p];
                    let new = match T::FOLD {
                        // fma(dw * da, isum, lane), as `fold_scaled`.
                        Fold::Block32 => {
                            _mm512_fmadd_ps(_mm512_mul_ps(f0, da[p]), _mm512_cvtepi32_ps(isum), old)
                        }
                        Fold::KMin => {
                            // As `fold_scaled_min`.
                            let f1 = w.f1(r, g);
                            let inner = _mm512_fmsub_ps(
                                f0,
                                _mm512_cvtepi32_ps(isum),
                                _mm512_mul_ps(f1, asum[p]),
                            );
                            _mm512_fmadd_ps(da[p], inner, old)
                        }
                        Fold::Q6 => {
                            // scale_lo * dot_lo + scale_hi * dot_hi.
                            let mut dot = _mm512_setzero_si512();
                            for h in 0..2 {
                                // Lane j's int16 pair both hold block j's scale:
                                // the high one, sign-extended, is the scale.
                                let sc = _mm512_srai_epi32(twice_si(w.sc(r, g, h)), 16);
                                dot = _mm512_add_epi32(dot, _mm512_mullo_epi32(sc, acc[h][r][p]));
                            }
                            _mm512_fmadd_ps(_mm512_mul_ps(f0, da[p]), _mm512_cvtepi32_ps(dot), old)
                        }
                        // `matmul::kernel_for` runs Q2-fold types on the AVX2
                        // multi-row kernel on this ISA too.
                        Fold::Q2 => unreachable!("no VNNI multi-row kernel for Q2 folds"),
                    };
                    facc[r][p] = if partial {
                        // Lanes past the row's last block keep their value.
                        let keep = (((1u32 << last) - 1) * 0x0101) as __mmask16;
                        _mm512_mask_blend_ps(keep, old, new)
                    } else {
                        new
                    };
                }
            }
        }
        facc
    }
}

/// Runs the `R x 2P` tile at weight rows `t0..t0 + R` and activation rows
/// `i..i + 2P` (`i` even), writing the outputs of the first `cw` activation
/// rows.
///
/// # Safety
/// As [`tile`]; `job.packed` holds the pairs of activation rows `i..i + cw`
/// as `pack_acts_vnni` packs them; the caller owns those output elements.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments)]
unsafe fn run_tile<T: MultiRow, S: WeightTile, const R: usize, const P: usize>(
    job: &QuantJob<'_>,
    w: S,
    t0: usize,
    i: usize,
    cw: usize,
    ng: usize,
    last: usize,
) {
    unsafe {
        let pairs = job.packed.as_ptr().cast::<ActPair>();
        let mut a = [pairs; P];
        for (p, ptr) in a.iter_mut().enumerate() {
            // A pair past the rows asked for repeats the last one (its
            // results are dropped).
            *ptr = pairs.add((i / 2 + p.min((cw - 1) / 2)) * ng);
        }
        let facc = tile::<T, S, R, P>(w, &a, ng, last);
        if R == MR {
            // A full tile: pair `p`'s 8 lane sets (weight row `r`, first and
            // second activation row) through one `tree8_x8`, whose low 4
            // lanes are then the first row's outputs of the tile's 4
            // consecutive weight rows and the high 4 the second row's: two
            // 4-float stores.
            for (p, _) in a.iter().enumerate() {
                let c = 2 * p;
                if c >= cw {
                    break;
                }
                let mut v = [_mm256_setzero_ps(); 8];
                for (r, row) in facc.iter().enumerate() {
                    let f = row[p];
                    v[2 * r] = _mm512_castps512_ps256(f);
                    v[2 * r + 1] = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f), 1));
                }
                let t = tree8_x8(&v);
                store4(job, (i + c) * job.rows + t0, _mm256_castps256_ps128(t));
                if c + 1 < cw {
                    store4(
                        job,
                        (i + c + 1) * job.rows + t0,
                        _mm256_extractf128_ps(t, 1),
                    );
                }
            }
            return;
        }
        // A short tile: 8 lane sets at a time through `tree8_x8`.
        let mut v = [_mm256_setzero_ps(); 8];
        let mut who = [(0usize, 0usize); 8];
        let mut n = 0;
        for (r, row) in facc.iter().enumerate() {
            for (p, &f) in row.iter().enumerate() {
                for (s, half) in [
                    _mm512_castps512_ps256(f),
                    _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f), 1)),
                ]
                .into_iter()
                .enumerate()
                {
                    v[n] = half;
                    who[n] = (r, 2 * p + s);
                    n += 1;
                    if n == 8 {
                        flush(job, &v, &who, 8, t0, i, cw);
                        n = 0;
                    }
                }
            }
        }
        if n > 0 {
            flush(job, &v, &who, n, t0, i, cw);
        }
    }
}
/// Writes the 4 outputs `out[o..o + 4]`.
///
/// # Safety
/// AVX available; the caller owns those output elements.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn store4(job: &QuantJob<'_>, o: usize, v: __m128) {
    unsafe {
        // SAFETY (of the slice): the caller owns these outputs; the slice
        // is checked against the buffer's bounds and dropped at once.
        let dst = job.out.slice(o, 4);
        _mm_storeu_ps(dst.as_mut_ptr(), v);
    }
}

/// Reduces the first `n` lane sets of `v` (for (weight row, activation row)
/// `who[j]` of the tile) and writes them.
///
/// # Safety
/// AVX2 available; the caller owns the outputs named by `who`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn flush(
    job: &QuantJob<'_>,
    v: &[__m256; 8],
    who: &[(usize, usize); 8],
    n: usize,
    t0: usize,
    i: usize,
    cw: usize,
) {
    unsafe {
        let mut t = [0.0f32; 8];
        _mm256_storeu_ps(t.as_mut_ptr(), tree8_x8(v));
        for (j, &(r, c)) in who.iter().enumerate().take(n) {
            if c < cw {
                // tree8_x8's lane for input j.
                let lane = [0, 4, 1, 5, 2, 6, 3, 7][j];
                job.out.set((i + c) * job.rows + t0 + r, t[lane]);
            }
        }
    }
}

/// Runs tile rows `t0..t0 + rt` (their groups from `w`) against
/// activation rows `i..i + ct` (`ct <= 2P`): as one `MR`-row tile, or row by
/// row when the tile is short.
///
/// # Safety
/// As [`run_tile`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments)]
unsafe fn run_rows<T: MultiRow, S: WeightTile, const P: usize>(
    job: &QuantJob<'_>,
    w: S,
    rt: usize,
    t0: usize,
    i: usize,
    ct: usize,
    ng: usize,
    last: usize,
) {
    unsafe {
        if rt == MR {
            run_tile::<T, S, MR, P>(job, w, t0, i, ct, ng, last);
        } else {
            for r in 0..rt {
                run_tile::<T, S, 1, P>(job, w.skip_rows(r), t0 + r, i, ct, ng, last);
            }
        }
    }
}

/// VNNI: weight rows `r0..r1` x activation rows `i0..i1`, in L2-sized chunks
/// of activation rows; against each, each tile of [`MR`] weight rows is
/// packed once and run against the chunk [`NC`] rows at a time.
///
/// # Safety
/// AVX2, FMA, F16C and AVX-512 F/BW/VL/VNNI available; `job.packed` is
/// `pack_acts_vnni::<T>` of the activations; `i0` is even; the caller owns output elements
/// `(i, r)` for `i` in `i0..i1`, `r` in `r0..r1`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn range_vnni<T: MultiRow>(
    job: &QuantJob<'_>,
    r0: usize,
    r1: usize,
    i0: usize,
    i1: usize,
) {
    unsafe {
        let nb = job.cols / 32;
        range_with::<T>(job, (r0, r1), (i0, i1), |row, out, stride| {
            // The driver passes a whole row and room for its groups.
            pack_row::<T>(row, nb, out, stride)
        })
    }
}

/// [`range_vnni`] for weights in the vertical layout
/// ([`crate::quant::vertical`]): each tile's groups are unpacked from it,
/// not packed from GGUF order.
///
/// # Safety
/// As [`range_vnni`]; `job.data` holds vertical rows.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn range_vnni_vertical<T: VerticalType>(
    job: &QuantJob<'_>,
    r0: usize,
    r1: usize,
    i0: usize,
    i1: usize,
) {
    unsafe {
        let nb = job.cols / 32;
        range_with::<T>(job, (r0, r1), (i0, i1), |row, out, stride| {
            for g in 0..nb.div_ceil(8) {
                // The driver passes a whole row and room for its groups.
                unpack_group::<T>(row, g, nb, &mut *out.add(g * stride));
            }
        })
    }
}

/// Runs tile rows `t0..t0 + rt` (from `w`) against activation rows
/// `c0..c1`, at most `nc` at a time.
///
/// # Safety
/// As [`run_rows`] for each slice of activation rows.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn run_chunk<T: MultiRow, S: WeightTile>(
    job: &QuantJob<'_>,
    w: S,
    (rt, t0): (usize, usize),
    (c0, c1): (usize, usize),
    nc: usize,
    (ng, last): (usize, usize),
    ahead: super::Ahead<'_>,
) {
    unsafe {
        let slices = (c1 - c0).div_ceil(nc);
        let mut i = c0;
        while i < c1 {
            ahead.rest((i - c0) / nc, slices);
            let ct = (c1 - i).min(nc);
            match ct {
                5.. => run_rows::<T, S, 3>(job, w, rt, t0, i, ct, ng, last),
                3 | 4 => run_rows::<T, S, 2>(job, w, rt, t0, i, ct, ng, last),
                _ => run_rows::<T, S, 1>(job, w, rt, t0, i, ct, ng, last),
            }
            i += ct;
        }
    }
}

/// [`range_vnni_vertical`] for Q8_0: its vertical groups are already the
/// kernel's operands, so the tiles read the matrix where it lies and
/// nothing is copied (the output head: 262,144 rows of 640).
///
/// # Safety
/// As [`range_vnni_vertical`] for Q8_0.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn range_vnni_q8_0_in_place(
    job: &QuantJob<'_>,
    r0: usize,
    r1: usize,
    i0: usize,
    i1: usize,
) {
    unsafe {
        let Some((ng, last, chunk)) = shape::<Q8_0>(job, r1, i0, i1) else {
            return;
        };
        super::for_each_tile(
            job,
            chunk,
            (r0, r1),
            (i0, i1),
            |data, t0, rt, c0, c1, ahead| {
                let w = InPlace {
                    row: data[t0 * job.row_bytes..].as_ptr(),
                    row_bytes: job.row_bytes,
                };
                run_chunk::<Q8_0, InPlace>(job, w, (rt, t0), (c0, c1), NC, (ng, last), ahead);
            },
        );
    }
}

/// A matmul job's groups per row, blocks in the last group and chunk of
/// activation rows, after checking its shapes; `None` for empty rows.
///
/// # Panics
/// If the job's buffers do not hold what `T`'s kernel reads.
#[inline]
fn shape<T: MultiRow>(
    job: &QuantJob<'_>,
    r1: usize,
    i0: usize,
    i1: usize,
) -> Option<(usize, usize, usize)> {
    let nb = job.cols / 32;
    let ng = nb.div_ceil(8);
    if ng == 0 {
        return None;
    }
    assert!(
        job.packed.len() >= room(i1.div_ceil(2) * ng)
            && job.row_bytes == T::row_bytes(nb)
            && job.data.len() >= r1 * job.row_bytes,
        "multi-row kernel: inconsistent shapes"
    );
    let chunk = act_chunk_rows(ng * std::mem::size_of::<ActGroup>());
    debug_assert!(
        i0.is_multiple_of(2) && chunk.is_multiple_of(2),
        "activation pairs split"
    );
    Some((ng, nb - 8 * (ng - 1), chunk))
}

/// The VNNI multi-row loop with `pack(row, out, stride)` filling a weight
/// row's groups (`out[g * stride]`).
///
/// # Safety
/// As [`range_vnni`], with `pack` filling groups as `pack_row::<T>` does.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn range_with<T: MultiRow>(
    job: &QuantJob<'_>,
    (r0, r1): (usize, usize),
    (i0, i1): (usize, usize),
    pack: impl Fn(*const u8, *mut WGroup, usize),
) {
    unsafe {
        let Some((ng, last, chunk)) = shape::<T>(job, r1, i0, i1) else {
            return;
        };
        let nc = if matches!(T::FOLD, Fold::Q6) { 4 } else { NC };
        super::for_each_packed_tile(
            job,
            chunk,
            (r0, r1),
            (i0, i1),
            pack,
            |w, rt, t0, c0, c1, ahead| {
                let w = Packed { w, stride: rt };
                run_chunk::<T, Packed>(job, w, (rt, t0), (c0, c1), nc, (ng, last), ahead);
            },
        );
    }
}
