//! Keys and values of committed tokens, per sequence, and the scratch rows of
//! the last pass. A pass writes only scratch; `commit` moves the rows that are
//! kept into their sequence, so nothing rejected leaks into a later pass.
//!
//! All memory is allocated when the cache is made, from a [`KvLayout`] (the
//! planner's numbers): a fixed number of sequence slots, each with every
//! full-attention layer's context and every sliding layer's window.

use std::ops::Range;

use half::f16;
use spindle_kernels::attention::KvElem;

use crate::batch::SeqId;
use crate::error::ModelError;

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

/// 32 values as an f16 scale and 32 int8: value `i` is `d * qs[i]`.
#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(C)]
pub struct BlockQ8 {
    pub d: f16,
    pub qs: [i8; 32],
}

impl BlockQ8 {
    const ZERO: BlockQ8 = BlockQ8 {
        d: f16::ZERO,
        qs: [0; 32],
    };

    /// Quantizes 32 values: scale `max |x| / 127` (rounded to f16), each
    /// value rounded to the nearest multiple of the f32 scale, as GGUF's
    /// Q8_0 is made.
    fn quantize(x: &[f32]) -> BlockQ8 {
        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0i8; 32];
        for (q, v) in qs.iter_mut().zip(x) {
            *q = (v * id).round().clamp(-127.0, 127.0) as i8;
        }
        BlockQ8 {
            d: f16::from_f32(d),
            qs,
        }
    }

    /// The 32 values as f32, into `out`.
    pub fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for (o, &q) in out.iter_mut().zip(&self.qs) {
            *o = d * q as f32;
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
    fn new(ty: KvType) -> Self {
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
            KvBuf::F32(v) => store(&mut v[at..at + src.len()], src),
            KvBuf::F16(v) => store(&mut v[at..at + src.len()], src),
            KvBuf::Q8_0(v) => {
                let blocks = &mut v[at / 32..(at + src.len()) / 32];
                for (b, x) in blocks.iter_mut().zip(src.chunks_exact(32)) {
                    *b = BlockQ8::quantize(x);
                }
            }
        }
    }

    /// Copies the values `from[range]` of a buffer of the same type to
    /// element offset `at`.
    fn copy_from(&mut self, at: usize, from: &KvBuf, range: Range<usize>) {
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

fn store<E: KvElem>(dst: &mut [E], src: &[f32]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = E::from_f32(s);
    }
}

/// Keys and values of one layer of one sequence: a fixed number of token
/// slots, position `p` in slot `p % slots`. A full-attention layer has a slot
/// for every position of the context; a sliding-window layer only as many as
/// its window, reused as the window moves on.
#[derive(Debug, Clone)]
pub struct LayerKv {
    pub k: KvBuf,
    pub v: KvBuf,
    slots: usize,
}

impl LayerKv {
    fn new(ty: KvType, slots: usize, kv_dim: usize) -> Self {
        let mut k = KvBuf::new(ty);
        let mut v = KvBuf::new(ty);
        // Zero-filled now, so the memory is resident from the start and the
        // process never grows later (what the planner predicts).
        k.resize(slots * kv_dim);
        v.resize(slots * kv_dim);
        LayerKv { k, v, slots }
    }

    /// Token slots of this layer.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// The element ranges holding positions `from..to`, in position order
    /// (two ranges where they wrap around the slots). The positions must be
    /// among the last `slots` committed.
    pub fn ranges(&self, from: usize, to: usize, kv_dim: usize) -> [Range<usize>; 2] {
        if from >= to {
            return [0..0, 0..0];
        }
        let (a, n) = (from % self.slots, to - from);
        let first = n.min(self.slots - a);
        [a * kv_dim..(a + first) * kv_dim, 0..(n - first) * kv_dim]
    }
}

/// The committed KV of one sequence.
#[derive(Debug, Clone)]
pub struct SeqKv {
    pub len: usize,
    pub layers: Vec<LayerKv>,
}

/// The scratch rows of the last pass.
#[derive(Debug, Clone)]
pub struct Scratch {
    pub layers: Vec<LayerKv>,
    /// `(sequence, position)` of each row of the last pass.
    pub rows: Vec<(SeqId, usize)>,
}

