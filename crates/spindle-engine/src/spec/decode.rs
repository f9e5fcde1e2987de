//! Speculative generation: after each emitted token, draft a tree of
//! continuations, verify the pending token and the whole tree in one pass,
//! and walk it: at each node sample the target's own token, exactly as plain
//! decoding would at that position, and descend while a child holds it.
//! Only the rows of the accepted path are committed to the KV cache.
//!
//! Why the output is exactly plain decoding's: a row's logits are
//! bit-identical whether it runs alone or in a tree (the one-pass rule,
//! tested in spindle-model), and the sampler is a pure function of
//! (settings, seed, position, logits, history). The walk samples every token
//! at the same position, from the same logits, with the same history, and
//! checks stops and limits in the same order as [`crate::generate`].

use std::time::Instant;

use spindle_model::{Batch, KvCache, Model, SeqId};

use super::adaptive::Adaptive;
use super::drafter::Drafter;
use super::tree::{TokenTree, MAX_DEPTH};
use super::verify::{likeliest_path, push_tree, LazyLogits};
use crate::error::EngineError;
use crate::generate::{prefill, FinishReason, GenerateOutput, GenerateRequest, GenerateStats};
use crate::sampler::sample;

/// Generates from `req.prompt` like [`crate::generate`], drafting with
/// `drafter` and sizing trees with `policy`.
pub fn generate_speculative(
    model: &Model,
    kv: &mut KvCache,
    req: &GenerateRequest,
    drafter: &mut dyn Drafter,
    policy: &mut Adaptive,
    mut on_token: impl FnMut(u32) -> bool,
) -> Result<GenerateOutput, EngineError> {
    let seq = kv.add_sequence()?;
    let result = generate_speculative_on(model, kv, seq, req, drafter, policy, &mut on_token);
    kv.remove_sequence(seq);
    result
}

/// [`generate_speculative`] on an open, empty sequence, which keeps its KV
/// afterwards (the accepted tokens only).
pub fn generate_speculative_on(
    model: &Model,
    kv: &mut KvCache,
    seq: SeqId,
    req: &GenerateRequest,
    drafter: &mut dyn Drafter,
    policy: &mut Adaptive,
    on_token: &mut impl FnMut(u32) -> bool,
) -> Result<GenerateOutput, EngineError> {
    let mut gen = Generation {
        model,
        req,
        seq,
        history: req.prompt.clone(),
        out: Vec::new(),
        on_token,
    };
    gen.run(kv, drafter, policy)
}

/// Whether generation goes on after a token.
enum Step {
    Continue(u32),
    Finish(FinishReason),
}

struct Generation<'a, F: FnMut(u32) -> bool> {
    model: &'a Model,
    req: &'a GenerateRequest,
    seq: SeqId,
    /// Prompt and emitted tokens.
    history: Vec<u32>,
    out: Vec<u32>,
    on_token: &'a mut F,
}

impl<F: FnMut(u32) -> bool> Generation<'_, F> {
    /// Samples the token at the next position from `logits`, emits it, and
    /// applies plain decoding's stops and limits in its order.
    fn step(&mut self, logits: &[f32], max_len: usize) -> Step {
        let pos = self.history.len();
        let token = sample(&self.req.sampler, logits, &self.history, pos);
        if self.req.stop_ids.contains(&token) {
            return Step::Finish(FinishReason::Stop);
        }
        self.out.push(token);
        self.history.push(token);
        if !(self.on_token)(token) {
            return Step::Finish(FinishReason::Cancelled);
        }
        if self.out.len() >= self.req.max_tokens || pos + 1 >= max_len {
            return Step::Finish(FinishReason::Length);
        }
        Step::Continue(token)
    }

    fn run(
        &mut self,
        kv: &mut KvCache,
        drafter: &mut dyn Drafter,
        policy: &mut Adaptive,
    ) -> Result<GenerateOutput, EngineError> {
        let mut stats = GenerateStats {
            prompt_tokens: self.req.prompt.len(),
            ..Default::default()
        };
        let t0 = Instant::now();
        let (logits, passes) = prefill(self.model, kv, self.seq, &self.req.prompt)?;
        stats.prompt_seconds = t0.elapsed().as_secs_f64();
        stats.passes = passes;
        let t1 = Instant::now();
        let max_len = kv.max_len();

        let mut pending = match self.req.max_tokens {
            0 => Step::Finish(FinishReason::Length),
            _ => self.step(&logits, max_len),
        };
        let finish = loop {
            let token = match pending {
                Step::Finish(f) => break f,
                Step::Continue(t) => t,
            };
            // `token` is emitted but not yet run, at position `p`.
            let p = self.history.len() - 1;
            let depth = MAX_DEPTH
                .min(self.req.max_tokens - self.out.len())
                .min(max_len.saturating_sub(p + 2));
            let ask = policy.draft_len(depth);
            let drafts = if ask > 0 {
                let t = Instant::now();
                let drafts = drafter.propose(&self.history, ask)?;
                let drafted: usize = drafts.iter().map(|d| d.tokens.len()).sum();
                policy.record_draft(drafted, t.elapsed().as_secs_f64());
                drafts
            } else {
                Vec::new()
            };
            let full = TokenTree::build(&drafts, policy.max_nodes);
            let tree = full.cut(policy.choose(&full));

            let mut batch = Batch::new();
            push_tree(&mut batch, self.seq, p, token, &tree);
            let t = Instant::now();
            let mut logits = LazyLogits::new(self.model.forward_hidden(&batch, kv)?);
            stats.passes += 1;
            stats.decode_passes += 1;
            stats.drafted += tree.len();

            // Walk: row 0 is the pending token; tree node i is row i + 1.
            let mut path = vec![0usize];
            let mut node = None;
            let mut rejected = false;
            pending = loop {
                let row = *path.last().expect("the path starts at the root");
                let l = logits.row(self.model, row, || likeliest_path(&tree, 0, row))?;
                let step = self.step(l, max_len);
                let Step::Continue(t) = step else {
                    break step;
                };
                match tree.child(node, t) {
                    Some(c) => {
                        node = Some(c);
                        path.push(c + 1);
                    }
                    None => {
                        rejected = tree.nodes.iter().any(|n| n.parent == node);
                        break Step::Continue(t);
                    }
                }
            };
            policy.record_pass(batch.len(), t.elapsed().as_secs_f64());
            let accepted = path.len() - 1;
            stats.accepted += accepted;
            policy.record_acceptance(accepted, rejected);
            kv.commit(self.seq, &path)?;
        };
        stats.gen_tokens = self.out.len();
        stats.gen_seconds = t1.elapsed().as_secs_f64();
        Ok(GenerateOutput {
            tokens: std::mem::take(&mut self.out),
            finish,
            stats,
        })
    }
}
