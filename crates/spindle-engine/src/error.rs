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

/// What kind of refusal or failure ended a request: the server maps each
/// kind to an HTTP status (invalid input to 4xx, never 5xx).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request itself is wrong (empty prompt, a token outside the
    /// vocabulary, a malformed score tree): the client must change it.
    InvalidRequest,
    /// The request does not fit the context: fewer tokens will.
    TooLong,
    /// The engine has no room for it now (the queue is full, the KV pool
    /// ran out): the same request may succeed later.
    Capacity,
    /// The request was cancelled (the engine is stopping).
    Cancelled,
    /// A fault of the engine, not of the request.
    Internal,
}

impl ErrorKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidRequest => "invalid_request",
            ErrorKind::TooLong => "too_long",
            ErrorKind::Capacity => "capacity",
            ErrorKind::Cancelled => "cancelled",
            ErrorKind::Internal => "internal",
        }
    }
}

/// Why the engine refused or ended a request, with the kind of reason.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct RequestError {
    pub kind: ErrorKind,
    pub message: String,
    /// The request field at fault, when one is (OpenAI's `param`).
    pub param: Option<&'static str>,
}

impl RequestError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> RequestError {
        RequestError {
            kind,
            message: message.into(),
            param: None,
        }
    }

    pub fn invalid(param: &'static str, message: impl Into<String>) -> RequestError {
        RequestError {
            param: Some(param),
            ..RequestError::new(ErrorKind::InvalidRequest, message)
        }
    }

    pub fn internal(message: impl Into<String>) -> RequestError {
        RequestError::new(ErrorKind::Internal, message)
    }
}
