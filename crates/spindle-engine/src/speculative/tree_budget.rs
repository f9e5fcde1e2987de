//! How many tree nodes to verify next: the budget that maximises expected
//! tokens per second, from what passes of each size have cost so far and
//! how well the drafter's estimates have held up.
//!
//! With `b` nodes, a pass costs `t(1 + b)` and commits `1 + reach(b)` tokens
//! on average, where `reach(b)` sums the probability of reaching each of the
//! `b` likeliest nodes. That probability is measured, not taken from the
//! drafter (drafters are often right about which token comes next and wrong
//! about how sure to be): a node is reached with its parent's probability
//! times `q`, the running rate at which the walk went on whenever the tree
//! offered a next token, times the node's share of the drafter's confidence
//! among its siblings (only one of them can be the model's token).
//!
//! `q` is learned per draft source and per depth ([`Acceptance`]): where the
//! walk stood at a node whose children came from several sources, each
//! source learns whether the model's token was among its children. So the
//! nodes go to the sources and depths that have been paying: an earlier
//! output matched deep into an agent's tool call, say, rather than a
//! one-token n-gram guess.
//!
//! `b = 0` is plain decoding, so where drafts keep failing the choice falls
//! back to it; a small probe every [`PROBE_EVERY`] plain passes lets `q`
//! recover (at most a few percent of the time).

use super::drafter::Source;
use super::token_tree::{TokenTree, MAX_DEPTH};

/// Budgets considered (nodes beyond the pending token).
const BUDGETS: [usize; 13] = [0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64];
/// Plain passes in a row before a small tree is tried anyway.
pub const PROBE_EVERY: usize = 16;
/// Nodes of a probe.
const PROBE_NODES: usize = 2;
/// Weight of the newest observation in running averages.
const EMA: f64 = 0.2;
/// Weight of one accepted or rejected token in the running acceptance rate.
const GO_ON_EMA: f64 = 0.1;
/// Acceptance rate before anything was verified.
const GO_ON_PRIOR: f64 = 0.6;
/// Observations at one (source, depth) that outweigh the source's rate over
/// all depths: until then a depth's estimate leans on the source's.
const DEPTH_PRIOR_WEIGHT: f64 = 4.0;
/// Gain over plain decoding a tree must promise before it is drafted: the
/// estimates are noisy, and a tree that only breaks even costs a little
/// more than plain decoding once the estimate is off.
const MIN_GAIN: f64 = 1.1;
/// Cost of each row beyond the first, relative to a one-row pass, before
/// any multi-row pass was timed: a little above what `spindle bench --rows`
/// measured on the development machine (2 rows 1.4x, 8 rows 3.7x, 16 rows
/// 5.2x).
const SLOPE: f64 = 0.4;

/// The adaptive budget policy of one generation.
#[derive(Debug, Clone)]
pub struct TreeBudget {
    /// Largest tree (default 16, at most 64).
    pub max_nodes: usize,
    /// Seconds of a one-row pass, running.
    one_row: Option<f64>,
    /// Seconds each further row adds, running (a pass of `n` rows is
    /// modelled as `one_row + n_more * (n - 1)`: one line fitted to every
    /// pass, so a noisy pass of one size cannot rule that size out for
    /// good).
    per_row: Option<f64>,
    /// How often the walk went on when the tree offered a next token, per
    /// source and depth.
    go_on: Acceptance,
    plain_streak: usize,
    /// Always verify the whole budget (no adaptation).
    fixed: bool,
    /// Seconds the drafter spends per drafted token, running (0 for n-gram
    /// lookup; most of a pass for a draft model).
    draft_token_seconds: f64,
    /// [`TreeBudget::draft_len`] asked for a probe: verify it whatever it is
    /// worth.
    probing: bool,
}

impl TreeBudget {
    pub fn new(max_nodes: usize) -> TreeBudget {
        let max_nodes = max_nodes.min(64);
        TreeBudget {
            max_nodes,
            one_row: None,
            per_row: None,
            go_on: Acceptance::default(),
            plain_streak: 0,
            fixed: false,
            draft_token_seconds: 0.0,
            probing: false,
        }
    }

    /// A policy that always verifies up to `max_nodes` nodes, whatever they
    /// cost: for tests and measurements.
    pub fn fixed(max_nodes: usize) -> TreeBudget {
        TreeBudget {
            fixed: true,
            ..TreeBudget::new(max_nodes)
        }
    }

    /// Seconds a pass of `rows` rows is expected to take.
    pub fn pass_seconds(&self, rows: usize) -> f64 {
        let one = self.one_row.unwrap_or(1.0);
        let per_row = self.per_row.unwrap_or(SLOPE * one);
        one + per_row * rows.saturating_sub(1) as f64
    }

