// One file (over 1,200 lines) on purpose: the AMX tile configuration, the
// packing of weights and activations into tile order, the tile loop and the
// fold of its int32 sums into the lanes that every other path folds are one
// contract (the results must be the VNNI path's bits), and they are only
// testable together on a machine with the tile unit.

//! The AMX multi-row micro-kernel, for matrices in the vertical layout
//! ([`crate::quant::vertical`]) on CPUs with the tile unit ([`crate::amx`]).
//!
//! A tile of 16 weight rows is decoded once per chunk of activation rows:
//! each 32-value block becomes one B tile of signed bytes (`b[k / 4][row][k
//! % 4]`, 512 bytes), and its scale terms 16-lane vectors over the rows.
//! Activation rows are the A tiles, read where the quantizer left them
//! (row-major int8, `cols` bytes apart), so nothing is packed per call but
//! the last, short tile of a chunk (copied into a zeroed 16-row buffer). One
//! `tdpbssd` per block gives the exact int32 dots of 16 activation rows x 16
//! weight rows (Q6_K: two, one per 16-value half, whose scales differ),
//! stored and folded into zmm lanes over the weight rows.
//!
//! # Bit-identical to the other paths
//!
//! Output `(i, r)` is, on every path, block `b`'s exact integer dot folded
//! into lane `b % 8` with its type's float operations ([`Fold`]), the blocks
//! of a lane in order, then the 8 lanes reduced with `tree8`. Here the lanes
//! are computed one after another (blocks `l, l + 8, ...` of lane `l`), so
//! one lane's accumulators per activation row stay in registers; each fold
//! is the same operation as the scalar one, on 16 weight rows at once, and
//! `tree8` is applied lane-wise across the 8 lane vectors. The integer dots
//! are exact whatever the order of their products.

use super::{ActGroup, Fold, QuantJob, WGroup};
use crate::amx::{self, TileConfig};
use crate::out_ptr::OutPtr;
#[cfg(test)]
use crate::quant::vertical::simd::unpack_group_adding;
use crate::quant::vertical::simd::VerticalType;
use std::arch::x86_64::*;
use std::cell::RefCell;

/// Weight rows per tile (the B tiles' columns).
const TN: usize = 16;
/// Activation rows per tile (the A tiles' rows).
const TM: usize = 16;
/// Rows of either side per tile: the work split cuts both at multiples.
pub(crate) const AMX_TILE_ROWS: usize = 16;
const _: () = assert!(TN == AMX_TILE_ROWS && TM == AMX_TILE_ROWS);

/// Aim for chunks of activation rows of about this many bytes (L2 resident
/// while every weight tile of a work item runs against them). A weight
/// tile is decoded once per chunk, so the larger the fewer decodes; the A
/// tiles read the quantized rows as they are, 1 byte per value.
const ACT_CHUNK_BYTES: usize = 640 * 1024;

/// Bytes of an activation row of `cols` values as the work split counts
/// them (`matmul`'s chunks of about 160 KiB): a quarter of the row, so the
/// split's chunks come out [`ACT_CHUNK_BYTES`] of int8 rows.
pub(crate) fn amx_chunk_row_bytes(cols: usize) -> usize {
    (cols * 160 * 1024 / ACT_CHUNK_BYTES).max(1)
}

/// One block of a weight tile as the tile unit reads it: row `k / 4` (0..8)
/// holds, for each of the 16 weight rows `n`, values `k..k + 4` at bytes
/// `64 (k / 4) + 4n`.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct BTile([i8; 512]);

/// A float per weight row of a tile.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Rows16([f32; TN]);

/// An int32 per weight row of a tile.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct IRows16([i32; TN]);

/// A weight tile decoded for the tile unit: per block `b`, its B tile and
/// the terms of its fold for each of the 16 rows (rows past the matrix are
/// zero, and their outputs are not written).
struct Decoded16 {
    b: Vec<BTile>,
    /// `Block32`: `dw`; `KMin`: `d * scale`; `Q6`: `d`.
    f0: Vec<Rows16>,
    /// `KMin`: `dmin * min`.
    f1: Vec<Rows16>,
    /// `Q6`: the scales of values 0..16 (`[2b]`) and 16..32 (`[2b + 1]`).
    sc: Vec<IRows16>,
    /// The blocks lane by lane, lanes in [`LANE_ORDER`]: `0, 8, 16, ...,
    /// 4, 12, ...`.
    order: Vec<u32>,
}

impl Decoded16 {
    const fn new() -> Self {
        Decoded16 {
            b: Vec::new(),
            f0: Vec::new(),
            f1: Vec::new(),
            sc: Vec::new(),
            order: Vec::new(),
        }
    }
}

thread_local! {
    /// This thread's two decoded weight tiles, reused across calls.
    static DECODED: RefCell<[Decoded16; 2]> =
        const { RefCell::new([Decoded16::new(), Decoded16::new()]) };
}

/// What turns a type's stored `u` into its signed value (mod 256): the
/// signed types store `s + 128` for the VNNI operand (after their
/// `VNNI_ADD`), the offset types `value + OFFSET`; K-quant mins values are
/// their own (unsigned, below 64, so valid signed bytes).
const fn signed_add<T: VerticalType>() -> i8 {
    if T::SIGNED {
        T::VNNI_ADD.wrapping_add(i8::MIN)
    } else {
        (-T::OFFSET) as i8
    }
}

/// Transposes 16 rows of 8 dwords, row `p` in the low half of `z[p % 8]`
/// if `p < 8` else its high half, into 8 columns of 16 dwords: result `d`
/// holds dword `d` of rows 0..16 in order.
///
/// # Safety
/// AVX-512F available.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
fn transpose_16x8(z: [__m512i; 8]) -> [__m512i; 8] {
    let t = [
        _mm512_unpacklo_epi32(z[0], z[1]),
        _mm512_unpackhi_epi32(z[0], z[1]),
        _mm512_unpacklo_epi32(z[2], z[3]),
        _mm512_unpackhi_epi32(z[2], z[3]),
        _mm512_unpacklo_epi32(z[4], z[5]),
        _mm512_unpackhi_epi32(z[4], z[5]),
        _mm512_unpacklo_epi32(z[6], z[7]),
        _mm512_unpackhi_epi32(z[6], z[7]),
    ];
    // u[j] (j < 4): in each 128-bit lane, column j (lanes 0, 2) or j + 4
    // (lanes 1, 3) of rows 0..4 (of 8..12 in the high half); u[j + 4] the
    // same of rows 4..8 (12..16).
    let u = [
        _mm512_unpacklo_epi64(t[0], t[2]),
        _mm512_unpackhi_epi64(t[0], t[2]),
        _mm512_unpacklo_epi64(t[1], t[3]),
        _mm512_unpackhi_epi64(t[1], t[3]),
        _mm512_unpacklo_epi64(t[4], t[6]),
        _mm512_unpackhi_epi64(t[4], t[6]),
        _mm512_unpacklo_epi64(t[5], t[7]),
        _mm512_unpackhi_epi64(t[5], t[7]),
    ];
    let lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    let hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    let mut out = [_mm512_setzero_si512(); 8];
    for j in 0..4 {
        out[j] = _mm512_permutex2var_epi64(u[j], lo, u[j + 4]);
        out[j + 4] = _mm512_permutex2var_epi64(u[j], hi, u[j + 4]);
    }
    out
}

