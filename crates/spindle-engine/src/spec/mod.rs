//! Speculative decoding: drafters propose continuations, they are merged
//! into a token tree, the target model verifies the whole tree in one pass,
//! and the walk keeps exactly the tokens plain decoding would have emitted.

pub mod drafter;

pub use drafter::{Draft, Drafter};
pub mod draft_model;
pub use draft_model::DraftModelDrafter;
pub mod adaptive;
pub mod decode;
pub mod ngram;
pub mod tree;
pub mod verify;

pub use adaptive::{Adaptive, CostLine};
pub use decode::{generate_speculative, generate_speculative_on};
pub use ngram::NgramDrafter;
pub use tree::TokenTree;
pub mod combined;
pub use combined::Combined;
