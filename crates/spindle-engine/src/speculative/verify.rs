//! Verification: the one walk over a verified tree, which decides the
//! tokens a sequence keeps after a pass (single-sequence speculation and
//! the serving loop both call [`walk`]), and the output head computed only
//! for the rows a walk visits.
//!
//! Why a walk emits exactly what plain decoding would: a row's logits are
//! bit-identical whether it runs alone or in a tree (the one-pass rule,
//! tested in spindle-model), and at every node the walk applies plain
//! decoding's own step ([`next_token`]: the sampler keyed by seed and
//! position, stop tokens, limits, in the same order), from the same logits
//! with the same history.

use std::ops::Range;
use std::sync::Mutex;

use spindle_kernels::head_screen::ScreenBounds;
use spindle_model::{Batch, Hidden, Logits, Model, Row, SeqId};

use super::token_tree::TokenTree;
use crate::constraint::Constraint;
use crate::error::EngineError;
use crate::generate::{next_token, FinishReason, Next, RowLogits, TokenRules};
use crate::sampler::{choose_bounded, PieceChoice, PieceChooser, SamplerConfig};

/// What a walk kept.
#[derive(Debug, Clone, PartialEq)]
pub struct Walk {
    /// The batch rows to commit, in order: the root (the pending token),
    /// then the row of each accepted node.
    pub path: Vec<usize>,
    /// The tree offered a next token and the model chose another (not
    /// when the walk ran out of tree, or generation ended).
    pub rejected: bool,
    /// Why generation ended, if it did.
    pub finish: Option<FinishReason>,
}

impl Walk {
    /// Drafted tokens accepted.
    pub fn accepted(&self) -> usize {
        self.path.len() - 1
    }

    /// The tree nodes accepted, in order (row `root + 1 + i` is node `i`).
    pub fn nodes(&self) -> Vec<usize> {
        self.path[1..]
            .iter()
            .map(|r| r - self.path[0] - 1)
            .collect()
    }
}

/// Walks `tree`, verified in the pass behind batch row `root` (tree node
/// `i` is row `root + 1 + i`): at each row, plain decoding's step chooses
/// the token after it (emitting it through `on_token`, which returns false
/// to cancel) and the walk descends while a child of the node holds that
/// token. An empty tree is plain decoding of one token.
///
/// `history` holds the prompt and every emitted token (the root's token
/// last); the walk appends what it emits, and `generated` counts it. A
/// `constraint` masks every token chosen and follows the emitted ones.
#[allow(clippy::too_many_arguments)]
pub fn walk(
    model: &Model,
    logits: &mut LazyLogits,
    tree: &TokenTree,
    root: usize,
    rules: &TokenRules,
    history: &mut Vec<u32>,
    generated: &mut usize,
    mut constraint: Option<&mut Constraint>,
    on_token: &mut dyn FnMut(u32, Option<&[f32]>) -> bool,
) -> Result<Walk, EngineError> {
    let mut path = vec![root];
    let mut node = None;
    loop {
        let row = *path.last().expect("the path starts at the root");
        let mut l = LazyRow {
            model,
            logits,
            row,
            more: likeliest_path(tree, root, row),
            choose_in_head: constraint.is_none(),
        };
        let c = constraint.as_deref_mut();
        let token = match next_token(rules, &mut l, history, generated, c, on_token)? {
            Next::Token(t) => t,
            Next::End(reason) => {
                return Ok(Walk {
                    path,
                    rejected: false,
                    finish: Some(reason),
                })
            }
        };
        match tree.child(node, token) {
            Some(c) => {
                node = Some(c);
                path.push(root + 1 + c);
            }
            None => {
                let rejected = tree.nodes.iter().any(|n| n.parent == node);
                return Ok(Walk {
                    path,
                    rejected,
                    finish: None,
                });
            }
        }
    }
}

