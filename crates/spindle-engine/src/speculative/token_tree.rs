//! Candidate continuations merged into a token trie (shared prefixes once),
//! cut to a node budget by the probability that each node is reached.

use super::drafter::Source;
use crate::sampler::{gumbel_noise, SamplerConfig};

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

/// Sources whose shares among siblings are counts of what followed the
/// same context before (n-gram lookup, suffix tries), not a distribution
/// computed under the request's noise.
const COUNTED: u8 =
    1 << Source::Ngram as u8 | 1 << Source::Request as u8 | 1 << Source::Traffic as u8;

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

    /// [`TokenTree::build`] for a request sampled with `sampler`, whose
    /// first drafted token sits at absolute `position`: count-based
    /// siblings are ranked by the target's noise ([`TokenTree::couple`])
    /// before the cut.
    pub fn build_coupled(
        drafts: &[super::Draft],
        budget: usize,
        sampler: &SamplerConfig,
        position: usize,
    ) -> TokenTree {
        let mut all = Self::trie(drafts);
        all.couple(sampler, position);
        all.cut(budget)
    }

    /// Couples count-based drafts to the sampler's noise. At temperature
    /// 0 the likeliest child is the best guess, and nothing changes. When
    /// sampling, the target draws `argmax(logit/T + g)` with variates `g`
    /// keyed by seed, position and token; the counts' own Gumbel-max draw
    /// under those variates, `argmax(ln share + g)`, matches it far more
    /// often than their likeliest child does. So within each set of
    /// siblings that only count-based sources proposed, the child ranked
    /// first by `ln share + g` takes the largest share, the second the next,
    /// and so on (the shares themselves stay, as do every node's shares
    /// below it); reaches are recomputed from the shares. `position`: the
    /// absolute position of depth-1 nodes.
    pub fn couple(&mut self, sampler: &SamplerConfig, position: usize) {
        if sampler.is_greedy() || self.nodes.len() < 2 {
            return;
        }
        let nodes = &self.nodes;
        let reach_of = |p: Option<usize>| p.map_or(1.0, |p| nodes[p].reach as f64);
        let local: Vec<f64> = nodes
            .iter()
            .map(|n| (n.reach as f64 / reach_of(n.parent).max(1e-12)).clamp(1e-12, 1.0))
            .collect();
        let mut groups = std::collections::HashMap::<Option<usize>, Vec<usize>>::new();
        for (i, n) in nodes.iter().enumerate() {
            if !n.certain && n.sources & !COUNTED == 0 {
                groups.entry(n.parent).or_default().push(i);
            }
        }
        let mut coupled = local.clone();
        for group in groups.values().filter(|g| g.len() > 1) {
            let score = |i: usize| {
                let n = &nodes[i];
                local[i].ln() + gumbel_noise(sampler.seed, position + n.depth - 1, n.token)
            };
            let mut ranked: Vec<(f64, usize)> = group.iter().map(|&i| (score(i), i)).collect();
            ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            let mut shares: Vec<f64> = group.iter().map(|&i| local[i]).collect();
            shares.sort_by(|a, b| b.total_cmp(a));
            for ((_, i), share) in ranked.into_iter().zip(shares) {
                coupled[i] = share;
            }
        }
        // Parents come before their children.
        for (i, share) in coupled.into_iter().enumerate() {
            let parent = self.nodes[i]
                .parent
                .map_or(1.0, |p| self.nodes[p].reach as f64);
            self.nodes[i].reach = (parent * share) as f32;
        }
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

    /// Coupled to the noise, a set of count-based siblings gives its top
    /// share to each child about as often as that share (a Gumbel-max draw
    /// from the counts); greedy, nothing moves; a grammar's or a draft
    /// model's node keeps its place; a node's own subtree moves with it.
    #[test]
    fn coupling_draws_the_top_child_from_the_counts() {
        let drafts = [
            d(&[1, 7], 0.5).from(Source::Ngram),
            d(&[2], 0.3).from(Source::Request),
            d(&[3], 0.2).from(Source::Traffic),
            d(&[4], 0.4).from(Source::Model),
        ];
        let plain = TokenTree::build(&drafts, 16);
        let greedy = SamplerConfig::default();
        assert_eq!(TokenTree::build_coupled(&drafts, 16, &greedy, 10), plain);
        let mut top = [0usize; 3];
        let runs = 6000;
        for position in 0..runs {
            let sampler = SamplerConfig {
                temperature: 0.8,
                seed: 11,
                ..Default::default()
            };
            let t = TokenTree::build_coupled(&drafts, 16, &sampler, position);
            let reach = |token: u32| t.nodes[t.child(None, token).unwrap()].reach;
            let mut shares = [reach(1), reach(2), reach(3)];
            let winner = (0..3)
                .max_by(|&a, &b| shares[a].total_cmp(&shares[b]))
                .unwrap();
            top[winner] += 1;
            shares.sort_by(|a, b| b.total_cmp(a));
            assert_eq!(shares, [0.5, 0.3, 0.2]);
            assert_eq!(reach(4), 0.4);
            let below = t.nodes[t.child(t.child(None, 1), 7).unwrap()].reach;
            assert!((below - reach(1) * 0.5).abs() < 1e-6);
        }
        for (count, want) in top.iter().zip([0.5, 0.3, 0.2]) {
            let got = *count as f64 / runs as f64;
            assert!((got - want).abs() < 0.03, "{top:?}");
        }
    }
}
