//! Scoring a token tree after a prompt, in the prompt's last pass: the
//! tree's rows join the batch behind the prompt's last row, only the rows
//! whose logits are read ask for them, and nothing of the tree is
//! committed.

use std::ops::Range;

use spindle_kernels::softmax::log_sum_exp;
use spindle_model::{Batch, Model, Row, SeqId};

use super::request::{ScoreTree, TreeScores};
use crate::error::EngineError;
use crate::speculative::verify::LazyLogits;

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
        let prefix = tree
            .prefix_roots
            .iter()
            .find(|&&(root, _)| root == i)
            .map(|&(_, k)| k);
        let (parent_row, pos) = match (parent, prefix) {
            (Some(p), _) => (Some(first + p), batch.rows[first + p].pos + 1),
            (None, Some(k)) => (prompt_row_at(batch, prompt_row, k), k),
            (None, None) => (Some(prompt_row), prompt_pos + 1),
        };
        batch.push(Row {
            token,
            pos,
            seq,
            parent: parent_row,
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

/// The batch row of the prompt's token at position `k - 1`, found up the
/// chain that ends at `prompt_row`; `None` when that token is committed
/// already (or `k` is 0), so a row at position `k` follows the committed
/// context's first `k` positions directly.
fn prompt_row_at(batch: &Batch, prompt_row: usize, k: usize) -> Option<usize> {
    let want = k.checked_sub(1)?;
    let mut row = Some(prompt_row);
    while let Some(r) = row {
        if batch.rows[r].pos == want {
            return Some(r);
        }
        if batch.rows[r].pos < want {
            return None;
        }
        row = batch.rows[r].parent;
    }
    None
}

/// Rows whose logits are held at once while a tree is scored: 32 MiB for a
/// 262k vocabulary, what the spare logits buffers keep. A decision of a
/// thousand option tokens held 1 GiB of logits at once before; `bench/soak`
/// saw its resident set jump by 55 MiB while a 50-row decision ran.
const SCORE_ROWS_AT_ONCE: usize = 32;

/// The log-probabilities `tree` asks for, from the pass's hidden states:
/// the head runs over the read rows [`SCORE_ROWS_AT_ONCE`] at a time, and
/// each block's logits are dropped once its log-probabilities are read (a
/// row's logits are the same bits whichever rows share its call).
pub(crate) fn read_scores(
    model: &Model,
    logits: &LazyLogits,
    tree: &ScoreTree,
    placed: &PlacedTree,
) -> Result<TreeScores, EngineError> {
    // Every (row, token) asked: the scored nodes, then the ends.
    let asked: Vec<(usize, u32)> = tree
        .scored
        .iter()
        .map(|&n| {
            let (token, parent) = tree.nodes[n];
            (placed.row_of(parent), token)
        })
        .chain(
            tree.ends
                .iter()
                .map(|&(n, token)| (placed.row_of(Some(n)), token)),
        )
        .collect();
    let mut values = vec![f64::NEG_INFINITY; asked.len()];
    for block in placed.logits_rows.chunks(SCORE_ROWS_AT_ONCE) {
        let computed = model.logits(logits.hidden(), block)?;
        let rows: Vec<&[f32]> = block
            .iter()
            .map(|&r| computed.row(r).expect("computed above"))
            .collect();
        // Each row's normaliser once, rows split over the cores: a row is
        // a sum over the whole vocabulary.
        let lse = log_sum_exps(&rows);
        for (value, &(row, token)) in values.iter_mut().zip(&asked) {
            if let Some(i) = block.iter().position(|&r| r == row) {
                *value = rows[i]
                    .get(token as usize)
                    .map_or(f64::NEG_INFINITY, |&l| l as f64 - lse[i]);
            }
        }
    }
    let ends = values.split_off(tree.scored.len());
    Ok(TreeScores {
        scored: values,
        ends,
    })
}

/// `ln sum exp(row)` of each row (within 3e-7, see
/// [`spindle_kernels::softmax::log_sum_exp`]), rows shared between the
/// available cores.
fn log_sum_exps(rows: &[&[f32]]) -> Vec<f64> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    if rows.len() < 2 || threads < 2 {
        return rows.iter().map(|r| log_sum_exp(r)).collect();
    }
    let per = rows.len().div_ceil(threads);
    std::thread::scope(|s| {
        let parts: Vec<_> = rows
            .chunks(per)
            .map(|c| s.spawn(move || c.iter().map(|r| log_sum_exp(r)).collect::<Vec<f64>>()))
            .collect();
        parts
            .into_iter()
            .flat_map(|p| p.join().expect("a sum does not panic"))
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::score::log_softmax;

    #[test]
    fn normalisers_match_the_log_softmax() {
        let a = [0.5f32, -2.0, 3.25, 1.0];
        let b = [10.0f32, -30.0, 0.0];
        let lse = log_sum_exps(&[&a, &b, &a]);
        for (row, l) in [&a[..], &b[..], &a[..]].iter().zip(&lse) {
            let all = log_softmax(row);
            for (x, lp) in row.iter().zip(&all) {
                assert!((*x as f64 - l - lp).abs() < 1e-6);
            }
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
            prefix_roots: Vec::new(),
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

    #[test]
    fn prefix_roots_branch_from_the_prompt_token_they_follow() {
        let mut batch = Batch::new();
        // Positions 10 and 11 in the batch; 0..10 committed.
        let prompt = batch.push_chain(3, 10, &[7, 8], |_| false);
        let tree = ScoreTree {
            nodes: vec![(5, None), (6, None), (9, None), (4, Some(2))],
            scored: vec![3],
            ends: vec![(0, 1), (1, 1)],
            prefix_roots: vec![(0, 11), (1, 4), (2, 0)],
        };
        push_score_tree(&mut batch, 3, prompt.end - 1, &tree);
        let r = &batch.rows;
        // After the first 11 tokens: the batch row at position 10.
        assert_eq!((r[2].pos, r[2].parent), (11, Some(0)));
        // After 4 committed tokens, and after none: roots of their own.
        assert_eq!((r[3].pos, r[3].parent), (4, None));
        assert_eq!((r[4].pos, r[4].parent), (0, None));
        assert_eq!((r[5].pos, r[5].parent), (1, Some(4)));
    }
}
