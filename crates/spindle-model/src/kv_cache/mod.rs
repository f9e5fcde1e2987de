//! Keys and values of committed tokens in a pool of fixed-size blocks, and
//! the scratch rows of the last pass.
//!
//! - A pass writes only scratch; [`KvCache::commit`] moves the rows that are
//!   kept into their sequence's blocks, so nothing rejected leaks into a
//!   later pass.
//! - Layers with the same attention window form a group with its own pool of
//!   [`BLOCK`]-token blocks; every sequence has one block table per group.
//!   Sliding-window groups give back the blocks that fell out of the window.
//! - Blocks are reference-counted, and every full block is known by a hash
//!   chain of its tokens: a new sequence whose prompt starts with the same
//!   blocks shares them instead of computing them again (prefix cache).
//!   A block is copied before a sequence writes into a shared one.
//! - All memory is allocated when the cache is made, from a [`KvLayout`]
//!   (the planner's numbers), and never grows.

mod block_pool;
mod commit;
mod storage;
#[cfg(test)]
mod tests;

use std::ops::Range;

pub use block_pool::{BlockId, BlockKey, BLOCK};
use block_pool::{BlockPool, ROOT_HASH};
pub use storage::{BlockQ8, KvBuf, KvType};

use crate::batch::SeqId;
use crate::error::ModelError;

/// Keys and values of some rows of one layer.
#[derive(Debug, Clone)]
pub struct KvPair {
    pub k: KvBuf,
    pub v: KvBuf,
}

impl KvPair {
    fn new(ty: KvType, rows: usize, kv_dim: usize) -> Self {
        let mut k = KvBuf::new(ty);
        let mut v = KvBuf::new(ty);
        // Zero-filled now, so the memory is resident from the start and the
        // process never grows later (what the planner predicts).
        k.resize(rows * kv_dim);
        v.resize(rows * kv_dim);
        KvPair { k, v }
    }
}

/// The committed KV of one sequence: its tokens and, per layer group, the
/// block holding each run of [`BLOCK`] positions (`None` for blocks a
/// sliding window has given back).
#[derive(Debug, Clone)]
pub struct SeqKv {
    pub len: usize,
    tokens: Vec<u32>,
    /// Chain hash of each full block.
    hashes: Vec<u64>,
    tables: Vec<Vec<Option<BlockId>>>,
    /// Per group: blocks below this index have been given back.
    released: Vec<usize>,
}

/// The scratch rows of the last pass.
#[derive(Debug, Clone)]
pub struct Scratch {
    pub layers: Vec<KvPair>,
    /// `(sequence, position, token)` of each row of the last pass.
    pub rows: Vec<(SeqId, usize, u32)>,
}

/// The shape of a KV cache.
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
    /// sliding layers keep this many positions beyond their window (a draft
    /// model drafts ahead and rolls back what was rejected). 0 for a cache
    /// that only ever commits accepted tokens.
    pub rollback: usize,
    /// Tokens of full-attention KV in the pool, shared by all sequences
    /// (at least one sequence of `max_len`). `None`: every sequence can
    /// reach `max_len` at once.
    pub pool_tokens: Option<usize>,
}

impl KvLayout {
    /// The layer groups: each distinct window, in order of first layer.
    pub fn groups(&self) -> Vec<Option<usize>> {
        let mut groups = Vec::new();
        for w in &self.windows {
            if !groups.contains(w) {
                groups.push(*w);
            }
        }
        groups
    }

    /// Most blocks one sequence holds at once in a group: the whole
    /// context, or a window (and the rollback) wherever it starts in a
    /// block, with the block being written.
    pub fn seq_blocks(&self, window: Option<usize>) -> usize {
        let all = self.max_len.div_ceil(BLOCK).max(1);
        match window {
            Some(w) => all.min((w + self.rollback).div_ceil(BLOCK) + 1),
            None => all,
        }
    }

    /// Blocks in a group's pool.
    pub fn pool_blocks(&self, window: Option<usize>) -> usize {
        let per_seq = self.seq_blocks(window);
        match (window, self.pool_tokens) {
            (None, Some(tokens)) => tokens.div_ceil(BLOCK).max(per_seq),
            _ => per_seq * self.max_seqs,
        }
    }

    /// Bytes of one block of one layer, keys and values.
    pub fn block_bytes(&self) -> usize {
        2 * BLOCK * self.ty.row_bytes(self.kv_dim)
    }

    /// Bytes of the whole pool, allocated up front.
    pub fn bytes(&self) -> usize {
        let blocks: usize = self.windows.iter().map(|w| self.pool_blocks(*w)).sum();
        blocks * self.block_bytes()
    }
}

