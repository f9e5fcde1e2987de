//! What every drafter provides: candidate continuations of the text so far,
//! each token with the drafter's estimate that the target model will accept
//! it.

use crate::error::EngineError;

/// One candidate continuation.
#[derive(Debug, Clone, PartialEq)]
pub struct Draft {
    pub tokens: Vec<u32>,
    /// `probs[i]`: the drafter's estimate that `tokens[i]` is accepted once
    /// `tokens[..i]` were (in 0..=1). Trees are cut by the product along a
    /// path: the probability that the whole path is accepted.
    pub probs: Vec<f32>,
}

impl Draft {
    /// A draft whose every token has the same acceptance estimate.
    pub fn uniform(tokens: Vec<u32>, p: f32) -> Draft {
        let probs = vec![p; tokens.len()];
        Draft { tokens, probs }
    }
}

/// Proposes continuations of a sequence; the verifier keeps what the target
/// model itself would have produced, so a drafter can only cost speed, never
/// change the output.
pub trait Drafter {
    /// A short name for statistics ("ngram", "draft").
    fn name(&self) -> &str;

    /// Candidate continuations of `history` (prompt and every emitted token,
    /// the last of which the target has not run yet), each at most
    /// `max_len` tokens. Empty when there is nothing worth trying.
    fn propose(&mut self, history: &[u32], max_len: usize) -> Result<Vec<Draft>, EngineError>;
}
