//! Sequences, sampling, the generation loop and scoring.

pub mod bench;
pub mod error;
pub mod generate;
pub mod sampler;
pub mod score;

pub use error::EngineError;
pub use generate::{generate, FinishReason, GenerateOutput, GenerateRequest, GenerateStats};
pub use sampler::{sample, SamplerConfig};
