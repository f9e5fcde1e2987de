//! The embedder's thread: jobs queue on a channel; each pass takes every
//! job waiting (up to the pass's row budget, a long job alone), and answers
//! each on its own channel.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use spindle_model::encoder::EncodedText;
use tokio::sync::oneshot;

use super::Embedder;
use crate::error::{ErrorKind, RequestError};

/// What a job asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobKind {
    /// One vector per text.
    Embed,
    /// One score per query and document pair (cross-encoders).
    ScorePairs,
}

/// A job's answer: one `Vec<f32>` per text (a vector, or a one-value
/// score).
pub type JobResult = Result<Vec<Vec<f32>>, RequestError>;

/// Texts and where their results go.
pub struct EmbedJob {
    pub kind: JobKind,
    pub texts: Vec<EncodedText>,
    pub reply: oneshot::Sender<JobResult>,
}

/// Counters for `/metrics`.
#[derive(Debug, Default)]
pub struct EmbedMetrics {
    pub waiting: AtomicUsize,
    pub running: AtomicUsize,
    pub requests: AtomicU64,
    pub texts: AtomicU64,
    pub tokens: AtomicU64,
    pub passes: AtomicU64,
    /// Microseconds spent in passes.
    pub busy_us: AtomicU64,
}

/// The embedder's queue, shared by the handlers (which tokenize through
/// [`EmbedHandle::embedder`] before they submit).
#[derive(Clone)]
pub struct EmbedHandle {
    tx: Sender<EmbedJob>,
    pub metrics: Arc<EmbedMetrics>,
    embedder: Arc<Embedder>,
    max_waiting: usize,
}

/// Starts `embedder` on its own thread; it stops when every handle is gone.
/// At most `max_waiting` jobs wait; more are refused (HTTP 429).
pub fn spawn_embedder(embedder: Arc<Embedder>, max_waiting: usize) -> EmbedHandle {
    let (tx, rx) = mpsc::channel();
    let metrics = Arc::new(EmbedMetrics::default());
    let handle = EmbedHandle {
        tx,
        metrics: metrics.clone(),
        embedder: embedder.clone(),
        max_waiting: max_waiting.max(1),
    };
    std::thread::Builder::new()
        .name("spindle-embedder".into())
        .spawn(move || run(&embedder, &rx, &metrics))
        .expect("cannot start the embedder thread");
    handle
}

impl EmbedHandle {
    /// The model, its tokenizer and its limits.
    pub fn embedder(&self) -> &Arc<Embedder> {
        &self.embedder
    }

    /// Queues `texts`; the receiver gets their results.
    pub fn submit(
        &self,
        kind: JobKind,
        texts: Vec<EncodedText>,
    ) -> Result<oneshot::Receiver<JobResult>, RequestError> {
        let waiting = self.metrics.waiting.fetch_add(1, Ordering::SeqCst);
        if waiting >= self.max_waiting {
            self.metrics.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(RequestError::new(
                ErrorKind::Capacity,
                format!("{waiting} embedding requests are waiting already: retry shortly"),
            ));
        }
        let (reply, rx) = oneshot::channel();
        self.tx.send(EmbedJob { kind, texts, reply }).map_err(|_| {
            self.metrics.waiting.fetch_sub(1, Ordering::SeqCst);
            RequestError::new(ErrorKind::Cancelled, "the embedder stopped")
        })?;
        Ok(rx)
    }
}

fn run(embedder: &Embedder, rx: &Receiver<EmbedJob>, metrics: &EmbedMetrics) {
    let mut held: Option<EmbedJob> = None;
    loop {
        let first = match held.take() {
            Some(job) => job,
            None => match rx.recv() {
                Ok(job) => job,
                Err(_) => return,
            },
        };
        let kind = first.kind;
        let mut rows: usize = first.texts.iter().map(|t| t.ids.len()).sum();
        let mut jobs = vec![first];
        // Everything already waiting joins, while it fits the pass.
        while let Ok(job) = rx.recv_timeout(Duration::ZERO) {
            let n: usize = job.texts.iter().map(|t| t.ids.len()).sum();
            if job.kind != kind || rows + n > embedder.max_batch_tokens {
                held = Some(job);
                break;
            }
            rows += n;
            jobs.push(job);
        }
        metrics.waiting.fetch_sub(jobs.len(), Ordering::SeqCst);
        // Jobs whose client left are dropped before the pass.
        jobs.retain(|j| !j.reply.is_closed());
        if jobs.is_empty() {
            continue;
        }
        let rows: usize = jobs
            .iter()
            .flat_map(|j| &j.texts)
            .map(|t| t.ids.len())
            .sum();
        metrics.running.fetch_add(jobs.len(), Ordering::SeqCst);
        let texts: Vec<EncodedText> = jobs.iter().flat_map(|j| j.texts.iter().cloned()).collect();
        let started = Instant::now();
        let result = match kind {
            JobKind::Embed => embedder.embed(&texts),
            JobKind::ScorePairs => embedder
                .score_pairs(&texts)
                .map(|s| s.into_iter().map(|v| vec![v]).collect()),
        };
        metrics
            .busy_us
            .fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
        metrics
            .passes
            .fetch_add(embedder.pass_ranges(&texts).len() as u64, Ordering::Relaxed);
        metrics
            .requests
            .fetch_add(jobs.len() as u64, Ordering::Relaxed);
        metrics
            .texts
            .fetch_add(texts.len() as u64, Ordering::Relaxed);
        metrics.tokens.fetch_add(rows as u64, Ordering::Relaxed);
        metrics.running.fetch_sub(jobs.len(), Ordering::SeqCst);
        match result {
            Ok(mut all) => {
                for job in jobs.into_iter().rev() {
                    let mine = all.split_off(all.len() - job.texts.len());
                    let _ = job.reply.send(Ok(mine));
                }
            }
            Err(e) => {
                for job in jobs {
                    let _ = job.reply.send(Err(e.clone()));
                }
            }
        }
    }
}
