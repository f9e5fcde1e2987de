//! Drafts from earlier traffic: the outputs of finished requests, in one
//! suffix trie per tenant, under a memory bound with least-recently-used
//! eviction of whole outputs.
//!
//! Agents repeat themselves across calls (the same tool-call shapes, the
//! same schema, the same code with small edits), so what earlier requests
//! produced predicts what this one will. Tenants are kept apart by
//! default: how fast a request's drafts are accepted could otherwise tell
//! one tenant what another's requests produced. A server with one user
//! can share one trie (`--spec-share-tenants`).

use std::collections::HashMap;

use super::drafter::{Draft, Source};
use super::suffix_trie::{Growth, SuffixTrie, NODE_BYTES};

/// The server's default bound. At ~30 trie nodes of 28 bytes per output
/// token (depth 40) it keeps the last ~20,000 tokens of outputs: an agent's
/// recent turns, which is where repeated text comes from. It is reached in
/// about a minute and a half of `bench/soak` (64 streams), so the server's
/// memory is flat after that; 64 MiB kept growing for six minutes
/// (docs/PERF.md §37).
pub const DEFAULT_TRAFFIC_CACHE_BYTES: usize = 16 << 20;

/// How the cache is bounded and shared.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrafficConfig {
    /// Most bytes of tries and stored outputs (live nodes; the arenas hold
    /// at most an eighth more).
    pub max_bytes: usize,
    /// One trie for every tenant (a single-user server).
    pub share_tenants: bool,
    /// Longest substring kept (match and draft together).
    pub depth: usize,
}

impl Default for TrafficConfig {
    fn default() -> Self {
        TrafficConfig {
            max_bytes: DEFAULT_TRAFFIC_CACHE_BYTES,
            share_tenants: false,
            depth: 40,
        }
    }
}

/// Prompt tokens stored before an output, so that its first tokens can be
/// drafted after the same turn header.
const PROMPT_TAIL: usize = 16;
/// Bytes of bookkeeping per stored output besides its tokens.
const DOC_OVERHEAD: usize = 64;
/// Bytes of bookkeeping per tenant besides its key: its map entry, its
/// trie's root and tables. Counted so that many tenants with one short
/// output each cannot hold more than the bound.
const TENANT_OVERHEAD: usize = 256;

#[derive(Debug)]
struct Doc {
    tokens: Vec<u32>,
    /// Clock of its insertion or of the last draft matched in its text.
    used: u64,
}

#[derive(Debug)]
struct TenantTrie {
    trie: SuffixTrie,
    docs: HashMap<u32, Doc>,
    next_doc: u32,
    /// Bytes of the stored outputs.
    doc_bytes: usize,
    /// Its key's and its own bookkeeping's bytes.
    fixed_bytes: usize,
}

impl TenantTrie {
    /// Live bytes: what the bound counts.
    fn bytes(&self) -> usize {
        self.trie.live_bytes() + self.doc_bytes + self.fixed_bytes
    }
}

/// What the cache holds, for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TrafficStats {
    /// Bytes held by the tries' arenas and the stored outputs.
    pub bytes: usize,
    pub nodes: usize,
    pub outputs: usize,
    pub tenants: usize,
    /// Outputs evicted to stay within the bound, since the start.
    pub evicted: u64,
}

/// The suffix tries of earlier outputs, per tenant.
#[derive(Debug)]
pub struct TrafficCache {
    config: TrafficConfig,
    tenants: HashMap<String, TenantTrie>,
    clock: u64,
    evicted: u64,
    /// Live bytes of every tenant, kept current.
    bytes: usize,
}

impl TrafficCache {
    pub fn new(config: TrafficConfig) -> TrafficCache {
        TrafficCache {
            config,
            tenants: HashMap::new(),
            clock: 0,
            evicted: 0,
            bytes: 0,
        }
    }

    pub fn config(&self) -> TrafficConfig {
        self.config
    }