    /// The number of nodes of `tree` (built with [`TreeBudget::max_nodes`]
    /// beyond its forced chain) to verify in the next pass: a budget for
    /// [`TokenTree::cut`]. The forced chain is always kept and is not part
    /// of the budget: it is certain, so it adds its tokens for the cost of
    /// its rows, and the drafted nodes after it are weighed on top of it.
    pub fn choose(&mut self, tree: &mut TokenTree) -> usize {
        let forced = tree.forced.min(tree.len());
        if self.fixed {
            return tree.len().min(forced + self.max_nodes);
        }
        self.rescore(tree);
        if std::mem::take(&mut self.probing) {
            return forced + PROBE_NODES.min(tree.len() - forced).min(self.max_nodes);
        }
        // The forced chain leads the order (reach 1, shallowest first).
        let order = tree.by_likelihood();
        let drafted = &order[forced..];
        let base = 1.0 + forced as f64;
        let mut best = (0usize, MIN_GAIN * base / self.pass_seconds(1 + forced));
        let mut sum = 0.0;
        let mut taken = 0;
        for &b in BUDGETS.iter().skip(1) {
            if b > self.max_nodes || b > drafted.len() {
                break;
            }
            while taken < b {
                sum += tree.nodes[drafted[taken]].reach as f64;
                taken += 1;
            }
            let rate = (base + sum) / self.pass_seconds(1 + forced + b);
            if rate > best.1 {
                best = (b, rate);
            }
        }
        if best.0 == 0 && !drafted.is_empty() {
            self.plain_streak += 1;
            if self.plain_streak >= PROBE_EVERY {
                self.plain_streak = 0;
                return forced + PROBE_NODES.min(drafted.len()).min(self.max_nodes);
            }
        } else if best.0 > 0 {
            self.plain_streak = 0;
        }
        forced + best.0
    }

    /// Replaces each node's reach (the drafters' estimate) by the measured
    /// one: its parent's, times the acceptance learned for its sources at
    /// its depth, times its share of the drafters' confidence among its
    /// siblings. A cut then keeps the nodes the walk is likeliest to reach
    /// whichever source proposed them.
    fn rescore(&self, tree: &mut TokenTree) {
        let forced = tree.forced.min(tree.len());
        let local: Vec<f64> = (0..tree.len())
            .map(|i| {
                let n = &tree.nodes[i];
                let parent = n.parent.map_or(1.0, |p| tree.nodes[p].reach as f64);
                (n.reach as f64 / parent.max(1e-12)).max(1e-6)
            })
            .collect();
        let mut siblings = std::collections::HashMap::<Option<usize>, f64>::new();
        for (i, n) in tree.nodes.iter().enumerate() {
            *siblings.entry(n.parent).or_default() += local[i];
        }
        let mut reach = vec![0.0f64; tree.len()];
        for (i, n) in tree.nodes.iter().enumerate() {
            let parent = n.parent.map_or(1.0, |p| reach[p]);
            // The forced chain, and what the grammar forces after a guessed
            // closer, are taken whenever their parent is.
            reach[i] = if i < forced || n.certain {
                parent
            } else {
                let q = self.go_on.of_node(n.sources, n.depth);
                parent * q * local[i] / siblings[&n.parent]
            };
        }
        for (n, r) in tree.nodes.iter_mut().zip(reach) {
            n.reach = r as f32;
        }
    }

    /// How many tokens to ask the drafter for (at most `max`): the chain
    /// length that maximises expected tokens per second once drafting time
    /// counts too. 0 when drafting cannot pay (then only a probe drafts, as
    /// in [`TreeBudget::choose`]).
    pub fn draft_len(&mut self, max: usize) -> usize {
        if self.fixed || max == 0 {
            return max;
        }
        let mut best = (0usize, MIN_GAIN / self.pass_seconds(1));
        let (mut tokens, mut reach) = (1.0, 1.0);
        for len in 1..=max {
            reach *= self.go_on.best(len);
            tokens += reach;
            let t = self.pass_seconds(1 + len) + self.draft_token_seconds * len as f64;
            if tokens / t > best.1 {
                best = (len, tokens / t);
            }
        }
        if best.0 == 0 {
            self.plain_streak += 1;
            if self.plain_streak >= PROBE_EVERY {
                self.plain_streak = 0;
                self.probing = true;
                return PROBE_NODES.min(max);
            }
        }
        best.0
    }