/// The shape of a KV cache: what each sequence slot holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvLayout {
    pub ty: KvType,
    /// Values per token per layer, for keys and again for values.
    pub kv_dim: usize,
    /// Per layer: `Some(window)` for a sliding-window layer.
    pub windows: Vec<Option<usize>>,
    /// Longest sequence (the context).
    pub max_len: usize,
    /// Sequences held at once.
    pub max_seqs: usize,
    /// Tokens a sequence must be able to roll back ([`KvCache::truncate`]):
    /// sliding layers keep this many slots beyond their window (a draft
    /// model drafts ahead and rolls back what was rejected). 0 for a cache
    /// that only ever commits accepted tokens.
    pub rollback: usize,
}

impl KvLayout {
    /// Token slots of layer `l` per sequence.
    pub fn slots(&self, l: usize) -> usize {
        match self.windows[l] {
            Some(w) => (w + self.rollback).clamp(1, self.max_len.max(1)),
            None => self.max_len,
        }
    }

    /// Bytes of the whole cache (every sequence slot), allocated up front.
    pub fn bytes(&self) -> usize {
        let per_seq: usize = (0..self.windows.len()).map(|l| self.slots(l)).sum();
        2 * per_seq * self.ty.row_bytes(self.kv_dim) * self.max_seqs
    }
}

/// The KV cache of all sequences: `max_seqs` sequence slots of fixed size,
/// allocated when the cache is made and reused as sequences come and go.
#[derive(Debug, Clone)]
pub struct KvCache {
    layout: KvLayout,
    seqs: Vec<SeqKv>,
    in_use: Vec<bool>,
    pub(crate) scratch: Scratch,
}

impl KvCache {
    /// A cache of `layout.max_seqs` sequences of at most `layout.max_len`
    /// tokens; all of its memory is allocated (and touched) here.
    ///
    /// # Panics
    /// For a Q8_0 layout whose `kv_dim` is not a multiple of 32 (check with
    /// [`KvType::supports`] first).
    pub fn new(layout: KvLayout) -> Self {
        assert!(
            layout.ty.supports(layout.kv_dim),
            "a Q8_0 KV cache needs kv_dim to be a multiple of 32, not {}",
            layout.kv_dim
        );
        let (ty, kv_dim) = (layout.ty, layout.kv_dim);
        let seqs = (0..layout.max_seqs)
            .map(|_| SeqKv {
                len: 0,
                layers: (0..layout.windows.len())
                    .map(|l| LayerKv::new(ty, layout.slots(l), kv_dim))
                    .collect(),
            })
            .collect();
        KvCache {
            in_use: vec![false; layout.max_seqs],
            seqs,
            scratch: Scratch {
                layers: (0..layout.windows.len())
                    .map(|_| LayerKv::new(ty, 0, kv_dim))
                    .collect(),
                rows: Vec::new(),
            },
            layout,
        }
    }

    pub fn layout(&self) -> &KvLayout {
        &self.layout
    }

    pub fn kv_type(&self) -> KvType {
        self.layout.ty
    }

    pub fn kv_dim(&self) -> usize {
        self.layout.kv_dim
    }

    pub fn max_len(&self) -> usize {
        self.layout.max_len
    }

    /// Opens an empty sequence in a free slot.
    pub fn add_sequence(&mut self) -> Result<SeqId, ModelError> {
        let Some(i) = self.in_use.iter().position(|u| !u) else {
            return Err(ModelError::NoFreeSequence {
                max: self.layout.max_seqs,
            });
        };
        self.in_use[i] = true;
        self.seqs[i].len = 0;
        Ok(i)
    }

    /// Sequence slots not in use.
    pub fn free_sequences(&self) -> usize {
        self.in_use.iter().filter(|u| !**u).count()
    }

    /// Ends a sequence; its slot is free for the next one.
    pub fn remove_sequence(&mut self, seq: SeqId) {
        if let Some(u) = self.in_use.get_mut(seq) {
            *u = false;
        }
    }

    pub fn seq(&self, seq: SeqId) -> Option<&SeqKv> {
        self.in_use
            .get(seq)
            .copied()
            .unwrap_or(false)
            .then(|| &self.seqs[seq])
    }

