//! Block types computed through their decoded form: each 32-value block
//! decodes to small integers plus the float terms of one multi-row
//! [`Fold`], and every kernel (scalar, AVX2) works from that decode with the
//! shared micro-kernels of [`multi_row`](super::multi_row).
//!
//! A type is then one decoder beside its reference dequantizer; its dot
//! products are the tested micro-kernels', so the scalar and AVX2 paths agree
//! bit for bit by construction. Decoding is scalar code: these types trade
//! some speed on one activation row (decode) for a small, uniform
//! implementation. `matmul` runs even one activation row through the
//! multi-row kernel for them.

use super::multi_row::{Decoded, Fold, MultiRow, WGroup};
use std::marker::PhantomData;

/// A block type defined by how its blocks decode.
pub(crate) trait BlockDecode {
    /// How a decoded block's exact integer dot becomes a float term.
    const FOLD: Fold;
    /// Whether decoded values are signed (dotted with the sign trick).
    const SIGNED: bool;
    /// Steps of `maddubs` pair sums accumulated before widening: a divisor
    /// of 8 (of 4 for `Q6` and `Q2` folds, whose scales change every 4
    /// steps) with `steps * 2 * max|v| * 127 <= 32767`, see
    /// [`multi_row`](super::multi_row).
    const STEPS: usize;
    /// Values in one storage block: 32, or 256 for super-blocks.
    const BLOCK_LEN: usize;
    /// Bytes in one storage block.
    const BLOCK_BYTES: usize;

    /// Decodes one storage block (`BLOCK_BYTES` long) into its `BLOCK_LEN /
    /// 32` blocks of 32 values.
    fn decode(block: &[u8], out: &mut [Decoded]);
}

/// The multi-row kernel pieces of a [`BlockDecode`] type.
pub(crate) struct ByDecode<T>(PhantomData<T>);

impl<T: BlockDecode> MultiRow for ByDecode<T> {
    const FOLD: Fold = T::FOLD;
    const SIGNED: bool = T::SIGNED;
    const STEPS: usize = T::STEPS;
    const OFFSET: i32 = 0;

    fn row_bytes(nb: usize) -> usize {
        nb / (T::BLOCK_LEN / 32) * T::BLOCK_BYTES
    }

    fn decode_row(row: &[u8], out: &mut [Decoded]) {
        let per = T::BLOCK_LEN / 32;
        for (block, o) in row
            .chunks_exact(T::BLOCK_BYTES)
            .zip(out.chunks_exact_mut(per))
        {
            T::decode(block, o);
        }
    }

    /// # Safety
    /// As [`MultiRow::pack_group`]: AVX2, FMA and F16C available; `row`
    /// covers `nb` blocks and `8 * g < nb`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn pack_group(row: *const u8, g: usize, nb: usize, out: &mut WGroup) {
        let per = T::BLOCK_LEN / 32;
        let m = (nb - 8 * g).min(8);
        let first = 8 * g / per;
        let count = m.div_ceil(per);
        // SAFETY: blocks `8g..8g + m` lie in the row of `nb` blocks the
        // caller vouches for; storage blocks never straddle a group (`per`
        // is 1 or 8).
        let bytes = unsafe {
            std::slice::from_raw_parts(row.add(first * T::BLOCK_BYTES), count * T::BLOCK_BYTES)
        };
        let mut dec = [Decoded::default(); 8];
        for (k, block) in bytes.chunks_exact(T::BLOCK_BYTES).enumerate() {
            T::decode(block, &mut dec[k * per..(k + 1) * per]);
        }
        // SAFETY: AVX2 is available (this function's contract).
        unsafe { avx2::pack_decoded(&dec, m, T::SIGNED, out) }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::super::multi_row::{store_group, Decoded, WGroup};
    use std::arch::x86_64::*;

    /// Packs 8 decoded blocks (the first `m` valid, the rest zero) into `out`
    /// for the AVX2 micro-kernel: magnitudes in `u` and the values in `s`
    /// for signed types, the values in `u` for unsigned ones.
    ///
    /// # Safety
    /// AVX2, FMA and F16C available.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn pack_decoded(
        dec: &[Decoded; 8],
        m: usize,
        signed: bool,
        out: &mut WGroup,
    ) {
        let mut u = [_mm256_setzero_si256(); 8];
        let mut s = [_mm256_setzero_si256(); 8];
        for (j, d) in dec.iter().enumerate() {
            // SAFETY: `d.v` is 32 bytes.
            let v = unsafe { _mm256_loadu_si256(d.v.as_ptr().cast()) };
            s[j] = v;
            u[j] = if signed { _mm256_abs_epi8(v) } else { v };
            out.f0[j] = d.f0;
            out.f1[j] = d.f1;
            for h in 0..2 {
                out.sc[h][2 * j] = d.sc[h] as i16;
                out.sc[h][2 * j + 1] = d.sc[h] as i16;
                out.mn[h][j] = d.mn[h] as i32;
            }
        }
        // SAFETY: `out.u` and `out.s` are 256 bytes each.
        unsafe {
            store_group(&u, m, out.u.as_mut_ptr());
            if signed {
                store_group(&s, m, out.s.as_mut_ptr().cast());
            }
        }
    }
}
