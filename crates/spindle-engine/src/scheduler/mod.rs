//! Serving many sequences at once: requests wait in a queue that is fair
//! between tenants, and the engine loop decides again after every pass which
//! sequences run (continuous batching): decode rows of every running
//! sequence and chunks of prompts share one `Batch` under a token budget; a
//! finished or cancelled sequence frees its KV before the next pass, and a
//! waiting request takes its place at once.

mod engine_loop;
mod metrics;
mod queue;
mod request;
mod score_tree;

pub use engine_loop::{spawn_engine, EngineConfig, EngineHandle, SubmitError};
pub use metrics::{Histogram, Metrics};
pub use queue::FairQueue;
pub use request::{Event, Finished, Request, RequestParams, ScoreTree, TokenLogprobs, TreeScores};
