//! Candidate continuations merged into a token trie (shared prefixes once),
//! cut to a node budget by the probability that each node is reached.

use super::drafter::Source;

/// Deepest a tree may go (tokens drafted past the pending one).
pub const MAX_DEPTH: usize = 16;

/// One drafted token.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub token: u32,
    /// The node this one follows; `None` for a child of the root (the
    /// pending token, which every tree starts from).
    pub parent: Option<usize>,
    /// 1 for children of the root.
    pub depth: usize,
    /// Estimated probability that the verifier reaches this node: the
    /// product of acceptance estimates along its path (the largest over
    /// drafts that share the path), until the budget policy replaces it by
    /// what it measured ([`super::TreeBudget::choose`]).
    pub reach: f32,
    /// Certain once its parent is accepted: every draft through it gave it
    /// probability exactly [`CERTAIN`] (the grammar forces it).
    pub certain: bool,
    /// The sources that proposed it (bits of [`Source::bit`]).
    pub sources: u8,
}

/// A draft probability that means "the grammar forces this token": only
/// grammar drafts use it; drafters' estimates stay below it.
pub const CERTAIN: f32 = 1.0;

/// A token tree: nodes in an order where every parent precedes its children.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TokenTree {
    pub nodes: Vec<Node>,
    /// The first `forced` nodes are the chain a grammar forces after the
    /// pending token: certain to be accepted, so the budget policy counts
    /// them outside the budget and acceptance statistics leave them out.
    pub forced: usize,
}

impl TokenTree {
    /// Merges `drafts` into a trie, then keeps the `budget` nodes most likely
    /// to be reached ([`TokenTree::cut`]), at most [`MAX_DEPTH`] deep.
    pub fn build(drafts: &[super::Draft], budget: usize) -> TokenTree {
        Self::trie(drafts).cut(budget)
    }

    /// All of `drafts` merged into a trie (shared prefixes once), at most
    /// [`MAX_DEPTH`] deep.
    fn trie(drafts: &[super::Draft]) -> TokenTree {
        let mut all: Vec<Node> = Vec::new();
        for d in drafts {
            let mut parent = None;
            let mut reach = 1.0f32;
            for (i, (&token, &p)) in d.tokens.iter().zip(&d.probs).take(MAX_DEPTH).enumerate() {
                reach *= p.clamp(0.0, 1.0);
                let existing = all
                    .iter()
                    .position(|n| n.parent == parent && n.token == token);
                let at = match existing {
                    Some(at) => {
                        all[at].reach = all[at].reach.max(reach);
                        all[at].certain &= p == CERTAIN;
                        all[at].sources |= d.source.bit();
                        at
                    }
                    None => {
                        all.push(Node {
                            token,
                            parent,
                            depth: i + 1,
                            reach,
                            certain: p == CERTAIN,
                            sources: d.source.bit(),
                        });
                        all.len() - 1
                    }
                };
                parent = Some(at);
            }
        }
        // A child's reach may have been raised above its parent's by
        // another draft: cap it, so a cut keeps whole paths.
        for i in 0..all.len() {
            if let Some(p) = all[i].parent {
                all[i].reach = all[i].reach.min(all[p].reach);
            }
        }
        TokenTree {
            nodes: all,
            forced: 0,
        }
    }

    /// Node indices, most likely to be reached first; ties go to the
    /// shallower (so parents come before their children), then to the
    /// earlier node. Any prefix of this order is a tree.
    pub fn by_likelihood(&self) -> Vec<usize> {
        let all = &self.nodes;
        let mut order: Vec<usize> = (0..all.len()).collect();
        order.sort_by(|&a, &b| {
            all[b]
                .reach
                .total_cmp(&all[a].reach)
                .then(all[a].depth.cmp(&all[b].depth))
                .then(a.cmp(&b))
        });
        order
    }

    /// The `budget` nodes most likely to be reached (a parent is always at
    /// least as likely as its children, so what is kept is a tree).
    pub fn cut(&self, budget: usize) -> TokenTree {
        let all = &self.nodes;
        let mut order = self.by_likelihood();
        order.truncate(budget);
        // Keep insertion order (parents before children), renumbered.
        order.sort_unstable();
        let mut new_index = vec![usize::MAX; all.len()];
        let mut nodes = Vec::with_capacity(order.len());
        for &i in &order {
            let parent = match all[i].parent {
                None => None,
                Some(p) if new_index[p] != usize::MAX => Some(new_index[p]),
                // Unreachable by the caps above; drop the node to be safe.
                Some(_) => continue,
            };
            new_index[i] = nodes.len();
            nodes.push(Node {
                parent,
                ..all[i].clone()
            });
        }
        let forced = self.forced.min(nodes.len());
        TokenTree { nodes, forced }
    }

