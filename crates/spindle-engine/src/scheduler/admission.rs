//! The scheduling policy: which waiting requests are admitted, which
//! prompt chunks run in the next pass, and who is preempted when the KV
//! pool runs short.
//!
//! A request is admitted only when a sequence slot is free and the pool
//! has room for its whole prompt beside what the running sequences need
//! next. When the next pass would need more blocks than the pool has free,
//! speculative trees go first, then the most recently admitted sequence is
//! preempted: its blocks are freed and it waits, ahead of new requests, to
//! be recomputed from its tokens so far (much of it from the prefix
//! cache). Nothing is truncated and its output does not change.

use std::sync::atomic::Ordering;

use spindle_model::SeqId;

use super::engine::{EngineLoop, Waiting};
use super::request::Event;
use super::sequence::{Phase, Sequence};
use super::step::finish;
use crate::error::{ErrorKind, RequestError};
use crate::generate::FinishReason;
use crate::speculative::draft_step::Speculation;
use crate::speculative::token_tree::MAX_DEPTH;
use crate::speculative::TreeBudget;

impl EngineLoop {
    /// Admits requests while a sequence slot is free and the KV pool has
    /// room for their prompts beside the running sequences' next pass:
    /// preempted requests first (earliest admitted first), then the queue.
    pub(super) fn admit(&mut self) {
        if self.config.static_batching && !self.running.is_empty() {
            return;
        }
        while self.kv.free_sequences() > 0 {
            let earliest = (0..self.preempted.len()).min_by_key(|&i| self.preempted[i].admitted);
            if let Some(i) = earliest {
                let r = self.preempted.swap_remove(i);
                if let Some(r) = self.resume(r) {
                    self.preempted.push(r);
                    return;
                }
                continue;
            }
            let Some(w) = self.next_up.take().or_else(|| self.waiting.pop()) else {
                return;
            };
            if let Some(w) = self.start(w) {
                self.next_up = Some(w);
                return;
            }
        }
    }

    /// Opens a sequence for `tokens` (from the prefix cache as far as it
    /// holds them) if the pool has room to prefill the rest beside what
    /// the running sequences need next; returns it and the cached length.
    fn open_sequence(&mut self, tokens: &[u32]) -> Option<(SeqId, usize)> {
        let (seq, cached) = self.kv.add_sequence_with_prefix(tokens).ok()?;
        let mut commits = self.demands(false);
        commits.push((seq, tokens.len() - cached));
        // Alone, a sequence always fits: the pool holds a whole context.
        if !self.running.is_empty() && !self.kv.fits(&commits) {
            self.kv.remove_sequence(seq);
            return None;
        }
        self.metrics.record_prefix_lookup(tokens.len(), cached);
        Some((seq, cached))
    }

    /// Starts a new request (checked when it was submitted); gives it back
    /// if there is no room yet.
    fn start(&mut self, mut w: Waiting) -> Option<Waiting> {
        let Some((seq, cached)) = self.open_sequence(&w.req.prompt) else {
            return Some(w);
        };
        self.queued.fetch_sub(1, Ordering::SeqCst);
        self.metrics
            .prompt_tokens
            .fetch_add(w.req.prompt.len() as u64, Ordering::Relaxed);
        self.admissions += 1;
        let scoring = w.req.score.is_some();
        let speculation = match self.config.tree_budget {
            Some(b) if !scoring && w.req.params.speculate => {
                self.spare_drafters.pop().map(|mut drafter| {
                    drafter.begin(&w.req.tenant);
                    Speculation {
                        drafter,
                        budget: if self.config.fixed_tree_budget {
                            TreeBudget::fixed(b)
                        } else {
                            TreeBudget::new(b)
                        },
                    }
                })
            }
            _ => None,
        };
        let history = w.req.prompt.clone();
        let constraint = w.req.params.constraint.take();
        let mut r = Sequence {
            phase: Phase::Prefilling {
                fed: cached,
                to: history.len(),
            },
            req: w.req,
            seq,
            arrived: w.arrived,
            admitted: self.admissions,
            history,
            generated: 0,
            last_token_at: None,
            speculation,
            constraint,
        };
        if r.req.params.max_tokens == 0 && !scoring {
            finish(&self.metrics, &mut r, FinishReason::Length);
            self.release(r);
            return None;
        }
        self.running.push(r);
        None
    }

