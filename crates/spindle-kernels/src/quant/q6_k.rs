//! Q6_K: super-blocks of 256 values in 16 sub-blocks of 16.
//!
//! Layout (210 bytes): 128 bytes `ql` of low nibbles, 64 bytes `qh` of high
//! 2-bit pairs, 16 signed 8-bit scales, f16 `d`. The super-block is two halves
//! of 128; half `h` uses `ql[64h..64h+64]`, `qh[32h..32h+32]`. Within a half,
//! value `l` (0..32) of group `g` (0..4) is
//!
//! * g0: `ql[l]` low nibble, `qh[l]` bits 0..2
//! * g1: `ql[l+32]` low nibble, `qh[l]` bits 2..4
//! * g2: `ql[l]` high nibble, `qh[l]` bits 4..6
//! * g3: `ql[l+32]` high nibble, `qh[l]` bits 6..8
//!
//! and the 6-bit `u` stands for `d * scale[k] * (u - 32)`, `k` = index / 16.
//!
//! Dot products take `Block32` activations: values `32t..32t+32` of
//! super-block `s` (sub-blocks `2t`, `2t + 1`; group `t % 4` of half `t / 4`)
//! meet activation block `b = 8s + t`, whose exact integer dot
//! `scale[2t] * dot_lo + scale[2t+1] * dot_hi` folds into lane `b % 8` with
//! [`fold_scaled`].

use super::kernels::{block32_act, Kernel, OneRow};
use super::multi_row::{Decoded, Fold, MultiRow};
use super::q8_act::ActRow;
use super::registry::QuantType;
use super::{arr, f16_le, fold_scaled};
use crate::simd::tree8;
use crate::simd::Isa;
use spindle_formats::GgmlType;

/// This type's entry in the kernels' registry.
pub(crate) const TYPE: QuantType = QuantType {
    #[cfg(target_arch = "x86_64")]
    vertical: Some(super::kernels::vertical::<Q6K>),
    // d after 128 bytes of low bits, 64 of high bits and 16 scales.
    ..QuantType::quantized(GgmlType::Q6_K, dequantize, &[208], true, kernels)
};

/// The kernels on `isa`: one-row scalar and AVX2 (which AVX-512 machines
/// run too), multi-row scalar, AVX2 and `vpdpbusd zmm`.
pub(crate) fn kernels(isa: Isa) -> Option<Kernel> {
    block32_act::<Q6K>(
        isa,
        OneRow {
            scalar: rows_scalar,
            #[cfg(target_arch = "x86_64")]
            avx2: avx2::rows,
            #[cfg(target_arch = "x86_64")]
            avx512: avx2::rows,
        },
    )
}

/// Bytes per super-block.
pub const BLOCK_BYTES: usize = 210;

/// The 6-bit unsigned value `l` (0..32) of group `g` of half `h`.
#[inline]
fn value(block: &[u8], h: usize, g: usize, l: usize) -> u8 {
    let ql = &block[64 * h..64 * h + 64];
    let qh = block[128 + 32 * h + l];
    let nibble = match g {
        0 => ql[l] & 0x0F,
        1 => ql[l + 32] & 0x0F,
        2 => ql[l] >> 4,
        _ => ql[l + 32] >> 4,
    };
    nibble | (((qh >> (2 * g)) & 3) << 4)
}

/// The signed 8-bit scale of sub-block `k` (0..16).
#[inline]
fn scale(block: &[u8], k: usize) -> i8 {
    block[192 + k] as i8
}

/// Scalar reference dequantization; `src` is whole super-blocks, `dst` 256
/// values per super-block.
pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (block, out) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(256)) {
        let d = f16_le(*arr::<2>(&block[208..]));
        for h in 0..2 {
            for g in 0..4 {
                for l in 0..32 {
                    let i = 128 * h + 32 * g + l;
                    let ds = d * scale(block, i / 16) as f32;
                    out[i] = ds * (value(block, h, g, l) as i32 - 32) as f32;
                }
            }
        }
    }
}

