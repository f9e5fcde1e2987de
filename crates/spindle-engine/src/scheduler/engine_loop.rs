//! The engine loop: one thread owns the model and the KV cache and, after
//! every pass, takes in new requests, drops cancelled ones, admits waiting
//! requests while sequence slots and KV blocks allow, and builds the next
//! `Batch` from every running sequence: one decode row each (with its
//! drafted tree), then prompt chunks up to the token budget (chunked
//! prefill beside decode).
//!
//! When the next pass would need more KV blocks than the pool has free,
//! speculative trees go first, then the most recently admitted sequence
//! is preempted: its blocks are freed and it waits, ahead of new requests,
//! to be recomputed from its tokens so far (much of it from the prefix
//! cache). Nothing is truncated and its output does not change.
//!
//! Every row's logits are bit-identical to those of the same sequence run
//! alone (batch-invariant kernels), and the sampler is keyed by (seed,
//! position), so a request gets the same tokens whatever else is running.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;
use std::time::Instant;

use spindle_model::{Batch, KvCache, Model, SeqId};

use crate::error::EngineError;
use crate::spec::tree::{TokenTree, MAX_DEPTH};
use crate::spec::verify::{likeliest_path, push_tree, LazyLogits};
use crate::spec::{Adaptive, CostLine, Drafter, NgramDrafter};

use super::metrics::Metrics;
use super::queue::FairQueue;
use super::request::{Event, Finished, Request, TokenLogprobs};
use super::score_tree::{push_score_tree, read_scores, PlacedTree};
use crate::generate::FinishReason;
use crate::sampler::sample;
use crate::score::{log_softmax, top_k};

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
    /// Speculative decoding with n-gram drafts, trees of at most this many
    /// nodes per sequence, sized each pass by the adaptive policy (`None`:
    /// off).
    pub spec_budget: Option<usize>,
    /// Verify the whole budget every pass instead of sizing trees from
    /// timings (for tests: what is drafted then depends on nothing but
    /// the tokens).
    pub spec_fixed: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_batch_tokens: 512,
            max_waiting: 1024,
            fair: true,
            static_batching: false,
            spec_budget: Some(16),
            spec_fixed: false,
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
}

impl EngineHandle {
    /// Queues `req`; its events arrive on the channel it carries.
    pub fn submit(&self, req: Request) -> Result<(), SubmitError> {
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

/// Starts the engine loop on its own thread. It runs until every handle is
/// dropped.
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
    };
    metrics
        .kv_capacity
        .store(kv.layout().bytes() as u64, Ordering::Relaxed);
    std::thread::Builder::new()
        .name("spindle-engine".into())
        .spawn(move || {
            let mut engine = EngineLoop {
                model,
                kv,
                config: config.clone(),
                metrics,
                queued,
                waiting: FairQueue::new(config.fair),
                running: Vec::new(),
                preempted: Vec::new(),
                next_up: None,
                admissions: 0,
                cost: CostLine::default(),
            };
            engine.run(rx);
        })
        .expect("the engine thread starts");
    handle
}

/// A request in a sequence slot.
struct Running {
    req: Request,
    seq: SeqId,
    arrived: Instant,
    /// Order of first admission: the latest admitted is preempted first.
    admitted: u64,
    /// Tokens of `history` committed to the KV cache.
    fed: usize,
    /// Prefill runs `history[fed..prefill_to]`: the prompt, or after a
    /// preemption every token so far.
    prefill_to: usize,
    /// Prompt and emitted tokens.
    history: Vec<u32>,
    generated: usize,
    /// The last emitted token, not yet run through the model.
    pending: Option<u32>,
    last_token_at: Option<Instant>,
    done: bool,
    /// Ended with an error: its KV is not kept.
    failed: bool,
    /// Speculative decoding, when on.
    spec: Option<SeqSpec>,
}

/// A sequence's drafter and tree-size policy.
struct SeqSpec {
    drafter: NgramDrafter,
    policy: Adaptive,
}

