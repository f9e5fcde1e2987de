//! Architectures over kernels: a `Batch` of rows in, logits out; the tokenizer
//! and the chat template.

pub mod arch;
pub mod batch;
pub mod chat_template;
pub mod config;
pub mod encoder;
pub mod error;
pub mod forward;
pub mod heap;
pub mod kv_cache;
pub mod loader;
mod parallel;
pub mod profile;
pub mod tokenizer;
pub mod weights;

pub use arch::Family;
pub use batch::{Batch, Row, SeqId};
pub use config::ModelConfig;
pub use error::ModelError;
pub use forward::{
    spare_logits_bytes, Hidden, Logits, Model, ModelMemory, ScreenCounts, SPARE_LOGITS_MAX_BYTES,
};
pub use kv_cache::{BlockUsage, KvCache, KvLayout, KvType, BLOCK};
pub use loader::{check_weights, load, load_tokenizer, LoadedModel, WeightsCheck};
