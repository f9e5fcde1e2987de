//! Progress of long prompt passes: an `indicatif` bar on standard error
//! (tokens done / total, tokens per second), only when standard error is a
//! terminal, and only once the work has taken over a second, so short
//! prompts and piped runs print nothing extra.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use anyhow::Result;
use indicatif::{ProgressBar, ProgressStyle};
use spindle_engine::generate::prefill;
use spindle_engine::GenerateStats;
use spindle_model::{KvCache, Model, SeqId};

/// Tokens per prefill pass while a bar may be shown: small enough to tick
/// often. The kernels give every row the same bits whatever the pass's
/// size, so this changes no value, only how often the bar moves.
const CHUNK: usize = 256;

/// How long work runs before its bar appears.
const SHOW_AFTER: Duration = Duration::from_secs(1);

/// A bar that appears once its work has run for [`SHOW_AFTER`].
pub struct LazyBar {
    total: u64,
    what: &'static str,
    started: Instant,
    enabled: bool,
    bar: Option<ProgressBar>,
}

impl LazyBar {
    /// A bar over `total` items (`what`: "prefill", "scoring"); it never
    /// shows when standard error is not a terminal.
    pub fn new(total: usize, what: &'static str) -> LazyBar {
        LazyBar {
            total: total as u64,
            what,
            started: Instant::now(),
            enabled: std::io::stderr().is_terminal(),
            bar: None,
        }
    }

    /// Whether the bar can show at all (standard error is a terminal).
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Moves the bar to `done` items, creating it once it is due.
    pub fn set(&mut self, done: usize) {
        if !self.enabled {
            return;
        }
        if self.bar.is_none() && self.started.elapsed() >= SHOW_AFTER {
            // Started where the work is, so its rate counts from now.
            let bar = ProgressBar::new(self.total).with_position(done as u64);
            if let Ok(style) = ProgressStyle::with_template(
                "{msg} [{bar:30}] {pos}/{len} tokens, {per_sec}, {eta} left",
            ) {
                bar.set_style(style.progress_chars("=> "));
            }
            bar.set_message(self.what);
            self.bar = Some(bar);
        }
        if let Some(bar) = &self.bar {
            bar.set_position(done as u64);
        }
    }

    /// Removes the bar from the terminal.
    pub fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

impl Drop for LazyBar {
    fn drop(&mut self) {
        self.finish();
    }
}

/// What [`prefill_with_bar`] ran, to add to the generation's statistics.
#[derive(Debug, Default, Clone, Copy)]
pub struct Prefilled {
    pub tokens: usize,
    pub passes: usize,
    pub seconds: f64,
}

impl Prefilled {
    /// Adds this prefill to the stats of the generation that followed it
    /// (which then prefilled only the last prompt token).
    pub fn add_to(self, stats: &mut GenerateStats) {
        stats.prefilled_tokens += self.tokens;
        stats.passes += self.passes;
        stats.prompt_seconds += self.seconds;
    }
}

/// On a terminal, prefills `prompt[kv.seq_len(seq)..prompt.len() - 1]`
/// onto `seq` in small passes with a progress bar, leaving the last prompt
/// token for the generation (which needs its logits). Elsewhere it does
/// nothing and the generation prefills in its usual passes.
pub fn prefill_with_bar(
    model: &Model,
    kv: &mut KvCache,
    seq: SeqId,
    prompt: &[u32],
) -> Result<Prefilled> {
    let held = kv.seq_len(seq);
    let end = prompt.len().saturating_sub(1);
    let mut bar = LazyBar::new(prompt.len(), "prefill");
    if !bar.enabled() || held >= end {
        return Ok(Prefilled::default());
    }
    let t0 = Instant::now();
    let mut done = Prefilled::default();
    for chunk in prompt[held..end].chunks(CHUNK) {
        let (_, passes) = prefill(model, kv, seq, chunk)?;
        done.tokens += chunk.len();
        done.passes += passes;
        bar.set(held + done.tokens);
    }
    bar.finish();
    done.seconds = t0.elapsed().as_secs_f64();
    Ok(done)
}
