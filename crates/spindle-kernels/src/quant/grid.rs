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
