//! Architectures over kernels: a `Batch` of rows in, logits out; the tokenizer
//! and the chat template.

pub mod chat_template;
pub mod tokenizer;
