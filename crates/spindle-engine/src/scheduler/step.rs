//! One pass over every running sequence: build the batch (each decoding
//! sequence's pending token with the tree drafted after it, then prompt
//! chunks up to the token budget), run it, and for each sequence commit
//! what it keeps and emit its tokens: a prompt chunk whole, a score tree's
//! scores, or the walk down its verified tree
//! ([`crate::speculative::walk`], the same walk single-sequence decoding
//! takes).

use std::ops::Range;
use std::sync::atomic::Ordering;
use std::time::Instant;

use spindle_model::Batch;

use super::engine::EngineLoop;
use super::metrics::Metrics;
use super::request::{Event, Finished, TokenLogprobs};
use super::score_tree::{push_score_tree, read_scores, PlacedTree};
use super::sequence::{Phase, Sequence};
use crate::error::{EngineError, RequestError};
use crate::generate::{prepare_during, FinishReason};
use crate::sampler::SamplerConfig;
use crate::score::{log_softmax, top_k};
use crate::speculative::draft_step::draft_depth;
use crate::speculative::verify::{likeliest_path, push_tree, walk, LazyLogits};
use crate::speculative::TokenTree;

/// What one running sequence contributes to a pass.
struct Part {
    running: usize,
    rows: Range<usize>,
    /// Prompt tokens the rows feed (0 for a decode row).
    prompt_tokens: usize,
    /// The row whose logits choose the next token, if any.
    logits_row: Option<usize>,
    /// The drafted tree verified after the pending token (rows after it).
    tree: TokenTree,
    /// A request's score tree, behind its prompt's last chunk.
    score: Option<PlacedTree>,
}

impl EngineLoop {
    /// One pass over every running sequence.
    pub(super) fn step(&mut self) {
        let with_trees = self.make_room();
        if self.running.iter().all(Sequence::is_finished) {
            return;
        }
        let mut batch = Batch::new();
        let mut parts = self.decode_parts(&mut batch, with_trees);
        parts.extend(self.prefill_parts(&mut batch));
        if batch.is_empty() {
            return;
        }
        let t = Instant::now();
        let (mut logits, (body_ms, head_ms)) = match self.pass(&batch, &parts) {
            Ok(l) => l,
            Err(e) => {
                // Nothing of the pass is committed; its requests end with
                // the error and free their slots.
                let e = RequestError::internal(format!("the forward pass failed: {e}"));
                for p in &parts {
                    self.fail(p.running, e.clone());
                }
                return;
            }
        };
        self.metrics.passes.fetch_add(1, Ordering::Relaxed);
        let first_head = logits.head_calls();
        let first_head_seconds = logits.head_seconds();
        let walks = Instant::now();
        let mut tokens = 0;
        let prompt_rows: usize = parts.iter().map(|p| p.prompt_tokens).sum();
        for p in parts {
            let generated = self.running[p.running].generated;
            // NaN or infinity (corrupt weights, say) would choose tokens at
            // random: the request ends with the reason instead.
            if p.rows
                .clone()
                .any(|row| !logits.hidden().row_is_finite(row))
            {
                self.metrics.non_finite.fetch_add(1, Ordering::Relaxed);
                self.fail(p.running, RequestError::internal("the model produced NaN or infinite values for this request: its weights are likely corrupt (check them with --check-weights)"));
                continue;
            }
            if let Err(e) = self.finish_part(&p, &mut logits) {
                self.fail(p.running, RequestError::internal(e.to_string()));
            }
            tokens += self.running[p.running].generated - generated;
        }
        let walk_ms = walks.elapsed().as_secs_f64() * 1e3;
        let seconds = t.elapsed().as_secs_f64();
        // The tree budgets price verification rows: a pass that also feeds
        // a prompt would pull the line towards prompt rows, which are
        // cheaper (no output head) and come in hundreds, so one such pass
        // outweighs dozens of decoding ones in the fit.
        if prompt_rows == 0 {
            self.cost.record(batch.len(), seconds);
        }
        let head = logits.head_calls();
        tracing::debug!(
            rows = batch.len(),
            prompt_rows,
            sequences = self.running.len(),
            tokens,
            head_rows_first = first_head.1,
            head_calls_later = head.0 - first_head.0,
            head_rows_later = head.1 - first_head.1,
            body_ms,
            head_ms,
            walk_ms,
            walk_head_ms = (logits.head_seconds() - first_head_seconds) * 1e3,
            ms = seconds * 1e3,
            "pass"
        );
    }

