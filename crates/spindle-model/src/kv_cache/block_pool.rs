//! The block pool of one group of layers: which blocks are free, which are
//! held and by how many sequences, and which full blocks are known by their
//! tokens (the prefix cache).
//!
//! A block a sequence no longer holds stays in the prefix cache while its
//! content is valid: a later sequence that starts with the same tokens takes
//! it back instead of recomputing it. Free blocks are handed out uncached
//! ones first, then cached ones, least recently freed first.

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};

/// Tokens per block: the formats' [`KV_BLOCK_TOKENS`], which the planner
/// sizes the pool with too.
///
/// [`KV_BLOCK_TOKENS`]: spindle_formats::KV_BLOCK_TOKENS
pub const BLOCK: usize = spindle_formats::KV_BLOCK_TOKENS;

/// Index of a block in its group's pool.
pub type BlockId = usize;

/// What a full block holds: the chain hash of every block before it, and
/// its own tokens. Comparing the tokens exactly means a hash collision can
/// only confuse two prefixes whose 64-bit chain hashes and last 16 tokens
/// all agree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockKey {
    pub parent: u64,
    pub tokens: [u32; BLOCK],
}

impl BlockKey {
    /// The key of the block holding `tokens` (exactly [`BLOCK`] of them)
    /// after the blocks whose chain hash is `parent`.
    pub fn new(parent: u64, tokens: &[u32]) -> BlockKey {
        let mut t = [0u32; BLOCK];
        t.copy_from_slice(tokens);
        BlockKey { parent, tokens: t }
    }

    /// The chain hash of the prefix ending with this block.
    pub fn chain_hash(&self) -> u64 {
        // SipHash with fixed keys: the same on every run.
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.hash(&mut h);
        h.finish()
    }
}

/// The chain hash before the first block.
pub const ROOT_HASH: u64 = 0x5350_494e_444c_4521;

#[derive(Debug, Clone)]
pub struct BlockPool {
    /// Sequences holding each block.
    refs: Vec<u32>,
    /// The prefix-cache key a block is registered under.
    keys: Vec<Option<BlockKey>>,
    /// When each free cached block was freed (its place in `cached_free`).
    freed_at: Vec<u64>,
    /// Free blocks outside the prefix cache.
    free: Vec<BlockId>,
    /// Free blocks in the prefix cache, least recently freed first.
    cached_free: BTreeMap<u64, BlockId>,
    index: HashMap<BlockKey, BlockId>,
    clock: u64,
}

impl BlockPool {
    pub fn new(blocks: usize) -> BlockPool {
        BlockPool {
            refs: vec![0; blocks],
            keys: vec![None; blocks],
            freed_at: vec![0; blocks],
            // Popped from the end: block 0 first.
            free: (0..blocks).rev().collect(),
            cached_free: BTreeMap::new(),
            index: HashMap::new(),
            clock: 0,
        }
    }

    pub fn capacity(&self) -> usize {
        self.refs.len()
    }

    /// Blocks that can be handed out now (free, cached or not).
    pub fn available(&self) -> usize {
        self.free.len() + self.cached_free.len()
    }

    /// Blocks held by at least one sequence.
    pub fn in_use(&self) -> usize {
        self.capacity() - self.available()
    }

    /// Blocks in the prefix cache that no sequence holds.
    pub fn cached_free(&self) -> usize {
        self.cached_free.len()
    }

    /// Whether more than one sequence holds `b` (so it must be copied
    /// before one of them writes to it).
    pub fn shared(&self, b: BlockId) -> bool {
        self.refs[b] > 1
    }

    /// A block for one sequence to write: an uncached free block, else the
    /// least recently freed cached one (leaving the prefix cache).
    pub fn allocate(&mut self) -> Option<BlockId> {
        let b = match self.free.pop() {
            Some(b) => b,
            None => {
                let (_, b) = self.cached_free.pop_first()?;
                self.unregister(b);
                b
            }
        };
        self.refs[b] = 1;
        Some(b)
    }

