//! Scoring a token tree after a prompt, in the prompt's last pass: the
//! tree's rows join the batch behind the prompt's last row, only the rows
//! whose logits are read ask for them, and nothing of the tree is
//! committed.

use std::ops::Range;

use spindle_model::{Batch, Model, Row, SeqId};

use super::request::{ScoreTree, TreeScores};
use crate::error::EngineError;
use crate::spec::verify::LazyLogits;

/// Where a tree sits in a batch.
#[derive(Debug, Clone)]
pub(crate) struct PlacedTree {
    /// The prompt's last row (parent of the tree's roots).
    pub prompt_row: usize,
    /// Node `i` is row `rows.start + i`.
    pub rows: Range<usize>,
    /// Rows whose logits are read.
    pub logits_rows: Vec<usize>,
}

impl PlacedTree {
    fn row_of(&self, node: Option<usize>) -> usize {
        node.map_or(self.prompt_row, |n| self.rows.start + n)
    }
}

/// Appends `tree` after `prompt_row` (the prompt's last row, of `seq`);
/// the prompt row's `logits` flag is set if a root is scored.
pub(crate) fn push_score_tree(
    batch: &mut Batch,
    seq: SeqId,
    prompt_row: usize,
    tree: &ScoreTree,
) -> PlacedTree {
    let first = batch.len();
    let mut wants = vec![false; tree.nodes.len()];
    let mut prompt_wants = false;
    for &n in &tree.scored {
        match tree.nodes[n].1 {
            Some(p) => wants[p] = true,
            None => prompt_wants = true,
        }
    }
    for &(n, _) in &tree.ends {
        wants[n] = true;
    }
    let prompt_pos = batch.rows[prompt_row].pos;
    for (i, &(token, parent)) in tree.nodes.iter().enumerate() {
        let (parent_row, pos) = match parent {
            Some(p) => (first + p, batch.rows[first + p].pos + 1),
            None => (prompt_row, prompt_pos + 1),
        };
        batch.push(Row {
            token,
            pos,
            seq,
            parent: Some(parent_row),
            logits: wants[i],
        });
    }
    batch.rows[prompt_row].logits |= prompt_wants;
    let mut logits_rows: Vec<usize> = (0..tree.nodes.len())
        .filter(|&i| wants[i])
        .map(|i| first + i)
        .collect();
    if prompt_wants {
        logits_rows.insert(0, prompt_row);
    }
    PlacedTree {
        prompt_row,
        rows: first..batch.len(),
        logits_rows,
    }
}

/// The log-probabilities `tree` asks for, from the pass's logits.
pub(crate) fn read_scores(
    model: &Model,
    logits: &mut LazyLogits,
    tree: &ScoreTree,
    placed: &PlacedTree,
) -> Result<TreeScores, EngineError> {
    logits.compute(model, &placed.logits_rows)?;
    let mut logprob = |row: usize, token: u32| -> Result<f64, EngineError> {
        let l = logits.row(model, row, Vec::new)?;
        Ok(log_prob_of(l, token))
    };
    let mut scored = Vec::with_capacity(tree.scored.len());
    for &n in &tree.scored {
        let (token, parent) = tree.nodes[n];
        scored.push(logprob(placed.row_of(parent), token)?);
    }
    let mut ends = Vec::with_capacity(tree.ends.len());
    for &(n, token) in &tree.ends {
        ends.push(logprob(placed.row_of(Some(n)), token)?);
    }
    Ok(TreeScores { scored, ends })
}

/// `log softmax(logits)[token]` in f64 (as [`crate::score::log_softmax`]
/// computes it, for one entry).
fn log_prob_of(logits: &[f32], token: u32) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let z: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    logits
        .get(token as usize)
        .map_or(f64::NEG_INFINITY, |&l| l as f64 - max - z.ln())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::score::log_softmax;

    #[test]
    fn one_entry_of_the_log_softmax() {
        let l = [0.5f32, -2.0, 3.25, 1.0];
        let all = log_softmax(&l);
        for t in 0..4 {
            assert_eq!(log_prob_of(&l, t), all[t as usize]);
        }
    }

    #[test]
    fn rows_follow_their_parents_and_only_read_rows_ask_for_logits() {
        let mut batch = Batch::new();
        let prompt = batch.push_chain(3, 10, &[7, 8], |_| false);
        // Two options under a shared suffix token: [5] then [6, 9] or [4].
        let tree = ScoreTree {
            nodes: vec![(5, None), (6, Some(0)), (9, Some(1)), (4, Some(0))],
            scored: vec![1, 2, 3],
            ends: vec![(2, 1), (3, 1)],
        };
        let placed = push_score_tree(&mut batch, 3, prompt.end - 1, &tree);
        assert_eq!(placed.rows, 2..6);
        let r = &batch.rows;
        assert_eq!((r[2].pos, r[2].parent), (12, Some(1)));
        assert_eq!((r[3].pos, r[3].parent), (13, Some(2)));
        assert_eq!((r[4].pos, r[4].parent), (14, Some(3)));
        assert_eq!((r[5].pos, r[5].parent), (13, Some(2)));
        // Node 0 is read for 1 and 3, node 1 for 2, nodes 2 and 3 for ends;
        // the prompt row for nothing.
        let flags: Vec<bool> = r.iter().map(|r| r.logits).collect();
        assert_eq!(flags, vec![false, false, true, true, true, true]);
        assert_eq!(placed.logits_rows, vec![2, 3, 4, 5]);
    }
}