    /// Brings a preempted request back (its tokens so far are its
    /// prompt); gives it back if there is no room yet.
    fn resume(&mut self, mut r: Sequence) -> Option<Sequence> {
        let Phase::Prefilling { to, .. } = r.phase else {
            unreachable!("a preempted sequence prefills again");
        };
        let Some((seq, cached)) = self.open_sequence(&r.history[..to]) else {
            return Some(r);
        };
        r.seq = seq;
        r.phase = Phase::Prefilling { fed: cached, to };
        self.running.push(r);
        None
    }

    /// The prompt chunks that fit in `budget` rows: `(running index,
    /// tokens)`, earliest admitted first, so a prompt cannot be overtaken
    /// for ever by newer ones.
    pub(super) fn prefill_chunks(&self, mut budget: usize) -> Vec<(usize, usize)> {
        let mut order: Vec<usize> = (0..self.running.len()).collect();
        order.sort_by_key(|&i| self.running[i].admitted);
        let mut chunks = Vec::new();
        for i in order {
            let take = self.running[i].prefill_left().min(budget);
            if take > 0 {
                budget -= take;
                chunks.push((i, take));
            }
        }
        chunks
    }

    /// What each running sequence may commit in the next pass: its pending
    /// token and, `with_trees`, the deepest accepted path of its tree; the
    /// prompt chunks the token budget leaves room for.
    fn demands(&self, with_trees: bool) -> Vec<(SeqId, usize)> {
        let tree = match (with_trees, self.config.tree_budget) {
            (true, Some(b)) => b.min(MAX_DEPTH),
            _ => 0,
        };
        let mut commits = Vec::new();
        for r in self.running.iter().filter(|r| r.is_decoding()) {
            commits.push((r.seq, 1 + tree));
        }
        let budget = self.config.max_batch_tokens.saturating_sub(commits.len());
        for (i, take) in self.prefill_chunks(budget) {
            commits.push((self.running[i].seq, take));
        }
        commits
    }

    /// Makes the next pass fit in the KV pool: without speculative trees if
    /// need be, else by preempting the most recently admitted sequences.
    /// Returns whether the pass may verify trees.
    pub(super) fn make_room(&mut self) -> bool {
        loop {
            if self.kv.fits(&self.demands(true)) {
                return true;
            }
            if self.kv.fits(&self.demands(false)) {
                return false;
            }
            if self.running.len() <= 1 {
                // Cannot happen with a pool that holds a whole context;
                // if it does, the request ends with the reason.
                let e = RequestError::new(
                    ErrorKind::Capacity,
                    "the KV cache has no room for this sequence's next tokens: give it more --kv-memory",
                );
                for r in &mut self.running {
                    let _ = r.req.events.send(Event::Error(e.clone()));
                    r.phase = Phase::Finished;
                }
                return false;
            }
            let latest = (0..self.running.len())
                .max_by_key(|&i| self.running[i].admitted)
                .expect("more than one running");
            self.preempt(latest);
        }
    }

    /// Frees running sequence `i`'s blocks; it waits to be recomputed from
    /// everything so far, the pending token included, whose logits then
    /// choose the next token as decoding would have.
    fn preempt(&mut self, i: usize) {
        let mut r = self.running.swap_remove(i);
        self.kv.remove_sequence(r.seq);
        r.phase = Phase::Prefilling {
            fed: 0,
            to: r.history.len(),
        };
        self.metrics.preemptions.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(seq = r.seq, tokens = r.history.len(), "preempted");
        self.preempted.push(r);
    }
}