/// The 8 dwords at `a` (low half) and `b` (high half).
///
/// # Safety
/// AVX-512F available; both readable for 32 bytes.
#[cfg(test)]
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn pair(a: *const u8, b: *const u8) -> __m512i {
    unsafe {
        let lo = _mm256_loadu_si256(a.cast());
        _mm512_inserti64x4(_mm512_castsi256_si512(lo), _mm256_loadu_si256(b.cast()), 1)
    }
}

/// The reference for [`decode_tile`]: each row's groups unpacked as the
/// VNNI kernel unpacks them ([`unpack_group_adding`]), then transposed.
/// Decodes weight rows `t0..t0 + rt` (`rt <= 16`) of the vertical matrix
/// `data` (rows of `row_bytes`, `nb` blocks) into `dec`.
///
/// # Safety
/// AVX2, FMA, F16C and AVX-512 F/BW/VL available; the rows exist.
#[cfg(test)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn decode_tile_reference<T: VerticalType>(
    data: &[u8],
    row_bytes: usize,
    (t0, rt): (usize, usize),
    nb: usize,
    dec: &mut Decoded16,
) {
    unsafe {
        let q6 = matches!(T::FOLD, Fold::Q6);
        let kmin = matches!(T::FOLD, Fold::KMin);
        let mut groups = vec![WGroup::ZERO; TN];
        dec.b.resize(nb, BTile([0; 512]));
        dec.f0.resize(nb, Rows16([0.0; TN]));
        if kmin {
            dec.f1.resize(nb, Rows16([0.0; TN]));
        }
        if q6 {
            dec.sc.resize(2 * nb, IRows16([0; TN]));
        }
        for g in 0..nb.div_ceil(8) {
            let mut half = false;
            for (n, wg) in groups.iter_mut().enumerate() {
                if n < rt {
                    let row = data[(t0 + n) * row_bytes..].as_ptr();
                    half = unpack_group_adding::<T>(row, g, nb, signed_add::<T>(), wg);
                } else if n == rt {
                    // Rows past the matrix: zero values, zero scales.
                    *wg = WGroup::ZERO;
                } else {
                    break;
                }
            }
            let groups = &groups;
            // Rows past `rt` repeat the zero row `rt` (when there is one).
            let at = |n: usize| &groups[n.min(rt.min(TN - 1))];
            let steps = if half { 4 } else { 8 };
            for k in 0..steps {
                let z: [__m512i; 8] = std::array::from_fn(|p| {
                    pair(
                        at(p).u.as_ptr().add(32 * k),
                        at(p + 8).u.as_ptr().add(32 * k),
                    )
                });
                for (d, col) in transpose_16x8(z).into_iter().enumerate() {
                    // A full group's dword d of step k is block d's values
                    // 4k..4k+4; a half group's, block d / 2's 8k + 4(d % 2).
                    let (j, k4) = if half { (d / 2, 2 * k + d % 2) } else { (d, k) };
                    if j < 8 && 8 * g + j < nb && (!half || j < 4) {
                        let dst = dec.b[8 * g + j].0.as_mut_ptr().add(64 * k4);
                        _mm512_store_si512(dst.cast(), col);
                    }
                }
            }
            let blocks = if half { 4 } else { 8 };
            let cols = |field: fn(&WGroup) -> *const u8| -> [__m512i; 8] {
                let z: [__m512i; 8] = std::array::from_fn(|p| pair(field(at(p)), field(at(p + 8))));
                transpose_16x8(z)
            };
            let f0 = cols(|w| w.f0.as_ptr().cast());
            for (j, v) in f0.into_iter().enumerate().take(blocks) {
                _mm512_store_si512(dec.f0[8 * g + j].0.as_mut_ptr().cast(), v);
            }
            if kmin {
                let f1 = cols(|w| w.f1.as_ptr().cast());
                for (j, v) in f1.into_iter().enumerate().take(blocks) {
                    _mm512_store_si512(dec.f1[8 * g + j].0.as_mut_ptr().cast(), v);
                }
            }
            if q6 {
                for h in 0..2 {
                    // Lane j's int16 pair both hold block j's scale.
                    let sc = if h == 0 {
                        cols(|w| w.sc[0].as_ptr().cast())
                    } else {
                        cols(|w| w.sc[1].as_ptr().cast())
                    };
                    for (j, v) in sc.into_iter().enumerate().take(blocks) {
                        let v = _mm512_srai_epi32(_mm512_slli_epi32(v, 16), 16);
                        let dst = dec.sc[2 * (8 * g + j) + h].0.as_mut_ptr();
                        _mm512_store_si512(dst.cast(), v);
                    }
                }
            }
        }
    }
}

/// The 16 rows' 32 bytes at `rows[n] + off` (row `n`), as 8 vectors of
/// their dwords: vector `d` holds dword `d` of rows 0..16 in order. Rows
/// past `rt` read as zero.
///
/// # Safety
/// AVX-512 F/BW/VL available; rows `0..rt` readable for 32 bytes at `off`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn gather_dwords(rows: &[*const u8; TN], rt: usize, off: usize) -> [__m512i; 8] {
    unsafe {
        let row = |n: usize| -> __m256i {
            if n < rt {
                _mm256_loadu_si256(rows[n].add(off).cast())
            } else {
                _mm256_setzero_si256()
            }
        };
        let z: [__m512i; 8] = std::array::from_fn(|p| {
            _mm512_inserti64x4(_mm512_castsi256_si512(row(p)), row(p + 8), 1)
        });
        transpose_16x8(z)
    }
}