    /// Ends running sequence `i` with `e`.
    fn fail(&mut self, i: usize, e: RequestError) {
        // Counted first, so a client that sees the error sees it counted.
        self.metrics.requests_failed.fetch_add(1, Ordering::Relaxed);
        let r = &mut self.running[i];
        let _ = r.req.events.send(Event::Error(e));
        r.phase = Phase::Finished;
    }

    /// Each decoding sequence's pending token, with the tree its drafter
    /// proposes (`with_trees`) sized by its budget against its share of
    /// the pass cost.
    fn decode_parts(&mut self, batch: &mut Batch, with_trees: bool) -> Vec<Part> {
        let max_len = self.kv.max_len();
        let n_decode = self.running.iter().filter(|r| r.is_decoding()).count();
        let cost = self.cost.fit();
        let mut parts = Vec::new();
        for (i, r) in self.running.iter_mut().enumerate() {
            if !r.is_decoding() {
                continue;
            }
            let p = r.history.len() - 1;
            let tree = match &mut r.speculation {
                Some(s) if with_trees => {
                    if let Some((fixed, per_row)) = cost {
                        // This sequence's share of the fixed cost, and what
                        // each of its rows adds.
                        s.budget
                            .set_pass_cost(fixed / n_decode as f64 + per_row, per_row);
                    }
                    let depth = draft_depth(r.req.params.max_tokens - r.generated, max_len, p);
                    s.draft(
                        &r.history,
                        &r.req.params.sampler,
                        depth,
                        r.constraint.as_mut(),
                    )
                    .unwrap_or_else(|e| {
                        // The walk decides the tokens either way.
                        tracing::warn!("drafting failed, decoding plainly this pass: {e}");
                        TokenTree::default()
                    })
                }
                _ => TokenTree::default(),
            };
            let rows = push_tree(batch, r.seq, p, r.history[p], &tree);
            parts.push(Part {
                running: i,
                logits_row: Some(rows.start),
                rows,
                prompt_tokens: 0,
                tree,
                score: None,
            });
        }
        parts
    }

    /// Prompt chunks in the rows the budget leaves; a prompt's last chunk
    /// carries its score tree, or asks for the logits of its last row.
    fn prefill_parts(&mut self, batch: &mut Batch) -> Vec<Part> {
        let budget = self.config.max_batch_tokens.saturating_sub(batch.len());
        let mut parts = Vec::new();
        for (i, take) in self.prefill_chunks(budget) {
            let r = &self.running[i];
            let Phase::Prefilling { fed, to } = r.phase else {
                unreachable!("only prefilling sequences have chunks");
            };
            let last = fed + take == to;
            let score_tree = r.req.score.as_ref().filter(|_| last);
            let rows = batch.push_chain(r.seq, fed, &r.history[fed..fed + take], |j| {
                last && j + 1 == take && score_tree.is_none()
            });
            let score = score_tree.map(|t| push_score_tree(batch, r.seq, rows.end - 1, t));
            let logits_row = (last && score.is_none()).then(|| rows.end - 1);
            parts.push(Part {
                running: i,
                rows,
                prompt_tokens: take,
                logits_row,
                tree: TokenTree::default(),
                score,
            });
        }
        parts
    }

