// One file (about 950 lines) on purpose: the layout's definition (`Spec`,
// its planes), the rewrite into it and back, and the VNNI code that reads
// it (group unpacking for the multi-row tiles, the one-row kernel) are one
// contract: a change to where a plane lies is made and reviewed in all of
// them at once, and the scalar rewrite beside the SIMD one must produce the
// same bytes.

//! The vertical weight layout: a quantized matrix rewritten once, at load,
//! into the order the VNNI multi-row kernel reads, in the same bytes.
//!
//! Every multi-row matmul used to repack each weight tile from GGUF order
//! into step vectors ([`WGroup`]) on every call: for the few activation rows
//! of a decode batch or a speculative tree, that repacking cost more than the
//! products (docs/PERF.md §36, §39). The vertical layout stores each group of
//! 8 blocks (a K-quant super-block, or 8 blocks of 32; a row's last 4
//! blocks as a half group) so that its step vectors come out of a load and a
//! mask:
//!
//! - step `k` of a full group holds, at byte `4j + i`, value `4k + i` of block
//!   `j` (8 steps); of a half group, at byte `8j + i`, value `8k + i` (4
//!   steps), the layouts of [`WGroup::u`];
//! - a value's unsigned form `u` (`s + 128` for Q8_0, the stored nibble or
//!   5/6-bit value for the others) is split into planes: a byte plane (8-bit
//!   `u`), a nibble plane (bits 0..4: vector `v` of 32 bytes holds step `v`
//!   in its low nibbles and step `v + steps / 2` in its high ones), a bit
//!   plane (bit 4: one little-endian `u32` mask per step) or a crumb plane
//!   (bits 4..6: vector `v` holds steps `4v..4v + 4`, two bits each);
//! - the scales stay where they are in a K-quant super-block; a group of
//!   32-value blocks puts its `m` f16 scales first, then its planes.
//!
//! The bytes are a permutation of the GGUF bytes (sizes equal, nothing
//! lost: [`from_vertical`] gives the file's bytes back), so the rewrite
//! happens in the model's own resident copy and memory does not double.
//! Results are bit for bit those of the GGUF layout: the same integers reach
//! the same folds. Only the VNNI kernel reads the layout; any other ISA (or
//! activation rounding) asked to multiply a vertical matrix gets the GGUF
//! bytes back first (`matmul`, slow but exact: tests switch ISAs on one
//! loaded model).

use super::multi_row::WGroup;
use crate::error::KernelError;
use spindle_formats::GgmlType;

/// Where a type's value bits above the nibble go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum High {
    /// 8-bit values in a byte plane (Q8_0).
    Bytes,
    /// 4-bit values: nibbles only.
    None,
    /// Bit 4 in a bit plane (Q5_0, Q5_K).
    Bit,
    /// Bits 4..6 in a crumb plane (Q6_K).
    Crumbs,
}

/// A type's vertical layout.
#[derive(Debug, Clone, Copy)]
struct Spec {
    ty: GgmlType,
    /// Bytes of a GGUF block of 32 values; 0 for K-quants.
    block32: usize,
    /// Bytes of a K-quant super-block; 0 for 32-value blocks.
    super_bytes: usize,
    high: High,
}

impl Spec {
    #[inline(always)]
    fn of(ty: GgmlType) -> Option<Spec> {
        let b32 = |block32, high| Spec {
            ty,
            block32,
            super_bytes: 0,
            high,
        };
        let k = |super_bytes, high| Spec {
            ty,
            block32: 0,
            super_bytes,
            high,
        };
        Some(match ty {
            GgmlType::Q8_0 => b32(34, High::Bytes),
            GgmlType::Q4_0 => b32(18, High::None),
            GgmlType::Q5_0 => b32(22, High::Bit),
            GgmlType::Q4_K => k(144, High::None),
            GgmlType::Q5_K => k(176, High::Bit),
            GgmlType::Q6_K => k(210, High::Crumbs),
            _ => return None,
        })
    }

    /// Offsets in a vertical group of `m` blocks of the main plane (bytes
    /// or nibbles) and of the high plane (bit or crumb).
    #[inline(always)]
    fn planes(self, m: usize) -> (usize, usize) {
        match self.ty {
            GgmlType::Q8_0 | GgmlType::Q4_0 => (2 * m, 0),
            GgmlType::Q5_0 => (6 * m, 2 * m),
            GgmlType::Q4_K => (16, 0),
            GgmlType::Q5_K => (48, 16),
            // Q6_K.
            _ => (0, 128),
        }
    }

    /// Bytes of a group of `m` blocks of 32.
    #[inline(always)]
    fn group_bytes(self, m: usize) -> usize {
        if self.block32 > 0 {
            m * self.block32
        } else {
            self.super_bytes
        }
    }
}

/// Where a vertical group's planes lie, for kernels that read them as they
/// are: the high bits' kind, the offsets of the main plane (bytes or
/// nibbles) and of the high plane in a group of `m` blocks, and the bytes
/// of a full group (every group before a row's last is one).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Planes {
    pub high: High,
    pub main: usize,
    pub high_at: usize,
    pub full_group_bytes: usize,
}

