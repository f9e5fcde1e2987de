//! A suffix trie of bounded depth with occurrence counts: every substring
//! of at most `depth` tokens of the texts put in is a path from the root,
//! and a node's count is how often its substring occurs. The longest
//! suffix of the text so far that is a path says where we are; its
//! children, weighed by their counts, are what followed there before.
//!
//! This is the structure of SuffixDecoding (arXiv 2411.04975) with the
//! depth bound its implementation uses: a node per (substring, position
//! in the trie), built in `O(len * depth)`, so no suffix links are needed.
//! Children are a sibling list (most nodes have one or two), except the
//! root's, which are hashed (one per distinct token).

use std::collections::{BinaryHeap, HashMap};

use super::drafter::{Draft, Source};

const NONE: u32 = u32::MAX;
const ROOT: u32 = 0;

#[derive(Debug, Clone)]
struct Node {
    token: u32,
    /// Occurrences of the node's substring.
    count: u32,
    parent: u32,
    first_child: u32,
    next_sibling: u32,
    /// Length of the node's substring.
    depth: u32,
    /// The last document whose text passed through the node (for
    /// least-recently-used eviction: the document a draft came from).
    doc: u32,
}

/// A bounded-depth suffix trie with counts.
#[derive(Debug, Clone)]
pub struct SuffixTrie {
    nodes: Vec<Node>,
    free: Vec<u32>,
    /// The root's children by token.
    roots: HashMap<u32, u32>,
    depth: usize,
    /// Nodes in use, the root included.
    live: usize,
    /// For [`SuffixTrie::append`]: the nodes of the substrings that end at
    /// the last appended token, longest first.
    active: Vec<u32>,
    /// The next `active`, kept to reuse its memory.
    spare: Vec<u32>,
}

/// Where the text so far was found: a node and the length of the suffix
/// it matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Match {
    node: u32,
    pub len: usize,
}

/// What a draft from the trie was grown with.
#[derive(Debug, Clone, Copy)]
pub struct Growth {
    /// Most nodes proposed.
    pub max_nodes: usize,
    /// Deepest path below the match.
    pub max_depth: usize,
    /// Nodes per matched token: a longer match is more specific, so it may
    /// propose more ("size scaled by match length").
    pub nodes_per_match_token: f32,
    /// Paths less likely than this are not proposed.
    pub min_prob: f32,
}

/// Bytes one node takes (its slot in the arena, and a hash entry for the
/// root's children).
pub const NODE_BYTES: usize = std::mem::size_of::<Node>();

impl SuffixTrie {
    /// An empty trie of substrings up to `depth` tokens.
    pub fn new(depth: usize) -> SuffixTrie {
        SuffixTrie {
            nodes: vec![Node {
                token: NONE,
                count: 0,
                parent: NONE,
                first_child: NONE,
                next_sibling: NONE,
                depth: 0,
                doc: NONE,
            }],
            free: Vec::new(),
            roots: HashMap::new(),
            depth: depth.max(1),
            live: 1,
            active: Vec::new(),
            spare: Vec::new(),
        }
    }

    /// The deepest substring kept.
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// Nodes in use (the root included).
    pub fn nodes(&self) -> usize {
        self.live
    }

    /// Memory its live nodes take (what the traffic cache's bound counts).
    pub fn live_bytes(&self) -> usize {
        self.live * NODE_BYTES + self.roots.len() * 2 * std::mem::size_of::<u32>()
    }

    /// Memory the trie holds: its node arena (free slots included) and the
    /// root's hash table.
    pub fn bytes(&self) -> usize {
        self.nodes.capacity() * NODE_BYTES
            + self.roots.capacity() * 2 * std::mem::size_of::<u32>()
            + (self.active.capacity() + self.spare.capacity()) * std::mem::size_of::<u32>()
    }

    fn child(&self, node: u32, token: u32) -> u32 {
        if node == ROOT {
            return self.roots.get(&token).copied().unwrap_or(NONE);
        }
        let mut c = self.nodes[node as usize].first_child;
        while c != NONE && self.nodes[c as usize].token != token {
            c = self.nodes[c as usize].next_sibling;
        }
        c
    }