/// One group of layers that share an attention window, and its blocks.
#[derive(Debug, Clone)]
struct Group {
    window: Option<usize>,
    /// Most blocks one sequence holds at once.
    seq_blocks: usize,
    /// Layers of the group.
    layers: Vec<usize>,
    pool: BlockPool,
}

/// The KV cache of all sequences.
#[derive(Debug, Clone)]
pub struct KvCache {
    layout: KvLayout,
    groups: Vec<Group>,
    /// Each layer's group, and its blocks' keys and values.
    layer_group: Vec<usize>,
    layers: Vec<KvPair>,
    seqs: Vec<Option<SeqKv>>,
    pub(crate) scratch: Scratch,
}

impl KvCache {
    /// A cache laid out as `layout`; all of its memory is allocated (and
    /// touched) here.
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
        let windows = layout.groups();
        let layer_group: Vec<usize> = layout
            .windows
            .iter()
            .map(|w| windows.iter().position(|g| g == w).expect("listed"))
            .collect();
        let groups = windows
            .iter()
            .enumerate()
            .map(|(g, &window)| Group {
                window,
                seq_blocks: layout.seq_blocks(window),
                layers: (0..layer_group.len())
                    .filter(|&l| layer_group[l] == g)
                    .collect(),
                pool: BlockPool::new(layout.pool_blocks(window)),
            })
            .collect::<Vec<_>>();
        let layers = layer_group
            .iter()
            .map(|&g| KvPair::new(ty, groups[g].pool.capacity() * BLOCK, kv_dim))
            .collect();
        KvCache {
            seqs: vec![None; layout.max_seqs],
            scratch: Scratch {
                layers: (0..layer_group.len())
                    .map(|_| KvPair::new(ty, 0, kv_dim))
                    .collect(),
                rows: Vec::new(),
            },
            groups,
            layer_group,
            layers,
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
        let Some(i) = self.seqs.iter().position(Option::is_none) else {
            return Err(ModelError::NoFreeSequence {
                max: self.layout.max_seqs,
            });
        };
        let groups = self.groups.len();
        self.seqs[i] = Some(SeqKv {
            len: 0,
            tokens: Vec::new(),
            hashes: Vec::new(),
            tables: vec![Vec::new(); groups],
            released: vec![0; groups],
        });
        Ok(i)
    }

    /// Opens a sequence for `prompt` that starts with the longest run of
    /// its full blocks the prefix cache holds (sliding groups need only
    /// the blocks their window still sees), and returns it with how many
    /// tokens it already holds. At least one prompt token is always left
    /// to run, for the logits that choose the next token.
    pub fn add_sequence_with_prefix(
        &mut self,
        prompt: &[u32],
    ) -> Result<(SeqId, usize), ModelError> {
        let seq = self.add_sequence()?;
        let max_blocks = prompt.len().saturating_sub(1) / BLOCK;
        let mut keys = Vec::with_capacity(max_blocks);
        let mut parent = ROOT_HASH;
        for chunk in prompt.chunks_exact(BLOCK).take(max_blocks) {
            let key = BlockKey::new(parent, chunk);
            parent = key.chain_hash();
            keys.push(key);
        }
        let found: Vec<Vec<Option<BlockId>>> = self
            .groups
            .iter()
            .map(|g| keys.iter().map(|k| g.pool.lookup(k)).collect())
            .collect();
        let rollback = self.layout.rollback;
        let first_needed = |window: Option<usize>, n: usize| match window {
            Some(w) => (n * BLOCK + 1).saturating_sub(w + rollback) / BLOCK,
            None => 0,
        };
        let hit = (1..=max_blocks)
            .rev()
            .find(|&n| {
                self.groups
                    .iter()
                    .zip(&found)
                    .all(|(g, f)| f[first_needed(g.window, n)..n].iter().all(Option::is_some))
            })
            .unwrap_or(0);
        let s = self.seqs[seq].as_mut().expect("just added");
        for (g, group) in self.groups.iter_mut().enumerate() {
            let first = first_needed(group.window, hit);
            for (i, b) in found[g][..hit].iter().enumerate() {
                let b = b.filter(|_| i >= first);
                if let Some(b) = b {
                    group.pool.retain(b);
                }
                s.tables[g].push(b);
            }
            s.released[g] = first;
        }
        s.len = hit * BLOCK;
        s.tokens = prompt[..s.len].to_vec();
        s.hashes = keys[..hit].iter().map(BlockKey::chain_hash).collect();
        Ok((seq, s.len))
    }

    /// Sequence slots not in use.
    pub fn free_sequences(&self) -> usize {
        self.seqs.iter().filter(|s| s.is_none()).count()
    }

