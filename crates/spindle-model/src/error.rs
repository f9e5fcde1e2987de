//! Errors of model loading and of a pass.

use spindle_formats::FormatError;
use spindle_kernels::KernelError;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error(transparent)]
    Tokenizer(#[from] crate::tokenizer::TokenizerError),
    #[error("unsupported architecture '{0}': Spindle runs llama, mistral, mixtral, qwen2, qwen3, qwen3moe, phi3, gemma2, gemma3 and gpt-oss models")]
    UnsupportedArchitecture(String),
    #[error("unsupported model feature: {0}")]
    Unsupported(String),
    #[error("model metadata is missing '{0}': the file was not written by a known converter")]
    MissingMetadata(String),
    #[error("model tensor '{name}' is missing: the file is incomplete or not a {arch} model")]
    MissingTensor { name: String, arch: String },
    #[error("tensor '{name}' has shape {got:?}, expected {want:?}: the file does not match its own metadata")]
    BadShape {
        name: String,
        got: Vec<usize>,
        want: Vec<usize>,
    },
    #[error("tensor '{name}' holds {value} at element {index}: the weights are corrupt; fetch the model again")]
    NonFinite {
        name: String,
        index: usize,
        value: f32,
    },
    #[error("tensor '{name}' has the scale {value} in block {block}: the weights are corrupt; fetch the model again")]
    NonFiniteScale {
        name: String,
        block: usize,
        value: f32,
    },
    #[error("tensor '{name}' holds {value} at element {index} (block {block}): the weights are corrupt; fetch the model again")]
    NonFiniteWeight {
        name: String,
        index: usize,
        block: usize,
        value: f32,
    },
    #[error("the pass produced NaN or infinite values (batch row {row}): the weights are likely corrupt; check them with --check-weights")]
    NonFiniteActivations { row: usize },
    #[error("{0}")]
    InvalidBatch(String),
    #[error("input {index} is {tokens} tokens, over the model's limit of {max}: shorten it, or ask for truncation")]
    InputTooLong {
        index: usize,
        tokens: usize,
        max: usize,
    },
    #[error("sequence {seq} would reach {len} tokens, past the context of {ctx}: shorten the prompt or raise --ctx")]
    ContextFull { seq: usize, len: usize, ctx: usize },
    #[error("all {max} sequence slots of the KV cache are in use: finish a sequence first, or make the cache with more")]
    NoFreeSequence { max: usize },
    #[error("all {blocks} KV blocks ({tokens} tokens) are in use: end or preempt a sequence first, or give the cache more memory (--kv-memory)")]
    OutOfBlocks { blocks: usize, tokens: usize },
    #[error("'{path}' is neither a GGUF file nor a Hugging Face model directory (config.json + *.safetensors)")]
    NotAModel { path: String },
    #[error("cannot open '{path}': {reason}")]
    Open { path: String, reason: String },
}