/// [`Planes`] of a vertical type's group of `m` (8, or 4 for a half group)
/// blocks; `None` for other types.
pub(crate) fn planes_of(ty: GgmlType, m: usize) -> Option<Planes> {
    let spec = Spec::of(ty)?;
    let (main, high_at) = spec.planes(m);
    Some(Planes {
        high: spec.high,
        main,
        high_at,
        full_group_bytes: spec.group_bytes(8),
    })
}

/// Whether a matrix of `ty` with rows of `cols` values can be stored
/// vertically: a supported type whose rows are whole groups of 8 blocks of
/// 32, or end in a half group of 4.
pub fn vertical_supported(ty: GgmlType, cols: usize) -> bool {
    let Some(spec) = Spec::of(ty) else {
        return false;
    };
    if cols == 0 || !cols.is_multiple_of(32) {
        return false;
    }
    if spec.block32 == 0 {
        return cols.is_multiple_of(256);
    }
    matches!((cols / 32) % 8, 0 | 4)
}

/// The groups of a row of `nb` blocks: (first block, blocks in the group).
fn groups(nb: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..nb.div_ceil(8)).map(move |g| (8 * g, (nb - 8 * g).min(8)))
}

/// Step and byte of value `l` of block `j` in a group of `m` blocks.
fn step_pos(m: usize, j: usize, l: usize) -> (usize, usize) {
    if m == 8 {
        (l / 4, 4 * j + l % 4)
    } else {
        (l / 8, 8 * j + l % 8)
    }
}

/// Reads (`set == None`) or writes bits `shift..shift + width` of byte `i`.
fn bits(bytes: &mut [u8], i: usize, shift: u32, width: u32, set: Option<u8>) -> u8 {
    let mask = ((1u32 << width) - 1) as u8;
    if let Some(v) = set {
        bytes[i] = (bytes[i] & !(mask << shift)) | ((v & mask) << shift);
    }
    (bytes[i] >> shift) & mask
}

/// The unsigned value `u` of value `l` of block `j` of a GGUF group
/// (`set`: writes it instead).
fn gguf_value(ty: GgmlType, group: &mut [u8], j: usize, l: usize, set: Option<u8>) -> u8 {
    let lo = set.map(|u| u & 15);
    let hi = set.map(|u| u >> 4);
    match ty {
        GgmlType::Q8_0 => bits(group, 34 * j + 2 + l, 0, 8, set.map(|u| u ^ 0x80)) ^ 0x80,
        GgmlType::Q4_0 => bits(group, 18 * j + 2 + l % 16, 4 * (l / 16) as u32, 4, set),
        GgmlType::Q5_0 => {
            let n = bits(group, 22 * j + 6 + l % 16, 4 * (l / 16) as u32, 4, lo);
            let b = bits(group, 22 * j + 2 + l / 8, (l % 8) as u32, 1, hi);
            n | b << 4
        }
        GgmlType::Q4_K => bits(group, 16 + 32 * (j / 2) + l, 4 * (j % 2) as u32, 4, set),
        GgmlType::Q5_K => {
            let n = bits(group, 48 + 32 * (j / 2) + l, 4 * (j % 2) as u32, 4, lo);
            let b = bits(group, 16 + l, j as u32, 1, hi);
            n | b << 4
        }
        // Q6_K: value n of 256 in half h, quarter q of the half.
        _ => {
            let n = 32 * j + l;
            let (h, q, ll) = (n / 128, (n % 128) / 32, n % 32);
            let low = bits(group, 64 * h + ll + 32 * (q % 2), 4 * (q / 2) as u32, 4, lo);
            let high = bits(group, 128 + 32 * h + ll, 2 * q as u32, 2, hi);
            low | high << 4
        }
    }
}

/// The unsigned value `u` of value `l` of block `j` of a vertical group of
/// `m` blocks (`set`: writes it instead).
fn vertical_value(
    spec: Spec,
    group: &mut [u8],
    m: usize,
    (j, l): (usize, usize),
    set: Option<u8>,
) -> u8 {
    let (main, high) = spec.planes(m);
    let (k, pos) = step_pos(m, j, l);
    if spec.high == High::Bytes {
        return bits(group, main + 32 * k + pos, 0, 8, set);
    }
    let half = m / 2;
    let lo = bits(
        group,
        main + 32 * (k % half) + pos,
        4 * (k / half) as u32,
        4,
        set.map(|u| u & 15),
    );
    let hi = set.map(|u| u >> 4);
    let top = match spec.high {
        High::Bit => bits(group, high + 4 * k + pos / 8, (pos % 8) as u32, 1, hi),
        High::Crumbs => bits(group, high + 32 * (k / 4) + pos, 2 * (k % 4) as u32, 2, hi),
        _ => 0,
    };
    lo | top << 4
}

