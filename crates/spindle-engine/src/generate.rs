//! Plain decoding of one sequence: prefill the prompt in one pass, then one
//! pass per generated token.

use std::time::Instant;

use spindle_model::{Batch, KvCache, Model, ModelError, Row, SeqId};

use crate::constraint::Constraint;
use crate::error::EngineError;
use crate::sampler::{sample, SamplerConfig};
use crate::speculative::verify::{LazyLogits, LazyRow};

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
    /// A grammar the output must match (see [`crate::constraint`]).
    pub constraint: Option<Constraint>,
}

impl GenerateRequest {
    /// The rules of each token, in a context of `max_len`.
    pub fn rules(&self, max_len: usize) -> TokenRules<'_> {
        TokenRules {
            sampler: &self.sampler,
            stop_ids: &self.stop_ids,
            logit_bias: &[],
            max_tokens: self.max_tokens,
            max_len,
            needs_logits: false,
        }
    }
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
    /// Prompt tokens run through the model: fewer than `prompt_tokens` when
    /// the sequence already held the KV of a prefix (a chat's earlier turns).
    pub prefilled_tokens: usize,
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
    /// Tree nodes each draft source proposed, and how many of those were
    /// accepted, by [`crate::speculative::Source::index`] (a node two
    /// sources proposed counts for both).
    pub by_source: [(u64, u64); crate::speculative::Source::COUNT],
    /// Grammar masks computed (constrained generation), their seconds, and
    /// the part of those seconds a token waited for its mask (the rest ran
    /// beside the model's passes).
    pub masks: usize,
    pub mask_seconds: f64,
    pub mask_waiting_seconds: f64,
}

