//! Finding corrupt weights: a NaN or an infinity in a block's scale (cheap:
//! two bytes a block, checked at load) or in any dequantized value (a full
//! scan, for `--check-weights`).

use super::{dequantize, f16_le};
use crate::error::KernelError;
use spindle_formats::GgmlType;

/// The first block of `src` (whole blocks of `ty`) whose f16 scale is NaN
/// or infinite, with that scale's value. A non-finite scale makes every
/// value of its block non-finite, and any logit it touches NaN.
pub fn first_bad_scale(ty: GgmlType, src: &[u8]) -> Option<(usize, f32)> {
    let offsets = super::registry::of(ty).scale_offsets;
    if offsets.is_empty() {
        return None;
    }
    src.chunks_exact(ty.block_bytes())
        .enumerate()
        .find_map(|(block, bytes)| {
            offsets.iter().find_map(|&o| {
                let bits = u16::from_le_bytes([bytes[o], bytes[o + 1]]);
                // All-ones exponent: an infinity or a NaN.
                (bits & 0x7c00 == 0x7c00).then(|| (block, f16_le([bytes[o], bytes[o + 1]])))
            })
        })
}

/// The first of the `n` values in `src` (of type `ty`) that dequantizes to
/// NaN or an infinity: its index and value.
pub fn first_non_finite(
    ty: GgmlType,
    src: &[u8],
    n: usize,
) -> Result<Option<(usize, f32)>, KernelError> {
    let expected = super::checked_bytes(ty, n, "weight scan")?;
    if src.len() != expected {
        return Err(KernelError::size(
            format!("weight scan {ty} source bytes"),
            expected,
            src.len(),
        ));
    }
    // A thousand blocks at a time, so the scan needs little memory.
    let per_chunk = ty.block_len() * 1024;
    let mut values = vec![0.0f32; per_chunk];
    for (c, bytes) in src.chunks(ty.block_bytes() * 1024).enumerate() {
        let len = bytes.len() / ty.block_bytes() * ty.block_len();
        dequantize(ty, bytes, &mut values[..len])?;
        if let Some(i) = values[..len].iter().position(|v| !v.is_finite()) {
            return Ok(Some((c * per_chunk + i, values[i])));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nan_or_infinite_scale_is_found_in_its_block() {
        for ty in GgmlType::ALL
            .into_iter()
            .filter(|&t| !super::super::registry::of(t).scale_offsets.is_empty())
        {
            let bb = ty.block_bytes();
            // Zeros are valid blocks of every type (scale 0.0).
            let data = vec![0u8; bb * 5];
            assert_eq!(first_bad_scale(ty, &data), None, "{ty}");
            assert_eq!(
                first_non_finite(ty, &data, 5 * ty.block_len()).unwrap(),
                None
            );
            for (bits, want_nan) in [
                (half::f16::NAN.to_bits(), true),
                (half::f16::INFINITY.to_bits(), false),
            ] {
                let mut d = data.clone();
                let o = super::super::registry::of(ty).scale_offsets[0];
                d[3 * bb + o..3 * bb + o + 2].copy_from_slice(&bits.to_le_bytes());
                let (block, value) = first_bad_scale(ty, &d).unwrap();
                assert_eq!(block, 3, "{ty}");
                assert_eq!(value.is_nan(), want_nan, "{ty}");
                // The full scan finds it too, in the same block (with the
                // quants all zero an infinite scale gives 0 * inf = NaN).
                let (i, v) = first_non_finite(ty, &d, 5 * ty.block_len())
                    .unwrap()
                    .unwrap();
                assert_eq!(i / ty.block_len(), 3, "{ty}");
                assert!(!v.is_finite());
            }
        }
    }

    #[test]
    fn the_full_scan_finds_a_non_finite_float_value_in_every_chunk_position() {
        let n = 1024 * 3 + 7;
        let mut data = vec![0u8; n * 2];
        assert_eq!(first_non_finite(GgmlType::F16, &data, n).unwrap(), None);
        assert_eq!(first_bad_scale(GgmlType::F16, &data), None);
        for at in [0, 1023, 1024, n - 1] {
            let mut d = data.clone();
            d[2 * at..2 * at + 2].copy_from_slice(&half::f16::NEG_INFINITY.to_bits().to_le_bytes());
            assert_eq!(
                first_non_finite(GgmlType::F16, &d, n).unwrap(),
                Some((at, f32::NEG_INFINITY))
            );
        }
        data[..2].copy_from_slice(&half::f16::NAN.to_bits().to_le_bytes());
        let (i, v) = first_non_finite(GgmlType::F16, &data, n).unwrap().unwrap();
        assert!(i == 0 && v.is_nan());
    }
}