/// The 16 rows' 8 floats from `f(n)` (row `n`), as 8 vectors over the rows
/// (vector `j`: float `j` of rows 0..16). Rows past `rt` are zero.
///
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
fn gather_floats(rt: usize, f: impl Fn(usize) -> __m256) -> [__m512i; 8] {
    let row = |n: usize| -> __m256i {
        if n < rt {
            _mm256_castps_si256(f(n))
        } else {
            _mm256_setzero_si256()
        }
    };
    let z: [__m512i; 8] =
        std::array::from_fn(|p| _mm512_inserti64x4(_mm512_castsi256_si512(row(p)), row(p + 8), 1));
    transpose_16x8(z)
}

/// For [`decode_tile`]'s bit planes: the `vpshufbitqmb` control that takes,
/// into byte `4n + t` of a B tile row, bit `4d + t` of row `n`'s mask (the
/// masks of rows `2q`, `2q + 1` in qword `q`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
fn bit_control(d: usize) -> __m512i {
    let mut c = [0u8; 64];
    for (p, c) in c.iter_mut().enumerate() {
        let (n, t) = (p / 4, p % 4);
        *c = (32 * (n % 2) + 4 * d + t) as u8;
    }
    // SAFETY: `c` is 64 bytes.
    unsafe { _mm512_loadu_si512(c.as_ptr().cast()) }
}

/// Decodes weight rows `t0..t0 + rt` (`rt <= 16`) of the vertical matrix
/// `data` (rows of `row_bytes`, `nb` blocks) into `dec`, reading the
/// planes as they lie: each 32-byte plane vector of the 16 rows is
/// transposed once (16 x 8 dwords), so that its dword `d` of every row sits
/// in one vector, which is then split into nibbles, given its high bits
/// (`vpshufbitqmb` from the bit plane) and made signed: a B tile row. The
/// same bytes as [`decode_tile_reference`] (tested), in about a third of
/// its work.
///
/// # Safety
/// AVX2, FMA, F16C, AVX-512 F/BW/VL/BITALG available; the rows exist.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512bitalg")]
unsafe fn decode_tile<T: VerticalType>(
    data: &[u8],
    row_bytes: usize,
    (t0, rt): (usize, usize),
    nb: usize,
    dec: &mut Decoded16,
) {
    unsafe {
        use crate::quant::vertical::{planes_of, High};
        let q6 = matches!(T::FOLD, Fold::Q6);
        let kmin = matches!(T::FOLD, Fold::KMin);
        dec.b.resize(nb, BTile([0; 512]));
        dec.f0.resize(nb, Rows16([0.0; TN]));
        if kmin {
            dec.f1.resize(nb, Rows16([0.0; TN]));
        }
        if q6 {
            dec.sc.resize(2 * nb, IRows16([0; TN]));
        }
        let full = planes_of(T::TY, 8).unwrap_or_else(|| unreachable!("a vertical type"));
        let add = _mm512_set1_epi8(signed_add::<T>());
        // Bytes 4n..4n + 4 of a B tile row belong to weight row n.
        let live: __mmask64 = if rt >= TN { !0 } else { (1u64 << (4 * rt)) - 1 };
        let low4 = _mm512_set1_epi8(0x0F);
        let rows: [*const u8; TN] = std::array::from_fn(|n| {
            if n < rt {
                data.as_ptr().add((t0 + n) * row_bytes)
            } else {
                std::ptr::null()
            }
        });
        for g in 0..nb.div_ceil(8) {
            let half = T::HALF_GROUPS && nb - 8 * g < 8;
            let m = if half { 4 } else { 8 };
            let pl = planes_of(T::TY, m).unwrap_or_else(|| unreachable!("a vertical type"));
            let at = g * full.full_group_bytes;
            let grows: [*const u8; TN] = std::array::from_fn(|n| rows[n].wrapping_add(at));
            // Dword d of step k: a full group's block d, values 4k..4k+4
            // (B tile row k); a half group's block d / 2, values 8k + 4(d %
            // 2).. (row 2k + d % 2).
            let bt = dec.b.as_mut_ptr();
            let put = |d: usize, k: usize, v: __m512i| {
                let (j, k4) = if half { (d / 2, 2 * k + d % 2) } else { (d, k) };
                let dst = bt.add(8 * g + j).cast::<i8>().add(64 * k4);
                // Rows past `rt` stay zero.
                _mm512_store_si512(dst.cast(), _mm512_maskz_add_epi8(live, v, add));
            };
            match pl.high {
                High::Bytes => {
                    for k in 0..m {
                        let t = gather_dwords(&grows, rt, pl.main + 32 * k);
                        for (d, v) in t.into_iter().enumerate() {
                            put(d, k, v);
                        }
                    }
                }
                _ => {
                    // The high plane, transposed: bit plane vector k = step
                    // k's masks; crumb plane vectors c[v][d] = steps 4v..4v+4
                    // of dword d.
                    let bits = if pl.high == High::Bit {
                        gather_dwords(&grows, rt, pl.high_at)
                    } else {
                        [_mm512_setzero_si512(); 8]
                    };
                    let crumbs = if pl.high == High::Crumbs {
                        [
                            gather_dwords(&grows, rt, pl.high_at),
                            gather_dwords(&grows, rt, pl.high_at + 32),
                        ]
                    } else {
                        [[_mm512_setzero_si512(); 8]; 2]
                    };
                    let top = |d: usize, k: usize| -> __m512i {
                        match pl.high {
                            High::Bit => {
                                let mask = _mm512_bitshuffle_epi64_mask(bits[k], bit_control(d));
                                _mm512_maskz_mov_epi8(mask, _mm512_set1_epi8(0x10))
                            }
                            High::Crumbs => {
                                let c = crumbs[k / 4][d];
                                let at = match k % 4 {
                                    0 => _mm512_slli_epi16(c, 4),
                                    1 => _mm512_slli_epi16(c, 2),
                                    2 => c,
                                    _ => _mm512_srli_epi16(c, 2),
                                };
                                _mm512_and_si512(at, _mm512_set1_epi8(0x30))
                            }
                            _ => _mm512_setzero_si512(),
                        }
                    };
                    let nv = m / 2;
                    for v in 0..nv {
                        let t = gather_dwords(&grows, rt, pl.main + 32 * v);
                        for (d, x) in t.into_iter().enumerate() {
                            let lo = _mm512_and_si512(x, low4);
                            let hi = _mm512_and_si512(_mm512_srli_epi16(x, 4), low4);
                            put(d, v, _mm512_or_si512(lo, top(d, v)));
                            put(d, v + nv, _mm512_or_si512(hi, top(d, v + nv)));
                        }
                    }
                }
            }
            // The scale terms, as vectors over the rows.
            let blocks = m;
            let store_rows = |dst: *mut f32, v: __m512i| _mm512_store_si512(dst.cast(), v);
            match T::FOLD {
                Fold::Block32 => {
                    // `m` f16 scales at the group's start.
                    let f0 = gather_floats(rt, |n| {
                        let h = if half {
                            _mm_loadl_epi64(grows[n].cast())
                        } else {
                            _mm_loadu_si128(grows[n].cast())
                        };
                        _mm256_cvtph_ps(h)
                    });
                    for (j, v) in f0.into_iter().enumerate().take(blocks) {
                        store_rows(dec.f0[8 * g + j].0.as_mut_ptr(), v);
                    }
                }
                Fold::KMin => {
                    let mut wg = WGroup::ZERO;
                    let mut ds = [[0f32; 8]; TN];
                    let mut dm = [[0f32; 8]; TN];
                    for n in 0..rt {
                        crate::quant::q4_k::avx2::k_params(grows[n], &mut wg);
                        ds[n] = wg.f0;
                        dm[n] = wg.f1;
                    }
                    let f0 = gather_floats(TN, |n| _mm256_loadu_ps(ds[n].as_ptr()));
                    let f1 = gather_floats(TN, |n| _mm256_loadu_ps(dm[n].as_ptr()));
                    for j in 0..8 {
                        store_rows(dec.f0[8 * g + j].0.as_mut_ptr(), f0[j]);
                        store_rows(dec.f1[8 * g + j].0.as_mut_ptr(), f1[j]);
                    }
                }
                Fold::Q6 => {
                    // One `d` per row (f16 at 208), the same for its 8
                    // blocks; scale of block t's half h: the i8 at 192 + 2t + h.
                    let mut d = [0u16; TN];
                    // `sc[h][n]`: row n's scales of halves h, block by block.
                    let mut sc = [[[0i32; 8]; TN]; 2];
                    for n in 0..rt {
                        d[n] = std::ptr::read_unaligned(grows[n].add(208).cast::<u16>());
                        for t in 0..8 {
                            for (h, sc) in sc.iter_mut().enumerate() {
                                sc[n][t] = *grows[n].add(192 + 2 * t + h) as i8 as i32;
                            }
                        }
                    }
                    let dv = _mm512_cvtph_ps(_mm256_loadu_si256(d.as_ptr().cast()));
                    for j in 0..8 {
                        _mm512_store_ps(dec.f0[8 * g + j].0.as_mut_ptr(), dv);
                    }
                    for (h, sc) in sc.iter().enumerate() {
                        let v = gather_floats(TN, |n| {
                            _mm256_castsi256_ps(_mm256_loadu_si256(sc[n].as_ptr().cast()))
                        });
                        for (j, v) in v.into_iter().enumerate() {
                            let dst = dec.sc[2 * (8 * g + j) + h].0.as_mut_ptr();
                            _mm512_store_si512(dst.cast(), v);
                        }
                    }
                }
                Fold::Q2 => unreachable!("no vertical layout for Q2 folds"),
            }
        }
    }
}