    /// Ends a sequence: its blocks go back to the pool (full ones stay in
    /// the prefix cache until they are needed for something else).
    pub fn remove_sequence(&mut self, seq: SeqId) {
        let Some(s) = self.seqs.get_mut(seq).and_then(Option::take) else {
            return;
        };
        for (group, table) in self.groups.iter_mut().zip(&s.tables) {
            for b in table.iter().flatten() {
                group.pool.release(*b);
            }
        }
    }

    pub fn seq(&self, seq: SeqId) -> Option<&SeqKv> {
        self.seqs.get(seq)?.as_ref()
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

    /// The keys and values of layer `l`'s blocks.
    pub(crate) fn layer(&self, l: usize) -> &KvPair {
        &self.layers[l]
    }

    /// The block of each run of [`BLOCK`] positions of `seq` in layer `l`
    /// (`None` where a sliding window has given the block back).
    pub(crate) fn block_table(&self, seq: SeqId, l: usize) -> &[Option<BlockId>] {
        &self.seq(seq).expect("a sequence of the pass").tables[self.layer_group[l]]
    }

    /// The element ranges of layer `l`'s blocks holding positions
    /// `from..to` of `seq`, in position order. The positions must be ones
    /// the layer keeps (at most a window back for a sliding layer).
    pub(crate) fn layer_ranges(
        &self,
        seq: SeqId,
        l: usize,
        from: usize,
        to: usize,
    ) -> Vec<Range<usize>> {
        let kv_dim = self.layout.kv_dim;
        let table = &self.seq(seq).expect("a sequence of the pass").tables[self.layer_group[l]];
        let mut ranges: Vec<Range<usize>> = Vec::new();
        let mut pos = from;
        while pos < to {
            let n = (BLOCK - pos % BLOCK).min(to - pos);
            let b = table[pos / BLOCK].expect("attention reads only blocks the window keeps");
            let start = (b * BLOCK + pos % BLOCK) * kv_dim;
            let range = start..start + n * kv_dim;
            match ranges.last_mut() {
                Some(last) if last.end == range.start => last.end = range.end,
                _ => ranges.push(range),
            }
            pos += n;
        }
        ranges
    }

    /// The keys and values layer `l` holds for `seq`, widened to f32, from
    /// the first position the next token sees (its window, for a sliding
    /// layer) to the end. For tests and tools; a pass reads them in place.
    pub fn committed_kv(&self, seq: SeqId, l: usize) -> Option<(Vec<f32>, Vec<f32>)> {
        let len = self.seq(seq)?.len;
        let from = match self.layout.windows.get(l)? {
            Some(w) => (len + 1).saturating_sub(*w),
            None => 0,
        };
        let (mut k, mut v) = (Vec::new(), Vec::new());
        let stored = &self.layers[l];
        for r in self.layer_ranges(seq, l, from, len) {
            let at = k.len();
            k.resize(at + r.len(), 0.0);
            v.resize(at + r.len(), 0.0);
            stored.k.read_into(r.clone(), &mut k[at..]);
            stored.v.read_into(r, &mut v[at..]);
        }
        Some((k, v))
    }

    /// Whether the pool can take every `(sequence, tokens)` commit at once.
    pub fn fits(&self, commits: &[(SeqId, usize)]) -> bool {
        let mut needed = vec![0usize; self.groups.len()];
        for &(seq, n) in commits {
            for (sum, b) in needed.iter_mut().zip(self.blocks_needed(seq, n)) {
                *sum += b;
            }
        }
        needed
            .iter()
            .zip(&self.groups)
            .all(|(n, g)| *n <= g.pool.available())
    }

    /// Bytes of the blocks that sequences hold.
    pub fn bytes_used(&self) -> usize {
        self.bytes_of(|pool| pool.in_use())
    }

    /// Bytes of the free blocks still held for the prefix cache (part of
    /// the pool, which is allocated up front; reported so that an operator
    /// can see what the cache keeps).
    pub fn bytes_prefix_cached(&self) -> usize {
        self.bytes_of(|pool| pool.cached_free())
    }

    /// Bytes of `blocks(pool)` blocks of each group, every layer of it.
    fn bytes_of(&self, blocks: impl Fn(&BlockPool) -> usize) -> usize {
        let per_block = self.layout.block_bytes();
        self.groups
            .iter()
            .map(|g| blocks(&g.pool) * g.layers.len() * per_block)
            .sum()
    }

    /// Blocks in use and in all, over every group.
    pub fn block_usage(&self) -> BlockUsage {
        let mut u = BlockUsage::default();
        for g in &self.groups {
            u.in_use += g.pool.in_use();
            u.cached_free += g.pool.cached_free();
            u.total += g.pool.capacity();
        }
        u
    }
}

/// Block counts of a cache, over every layer group.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BlockUsage {
    /// Held by at least one sequence.
    pub in_use: usize,
    /// Free, but still in the prefix cache.
    pub cached_free: usize,
    pub total: usize,
}