/// The logits of a pass's rows, computed when they are needed. The output
/// head is most of a row's cost (262k logits against a few million weights
/// per layer), and a walk over a verified tree reads only the rows on its
/// path, so the head runs first over the rows expected to be read (each
/// tree's likeliest path) and again only when a walk takes another branch.
/// Each row's logits are bit-identical however rows are grouped (see
/// [`Model::logits`]).
///
/// A row that needs only its chosen token has it chosen while the head
/// computes its logits, which are then never stored
/// ([`LazyLogits::compute_choosing`]), or, alone in its call, reads the
/// head's screen ([`LazyLogits::screen`]: bounds on every logit, then the
/// exact logits of the few tokens that can still win) when the model has
/// one.
pub struct LazyLogits {
    hidden: Hidden,
    /// Position of the token after each batch row.
    next_pos: Vec<usize>,
    computed: Vec<Logits>,
    /// Rows whose token was chosen without storing their logits: the row,
    /// the settings and position it was chosen under, and the token.
    chosen: Vec<(usize, SamplerConfig, usize, u32)>,
    /// Seconds the full head's calls took, their number and the rows they
    /// covered, kept or chosen (for the pass log).
    head_seconds: f64,
    head_calls: usize,
    head_rows: usize,
    /// Screen bounds, per call: the rows and their bounds.
    screened: Vec<(Vec<usize>, ScreenBounds)>,
    /// The model has no screen: every row takes the full head.
    unscreened: bool,
}

impl LazyLogits {
    /// The head of the pass that ran `batch` and gave `hidden`.
    pub fn new(hidden: Hidden, batch: &Batch) -> LazyLogits {
        LazyLogits {
            hidden,
            next_pos: batch.rows.iter().map(|r| r.pos + 1).collect(),
            computed: Vec::new(),
            chosen: Vec::new(),
            head_seconds: 0.0,
            head_calls: 0,
            head_rows: 0,
            screened: Vec::new(),
            unscreened: false,
        }
    }

    /// Runs the head's screen over `rows` (those not screened or computed
    /// yet), in one call. False when the model has no screen or there are
    /// more than [`MAX_SCREEN_ROWS`] (then the full head is cheaper).
    pub fn screen(&mut self, model: &Model, rows: &[usize]) -> Result<bool, EngineError> {
        if self.unscreened {
            return Ok(false);
        }
        let todo: Vec<usize> = rows
            .iter()
            .copied()
            .filter(|&r| self.find(r).is_none() && self.bounds_of(r).is_none())
            .collect();
        if todo.is_empty() {
            return Ok(true);
        }
        if todo.len() > MAX_SCREEN_ROWS {
            return Ok(false);
        }
        match model.head_bounds(&self.hidden, &todo)? {
            Some(b) => {
                self.screened.push((todo, b));
                Ok(true)
            }
            None => {
                self.unscreened = true;
                Ok(false)
            }
        }
    }

    /// Row `row`'s bounds and likeliest token, if it was screened.
    pub fn bounds_of(&self, row: usize) -> Option<(&[f32], u32)> {
        self.screened.iter().find_map(|(rows, b)| {
            let i = rows.iter().position(|&r| r == row)?;
            Some((&b.ub[i * b.vocab..(i + 1) * b.vocab], b.likeliest[i]))
        })
    }

    /// The pass's hidden states.
    pub fn hidden(&self) -> &Hidden {
        &self.hidden
    }

    fn find(&self, row: usize) -> Option<usize> {
        self.computed.iter().position(|l| l.rows.contains(&row))
    }

    /// Runs the head over `rows` (those not computed yet), in one call.
    pub fn compute(&mut self, model: &Model, rows: &[usize]) -> Result<(), EngineError> {
        self.compute_choosing(model, rows, &[])
    }

