//! Model file formats: GGUF, safetensors and Hugging Face `config.json`.
//!
//! Parsing only. Every length and count read from a file is checked against
//! the file's size before anything is allocated from it.

pub mod dtype;
pub mod error;
pub mod file_kind;
pub mod gguf;
pub mod header_shape;
pub mod safetensors_dir;
pub mod storage;

pub use dtype::{type_info, unsupported_type_name, GgmlType, TypeInfo};
pub use error::FormatError;
pub use gguf::{GgufFile, GgufTensorInfo, MetaValue};
pub use header_shape::{
    ArchFamily, ExpertShape, HeaderArch, HeaderShape, HeaderSource, DEFAULT_CONTEXT_LENGTH,
    KV_BLOCK_TOKENS,
};
pub use safetensors_dir::{is_hf_dir, HfConfig, SafetensorsModel, SafetensorsTensor};
pub use storage::{Storage, TensorBytes};
