//! Plain decoding of one sequence: prefill the prompt in one pass, then one
//! pass per generated token.

use std::time::Instant;

use spindle_model::{Batch, KvCache, Model, Row, SeqId};

use crate::error::EngineError;
use crate::sampler::{sample, SamplerConfig};

/// Longest chain run in one prefill pass; longer prompts take several.
pub const PREFILL_CHUNK: usize = 2048;

/// What to generate.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampler: SamplerConfig,
    /// Tokens that end generation (not emitted).
    pub stop_ids: Vec<u32>,
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token or stop string.
    Stop,
    /// `max_tokens` or the context length reached.
    Length,
    /// The caller's callback asked to stop.
    Cancelled,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
        }
    }
}

/// Timing and counts of one generation.
#[derive(Debug, Clone, Default)]
pub struct GenerateStats {
    pub prompt_tokens: usize,
    pub prompt_seconds: f64,
    pub gen_tokens: usize,
    pub gen_seconds: f64,
    /// Passes of the model, prefill included.
    pub passes: usize,
    /// Passes after prefill.
    pub decode_passes: usize,
    /// Tokens drafted and sent for verification (speculative decoding).
    pub drafted: usize,
    /// Drafted tokens the target model accepted.
    pub accepted: usize,
}

impl GenerateStats {
    pub fn prompt_tokens_per_s(&self) -> f64 {
        rate(self.prompt_tokens, self.prompt_seconds)
    }

    pub fn gen_tokens_per_s(&self) -> f64 {
        rate(self.gen_tokens, self.gen_seconds)
    }

    /// Generated tokens per pass that produced them: the last prefill pass
    /// yields the first token, each decode pass the next (1.0 for plain decoding).
    pub fn tokens_per_pass(&self) -> f64 {
        if self.gen_tokens == 0 {
            0.0
        } else {
            self.gen_tokens as f64 / (self.decode_passes + 1) as f64
        }
    }

    /// Accepted over drafted (0 when nothing was drafted).
    pub fn acceptance_rate(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }
}

fn rate(n: usize, s: f64) -> f64 {
    if s > 0.0 {
        n as f64 / s
    } else {
        0.0
    }
}

/// The result of a generation.
#[derive(Debug, Clone)]
pub struct GenerateOutput {
    pub tokens: Vec<u32>,
    pub finish: FinishReason,
    pub stats: GenerateStats,
}

/// Runs prompt tokens through the model as chains of at most
/// [`PREFILL_CHUNK`] rows, committing them; returns the logits of the last
/// prompt token.
pub fn prefill(
    model: &Model,
    kv: &mut KvCache,
    seq: SeqId,
    tokens: &[u32],
) -> Result<(Vec<f32>, usize), EngineError> {
    if tokens.is_empty() {
        return Err(EngineError::EmptyPrompt);
    }
    let start = kv.seq_len(seq);
    if start + tokens.len() > kv.max_len() {
        return Err(EngineError::PromptTooLong {
            tokens: start + tokens.len(),
            ctx: kv.max_len(),
        });
    }
    let mut passes = 0;
    let mut last = Vec::new();
    for (c, chunk) in tokens.chunks(PREFILL_CHUNK).enumerate() {
        let is_last = (c + 1) * PREFILL_CHUNK >= tokens.len();
        let mut batch = Batch::new();
        let rows = batch.push_chain(seq, kv.seq_len(seq), chunk, |i| {
            is_last && i + 1 == chunk.len()
        });
        let logits = model.forward(&batch, kv)?;
        kv.commit(seq, &rows.collect::<Vec<_>>())?;
        passes += 1;
        if is_last {
            last = logits
                .row(batch.len() - 1)
                .expect("asked for logits")
                .to_vec();
        }
    }
    Ok((last, passes))
}

/// Generates from `req.prompt`, calling `on_token` with each emitted token;
/// `on_token` returns `false` to stop early.
pub fn generate(
    model: &Model,
    kv: &mut KvCache,
    req: &GenerateRequest,
    mut on_token: impl FnMut(u32) -> bool,
) -> Result<GenerateOutput, EngineError> {
    let seq = kv.add_sequence()?;
    let result = generate_on(model, kv, seq, req, &mut on_token);
    kv.remove_sequence(seq);
    result
}

/// [`generate`] on an open, empty sequence, which keeps its KV afterwards.
pub fn generate_on(
    model: &Model,
    kv: &mut KvCache,
    seq: SeqId,
    req: &GenerateRequest,
    on_token: &mut impl FnMut(u32) -> bool,
) -> Result<GenerateOutput, EngineError> {
    let mut stats = GenerateStats {
        prompt_tokens: req.prompt.len(),
        ..Default::default()
    };
    let t0 = Instant::now();
    let (mut logits, passes) = prefill(model, kv, seq, &req.prompt)?;
    stats.prompt_seconds = t0.elapsed().as_secs_f64();
    stats.passes = passes;

    let t1 = Instant::now();
    let mut history = req.prompt.clone();
    let mut out = Vec::new();
    let finish = loop {
        if out.len() >= req.max_tokens {
            break FinishReason::Length;
        }
        let pos = history.len();
        let token = sample(&req.sampler, &logits, &history, pos);
        if req.stop_ids.contains(&token) {
            break FinishReason::Stop;
        }
        out.push(token);
        history.push(token);
        if !on_token(token) {
            break FinishReason::Cancelled;
        }
        if out.len() >= req.max_tokens {
            break FinishReason::Length;
        }
        if pos + 1 >= kv.max_len() {
            break FinishReason::Length;
        }
        let mut batch = Batch::new();
        batch.push(Row {
            token,
            pos,
            seq,
            parent: None,
            logits: true,
        });
        let l = model.forward(&batch, kv)?;
        kv.commit(seq, &[0])?;
        stats.passes += 1;
        stats.decode_passes += 1;
        logits = l.row(0).expect("asked for logits").to_vec();
    };
    stats.gen_tokens = out.len();
    stats.gen_seconds = t1.elapsed().as_secs_f64();
    Ok(GenerateOutput {
        tokens: out,
        finish,
        stats,
    })
}
