//! What every drafter provides: candidate continuations of the text so far,
//! each token with the drafter's estimate that the target model will accept
//! it.

use std::sync::Arc;

use spindle_model::Model;

use super::combined_drafter::Combined;
use super::draft_model_drafter::DraftModelDrafter;
use super::ngram_drafter::NgramDrafter;
use crate::error::EngineError;

/// One candidate continuation.
#[derive(Debug, Clone, PartialEq)]
pub struct Draft {
    pub tokens: Vec<u32>,
    /// `probs[i]`: the drafter's estimate that `tokens[i]` is accepted once
    /// `tokens[..i]` were (in 0..=1; exactly [`super::token_tree::CERTAIN`]
    /// only where a grammar forces the token). Trees are cut by the product
    /// along a path: the probability that the whole path is accepted.
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
pub trait Drafter: Send {
    /// A short name for statistics ("ngram", "draft").
    fn name(&self) -> &str;

    /// Candidate continuations of `history` (prompt and every emitted token,
    /// the last of which the target has not run yet), each at most
    /// `max_len` tokens. Empty when there is nothing worth trying.
    fn propose(&mut self, history: &[u32], max_len: usize) -> Result<Vec<Draft>, EngineError>;
}

/// Where each sequence's drafter comes from: what `--spec` names, for
/// `run`, `chat` and `serve` alike. The server makes one drafter per
/// sequence slot when it starts, so a draft model's KV caches are
/// allocated up front and counted in its plan ([`DraftSource::kv_bytes`]).
#[derive(Clone, Default)]
pub enum DraftSource {
    /// Prompt lookup over the sequence's own text.
    #[default]
    Ngram,
    /// A model with the target's vocabulary (a smaller sibling, or the
    /// target with layers skipped), its weights shared by every sequence
    /// and a KV cache of its own per sequence, with n-gram drafts merged in.
    Model(Arc<Model>),
}

impl std::fmt::Debug for DraftSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DraftSource::Ngram => f.write_str("Ngram"),
            DraftSource::Model(m) => write!(f, "Model({} layers)", m.config.n_layers),
        }
    }
}

impl DraftSource {
    /// A drafter for one sequence of at most `max_len` tokens.
    pub fn make(&self, max_len: usize) -> Result<Box<dyn Drafter + Send>, EngineError> {
        Ok(match self {
            DraftSource::Ngram => Box::new(NgramDrafter::default()),
            DraftSource::Model(model) => {
                let d = DraftModelDrafter::new(model.clone(), max_len)?;
                Box::new(Combined::new(vec![
                    Box::new(d),
                    Box::new(NgramDrafter::default()),
                ]))
            }
        })
    }

    /// Bytes of KV cache each drafter of `max_len` tokens allocates (0 for
    /// n-gram drafts).
    pub fn kv_bytes(&self, max_len: usize) -> usize {
        match self {
            DraftSource::Ngram => 0,
            DraftSource::Model(model) => DraftModelDrafter::layout(model, max_len).bytes(),
        }
    }

    /// Errors unless the drafts' token ids mean the target's tokens.
    pub fn check_vocab(&self, target_vocab: usize) -> Result<(), EngineError> {
        match self {
            DraftSource::Ngram => Ok(()),
            DraftSource::Model(model) => {
                let draft = model.config.vocab_size;
                if draft == target_vocab {
                    Ok(())
                } else {
                    Err(EngineError::DraftVocabMismatch {
                        draft,
                        target: target_vocab,
                    })
                }
            }
        }
    }
}