    fn key<'a>(&self, tenant: &'a str) -> &'a str {
        if self.config.share_tenants {
            ""
        } else {
            tenant
        }
    }

    /// Stores what a request of `tenant` produced: `history` is its prompt
    /// (`prompt_len` tokens) then its output. Older outputs are evicted,
    /// least recently used first, to stay within the bound.
    pub fn add(&mut self, tenant: &str, history: &[u32], prompt_len: usize) {
        let prompt_len = prompt_len.min(history.len());
        if prompt_len == history.len() {
            return;
        }
        let tokens = history[prompt_len.saturating_sub(PROMPT_TAIL)..].to_vec();
        // An output that alone could exceed the bound is not stored (at
        // most one node per substring of up to `depth` tokens).
        let n = tokens.len();
        let most_nodes: usize = (0..n).map(|i| self.config.depth.min(n - i)).sum();
        let most_bytes = n * 4 + DOC_OVERHEAD + most_nodes * (NODE_BYTES + 8);
        if most_bytes > self.config.max_bytes {
            return;
        }
        self.clock += 1;
        let key = self.key(tenant).to_string();
        let depth = self.config.depth;
        let fixed_bytes = key.len() + TENANT_OVERHEAD;
        // A new tenant's whole size counts (its root and bookkeeping too).
        let new_tenant = !self.tenants.contains_key(&key);
        let t = self.tenants.entry(key).or_insert_with(|| TenantTrie {
            trie: SuffixTrie::new(depth),
            docs: HashMap::new(),
            next_doc: 0,
            fixed_bytes,
            doc_bytes: 0,
        });
        let before = if new_tenant { 0 } else { t.bytes() };
        let id = t.next_doc;
        t.next_doc = t.next_doc.wrapping_add(1);
        t.trie.insert(&tokens, id);
        t.doc_bytes += tokens.len() * 4 + DOC_OVERHEAD;
        t.docs.insert(
            id,
            Doc {
                tokens,
                used: self.clock,
            },
        );
        self.bytes = self.bytes + t.bytes() - before;
        self.evict();
    }

    /// Removes least recently used outputs until the cache is within its
    /// bound (the one just added is the most recently used).
    fn evict(&mut self) {
        while self.bytes > self.config.max_bytes {
            let oldest = self
                .tenants
                .iter()
                .flat_map(|(k, t)| t.docs.iter().map(move |(id, d)| (d.used, k, *id)))
                .min();
            let Some((_, key, id)) = oldest else {
                return;
            };
            let key = key.clone();
            let t = self.tenants.get_mut(&key).expect("the tenant holds it");
            let before = t.bytes();
            let doc = t.docs.remove(&id).expect("the output is stored");
            t.trie.remove(&doc.tokens);
            t.doc_bytes -= doc.tokens.len() * 4 + DOC_OVERHEAD;
            self.bytes -= before - t.bytes();
            if t.docs.is_empty() {
                self.bytes -= t.bytes();
                self.tenants.remove(&key);
            }
            self.evicted += 1;
        }
    }

    /// Continuations of `history` from `tenant`'s earlier outputs: the
    /// longest suffix (at most `max_match` tokens) found in them, grown as
    /// a branching tree. The output the match came from counts as used.
    pub fn propose(
        &mut self,
        tenant: &str,
        history: &[u32],
        max_match: usize,
        growth: Growth,
    ) -> Vec<Draft> {
        let key = self.key(tenant);
        let Some(t) = self.tenants.get_mut(key) else {
            return Vec::new();
        };
        let Some(m) = t.trie.longest_match(history, max_match) else {
            return Vec::new();
        };
        self.clock += 1;
        if let Some(doc) = t.docs.get_mut(&t.trie.match_doc(m)) {
            doc.used = self.clock;
        }
        t.trie.grow(m, growth, Source::Traffic)
    }

    pub fn stats(&self) -> TrafficStats {
        TrafficStats {
            bytes: self
                .tenants
                .iter()
                .map(|(k, t)| t.trie.bytes() + t.doc_bytes + k.capacity() + DOC_OVERHEAD)
                .sum(),
            nodes: self.tenants.values().map(|t| t.trie.nodes()).sum(),
            outputs: self.tenants.values().map(|t| t.docs.len()).sum(),
            tenants: self.tenants.len(),
            evicted: self.evicted,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn growth() -> Growth {
        Growth {
            max_nodes: 16,
            max_depth: 8,
            nodes_per_match_token: 16.0,
            min_prob: 0.0,
        }
    }

    fn drafted(c: &mut TrafficCache, tenant: &str, history: &[u32]) -> Vec<Vec<u32>> {
        c.propose(tenant, history, 8, growth())
            .into_iter()
            .map(|d| d.tokens)
            .collect()
    }

    #[test]
    fn tenants_see_only_their_own_outputs_unless_shared() {
        let mut c = TrafficCache::new(TrafficConfig::default());
        // Prompt [1, 2], output [3, 4, 5].
        c.add("alice", &[1, 2, 3, 4, 5], 2);
        assert_eq!(drafted(&mut c, "alice", &[9, 2, 3]), vec![vec![4, 5]]);
        // The prompt's tail is stored too: the output's first token is drafted
        // after the same prompt end.
        assert_eq!(drafted(&mut c, "alice", &[2]), vec![vec![3, 4, 5]]);
        assert!(drafted(&mut c, "bob", &[9, 2, 3]).is_empty());
        let mut shared = TrafficCache::new(TrafficConfig {
            share_tenants: true,
            ..TrafficConfig::default()
        });
        shared.add("alice", &[1, 2, 3, 4, 5], 2);
        assert_eq!(drafted(&mut shared, "bob", &[9, 2, 3]), vec![vec![4, 5]]);
        // A request that produced nothing stores nothing.
        c.add("carol", &[1, 2], 2);
        assert_eq!(c.stats().tenants, 1);
    }

    #[test]
    fn the_least_recently_used_output_is_evicted_first() {
        let one = |first: u32| -> Vec<u32> { (first..first + 20).collect() };
        let mut probe = TrafficCache::new(TrafficConfig::default());
        probe.add("t", &one(100), 0);
        // Room for about two and a half outputs of this size (live bytes).
        let live = probe.bytes;
        let mut c = TrafficCache::new(TrafficConfig {
            max_bytes: live * 5 / 2,
            ..TrafficConfig::default()
        });
        c.add("t", &one(100), 0);
        c.add("t", &one(200), 0);
        // A draft from the first output makes it the most recently used.
        assert!(!drafted(&mut c, "t", &[101, 102]).is_empty());
        c.add("t", &one(300), 0);
        let s = c.stats();
        assert_eq!((s.outputs, s.evicted), (2, 1));
        assert!(c.bytes <= c.config.max_bytes);
        assert!(!drafted(&mut c, "t", &[101, 102]).is_empty(), "kept: used");
        assert!(drafted(&mut c, "t", &[201, 202]).is_empty(), "evicted");
        assert!(
            !drafted(&mut c, "t", &[301, 302]).is_empty(),
            "kept: newest"
        );
        // Eviction takes back exactly what the output put in: with every
        // output evicted the trie is empty again.
        let mut tiny = TrafficCache::new(TrafficConfig {
            max_bytes: live * 3 / 2,
            ..TrafficConfig::default()
        });
        tiny.add("t", &one(100), 0);
        tiny.add("u", &one(200), 0);
        let s = tiny.stats();
        assert_eq!((s.outputs, s.tenants, s.evicted), (1, 1, 1));
        assert!(drafted(&mut tiny, "t", &[101, 102]).is_empty());
        assert_eq!(tiny.bytes, live);
    }

    #[test]
    fn many_tenants_with_one_short_output_each_stay_within_the_bound() {
        let bound = 64 << 10;
        let mut c = TrafficCache::new(TrafficConfig {
            max_bytes: bound,
            ..TrafficConfig::default()
        });
        for i in 0..10_000 {
            c.add(&format!("tenant-{i}"), &[1, 2, 3], 2);
        }
        let s = c.stats();
        assert!(c.bytes <= bound, "{} bytes", c.bytes);
        // Each tenant's bookkeeping counts: without it 10,000 tenants of a
        // few nodes each fitted in 64 KiB of counted bytes.
        assert!(
            s.tenants * TENANT_OVERHEAD <= bound,
            "{} tenants",
            s.tenants
        );
        assert!(s.evicted > 0);
        // All evicted: nothing is left counted.
        let mut empty = TrafficCache::new(TrafficConfig {
            max_bytes: bound,
            ..TrafficConfig::default()
        });
        empty.add("a", &[1, 2, 3], 2);
        empty.config.max_bytes = 0;
        empty.evict();
        assert_eq!((empty.bytes, empty.stats().tenants), (0, 0));
    }
}