    /// One more sequence holds `b` (a prefix-cache hit).
    pub fn retain(&mut self, b: BlockId) {
        if self.refs[b] == 0 {
            self.cached_free.remove(&self.freed_at[b]);
        }
        self.refs[b] += 1;
    }

    /// One sequence fewer holds `b`; with none left it is free, and stays
    /// in the prefix cache if it is registered there.
    pub fn release(&mut self, b: BlockId) {
        debug_assert!(self.refs[b] > 0, "block {b} released more often than held");
        self.refs[b] = self.refs[b].saturating_sub(1);
        if self.refs[b] > 0 {
            return;
        }
        if self.keys[b].is_some() {
            self.clock += 1;
            self.freed_at[b] = self.clock;
            self.cached_free.insert(self.clock, b);
        } else {
            self.free.push(b);
        }
    }

    /// Records that full block `b` holds `key`. If another block already
    /// holds the same key, that one stays the cached copy.
    pub fn register(&mut self, b: BlockId, key: BlockKey) {
        if self.keys[b].is_none() && !self.index.contains_key(&key) {
            self.index.insert(key, b);
            self.keys[b] = Some(key);
        }
    }

    /// Takes `b` out of the prefix cache (its content is about to change).
    pub fn unregister(&mut self, b: BlockId) {
        if let Some(key) = self.keys[b].take() {
            self.index.remove(&key);
        }
    }

    pub fn lookup(&self, key: &BlockKey) -> Option<BlockId> {
        self.index.get(key).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u32) -> BlockKey {
        BlockKey::new(ROOT_HASH, &[n; BLOCK])
    }

    #[test]
    fn released_cached_blocks_are_reused_least_recently_freed_first() {
        let mut pool = BlockPool::new(3);
        let (a, b, c) = (
            pool.allocate().unwrap(),
            pool.allocate().unwrap(),
            pool.allocate().unwrap(),
        );
        assert_eq!(pool.allocate(), None);
        pool.register(a, key(1));
        pool.register(b, key(2));
        pool.release(b);
        pool.release(a);
        pool.release(c);
        assert_eq!((pool.available(), pool.cached_free()), (3, 2));
        // The uncached block goes first, then b (freed before a).
        assert_eq!(pool.allocate(), Some(c));
        assert_eq!(pool.allocate(), Some(b));
        assert_eq!(pool.lookup(&key(2)), None, "reusing b evicts its key");
        assert_eq!(pool.lookup(&key(1)), Some(a));
        // A hit takes a back out of the free set.
        pool.retain(a);
        assert_eq!((pool.available(), pool.in_use()), (0, 3));
        assert_eq!(pool.allocate(), None);
    }

    #[test]
    fn shared_blocks_are_free_only_when_every_holder_releases_them() {
        let mut pool = BlockPool::new(2);
        let a = pool.allocate().unwrap();
        pool.register(a, key(7));
        pool.retain(a);
        assert!(pool.shared(a));
        pool.release(a);
        assert!(!pool.shared(a));
        assert_eq!(pool.available(), 1);
        pool.release(a);
        assert_eq!((pool.available(), pool.cached_free()), (2, 1));
        // A second block with the same content does not replace the first.
        let b = pool.allocate().unwrap();
        pool.register(b, key(7));
        assert_eq!(pool.lookup(&key(7)), Some(a));
        pool.release(b);
        assert_eq!(pool.cached_free(), 1, "b was never registered");
    }

    #[test]
    fn chain_hashes_depend_on_every_earlier_block() {
        let a = BlockKey::new(ROOT_HASH, &[1; BLOCK]);
        let b = BlockKey::new(a.chain_hash(), &[2; BLOCK]);
        let b2 = BlockKey::new(
            BlockKey::new(ROOT_HASH, &[3; BLOCK]).chain_hash(),
            &[2; BLOCK],
        );
        assert_ne!(b.chain_hash(), b2.chain_hash());
        assert_eq!(b, BlockKey::new(a.chain_hash(), &[2; BLOCK]));
    }
}