/// Scalar reference: dot of one weight row with one `Block32` activation row.
pub(crate) fn dot_scalar(w: &[u8], a: ActRow<'_>) -> f32 {
    let mut lanes = [0.0f32; 8];
    for (s, block) in w.chunks_exact(BLOCK_BYTES).enumerate() {
        let d = f16_le(*arr::<2>(&block[208..]));
        for t in 0..8 {
            let b = 8 * s + t;
            let aq = &a.qs[32 * b..32 * b + 32];
            let mut sums = [0i32; 2];
            for (l, &y) in aq.iter().enumerate() {
                sums[l / 16] += (value(block, t / 4, t % 4, l) as i32 - 32) * y as i32;
            }
            let isum =
                scale(block, 2 * t) as i32 * sums[0] + scale(block, 2 * t + 1) as i32 * sums[1];
            fold_scaled(&mut lanes[b % 8], d, a.d[b], isum);
        }
    }
    tree8(&lanes)
}

/// Scalar: `out[r] = dot(row r of w, a)`.
pub(crate) fn rows_scalar(w: &[u8], row_bytes: usize, a: ActRow<'_>, out: &mut [f32]) {
    for (row, o) in w.chunks_exact(row_bytes).zip(out.iter_mut()) {
        *o = dot_scalar(row, a);
    }
}

/// Marker type for the multi-row kernels.
pub(crate) struct Q6K;

impl MultiRow for Q6K {
    const FOLD: Fold = Fold::Q6;
    // Values `u - 32` in -32..32, dotted with the sign trick: 4 steps of pair
    // sums stay below 4 * 2 * 32 * 127, and 4 steps are one 16-value scale.
    const SIGNED: bool = true;
    const STEPS: usize = 4;
    const OFFSET: i32 = 0;

    fn row_bytes(nb: usize) -> usize {
        nb / 8 * BLOCK_BYTES
    }

    fn decode_row(row: &[u8], out: &mut [Decoded]) {
        for (block, o) in row.chunks_exact(BLOCK_BYTES).zip(out.chunks_exact_mut(8)) {
            let d = f16_le(*arr::<2>(&block[208..]));
            for (t, o) in o.iter_mut().enumerate() {
                o.v = std::array::from_fn(|l| (value(block, t / 4, t % 4, l) as i32 - 32) as i8);
                o.f0 = d;
                o.sc = [scale(block, 2 * t), scale(block, 2 * t + 1)];
            }
        }
    }

