//! What a client asks the engine for, and what it hears back.

use tokio::sync::mpsc::UnboundedSender;

use crate::constraint::Constraint;
use crate::error::{ErrorKind, RequestError};
use crate::generate::{FinishReason, TokenRules};
use crate::sampler::SamplerConfig;

/// How to continue one prompt.
#[derive(Debug, Clone)]
pub struct RequestParams {
    pub max_tokens: usize,
    pub sampler: SamplerConfig,
    /// Tokens that end generation (not emitted): the model's end-of-turn
    /// tokens unless the client asked to ignore them.
    pub stop_ids: Vec<u32>,
    /// Added to the logits before sampling (OpenAI's `logit_bias`).
    pub logit_bias: Vec<(u32, f32)>,
    /// Also report each token's log-probability and this many alternatives
    /// (`None`: no log-probabilities).
    pub logprobs: Option<usize>,
    /// A grammar the output must match, compiled (each request gets its
    /// own copy: `Clone` starts an independent matcher state).
    pub constraint: Option<Constraint>,
    /// Whether the request's passes may verify drafts (when the engine
    /// speculates at all); false runs it plainly, for the same tokens.
    pub speculate: bool,
}

impl RequestParams {
    /// Plain decoding's rules for these tokens, in a context of `max_len`.
    pub fn rules(&self, max_len: usize) -> TokenRules<'_> {
        TokenRules {
            sampler: &self.sampler,
            stop_ids: &self.stop_ids,
            logit_bias: &self.logit_bias,
            max_tokens: self.max_tokens,
            max_len,
            needs_logits: self.logprobs.is_some(),
        }
    }
}

/// A token tree to score after the prompt, in the prompt's last pass,
/// instead of generating: the decision endpoint's options.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ScoreTree {
    /// Each node's token and parent node (`None`: it follows the prompt's
    /// last token). Parents come before their children.
    pub nodes: Vec<(u32, Option<usize>)>,
    /// Nodes whose own token's log-probability is wanted.
    pub scored: Vec<usize>,
    /// `(node, token)`: the log-probability of `token` right after `node`
    /// (an end marker that closes an option).
    pub ends: Vec<(usize, u32)>,
    /// `(root, k)`: root node `root` follows only the prompt's first `k`
    /// tokens instead of all of it (a branch that does not see the rest,
    /// e.g. a content-free state beside the real one).
    pub prefix_roots: Vec<(usize, usize)>,
}

impl ScoreTree {
    /// The tree's depth (longest chain of nodes), or why the tree is
    /// malformed.
    pub fn depth(&self) -> Result<usize, String> {
        let mut depth = vec![0usize; self.nodes.len()];
        for (i, &(_, parent)) in self.nodes.iter().enumerate() {
            depth[i] = match parent {
                None => 1,
                Some(p) if p < i => depth[p] + 1,
                Some(p) => return Err(format!("node {i}'s parent {p} does not come before it")),
            };
        }
        let n = self.nodes.len();
        if let Some(bad) = self
            .scored
            .iter()
            .chain(self.ends.iter().map(|(n, _)| n))
            .find(|&&i| i >= n)
        {
            return Err(format!("node {bad} is not in the tree of {n} nodes"));
        }
        Ok(depth.into_iter().max().unwrap_or(0))
    }
}

/// What scoring a tree gives, in the order of [`ScoreTree::scored`] and
/// [`ScoreTree::ends`]: natural-log probabilities under the model.
#[derive(Debug, Clone, PartialEq)]
pub struct TreeScores {
    pub scored: Vec<f64>,
    pub ends: Vec<f64>,
}

/// One generation request. Dropping the receiving end of `events` cancels
/// it: the engine frees its sequence before the next pass.
#[derive(Debug)]
pub struct Request {
    pub prompt: Vec<u32>,
    pub params: RequestParams,
    /// Score this tree after the prompt instead of generating (the prompt's
    /// KV stays in the prefix cache for the next request).
    pub score: Option<ScoreTree>,
    /// Who asked (an API key or the `user` field): the queue takes turns
    /// between tenants.
    pub tenant: String,
    pub events: UnboundedSender<Event>,
}