/// The tile unit's registers: A tiles (activations) 0 and 1, B tiles
/// (weights) 2 and 3, C tiles (the dots) 4 to 7, so that loads overlap the
/// products before them: the unit of the tile unit's time runs its products
/// in order, and a load into a register that a product still reads waits
/// for it.
///
/// A *unit* is one A tile (8 activation rows x a block, or for Q6_K half a
/// block: its halves have their own scales) against the B tiles of `W`
/// weight tiles (one product each), so that each A tile, read from L2,
/// serves `W` products. With `W = 2`, unit `u` reads A tile `u % 2` and B
/// tiles 2 and 3 and writes C tiles `4 + 2 (u % 2)` and the next; with `W
/// = 1`, A tile `u % 2`, B tile `2 + u % 2`, C tile `4 + u % 4`. A unit's
/// dots are stored `2 / W` units after its products start and folded one
/// unit later (docs/PERF.md §42).
const RING: usize = 4;

/// Activation rows per A tile.
const TA: usize = 8;

/// Units between a unit's products and the store of their dots.
const fn store_after(w: usize) -> usize {
    // `run_tiles`' rounds name the registers for these distances.
    2 / w
}

/// Units between a unit's products and their fold (a store's data is read
/// a unit after it, not at once).
const fn fold_after(w: usize) -> usize {
    store_after(w) + 1
}

/// The configuration of a type's tiles (see [`RING`]).
fn config(q6: bool) -> TileConfig {
    let mut cfg = TileConfig::new();
    let kb = if q6 { 16 } else { 32 };
    for a in 0..2 {
        cfg.set(a, TA, kb);
        cfg.set(2 + a, kb / 4, 4 * TN);
    }
    for c in 4..8 {
        cfg.set(c, TA, 4 * TN);
    }
    cfg
}

/// Where one A tile's rows are: values (the 8 rows of block number `s` of
/// the fold's order at `qs + 512 s`, 32 bytes apart), scales and, for
/// `KMin`, the block sums as f32 (both `nb` per row).
#[derive(Clone, Copy)]
struct ActTile {
    qs: *const i8,
    d: *const f32,
    asum: *const f32,
}

/// The int32 dots of one product: 8 activation rows x 16 weight rows.
#[repr(C, align(64))]
struct CBuf([[i32; TN]; TA]);

/// Units (see [`RING`]) per block of `T`.
const fn units<T: VerticalType>() -> usize {
    if matches!(T::FOLD, Fold::Q6) {
        2
    } else {
        1
    }
}

/// Where unit `u` of an A tile reads: its A tile, and the B tile of block
/// number `s = u / units` of the fold's order in `dec` (16 of a block's 32
/// values per row for Q6_K, else all; the A tiles' blocks are packed in
/// that order).
///
/// # Safety
/// As [`run_tiles`]; `u` is a unit of the tile's order.
#[inline(always)]
unsafe fn operands<T: VerticalType>(act: ActTile, dec: &Decoded16, u: usize) -> (*const u8, usize) {
    unsafe {
        let (s, h) = (u / units::<T>(), u % units::<T>());
        let b = *dec.order.get_unchecked(s) as usize;
        let a = act.qs.add(TM * 32 * s + 16 * h).cast::<u8>();
        (a, 256 * h + 512 * b)
    }
}