impl GenerateStats {
    /// Prefill speed: the tokens actually run (a held prefix took no time).
    pub fn prompt_tokens_per_s(&self) -> f64 {
        rate(self.prefilled_tokens, self.prompt_seconds)
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

    /// Adds `c`'s mask counts and times.
    pub fn add_masks(&mut self, c: &Constraint) {
        self.masks += c.timing.masks;
        self.mask_seconds += c.timing.seconds;
        self.mask_waiting_seconds += c.timing.waiting_seconds;
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

/// Prefills what `seq` lacks of `prompt`: the sequence holds the KV of
/// `prompt[..kv.seq_len(seq)]` (nothing, for a new sequence), so only the
/// rest runs, at its own positions. A sequence holding the whole prompt (or
/// more) is rolled back to one token short, so that the last prompt token
/// gives the logits. Returns the logits, the passes and the tokens run.
pub fn prefill_rest(
    model: &Model,
    kv: &mut KvCache,
    seq: SeqId,
    prompt: &[u32],
) -> Result<(Vec<f32>, usize, usize), EngineError> {
    if prompt.is_empty() {
        return Err(EngineError::EmptyPrompt);
    }
    if kv.seq_len(seq) >= prompt.len() {
        kv.truncate(seq, prompt.len() - 1)?;
    }
    let held = kv.seq_len(seq);
    let (logits, passes) = prefill(model, kv, seq, &prompt[held..])?;
    Ok((logits, passes, prompt.len() - held))
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

/// [`generate`] on an open sequence, which keeps its KV afterwards. The
/// sequence may already hold the KV of a prefix of `req.prompt` (see
/// [`prefill_rest`]): only the rest is prefilled.
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
    let (logits, passes, prefilled) = prefill_rest(model, kv, seq, &req.prompt)?;
    stats.prompt_seconds = t0.elapsed().as_secs_f64();
    stats.passes = passes;
    stats.prefilled_tokens = prefilled;

    let t1 = Instant::now();
    let rules = req.rules(kv.max_len());
    let mut history = req.prompt.clone();
    let mut generated = 0;
    let mut constraint = req.constraint.clone();
    let mut on_token = |t: u32, _: Option<&[f32]>| on_token(t);
    // The prompt's last row comes with its logits; each pass after it
    // gives a hidden state, whose head runs only as far as choosing needs.
    let mut lazy: Option<LazyLogits> = None;
    let finish = loop {
        if generated >= req.max_tokens {
            break FinishReason::Length;
        }
        let next = match lazy.as_mut() {
            None => next_token(
                &rules,
                &mut FullRow(&logits),
                &mut history,
                &mut generated,
                constraint.as_mut(),
                &mut on_token,
            )?,
            Some(l) => next_token(
                &rules,
                &mut LazyRow {
                    model,
                    logits: l,
                    row: 0,
                    more: vec![0],
                    choose_in_head: constraint.is_none(),
                },
                &mut history,
                &mut generated,
                constraint.as_mut(),
                &mut on_token,
            )?,
        };
        let token = match next {
            Next::Token(t) => t,
            Next::End(reason) => break reason,
        };
        let mut batch = Batch::new();
        batch.push(Row {
            token,
            pos: history.len() - 1,
            seq,
            parent: None,
            logits: true,
        });
        let preparing = constraint.as_mut().map(|c| (c, Vec::new()));
        let hidden = prepare_during(model.n_threads(), preparing, || {
            model.forward_hidden(&batch, kv)
        })?;
        if let Some(row) = hidden.first_non_finite_row() {
            return Err(ModelError::NonFiniteActivations { row }.into());
        }
        kv.commit(seq, &[0])?;
        stats.passes += 1;
        stats.decode_passes += 1;
        lazy = Some(LazyLogits::new(hidden, &batch));
    };
    stats.gen_tokens = generated;
    stats.gen_seconds = t1.elapsed().as_secs_f64();
    if let Some(c) = &constraint {
        stats.add_masks(c);
    }
    Ok(GenerateOutput {
        tokens: history.split_off(req.prompt.len()),
        finish,
        stats,
    })
}

/// Runs `pass` (a pass of the model) while a helper thread computes the
/// masks each of `constraints` will need to choose tokens from it: the
/// next token's, and those along the given path (the likeliest path of a
/// tree being verified). Masks depend only on the tokens emitted before
/// them, so they are ready when the logits are, off the critical path.
///
/// Only where a core is spare beside the pass's `threads`: on a machine
/// whose every core runs the pass, the helper would slow the pass by what
/// it saves (measured: docs/PERF.md §19), and most masks are never needed
/// (see [`next_token`]).
pub fn prepare_during<'a, T>(
    threads: usize,
    constraints: impl IntoIterator<Item = (&'a mut Constraint, Vec<u32>)>,
    pass: impl FnOnce() -> T,
) -> T {
    // Asked once: on Linux the answer reads cgroup files.
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let cores = *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let mut constraints: Vec<(&mut Constraint, Vec<u32>)> = constraints.into_iter().collect();
    if constraints.is_empty() || cores <= threads {
        return pass();
    }
    std::thread::scope(|s| {
        let helper = s.spawn(move || {
            for (c, path) in constraints.iter_mut() {
                c.prepare(path);
            }
        });
        let out = pass();
        let _ = helper.join();
        out
    })
}

/// How plain decoding chooses each token and when it ends: the rules every
/// decoder of Spindle applies, token by token, in this order
/// ([`next_token`]). Speculative walks apply them at every tree node they
/// visit, so they emit exactly what plain decoding would.
#[derive(Debug, Clone, Copy)]
pub struct TokenRules<'a> {
    pub sampler: &'a SamplerConfig,
    /// Tokens that end generation (not emitted).
    pub stop_ids: &'a [u32],
    /// Added to the logits before sampling (OpenAI's `logit_bias`).
    pub logit_bias: &'a [(u32, f32)],
    /// Most tokens to emit.
    pub max_tokens: usize,
    /// Longest sequence, prompt included (the context).
    pub max_len: usize,
    /// Every chosen token's full logits are wanted (log-probabilities).
    pub needs_logits: bool,
}

impl TokenRules<'_> {
    /// Whether a row's token can be chosen from the head's bounds and a
    /// few exact logits ([`crate::sampler::choose_bounded`]).
    pub fn chooses_from_bounds(&self) -> bool {
        !self.needs_logits && self.logit_bias.is_empty() && self.sampler.chooses_from_bounds()
    }
}

/// What [`next_token`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// This token was emitted and generation goes on after it.
    Token(u32),
    /// Generation ended (after emitting a last token, unless a stop token
    /// or a cancellation ended it).
    End(FinishReason),
}