    /// The drafter took `seconds` to draft `tokens` tokens.
    pub fn record_draft(&mut self, tokens: usize, seconds: f64) {
        if tokens > 0 {
            let per = seconds / tokens as f64;
            self.draft_token_seconds += EMA * (per - self.draft_token_seconds);
        }
    }

    /// A pass of `rows` rows took `seconds`.
    pub fn record_pass(&mut self, rows: usize, seconds: f64) {
        let ema = |old: Option<f64>, new: f64| Some(old.map_or(new, |o| o + EMA * (new - o)));
        if rows <= 1 {
            self.one_row = ema(self.one_row, seconds);
        } else if let Some(one) = self.one_row {
            let per_row = ((seconds - one) / (rows - 1) as f64).max(0.0);
            self.per_row = ema(self.per_row, per_row);
        }
    }

    /// Replaces the fitted pass-cost line: in a shared batch the caller
    /// knows better what this sequence's rows cost (its share of the fixed
    /// cost, and the marginal cost of a row).
    pub fn set_pass_cost(&mut self, one_row: f64, per_row: f64) {
        self.one_row = Some(one_row);
        self.per_row = Some(per_row);
    }

    /// The walk of `tree` accepted the nodes `accepted` (in order), then
    /// stopped: `rejected` when the tree offered a next token and the model
    /// chose another (not when it ran out of tree, or generation ended).
    /// At each node the walk stood on, every source that offered a child
    /// learns whether the model's token was one of its. Certain nodes (the
    /// forced chain, what a grammar forces) say nothing of how good the
    /// drafts are: left out.
    pub fn record_acceptance(&mut self, tree: &TokenTree, accepted: &[usize], rejected: bool) {
        let mut at: Option<usize> = None;
        for step in 0..=accepted.len() {
            let next = accepted.get(step).copied();
            let (mut offered, mut depth) = (0u8, 0usize);
            for n in tree.nodes.iter().filter(|n| n.parent == at && !n.certain) {
                offered |= n.sources;
                depth = n.depth;
            }
            if offered != 0 {
                match next {
                    Some(c) => self.go_on.observe(offered, tree.nodes[c].sources, depth),
                    None if rejected => self.go_on.observe(offered, 0, depth),
                    None => {}
                }
            }
            match next {
                Some(c) => at = Some(c),
                None => break,
            }
        }
    }

    /// The acceptance rate learned for `source` at `depth` (1: the first
    /// drafted token).
    pub fn acceptance(&self, source: Source, depth: usize) -> f64 {
        self.go_on.of(source, depth)
    }
}

/// Running acceptance rates by source and depth: where the walk stood at a
/// node with children from a source, whether it went on into one of them.
#[derive(Debug, Clone)]
pub struct Acceptance {
    /// By source, then depth (`MAX_DEPTH + 1` slots; 0 unused).
    rate: [[f64; MAX_DEPTH + 1]; Source::COUNT],
    /// Observations at each (source, depth), capped (so old ones fade as
    /// the running rate does).
    seen: [[f64; MAX_DEPTH + 1]; Source::COUNT],
    /// By source over all depths.
    pooled: [f64; Source::COUNT],
    /// Sources observed at all.
    observed: u8,
}

impl Default for Acceptance {
    fn default() -> Self {
        Acceptance {
            rate: [[GO_ON_PRIOR; MAX_DEPTH + 1]; Source::COUNT],
            seen: [[0.0; MAX_DEPTH + 1]; Source::COUNT],
            pooled: [GO_ON_PRIOR; Source::COUNT],
            observed: 0,
        }
    }
}

impl Acceptance {
    /// Observations after which a rate moves as an EMA of `GO_ON_EMA`.
    const SEEN_CAP: f64 = 1.0 / GO_ON_EMA;

    /// Each source of `offered` learns whether the accepted child (its
    /// sources `taken`, 0 when none was) was one of its, at `depth`.
    fn observe(&mut self, offered: u8, taken: u8, depth: usize) {
        let d = depth.min(MAX_DEPTH);
        for s in Source::ALL {
            if offered & s.bit() == 0 {
                continue;
            }
            let hit = if taken & s.bit() != 0 { 1.0 } else { 0.0 };
            let i = s.index();
            self.pooled[i] += GO_ON_EMA * (hit - self.pooled[i]);
            // The first observations move a depth's rate further (a mean
            // over them), later ones as the running average.
            self.seen[i][d] = (self.seen[i][d] + 1.0).min(Self::SEEN_CAP);
            self.rate[i][d] += (hit - self.rate[i][d]) / self.seen[i][d];
            self.observed |= s.bit();
        }
    }