/// `C += A · B` with a zeroed C: one product.
///
/// # Safety
/// As [`run_tiles`].
#[inline(always)]
unsafe fn product<const C: u8, const A: u8, const B: u8>(b: *const u8) {
    unsafe {
        amx::load::<B>(b, 4 * TN);
        amx::zero::<C>();
        amx::dot_ss::<C, A, B>();
    }
}

/// Folds block `b`'s dots of activation rows `0..M` into `acc`, as every
/// path folds a block into its lane: `lo` (Q6_K: of values 0..16; `hi` of
/// 16..32, else unused).
///
/// # Safety
/// AVX-512F available; as [`run_tile`].
#[inline(always)]
unsafe fn fold<T: VerticalType, const M: usize>(
    act: ActTile,
    dec: &Decoded16,
    (b, nb): (usize, usize),
    (lo, hi): (&CBuf, &CBuf),
    acc: &mut [__m512; M],
) {
    unsafe {
        let f0 = _mm512_load_ps(dec.f0[b].0.as_ptr());
        for (m, acc) in acc.iter_mut().enumerate() {
            let da = _mm512_set1_ps(*act.d.add(m * nb + b));
            let dots = _mm512_load_si512(lo.0[m].as_ptr().cast());
            *acc = match T::FOLD {
                // fma(dw * da, isum, lane), as `fold_scaled`.
                Fold::Block32 => {
                    _mm512_fmadd_ps(_mm512_mul_ps(f0, da), _mm512_cvtepi32_ps(dots), *acc)
                }
                // As `fold_scaled_min`.
                Fold::KMin => {
                    let f1 = _mm512_load_ps(dec.f1[b].0.as_ptr());
                    let asum = _mm512_set1_ps(*act.asum.add(m * nb + b));
                    let inner =
                        _mm512_fmsub_ps(f0, _mm512_cvtepi32_ps(dots), _mm512_mul_ps(f1, asum));
                    _mm512_fmadd_ps(da, inner, *acc)
                }
                // scale_lo * dot_lo + scale_hi * dot_hi, then as
                // `fold_scaled`.
                Fold::Q6 => {
                    let hi = _mm512_load_si512(hi.0[m].as_ptr().cast());
                    let s0 = _mm512_load_si512(dec.sc[2 * b].0.as_ptr().cast());
                    let s1 = _mm512_load_si512(dec.sc[2 * b + 1].0.as_ptr().cast());
                    let dot =
                        _mm512_add_epi32(_mm512_mullo_epi32(s0, dots), _mm512_mullo_epi32(s1, hi));
                    _mm512_fmadd_ps(_mm512_mul_ps(f0, da), _mm512_cvtepi32_ps(dot), *acc)
                }
                Fold::Q2 => unreachable!("no vertical layout for Q2 folds"),
            };
        }
    }
}

/// The order the lanes are folded in, so that `tree8` can be summed as
/// they finish: `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))`.
const LANE_ORDER: [usize; 8] = [0, 4, 2, 6, 1, 5, 3, 7];
/// Where each lane is in [`LANE_ORDER`].
const LANE_POSITION: [usize; 8] = [0, 4, 2, 6, 1, 5, 3, 7];
const _: () = {
    let mut l = 0;
    while l < 8 {
        assert!(LANE_ORDER[LANE_POSITION[l]] == l);
        l += 1;
    }
};

/// The blocks of a row of `nb` in the order the kernel folds them: lane
/// by lane in [`LANE_ORDER`], each lane's blocks in order.
fn fold_order(nb: usize) -> impl Iterator<Item = usize> {
    LANE_ORDER.iter().flat_map(move |&l| (l..nb).step_by(8))
}

/// The 8 lane accumulators of `M` rows of one weight tile, kept as each
/// lane is done and summed with `tree8` when the last is. Aligned, so its
/// stores never split a cache line (compiler spill slots of a tree kept in
/// registers did, at a fifth of the kernel's time).
#[repr(C, align(64))]
struct Lanes<const M: usize>([[__m512; M]; 8]);

impl<const M: usize> Lanes<M> {
    /// Lane `l`'s accumulators.
    ///
    /// # Safety
    /// `t` is valid for writes.
    #[inline(always)]
    unsafe fn put(t: *mut Self, l: usize, acc: &[__m512; M]) {
        unsafe { (*t).0[l] = *acc };
    }

    /// `tree8` of the lanes, row `m`: `((l0 + l4) + (l2 + l6)) + ((l1 +
    /// l5) + (l3 + l7))`.
    ///
    /// # Safety
    /// AVX-512F available; every lane was put.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
    unsafe fn sum(t: *const Self, m: usize) -> __m512 {
        unsafe {
            let l = |j: usize| (*t).0[j][m];
            let q0 = _mm512_add_ps(_mm512_add_ps(l(0), l(4)), _mm512_add_ps(l(2), l(6)));
            let q1 = _mm512_add_ps(_mm512_add_ps(l(1), l(5)), _mm512_add_ps(l(3), l(7)));
            _mm512_add_ps(q0, q1)
        }
    }
}

/// A run of A tiles: tile `j` holds activation rows `m0 + 8j ..` of a
/// chunk packed by [`pack_acts_amx`].
#[derive(Clone, Copy)]
struct ActRun {
    /// The packed 16-row tiles.
    tiles: *const i8,
    /// The scales of row 0, and the block sums as f32 of row 0.
    d: *const f32,
    asum: *const f32,
    nb: usize,
    /// The first row.
    m0: usize,
}

impl ActRun {
    /// A tile `j` of the run.
    ///
    /// # Safety
    /// The tile's rows are in the packed activations.
    #[inline(always)]
    unsafe fn tile(self, j: usize) -> ActTile {
        let m = self.m0 + TA * j;
        // The 16-row tile of row `m`, its first or second 8 rows.
        unsafe {
            ActTile {
                qs: self.tiles.add((m / TM) * self.nb * TM * 32 + (m % TM) * 32),
                d: self.d.add(m * self.nb),
                asum: self.asum.wrapping_add(m * self.nb),
            }
        }
    }
}

