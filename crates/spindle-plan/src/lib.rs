//! Memory and speed ceiling of a model, from its file headers only.
//!
//! A model that loads can still run out of memory when requests arrive:
//! weights are one of four allocations (weights, KV cache, activations and
//! workspace, runtime overhead). The headers of the model files and its
//! config are enough to predict all four, and the speed ceiling: decoding
//! reads every weight once per step and, past some context length, more KV
//! than weights. Nothing here reads tensor data, so a header-only copy of a
//! 70B model plans as well as the model itself.
//!
//! ```no_run
//! # fn main() -> Result<(), spindle_plan::PlanError> {
//! use spindle_plan::{plan, Device, EngineProfile, KvType, ModelShape, PlanRequest};
//! let shape = ModelShape::from_path(std::path::Path::new("model.gguf"))?;
//! let request = PlanRequest::new(4096, 1, KvType::F16, Device::parse("h100")?);
//! let plan = plan(&shape, &request, &EngineProfile::cpu());
//! println!("{}", plan.render_table());
//! # Ok(())
//! # }
//! ```

mod device;
mod error;
mod memory;
mod plan;
mod profile;
mod report;
mod roofline;
mod shape;
mod source;

pub use device::Device;
pub use error::PlanError;
pub use memory::{activation_terms, overhead_terms, Phase, Term, ENCODER_PASS_TOKENS};
pub use plan::{plan, Crossover, KvType, PerBatch, Plan, PlanRequest, DEFAULT_PREFILL_CHUNK};
pub use profile::{
    EngineProfile, CPU_RUNTIME_BYTES, CPU_TOKENIZER_BUILD_BYTES_PER_ENTRY,
    CPU_TOKENIZER_BYTES_PER_ENTRY,
};
pub use report::human_bytes;
pub use roofline::{attention_flops, decode_tokens_per_s, kv_crossover_ctx, prefill_tokens_per_s};
pub use shape::{Family, ModelShape};
pub use source::{WeightFormat, WeightStats};
