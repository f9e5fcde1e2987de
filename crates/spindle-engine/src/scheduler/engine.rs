//! The engine loop: one thread owns the model and the KV cache and, after
//! every pass, takes in new requests, retires finished and cancelled ones,
//! admits waiting requests while sequence slots and KV blocks allow
//! ([`super::admission`]), and runs the next pass over every running
//! sequence ([`super::step`]).
//!
//! Every row's logits are bit-identical to those of the same sequence run
//! alone (batch-invariant kernels), and the sampler is keyed by (seed,
//! position), so a request gets the same tokens whatever else is running.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::Instant;

use spindle_model::{KvCache, Model};

use super::fair_queue::FairQueue;
use super::handle::EngineConfig;
use super::metrics::Metrics;
use super::request::Request;
use super::sequence::Sequence;
use crate::speculative::{CostLine, Drafter};

/// A request waiting for a sequence slot.
pub(super) struct Waiting {
    pub req: Request,
    pub arrived: Instant,
}

pub(super) struct EngineLoop {
    pub model: Model,
    pub kv: KvCache,
    pub config: EngineConfig,
    pub metrics: Arc<Metrics>,
    /// Requests submitted and not admitted yet (shared with the handles,
    /// which refuse new ones past `max_waiting`).
    pub queued: Arc<AtomicUsize>,
    pub waiting: FairQueue<Waiting>,
    pub running: Vec<Sequence>,
    /// Requests preempted for KV blocks, to be recomputed before any new
    /// request is admitted.
    pub preempted: Vec<Sequence>,
    /// A request taken from the queue that did not fit yet: admitted next.
    pub next_up: Option<Waiting>,
    pub admissions: u64,
    /// What passes cost by rows, for the tree-budget policies.
    pub cost: CostLine,
    /// Drafters of the free sequence slots (one per slot when speculation
    /// is on); a sequence takes one when admitted and gives it back when
    /// it leaves.
    pub spare_drafters: Vec<Box<dyn Drafter>>,
}

impl EngineLoop {
    pub fn new(
        model: Model,
        kv: KvCache,
        config: EngineConfig,
        metrics: Arc<Metrics>,
        queued: Arc<AtomicUsize>,
    ) -> EngineLoop {
        let mut spare_drafters: Vec<Box<dyn Drafter>> = Vec::new();
        if config.tree_budget.is_some() {
            for _ in 0..kv.free_sequences() {
                match config.drafts.make(kv.max_len()) {
                    Ok(d) => spare_drafters.push(d),
                    Err(e) => {
                        // That slot decodes plainly; the output is the same.
                        tracing::warn!("a sequence slot runs without drafts: {e}");
                    }
                }
            }
        }
        EngineLoop {
            model,
            kv,
            waiting: FairQueue::new(config.fair),
            config,
            metrics,
            queued,
            running: Vec::new(),
            preempted: Vec::new(),
            next_up: None,
            admissions: 0,
            cost: CostLine::default(),
            spare_drafters,
        }
    }

    pub fn run(mut self, rx: Receiver<Request>) {
        loop {
            if self.running.is_empty() && self.waiting.is_empty() {
                match rx.recv() {
                    Ok(req) => self.arrive(req),
                    Err(_) => return,
                }
            }
            while let Ok(req) = rx.try_recv() {
                self.arrive(req);
            }
            self.retire_finished();
            self.admit();
            self.publish();
            if !self.running.is_empty() {
                self.step();
            }
        }
    }

    fn arrive(&mut self, req: Request) {
        let tenant = req.tenant.clone();
        self.waiting.push(
            &tenant,
            Waiting {
                req,
                arrived: Instant::now(),
            },
        );
    }

    /// Moves finished and cancelled sequences out of the running set and
    /// frees their blocks (full ones stay in the prefix cache) and
    /// drafters; drops cancelled requests that wait.
    fn retire_finished(&mut self) {
        let mut i = 0;
        while i < self.running.len() {
            let r = &self.running[i];
            if !r.is_finished() && !r.req.events.is_closed() {
                i += 1;
                continue;
            }
            let mut r = self.running.swap_remove(i);
            if !r.is_finished() {
                self.count_cancelled(1);
                // A client that stopped reading (a stop string, say) still
                // got the model's own tokens.
                r.end_drafts();
            }
            self.release(r);
        }
        let (gone, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.preempted)
            .into_iter()
            .partition(|r| r.req.events.is_closed());
        self.preempted = kept;
        self.count_cancelled(gone.len());
        for r in gone {
            self.give_back_drafter(r);
        }
        if self
            .next_up
            .as_ref()
            .is_some_and(|w| w.req.events.is_closed())
        {
            self.next_up = None;
            self.queued.fetch_sub(1, Ordering::SeqCst);
            self.count_cancelled(1);
        }
        let before = self.waiting.len();
        self.waiting.retain(|w| !w.req.events.is_closed());
        let dropped = before - self.waiting.len();
        self.queued.fetch_sub(dropped, Ordering::SeqCst);
        self.count_cancelled(dropped);
    }

    fn count_cancelled(&self, n: usize) {
        self.metrics
            .requests_cancelled
            .fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Frees a running sequence's KV blocks and gives back its drafter.
    pub fn release(&mut self, r: Sequence) {
        self.kv.remove_sequence(r.seq);
        self.give_back_drafter(r);
    }

    fn give_back_drafter(&mut self, r: Sequence) {
        if let Some(s) = r.speculation {
            self.spare_drafters.push(s.drafter);
        }
    }

    fn publish(&self) {
        let m = &self.metrics;
        m.requests_running
            .store(self.running.len() as u64, Ordering::Relaxed);
        // Preempted requests wait too (to be recomputed), as in vLLM.
        let waiting = self.queued.load(Ordering::SeqCst) + self.preempted.len();
        m.requests_waiting.store(waiting as u64, Ordering::Relaxed);
        m.kv_used
            .store(self.kv.bytes_used() as u64, Ordering::Relaxed);
        m.set_head(
            self.model.screen_counts(),
            spindle_model::spare_logits_bytes(),
        );
        m.set_memory(self.model.memory(), &self.kv);
        if let Some(t) = &self.config.drafts.traffic {
            m.set_traffic(&t.lock().unwrap_or_else(|e| e.into_inner()).stats());
        }
    }
}