/// Runs `n_tiles` A tiles of `M` rows (`M <= 8`; every tile but the last
/// has 8) against the `W` decoded weight tiles `dec` and writes the first
/// `rt[w]` outputs of each of their rows `m` of weight tile `w` at output
/// `o0[w] + (m0 + m) * rows`.
///
/// The blocks go lane by lane (`order`), so one lane's accumulators stay in
/// registers, in a pipeline of units (see [`RING`]) that runs on from one A
/// tile to the next: unit `u`'s products use C tiles `2 + (u W + w) % 6`,
/// and its dots go to `c[(u W + w) % 6]`.
///
/// # Safety
/// AVX2, FMA, F16C, AVX-512 F/BW/VL and AMX available, with [`config`]
/// loaded; `acts` covers the tiles' rows of `nb` blocks; each `dec` holds
/// `nb` decoded blocks and their order; the caller owns the outputs.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
#[allow(clippy::too_many_arguments)]
unsafe fn run_tiles<T: VerticalType, const M: usize, const W: usize>(
    acts: ActRun,
    n_tiles: usize,
    dec: [&Decoded16; W],
    out: (&OutPtr, [usize; W], usize),
    rt: [usize; W],
    c: &mut [CBuf; RING],
) {
    unsafe {
        let nb = acts.nb;
        let upb = units::<T>();
        let total = nb * upb;
        let units_all = n_tiles * total;
        let (store_at, fold_at) = (store_after(W), fold_after(W));
        // Issue cursor: A tile and unit.
        let (mut ti, mut ui, mut act_i) = (0, 0, acts.tile(0));
        // Fold cursor: A tile, unit, lane position in `LANE_ORDER`, the
        // lanes' accumulators and their tree.
        let (mut tf, mut uf, mut pos, mut act_f) = (0, 0, 0, acts.tile(0));
        let mut acc = [[_mm512_setzero_ps(); M]; W];
        let mut lanes: [std::mem::MaybeUninit<Lanes<M>>; W] =
            std::array::from_fn(|_| std::mem::MaybeUninit::uninit());
        let (out, o0, rows) = out;
        // Global unit `g` starts, then the block whose last unit is `g -
        // fold_at` is folded and unit `g - store_at` stored (in that order:
        // Q6_K's fold reads the slots of unit `g - fold_at - 1`, which the
        // store then takes).
        macro_rules! issue_fold {
            ($g:expr, $issue:block) => {{
                let g = $g;
                if g < units_all {
                    $issue
                    ui += 1;
                    if ui == total {
                        ui = 0;
                        ti += 1;
                        if ti < n_tiles {
                            act_i = acts.tile(ti);
                        }
                    }
                }
                if (fold_at..units_all + fold_at).contains(&g) {
                    if uf % upb == upb - 1 {
                        let b = *dec[0].order.get_unchecked(uf / upb) as usize;
                        let at = LANE_POSITION[b % 8];
                        while pos < at {
                            // The lane is done (or had no blocks: 0.0, as a
                            // lane of the other paths that no block reaches).
                            for w in 0..W {
                                Lanes::put(lanes[w].as_mut_ptr(), LANE_ORDER[pos], &acc[w]);
                                acc[w] = [_mm512_setzero_ps(); M];
                            }
                            pos += 1;
                        }
                        let last = g - fold_at;
                        for w in 0..W {
                            let lo = &c[((last + 1 - upb) * W + w) % RING];
                            let hi = &c[(last * W + w) % RING];
                            fold::<T, M>(act_f, dec[w], (b, nb), (lo, hi), &mut acc[w]);
                        }
                    }
                    uf += 1;
                    if uf == total {
                        // The A tile is done: its last lanes, its outputs.
                        while pos < 8 {
                            for w in 0..W {
                                Lanes::put(lanes[w].as_mut_ptr(), LANE_ORDER[pos], &acc[w]);
                                acc[w] = [_mm512_setzero_ps(); M];
                            }
                            pos += 1;
                        }
                        for w in 0..W {
                            let keep = ((1u32 << rt[w]) - 1) as __mmask16;
                            for m in 0..M {
                                let v = Lanes::sum(lanes[w].as_ptr(), m);
                                // The caller owns these outputs; the slice is
                                // checked against the buffer and dropped at
                                // once.
                                let row = acts.m0 + TA * tf + m;
                                let dst = out.slice(o0[w] + row * rows, rt[w]);
                                _mm512_mask_storeu_ps(dst.as_mut_ptr(), keep, v);
                            }
                        }
                        uf = 0;
                        pos = 0;
                        tf += 1;
                        if tf < n_tiles {
                            act_f = acts.tile(tf);
                        }
                    }
                }
                (store_at..units_all + store_at).contains(&g)
            }};
        }
        // Two weight tiles: unit `g` (`g % 2 == k`) reads A tile k, writes C
        // tiles 4 + 2k and 5 + 2k; unit `g - 1` is stored from the others.
        macro_rules! step2 {
            ($base:expr, $k:literal) => {{
                let store = issue_fold!($base + $k, {
                    let (a, b) = operands::<T>(act_i, dec[0], ui);
                    amx::load::<$k>(a, 32);
                    product::<{ 4 + 2 * $k }, $k, 2>(dec[0].b.as_ptr().cast::<u8>().add(b));
                    product::<{ 5 + 2 * $k }, $k, 3>(dec[W - 1].b.as_ptr().cast::<u8>().add(b));
                });
                if store {
                    amx::store::<{ 4 + 2 * (1 - $k) }>(
                        c[2 * (1 - $k)].0.as_mut_ptr().cast(),
                        4 * TN,
                    );
                    amx::store::<{ 5 + 2 * (1 - $k) }>(
                        c[2 * (1 - $k) + 1].0.as_mut_ptr().cast(),
                        4 * TN,
                    );
                }
            }};
        }
        // One weight tile: unit `g` (`g % 4 == k`) reads A tile k % 2 and B
        // tile 2 + k % 2, writes C tile 4 + k; unit `g - 2` is stored.
        macro_rules! step1 {
            ($base:expr, $k:literal) => {{
                let store = issue_fold!($base + $k, {
                    let (a, b) = operands::<T>(act_i, dec[0], ui);
                    amx::load::<{ $k % 2 }>(a, 32);
                    product::<{ 4 + $k }, { $k % 2 }, { 2 + $k % 2 }>(
                        dec[0].b.as_ptr().cast::<u8>().add(b),
                    );
                });
                if store {
                    amx::store::<{ 4 + ($k + 2) % 4 }>(
                        c[($k + 2) % 4].0.as_mut_ptr().cast(),
                        4 * TN,
                    );
                }
            }};
        }
        let mut base = 0;
        while base < units_all + fold_at {
            if W == 1 {
                step1!(base, 0);
                step1!(base, 1);
                step1!(base, 2);
                step1!(base, 3);
            } else {
                step2!(base, 0);
                step2!(base, 1);
            }
            base += RING / W;
        }
    }
}

