//! Drafting with a smaller model that shares the target's vocabulary (a
//! smaller sibling, or the same model at lower precision): it decodes on
//! its own KV cache, a few tokens ahead of the target, choosing each token
//! as the target's sampler would from the draft's logits (greedy: the
//! argmax; sampling: the same Gumbel noise, so a close draft model draws
//! the target's token, not merely its likeliest).
//!
//! The draft cache is kept in step with the history incrementally: what it
//! has committed is the last history it saw plus the tokens it drafted after
//! it. The next [`Drafter::propose`] keeps the common prefix with the new
//! history, rolls back the rest (what the verifier rejected) and runs only
//! the tokens it lacks; drafted tokens still on the new path are reused
//! without a pass. Its sliding-window layers keep [`ROLLBACK`] slots beyond
//! their window so that the rollback is possible; a longer one re-prefills
//! the sequence from the start.

use std::sync::Arc;

use spindle_model::{Batch, KvCache, KvLayout, Model, ModelError, SeqId};

use crate::error::EngineError;
use crate::sampler::{argmax, coupled_choice, sample, SamplerConfig};

use super::drafter::{Draft, Drafter, Source};

/// The most a draft model's probability counts for: certainty
/// ([`super::token_tree::CERTAIN`]) is the grammar's alone.
const MOST_SURE: f32 = 0.999;

/// Tokens the draft cache can roll back, and so the longest draft.
pub const ROLLBACK: usize = 64;

/// Longest chain run in one catch-up pass of the draft model.
pub const CATCH_UP_CHUNK: usize = 512;

/// Default confidence under which drafting stops (after the first token):
/// a low-confidence tail mostly costs verification rows.
pub const DEFAULT_MIN_PROB: f32 = 0.1;

/// Counts since the drafter was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DraftModelStats {
    /// Passes of the draft model.
    pub passes: usize,
    /// Rows run by those passes (catch-up and drafting).
    pub rows: usize,
    /// Tokens proposed in first drafts.
    pub drafted: usize,
    /// Times the sequence could not roll back far enough and was
    /// re-prefilled from the start.
    pub resets: usize,
}

/// What the draft model predicts after a committed token: its pick and the
/// runner-up, with the drafter's confidence in each.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Pick {
    top: u32,
    top_p: f32,
    second: Option<(u32, f32)>,
}

impl Pick {
    /// The pick after `path` (the token at position `path.len()`) under
    /// the target's sampling `noise`. Greedy: the argmax (after any
    /// penalties) with its softmax probability; sampling: the token the
    /// target's own draw would choose from these logits, and the runner-up
    /// by the same scores ([`coupled_choice`]).
    fn of(logits: &[f32], noise: &SamplerConfig, path: &[u32]) -> Pick {
        if noise.is_greedy() {
            let top = sample(noise, logits, path, path.len());
            return Pick {
                top,
                top_p: prob_of(logits, top),
                second: runner_up(logits, top).map(|t| (t, prob_of(logits, t))),
            };
        }
        match coupled_choice(noise, logits, path, path.len()) {
            Some((first, second)) => Pick {
                top: first.token,
                top_p: first.confidence,
                second: second.map(|s| (s.token, s.confidence)),
            },
            None => Pick {
                top: argmax(logits),
                top_p: f32::NAN,
                second: None,
            },
        }
    }
}

/// A [`Drafter`] running a draft model on its own KV cache.
pub struct DraftModelDrafter {
    /// Shared by every sequence's drafter (the server has one per slot).
    model: Arc<Model>,
    kv: KvCache,
    seq: SeqId,
    /// Tokens committed to the draft cache, in order.
    committed: Vec<u32>,
    /// `picks[i]`: the prediction after `committed[..=i]`, where it was
    /// computed (the last row of a catch-up, every drafting step), under
    /// `noise`.
    picks: Vec<Option<Pick>>,
    /// The sampling the picks were made for (a request's own).
    noise: SamplerConfig,
    min_prob: f32,
    stats: DraftModelStats,
}

impl DraftModelDrafter {
    /// A drafter owning `model`, with a KV cache of one sequence of up to
    /// `max_len` tokens (allocated now) whose sliding-window layers can roll
    /// back [`ROLLBACK`] tokens.
    pub fn new(model: impl Into<Arc<Model>>, max_len: usize) -> Result<Self, EngineError> {
        let model = model.into();
        let mut kv = KvCache::new(Self::layout(&model, max_len));
        let seq = kv.add_sequence()?;
        Ok(DraftModelDrafter {
            model,
            kv,
            seq,
            committed: Vec::new(),
            picks: Vec::new(),
            noise: SamplerConfig::default(),
            min_prob: DEFAULT_MIN_PROB,
            stats: DraftModelStats::default(),
        })
    }