impl Request {
    /// Whether the request can run in a context of `ctx` tokens over a
    /// vocabulary of `vocab` (the engine refuses it at submission
    /// otherwise, before it takes a place in the queue).
    pub fn check(&self, ctx: usize, vocab: usize) -> Result<(), RequestError> {
        let n = self.prompt.len();
        if n == 0 {
            return Err(RequestError::invalid(
                "prompt",
                "the prompt is empty: give at least one token",
            ));
        }
        if let Some(bad) = first_outside(self.prompt.iter().copied(), vocab) {
            return Err(RequestError::invalid(
                "prompt",
                format!("token id {bad} is outside the vocabulary of {vocab}"),
            ));
        }
        if let Some(bad) = first_outside(self.params.logit_bias.iter().map(|b| b.0), vocab) {
            return Err(RequestError::invalid(
                "logit_bias",
                format!("logit_bias keys must be token ids below {vocab}, got {bad}"),
            ));
        }
        let too_long = |message: String| RequestError {
            param: Some("max_tokens"),
            ..RequestError::new(ErrorKind::TooLong, message)
        };
        if n >= ctx {
            return Err(too_long(format!(
                "the prompt has {n} tokens but the context holds {ctx}: shorten it"
            )));
        }
        match &self.score {
            Some(tree) => {
                let depth = tree.depth().map_err(|e| {
                    RequestError::invalid("questions", format!("the score tree is malformed: {e}"))
                })?;
                if let Some(&(node, k)) = tree
                    .prefix_roots
                    .iter()
                    .find(|&&(node, k)| tree.nodes.get(node).is_none_or(|x| x.1.is_some()) || k > n)
                {
                    return Err(RequestError::invalid(
                        "questions",
                        format!("the score tree's node {node} cannot follow the prompt's first {k} tokens: it must be a root and k at most {n}"),
                    ));
                }
                if let Some(bad) = first_outside(tree.nodes.iter().map(|n| n.0), vocab) {
                    return Err(RequestError::invalid(
                        "questions",
                        format!("token id {bad} is outside the vocabulary of {vocab}"),
                    ));
                }
                if n + depth > ctx {
                    return Err(too_long(format!(
                        "the prompt ({n} tokens) and the score tree ({depth} deep) exceed the context of {ctx}"
                    )));
                }
            }
            None => {
                let max = self.params.max_tokens;
                if n + max > ctx {
                    return Err(too_long(format!(
                        "This model's maximum context length is {ctx} tokens. However, you requested {} tokens ({n} in the prompt, {max} in the completion). Please reduce the prompt or max_tokens.",
                        n + max
                    )));
                }
            }
        }
        Ok(())
    }
}

/// The first id of `ids` that is not below `vocab`.
fn first_outside(mut ids: impl Iterator<Item = u32>, vocab: usize) -> Option<u32> {
    ids.find(|&t| t as usize >= vocab)
}

/// Log-probabilities of an emitted token under the model (before
/// temperature, penalties and filters, as OpenAI and vLLM report them).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    pub logprob: f32,
    /// The most likely tokens at that position, most likely first.
    pub top: Vec<(u32, f32)>,
}

/// How a request ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Finished {
    pub reason: FinishReason,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
}

/// What the engine tells a request's client, in order: tokens, then one
/// `Finished` or `Error`.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Token {
        id: u32,
        logprobs: Option<TokenLogprobs>,
    },
    /// A pass chose the request's tokens (sent after them), verifying
    /// `drafted` tokens for it (0 in a plain pass) and keeping `accepted`
    /// of them: one per pass that emitted tokens.
    Speculated {
        drafted: usize,
        accepted: usize,
    },
    /// The scores of a request's [`ScoreTree`], just before `Finished`.
    Scores(TreeScores),
    Finished(Finished),
    /// The request ended without finishing, and why.
    Error(RequestError),
}
