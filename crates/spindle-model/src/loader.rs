//! Opening a model from a path: a GGUF file or a Hugging Face directory.

use std::path::Path;

use spindle_formats::{GgufFile, SafetensorsModel};

use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::forward::Model;
use crate::tokenizer::Tokenizer;
use crate::weights::{TensorSource, Weights};

/// A model with its tokenizer, as found on disk.
pub struct LoadedModel {
    pub model: Model,
    /// `None` when the file carries no vocabulary (e.g. test models); commands
    /// that need text then say so.
    pub tokenizer: Option<Tokenizer>,
    pub tokenizer_error: Option<String>,
    pub name: String,
}

/// Loads the model at `path` with `n_threads` compute threads.
pub fn load(path: &Path, n_threads: usize) -> Result<LoadedModel, ModelError> {
    let name = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    if !path.exists() {
        return Err(ModelError::Open {
            path: path.display().to_string(),
            reason: "no such file or directory; give a .gguf file or a model directory with -m, or run `spindle pull`".into(),
        });
    }
    if path.is_dir() {
        if !spindle_formats::is_hf_dir(path) {
            return Err(ModelError::NotAModel {
                path: path.display().to_string(),
            });
        }
        let st = SafetensorsModel::open(path)?;
        let config = ModelConfig::from_hf(st.config())?;
        let weights = Weights::load(&TensorSource::Safetensors(&st), &config)?;
        let (tokenizer, tokenizer_error) = split(Tokenizer::from_hf_dir(path));
        return Ok(LoadedModel {
            model: Model::new(config, weights, n_threads),
            tokenizer,
            tokenizer_error,
            name,
        });
    }
    let mut gguf = GgufFile::open(path)?;
    if resident_weights(gguf.file_len()) {
        gguf.make_resident()?;
    }
    let config = ModelConfig::from_gguf(&gguf)?;
    let weights = Weights::load(&TensorSource::Gguf(&gguf), &config)?;
    let (tokenizer, tokenizer_error) = if gguf.get("tokenizer.ggml.tokens").is_some() {
        split(Tokenizer::from_gguf(&gguf))
    } else {
        (None, None)
    };
    if let Some(name) = gguf.get_str("general.name") {
        let name = name.to_string();
        return Ok(LoadedModel {
            model: Model::new(config, weights, n_threads),
            tokenizer,
            tokenizer_error,
            name,
        });
    }
    Ok(LoadedModel {
        model: Model::new(config, weights, n_threads),
        tokenizer,
        tokenizer_error,
        name,
    })
}

/// Whether weights are copied into huge-page memory at load (decoding runs
/// ~20% faster, docs/PERF.md) or read through the file's memory map: the map
/// when `SPINDLE_MMAP=1`, or when the file is over half the available memory
/// (the copy and the page cache would compete).
fn resident_weights(file_len: u64) -> bool {
    if std::env::var("SPINDLE_MMAP").is_ok_and(|v| v == "1") {
        return false;
    }
    mem_available().is_none_or(|avail| file_len < avail / 2)
}

/// `MemAvailable` from /proc/meminfo, in bytes.
fn mem_available() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

fn split<T, E: std::fmt::Display>(r: Result<T, E>) -> (Option<T>, Option<String>) {
    match r {
        Ok(t) => (Some(t), None),
        Err(e) => (None, Some(e.to_string())),
    }
}