/// [`run_tiles`] for tiles of `mr` (1..=8) activation rows.
///
/// # Safety
/// As [`run_tiles`] with `M = mr`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn run_rows<T: VerticalType, const W: usize>(
    mr: usize,
    (acts, n_tiles): (ActRun, usize),
    dec: [&Decoded16; W],
    out: (&OutPtr, [usize; W], usize),
    rt: [usize; W],
    c: &mut [CBuf; RING],
) {
    unsafe {
        macro_rules! by_rows {
            ($($m:literal)*) => {
                match mr {
                    $($m => run_tiles::<T, $m, W>(acts, n_tiles, dec, out, rt, c),)*
                    _ => unreachable!("1..=8 activation rows"),
                }
            };
        }
        by_rows!(1 2 3 4 5 6 7 8)
    }
}

/// Bytes of the activation tiles [`pack_acts_amx`] writes for `n` rows of
/// `nb` blocks.
fn tiles_bytes(n: usize, nb: usize) -> usize {
    n.div_ceil(TM) * nb * TM * 32
}

/// Packs the quantized activations for the AMX kernel of `T`, into `out`
/// as bytes: for each tile of 16 rows (the last padded with zero rows),
/// for each block in the kernel's order, its A tile (the 16 rows' 32
/// values, 512 contiguous bytes), so that a tile's blocks stream from one
/// contiguous run front to back (read
/// in place from the row-major values an A tile was 16 cache lines, each
/// half used). Then, for `KMin` types, every block sum as f32 (row-major,
/// `nb` per row).
///
/// # Safety
/// None beyond the function's own (it is `unsafe` to share the signature
/// of the other packers).
pub(crate) unsafe fn pack_acts_amx<T: VerticalType>(
    acts: &crate::quant::q8_act::QuantizedActs,
    out: &mut Vec<ActGroup>,
) {
    let (n, nb) = (acts.n(), acts.cols() / 32);
    let tiles = tiles_bytes(n, nb);
    let sums = if matches!(T::FOLD, Fold::KMin) {
        4 * n * nb
    } else {
        0
    };
    // Reused as it is: every byte read is written below (no zero fill of
    // the whole buffer, which cost more than the copies).
    let groups = (tiles + sums).div_ceil(std::mem::size_of::<ActGroup>());
    if out.len() < groups {
        out.resize(groups, ActGroup::ZERO);
    }
    let bytes = out.len() * std::mem::size_of::<ActGroup>();
    // SAFETY: `ActGroup` is plain data (any bytes are valid) aligned for
    // f32, and the vector holds `bytes` bytes of them.
    let mem = unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<u8>(), bytes) };
    let (values, rest) = mem.split_at_mut(tiles);
    // Each tile's blocks in the order the kernel folds them (`fold_order`),
    // so that it reads them front to back.
    let mut position = vec![0usize; nb];
    for (s, b) in fold_order(nb).enumerate() {
        position[b] = s;
    }
    for i in 0..n {
        let Some(a) = acts.row(i) else { break };
        let (mt, r) = (i / TM, i % TM);
        for (b, q) in a.qs.chunks_exact(32).enumerate() {
            let at = ((mt * nb + position[b]) * TM + r) * 32;
            // SAFETY: `q` is 32 bytes, and `values` holds the tile's row.
            let dst = &mut values[at..at + 32];
            unsafe { std::ptr::copy_nonoverlapping(q.as_ptr().cast::<u8>(), dst.as_mut_ptr(), 32) };
        }
        if sums > 0 {
            for (b, &s) in a.bsums.iter().enumerate() {
                let at = 4 * (i * nb + b);
                rest[at..at + 4].copy_from_slice(&(s as f32).to_ne_bytes());
            }
        }
    }
    // The last tile's rows past `n` are zero.
    if !n.is_multiple_of(TM) {
        let (mt, r0) = (n / TM, n % TM);
        for b in 0..nb {
            let at = (mt * nb + b) * TM * 32;
            values[at + 32 * r0..at + 32 * TM].fill(0);
        }
    }
}

