//! The draft step, the same for every caller: ask the drafter for as many
//! tokens as the budget policy finds worth it, merge its candidates into a
//! token tree and cut the tree to the size that maximises expected tokens
//! per second.

use std::time::Instant;

use super::drafter::Drafter;
use super::token_tree::{TokenTree, MAX_DEPTH};
use super::tree_budget::TreeBudget;
use crate::error::EngineError;

/// A sequence's speculation: its drafter and its tree-size policy.
pub struct Speculation {
    pub drafter: Box<dyn Drafter>,
    pub budget: TreeBudget,
}

/// Deepest useful tree after the pending token at position `pos`: within
/// [`MAX_DEPTH`], the tokens still to generate (`left`) and the context of
/// `max_len` (the pending token and every accepted one need a position).
pub fn draft_depth(left: usize, max_len: usize, pos: usize) -> usize {
    MAX_DEPTH.min(left).min(max_len.saturating_sub(pos + 2))
}

/// The tree to verify after the last token of `history` (the pending
/// token, not run yet): at most `depth` deep, sized by `budget`. Empty when
/// drafting does not pay (plain decoding).
pub fn draft_tree(
    drafter: &mut dyn Drafter,
    budget: &mut TreeBudget,
    history: &[u32],
    depth: usize,
) -> Result<TokenTree, EngineError> {
    let ask = budget.draft_len(depth);
    if ask == 0 {
        return Ok(TokenTree::default());
    }
    let t = Instant::now();
    let drafts = drafter.propose(history, ask)?;
    let drafted: usize = drafts.iter().map(|d| d.tokens.len()).sum();
    budget.record_draft(drafted, t.elapsed().as_secs_f64());
    let full = TokenTree::build(&drafts, budget.max_nodes);
    let keep = budget.choose(&full);
    Ok(full.cut(keep))
}

impl Speculation {
    /// [`draft_tree`] with this sequence's drafter and policy.
    pub fn draft(&mut self, history: &[u32], depth: usize) -> Result<TokenTree, EngineError> {
        draft_tree(self.drafter.as_mut(), &mut self.budget, history, depth)
    }
}
