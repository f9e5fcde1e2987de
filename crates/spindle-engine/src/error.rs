//! Errors of the engine.

use spindle_model::ModelError;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("the prompt is empty: give at least one token")]
    EmptyPrompt,
    #[error(
        "scoring needs at least two tokens (each is scored given the ones before it); got {0}"
    )]
    TooFewToScore(usize),
    #[error(
        "the prompt has {tokens} tokens but the context holds {ctx}: shorten it or raise --ctx"
    )]
    PromptTooLong { tokens: usize, ctx: usize },
    #[error("the draft model has a vocabulary of {draft} tokens but the target model has {target}: a draft model must share the target's tokenizer (use a smaller model of the same family, or the same model at lower precision)")]
    DraftVocabMismatch { draft: usize, target: usize },
    #[error("the text has {tokens} tokens, fewer than one chunk of {ctx}: give a longer text or a smaller -c")]
    TextTooShort { tokens: usize, ctx: usize },
}