    /// The estimate for `source` at `depth`: the depth's own rate, leaning
    /// on the source's rate over all depths until the depth has data.
    pub fn of(&self, source: Source, depth: usize) -> f64 {
        let (i, d) = (source.index(), depth.min(MAX_DEPTH));
        let n = self.seen[i][d];
        (n * self.rate[i][d] + DEPTH_PRIOR_WEIGHT * self.pooled[i]) / (n + DEPTH_PRIOR_WEIGHT)
    }

    /// The estimate for a node proposed by `sources` (bits) at `depth`: the
    /// best of its sources'.
    fn of_node(&self, sources: u8, depth: usize) -> f64 {
        Source::ALL
            .iter()
            .filter(|s| sources & s.bit() != 0)
            .map(|&s| self.of(s, depth))
            .reduce(f64::max)
            .unwrap_or(GO_ON_PRIOR)
    }

    /// The best estimate at `depth` over the sources observed so far (the
    /// prior before any).
    fn best(&self, depth: usize) -> f64 {
        match self.observed {
            0 => GO_ON_PRIOR,
            seen => self.of_node(seen, depth),
        }
    }
}

/// `seconds = fixed + per_row * rows`, fitted by least squares to recent
/// passes (older ones fade): what a pass of a shared batch costs.
#[derive(Debug, Clone, Default)]
pub struct CostLine {
    /// Decayed sums of 1, rows, seconds, rows^2 and rows * seconds.
    n: f64,
    x: f64,
    y: f64,
    xx: f64,
    xy: f64,
}

impl CostLine {
    /// How much an old pass still counts after each new one.
    const DECAY: f64 = 0.98;

    pub fn record(&mut self, rows: usize, seconds: f64) {
        let x = rows as f64;
        for (sum, v) in [
            (&mut self.n, 1.0),
            (&mut self.x, x),
            (&mut self.y, seconds),
            (&mut self.xx, x * x),
            (&mut self.xy, x * seconds),
        ] {
            *sum = *sum * Self::DECAY + v;
        }
    }

    /// `(fixed, per_row)`, once passes of different sizes were seen; the
    /// slope is kept at least 0.
    pub fn fit(&self) -> Option<(f64, f64)> {
        let var = self.n * self.xx - self.x * self.x;
        if self.n < 2.0 || var <= 1e-9 * self.n * self.n {
            return None;
        }
        let slope = ((self.n * self.xy - self.x * self.y) / var).max(0.0);
        let fixed = ((self.y - slope * self.x) / self.n).max(0.0);
        Some((fixed, slope))
    }
}

#[cfg(test)]
mod tests {
    use super::super::token_tree::CERTAIN;
    use super::super::{Draft, TokenTree};
    use super::*;

    fn tree(p: f32, n: usize) -> TokenTree {
        TokenTree::build(&[Draft::uniform((0..n as u32).collect(), p)], 64)
    }

    /// A walk that accepted a whole chain of `n` drafted tokens.
    fn accept(a: &mut TreeBudget, n: usize) {
        let t = tree(0.9, n);
        a.record_acceptance(&t, &(0..n).collect::<Vec<_>>(), false);
    }

    /// A walk that rejected the first drafted token.
    fn reject(a: &mut TreeBudget) {
        a.record_acceptance(&tree(0.9, 4), &[], true);
    }

    #[test]
    fn the_cost_line_recovers_fixed_and_per_row_costs() {
        let mut c = CostLine::default();
        assert_eq!(c.fit(), None);
        c.record(4, 0.030);
        c.record(4, 0.030);
        assert_eq!(c.fit(), None, "one size says nothing about the slope");
        for r in [1, 8, 3, 16, 2] {
            c.record(r, 0.010 + 0.002 * r as f64);
        }
        let (fixed, per_row) = c.fit().unwrap();
        // The first two passes (4 rows, 30 ms) sit above the line.
        assert!((per_row - 0.002).abs() < 0.0005, "{per_row}");
        assert!(fixed > 0.008 && fixed < 0.016, "{fixed}");
    }

    #[test]
    fn accepted_drafts_grow_the_tree_and_rejected_ones_end_it() {
        let mut a = TreeBudget::new(16);
        a.record_pass(1, 0.010);
        let t = tree(0.9, 16);
        // Before any evidence (go on 0.6): one node pays best at 0.4 of a
        // pass per extra row.
        assert_eq!(a.choose(&mut t.clone()), 1);
        for _ in 0..40 {
            accept(&mut a, 8);
        }
        assert!(
            a.choose(&mut t.clone()) >= 12,
            "{}",
            a.choose(&mut t.clone())
        );
        for _ in 0..40 {
            reject(&mut a);
        }
        assert_eq!(a.choose(&mut t.clone()), 0);
        assert_eq!(a.choose(&mut TokenTree::default()), 0);
    }

