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

    /// Copies the values `from[range]` of a buffer of the same type to
    /// element offset `at`.
    fn copy_from(&mut self, at: usize, from: &KvBuf, range: Range<usize>) {
        let n = range.len();
        match (self, from) {
            (KvBuf::F32(a), KvBuf::F32(b)) => a[at..at + n].copy_from_slice(&b[range]),
            (KvBuf::F16(a), KvBuf::F16(b)) => a[at..at + n].copy_from_slice(&b[range]),
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
        2 * per_seq * self.kv_dim * self.ty.bytes() * self.max_seqs
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
    pub fn new(layout: KvLayout) -> Self {
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
        let per_token = 2 * self.layout.kv_dim * self.layout.ty.bytes();
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