/// Copies what is not a value from a GGUF group to a vertical one
/// (`to_vertical`) or back: the blocks' scales.
fn copy_scales(spec: Spec, m: usize, src: &[u8], dst: &mut [u8], to_vertical: bool) {
    if spec.block32 > 0 {
        for j in 0..m {
            let (g, v) = (spec.block32 * j, 2 * j);
            let (from, to) = if to_vertical { (g, v) } else { (v, g) };
            dst[to..to + 2].copy_from_slice(&src[from..from + 2]);
        }
    } else {
        let range = match spec.high {
            // Q6_K: scales and d after the values.
            High::Crumbs => 192..210,
            _ => 0..16,
        };
        dst[range.clone()].copy_from_slice(&src[range]);
    }
}

/// Checks the shapes of a conversion; returns the type's spec and the row
/// bytes.
fn checked(
    ty: GgmlType,
    cols: usize,
    src_len: usize,
    dst_len: usize,
) -> Result<(Spec, usize), KernelError> {
    let spec = Spec::of(ty)
        .filter(|_| vertical_supported(ty, cols))
        .ok_or_else(|| {
            KernelError::unsupported(format!("vertical layout for {ty} rows of {cols}"))
        })?;
    let row_bytes = super::checked_bytes(ty, cols, "vertical row")?;
    if src_len != dst_len || !src_len.is_multiple_of(row_bytes) {
        return Err(KernelError::size("vertical matrix bytes", dst_len, src_len));
    }
    Ok((spec, row_bytes))
}

/// Rewrites whole rows of `cols` values of `ty` between the two layouts,
/// value by value (the reference, and the way back).
fn convert_scalar(
    ty: GgmlType,
    cols: usize,
    src: &[u8],
    dst: &mut [u8],
    to_vertical: bool,
) -> Result<(), KernelError> {
    let (spec, row_bytes) = checked(ty, cols, src.len(), dst.len())?;
    let nb = cols / 32;
    let mut from = vec![0u8; row_bytes];
    for (s_row, d_row) in src
        .chunks_exact(row_bytes)
        .zip(dst.chunks_exact_mut(row_bytes))
    {
        from.copy_from_slice(s_row);
        let mut at = 0;
        for (_, m) in groups(nb) {
            let len = spec.group_bytes(m);
            let (s, d) = (&mut from[at..at + len], &mut d_row[at..at + len]);
            copy_scales(spec, m, s, d, to_vertical);
            let blocks = if spec.block32 > 0 { m } else { 8 };
            for j in 0..blocks {
                for l in 0..32 {
                    let u = if to_vertical {
                        gguf_value(ty, s, j, l, None)
                    } else {
                        vertical_value(spec, s, m, (j, l), None)
                    };
                    if to_vertical {
                        vertical_value(spec, d, m, (j, l), Some(u));
                    } else {
                        gguf_value(ty, d, j, l, Some(u));
                    }
                }
            }
            at += len;
        }
    }
    Ok(())
}

/// The scalar reference of [`to_vertical`]: `dst` = `src` (GGUF rows of
/// `cols` values of `ty`) in the vertical layout.
pub fn to_vertical_scalar(
    ty: GgmlType,
    cols: usize,
    src: &[u8],
    dst: &mut [u8],
) -> Result<(), KernelError> {
    convert_scalar(ty, cols, src, dst, true)
}

/// `dst` = the GGUF bytes of the vertical rows `src`.
pub fn from_vertical(
    ty: GgmlType,
    cols: usize,
    src: &[u8],
    dst: &mut [u8],
) -> Result<(), KernelError> {
    if ty != GgmlType::Q8_0 {
        return convert_scalar(ty, cols, src, dst, false);
    }
    // Q8_0 block by block: an ISA switched on a loaded model converts the
    // whole output head (262,144 rows) back on every call.
    let (_, row_bytes) = checked(ty, cols, src.len(), dst.len())?;
    let nb = cols / 32;
    for (s_row, d_row) in src
        .chunks_exact(row_bytes)
        .zip(dst.chunks_exact_mut(row_bytes))
    {
        for (b, blk) in d_row.chunks_exact_mut(34).enumerate() {
            let (scale, q) = q8_0_vertical_block(s_row, nb, b);
            blk[..2].copy_from_slice(&scale.to_le_bytes());
            for (o, q) in blk[2..].iter_mut().zip(q) {
                *o = q as u8;
            }
        }
    }
    Ok(())
}

/// Block `b` of a Q8_0 row in the vertical layout (`nb` blocks): its f16
/// scale's bits and its 32 values, as the file's block holds them. For
/// readers that go block by block (the head's screen, built from 262,144
/// rows, where [`from_vertical`]'s value-by-value reference is too slow).
///
/// # Panics
/// If the row is shorter than `nb` Q8_0 blocks or `b >= nb`.
pub fn q8_0_vertical_block(row: &[u8], nb: usize, b: usize) -> (u16, [i8; 32]) {
    assert!(
        b < nb && row.len() >= 34 * nb,
        "Q8_0 vertical block {b} of {nb}"
    );
    let (g, j) = (b / 8, b % 8);
    let m = (nb - 8 * g).min(8);
    let group = &row[34 * 8 * g..34 * (8 * g + m)];
    let scale = u16::from_le_bytes([group[2 * j], group[2 * j + 1]]);
    let mut q = [0i8; 32];
    for (l, v) in q.iter_mut().enumerate() {
        let (k, at) = step_pos(m, j, l);
        *v = (group[2 * m + 32 * k + at] ^ 0x80) as i8;
    }
    (scale, q)
}

