//! How keys and values are stored: the element types (f32, f16, Q8_0
//! blocks) and buffers of rows of one type.

use std::ops::Range;

use half::f16;
pub use spindle_kernels::attention::BlockQ8;
use spindle_kernels::attention::KvElem;

/// Element type of stored keys and values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvType {
    F32,
    F16,
    /// Blocks of 32 values: an f16 scale and 32 int8 (34 bytes, as GGUF's
    /// Q8_0), for about half the memory of f16. Needs `kv_dim` to be a
    /// multiple of 32.
    Q8_0,
}

impl KvType {
    /// Bytes of `n` stored values (`n` a multiple of 32 for Q8_0).
    pub fn row_bytes(self, n: usize) -> usize {
        match self {
            KvType::F32 => 4 * n,
            KvType::F16 => 2 * n,
            KvType::Q8_0 => n / 32 * std::mem::size_of::<BlockQ8>(),
        }
    }

    /// Whether rows of `kv_dim` values can be stored in this type.
    pub fn supports(self, kv_dim: usize) -> bool {
        self != KvType::Q8_0 || kv_dim.is_multiple_of(32)
    }

    /// `f32`, `f16` or `q8_0`, as [`KvType::parse`] reads them.
    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
        }
    }

    /// Parses `f32`, `f16` or `q8_0`.
    pub fn parse(s: &str) -> Option<KvType> {
        match s {
            "f32" => Some(KvType::F32),
            "f16" => Some(KvType::F16),
            "q8_0" => Some(KvType::Q8_0),
            _ => None,
        }
    }
}

/// Rows of `kv_dim` values in one element type. Element offsets and
/// lengths of a Q8_0 buffer are multiples of 32 (whole rows).
#[derive(Debug, Clone)]
pub enum KvBuf {
    F32(Vec<f32>),
    F16(Vec<f16>),
    Q8_0(Vec<BlockQ8>),
}

impl KvBuf {
    pub(crate) fn new(ty: KvType) -> Self {
        match ty {
            KvType::F32 => KvBuf::F32(Vec::new()),
            KvType::F16 => KvBuf::F16(Vec::new()),
            KvType::Q8_0 => KvBuf::Q8_0(Vec::new()),
        }
    }

    /// Resizes to `n` values, zero-filled.
    pub(crate) fn resize(&mut self, n: usize) {
        match self {
            KvBuf::F32(v) => v.resize(n, 0.0),
            KvBuf::F16(v) => v.resize(n, f16::ZERO),
            KvBuf::Q8_0(v) => v.resize(n.div_ceil(32), BlockQ8::ZERO),
        }
    }

    /// Stores `src` at element offset `at`.
    pub(crate) fn write(&mut self, at: usize, src: &[f32]) {
        match self {
            KvBuf::F32(v) => store(v, at, src),
            KvBuf::F16(v) => store(v, at, src),
            KvBuf::Q8_0(v) => store(v, at, src),
        }
    }

    /// Copies the values `from[range]` of a buffer of the same type to
    /// element offset `at`.
    pub(crate) fn copy_from(&mut self, at: usize, from: &KvBuf, range: Range<usize>) {
        let n = range.len();
        match (self, from) {
            (KvBuf::F32(a), KvBuf::F32(b)) => a[at..at + n].copy_from_slice(&b[range]),
            (KvBuf::F16(a), KvBuf::F16(b)) => a[at..at + n].copy_from_slice(&b[range]),
            (KvBuf::Q8_0(a), KvBuf::Q8_0(b)) => {
                a[at / 32..(at + n) / 32].copy_from_slice(&b[range.start / 32..range.end / 32])
            }
            _ => unreachable!("KV buffers of one cache share a type"),
        }
    }

    /// Copies the values `range` of this buffer to element offset `at`
    /// (copy-on-write of a shared block).
    pub(crate) fn copy_within(&mut self, range: Range<usize>, at: usize) {
        match self {
            KvBuf::F32(v) => v.copy_within(range, at),
            KvBuf::F16(v) => v.copy_within(range, at),
            KvBuf::Q8_0(v) => v.copy_within(range.start / 32..range.end / 32, at / 32),
        }
    }

    /// The values `range` widened to f32 into `out` (as long as `range`;
    /// for Q8_0 both are whole blocks of 32).
    pub fn read_into(&self, range: Range<usize>, out: &mut [f32]) {
        match self {
            KvBuf::F32(v) => widen(v, range, out),
            KvBuf::F16(v) => widen(v, range, out),
            KvBuf::Q8_0(v) => widen(v, range, out),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            KvBuf::F32(v) => v.len(),
            KvBuf::F16(v) => v.len(),
            KvBuf::Q8_0(v) => 32 * v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// `src` stored at value offset `at` (a multiple of `E::VALUES`).
fn store<E: KvElem>(dst: &mut [E], at: usize, src: &[f32]) {
    E::store(src, &mut dst[at / E::VALUES..(at + src.len()) / E::VALUES]);
}

/// The values `range` (whole elements) widened to f32 into `out`.
fn widen<E: KvElem>(src: &[E], range: Range<usize>, out: &mut [f32]) {
    E::widen(&src[range.start / E::VALUES..range.end / E::VALUES], out);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_type_names_parse_back() {
        for ty in [KvType::F32, KvType::F16, KvType::Q8_0] {
            assert_eq!(KvType::parse(ty.name()), Some(ty));
        }
        assert_eq!(KvType::parse("bf16"), None);
    }

    #[test]
    fn q8_0_blocks_round_to_within_half_a_step() {
        let x: Vec<f32> = (0..32)
            .map(|i| ((i * 37 % 19) as f32 - 9.0) * 0.173)
            .collect();
        let b = BlockQ8::quantize(&x);
        let mut y = [0.0f32; 32];
        b.dequantize(&mut y);
        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        // The f16 scale adds a relative error of at most 2^-11 per value.
        let step = amax / 127.0;
        for (a, b) in x.iter().zip(&y) {
            assert!((a - b).abs() <= step * 0.5 + amax * 1e-3, "{a} vs {b}");
        }
        let zero = BlockQ8::quantize(&[0.0; 32]);
        assert_eq!(zero.qs, [0; 32]);
        assert_eq!(KvType::Q8_0.row_bytes(256), 8 * 34);
        assert!(!KvType::Q8_0.supports(16) && KvType::Q8_0.supports(64));
    }
}
