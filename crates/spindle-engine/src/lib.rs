//! Sequences, sampling, the generation loop and scoring.

pub mod bench;
pub mod constraint;
pub mod decide;
pub mod embed;
pub mod error;
pub mod generate;
pub mod sampler;
pub mod scheduler;
pub mod score;
pub mod speculative;

pub use error::{EngineError, ErrorKind, RequestError};
pub use generate::{
    generate, generate_on, FinishReason, GenerateOutput, GenerateRequest, GenerateStats,
};
pub use sampler::{sample, SamplerConfig};
