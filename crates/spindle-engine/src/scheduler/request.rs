//! What a client asks the engine for, and what it hears back.

use tokio::sync::mpsc::UnboundedSender;

use crate::generate::FinishReason;
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
}

/// One generation request. Dropping the receiving end of `events` cancels
/// it: the engine frees its sequence before the next pass.
#[derive(Debug)]
pub struct Request {
    pub prompt: Vec<u32>,
    pub params: RequestParams,
    /// Who asked (an API key or the `user` field): the queue takes turns
    /// between tenants.
    pub tenant: String,
    pub events: UnboundedSender<Event>,
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
    Finished(Finished),
    Error(String),
}
