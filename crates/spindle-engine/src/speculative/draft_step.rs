//! The draft step, the same for every caller: ask the drafter for as many
//! tokens as the budget policy finds worth it, merge its candidates into a
//! token tree and cut the tree to the size that maximises expected tokens
//! per second.

use std::time::Instant;

use super::drafter::{Draft, Drafter, Source};
use super::token_tree::{TokenTree, CERTAIN, MAX_DEPTH};
use super::tree_budget::TreeBudget;
use crate::constraint::Constraint;
use crate::error::EngineError;
use crate::sampler::SamplerConfig;

/// How likely a grammar's closer branch is taken, before anything is
/// measured (a value ends after any of its tokens with about this chance).
const CLOSER_PROB: f32 = 0.25;

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
///
/// `forced` is what a grammar forces next (a schema's keys and
/// punctuation): it rides the tree whatever drafting is worth, since the
/// walk is certain to accept it (the mask leaves the model no other
/// choice), and the drafter continues from its end.
///
/// Under a `constraint`, each drafted continuation is cut where the grammar
/// forbids it and extended by what the grammar then forces.
///
/// Drafts are coupled to the request's `sampler`: drafters rank their
/// tokens under the target's own noise, and the tree ranks count-based
/// siblings the same way ([`TokenTree::build_coupled`]).
pub fn draft_tree(
    drafter: &mut dyn Drafter,
    budget: &mut TreeBudget,
    history: &[u32],
    sampler: &SamplerConfig,
    depth: usize,
    mut constraint: Option<&mut Constraint>,
) -> Result<TokenTree, EngineError> {
    let forced = constraint
        .as_deref_mut()
        .map(Constraint::forced)
        .unwrap_or_default();
    // Forced tokens ride outside the node budget (they cost rows, but the
    // walk is certain to take them), within the depth.
    let forced = &forced[..forced.len().min(depth)];
    let ask = budget.draft_len(depth - forced.len());
    // Drafts from the grammar: the value may end right after the forced
    // chain, and what it forces then is certain once the closer is taken.
    let closers = constraint
        .as_deref()
        .map(|c| c.closers(forced, depth))
        .unwrap_or_default();
    if ask == 0 && forced.is_empty() && closers.is_empty() {
        return Ok(TokenTree::default());
    }
    let mut drafts = Vec::new();
    if ask > 0 {
        let t = Instant::now();
        let proposed = if forced.is_empty() {
            drafter.propose(history, ask, sampler)?
        } else {
            drafter.propose(&[history, forced].concat(), ask, sampler)?
        };
        for d in proposed {
            let mut tokens = forced.to_vec();
            let mut probs = vec![CERTAIN; forced.len()];
            match constraint.as_deref() {
                Some(c) => {
                    let (valid, tail) = c.fit_draft(forced, &d.tokens);
                    tokens.extend(&d.tokens[..valid]);
                    probs.extend(&d.probs[..valid]);
                    tokens.extend(&tail);
                    probs.extend(std::iter::repeat_n(CERTAIN, tail.len()));
                }
                None => {
                    tokens.extend(d.tokens);
                    probs.extend(d.probs);
                }
            }
            tokens.truncate(depth);
            probs.truncate(depth);
            drafts.push(Draft {
                tokens,
                probs,
                source: d.source,
            });
        }
        let drafted: usize = drafts
            .iter()
            .map(|d| d.tokens.len().saturating_sub(forced.len()))
            .sum();
        budget.record_draft(drafted, t.elapsed().as_secs_f64());
    }
    if drafts.is_empty() && !forced.is_empty() {
        drafts.push(Draft::uniform(forced.to_vec(), CERTAIN).from(Source::Grammar));
    }
    for branch in closers {
        let mut tokens = forced.to_vec();
        let mut probs = vec![CERTAIN; forced.len()];
        probs.push(CLOSER_PROB);
        probs.extend(std::iter::repeat_n(CERTAIN, branch.len() - 1));
        tokens.extend(branch);
        drafts.push(Draft {
            tokens,
            probs,
            source: Source::Grammar,
        });
    }
    let mut full = TokenTree::build_coupled(
        &drafts,
        budget.max_nodes + forced.len(),
        sampler,
        history.len(),
    );
    // Forced nodes have reach 1 and are the shallowest, so they come first
    // in the trie and in any cut.
    full.forced = forced.len().min(full.len());
    let keep = budget.choose(&mut full).max(full.forced);
    Ok(full.cut(keep))
}

impl Speculation {
    /// [`draft_tree`] with this sequence's drafter and policy.
    pub fn draft(
        &mut self,
        history: &[u32],
        sampler: &SamplerConfig,
        depth: usize,
        constraint: Option<&mut Constraint>,
    ) -> Result<TokenTree, EngineError> {
        draft_tree(
            self.drafter.as_mut(),
            &mut self.budget,
            history,
            sampler,
            depth,
            constraint,
        )
    }
}