impl SeqSpec {
    /// The tree to verify after the pending token (empty: plain decoding).
    fn draft(&mut self, history: &[u32], depth: usize) -> TokenTree {
        let ask = self.policy.draft_len(depth);
        if ask == 0 {
            return TokenTree::default();
        }
        let t = Instant::now();
        let drafts = self.drafter.propose(history, ask).unwrap_or_default();
        let drafted: usize = drafts.iter().map(|d| d.tokens.len()).sum();
        self.policy.record_draft(drafted, t.elapsed().as_secs_f64());
        let full = TokenTree::build(&drafts, self.policy.max_nodes);
        let keep = self.policy.choose(&full);
        full.cut(keep)
    }
}

struct Waiting {
    req: Request,
    arrived: Instant,
}

struct EngineLoop {
    model: Model,
    kv: KvCache,
    config: EngineConfig,
    metrics: Arc<Metrics>,
    queued: Arc<AtomicUsize>,
    waiting: FairQueue<Waiting>,
    running: Vec<Running>,
    /// Requests preempted for KV blocks, to be recomputed before any new
    /// request is admitted.
    preempted: Vec<Running>,
    /// A request taken from the queue that did not fit yet: admitted next.
    next_up: Option<Waiting>,
    admissions: u64,
    /// What passes cost by rows, for the speculative policies.
    cost: CostLine,
}

/// What one running sequence contributes to a pass.
struct Part {
    running: usize,
    rows: std::ops::Range<usize>,
    /// Prompt tokens the rows feed (0 for a decode row).
    prompt_tokens: usize,
    /// The row whose logits choose the next token, if any.
    logits_row: Option<usize>,
    /// The drafted tree verified after the pending token (rows after it).
    tree: TokenTree,
    /// A request's score tree, behind its prompt's last chunk.
    score: Option<PlacedTree>,
}

