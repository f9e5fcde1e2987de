//! Speculative generation: after each emitted token, draft a tree of
//! continuations, verify the pending token and the whole tree in one pass,
//! and walk it: at each node sample the target's own token, exactly as plain
//! decoding would at that position, and descend while a child holds it.
//! Only the rows of the accepted path are committed to the KV cache.
//!
//! The draft step ([`super::draft_step`]) and the walk ([`super::verify`])
//! are the ones the serving loop uses too; why the output is exactly plain
//! decoding's is said there.

use std::time::Instant;

use spindle_model::{Batch, KvCache, Model, ModelError, SeqId};

use super::draft_step::{draft_depth, draft_tree};
use super::drafter::Drafter;
use super::tree_budget::TreeBudget;
use super::verify::{push_tree, walk, LazyLogits};
use crate::error::EngineError;
use crate::generate::{
    next_token, prefill_rest, prepare_during, FinishReason, FullRow, GenerateOutput,
    GenerateRequest, GenerateStats, Next,
};

/// Generates from `req.prompt` like [`crate::generate`], drafting with
/// `drafter` and sizing trees with `policy`.
pub fn generate_speculative(
    model: &Model,
    kv: &mut KvCache,
    req: &GenerateRequest,
    drafter: &mut dyn Drafter,
    policy: &mut TreeBudget,
    mut on_token: impl FnMut(u32) -> bool,
) -> Result<GenerateOutput, EngineError> {
    let seq = kv.add_sequence()?;
    let result = generate_speculative_on(model, kv, seq, req, drafter, policy, &mut on_token);
    kv.remove_sequence(seq);
    result
}

/// [`generate_speculative`] on an open sequence, which keeps its KV
/// afterwards (the accepted tokens only). Like [`crate::generate_on`], a
/// sequence holding the KV of a prefix of `req.prompt` prefills only the
/// rest.
pub fn generate_speculative_on(
    model: &Model,
    kv: &mut KvCache,
    seq: SeqId,
    req: &GenerateRequest,
    drafter: &mut dyn Drafter,
    policy: &mut TreeBudget,
    on_token: &mut impl FnMut(u32) -> bool,
) -> Result<GenerateOutput, EngineError> {
    let mut gen = Generation {
        model,
        req,
        seq,
        history: req.prompt.clone(),
        on_token,
    };
    gen.run(kv, drafter, policy)
}

struct Generation<'a, F: FnMut(u32) -> bool> {
    model: &'a Model,
    req: &'a GenerateRequest,
    seq: SeqId,
    /// Prompt and emitted tokens.
    history: Vec<u32>,
    on_token: &'a mut F,
}

impl<F: FnMut(u32) -> bool> Generation<'_, F> {
    fn run(
        &mut self,
        kv: &mut KvCache,
        drafter: &mut dyn Drafter,
        policy: &mut TreeBudget,
    ) -> Result<GenerateOutput, EngineError> {
        let mut stats = GenerateStats {
            prompt_tokens: self.req.prompt.len(),
            ..Default::default()
        };
        let t0 = Instant::now();
        let (logits, passes, prefilled) = prefill_rest(self.model, kv, self.seq, &self.req.prompt)?;
        stats.prompt_seconds = t0.elapsed().as_secs_f64();
        stats.passes = passes;
        stats.prefilled_tokens = prefilled;
        let t1 = Instant::now();
        let rules = self.req.rules(kv.max_len());
        let mut generated = 0;
        let mut constraint = self.req.constraint.clone();
        let on_token = &mut *self.on_token;
        let mut emit = |t: u32, _: Option<&[f32]>| on_token(t);

        let mut finish = match self.req.max_tokens {
            0 => Some(FinishReason::Length),
            _ => match next_token(
                &rules,
                &mut FullRow(&logits),
                &mut self.history,
                &mut generated,
                constraint.as_mut(),
                &mut emit,
            )? {
                Next::Token(_) => None,
                Next::End(reason) => Some(reason),
            },
        };
        while finish.is_none() {
            // The last emitted token is pending (not run yet), at `p`.
            let p = self.history.len() - 1;
            let depth = draft_depth(self.req.max_tokens - generated, rules.max_len, p);
            let tree = draft_tree(
                drafter,
                policy,
                &self.history,
                rules.sampler,
                depth,
                constraint.as_mut(),
            )?;

            let mut batch = Batch::new();
            let token = self.history[p];
            let root = push_tree(&mut batch, self.seq, p, token, &tree).start;
            let t = Instant::now();
            let preparing = constraint.as_mut().map(|c| (c, tree.likeliest_tokens()));
            let threads = self.model.n_threads();
            let hidden =
                prepare_during(threads, preparing, || self.model.forward_hidden(&batch, kv))?;
            if let Some(row) = hidden.first_non_finite_row() {
                return Err(ModelError::NonFiniteActivations { row }.into());
            }
            let mut logits = LazyLogits::new(hidden, &batch);
            stats.passes += 1;
            stats.decode_passes += 1;
            stats.drafted += tree.len();
            let w = walk(
                self.model,
                &mut logits,
                &tree,
                root,
                &rules,
                &mut self.history,
                &mut generated,
                constraint.as_mut(),
                &mut emit,
            )?;
            policy.record_pass(batch.len(), t.elapsed().as_secs_f64());
            stats.accepted += w.accepted();
            for (all, (d, a)) in stats
                .by_source
                .iter_mut()
                .zip(tree.source_counts(&w.nodes()))
            {
                all.0 += d;
                all.1 += a;
            }
            policy.record_acceptance(&tree, &w.nodes(), w.rejected);
            kv.commit(self.seq, &w.path)?;
            finish = w.finish;
        }
        stats.gen_tokens = generated;
        stats.gen_seconds = t1.elapsed().as_secs_f64();
        if let Some(c) = &constraint {
            stats.add_masks(c);
        }
        Ok(GenerateOutput {
            tokens: self.history.split_off(self.req.prompt.len()),
            finish: finish.expect("the loop ends with a reason"),
            stats,
        })
    }
}