    /// # Safety
    /// As [`MultiRow::pack_group`]: AVX2, FMA and F16C available; `row`
    /// covers `nb` blocks and `8 * g < nb`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn pack_group(row: *const u8, g: usize, _nb: usize, out: &mut super::multi_row::WGroup) {
        unsafe { avx2::pack_group(row.add(g * BLOCK_BYTES), out) }
    }

    /// # Safety
    /// As [`MultiRow::pack_group_unsigned`].
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
    unsafe fn pack_group_unsigned(
        row: *const u8,
        g: usize,
        _nb: usize,
        out: &mut super::multi_row::WGroup,
    ) {
        unsafe { avx2::pack_group_unsigned(row.add(g * BLOCK_BYTES), out) }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use super::BLOCK_BYTES;
    use crate::quant::multi_row::{store_vertical, WGroup};
    use crate::quant::q8_act::ActRow;
    use crate::simd::avx2::*;
    use std::arch::x86_64::*;

    /// `pshufb` controls spreading int16 scale `2g` over the low 128-bit lane
    /// and scale `2g + 1` over the high one.
    const SCALE_PAIR: [__m256i; 4] = {
        const fn ctrl(g: usize) -> __m256i {
            let lo = (4 * g) as u8;
            let mut b = [0u8; 32];
            let mut i = 0;
            while i < 16 {
                b[i] = lo + (i % 2) as u8;
                b[16 + i] = lo + 2 + (i % 2) as u8;
                i += 1;
            }
            // SAFETY: 32 bytes reinterpreted as a 256-bit vector.
            unsafe { std::mem::transmute::<[u8; 32], __m256i>(b) }
        }
        [ctrl(0), ctrl(1), ctrl(2), ctrl(3)]
    };

    /// The unsigned 6-bit values of the 8 blocks of 32 of the super-block at
    /// `bp` (block `t`: group `t % 4` of half `t / 4`).
    ///
    /// # Safety
    /// AVX2, FMA and F16C available; `bp..bp + BLOCK_BYTES` readable.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn values(bp: *const u8) -> [__m256i; 8] {
        unsafe {
            let low4 = _mm256_set1_epi8(0x0F);
            let mut v = [_mm256_setzero_si256(); 8];
            for h in 0..2 {
                let ql0 = load_256(bp.add(64 * h));
                let ql1 = load_256(bp.add(64 * h + 32));
                let qh = load_256(bp.add(128 + 32 * h));
                v[4 * h] = _mm256_or_si256(
                    _mm256_and_si256(ql0, low4),
                    _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(0x03)), 4),
                );
                v[4 * h + 1] = _mm256_or_si256(
                    _mm256_and_si256(ql1, low4),
                    _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(0x0C)), 2),
                );
                v[4 * h + 2] = _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4),
                    _mm256_and_si256(qh, _mm256_set1_epi8(0x30)),
                );
                v[4 * h + 3] = _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4),
                    _mm256_srli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(0xC0u8 as i8)), 2),
                );
            }
            v
        }
    }

    /// Packs the super-block at `bp` for the multi-row kernel: signed values
    /// `u - 32` and their magnitudes, `d`, and the 16-value scales as int16
    /// multipliers.
    ///
    /// # Safety
    /// AVX2, FMA and F16C available; `bp..bp + BLOCK_BYTES` readable.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn pack_group(bp: *const u8, out: &mut WGroup) {
        unsafe {
            let mut v = values(bp);
            for vt in &mut v {
                *vt = _mm256_sub_epi8(*vt, _mm256_set1_epi8(32));
            }
            store_vertical(&v, out.s.as_mut_ptr().cast());
            for vt in &mut v {
                *vt = _mm256_sign_epi8(*vt, *vt);
            }
            store_vertical(&v, out.u.as_mut_ptr());
            set_scales(bp, out);
        }
    }

    /// [`pack_group`] for the VNNI kernel: the values `u - 32` as `s + 128`
    /// (that is `u + 96`), `d` and the scales.
    ///
    /// # Safety
    /// AVX2, FMA and F16C available; `bp..bp + BLOCK_BYTES` readable.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn pack_group_unsigned(bp: *const u8, out: &mut WGroup) {
        unsafe {
            let mut v = values(bp);
            for vt in &mut v {
                *vt = _mm256_add_epi8(*vt, _mm256_set1_epi8(96));
            }
            store_vertical(&v, out.u.as_mut_ptr());
            set_scales(bp, out);
        }
    }

    /// `d` and the 16-value scales as int16 multipliers of the super-block
    /// at `bp`.
    ///
    /// # Safety
    /// `bp..bp + BLOCK_BYTES` readable.
    #[inline]
    pub(crate) unsafe fn set_scales(bp: *const u8, out: &mut WGroup) {
        unsafe {
            out.f0 = [half_to_f32(read_u16(bp.add(208))); 8];
            for t in 0..8 {
                for (h, sc) in out.sc.iter_mut().enumerate() {
                    let s = *bp.add(192 + 2 * t + h) as i8 as i16;
                    sc[2 * t] = s;
                    sc[2 * t + 1] = s;
                }
            }
        }
    }

    /// The 8 exact integer dots of the super-block at `bp` with the 256 values
    /// at `aq`, lane `t`: `scale[2t] * dot_lo + scale[2t+1] * dot_hi` of values
    /// `32t..32t+32`. The 6-bit values are multiplied unsigned and `32 * a`
    /// is taken off per pair of products (in int16, exact), before the scales.
    ///
    /// # Safety
    /// AVX2, FMA and F16C available; `bp..bp + BLOCK_BYTES` and
    /// `aq..aq + 256` readable.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn int_dots(bp: *const u8, aq: *const i8) -> __m256i {
        unsafe {
            let low4 = _mm256_set1_epi8(0x0F);
            let m32 = _mm256_set1_epi8(32);
            let mut p = [_mm256_setzero_si256(); 8];
            for h in 0..2 {
                let ql0 = load_256(bp.add(64 * h));
                let ql1 = load_256(bp.add(64 * h + 32));
                let qh = load_256(bp.add(128 + 32 * h));
                // The half's 8 scales as int16, in both 128-bit lanes.
                // (An 8-byte read: the block ends 2 bytes after the scales.)
                let sc8 = std::ptr::read_unaligned(bp.add(192 + 8 * h).cast::<i64>());
                let sc = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(_mm_cvtsi64_si128(sc8)));
                let q = [
                    _mm256_or_si256(
                        _mm256_and_si256(ql0, low4),
                        _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(0x03)), 4),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(ql1, low4),
                        _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(0x0C)), 2),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4),
                        _mm256_and_si256(qh, _mm256_set1_epi8(0x30)),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4),
                        _mm256_srli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(0xC0u8 as i8)), 2),
                    ),
                ];
                for (g, &qg) in q.iter().enumerate() {
                    let y = load_256(aq.add(128 * h + 32 * g).cast());
                    // Pair sums of (u - 32) * a: at most 2 * 32 * 127 in magnitude.
                    let pairs = _mm256_sub_epi16(dot_u8_i8_pairs(qg, y), dot_u8_i8_pairs(m32, y));
                    // Pair sums 0..8 cover values 0..16 (scale 2g of the half),
                    // 8..16 the next 16 (scale 2g + 1): spread them to match.
                    let scale = _mm256_shuffle_epi8(sc, SCALE_PAIR[g]);
                    p[4 * h + g] = _mm256_madd_epi16(pairs, scale);
                }
            }
            transpose_sum_8(p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7])
        }
    }

    /// AVX2: `out[r] = dot(row r of w, a)`, bit-identical to
    /// [`super::dot_scalar`].
    ///
    /// # Safety
    /// AVX2, FMA and F16C must be available.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn rows(w: &[u8], row_bytes: usize, a: ActRow<'_>, out: &mut [f32]) {
        unsafe {
            let nb = a.d.len();
            let ns = nb / 8;
            assert!(
                nb.is_multiple_of(8)
                    && row_bytes == ns * BLOCK_BYTES
                    && a.qs.len() == nb * 32
                    && w.len() >= out.len() * row_bytes,
                "Q6_K kernel: inconsistent shapes"
            );
            let (qs, d) = (a.qs.as_ptr(), a.d.as_ptr());
            for (row, o) in w.chunks_exact(row_bytes).zip(out.iter_mut()) {
                let mut acc = _mm256_setzero_ps();
                for s in 0..ns {
                    // In bounds: checked above.
                    let bp = row.as_ptr().add(s * BLOCK_BYTES);
                    let isum = _mm256_cvtepi32_ps(int_dots(bp, qs.add(256 * s)));
                    let dw = _mm256_set1_ps(half_to_f32(read_u16(bp.add(208))));
                    // fma(dw * da, isum, lane), as `fold_scaled`.
                    acc = _mm256_fmadd_ps(_mm256_mul_ps(dw, load_ps(d.add(8 * s))), isum, acc);
                }
                *o = tree8_ps(acc);
            }
        }
    }
}
