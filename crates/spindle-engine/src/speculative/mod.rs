//! Speculative decoding: drafters propose continuations, they are merged
//! into a token tree, the target model verifies the whole tree in one pass,
//! and the walk keeps exactly the tokens plain decoding would have emitted.
//!
//! - [`drafter`]: what a drafter provides, and [`DraftSource`], which makes
//!   one per sequence (`--spec` for `run`, `chat` and `serve`);
//! - [`ngram_drafter`], [`suffix_drafter`], [`draft_model_drafter`],
//!   [`combined_drafter`]: the drafters; [`suffix_trie`] the counted
//!   suffix trie behind suffix drafts, and [`traffic_cache`] the tries of
//!   earlier requests' outputs, per tenant;
//! - [`token_tree`]: drafts merged into a trie and cut to a node budget;
//! - [`tree_budget`]: how many nodes are worth verifying next;
//! - [`draft_step`]: the one draft step (ask the drafter, build the tree,
//!   size it);
//! - [`verify`]: the one walk over a verified tree, and the lazy output head;
//! - [`generate`]: single-sequence speculative generation.

pub mod combined_drafter;
pub mod draft_model_drafter;
pub mod draft_step;
pub mod drafter;
pub mod generate;
pub mod ngram_drafter;
pub mod suffix_drafter;
pub mod suffix_trie;
pub mod token_tree;
pub mod traffic_cache;
pub mod tree_budget;
pub mod verify;

pub use combined_drafter::Combined;
pub use draft_model_drafter::DraftModelDrafter;
pub use draft_step::draft_tree;
pub use drafter::{Draft, DraftSource, Drafter, Source};
pub use generate::{generate_speculative, generate_speculative_on};
pub use ngram_drafter::NgramDrafter;
pub use suffix_drafter::SuffixDrafter;
pub use token_tree::TokenTree;
pub use traffic_cache::{TrafficCache, TrafficConfig, TrafficStats, DEFAULT_TRAFFIC_CACHE_BYTES};
pub use tree_budget::{CostLine, TreeBudget};
pub use verify::{walk, Walk};
