//! The one error type of the planner. Each message says what is wrong and
//! what to do next.

use std::path::PathBuf;

use spindle_formats::FormatError;

/// Why a model could not be planned.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// A GGUF header or `config.json` could not be read or parsed.
    #[error(transparent)]
    Format(#[from] FormatError),

    /// A file or directory could not be read.
    #[error("cannot read {}: {source}; check that the path exists and is readable", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A directory without `config.json`.
    #[error(
        "{} has no config.json: pass a .gguf file or a Hugging Face model directory \
         (config.json with model.safetensors or model.safetensors.index.json and its shards)",
        dir.display()
    )]
    MissingConfig { dir: PathBuf },

    /// A Hugging Face directory without safetensors weights.
    #[error(
        "{} has neither model.safetensors nor model.safetensors.index.json: download the \
         weights (their headers are enough to plan: a header-only copy of each file works)",
        dir.display()
    )]
    NoWeights { dir: PathBuf },

    /// A safetensors file whose header is cut short or malformed.
    #[error("bad safetensors header in {}: {reason}", path.display())]
    Safetensors { path: PathBuf, reason: String },

    /// A hyper-parameter the plan needs is missing or unusable.
    #[error("{what} in {source_name}: {reason}")]
    Config {
        what: String,
        source_name: String,
        reason: String,
    },

    /// A `--device` string that names no known device.
    #[error("{0}")]
    Device(String),
}

impl PlanError {
    pub(crate) fn safetensors(path: &std::path::Path, reason: impl Into<String>) -> PlanError {
        PlanError::Safetensors {
            path: path.to_path_buf(),
            reason: reason.into(),
        }
    }

    pub(crate) fn io(path: &std::path::Path, source: std::io::Error) -> PlanError {
        PlanError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}