    fn children(&self, node: u32) -> impl Iterator<Item = u32> + '_ {
        let mut c = self.nodes[node as usize].first_child;
        std::iter::from_fn(move || {
            let here = c;
            (here != NONE).then(|| {
                c = self.nodes[here as usize].next_sibling;
                here
            })
        })
    }

    /// The child of `node` holding `token`, made if missing; its count is
    /// raised by one and its document set to `doc`.
    fn touch_child(&mut self, node: u32, token: u32, doc: u32) -> u32 {
        let mut c = self.child(node, token);
        if c == NONE {
            let fresh = Node {
                token,
                count: 0,
                parent: node,
                first_child: NONE,
                next_sibling: self.nodes[node as usize].first_child,
                depth: self.nodes[node as usize].depth + 1,
                doc,
            };
            c = match self.free.pop() {
                Some(i) => {
                    self.nodes[i as usize] = fresh;
                    i
                }
                None => {
                    // Grown by an eighth at a time, so the arena holds little
                    // more than its live nodes (the traffic cache's bound
                    // counts live nodes).
                    if self.nodes.len() == self.nodes.capacity() {
                        self.nodes.reserve_exact((self.nodes.len() / 8).max(64));
                    }
                    self.nodes.push(fresh);
                    (self.nodes.len() - 1) as u32
                }
            };
            self.nodes[node as usize].first_child = c;
            if node == ROOT {
                self.roots.insert(token, c);
            }
            self.live += 1;
        }
        let n = &mut self.nodes[c as usize];
        n.count += 1;
        n.doc = doc;
        c
    }

    /// Puts every substring of `tokens` (up to the depth) in, counted once
    /// per occurrence, as document `doc`.
    pub fn insert(&mut self, tokens: &[u32], doc: u32) {
        for start in 0..tokens.len() {
            let mut node = ROOT;
            for &t in &tokens[start..tokens.len().min(start + self.depth)] {
                node = self.touch_child(node, t, doc);
            }
        }
    }

    /// Takes back what [`SuffixTrie::insert`] put in for the same `tokens`:
    /// counts fall, and nodes no text passes through any more are freed.
    pub fn remove(&mut self, tokens: &[u32]) {
        for start in 0..tokens.len() {
            let mut node = ROOT;
            let mut first_empty = NONE;
            for &t in &tokens[start..tokens.len().min(start + self.depth)] {
                let c = self.child(node, t);
                if c == NONE {
                    // Not what was inserted; nothing more to take back here.
                    break;
                }
                let n = &mut self.nodes[c as usize];
                n.count = n.count.saturating_sub(1);
                if n.count == 0 && first_empty == NONE {
                    first_empty = c;
                }
                node = c;
            }
            if first_empty != NONE {
                self.unlink_subtree(first_empty);
            }
        }
    }

    /// Frees `node` and everything below it (all of it has count 0).
    fn unlink_subtree(&mut self, node: u32) {
        let parent = self.nodes[node as usize].parent;
        // Out of the parent's sibling list.
        let first = self.nodes[parent as usize].first_child;
        let next = self.nodes[node as usize].next_sibling;
        if first == node {
            self.nodes[parent as usize].first_child = next;
        } else {
            let mut c = first;
            while self.nodes[c as usize].next_sibling != node {
                c = self.nodes[c as usize].next_sibling;
            }
            self.nodes[c as usize].next_sibling = next;
        }
        if parent == ROOT {
            self.roots.remove(&self.nodes[node as usize].token);
        }
        let mut stack = vec![node];
        while let Some(n) = stack.pop() {
            stack.extend(self.children(n));
            self.nodes[n as usize].first_child = NONE;
            self.nodes[n as usize].count = 0;
            self.free.push(n);
            self.live -= 1;
        }
    }

    /// Appends one token to a text that grows (a request's prompt and
    /// output): the substrings ending at it are counted, in `O(depth)`.
    pub fn append(&mut self, token: u32) {
        let mut next = std::mem::take(&mut self.spare);
        next.clear();
        let active = std::mem::take(&mut self.active);
        for &a in &active {
            if (self.nodes[a as usize].depth as usize) < self.depth {
                next.push(self.touch_child(a, token, 0));
            }
        }
        next.push(self.touch_child(ROOT, token, 0));
        self.active = next;
        self.spare = active;
    }

    /// Empties the trie, keeping its memory for the next text.
    pub fn clear(&mut self) {
        self.nodes.truncate(1);
        let root = &mut self.nodes[0];
        root.first_child = NONE;
        root.count = 0;
        self.free.clear();
        self.roots.clear();
        self.active.clear();
        self.live = 1;
    }

    /// The longest suffix of `history`, at most `max_len` tokens, that is a
    /// path with a continuation (a node with children). `None` when not even
    /// the last token was seen before with something after it.
    pub fn longest_match(&self, history: &[u32], max_len: usize) -> Option<Match> {
        let max_len = max_len.min(history.len()).min(self.depth - 1);
        // If a suffix is a path, so is every shorter one: grow the match
        // from the end, keeping the longest that has a continuation.
        let mut best = None;
        for len in 1..=max_len {
            let mut node = ROOT;
            for &t in &history[history.len() - len..] {
                node = self.child(node, t);
                if node == NONE {
                    return best;
                }
            }
            if self.nodes[node as usize].first_child != NONE {
                best = Some(Match { node, len });
            }
        }
        best
    }

    /// The document that last passed through the matched node.
    pub fn match_doc(&self, m: Match) -> u32 {
        self.nodes[m.node as usize].doc
    }

    /// How many times the matched suffix occurred.
    pub fn match_count(&self, m: Match) -> u32 {
        self.nodes[m.node as usize].count
    }

    /// Continuations of a match as a branching tree, grown best-first by
    /// the empirical probability of each path (each step: a child's count
    /// over its siblings' counts plus one, since one more occurrence, the
    /// current one, has an unknown continuation), returned as one draft
    /// per leaf. At most `growth.max_nodes`, and `nodes_per_match_token`
    /// per matched token.
    pub fn grow(&self, m: Match, growth: Growth, source: Source) -> Vec<Draft> {
        let budget = growth
            .max_nodes
            .min((growth.nodes_per_match_token * m.len as f32).ceil() as usize);
        if budget == 0 || growth.max_depth == 0 {
            return Vec::new();
        }
        // (path probability, node, its own step probability, parent index
        // in `kept`).
        #[derive(PartialEq)]
        struct Open(f32, u32, f32, usize);
        impl Eq for Open {}
        impl PartialOrd for Open {
            fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
                Some(self.cmp(o))
            }
        }
        impl Ord for Open {
            fn cmp(&self, o: &Self) -> std::cmp::Ordering {
                // Likeliest first; ties to the lower node index (older),
                // so the order does not depend on the heap.
                self.0.total_cmp(&o.0).then(o.1.cmp(&self.1))
            }
        }
        let mut heap = BinaryHeap::new();
        let push_children = |heap: &mut BinaryHeap<Open>, node: u32, reach: f32, at: usize| {
            let total: u32 = self
                .children(node)
                .map(|c| self.nodes[c as usize].count)
                .sum();
            for c in self.children(node) {
                let p = self.nodes[c as usize].count as f32 / (total + 1) as f32;
                if reach * p >= growth.min_prob {
                    heap.push(Open(reach * p, c, p, at));
                }
            }
        };
        // kept: (node, step probability, parent in kept, depth below match).
        let mut kept: Vec<(u32, f32, usize, usize)> = Vec::new();
        push_children(&mut heap, m.node, 1.0, usize::MAX);
        while let Some(Open(reach, node, p, parent)) = heap.pop() {
            let depth = if parent == usize::MAX {
                1
            } else {
                kept[parent].3 + 1
            };
            kept.push((node, p, parent, depth));
            if kept.len() >= budget {
                break;
            }
            if depth < growth.max_depth {
                push_children(&mut heap, node, reach, kept.len() - 1);
            }
        }
        // One draft per leaf: the path from the match down to it.
        let mut has_child = vec![false; kept.len()];
        for k in &kept {
            if k.2 != usize::MAX {
                has_child[k.2] = true;
            }
        }
        let mut drafts = Vec::new();
        for leaf in (0..kept.len()).filter(|&i| !has_child[i]) {
            let (mut tokens, mut probs) = (Vec::new(), Vec::new());
            let mut at = leaf;
            while at != usize::MAX {
                tokens.push(self.nodes[kept[at].0 as usize].token);
                probs.push(kept[at].1);
                at = kept[at].2;
            }
            tokens.reverse();
            probs.reverse();
            drafts.push(Draft {
                tokens,
                probs,
                source,
            });
        }
        drafts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn growth(max_nodes: usize) -> Growth {
        Growth {
            max_nodes,
            max_depth: 8,
            nodes_per_match_token: 100.0,
            min_prob: 0.0,
        }
    }

    /// Occurrences of `s` in `text`, counted by brute force.
    fn occurrences(text: &[u32], s: &[u32]) -> u32 {
        text.windows(s.len()).filter(|w| *w == s).count() as u32
    }

    #[test]
    fn counts_are_occurrences_of_every_short_substring() {
        let text = [1, 2, 3, 1, 2, 4, 1, 2, 3, 5, 2, 3];
        let mut t = SuffixTrie::new(4);
        t.insert(&text, 7);
        let mut appended = SuffixTrie::new(4);
        for &x in &text {
            appended.append(x);
        }
        for trie in [&t, &appended] {
            for len in 1..=4 {
                for s in text.windows(len) {
                    let mut node = ROOT;
                    for &x in s {
                        node = trie.child(node, x);
                    }
                    assert_eq!(
                        trie.nodes[node as usize].count,
                        occurrences(&text, s),
                        "{s:?}"
                    );
                }
            }
            // Nothing longer than the depth.
            let mut node = ROOT;
            for &x in &text[..4] {
                node = trie.child(node, x);
            }
            assert_eq!(trie.nodes[node as usize].first_child, NONE);
        }
        assert_eq!(t.nodes(), appended.nodes());
    }

    #[test]
    fn the_longest_suffix_with_a_continuation_is_matched() {
        let mut t = SuffixTrie::new(8);
        t.insert(&[1, 2, 3, 4, 9, 2, 3, 5], 0);
        // "... 1 2 3": the whole of "1 2 3" was followed by 4.
        let m = t.longest_match(&[7, 1, 2, 3], 6).unwrap();
        assert_eq!(m.len, 3);
        // "... 8 2 3": only "2 3" occurred (twice, then 4 or 5).
        let m = t.longest_match(&[8, 2, 3], 6).unwrap();
        assert_eq!((m.len, t.match_count(m)), (2, 2));
        // "5" ends the text: it was never followed by anything.
        assert_eq!(t.longest_match(&[5], 6), None);
        assert_eq!(t.longest_match(&[6], 6), None);
        assert_eq!(t.longest_match(&[], 6), None);
    }

    #[test]
    fn trees_branch_by_counts() {
        let mut t = SuffixTrie::new(8);
        // After "7": "1 2" three times, "3" once.
        t.insert(&[7, 1, 2, 0, 7, 1, 2, 0, 7, 3, 0, 7, 1, 2], 0);
        let m = t.longest_match(&[5, 7], 4).unwrap();
        assert_eq!(m.len, 1);
        let shallow = Growth {
            max_depth: 2,
            ..growth(3)
        };
        let drafts = t.grow(m, shallow, Source::Traffic);
        let paths: Vec<Vec<u32>> = drafts.iter().map(|d| d.tokens.clone()).collect();
        // Best-first: 1 (3/5), then 2 after it (3/4 * 3/5), then 3 (1/5)
        // (0 after "7 1 2", at 0.225, is below the depth).
        assert_eq!(paths, vec![vec![1, 2], vec![3]]);
        assert!((drafts[0].probs[0] - 3.0 / 5.0).abs() < 1e-6);
        assert!((drafts[0].probs[1] - 3.0 / 4.0).abs() < 1e-6);
        assert!((drafts[1].probs[0] - 1.0 / 5.0).abs() < 1e-6);
        assert!(drafts.iter().all(|d| d.source == Source::Traffic));
        // Scaled by match length: one matched token allows 2 nodes here.
        let scaled = t.grow(
            m,
            Growth {
                nodes_per_match_token: 2.0,
                ..growth(16)
            },
            Source::Traffic,
        );
        assert_eq!(scaled.iter().map(|d| d.tokens.len()).sum::<usize>(), 2);
        // Deeper, 0 after "7 1 2" (3/5 * 3/4 * 2/4) beats 3 (1/5).
        let deep = t.grow(m, growth(3), Source::Traffic);
        assert_eq!(deep.len(), 1);
        assert_eq!(deep[0].tokens, vec![1, 2, 0]);
        // The path probability floor prunes the rare branch.
        let pruned = t.grow(
            m,
            Growth {
                min_prob: 0.3,
                ..growth(16)
            },
            Source::Traffic,
        );
        assert!(pruned.iter().all(|d| d.tokens[0] == 1), "{pruned:?}");
    }

    #[test]
    fn removing_a_document_takes_back_exactly_its_counts() {
        let a = [1, 2, 3, 4, 5];
        let b = [9, 2, 3, 4, 8];
        let mut t = SuffixTrie::new(4);
        t.insert(&a, 0);
        let only_a = t.nodes();
        t.insert(&b, 1);
        assert!(t.nodes() > only_a);
        t.remove(&b);
        assert_eq!(t.nodes(), only_a);
        let m = t.longest_match(&[2, 3, 4], 4).unwrap();
        assert_eq!(t.match_count(m), 1);
        let drafts = t.grow(m, growth(4), Source::Traffic);
        assert_eq!(drafts[0].tokens, vec![5]);
        t.remove(&a);
        assert_eq!(t.nodes(), 1);
        assert_eq!(t.longest_match(&[1, 2], 4), None);
        // Freed slots are reused.
        let cap = t.nodes.len();
        t.insert(&a, 2);
        assert_eq!(t.nodes.len(), cap);
    }
}