/// Dequantizes one row of `cols` values of `ty` stored in the vertical
/// layout into `out` (the embedding lookup of a head rewritten with the
/// layers: its rows are read one token at a time).
pub fn dequantize_vertical_row(
    ty: GgmlType,
    cols: usize,
    row: &[u8],
    out: &mut [f32],
) -> Result<(), KernelError> {
    if ty == GgmlType::Q8_0 && vertical_supported(ty, cols) && row.len() == 34 * (cols / 32) {
        if out.len() != cols {
            return Err(KernelError::size("dequantized row", cols, out.len()));
        }
        let nb = cols / 32;
        for (b, o) in out.chunks_exact_mut(32).enumerate() {
            let (scale, q) = q8_0_vertical_block(row, nb, b);
            let d = half::f16::from_bits(scale).to_f32();
            for (o, &q) in o.iter_mut().zip(&q) {
                *o = d * q as f32;
            }
        }
        return Ok(());
    }
    let mut gguf = vec![0u8; row.len()];
    from_vertical(ty, cols, row, &mut gguf)?;
    super::dequantize(ty, &gguf, out)
}

/// Rewrites the GGUF rows in `data` (rows of `cols` values of `ty`) into the
/// vertical layout, in place.
pub fn to_vertical(ty: GgmlType, cols: usize, data: &mut [u8]) -> Result<(), KernelError> {
    let (_, row_bytes) = checked(ty, cols, data.len(), data.len())?;
    #[cfg(target_arch = "x86_64")]
    let fast = crate::simd::Isa::Avx512Vnni.is_available();
    #[cfg(not(target_arch = "x86_64"))]
    let fast = false;
    let mut row = vec![0u8; row_bytes];
    for r in data.chunks_exact_mut(row_bytes) {
        row.copy_from_slice(r);
        #[cfg(target_arch = "x86_64")]
        if fast {
            // SAFETY: the ISA was checked; `row` and `r` are one whole row.
            unsafe { simd::row_to_vertical(ty, cols, &row, r) };
            continue;
        }
        convert_scalar(ty, cols, &row, r, true)?;
    }
    Ok(())
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod simd {
    //! Unpacking vertical groups into [`WGroup`]s for the VNNI kernel, and
    //! the fast rewrite at load.

    use super::{groups, High, Spec, WGroup};
    use crate::quant::multi_row::{pack_act_group, ActGroup, Fold, MultiRow, QuantJob};
    use crate::quant::q8_act::QuantizedActs;
    use crate::simd::avx2::tree8_ps;
    use spindle_formats::GgmlType;
    use std::arch::x86_64::*;

    /// A vertical type's pieces for the VNNI kernel.
    pub(crate) trait VerticalType: MultiRow {
        const TY: GgmlType;
        /// Added (mod 256) to the stored `u` to give the kernel's unsigned
        /// operand (Q6_K: `u - 32 + 128`).
        const VNNI_ADD: i8 = 0;
        /// Whether a row may end in a half group (the 32-value types; a
        /// K-quant row is whole super-blocks).
        const HALF_GROUPS: bool = false;

        /// The group's float terms (and Q6_K's scales) into `out`, from the
        /// vertical group at `p` of `m` blocks.
        ///
        /// # Safety
        /// AVX2, FMA and F16C available; `p` covers the group.
        unsafe fn scales(p: *const u8, m: usize, out: &mut WGroup);
    }

    /// Writes the step vectors of the vertical group at `p` of `M` blocks
    /// (`M` steps: 8, or 4 for a half group) to `dst + 32k`, each its stored
    /// `u` plus `add` (mod 256). Each vector is stored as soon as it is
    /// made: an array of them returned by value was copied through the
    /// stack with 64-byte moves over 32-byte stores, which stalled on
    /// store forwarding.
    ///
    /// # Safety
    /// AVX2, FMA, F16C and AVX-512 F/BW/VL available; `p` covers the group
    /// and `dst..dst + 32m` is writable.
    // A target-feature function, not `inline(always)`: the closures below
    // inherit its features, so their intrinsics inline (in a plain
    // function each `_mm256_maskz_mov_epi8` was a call: 12% of an AMX
    // prompt matmul, 6% of a VNNI one-row one).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
    unsafe fn unpack_steps<T: VerticalType, const M: usize>(p: *const u8, add: i8, dst: *mut u8) {
        unsafe {
            let m = M;
            let spec = Spec::of(T::TY).unwrap_or_else(|| unreachable!("checked vertical type"));
            let (main, high) = spec.planes(m);
            let load = |o: usize| _mm256_loadu_si256(p.add(o).cast());
            let addv = _mm256_set1_epi8(add);
            let put = |k: usize, s: __m256i| {
                let s = if add != 0 {
                    _mm256_add_epi8(s, addv)
                } else {
                    s
                };
                _mm256_storeu_si256(dst.add(32 * k).cast(), s);
            };
            if spec.high == High::Bytes {
                for k in 0..m {
                    put(k, load(main + 32 * k));
                }
                return;
            }
            let low4 = _mm256_set1_epi8(0x0F);
            let half = m / 2;
            // Bits above the nibble of step `k`.
            let top = |k: usize| -> __m256i {
                match spec.high {
                    High::Bit => {
                        let mask = std::ptr::read_unaligned(p.add(high + 4 * k).cast::<u32>());
                        _mm256_maskz_mov_epi8(mask, _mm256_set1_epi8(0x10))
                    }
                    High::Crumbs => {
                        let c = load(high + 32 * (k / 4));
                        let at = match k % 4 {
                            0 => _mm256_slli_epi16(c, 4),
                            1 => _mm256_slli_epi16(c, 2),
                            2 => c,
                            _ => _mm256_srli_epi16(c, 2),
                        };
                        _mm256_and_si256(at, _mm256_set1_epi8(0x30))
                    }
                    _ => _mm256_setzero_si256(),
                }
            };
            for k in 0..half {
                let x = load(main + 32 * k);
                let lo = _mm256_and_si256(x, low4);
                let hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), low4);
                put(k, _mm256_or_si256(lo, top(k)));
                put(k + half, _mm256_or_si256(hi, top(k + half)));
            }
        }
    }

    macro_rules! block32_vertical {
        ($($T:ty => $ty:expr),*) => {$(
            impl VerticalType for $T {
                const TY: GgmlType = $ty;
                const HALF_GROUPS: bool = true;
                /// # Safety
                /// As [`VerticalType::scales`].
                #[inline]
                #[target_feature(enable = "avx2,fma,f16c")]
                unsafe fn scales(p: *const u8, m: usize, out: &mut WGroup) {
                    // SAFETY: as the trait's contract.
                    unsafe { block32_scales(p, m, out) }
                }
            }
        )*};
    }
    use crate::quant::{q4_0::Q4_0, q4_k::Q4K, q5_0::Q5_0, q5_k::Q5K, q6_k::Q6K, q8_0::Q8_0};
    block32_vertical!(Q8_0 => GgmlType::Q8_0, Q4_0 => GgmlType::Q4_0, Q5_0 => GgmlType::Q5_0);

    macro_rules! k_min_vertical {
        ($($T:ty => $ty:expr),*) => {$(
            impl VerticalType for $T {
                const TY: GgmlType = $ty;
                /// # Safety
                /// As [`VerticalType::scales`].
                #[inline]
                #[target_feature(enable = "avx2,fma,f16c")]
                unsafe fn scales(p: *const u8, _m: usize, out: &mut WGroup) {
                    // SAFETY: as the trait's contract; Q4_K and Q5_K share
                    // the header, where GGUF has it.
                    unsafe { crate::quant::q4_k::avx2::k_params(p, out) }
                }
            }
        )*};
    }
    k_min_vertical!(Q4K => GgmlType::Q4_K, Q5K => GgmlType::Q5_K);

    impl VerticalType for Q6K {
        const TY: GgmlType = GgmlType::Q6_K;
        const VNNI_ADD: i8 = 96;
        /// # Safety
        /// As [`VerticalType::scales`].
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn scales(p: *const u8, _m: usize, out: &mut WGroup) {
            // SAFETY: as the trait's contract; scales and `d` are where GGUF
            // has them.
            unsafe { crate::quant::q6_k::avx2::set_scales(p, out) }
        }
    }

    /// Unpacks group `g` of the vertical row at `row` (`nb` blocks) into
    /// `out` as [`MultiRow::pack_group_unsigned`] packs the GGUF row: the
    /// kernel's unsigned operand `u`, `f0`, `f1`, `sc`.
    ///
    /// # Safety
    /// AVX2, FMA, F16C and AVX-512 F/BW/VL available; `row` covers `nb`
    /// blocks (a whole vertical row) and `8 * g < nb`.
    #[inline(always)]
    pub(crate) unsafe fn unpack_group<T: VerticalType>(
        row: *const u8,
        g: usize,
        nb: usize,
        out: &mut WGroup,
    ) {
        // SAFETY: the caller's promises.
        unsafe {
            unpack_group_adding::<T>(row, g, nb, T::VNNI_ADD, out);
        }
    }

    /// [`unpack_group`] with `add` (mod 256) added to the stored `u`
    /// instead of the VNNI operand's [`VerticalType::VNNI_ADD`] (the AMX
    /// kernel's signed values). Whether the group is a half group.
    ///
    /// # Safety
    /// As [`unpack_group`].
    #[inline(always)]
    pub(crate) unsafe fn unpack_group_adding<T: VerticalType>(
        row: *const u8,
        g: usize,
        nb: usize,
        add: i8,
        out: &mut WGroup,
    ) -> bool {
        unsafe {
            let spec = Spec::of(T::TY).unwrap_or_else(|| unreachable!("checked vertical type"));
            // Groups before `g` are full ones.
            let p = row.add(g * spec.group_bytes(8));
            // A constant step count for each form, so the loops unroll.
            if !T::HALF_GROUPS || nb - 8 * g >= 8 {
                unpack_steps::<T, 8>(p, add, out.u.as_mut_ptr());
                T::scales(p, 8, out);
                false
            } else {
                unpack_steps::<T, 4>(p, add, out.u.as_mut_ptr());
                T::scales(p, 4, out);
                true
            }
        }
    }

    /// Block32 types: the `m` f16 scales at the group's start as `f0`, the
    /// rest 0 (as `pack_group_unsigned` sets them), in one vector store.
    ///
    /// # Safety
    /// AVX2 and F16C available; `p..p + 2m` readable, `m` 8 or 4.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn block32_scales(p: *const u8, m: usize, out: &mut WGroup) {
        unsafe {
            let h = if m == 8 {
                _mm_loadu_si128(p.cast())
            } else {
                _mm_loadl_epi64(p.cast())
            };
            _mm256_storeu_ps(out.f0.as_mut_ptr(), _mm256_cvtph_ps(h));
        }
    }

    /// Packs activation row 0 of `acts` for [`rows_vertical`]: its groups
    /// as the multi-row kernels pack them, `corr` holding what starts the
    /// integer sums: `-offset * bsum` for the 32-value types (the offset of
    /// the kernel's unsigned operand), for Q6_K `-128 *` the sums of each
    /// block's values 0..16 (those of 16..32 follow from `asum`).
    ///
    /// # Safety
    /// AVX2, FMA and F16C available.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn pack_one_row<T: VerticalType>(
        acts: &QuantizedActs,
        out: &mut Vec<ActGroup>,
    ) {
        unsafe {
            out.clear();
            let Some(a) = acts.row(0) else { return };
            let offset = if T::SIGNED { 128 } else { T::OFFSET };
            let nb = a.d.len();
            for g in 0..nb.div_ceil(8) {
                let mut ag = ActGroup::ZERO;
                pack_act_group(a, g, -offset, &mut ag);
                if matches!(T::FOLD, Fold::Q6) {
                    for (j, c) in ag.corr.iter_mut().enumerate().take(8.min(nb - 8 * g)) {
                        let b = 8 * g + j;
                        let low = &a.qs[32 * b..32 * b + 16];
                        *c = -offset * low.iter().map(|&q| q as i32).sum::<i32>();
                    }
                }
                out.push(ag);
            }
        }
    }

    /// One-row matmul on vertical weights, rows `r0..r1` against the row
    /// [`pack_one_row`] packed into `job.packed`, by `vpdpbusd ymm` on the
    /// step vectors (a group's 8 block dots come out in their own lanes, no
    /// transposition), with the float operations of the multi-row kernels
    /// (which equal the GGUF one-row kernels').
    ///
    /// # Safety
    /// AVX2, FMA, F16C and AVX-512 F/BW/VL/VNNI available; `job.data`
    /// holds vertical rows; `job.packed` is `pack_one_row::<T>` of the
    /// activations; the caller owns outputs `r0..r1` of activation row 0.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(crate) unsafe fn rows_vertical<T: VerticalType>(
        job: &QuantJob<'_>,
        r0: usize,
        r1: usize,
        _i0: usize,
        _i1: usize,
    ) {
        unsafe {
            let nb = job.cols / 32;
            assert!(
                job.row_bytes == T::row_bytes(nb)
                    && job.packed.len() == nb.div_ceil(8)
                    && job.data.len() >= r1 * job.row_bytes,
                "vertical one-row kernel: inconsistent shapes"
            );
            let out = job.out.slice(r0, r1 - r0);
            let w = &job.data[..r1 * job.row_bytes];
            let mut wg = WGroup::ZERO;
            // No rows asked for ahead, as the GGUF one-row kernels of the
            // 32-value types do: from the vertical layout, Q8_0 and Q5_0
            // rows streamed from memory at 13-14 GB/s a core with them (8,192
            // columns) and 24-29 without (docs/PERF.md §56).
            for (r, o) in (r0..r1).zip(out.iter_mut()) {
                *o = dot_row::<T>(w.as_ptr().add(r * job.row_bytes), nb, job.packed, &mut wg);
            }
        }
    }

    /// The dot of the vertical row at `row` (`nb` blocks) with the packed
    /// activation row `acts`; `wg` is scratch for one unpacked group.
    ///
    /// # Safety
    /// As [`rows_vertical`]; `row` covers a whole row.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn dot_row<T: VerticalType>(
        row: *const u8,
        nb: usize,
        acts: &[ActGroup],
        wg: &mut WGroup,
    ) -> f32 {
        unsafe {
            let spec = Spec::of(T::TY).unwrap_or_else(|| unreachable!("checked vertical type"));
            let full = spec.group_bytes(8);
            let mut lanes = _mm256_setzero_ps();
            let ahead = nb >= LONG_ROW_BLOCKS;
            for (g, ag) in acts.iter().enumerate() {
                let p = row.add(g * full);
                if ahead {
                    // A long row's activations (20 KB at 14,336 columns)
                    // fill most of L1, and weights streamed through L1
                    // pushed them out: such rows ran at half the rate of
                    // short ones (docs/PERF.md §51, §56). So their bytes are
                    // asked for two pages ahead into L2 only. (A prefetch
                    // never faults: past the matrix's end it is only wasted.)
                    let q = p.wrapping_add(PREFETCH_AHEAD);
                    for line in 0..full.div_ceil(64) {
                        _mm_prefetch::<_MM_HINT_T1>(q.wrapping_add(64 * line).cast());
                    }
                }
                lanes = if !T::HALF_GROUPS || nb - 8 * g >= 8 {
                    fold_group::<T, 8>(p, ag, wg, lanes)
                } else {
                    fold_group::<T, 4>(p, ag, wg, lanes)
                };
            }
            tree8_ps(lanes)
        }
    }

    /// Blocks of 32 from which a one-row call asks for its weights ahead
    /// (10,240 columns: the rows from which the kernel streams slower).
    const LONG_ROW_BLOCKS: usize = 320;
    /// How far ahead, in bytes: into L2, 8 KB streamed Q4_K and Q6_K long
    /// rows from DRAM at 28-31 GB/s a core against 22 at 4 KB (§56).
    const PREFETCH_AHEAD: usize = 8192;

    /// Folds the vertical group at `p` of `M` blocks (8, or a half group
    /// of 4) dotted with `act` into `lanes`, as the multi-row kernels do.
    ///
    /// # Safety
    /// As [`rows_vertical`]; `p` covers the group.
    #[inline(always)]
    unsafe fn fold_group<T: VerticalType, const M: usize>(
        p: *const u8,
        ag: &ActGroup,
        wg: &mut WGroup,
        lanes: __m256,
    ) -> __m256 {
        unsafe {
            let q6 = matches!(T::FOLD, Fold::Q6);
            unpack_steps::<T, M>(p, T::VNNI_ADD, wg.u.as_mut_ptr());
            T::scales(p, M, wg);
            let mut acc = [_mm256_setzero_si256(); 2];
            if q6 {
                // -128 * the half sums: of values 0..16 in `corr`, of 16..32
                // the block sum's rest.
                let low = _mm256_loadu_si256(ag.corr.as_ptr().cast());
                let all = _mm256_cvttps_epi32(_mm256_loadu_ps(ag.asum.as_ptr()));
                acc[0] = low;
                acc[1] = _mm256_sub_epi32(_mm256_mullo_epi32(all, _mm256_set1_epi32(-128)), low);
            }
            for k in 0..M {
                let h = if q6 { k / 4 } else { 0 };
                let wv = _mm256_loadu_si256(wg.u.as_ptr().add(32 * k).cast());
                let av = _mm256_loadu_si256(ag.qs.as_ptr().add(32 * k).cast());
                acc[h] = _mm256_dpbusd_epi32(acc[h], wv, av);
            }
            let mut isum = acc[0];
            if M < 8 {
                // Each block's two partial sums (64-bit lane j) to lane j.
                let pairs = _mm256_add_epi32(isum, _mm256_shuffle_epi32(isum, 0b10_11_00_01));
                isum =
                    _mm256_permutevar8x32_epi32(pairs, _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6));
            }
            if matches!(T::FOLD, Fold::Block32) && T::OFFSET + i32::from(T::SIGNED) != 0 {
                isum = _mm256_add_epi32(isum, _mm256_loadu_si256(ag.corr.as_ptr().cast()));
            }
            let da = _mm256_loadu_ps(ag.d.as_ptr());
            let f0 = _mm256_loadu_ps(wg.f0.as_ptr());
            let new = match T::FOLD {
                Fold::Block32 => {
                    _mm256_fmadd_ps(_mm256_mul_ps(f0, da), _mm256_cvtepi32_ps(isum), lanes)
                }
                Fold::KMin => {
                    let f1 = _mm256_loadu_ps(wg.f1.as_ptr());
                    let asum = _mm256_loadu_ps(ag.asum.as_ptr());
                    let inner =
                        _mm256_fmsub_ps(f0, _mm256_cvtepi32_ps(isum), _mm256_mul_ps(f1, asum));
                    _mm256_fmadd_ps(da, inner, lanes)
                }
                Fold::Q6 => {
                    let mut dot = _mm256_setzero_si256();
                    for (h, a) in acc.iter().enumerate() {
                        let sc = _mm256_loadu_si256(wg.sc[h].as_ptr().cast());
                        // Both int16 halves hold the scale: the high one,
                        // sign-extended.
                        let sc = _mm256_srai_epi32(sc, 16);
                        dot = _mm256_add_epi32(dot, _mm256_mullo_epi32(sc, *a));
                    }
                    _mm256_fmadd_ps(_mm256_mul_ps(f0, da), _mm256_cvtepi32_ps(dot), lanes)
                }
                Fold::Q2 => unreachable!("no vertical layout for Q2 folds"),
            };
            if M < 8 {
                // Lanes past the group's blocks keep their value.
                _mm256_blend_ps(lanes, new, 0b0000_1111)
            } else {
                new
            }
        }
    }

    /// Rewrites one GGUF row `src` into the vertical row `dst`.
    ///
    /// # Safety
    /// AVX2, FMA, F16C and AVX-512 F/BW/VL/VNNI available; `src` and `dst`
    /// are one whole row of `cols` values of `ty`, a vertical type.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(crate) unsafe fn row_to_vertical(ty: GgmlType, cols: usize, src: &[u8], dst: &mut [u8]) {
        unsafe {
            match ty {
                GgmlType::Q8_0 => row_to_vertical_of::<Q8_0>(cols, src, dst),
                GgmlType::Q4_0 => row_to_vertical_of::<Q4_0>(cols, src, dst),
                GgmlType::Q5_0 => row_to_vertical_of::<Q5_0>(cols, src, dst),
                GgmlType::Q4_K => row_to_vertical_of::<Q4K>(cols, src, dst),
                GgmlType::Q5_K => row_to_vertical_of::<Q5K>(cols, src, dst),
                GgmlType::Q6_K => row_to_vertical_of::<Q6K>(cols, src, dst),
                _ => unreachable!("checked vertical type"),
            }
        }
    }

    /// [`row_to_vertical`] for `T`: each group packed as the VNNI kernel
    /// reads it (the existing GGUF packing), then its `u` split into planes.
    ///
    /// # Safety
    /// As [`row_to_vertical`].
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn row_to_vertical_of<T: VerticalType>(cols: usize, src: &[u8], dst: &mut [u8]) {
        unsafe {
            let spec = Spec::of(T::TY).unwrap_or_else(|| unreachable!("checked vertical type"));
            let nb = cols / 32;
            let mut wg = WGroup::ZERO;
            for (g, (_, m)) in groups(nb).enumerate() {
                let at = g * spec.group_bytes(8);
                let len = spec.group_bytes(m);
                T::pack_group_unsigned(src.as_ptr(), g, nb, &mut wg);
                let d = &mut dst[at..at + len];
                super::copy_scales(spec, m, &src[at..at + len], d, true);
                let sub = _mm256_set1_epi8(T::VNNI_ADD);
                let mut v = [_mm256_setzero_si256(); 8];
                for (k, s) in v.iter_mut().enumerate().take(m) {
                    let u = _mm256_loadu_si256(wg.u.as_ptr().add(32 * k).cast());
                    *s = _mm256_sub_epi8(u, sub);
                }
                store_planes(spec, m, &v, d.as_mut_ptr());
            }
        }
    }

    /// Stores step vectors `v` (the stored `u`) of a group of `m` blocks as
    /// its planes at `p`.
    ///
    /// # Safety
    /// AVX2 and AVX-512 F/BW/VL available; `p` covers the group.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
    unsafe fn store_planes(spec: Spec, m: usize, v: &[__m256i; 8], p: *mut u8) {
        unsafe {
            let (main, high) = spec.planes(m);
            let store = |o: usize, x: __m256i| _mm256_storeu_si256(p.add(o).cast(), x);
            if spec.high == High::Bytes {
                for (k, s) in v.iter().enumerate().take(m) {
                    store(main + 32 * k, *s);
                }
                return;
            }
            let low4 = _mm256_set1_epi8(0x0F);
            let half = m / 2;
            for k in 0..half {
                let lo = _mm256_and_si256(v[k], low4);
                let hi = _mm256_slli_epi16(_mm256_and_si256(v[k + half], low4), 4);
                store(main + 32 * k, _mm256_or_si256(lo, hi));
            }
            match spec.high {
                High::Bit => {
                    for (k, s) in v.iter().enumerate().take(m) {
                        // Bit 4 of each byte, moved to bit 7.
                        let mask = _mm256_movemask_epi8(_mm256_slli_epi16(*s, 3)) as u32;
                        std::ptr::write_unaligned(p.add(high + 4 * k).cast::<u32>(), mask);
                    }
                }
                High::Crumbs => {
                    let three = _mm256_set1_epi8(0x03);
                    for h in 0..2 {
                        // Bits 4..6 of each step's bytes, as 0..4 (no byte
                        // reaches past bit 7 when shifted below).
                        let top =
                            |q: usize| _mm256_and_si256(_mm256_srli_epi16(v[4 * h + q], 4), three);
                        let c = _mm256_or_si256(
                            _mm256_or_si256(top(0), _mm256_slli_epi16(top(1), 2)),
                            _mm256_or_si256(
                                _mm256_slli_epi16(top(2), 4),
                                _mm256_slli_epi16(top(3), 6),
                            ),
                        );
                        store(high + 32 * h, c);
                    }
                }
                _ => {}
            }
        }
    }
}