    /// The KV cache of one drafter: one sequence of `max_len` tokens whose
    /// sliding-window layers can roll back [`ROLLBACK`] tokens.
    pub fn layout(model: &Model, max_len: usize) -> KvLayout {
        let mut layout = model.kv_layout(model.default_kv_type(), max_len, 1);
        layout.rollback = ROLLBACK;
        layout
    }

    /// Sets the confidence under which drafting stops after the first token,
    /// and under which no runner-up is offered (default
    /// [`DEFAULT_MIN_PROB`]; 0 drafts `max_len` tokens whenever the context
    /// allows).
    pub fn with_min_prob(mut self, p: f32) -> Self {
        self.min_prob = p;
        self
    }

    /// Errors unless the draft model's vocabulary has `target_vocab` tokens:
    /// its token ids would mean other tokens than the target's.
    pub fn check_vocab(&self, target_vocab: usize) -> Result<(), EngineError> {
        let draft = self.vocab_size();
        if draft == target_vocab {
            return Ok(());
        }
        Err(EngineError::DraftVocabMismatch {
            draft,
            target: target_vocab,
        })
    }

    pub fn vocab_size(&self) -> usize {
        self.model.config.vocab_size
    }

    /// The draft model.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// Longest sequence the draft cache holds.
    pub fn max_len(&self) -> usize {
        self.kv.max_len()
    }

    pub fn stats(&self) -> DraftModelStats {
        self.stats
    }

    /// Brings the draft cache to a state whose committed tokens start with
    /// `path` (non-empty, fitting the context) and returns the prediction
    /// after `path`. `shared` tokens of `path` are known to be committed.
    ///
    /// Committed tokens beyond `path` are kept when the prediction after
    /// `path` is at hand (a later step may reuse them); otherwise the cache
    /// rolls back to the common prefix, at most `path.len() - 1` tokens, and
    /// runs the rest of `path`, so no token is ever committed twice.
    fn pick_after(&mut self, path: &[u32], shared: usize) -> Result<Pick, EngineError> {
        let n = path.len();
        let shared = shared.min(n).min(self.committed.len());
        let common = shared
            + self.committed[shared..]
                .iter()
                .zip(&path[shared..])
                .take_while(|(a, b)| a == b)
                .count();
        if common == n {
            if let Some(pick) = self.picks[n - 1] {
                return Ok(pick);
            }
        }
        let keep = common.min(n - 1);
        if keep < self.committed.len() {
            if self.kv.truncate(self.seq, keep).is_ok() {
                self.committed.truncate(keep);
                self.picks.truncate(keep);
            } else {
                self.reset()?;
            }
        }
        self.catch_up(path)
    }

    /// Empties the sequence: the next catch-up prefills from the start.
    fn reset(&mut self) -> Result<(), EngineError> {
        self.committed.clear();
        self.picks.clear();
        self.kv.remove_sequence(self.seq);
        self.seq = self.kv.add_sequence()?;
        self.stats.resets += 1;
        Ok(())
    }

    /// Runs `path[committed..]` (at least one token) as chains of at most
    /// [`CATCH_UP_CHUNK`] rows, committing them, with logits for the last
    /// row only; the prediction after it.
    fn catch_up(&mut self, path: &[u32]) -> Result<Pick, EngineError> {
        let missing = &path[self.committed.len()..];
        let n_chunks = missing.len().div_ceil(CATCH_UP_CHUNK);
        let mut pick = None;
        for (c, chunk) in missing.chunks(CATCH_UP_CHUNK).enumerate() {
            let is_last = c + 1 == n_chunks;
            let mut batch = Batch::new();
            let start = self.kv.seq_len(self.seq);
            let rows =
                batch.push_chain(self.seq, start, chunk, |i| is_last && i + 1 == chunk.len());
            let logits = self.model.forward(&batch, &mut self.kv)?;
            self.stats.passes += 1;
            self.stats.rows += chunk.len();
            if let Err(e) = self.kv.commit(self.seq, &rows.collect::<Vec<_>>()) {
                // A partial commit would leave `committed` out of step.
                self.reset()?;
                return Err(e.into());
            }
            self.committed.extend_from_slice(chunk);
            self.picks.resize(self.committed.len(), None);
            if is_last {
                pick = logits
                    .row(batch.len() - 1)
                    .map(|row| Pick::of(row, &self.noise, path));
            }
        }
        let Some(pick) = pick else {
            return Err(EngineError::Model(ModelError::InvalidBatch(
                "the draft model returned no logits for the last token".into(),
            )));
        };
        if let Some(last) = self.picks.last_mut() {
            *last = Some(pick);
        }
        Ok(pick)
    }