/// One step of plain decoding, from the logits of the last position of
/// `history` (prompt and emitted tokens): sample the token at the next
/// position (keyed by seed and position), end at a stop token, emit it
/// (`on_token(token, logits)` returns false to cancel; the logits are
/// there when they were computed, always when [`TokenRules::needs_logits`]),
/// then end at the token limit or the context.
///
/// `logits` gives the full row, or where the rules allow only the token
/// the sampler chooses, found from the head's bounds ([`RowLogits`]): the
/// same token either way.
///
/// Under a `constraint`, tokens the grammar forbids get minus infinity
/// before sampling (stop tokens stay allowed where the output may end), the
/// emitted token advances the matcher, and a complete grammar ends
/// generation (`Stop`).
pub fn next_token(
    rules: &TokenRules,
    logits: &mut dyn RowLogits,
    history: &mut Vec<u32>,
    generated: &mut usize,
    mut constraint: Option<&mut Constraint>,
    on_token: &mut dyn FnMut(u32, Option<&[f32]>) -> bool,
) -> Result<Next, EngineError> {
    let pos = history.len();
    let chosen = |logits: &mut dyn RowLogits, history: &[u32]| -> Result<u32, EngineError> {
        if rules.chooses_from_bounds() {
            if let Some(t) = logits.chosen(rules.sampler, pos)? {
                return Ok(t);
            }
        }
        Ok(sample(rules.sampler, logits.full()?, history, pos))
    };
    let token = if rules.logit_bias.is_empty() && constraint.is_none() {
        chosen(logits, history)?
    } else {
        match constraint.as_deref_mut() {
            // The mask only matters when the token drawn without it is one
            // the grammar forbids: drawing from all tokens gives the token
            // drawn from the allowed ones whenever it is allowed (greedy,
            // or sampling with no top-k/top-p/min-p cut), so the mask is
            // computed only then.
            Some(c) if rules.sampler.is_greedy() || rules.sampler.filters_nothing() => {
                let t = if rules.logit_bias.is_empty() {
                    chosen(logits, history)?
                } else {
                    sample(rules.sampler, &biased(rules, logits.full()?), history, pos)
                };
                if c.allows(t, rules.stop_ids) {
                    t
                } else {
                    let mut adjusted = biased(rules, logits.full()?);
                    if !c.mask_logits(&mut adjusted, rules.stop_ids) {
                        return Ok(Next::End(FinishReason::Stop));
                    }
                    sample(rules.sampler, &adjusted, history, pos)
                }
            }
            Some(c) => {
                let mut adjusted = biased(rules, logits.full()?);
                if !c.mask_logits(&mut adjusted, rules.stop_ids) {
                    return Ok(Next::End(FinishReason::Stop));
                }
                sample(rules.sampler, &adjusted, history, pos)
            }
            None => sample(rules.sampler, &biased(rules, logits.full()?), history, pos),
        }
    };
    if rules.stop_ids.contains(&token) {
        return Ok(Next::End(FinishReason::Stop));
    }
    history.push(token);
    *generated += 1;
    if let Some(c) = constraint.as_deref_mut() {
        c.consume(token);
    }
    let shown = if rules.needs_logits {
        Some(logits.full()?)
    } else {
        logits.computed()
    };
    if !on_token(token, shown) {
        return Ok(Next::End(FinishReason::Cancelled));
    }
    if constraint.is_some_and(|c| c.is_done()) {
        return Ok(Next::End(FinishReason::Stop));
    }
    if *generated >= rules.max_tokens || pos + 1 >= rules.max_len {
        return Ok(Next::End(FinishReason::Length));
    }
    Ok(Next::Token(token))
}

/// The logits with the rules' `logit_bias` added.
fn biased(rules: &TokenRules, logits: &[f32]) -> Vec<f32> {
    let mut adjusted = logits.to_vec();
    for &(id, b) in rules.logit_bias {
        if let Some(v) = adjusted.get_mut(id as usize) {
            *v += b;
        }
    }
    adjusted
}

/// One row's logits as [`next_token`] reads them: every logit, or only the
/// token the sampler would choose from them.
pub trait RowLogits {
    /// Every logit of the row (computed now if it was not).
    fn full(&mut self) -> Result<&[f32], EngineError>;

    /// The token `sample(cfg, logits, _, position)` chooses, found without
    /// every logit (`cfg` satisfies [`SamplerConfig::chooses_from_bounds`]);
    /// `None` when that is not cheaper here.
    fn chosen(&mut self, cfg: &SamplerConfig, position: usize) -> Result<Option<u32>, EngineError>;

    /// Every logit, if they were computed.
    fn computed(&self) -> Option<&[f32]>;
}

/// A row whose logits are all there.
pub struct FullRow<'a>(pub &'a [f32]);

impl RowLogits for FullRow<'_> {
    fn full(&mut self) -> Result<&[f32], EngineError> {
        Ok(self.0)
    }

    fn chosen(&mut self, _: &SamplerConfig, _: usize) -> Result<Option<u32>, EngineError> {
        Ok(None)
    }

    fn computed(&self) -> Option<&[f32]> {
        Some(self.0)
    }
}