    /// The pass itself, and the head over the rows the walks will read
    /// first: every prompt's last row and each tree's likeliest path.
    /// With the milliseconds of the layers and of the head's first call.
    fn pass(
        &mut self,
        batch: &Batch,
        parts: &[Part],
    ) -> Result<(LazyLogits, (f64, f64)), EngineError> {
        let t = Instant::now();
        // The masks of the tokens this pass will choose are computed beside it.
        let choosing: Vec<(usize, Vec<u32>)> = parts
            .iter()
            .filter(|p| p.logits_row.is_some())
            .map(|p| (p.running, p.tree.likeliest_tokens()))
            .collect();
        let constraints = self.running.iter_mut().enumerate().filter_map(|(i, r)| {
            let path = choosing.iter().find(|c| c.0 == i)?.1.clone();
            Some((r.constraint.as_mut()?, path))
        });
        let hidden = prepare_during(self.model.n_threads(), constraints, || {
            self.model.forward_hidden(batch, &mut self.kv)
        })?;
        let body_ms = t.elapsed().as_secs_f64() * 1e3;
        let mut logits = LazyLogits::new(hidden, batch);
        // Rows whose walk needs only the chosen token have it chosen as the
        // head computes them (or, alone, read the head's screen); the
        // others (log-probabilities, penalties, cut sampling, logit bias)
        // keep every logit. One call of the head for all of them.
        let max_len = self.kv.max_len();
        let (mut first, mut screened) = (Vec::new(), Vec::new());
        for p in parts {
            if let Some(row) = p.logits_row {
                let r = &self.running[p.running];
                let rules = r.req.params.rules(max_len);
                let rows = likeliest_path(&p.tree, row, row);
                if rules.chooses_from_bounds() {
                    let constrained = r.constraint.is_some();
                    screened.extend(
                        rows.into_iter()
                            .map(|row| (row, rules.sampler, constrained)),
                    );
                } else {
                    first.extend(rows);
                }
            }
        }
        let screened_rows: Vec<usize> = screened.iter().map(|s| s.0).collect();
        if logits.screen(&self.model, &screened_rows)? {
            screened.clear();
        }
        // A constrained row whose chosen token its grammar forbids reads
        // every logit (the walk's `LazyRow::choose_in_head`): those rows
        // keep them in this call rather than take a second one.
        let (constrained, free): (Vec<_>, Vec<_>) = screened.into_iter().partition(|s| s.2);
        first.extend(constrained.iter().map(|s| s.0));
        let screened: Vec<(usize, &SamplerConfig)> = free.iter().map(|s| (s.0, s.1)).collect();
        for p in parts {
            if let Some(s) = &p.score {
                first.extend(&s.logits_rows);
            }
        }
        logits.compute_choosing(&self.model, &first, &screened)?;
        let head_ms = t.elapsed().as_secs_f64() * 1e3 - body_ms;
        Ok((logits, (body_ms, head_ms)))
    }

