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
//! `b = 0` is plain decoding, so where drafts keep failing the choice falls
//! back to it; a small probe every [`PROBE_EVERY`] plain passes lets `q`
//! recover (at most a few percent of the time).

use super::token_tree::TokenTree;

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
    /// How often the walk went on when the tree offered a next token.
    go_on: f64,
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
            go_on: GO_ON_PRIOR,
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
    pub fn choose(&mut self, tree: &TokenTree) -> usize {
        let forced = tree.forced.min(tree.len());
        if self.fixed {
            return tree.len().min(forced + self.max_nodes);
        }
        if std::mem::take(&mut self.probing) {
            return forced + PROBE_NODES.min(tree.len() - forced).min(self.max_nodes);
        }
        // Measured reach of every node (parents come first), taken in the
        // order the budget cut keeps nodes.
        let local = |i: usize| -> f64 {
            let n = &tree.nodes[i];
            let parent = n.parent.map_or(1.0, |p| tree.nodes[p].reach as f64);
            (n.reach as f64 / parent.max(1e-12)).max(1e-6)
        };
        let mut siblings = std::collections::HashMap::<Option<usize>, f64>::new();
        for (i, n) in tree.nodes.iter().enumerate() {
            *siblings.entry(n.parent).or_default() += local(i);
        }
        let mut reach = vec![0.0f64; tree.len()];
        for (i, n) in tree.nodes.iter().enumerate() {
            let parent = n.parent.map_or(1.0, |p| reach[p]);
            // The forced chain, and what the grammar forces after a guessed
            // closer, are taken whenever their parent is.
            reach[i] = if i < forced || n.certain {
                parent
            } else {
                parent * self.go_on * local(i) / siblings[&n.parent]
            };
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
                sum += reach[drafted[taken]];
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
            reach *= self.go_on;
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

    /// The walk of `tree` accepted `accepted` of its tokens, then stopped:
    /// `rejected` when the tree offered a next token and the model chose
    /// another (not when it ran out of tree, or generation ended). The
    /// forced chain says nothing of how good the drafts are: left out.
    pub fn record_acceptance(&mut self, tree: &TokenTree, accepted: usize, rejected: bool) {
        let accepted = accepted.saturating_sub(tree.forced);
        for _ in 0..accepted {
            self.go_on += GO_ON_EMA * (1.0 - self.go_on);
        }
        if rejected {
            self.go_on += GO_ON_EMA * (0.0 - self.go_on);
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
    use super::super::{Draft, TokenTree};
    use super::*;

    fn tree(p: f32, n: usize) -> TokenTree {
        TokenTree::build(&[Draft::uniform((0..n as u32).collect(), p)], 64)
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
        assert_eq!(a.choose(&t), 1);
        for _ in 0..40 {
            a.record_acceptance(&TokenTree::default(), 8, false);
        }
        assert!(a.choose(&t) >= 12, "{}", a.choose(&t));
        for _ in 0..40 {
            a.record_acceptance(&TokenTree::default(), 0, true);
        }
        assert_eq!(a.choose(&t), 0);
        assert_eq!(a.choose(&TokenTree::default()), 0);
    }

    #[test]
    fn siblings_share_the_reach_of_their_parent() {
        let mut a = TreeBudget::new(16);
        a.record_pass(1, 0.010);
        for _ in 0..40 {
            a.record_acceptance(&TokenTree::default(), 8, false);
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
        assert!(a.choose(&wide) < a.choose(&deep));
    }

    #[test]
    fn costly_drafters_draft_less() {
        let mut a = TreeBudget::new(16);
        a.record_pass(1, 0.010);
        for _ in 0..40 {
            a.record_acceptance(&TokenTree::default(), 8, false);
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
    fn expensive_rows_shrink_the_tree() {
        let mut a = TreeBudget::new(16);
        a.record_pass(1, 0.010);
        let cheap = a.choose(&tree(0.8, 16));
        for n in 2..=17 {
            a.record_pass(n, 0.010 * n as f64);
        }
        // Each row costs as much as a whole pass: drafting cannot pay.
        assert!(a.choose(&tree(0.8, 16)) < cheap);
        assert_eq!(a.choose(&tree(0.8, 16)), 0);
    }

    #[test]
    fn failing_drafts_fall_back_to_plain_with_rare_probes() {
        let mut a = TreeBudget::new(16);
        a.record_pass(1, 0.010);
        let t = tree(0.9, 16);
        for _ in 0..50 {
            a.record_acceptance(&TokenTree::default(), 0, true);
        }
        let chosen: Vec<usize> = (0..64).map(|_| a.choose(&t)).collect();
        let drafted: usize = chosen.iter().sum();
        assert_eq!(drafted, (64 / PROBE_EVERY) * PROBE_NODES, "{chosen:?}");
    }
}