    fn seq_mut(&mut self, seq: SeqId) -> Result<&mut SeqKv, ModelError> {
        if !self.in_use.get(seq).copied().unwrap_or(false) {
            return Err(ModelError::InvalidBatch(format!(
                "sequence {seq} does not exist"
            )));
        }
        Ok(&mut self.seqs[seq])
    }

    /// Committed length of a sequence (0 for an unknown one).
    pub fn seq_len(&self, seq: SeqId) -> usize {
        self.seq(seq).map_or(0, |s| s.len)
    }

    /// Appends rows of the last pass to their sequence, in order. Each row
    /// must be at the sequence's next position.
    pub fn commit(&mut self, seq: SeqId, rows: &[usize]) -> Result<(), ModelError> {
        let kv_dim = self.layout.kv_dim;
        let max_len = self.layout.max_len;
        for &r in rows {
            let Some(&(rseq, pos)) = self.scratch.rows.get(r) else {
                return Err(ModelError::InvalidBatch(format!(
                    "row {r} is not in the last pass"
                )));
            };
            let len = self.seq(seq).map_or(0, |s| s.len);
            if rseq != seq || pos != len {
                return Err(ModelError::InvalidBatch(format!(
                    "row {r} (sequence {rseq}, position {pos}) cannot follow sequence {seq} at length {len}"
                )));
            }
            if len + 1 > max_len {
                return Err(ModelError::ContextFull {
                    seq,
                    len: len + 1,
                    ctx: max_len,
                });
            }
            let scratch = std::mem::take(&mut self.scratch.layers);
            let s = self.seq_mut(seq)?;
            for (dst, src) in s.layers.iter_mut().zip(&scratch) {
                let at = (len % dst.slots) * kv_dim;
                dst.k.copy_from(at, &src.k, r * kv_dim..(r + 1) * kv_dim);
                dst.v.copy_from(at, &src.v, r * kv_dim..(r + 1) * kv_dim);
            }
            s.len += 1;
            self.scratch.layers = scratch;
        }
        Ok(())
    }

    /// Commits `n` positions of zero keys and values to a sequence, without a
    /// pass: benchmarks and memory measurements use it to reach a long
    /// context quickly (what a pass costs does not depend on the values).
    pub fn pad_with_zeros(&mut self, seq: SeqId, n: usize) -> Result<(), ModelError> {
        let kv_dim = self.layout.kv_dim;
        let max_len = self.layout.max_len;
        let s = self.seq_mut(seq)?;
        if s.len + n > max_len {
            return Err(ModelError::ContextFull {
                seq,
                len: s.len + n,
                ctx: max_len,
            });
        }
        for l in &mut s.layers {
            let zeros = vec![0.0f32; kv_dim];
            for p in s.len..s.len + n.min(l.slots) {
                let at = (p % l.slots) * kv_dim;
                l.k.write(at, &zeros);
                l.v.write(at, &zeros);
            }
        }
        s.len += n;
        Ok(())
    }

    /// Rolls a sequence back to `len` tokens. A sliding-window layer keeps
    /// only its window, so a sequence can roll back only as far as its
    /// windows still hold what the following positions see.
    pub fn truncate(&mut self, seq: SeqId, len: usize) -> Result<(), ModelError> {
        let windows = self.layout.windows.clone();
        let s = self.seq_mut(seq)?;
        if len >= s.len {
            return Ok(());
        }
        for (l, w) in windows.iter().enumerate() {
            if let Some(w) = w {
                // Position `len` sees back to `len + 1 - w`, which must not
                // have been overwritten by positions up to `s.len - 1`.
                let slots = s.layers[l].slots;
                if (len + 1).saturating_sub(*w) + slots < s.len {
                    return Err(ModelError::InvalidBatch(format!(
                        "cannot roll sequence {seq} back from {} to {len} tokens: layer {l} keeps only its window of {w}",
                        s.len
                    )));
                }
            }
        }
        s.len = len;
        Ok(())
    }

    /// Bytes of committed KV in use by all sequences.
    pub fn bytes_used(&self) -> usize {
        let per_token = 2 * self.layout.ty.row_bytes(self.layout.kv_dim);
        self.seqs
            .iter()
            .zip(&self.in_use)
            .filter(|(_, u)| **u)
            .map(|(s, _)| {
                s.layers
                    .iter()
                    .map(|l| s.len.min(l.slots) * per_token)
                    .sum::<usize>()
            })
            .sum()
    }
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