    /// The likeliest descendants of `node` (`None`: the root), as node
    /// indices: from each node, the child the drafters rated likeliest to
    /// be reached (the path whose logits a walk reads first).
    pub fn likeliest_below(&self, mut node: Option<usize>) -> Vec<usize> {
        let mut path = Vec::new();
        while let Some((i, _)) = self
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.parent == node)
            .max_by(|(a, x), (b, y)| x.reach.total_cmp(&y.reach).then(b.cmp(a)))
        {
            path.push(i);
            node = Some(i);
        }
        path
    }

    /// The tokens of the likeliest path from the root.
    pub fn likeliest_tokens(&self) -> Vec<u32> {
        self.likeliest_below(None)
            .into_iter()
            .map(|i| self.nodes[i].token)
            .collect()
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Nodes each source proposed, and how many of those a walk accepted
    /// (`accepted`: the accepted nodes, in order), by [`Source::index`].
    /// A node two sources proposed counts for both.
    pub fn source_counts(&self, accepted: &[usize]) -> [(u64, u64); Source::COUNT] {
        let mut counts = [(0u64, 0u64); Source::COUNT];
        for (i, n) in self.nodes.iter().enumerate() {
            for s in Source::ALL {
                if n.sources & s.bit() != 0 {
                    counts[s.index()].0 += 1;
                    counts[s.index()].1 += accepted.contains(&i) as u64;
                }
            }
        }
        counts
    }

    /// The child of `parent` (`None`: the root) holding `token`.
    pub fn child(&self, parent: Option<usize>, token: u32) -> Option<usize> {
        self.nodes
            .iter()
            .position(|n| n.parent == parent && n.token == token)
    }
}

#[cfg(test)]
mod tests {
    use super::super::Draft;
    use super::*;

    fn d(tokens: &[u32], p: f32) -> Draft {
        Draft::uniform(tokens.to_vec(), p)
    }

    #[test]
    fn shared_prefixes_are_merged() {
        let t = TokenTree::build(&[d(&[1, 2, 3], 0.9), d(&[1, 2, 4], 0.5), d(&[5], 0.5)], 16);
        let tokens: Vec<(u32, Option<usize>)> =
            t.nodes.iter().map(|n| (n.token, n.parent)).collect();
        assert_eq!(
            tokens,
            vec![
                (1, None),
                (2, Some(0)),
                (3, Some(1)),
                (4, Some(1)),
                (5, None)
            ]
        );
        assert_eq!(t.nodes[2].depth, 3);
        // 1 is reached with 0.9 (the better of the two drafts).
        assert!((t.nodes[0].reach - 0.9).abs() < 1e-6);
        assert_eq!(t.child(Some(1), 4), Some(3));
        assert_eq!(t.child(None, 2), None);
    }

    #[test]
    fn the_budget_keeps_the_likeliest_whole_paths() {
        // Reach: 1: .9, 2: .81, 3: .729; 5: .5; 4: .5^3 = .125 (its own
        // draft's product).
        let t = TokenTree::build(&[d(&[1, 2, 3], 0.9), d(&[1, 2, 4], 0.5), d(&[5], 0.5)], 4);
        let tokens: Vec<u32> = t.nodes.iter().map(|n| n.token).collect();
        assert_eq!(tokens, vec![1, 2, 3, 5]);
        for (i, n) in t.nodes.iter().enumerate() {
            if let Some(p) = n.parent {
                assert!(p < i, "parents come first");
            }
        }
        assert!(TokenTree::build(&[d(&[1, 2], 0.9)], 0).is_empty());
    }

    #[test]
    fn merged_nodes_keep_every_source() {
        let t = TokenTree::build(
            &[
                d(&[1, 2], 0.9).from(Source::Request),
                d(&[1, 3], 0.5).from(Source::Traffic),
            ],
            16,
        );
        let both = Source::Request.bit() | Source::Traffic.bit();
        assert_eq!(t.nodes[0].sources, both);
        assert_eq!(t.nodes[1].sources, Source::Request.bit());
        assert_eq!(t.nodes[2].sources, Source::Traffic.bit());
        // The walk took 1 then 3.
        let c = t.source_counts(&[0, 2]);
        assert_eq!(c[Source::Request.index()], (2, 1));
        assert_eq!(c[Source::Traffic.index()], (2, 2));
        assert_eq!(c[Source::Ngram.index()], (0, 0));
    }

    #[test]
    fn depth_is_capped() {
        let long: Vec<u32> = (0..40).collect();
        let t = TokenTree::build(&[d(&long, 1.0)], 64);
        assert_eq!(t.len(), MAX_DEPTH);
    }
}