    /// Runs the head, in one call, over `full` (every logit kept) and
    /// `choose`: rows whose token is chosen under their settings (which
    /// must choose from bounds) while the head computes their logits,
    /// which are not kept. Rows computed or chosen already are skipped.
    pub fn compute_choosing(
        &mut self,
        model: &Model,
        full: &[usize],
        choose: &[(usize, &SamplerConfig)],
    ) -> Result<(), EngineError> {
        let mut rows: Vec<usize> = Vec::new();
        for &r in full {
            if self.find(r).is_none() && !rows.contains(&r) {
                rows.push(r);
            }
        }
        let kept = rows.len();
        let mut choosers = Vec::new();
        for &(r, cfg) in choose {
            let pos = self.next_position(r)?;
            if self.find(r).is_none()
                && !rows.contains(&r)
                && self.chosen_token(r, cfg, pos).is_none()
            {
                rows.push(r);
                choosers.push((cfg, pos, PieceChooser::new(cfg, pos)));
            }
        }
        if rows.is_empty() {
            return Ok(());
        }
        let keep: Vec<bool> = (0..rows.len()).map(|j| j < kept).collect();
        let picks: Vec<Mutex<PieceChoice>> = choosers.iter().map(|_| Mutex::default()).collect();
        let visit = |j: usize, first: usize, piece: &mut [f32]| {
            let best = choosers[j - kept].2.piece(first, piece);
            let mut pick = picks[j - kept].lock().unwrap_or_else(|p| p.into_inner());
            *pick = pick.merge(best);
        };
        let t = std::time::Instant::now();
        let logits = model.logits_visiting(&self.hidden, &rows, &keep, &visit)?;
        self.head_seconds += t.elapsed().as_secs_f64();
        self.head_calls += 1;
        self.head_rows += rows.len();
        if kept > 0 {
            self.computed.push(logits);
        }
        for ((&row, (cfg, pos, _)), pick) in rows[kept..].iter().zip(choosers).zip(picks) {
            let token = pick.into_inner().unwrap_or_else(|p| p.into_inner()).token();
            self.chosen.push((row, cfg.clone(), pos, token));
        }
        Ok(())
    }

    /// The position of the token chosen after batch row `row`.
    fn next_position(&self, row: usize) -> Result<usize, EngineError> {
        self.next_pos.get(row).copied().ok_or_else(|| {
            EngineError::Model(spindle_model::ModelError::InvalidBatch(format!(
                "a token chosen after batch row {row}, past the pass's {} rows",
                self.next_pos.len()
            )))
        })
    }

    /// The token chosen after row `row` under `cfg` at `position`, if
    /// [`Self::compute_choosing`] chose it.
    pub fn chosen_token(&self, row: usize, cfg: &SamplerConfig, position: usize) -> Option<u32> {
        self.chosen
            .iter()
            .find(|(r, c, p, _)| *r == row && *p == position && c == cfg)
            .map(|c| c.3)
    }

    /// Seconds the full head's calls have taken so far.
    pub fn head_seconds(&self) -> f64 {
        self.head_seconds
    }

    /// Calls of the full head so far and the rows they covered, whether
    /// the rows kept their logits or had their tokens chosen (for the pass
    /// log).
    pub fn head_calls(&self) -> (usize, usize) {
        (self.head_calls, self.head_rows)
    }

    /// Logits of batch row `row` if they are computed.
    pub fn get(&self, row: usize) -> Option<&[f32]> {
        self.computed[self.find(row)?].row(row)
    }

    /// Logits of batch row `row`; if they are not computed yet, the head
    /// runs over `more()` (which should include `row`) and `row`.
    pub fn row(
        &mut self,
        model: &Model,
        row: usize,
        more: impl FnOnce() -> Vec<usize>,
    ) -> Result<&[f32], EngineError> {
        if self.find(row).is_none() {
            let mut rows = more();
            if !rows.contains(&row) {
                rows.insert(0, row);
            }
            self.compute(model, &rows)?;
        }
        let at = self.find(row).expect("computed above");
        Ok(self.computed[at].row(row).expect("computed above"))
    }
}

/// Most rows screened in one call: the screen reads half the head's bytes
/// but does as many multiply-adds, so it wins only where the head is
/// memory-bound, one row (docs/PERF.md §32: 2 rows already cost about
/// what the full head costs for them).
pub const MAX_SCREEN_ROWS: usize = 1;

/// One row of a [`LazyLogits`] as [`next_token`] reads it: its full
/// logits (with the head over `more`, the likeliest rows below it, in the
/// same call), or its chosen token from the screen.
pub struct LazyRow<'a> {
    pub model: &'a Model,
    pub logits: &'a mut LazyLogits,
    pub row: usize,
    pub more: Vec<usize>,
    /// Whether rows not yet computed have their tokens chosen in the head
    /// ([`LazyLogits::compute_choosing`]). Not under a constraint: a token
    /// its grammar forbids sends the walk to every logit of the row, a
    /// second head call where keeping them costs nothing more.
    pub choose_in_head: bool,
}