impl EngineLoop {
    fn run(&mut self, rx: Receiver<Request>) {
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
    /// frees their blocks (full ones stay in the prefix cache); drops
    /// cancelled requests that wait.
    fn retire_finished(&mut self) {
        let mut i = 0;
        while i < self.running.len() {
            let r = &self.running[i];
            if !r.done && !r.req.events.is_closed() {
                i += 1;
                continue;
            }
            let r = self.running.swap_remove(i);
            self.kv.remove_sequence(r.seq);
        }
        self.preempted.retain(|r| !r.req.events.is_closed());
        if self
            .next_up
            .as_ref()
            .is_some_and(|w| w.req.events.is_closed())
        {
            self.next_up = None;
            self.queued.fetch_sub(1, Ordering::SeqCst);
        }
        let before = self.waiting.len();
        self.waiting.retain(|w| !w.req.events.is_closed());
        let dropped = before - self.waiting.len();
        self.queued.fetch_sub(dropped, Ordering::SeqCst);
    }

    /// Admits requests while a sequence slot is free and the KV pool has
    /// room for their prompts beside the running sequences' next pass:
    /// preempted requests first (earliest admitted first), then the queue.
    fn admit(&mut self) {
        if self.config.static_batching && !self.running.is_empty() {
            return;
        }
        while self.kv.free_sequences() > 0 {
            let earliest = (0..self.preempted.len()).min_by_key(|&i| self.preempted[i].admitted);
            if let Some(i) = earliest {
                let r = self.preempted.swap_remove(i);
                if let Some(r) = self.resume(r) {
                    self.preempted.push(r);
                    return;
                }
                continue;
            }
            let Some(w) = self.next_up.take().or_else(|| self.waiting.pop()) else {
                return;
            };
            if let Some(w) = self.start(w) {
                self.next_up = Some(w);
                return;
            }
        }
    }

    /// Opens a sequence for `tokens` (from the prefix cache as far as it
    /// holds them) if the pool has room to prefill the rest beside what
    /// the running sequences need next; returns it and the cached length.
    fn open_sequence(&mut self, tokens: &[u32]) -> Option<(SeqId, usize)> {
        let (seq, cached) = self.kv.add_sequence_with_prefix(tokens).ok()?;
        let mut commits = self.demands(false);
        commits.push((seq, tokens.len() - cached));
        // Alone, a sequence always fits: the pool holds a whole context.
        if !self.running.is_empty() && !self.kv.fits(&commits) {
            self.kv.remove_sequence(seq);
            return None;
        }
        let m = &self.metrics;
        m.prefix_cache_queries
            .fetch_add(tokens.len() as u64, Ordering::Relaxed);
        m.prefix_cache_hits
            .fetch_add(cached as u64, Ordering::Relaxed);
        Some((seq, cached))
    }

    /// Starts a new request; gives it back if there is no room yet.
    fn start(&mut self, w: Waiting) -> Option<Waiting> {
        let ctx = self.kv.max_len();
        let depth = w.req.score.as_ref().map_or(Ok(0), |t| t.depth());
        let problem = if w.req.prompt.is_empty() {
            Some("the prompt is empty: give at least one token".to_string())
        } else if w.req.prompt.len() >= ctx {
            Some(format!(
                "the prompt has {} tokens but the context holds {ctx}",
                w.req.prompt.len()
            ))
        } else {
            match depth {
                Err(e) => Some(format!("the score tree is malformed: {e}")),
                Ok(d) if w.req.prompt.len() + d > ctx => Some(format!(
                    "the prompt ({} tokens) and the score tree ({d} deep) exceed the context of {ctx}",
                    w.req.prompt.len()
                )),
                Ok(_) => None,
            }
        };
        if let Some(msg) = problem {
            self.queued.fetch_sub(1, Ordering::SeqCst);
            let _ = w.req.events.send(Event::Error(msg));
            return None;
        }
        let Some((seq, cached)) = self.open_sequence(&w.req.prompt) else {
            return Some(w);
        };
        self.queued.fetch_sub(1, Ordering::SeqCst);
        self.metrics
            .prompt_tokens
            .fetch_add(w.req.prompt.len() as u64, Ordering::Relaxed);
        self.admissions += 1;
        let scoring = w.req.score.is_some();
        let history = w.req.prompt.clone();
        let mut r = Running {
            prefill_to: history.len(),
            req: w.req,
            seq,
            arrived: w.arrived,
            admitted: self.admissions,
            fed: cached,
            history,
            generated: 0,
            pending: None,
            last_token_at: None,
            done: false,
            failed: false,
            spec: self
                .config
                .spec_budget
                .filter(|_| !scoring)
                .map(|b| SeqSpec {
                    drafter: NgramDrafter::default(),
                    policy: if self.config.spec_fixed {
                        Adaptive::fixed(b)
                    } else {
                        Adaptive::new(b)
                    },
                }),
        };
        if r.req.params.max_tokens == 0 && !scoring {
            finish(&self.metrics, &mut r, FinishReason::Length);
            self.kv.remove_sequence(seq);
            return None;
        }
        self.running.push(r);
        None
    }

    /// Brings a preempted request back (its tokens so far are its
    /// prompt); gives it back if there is no room yet.
    fn resume(&mut self, mut r: Running) -> Option<Running> {
        let Some((seq, cached)) = self.open_sequence(&r.history[..r.prefill_to]) else {
            return Some(r);
        };
        (r.seq, r.fed) = (seq, cached);
        self.running.push(r);
        None
    }

    /// The prompt chunks that fit in `budget` rows: `(running index,
    /// tokens)`, earliest admitted first, so a prompt cannot be overtaken
    /// for ever by newer ones.
    fn prefill_chunks(&self, mut budget: usize) -> Vec<(usize, usize)> {
        let mut order: Vec<usize> = (0..self.running.len()).collect();
        order.sort_by_key(|&i| self.running[i].admitted);
        let mut chunks = Vec::new();
        for i in order {
            let r = &self.running[i];
            let take = (r.prefill_to - r.fed).min(budget);
            if take > 0 {
                budget -= take;
                chunks.push((i, take));
            }
        }
        chunks
    }

    /// What each running sequence may commit in the next pass: its pending
    /// token and, `with_trees`, the deepest accepted path of its tree; the
    /// prompt chunks the token budget leaves room for.
    fn demands(&self, with_trees: bool) -> Vec<(SeqId, usize)> {
        let tree = match (with_trees, self.config.spec_budget) {
            (true, Some(b)) => b.min(MAX_DEPTH),
            _ => 0,
        };
        let mut commits = Vec::new();
        for r in self.running.iter().filter(|r| r.pending.is_some()) {
            commits.push((r.seq, 1 + tree));
        }
        let budget = self.config.max_batch_tokens.saturating_sub(commits.len());
        for (i, take) in self.prefill_chunks(budget) {
            commits.push((self.running[i].seq, take));
        }
        commits
    }

    /// Makes the next pass fit in the KV pool: without speculative trees if
    /// need be, else by preempting the most recently admitted sequences.
    /// Returns whether the pass may verify trees.
    fn make_room(&mut self) -> bool {
        loop {
            if self.kv.fits(&self.demands(true)) {
                return true;
            }
            if self.kv.fits(&self.demands(false)) {
                return false;
            }
            if self.running.len() <= 1 {
                // Cannot happen with a pool that holds a whole context;
                // if it does, the request ends with the reason.
                for r in &mut self.running {
                    let _ = r.req.events.send(Event::Error(
                        "the KV cache has no room for this sequence's next tokens: give it more --kv-memory".into(),
                    ));
                    (r.done, r.failed) = (true, true);
                }
                return false;
            }
            let latest = (0..self.running.len())
                .max_by_key(|&i| self.running[i].admitted)
                .expect("more than one running");
            let mut r = self.running.swap_remove(latest);
            self.kv.remove_sequence(r.seq);
            // Everything so far, the pending token included, is prefilled
            // again; its logits choose the next token as decoding would.
            r.pending = None;
            r.prefill_to = r.history.len();
            r.fed = 0;
            self.metrics.preemptions.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(seq = r.seq, tokens = r.prefill_to, "preempted");
            self.preempted.push(r);
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
    }

    /// One pass over every running sequence: each decoding sequence's
    /// pending token with its drafted tree, then prompt chunks.
    fn step(&mut self) {
        let with_trees = self.make_room();
        if self.running.iter().all(|r| r.done) {
            return;
        }
        let mut batch = Batch::new();
        let mut parts = Vec::new();
        let max_len = self.kv.max_len();
        let n_decode = self.running.iter().filter(|r| r.pending.is_some()).count();
        let cost = self.cost.fit();
        for (i, r) in self.running.iter_mut().enumerate() {
            let Some(token) = r.pending else {
                continue;
            };
            let p = r.history.len() - 1;
            let tree = match &mut r.spec {
                Some(spec) if with_trees => {
                    if let Some((fixed, per_row)) = cost {
                        // This sequence's share of the fixed cost, and what
                        // each of its rows adds.
                        spec.policy
                            .set_pass_cost(fixed / n_decode as f64 + per_row, per_row);
                    }
                    let depth = MAX_DEPTH
                        .min(r.req.params.max_tokens - r.generated)
                        .min(max_len.saturating_sub(p + 2));
                    spec.draft(&r.history, depth)
                }
                _ => TokenTree::default(),
            };
            let rows = push_tree(&mut batch, r.seq, p, token, &tree);
            parts.push(Part {
                running: i,
                logits_row: Some(rows.start),
                rows,
                prompt_tokens: 0,
                tree,
                score: None,
            });
        }
        let budget = self.config.max_batch_tokens.saturating_sub(batch.len());
        for (i, take) in self.prefill_chunks(budget) {
            let r = &self.running[i];
            let last = r.fed + take == r.prefill_to;
            let score_tree = r.req.score.as_ref().filter(|_| last);
            let rows = batch.push_chain(r.seq, r.fed, &r.history[r.fed..r.fed + take], |j| {
                last && j + 1 == take && score_tree.is_none()
            });
            let score = score_tree.map(|t| push_score_tree(&mut batch, r.seq, rows.end - 1, t));
            let logits_row = (last && score.is_none()).then(|| rows.end - 1);
            parts.push(Part {
                running: i,
                rows,
                prompt_tokens: take,
                logits_row,
                tree: TokenTree::default(),
                score,
            });
        }
        if batch.is_empty() {
            return;
        }
        let t = Instant::now();
        let result = self.pass(&batch, &parts);
        let mut logits = match result {
            Ok(l) => l,
            Err(e) => {
                // Nothing of the pass is committed; its requests end with
                // the error and free their slots.
                let msg = format!("the forward pass failed: {e}");
                for p in &parts {
                    let r = &mut self.running[p.running];
                    let _ = r.req.events.send(Event::Error(msg.clone()));
                    r.done = true;
                    r.failed = true;
                }
                return;
            }
        };
        self.metrics.passes.fetch_add(1, Ordering::Relaxed);
        for p in parts {
            if let Err(e) = self.finish_part(&p, &mut logits, max_len) {
                let r = &mut self.running[p.running];
                let _ = r.req.events.send(Event::Error(e));
                r.done = true;
                r.failed = true;
            }
        }
        let seconds = t.elapsed().as_secs_f64();
        self.cost.record(batch.len(), seconds);
        tracing::debug!(
            rows = batch.len(),
            sequences = self.running.len(),
            ms = seconds * 1e3,
            "pass"
        );
    }

    /// The pass itself, and the head over the rows the walks will read
    /// first: every prompt's last row and each tree's likeliest path.
    fn pass(&mut self, batch: &Batch, parts: &[Part]) -> Result<LazyLogits, EngineError> {
        let hidden = self.model.forward_hidden(batch, &mut self.kv)?;
        let mut logits = LazyLogits::new(hidden);
        let mut first: Vec<usize> = parts
            .iter()
            .filter_map(|p| p.logits_row.map(|row| likeliest_path(&p.tree, row, row)))
            .flatten()
            .collect();
        for p in parts {
            if let Some(s) = &p.score {
                first.extend(&s.logits_rows);
            }
        }
        logits.compute(&self.model, &first)?;
        Ok(logits)
    }

    /// Commits what a sequence keeps of the pass and emits its tokens: a
    /// prompt chunk, or a walk down the verified tree from the pending
    /// token, sampling the model's own token at each node.
    fn finish_part(
        &mut self,
        p: &Part,
        logits: &mut LazyLogits,
        max_len: usize,
    ) -> Result<(), String> {
        let r = &mut self.running[p.running];
        // A prompt chunk is committed whole; a walk commits its path below.
        if p.prompt_tokens > 0 {
            let rows: Vec<usize> = p.rows.clone().collect();
            self.kv
                .commit(r.seq, &rows)
                .map_err(|e| format!("KV commit failed: {e}"))?;
            r.fed += p.prompt_tokens;
        }
        if let Some(placed) = &p.score {
            let tree = r.req.score.as_ref().expect("a score part has a tree");
            let scores = read_scores(&self.model, logits, tree, placed)
                .map_err(|e| format!("the output head failed: {e}"))?;
            let _ = r.req.events.send(Event::Scores(scores));
            finish(&self.metrics, r, FinishReason::Stop);
            return Ok(());
        }
        let Some(root) = p.logits_row else {
            return Ok(());
        };
        let tree = &p.tree;
        let mut path = vec![root];
        let mut node = None;
        let mut rejected = false;
        let mut finished = None;
        loop {
            let row = *path.last().expect("the path starts at the root");
            let l = logits
                .row(&self.model, row, || likeliest_path(tree, root, row))
                .map_err(|e| format!("the output head failed: {e}"))?;
            if let Some(reason) = emit(r, l, max_len, &self.metrics) {
                finished = Some(reason);
                break;
            }
            let t = r.pending.expect("emit leaves the token pending");
            match tree.child(node, t) {
                Some(c) => {
                    node = Some(c);
                    path.push(root + 1 + c);
                }
                None => {
                    rejected = tree.nodes.iter().any(|n| n.parent == node);
                    break;
                }
            }
        }
        if p.prompt_tokens == 0 {
            self.kv
                .commit(r.seq, &path)
                .map_err(|e| format!("KV commit failed: {e}"))?;
        }
        let accepted = path.len() - 1;
        if let Some(spec) = &mut r.spec {
            if !tree.is_empty() {
                spec.policy.record_acceptance(accepted, rejected);
            }
        }
        let m = &self.metrics;
        m.spec_drafted
            .fetch_add(tree.len() as u64, Ordering::Relaxed);
        m.spec_accepted
            .fetch_add(accepted as u64, Ordering::Relaxed);
        if let Some(reason) = finished {
            finish(m, r, reason);
        }
        Ok(())
    }
}

/// Sends a request's final event and records its latency.
fn finish(metrics: &Metrics, r: &mut Running, reason: FinishReason) {
    r.done = true;
    let _ = r.req.events.send(Event::Finished(Finished {
        reason,
        prompt_tokens: r.req.prompt.len(),
        completion_tokens: r.generated,
    }));
    metrics.requests_finished.fetch_add(1, Ordering::Relaxed);
    metrics.observe(&metrics.e2e_latency, r.arrived.elapsed().as_secs_f64());
}

/// Samples the next token of `r` from `logits` as plain decoding does and
/// sends it; returns why the request ends, if it does.
fn emit(
    r: &mut Running,
    logits: &[f32],
    max_len: usize,
    metrics: &Metrics,
) -> Option<FinishReason> {
    let params = &r.req.params;
    let pos = r.history.len();
    let biased;
    let for_sampling = if params.logit_bias.is_empty() {
        logits
    } else {
        let mut l = logits.to_vec();
        for &(id, b) in &params.logit_bias {
            if let Some(v) = l.get_mut(id as usize) {
                *v += b;
            }
        }
        biased = l;
        &biased[..]
    };
    let token = sample(&params.sampler, for_sampling, &r.history, pos);
    r.pending = None;
    if params.stop_ids.contains(&token) {
        return Some(FinishReason::Stop);
    }
    let logprobs = params.logprobs.map(|k| token_logprobs(logits, token, k));
    r.history.push(token);
    r.generated += 1;
    r.pending = Some(token);
    metrics.generation_tokens.fetch_add(1, Ordering::Relaxed);
    let now = Instant::now();
    match r.last_token_at {
        None => metrics.observe(
            &metrics.time_to_first_token,
            (now - r.arrived).as_secs_f64(),
        ),
        Some(t) => metrics.observe(&metrics.inter_token_latency, (now - t).as_secs_f64()),
    }
    r.last_token_at = Some(now);
    if r.req
        .events
        .send(Event::Token {
            id: token,
            logprobs,
        })
        .is_err()
    {
        return Some(FinishReason::Cancelled);
    }
    if r.generated >= r.req.params.max_tokens || pos + 1 >= max_len {
        return Some(FinishReason::Length);
    }
    None
}

/// Log-softmax of `logits` at `token`, and the `k` likeliest tokens (as
/// `spindle score` computes them).
pub(crate) fn token_logprobs(logits: &[f32], token: u32, k: usize) -> TokenLogprobs {
    let lp = log_softmax(logits);
    TokenLogprobs {
        logprob: lp[token as usize] as f32,
        top: top_k(&lp, k)
            .into_iter()
            .map(|t| (t.id, t.logprob as f32))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprobs_are_a_log_softmax_with_the_top_in_order() {
        let logits = [1.0f32, 3.0, 2.0, 3.0, -1.0];
        let z: f64 = logits.iter().map(|&l| (l as f64).exp()).sum();
        let want = |i: usize| (logits[i] as f64 - z.ln()) as f32;
        let lp = token_logprobs(&logits, 2, 3);
        assert!((lp.logprob - want(2)).abs() < 1e-6);
        let ids: Vec<u32> = lp.top.iter().map(|t| t.0).collect();
        // Ties keep the lower id first.
        assert_eq!(ids, vec![1, 3, 2]);
        assert!((lp.top[0].1 - want(1)).abs() < 1e-6);
        assert!(token_logprobs(&logits, 0, 0).top.is_empty());
    }
}