    #[test]
    fn siblings_share_the_reach_of_their_parent() {
        let mut a = TreeBudget::new(16);
        a.record_pass(1, 0.010);
        for _ in 0..40 {
            accept(&mut a, 8);
        }
        // Four different first tokens: at most one can be right, so a wide
        // tree is worth less than a deep one.
        let wide = TokenTree::build(
            &(0..4u32)
                .map(|i| Draft::uniform(vec![i, 10 + i, 20 + i, 30 + i], 0.9))
                .collect::<Vec<_>>(),
            64,
        );
        let deep = tree(0.9, 16);
        assert!(a.choose(&mut wide.clone()) < a.choose(&mut deep.clone()));
    }

    #[test]
    fn costly_drafters_draft_less() {
        let mut a = TreeBudget::new(16);
        a.record_pass(1, 0.010);
        for _ in 0..40 {
            accept(&mut a, 8);
        }
        let free = a.draft_len(16);
        assert!(free >= 8, "{free}");
        // A draft model costing most of a pass per token.
        for _ in 0..40 {
            a.record_draft(4, 4.0 * 0.009);
        }
        assert_eq!(a.draft_len(16), 0);
        // Still probed now and then.
        let probes = (0..64).filter(|_| a.draft_len(16) > 0).count();
        assert_eq!(probes, 64 / PROBE_EVERY);
    }

    #[test]
    fn acceptance_is_learned_per_source_and_depth() {
        let mut a = TreeBudget::new(16);
        a.record_pass(1, 0.010);
        // Two sources disagree on the first token; the model always takes
        // the traffic source's, whose drafts then run on for 8 tokens.
        let both = TokenTree::build(
            &[
                Draft::uniform(vec![1, 2], 0.5).from(Source::Ngram),
                Draft::uniform((10..18).collect(), 0.5).from(Source::Traffic),
            ],
            64,
        );
        let traffic_path: Vec<usize> = both.likeliest_below(Some(both.child(None, 10).unwrap()));
        let mut accepted = vec![both.child(None, 10).unwrap()];
        accepted.extend(traffic_path);
        assert_eq!(accepted.len(), 8);
        for _ in 0..30 {
            a.record_acceptance(&both, &accepted, false);
        }
        assert!(a.acceptance(Source::Traffic, 1) > 0.95);
        assert!(
            a.acceptance(Source::Traffic, 8) > 0.9,
            "deep traffic drafts pay"
        );
        assert!(a.acceptance(Source::Ngram, 1) < 0.05);
        // Depth 2 of the n-gram source was never reached: its estimate is
        // the source's rate over all depths.
        assert!(a.acceptance(Source::Ngram, 2) < 0.05);
        // A later tree keeps the traffic branch and drops the n-gram one.
        let kept = {
            let mut rescored = both.clone();
            let keep = a.choose(&mut rescored);
            rescored.cut(keep)
        };
        assert!(kept.child(None, 10).is_some());
        assert!(kept.child(None, 1).is_none(), "{kept:?}");
        // Certain nodes teach nothing.
        let mut b = TreeBudget::new(16);
        let forced = TokenTree::build(&[Draft::uniform(vec![5, 6], CERTAIN)], 16);
        b.record_acceptance(&forced, &[0, 1], false);
        assert_eq!(b.acceptance(Source::Ngram, 1), GO_ON_PRIOR);
    }

    #[test]
    fn expensive_rows_shrink_the_tree() {
        let mut a = TreeBudget::new(16);
        a.record_pass(1, 0.010);
        let cheap = a.choose(&mut tree(0.8, 16));
        for n in 2..=17 {
            a.record_pass(n, 0.010 * n as f64);
        }
        // Each row costs as much as a whole pass: drafting cannot pay.
        assert!(a.choose(&mut tree(0.8, 16)) < cheap);
        assert_eq!(a.choose(&mut tree(0.8, 16)), 0);
    }

    #[test]
    fn failing_drafts_fall_back_to_plain_with_rare_probes() {
        let mut a = TreeBudget::new(16);
        a.record_pass(1, 0.010);
        let t = tree(0.9, 16);
        for _ in 0..50 {
            reject(&mut a);
        }
        let chosen: Vec<usize> = (0..64).map(|_| a.choose(&mut t.clone())).collect();
        let drafted: usize = chosen.iter().sum();
        assert_eq!(drafted, (64 / PROBE_EVERY) * PROBE_NODES, "{chosen:?}");
    }
}