impl RowLogits for LazyRow<'_> {
    fn full(&mut self) -> Result<&[f32], EngineError> {
        let more = std::mem::take(&mut self.more);
        self.logits.row(self.model, self.row, || more)
    }

    fn chosen(&mut self, cfg: &SamplerConfig, position: usize) -> Result<Option<u32>, EngineError> {
        if self.logits.get(self.row).is_some() {
            return Ok(None);
        }
        if let Some(t) = self.logits.chosen_token(self.row, cfg, position) {
            return Ok(Some(t));
        }
        let mut rows = self.more.clone();
        if !rows.contains(&self.row) {
            rows.insert(0, self.row);
        }
        if !self.logits.screen(self.model, &rows)? {
            if !self.choose_in_head {
                return Ok(None);
            }
            // The rows below, chosen under the same settings, in the same
            // call (were the row's position in the pass not the one asked
            // for, its token is not found here and `full` computes it).
            let choose: Vec<(usize, &SamplerConfig)> = rows.iter().map(|&r| (r, cfg)).collect();
            self.logits.compute_choosing(self.model, &[], &choose)?;
            return Ok(self.logits.chosen_token(self.row, cfg, position));
        }
        let (model, row) = (self.model, self.row);
        let logits = &*self.logits;
        let Some((ub, likeliest)) = logits.bounds_of(row) else {
            return Ok(None);
        };
        let mut exact = |ids: &[u32]| -> Result<Vec<f32>, EngineError> {
            Ok(model.logits_of(logits.hidden(), row, ids)?)
        };
        let chosen = choose_bounded(cfg, ub, likeliest, position, &mut exact)?;
        model.record_screen(chosen.is_some());
        Ok(chosen)
    }

    fn computed(&self) -> Option<&[f32]> {
        self.logits.get(self.row)
    }
}

/// Appends `pending` (the last emitted token, at position `pos` of `seq`)
/// and the drafted `tree` after it, every row asking for logits. Returns
/// the rows: the pending token's first, then tree node `i` at `+ 1 + i`.
pub fn push_tree(
    batch: &mut Batch,
    seq: SeqId,
    pos: usize,
    pending: u32,
    tree: &TokenTree,
) -> Range<usize> {
    let root = batch.push(Row {
        token: pending,
        pos,
        seq,
        parent: None,
        logits: true,
    });
    for n in &tree.nodes {
        batch.push(Row {
            token: n.token,
            pos: pos + n.depth,
            seq,
            parent: Some(n.parent.map_or(root, |q| root + 1 + q)),
            logits: true,
        });
    }
    root..root + 1 + tree.len()
}

/// Batch row `row` and the rows of its likeliest descendants in `tree`,
/// whose root (the pending token) is batch row `root` and whose node `i` is
/// batch row `root + 1 + i`: from each node, the child the drafters rated
/// likeliest to be reached.
pub fn likeliest_path(tree: &TokenTree, root: usize, row: usize) -> Vec<usize> {
    let node = (row > root).then(|| row - root - 1);
    let mut rows = vec![row];
    rows.extend(tree.likeliest_below(node).into_iter().map(|i| root + 1 + i));
    rows
}

#[cfg(test)]
mod tests {
    use super::super::Draft;
    use super::*;

    #[test]
    fn the_likeliest_path_follows_the_best_child() {
        // Root children: 1 (.9) -> 2 (.81); 5 (.5).
        let t = TokenTree::build(
            &[
                Draft::uniform(vec![1, 2], 0.9),
                Draft::uniform(vec![5], 0.5),
            ],
            16,
        );
        // Nodes: 0 = 1, 1 = 2, 2 = 5; with the root at batch row 3.
        assert_eq!(likeliest_path(&t, 3, 3), vec![3, 4, 5]);
        assert_eq!(likeliest_path(&t, 3, 6), vec![6]);
        assert_eq!(likeliest_path(&TokenTree::default(), 0, 0), vec![0]);
    }
}
