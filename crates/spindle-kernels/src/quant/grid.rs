//! Reading i-quant codebook rows ([`iq_grids`](super::iq_grids)) and sign
//! bits: what the IQ1/IQ2/IQ3 block types share.

/// Value `i` of a packed grid row (one signed byte per value).
#[inline]
pub(crate) fn value(row: u64, i: usize) -> i8 {
    (row >> (8 * i)) as u8 as i8
}

/// `magnitude`, negated when bit `i` of `signs` is set.
#[inline]
pub(crate) fn signed(magnitude: i8, signs: u8, i: usize) -> i8 {
    if (signs >> i) & 1 == 1 {
        -magnitude
    } else {
        magnitude
    }
}

/// A dequantized grid value as gguf-py computes it: `(scale * magnitude) *
/// sign`, the sign applied exactly.
#[inline]
pub(crate) fn scaled(scale: f32, magnitude: i8, signs: u8, i: usize) -> f32 {
    let v = scale * magnitude as f32;
    if (signs >> i) & 1 == 1 {
        -v
    } else {
        v
    }
}

/// AVX2: 32 values from 4 grid rows of 8 (row `k` gives values `8k..8k +
/// 8`), each negated where bit `l % 8` of `signs[l / 8]` is set.
///
/// # Safety
/// AVX2, FMA and F16C available.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn signed_rows_avx2(
    rows: [u64; 4],
    signs: [u8; 4],
) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    let mag = _mm256_set_epi64x(
        rows[3] as i64,
        rows[2] as i64,
        rows[1] as i64,
        rows[0] as i64,
    );
    let spread = |s: u8| (s as u64).wrapping_mul(0x0101_0101_0101_0101) as i64;
    let s = _mm256_set_epi64x(
        spread(signs[3]),
        spread(signs[2]),
        spread(signs[1]),
        spread(signs[0]),
    );
    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let negative = _mm256_cmpeq_epi8(_mm256_and_si256(s, bit), bit);
    // -1 where negated, +1 elsewhere.
    _mm256_sign_epi8(mag, _mm256_or_si256(negative, _mm256_set1_epi8(1)))
}
