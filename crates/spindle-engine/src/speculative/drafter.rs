//! What every drafter provides: candidate continuations of the text so far,
//! each token with the drafter's estimate that the target model will accept
//! it.

use std::sync::{Arc, Mutex};

use spindle_model::Model;

use super::combined_drafter::Combined;
use super::draft_model_drafter::DraftModelDrafter;
use super::ngram_drafter::NgramDrafter;
use super::suffix_drafter::SuffixDrafter;
use super::traffic_cache::TrafficCache;
use crate::error::EngineError;
use crate::sampler::SamplerConfig;

/// Where a draft came from: the tree-budget policy learns how often each
/// source's tokens are accepted, at each depth, and spends its nodes where
/// they pay most.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Source {
    /// Prompt lookup over the request's own text.
    #[default]
    Ngram,
    /// The suffix trie of the request's own text (prompt and output).
    Request,
    /// The suffix trie of earlier requests' outputs (the tenant's traffic).
    Traffic,
    /// Tokens a grammar forces, and its guesses where a value may end.
    Grammar,
    /// A draft model.
    Model,
}

impl Source {
    pub const ALL: [Source; 5] = [
        Source::Ngram,
        Source::Request,
        Source::Traffic,
        Source::Grammar,
        Source::Model,
    ];
    pub const COUNT: usize = Self::ALL.len();

    pub fn index(self) -> usize {
        self as usize
    }

    /// The bit of this source in a tree node's [`crate::speculative::token_tree::Node::sources`].
    pub fn bit(self) -> u8 {
        1 << self.index()
    }

    /// Its name in metrics and statistics.
    pub fn name(self) -> &'static str {
        match self {
            Source::Ngram => "ngram",
            Source::Request => "suffix_request",
            Source::Traffic => "suffix_traffic",
            Source::Grammar => "grammar",
            Source::Model => "draft_model",
        }
    }
}

/// One candidate continuation.
#[derive(Debug, Clone, PartialEq)]
pub struct Draft {
    pub tokens: Vec<u32>,
    /// `probs[i]`: the drafter's estimate that `tokens[i]` is accepted once
    /// `tokens[..i]` were (in 0..=1; exactly [`super::token_tree::CERTAIN`]
    /// only where a grammar forces the token). Trees are cut by the product
    /// along a path: the probability that the whole path is accepted.
    pub probs: Vec<f32>,
    pub source: Source,
}

impl Draft {
    /// A draft whose every token has the same acceptance estimate.
    pub fn uniform(tokens: Vec<u32>, p: f32) -> Draft {
        let probs = vec![p; tokens.len()];
        Draft {
            tokens,
            probs,
            source: Source::default(),
        }
    }

    /// The same draft, from `source`.
    pub fn from(self, source: Source) -> Draft {
        Draft { source, ..self }
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
    ///
    /// `sampler` is the request's own sampling: the token after `history`
    /// is drawn at position `history.len()` (the history starts at 0), the
    /// `i`-th drafted one at `history.len() + i`. A drafter with a
    /// distribution ranks its tokens under the target's noise at those
    /// positions ([`crate::sampler::coupled_choice`]); count-based drafters
    /// may ignore it, as the tree couples their shares
    /// ([`super::TokenTree::couple`]).
    fn propose(
        &mut self,
        history: &[u32],
        max_len: usize,
        sampler: &SamplerConfig,
    ) -> Result<Vec<Draft>, EngineError>;

    /// A new request starts in this drafter's sequence slot, from
    /// `tenant` (an API key or `user`; drafts from earlier traffic come
    /// from that tenant's only, unless the cache is shared).
    fn begin(&mut self, _tenant: &str) {}

    /// The request ended with `history` (`prompt_len` prompt tokens, then
    /// its output): what it produced may draft later requests.
    fn end(&mut self, _history: &[u32], _prompt_len: usize) {}
}

/// Where each sequence's drafts come from: what `--spec` names, for
/// `run`, `chat` and `serve` alike. The server makes one drafter per
/// sequence slot when it starts, so a draft model's KV caches are
/// allocated up front and counted in its plan ([`DraftSource::kv_bytes`]).
/// Every source a drafter has goes into one tree.
#[derive(Clone, Default)]
pub struct DraftSource {
    /// Prompt lookup over the sequence's own text.
    pub ngram: bool,
    /// A suffix trie over the sequence's own text.
    pub suffix: bool,
    /// Suffix tries over earlier requests' outputs, shared by every
    /// sequence slot.
    pub traffic: Option<Arc<Mutex<TrafficCache>>>,
    /// A model with the target's vocabulary (a smaller sibling, or the
    /// target with layers skipped), its weights shared by every sequence
    /// and a KV cache of its own per sequence.
    pub model: Option<Arc<Model>>,
}

impl std::fmt::Debug for DraftSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DraftSource")
            .field("ngram", &self.ngram)
            .field("suffix", &self.suffix)
            .field("traffic", &self.traffic.is_some())
            .field(
                "model_layers",
                &self.model.as_ref().map(|m| m.config.n_layers),
            )
            .finish()
    }
}

impl DraftSource {
    /// Prompt lookup only.
    pub fn ngram() -> DraftSource {
        DraftSource {
            ngram: true,
            ..Default::default()
        }
    }

    /// What `--spec auto` drafts with: n-gram lookup and the suffix trie
    /// of the request, and earlier traffic when there is a cache.
    pub fn auto(traffic: Option<Arc<Mutex<TrafficCache>>>) -> DraftSource {
        DraftSource {
            ngram: true,
            suffix: true,
            traffic,
            model: None,
        }
    }

    /// A draft model with n-gram drafts merged in.
    pub fn model(model: Arc<Model>) -> DraftSource {
        DraftSource {
            ngram: true,
            model: Some(model),
            ..Default::default()
        }
    }

    /// A drafter for one sequence of at most `max_len` tokens.
    pub fn make(&self, max_len: usize) -> Result<Box<dyn Drafter + Send>, EngineError> {
        let mut all: Vec<Box<dyn Drafter>> = Vec::new();
        if let Some(model) = &self.model {
            all.push(Box::new(DraftModelDrafter::new(model.clone(), max_len)?));
        }
        if self.suffix || self.traffic.is_some() {
            all.push(Box::new(SuffixDrafter::new(
                self.suffix,
                self.traffic.clone(),
            )));
        }
        if self.ngram {
            all.push(Box::new(NgramDrafter::default()));
        }
        Ok(match all.len() {
            1 => all.pop().expect("one drafter"),
            _ => Box::new(Combined::new(all)),
        })
    }

    /// Bytes of KV cache each drafter of `max_len` tokens allocates (0
    /// without a draft model).
    pub fn kv_bytes(&self, max_len: usize) -> usize {
        match &self.model {
            None => 0,
            Some(model) => DraftModelDrafter::layout(model, max_len).bytes(),
        }
    }

    /// Errors unless the drafts' token ids mean the target's tokens.
    pub fn check_vocab(&self, target_vocab: usize) -> Result<(), EngineError> {
        match &self.model {
            None => Ok(()),
            Some(model) => {
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
