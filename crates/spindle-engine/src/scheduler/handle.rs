//! The clients' side of the engine: its configuration, starting it on its
//! own thread, and the handle that submits requests (refusing at once the
//! ones that cannot run) and reads metrics.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;

use spindle_model::{KvCache, Model};

use super::engine::EngineLoop;
use super::metrics::Metrics;
use super::request::Request;
use crate::error::{ErrorKind, RequestError};
use crate::speculative::DraftSource;

/// How the loop schedules.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Rows per pass: decode rows first, prompt chunks in what is left.
    pub max_batch_tokens: usize,
    /// Requests allowed to wait; more are refused (the server answers 429).
    pub max_waiting: usize,
    /// Take turns between tenants (false: first come, first served).
    pub fair: bool,
    /// Admit new requests only when no sequence is running (static
    /// batching, for comparison in `bench/serve`).
    pub static_batching: bool,
    /// Speculative decoding: trees of at most this many nodes per
    /// sequence, sized each pass by the tree-budget policy (`None`: off).
    pub tree_budget: Option<usize>,
    /// Verify the whole budget every pass instead of sizing trees from
    /// timings (for tests: what is drafted then depends on nothing but
    /// the tokens).
    pub fixed_tree_budget: bool,
    /// Where each sequence slot's drafter comes from (one is made per slot
    /// when the engine starts).
    pub drafts: DraftSource,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_batch_tokens: 512,
            max_waiting: 1024,
            fair: true,
            static_batching: false,
            tree_budget: Some(16),
            fixed_tree_budget: false,
            drafts: DraftSource::ngram(),
        }
    }
}

/// Why a request was not queued.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SubmitError {
    #[error("{waiting} requests are already waiting (the limit): retry shortly")]
    QueueFull { waiting: usize },
    #[error("the engine has stopped")]
    Stopped,
    /// The request cannot run as it is (see [`Request::check`]).
    #[error(transparent)]
    Refused(RequestError),
}

impl SubmitError {
    /// The kind of refusal, as for errors of running requests.
    pub fn request_error(&self) -> RequestError {
        match self {
            SubmitError::QueueFull { .. } => {
                RequestError::new(ErrorKind::Capacity, self.to_string())
            }
            SubmitError::Stopped => RequestError::new(ErrorKind::Cancelled, self.to_string()),
            SubmitError::Refused(e) => e.clone(),
        }
    }
}

/// The clients' side of the engine: submit requests, read metrics.
#[derive(Clone)]
pub struct EngineHandle {
    tx: Sender<Request>,
    queued: Arc<AtomicUsize>,
    max_waiting: usize,
    pub metrics: Arc<Metrics>,
    /// Longest sequence (prompt and generated tokens).
    pub ctx: usize,
    /// Token ids are below this.
    pub vocab_size: usize,
}

impl EngineHandle {
    /// Queues `req` after checking that it can run; its events arrive on
    /// the channel it carries.
    pub fn submit(&self, req: Request) -> Result<(), SubmitError> {
        req.check(self.ctx, self.vocab_size)
            .map_err(SubmitError::Refused)?;
        let waiting = self.queued.fetch_add(1, Ordering::SeqCst);
        if waiting >= self.max_waiting {
            self.queued.fetch_sub(1, Ordering::SeqCst);
            return Err(SubmitError::QueueFull { waiting });
        }
        self.tx.send(req).map_err(|_| {
            self.queued.fetch_sub(1, Ordering::SeqCst);
            SubmitError::Stopped
        })
    }
}

/// Starts the engine loop on its own thread, with one drafter per sequence
/// slot when speculation is on. It runs until every handle is dropped.
pub fn spawn_engine(model: Model, kv: KvCache, config: EngineConfig) -> EngineHandle {
    let (tx, rx) = std::sync::mpsc::channel();
    let metrics = Arc::new(Metrics::default());
    let queued = Arc::new(AtomicUsize::new(0));
    let handle = EngineHandle {
        tx,
        queued: queued.clone(),
        max_waiting: config.max_waiting,
        metrics: metrics.clone(),
        ctx: kv.max_len(),
        vocab_size: model.config.vocab_size,
    };
    metrics.set_pool(&kv);
    metrics.set_memory(model.memory(), &kv);
    std::thread::Builder::new()
        .name("spindle-engine".into())
        .spawn(move || EngineLoop::new(model, kv, config, metrics, queued).run(rx))
        .expect("the engine thread starts");
    handle
}
