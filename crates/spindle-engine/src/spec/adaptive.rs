//! How many tree nodes to verify next: the budget that maximises expected
//! tokens per second, from what passes of each size have cost so far and
//! how well the drafter's estimates have held up.
//!
//! With `b` nodes, a pass costs `t(1 + b)` and commits `1 + c * reach(b)`
//! tokens on average, where `reach(b)` is the sum of the reach estimates of
//! the `b` likeliest nodes and `c` the running ratio of accepted to
//! estimated. `b = 0` is plain decoding, so where drafts keep failing the
//! choice falls back to it; a small probe every [`PROBE_EVERY`] plain passes
//! lets `c` recover (at most a few percent of the time).

use super::tree::TokenTree;

/// Budgets considered (nodes beyond the pending token).
const BUDGETS: [usize; 13] = [0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64];
/// Plain passes in a row before a small tree is tried anyway.
pub const PROBE_EVERY: usize = 16;
/// Nodes of a probe.
const PROBE_NODES: usize = 2;
/// Weight of the newest observation in running averages.
const EMA: f64 = 0.2;
/// Relative cost of a pass of `n` rows before any of that size was timed:
/// `1 + SLOPE * (n - 1)`, a little above what `spindle bench --rows` measured
/// on the development machine (2 rows 1.4x, 8 rows 3.7x, 16 rows 5.2x).
const SLOPE: f64 = 0.4;

/// The adaptive budget policy of one generation.
#[derive(Debug, Clone)]
pub struct Adaptive {
    /// Largest tree (default 16, at most 64).
    pub max_nodes: usize,
    /// Seconds of a pass of `n` rows (index `n`), as timed so far.
    cost: Vec<Option<f64>>,
    /// Accepted over estimated, running.
    calibration: f64,
    plain_streak: usize,
    /// Always verify the whole budget (no adaptation).
    fixed: bool,
}

impl Adaptive {
    pub fn new(max_nodes: usize) -> Adaptive {
        let max_nodes = max_nodes.min(64);
        Adaptive {
            max_nodes,
            cost: vec![None; max_nodes + 2],
            calibration: 1.0,
            plain_streak: 0,
            fixed: false,
        }
    }

    /// A policy that always verifies up to `max_nodes` nodes, whatever they
    /// cost: for tests and measurements.
    pub fn fixed(max_nodes: usize) -> Adaptive {
        Adaptive {
            fixed: true,
            ..Adaptive::new(max_nodes)
        }
    }

    /// Seconds a pass of `rows` rows is expected to take.
    pub fn pass_seconds(&self, rows: usize) -> f64 {
        if let Some(Some(t)) = self.cost.get(rows) {
            return *t;
        }
        // Scale the prior from the nearest timed size below (or above).
        let prior = |n: usize| 1.0 + SLOPE * (n as f64 - 1.0);
        let nearest = (1..self.cost.len())
            .filter_map(|n| self.cost[n].map(|t| (n, t)))
            .min_by_key(|&(n, _)| n.abs_diff(rows));
        match nearest {
            Some((n, t)) => t * prior(rows) / prior(n),
            None => prior(rows),
        }
    }

    /// The number of nodes of `tree` (built with [`Adaptive::max_nodes`]) to
    /// verify in the next pass.
    pub fn choose(&mut self, tree: &TokenTree) -> usize {
        if self.fixed {
            return tree.len().min(self.max_nodes);
        }
        let mut reach: Vec<f64> = tree.nodes.iter().map(|n| n.reach as f64).collect();
        reach.sort_by(|a, b| b.total_cmp(a));
        let mut best = (0usize, 1.0 / self.pass_seconds(1));
        let mut sum = 0.0;
        let mut taken = 0;
        for &b in BUDGETS.iter().skip(1) {
            if b > self.max_nodes || b > reach.len() {
                break;
            }
            while taken < b {
                sum += reach[taken];
                taken += 1;
            }
            let rate = (1.0 + self.calibration * sum) / self.pass_seconds(1 + b);
            if rate > best.1 {
                best = (b, rate);
            }
        }
        if best.0 == 0 && !tree.is_empty() {
            self.plain_streak += 1;
            if self.plain_streak >= PROBE_EVERY {
                self.plain_streak = 0;
                return PROBE_NODES.min(tree.len()).min(self.max_nodes);
            }
        } else if best.0 > 0 {
            self.plain_streak = 0;
        }
        best.0
    }

    /// A pass of `rows` rows took `seconds`.
    pub fn record_pass(&mut self, rows: usize, seconds: f64) {
        if let Some(slot) = self.cost.get_mut(rows) {
            *slot = Some(match *slot {
                Some(t) => t + EMA * (seconds - t),
                None => seconds,
            });
        }
    }

    /// A verified tree whose reach estimates summed to `estimated` gave
    /// `accepted` tokens.
    pub fn record_acceptance(&mut self, estimated: f64, accepted: usize) {
        if estimated <= 0.0 {
            return;
        }
        let ratio = (accepted as f64 / estimated).clamp(0.0, 4.0);
        self.calibration += EMA * (ratio - self.calibration);
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
    fn confident_drafts_get_a_tree_and_hopeless_ones_plain_decoding() {
        let mut a = Adaptive::new(16);
        a.record_pass(1, 0.010);
        // At 0.4 of a pass per extra row, 6 nodes of a 0.95 chain pay best.
        assert_eq!(a.choose(&tree(0.95, 16)), 6);
        assert_eq!(a.choose(&tree(0.05, 16)), 0);
        assert_eq!(a.choose(&TokenTree::default()), 0);
    }

    #[test]
    fn expensive_rows_shrink_the_tree() {
        let mut a = Adaptive::new(16);
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
        let mut a = Adaptive::new(16);
        a.record_pass(1, 0.010);
        for _ in 0..50 {
            a.record_acceptance(3.0, 0);
        }
        let t = tree(0.9, 16);
        let chosen: Vec<usize> = (0..64).map(|_| a.choose(&t)).collect();
        let drafted: usize = chosen.iter().sum();
        assert_eq!(drafted, (64 / PROBE_EVERY) * PROBE_NODES, "{chosen:?}");
    }
}
