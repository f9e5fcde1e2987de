//! Where models live: `$SPINDLE_HOME` (default `~/.cache/spindle`).

use std::path::PathBuf;

/// The default model's file name.
pub const DEFAULT_MODEL_FILE: &str = "gemma-3-270m-q4_k_m.gguf";
/// The default embedding model's directory (`spindle pull all-minilm-l6-v2`).
pub const DEFAULT_EMBEDDING_DIR: &str = "all-MiniLM-L6-v2";

pub fn spindle_home() -> PathBuf {
    if let Some(h) = std::env::var_os("SPINDLE_HOME").filter(|h| !h.is_empty()) {
        return PathBuf::from(h);
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from);
    home.join(".cache").join("spindle")
}

pub fn models_dir() -> PathBuf {
    spindle_home().join("models")
}

pub fn default_model_path() -> PathBuf {
    models_dir().join(DEFAULT_MODEL_FILE)
}
