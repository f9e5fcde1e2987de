//! Keys and values of committed tokens, per sequence, and the scratch rows of
//! the last pass. A pass writes only scratch; `commit` moves the rows that are
//! kept into their sequence, so nothing rejected leaks into a later pass.

use half::f16;
use spindle_kernels::attention::KvElem;

use crate::batch::SeqId;
use crate::error::ModelError;

/// Element type of stored keys and values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvType {
    F32,
    F16,
}

impl KvType {
    pub fn bytes(self) -> usize {
        match self {
            KvType::F32 => 4,
            KvType::F16 => 2,
        }
    }
}

/// Rows of `kv_dim` values in one element type.
#[derive(Debug, Clone)]
pub enum KvBuf {
    F32(Vec<f32>),
    F16(Vec<f16>),
}

impl KvBuf {
    fn new(ty: KvType) -> Self {
        match ty {
            KvType::F32 => KvBuf::F32(Vec::new()),
            KvType::F16 => KvBuf::F16(Vec::new()),
        }
    }

    fn truncate(&mut self, n: usize) {
        match self {
            KvBuf::F32(v) => v.truncate(n),
            KvBuf::F16(v) => v.truncate(n),
        }
    }

    /// Resizes to `n` values, zero-filled.
    pub(crate) fn resize(&mut self, n: usize) {
        match self {
            KvBuf::F32(v) => v.resize(n, 0.0),
            KvBuf::F16(v) => v.resize(n, f16::ZERO),
        }
    }

    /// Stores `src` at element offset `at`.
    pub(crate) fn write(&mut self, at: usize, src: &[f32]) {
        match self {
            KvBuf::F32(v) => store(&mut v[at..at + src.len()], src),
            KvBuf::F16(v) => store(&mut v[at..at + src.len()], src),
        }
    }

    /// Appends the values `from[range]` of a buffer of the same type.
    fn extend_from(&mut self, from: &KvBuf, range: std::ops::Range<usize>) {
        match (self, from) {
            (KvBuf::F32(a), KvBuf::F32(b)) => a.extend_from_slice(&b[range]),
            (KvBuf::F16(a), KvBuf::F16(b)) => a.extend_from_slice(&b[range]),
            _ => unreachable!("KV buffers of one cache share a type"),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            KvBuf::F32(v) => v.len(),
            KvBuf::F16(v) => v.len(),
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

/// Keys and values of one layer.
#[derive(Debug, Clone)]
pub struct LayerKv {
    pub k: KvBuf,
    pub v: KvBuf,
}

impl LayerKv {
    fn new(ty: KvType) -> Self {
        LayerKv {
            k: KvBuf::new(ty),
            v: KvBuf::new(ty),
        }
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

/// The KV cache of all sequences.
#[derive(Debug, Clone)]
pub struct KvCache {
    ty: KvType,
    n_layers: usize,
    kv_dim: usize,
    max_len: usize,
    seqs: Vec<Option<SeqKv>>,
    pub(crate) scratch: Scratch,
}

impl KvCache {
    /// A cache for sequences of at most `max_len` tokens.
    pub fn new(ty: KvType, n_layers: usize, kv_dim: usize, max_len: usize) -> Self {
        KvCache {
            ty,
            n_layers,
            kv_dim,
            max_len,
            seqs: Vec::new(),
            scratch: Scratch {
                layers: (0..n_layers).map(|_| LayerKv::new(ty)).collect(),
                rows: Vec::new(),
            },
        }
    }

    pub fn kv_type(&self) -> KvType {
        self.ty
    }

    pub fn kv_dim(&self) -> usize {
        self.kv_dim
    }

    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// Opens an empty sequence.
    pub fn add_sequence(&mut self) -> SeqId {
        let seq = SeqKv {
            len: 0,
            layers: (0..self.n_layers).map(|_| LayerKv::new(self.ty)).collect(),
        };
        if let Some(i) = self.seqs.iter().position(Option::is_none) {
            self.seqs[i] = Some(seq);
            i
        } else {
            self.seqs.push(Some(seq));
            self.seqs.len() - 1
        }
    }

    /// Frees a sequence and everything it held.
    pub fn remove_sequence(&mut self, seq: SeqId) {
        if let Some(s) = self.seqs.get_mut(seq) {
            *s = None;
        }
    }

    pub fn seq(&self, seq: SeqId) -> Option<&SeqKv> {
        self.seqs.get(seq).and_then(Option::as_ref)
    }

    fn seq_mut(&mut self, seq: SeqId) -> Result<&mut SeqKv, ModelError> {
        self.seqs
            .get_mut(seq)
            .and_then(Option::as_mut)
            .ok_or_else(|| ModelError::InvalidBatch(format!("sequence {seq} does not exist")))
    }

    /// Committed length of a sequence (0 for an unknown one).
    pub fn seq_len(&self, seq: SeqId) -> usize {
        self.seq(seq).map_or(0, |s| s.len)
    }

    /// Appends rows of the last pass to their sequence, in order. Each row
    /// must be at the sequence's next position.
    pub fn commit(&mut self, seq: SeqId, rows: &[usize]) -> Result<(), ModelError> {
        let kv_dim = self.kv_dim;
        let max_len = self.max_len;
        for &r in rows {
            let Some(&(rseq, pos)) = self.scratch.rows.get(r) else {
                return Err(ModelError::InvalidBatch(format!(
                    "row {r} is not in the last pass"
                )));
            };
            let s = self.seqs.get(seq).and_then(Option::as_ref);
            let len = s.map_or(0, |s| s.len);
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
                dst.k.extend_from(&src.k, r * kv_dim..(r + 1) * kv_dim);
                dst.v.extend_from(&src.v, r * kv_dim..(r + 1) * kv_dim);
            }
            s.len += 1;
            self.scratch.layers = scratch;
        }
        Ok(())
    }

    /// Rolls a sequence back to `len` tokens.
    pub fn truncate(&mut self, seq: SeqId, len: usize) -> Result<(), ModelError> {
        let kv_dim = self.kv_dim;
        let s = self.seq_mut(seq)?;
        if len < s.len {
            for l in &mut s.layers {
                l.k.truncate(len * kv_dim);
                l.v.truncate(len * kv_dim);
            }
            s.len = len;
        }
        Ok(())
    }

    /// Bytes held by committed KV of all sequences.
    pub fn bytes_used(&self) -> usize {
        self.seqs
            .iter()
            .flatten()
            .map(|s| {
                s.layers
                    .iter()
                    .map(|l| (l.k.len() + l.v.len()) * self.ty.bytes())
                    .sum::<usize>()
            })
            .sum()
    }
}
