//! Serving many sequences at once: requests wait in a queue that is fair
//! between tenants, and the engine loop decides again after every pass which
//! sequences run (continuous batching): decode rows of every running
//! sequence and chunks of prompts share one `Batch` under a token budget; a
//! finished or cancelled sequence frees its KV before the next pass, and a
//! waiting request takes its place at once.
//!
//! - [`handle`]: configuration, starting the loop, submitting requests;
//! - `engine`: the loop and the state it owns;
//! - `admission`: the scheduling policy (admission, prompt chunks,
//!   preemption by recompute);
//! - `step`: one pass (build the batch, run it, walk, commit, emit);
//! - `sequence`: a running request and its phase;
//! - [`metrics`], [`fair_queue`], [`request`], `score_tree`.

mod admission;
mod engine;
pub mod fair_queue;
pub mod handle;
pub mod metrics;
pub mod request;
mod score_tree;
mod sequence;
mod step;

pub use fair_queue::FairQueue;
pub use handle::{spawn_engine, EngineConfig, EngineHandle, SubmitError};
pub use metrics::{Histogram, Metrics};
pub use request::{Event, Finished, Request, RequestParams, ScoreTree, TokenLogprobs, TreeScores};