    fn confident(&self, p: f32) -> bool {
        p >= self.min_prob && p > 0.0 && p.is_finite()
    }
}

impl Drafter for DraftModelDrafter {
    fn name(&self) -> &str {
        "draft"
    }

    /// One draft of up to `max_len` (at most [`ROLLBACK`]) tokens, each the
    /// pick under the request's `sampler`, then, when confident enough, the
    /// runner-up first token alone.
    fn propose(
        &mut self,
        history: &[u32],
        max_len: usize,
        sampler: &SamplerConfig,
    ) -> Result<Vec<Draft>, EngineError> {
        let max_len = max_len.min(ROLLBACK);
        if *sampler != self.noise {
            // Picks made under other noise are other tokens; the cache
            // itself stays.
            self.noise = sampler.clone();
            self.picks.iter_mut().for_each(|p| *p = None);
        }
        if history.is_empty() || max_len == 0 || history.len() > self.kv.max_len() {
            return Ok(Vec::new());
        }
        let first = self.pick_after(history, 0)?;
        if !(first.top_p > 0.0 && first.top_p.is_finite()) {
            return Ok(Vec::new());
        }
        let mut draft = Draft {
            tokens: vec![first.top],
            probs: vec![first.top_p.min(MOST_SURE)],
            source: Source::Model,
        };
        // Each further token needs the one before it run, at the next
        // position of the draft context.
        let mut path = history.to_vec();
        while draft.tokens.len() < max_len && path.len() < self.kv.max_len() {
            path.push(draft.tokens[draft.tokens.len() - 1]);
            let next = self.pick_after(&path, path.len() - 1)?;
            if !self.confident(next.top_p) {
                break;
            }
            draft.tokens.push(next.top);
            draft.probs.push(next.top_p.min(MOST_SURE));
        }
        self.stats.drafted += draft.tokens.len();

        let mut drafts = vec![draft];
        if let Some((t, p)) = first.second {
            if self.confident(p) {
                drafts.push(Draft {
                    tokens: vec![t],
                    probs: vec![p.min(MOST_SURE)],
                    source: Source::Model,
                });
            }
        }
        Ok(drafts)
    }
}

/// The softmax probability of `token` under `logits`, computed in f64 over
/// the whole vocabulary (stably: shifted by the largest logit). NaN when the
/// logits hold no finite maximum.
fn prob_of(logits: &[f32], token: u32) -> f32 {
    let Some(&l) = logits.get(token as usize) else {
        return 0.0;
    };
    let max = logits
        .iter()
        .fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
    if !max.is_finite() || !l.is_finite() {
        return f32::NAN;
    }
    let sum: f64 = logits.iter().map(|&v| (v as f64 - max).exp()).sum();
    ((l as f64 - max).exp() / sum) as f32
}

/// The most likely token other than `top` (lowest id on a tie), if any.
fn runner_up(logits: &[f32], top: u32) -> Option<u32> {
    let top = top as usize;
    let mut best: Option<usize> = None;
    for (i, &v) in logits.iter().enumerate() {
        if i != top && best.is_none_or(|b| v > logits[b]) {
            best = Some(i);
        }
    }
    best.map(|b| b as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draft_model_prob_is_a_stable_softmax() {
        let logits = [1000.0f32, 1000.0, 0.0];
        let p = prob_of(&logits, 0);
        assert!((p - 0.5).abs() < 1e-6, "{p}");
        let p = prob_of(&[0.0f32; 4], 2);
        assert_eq!(p, 0.25);
        assert_eq!(prob_of(&[3.0f32], 0), 1.0);
        assert_eq!(prob_of(&[3.0f32], 5), 0.0);
        assert!(prob_of(&[f32::NAN, f32::NAN], 0).is_nan());
        assert!(prob_of(&[f32::NEG_INFINITY; 2], 0).is_nan());
        let p = prob_of(&[0.0f32, -200.0], 0);
        assert!(p > 0.0 && p <= 1.0);
    }

    #[test]
    fn draft_model_runner_up_takes_the_second_lowest_id_on_ties() {
        assert_eq!(runner_up(&[1.0, 3.0, 2.0, 2.0], 1), Some(2));
        assert_eq!(runner_up(&[3.0, 3.0, 1.0], 0), Some(1));
        assert_eq!(runner_up(&[5.0], 0), None);
        assert_eq!(runner_up(&[], 0), None);
    }
}
