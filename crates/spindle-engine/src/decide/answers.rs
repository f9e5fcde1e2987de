//! A decision's answers from the engine's scores of its tree: each mode's
//! option scores, the content-free prior divided out, normalised.

use super::normalize::normalize;
use super::prior_cache::PriorCache;
use super::prompt::{DecisionPlan, PlannedQuestion};
use super::{Answer, DecideError, Mode};
use crate::scheduler::TreeScores;

impl DecisionPlan {
    /// The answers, in the order of the questions, from the engine's scores
    /// of [`DecisionPlan::tree`].
    pub fn answers(&self, scores: &TreeScores) -> Result<Vec<Answer>, DecideError> {
        self.answers_with(scores, None)
    }

    /// [`DecisionPlan::answers`], keeping the content-free answers this
    /// pass scored in `cache` for the next decision that asks the same.
    pub fn answers_with(
        &self,
        scores: &TreeScores,
        cache: Option<&PriorCache>,
    ) -> Result<Vec<Answer>, DecideError> {
        self.questions
            .iter()
            .map(|q| {
                if self.mode == Mode::Label {
                    return normalize(&q.id, q.kind, &q.labels, &label_scores(q, scores));
                }
                // Each part of the mode's score, normalised over the
                // options (`blend` has two; the others one).
                let parts_of = |options: &[(Vec<usize>, usize)]| -> Vec<Vec<f64>> {
                    let first = || -> Vec<f64> {
                        options.iter().map(|(s, _)| scores.scored[s[0]]).collect()
                    };
                    let total = |per_token: bool| -> Vec<f64> {
                        options
                            .iter()
                            .map(|(scored, end)| {
                                let sum = scored.iter().map(|&s| scores.scored[s]).sum::<f64>()
                                    + scores.ends[*end];
                                if per_token {
                                    sum / (scored.len() + 1) as f64
                                } else {
                                    sum
                                }
                            })
                            .collect()
                    };
                    let parts = match self.mode {
                        Mode::FirstToken => vec![first()],
                        Mode::Sum => vec![total(false)],
                        Mode::Mean => vec![total(true)],
                        Mode::Blend if distinct_first_tokens(options) => {
                            vec![total(false), first()]
                        }
                        Mode::Blend => vec![total(false)],
                        Mode::Label => unreachable!("label questions return above"),
                    };
                    parts.iter().map(|p| log_softmax_of(p)).collect()
                };
                let mut parts = parts_of(&q.options);
                // The content-free parts, kept flat (part after part) in
                // the cache.
                let prior: Option<Vec<f64>> = match (&q.prior_kept, q.prior_options.is_empty()) {
                    (Some(kept), _) => Some(kept.clone()),
                    (None, false) => {
                        let prior: Vec<f64> =
                            parts_of(&q.prior_options).into_iter().flatten().collect();
                        if let (Some(c), Some(k)) = (cache, &q.prior_key) {
                            if prior.iter().all(|p| p.is_finite()) {
                                c.insert(k.clone(), prior.clone());
                            }
                        }
                        Some(prior)
                    }
                    (None, true) => None,
                };
                if let Some(prior) = prior {
                    // The content-free state's own preferences divided out.
                    let n = q.options.len();
                    for (part, p) in parts.iter_mut().zip(prior.chunks(n)) {
                        part.iter_mut().zip(p).for_each(|(s, p)| *s -= p);
                    }
                }
                // A geometric mean of the parts (renormalised below).
                let k = parts.len() as f64;
                let option_scores: Vec<f64> = (0..q.options.len())
                    .map(|i| parts.iter().map(|p| p[i]).sum::<f64>() / k)
                    .collect();
                normalize(&q.id, q.kind, &q.labels, &option_scores)
            })
            .collect()
    }
}

/// A `label` question's option scores: per listing, the log-softmax of
/// the letters' log-probabilities (less, with `prior`, the content-free
/// listing's: the prior divided out); averaged over the listings.
fn label_scores(q: &PlannedQuestion, scores: &TreeScores) -> Vec<f64> {
    let log_softmax = |ends: &[usize]| -> Vec<f64> {
        let raw: Vec<f64> = ends.iter().map(|&e| scores.ends[e]).collect();
        log_softmax_of(&raw)
    };
    let n = q.labels.len();
    let mut total = vec![0.0f64; n];
    for (j, ends) in q.listings.iter().enumerate() {
        let mut lp = log_softmax(ends);
        if let Some(prior) = q.priors.get(j) {
            let cf = log_softmax(prior);
            let calibrated: Vec<f64> = lp.iter().zip(&cf).map(|(a, b)| a - b).collect();
            lp = log_softmax_of(&calibrated);
        }
        for (t, l) in total.iter_mut().zip(&lp) {
            *t += l;
        }
    }
    let k = q.listings.len().max(1) as f64;
    total.iter().map(|t| t / k).collect()
}

/// Whether every option starts with its own token (the tree shares a node
/// between options that start alike).
fn distinct_first_tokens(options: &[(Vec<usize>, usize)]) -> bool {
    let mut firsts: Vec<usize> = options.iter().map(|(s, _)| s[0]).collect();
    firsts.sort_unstable();
    firsts.windows(2).all(|w| w[0] != w[1])
}

fn log_softmax_of(x: &[f64]) -> Vec<f64> {
    let max = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let lse = max + x.iter().map(|r| (r - max).exp()).sum::<f64>().ln();
    x.iter().map(|r| r - lse).collect()
}