/// AMX: weight rows `r0..r1` x activation rows `i0..i1` of a vertical
/// matrix, in chunks of activation rows; against each, each tile of 16
/// weight rows is decoded once and run against the chunk 16 rows at a time.
///
/// # Safety
/// AVX2, FMA, F16C, AVX-512 F/BW/VL/VNNI and AMX available; `job.data`
/// holds vertical rows of `T`; `job.packed` is `pack_acts_amx::<T>` of the
/// activations; the caller owns output elements `(i, r)` for `i` in
/// `i0..i1`, `r` in `r0..r1`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn range_amx<T: VerticalType>(
    job: &QuantJob<'_>,
    r0: usize,
    r1: usize,
    i0: usize,
    i1: usize,
) {
    unsafe {
        let nb = job.cols / 32;
        let kmin = matches!(T::FOLD, Fold::KMin);
        let acts = job.acts;
        assert!(
            nb > 0
                && job.row_bytes == T::row_bytes(nb)
                && job.data.len() >= r1 * job.row_bytes
                && i1 <= acts.n(),
            "AMX multi-row kernel: inconsistent shapes"
        );
        let Some(first) = acts.row(0) else { return };
        let n = acts.n();
        assert!(
            std::mem::size_of_val(job.packed)
                >= tiles_bytes(n, nb) + if kmin { 4 * n * nb } else { 0 }
                && i0.is_multiple_of(TM),
            "AMX multi-row kernel: activations not packed, or a tile split"
        );
        // Row i's scales at `d + i * nb`; its tile's blocks from `tiles +
        // (i / 16) * nb * 512`; its block sums after the tiles.
        let d = first.d.as_ptr();
        let tiles = job.packed.as_ptr().cast::<i8>();
        let asum = tiles.add(tiles_bytes(n, nb)).cast::<f32>();
        let chunk = (ACT_CHUNK_BYTES / job.cols).next_multiple_of(TM).max(TM);
        let data = &job.data[..r1 * job.row_bytes];
        DECODED.with(|cell| {
            let mut fresh = [Decoded16::new(), Decoded16::new()];
            let mut guard = cell.try_borrow_mut();
            let [d0, d1]: &mut [Decoded16; 2] = match &mut guard {
                Ok(d) => d,
                // A re-entrant call (not expected): its own buffers.
                Err(_) => &mut fresh,
            };
            for dec in [&mut *d0, &mut *d1] {
                dec.order.clear();
                dec.order.extend(fold_order(nb).map(|b| b as u32));
            }
            let mut cbuf: [CBuf; RING] = std::array::from_fn(|_| CBuf([[0; TN]; TA]));
            config(matches!(T::FOLD, Fold::Q6)).load();
            let rows = job.rows;
            let mut c0 = i0;
            while c0 < i1 {
                let c1 = (c0 + chunk).min(i1);
                // Weight tiles two at a time (each A tile serves both).
                let mut t0 = r0;
                while t0 < r1 {
                    let rt0 = (r1 - t0).min(TN);
                    let t1 = t0 + rt0;
                    let rt1 = (r1 - t1).min(TN);
                    crate::quant::prefetch_rows_l2(data, t0 + 2 * TN, 2 * TN, job.row_bytes);
                    decode_tile::<T>(data, job.row_bytes, (t0, rt0), nb, d0);
                    if rt1 > 0 {
                        decode_tile::<T>(data, job.row_bytes, (t1, rt1), nb, d1);
                    }
                    // The chunk's whole 8-row tiles in one run, then its
                    // last rows.
                    let whole = (c1 - c0) / TA;
                    let short = (c1 - c0) % TA;
                    for (m0, n_tiles, mr) in [(c0, whole, TA), (c0 + TA * whole, 1, short)] {
                        if n_tiles == 0 || mr == 0 {
                            continue;
                        }
                        let run = ActRun {
                            tiles,
                            d,
                            asum,
                            nb,
                            m0,
                        };
                        if rt1 > 0 {
                            let out = (job.out, [t0, t1], rows);
                            run_rows::<T, 2>(
                                mr,
                                (run, n_tiles),
                                [d0, d1],
                                out,
                                [rt0, rt1],
                                &mut cbuf,
                            );
                        } else {
                            let out = (job.out, [t0], rows);
                            run_rows::<T, 1>(mr, (run, n_tiles), [d0], out, [rt0], &mut cbuf);
                        }
                    }
                    t0 = t1 + rt1;
                }
                c0 = c1;
            }
            amx::release();
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::vertical::to_vertical;
    use crate::quant::{q4_0::Q4_0, q4_k::Q4K, q5_0::Q5_0, q5_k::Q5K, q6_k::Q6K, q8_0::Q8_0};

    /// Random bytes with sane f16 scales, as vertical rows of `ty`.
    fn vertical_rows(
        ty: spindle_formats::GgmlType,
        rows: usize,
        cols: usize,
        seed: u32,
    ) -> Vec<u8> {
        let bytes = ty.bytes_for((rows * cols) as u64).unwrap() as usize;
        let mut x = seed;
        let mut data: Vec<u8> = (0..bytes)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            })
            .collect();
        // Scales: the f16 0x3C00 (1.0) family, so none is NaN.
        let block = ty.block_bytes();
        for b in data.chunks_exact_mut(block) {
            match ty {
                spindle_formats::GgmlType::Q6_K => b[209] &= 0x3B,
                spindle_formats::GgmlType::Q4_K | spindle_formats::GgmlType::Q5_K => {
                    b[1] &= 0x3B;
                    b[3] &= 0x3B;
                }
                _ => b[1] &= 0x3B,
            }
        }
        to_vertical(ty, cols, &mut data).unwrap();
        data
    }

    fn same<T: VerticalType>(ty: spindle_formats::GgmlType, cols: usize) {
        let rows = 21;
        let data = vertical_rows(ty, rows, cols, 0x9E37_79B9 ^ cols as u32);
        let row_bytes = data.len() / rows;
        let nb = cols / 32;
        for (t0, rt) in [(0, 16), (16, 5)] {
            let (mut a, mut b) = (Decoded16::new(), Decoded16::new());
            // SAFETY: the ISA was checked by the caller; the rows exist.
            unsafe {
                decode_tile::<T>(&data, row_bytes, (t0, rt), nb, &mut a);
                decode_tile_reference::<T>(&data, row_bytes, (t0, rt), nb, &mut b);
            }
            for blk in 0..nb {
                assert_eq!(
                    a.b[blk].0, b.b[blk].0,
                    "{ty} {cols}: B tile of block {blk}, rows {t0}+{rt}"
                );
                let bits = |v: &Rows16| v.0.map(f32::to_bits);
                assert_eq!(
                    bits(&a.f0[blk]),
                    bits(&b.f0[blk]),
                    "{ty} {cols}: f0 of block {blk}"
                );
                if matches!(T::FOLD, Fold::KMin) {
                    assert_eq!(
                        bits(&a.f1[blk]),
                        bits(&b.f1[blk]),
                        "{ty} {cols}: f1 of block {blk}"
                    );
                }
                if matches!(T::FOLD, Fold::Q6) {
                    for h in 0..2 {
                        assert_eq!(
                            a.sc[2 * blk + h].0,
                            b.sc[2 * blk + h].0,
                            "{ty}: sc {blk} {h}"
                        );
                    }
                }
            }
        }
    }

    /// The plane-reading decoder gives the reference's bytes, for whole and
    /// short tiles, whole groups and half groups.
    #[test]
    fn the_fast_decode_equals_the_reference() {
        // The decoders need AVX-512 (F/BW/VL, and BITALG for the fast
        // one), not the tile unit: AVX-512 machines without AMX test them.
        let decodable = std::is_x86_feature_detected!("fma")
            && std::is_x86_feature_detected!("f16c")
            && std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512bw")
            && std::is_x86_feature_detected!("avx512vl")
            && std::is_x86_feature_detected!("avx512bitalg");
        if !decodable {
            eprintln!(
                "note: no AVX-512 BITALG on this CPU; the AMX tile decoder was not tested here"
            );
            return;
        }
        use spindle_formats::GgmlType as G;
        for cols in [256, 640, 128] {
            same::<Q8_0>(G::Q8_0, cols);
            same::<Q4_0>(G::Q4_0, cols);
            same::<Q5_0>(G::Q5_0, cols);
        }
        for cols in [256, 1024] {
            same::<Q4K>(G::Q4_K, cols);
            same::<Q5K>(G::Q5_K, cols);
            same::<Q6K>(G::Q6_K, cols);
        }
    }
}
