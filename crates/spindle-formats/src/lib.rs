//! Model file formats: GGUF, safetensors and Hugging Face `config.json`.
//!
//! Parsing only. Every length and count read from a file is checked against
//! the file's size before anything is allocated from it.

pub mod dtype;

pub use dtype::GgmlType;