    /// Commits what a sequence keeps of the pass and emits its tokens.
    fn finish_part(&mut self, p: &Part, logits: &mut LazyLogits) -> Result<(), EngineError> {
        let max_len = self.kv.max_len();
        let r = &mut self.running[p.running];
        // A prompt chunk is committed whole; a walk commits its path below.
        if p.prompt_tokens > 0 {
            let rows: Vec<usize> = p.rows.clone().collect();
            self.kv.commit(r.seq, &rows)?;
            if let Phase::Prefilling { fed, to } = r.phase {
                r.phase = Phase::Prefilling {
                    fed: fed + p.prompt_tokens,
                    to,
                };
            }
        }
        if let Some(placed) = &p.score {
            let tree = r.req.score.as_ref().expect("a score part has a tree");
            let scores = read_scores(&self.model, logits, tree, placed)?;
            let _ = r.req.events.send(Event::Scores(scores));
            finish(&self.metrics, r, FinishReason::Stop);
            return Ok(());
        }
        let Some(root) = p.logits_row else {
            return Ok(());
        };
        let metrics = &*self.metrics;
        let rules = r.req.params.rules(max_len);
        let (events, arrived, last_token_at) = (&r.req.events, r.arrived, &mut r.last_token_at);
        let logprobs = r.req.params.logprobs;
        let mut emit = |token: u32, l: Option<&[f32]>| {
            let logprobs = logprobs.and_then(|k| Some(token_logprobs(l?, token, k)));
            metrics.record_token(arrived, last_token_at);
            events
                .send(Event::Token {
                    id: token,
                    logprobs,
                })
                .is_ok()
        };
        let w = walk(
            &self.model,
            logits,
            &p.tree,
            root,
            &rules,
            &mut r.history,
            &mut r.generated,
            r.constraint.as_mut(),
            &mut emit,
        )?;
        if p.prompt_tokens == 0 {
            self.kv.commit(r.seq, &w.path)?;
        }
        let accepted = w.nodes();
        if let Some(s) = &mut r.speculation {
            s.budget.record_acceptance(&p.tree, &accepted, w.rejected);
        }
        if !p.tree.is_empty() {
            metrics.record_drafts(&p.tree, &accepted);
        }
        // Every pass that chose tokens says so, drafts or not: the client
        // counts its passes (tokens per pass) from these.
        let _ = r.req.events.send(Event::Speculated {
            drafted: p.tree.len(),
            accepted: accepted.len(),
        });
        match w.finish {
            Some(reason) => finish(metrics, r, reason),
            None => r.phase = Phase::Decoding,
        }
        Ok(())
    }
}

/// Sends a request's final event and records its latency.
pub(super) fn finish(metrics: &Metrics, r: &mut Sequence, reason: FinishReason) {
    r.phase = Phase::Finished;
    r.end_drafts();
    let _ = r.req.events.send(Event::Finished(Finished {
        reason,
        prompt_tokens: r.req.prompt.len(),
        completion_tokens: r.generated,
    }));
    let counter = match reason {
        FinishReason::Cancelled => &metrics.requests_cancelled,
        FinishReason::Stop | FinishReason::Length => &metrics.requests_finished,
    };
    counter.fetch_add(1, Ordering::Relaxed);
    if reason == FinishReason::Length {
        metrics
            .requests_finished_length
            .fetch_add(1, Ordering::Relaxed);
    }
    metrics.observe(&metrics.e2e_latency, r.arrived.elapsed().as_secs_f64());
    if let Some(c) = &r.constraint {
        let micros = |s: f64| (s * 1e6) as u64;
        metrics
            .grammar_masks
            .fetch_add(c.timing.masks as u64, Ordering::Relaxed);
        metrics
            .grammar_mask_micros
            .fetch_add(micros(c.timing.seconds), Ordering::Relaxed);
        metrics
            .grammar_mask_wait_micros
            .fetch_add(micros(c.timing.waiting_seconds), Ordering::Relaxed);
    }
}

/// Log-softmax of `logits` at `token`, and the `k` likeliest tokens (as
/// `spindle score` computes them).
pub(crate) fn token_logprobs(logits: &[f32], token: u32, k: usize) -> TokenLogprobs {
    let lp = log_softmax(logits);
    TokenLogprobs {
        logprob: lp[token as usize] as f32,
        top: top_k(&lp, k)
            .into_iter()
            .map(|t| (t.id, t.logprob as f32))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprobs_are_a_log_softmax_with_the_top_in_order() {
        let logits = [1.0f32, 3.0, 2.0, 3.0, -1.0];
        let z: f64 = logits.iter().map(|&l| (l as f64).exp()).sum();
        let want = |i: usize| (logits[i] as f64 - z.ln()) as f32;
        let lp = token_logprobs(&logits, 2, 3);
        assert!((lp.logprob - want(2)).abs() < 1e-6);
        let ids: Vec<u32> = lp.top.iter().map(|t| t.0).collect();
        // Ties keep the lower id first.
        assert_eq!(ids, vec![1, 3, 2]);
        assert!((lp.top[0].1 - want(1)).abs() < 1e-6);
        assert!(token_logprobs(&logits, 0, 0).top.is_empty());
    }
}
