//! Compute kernels: quantized blocks, SIMD dispatch, the thread pool, matmul,
//! attention, norms, rope and activations. Knows nothing of models.

pub mod activation;
pub mod amx;
pub mod attention;
pub mod cpu;
pub mod encoder_attention;
pub mod error;
pub mod float_panels;
pub mod head_screen;
pub mod int8_peak;
pub mod matmul;
pub mod membw;
pub mod norm;
mod out_ptr;
pub mod quant;
pub mod rope;
pub mod simd;
pub mod softmax;
pub mod threadpool;

pub use error::KernelError;
pub use matmul::{matmul, WeightView};
pub use quant::dequantize;
pub use quant::finite::{first_bad_scale, first_non_finite};
pub use quant::WeightLayout;
pub use spindle_formats::GgmlType;
pub use threadpool::ThreadPool;
