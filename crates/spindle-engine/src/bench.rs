//! Benchmarks of the one pass, like llama-bench: prompt processing, token
//! generation, and the cost of a pass against its number of rows.

use std::time::Instant;

use spindle_model::{Batch, Hidden, KvCache, Model, Row};

use crate::error::EngineError;
use crate::sampler::{choose_bounded, sample, SamplerConfig};
use crate::speculative::verify::LazyLogits;

/// Mean, standard deviation and median of repeated measurements.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Summary {
    pub mean: f64,
    pub sd: f64,
    pub median: f64,
    pub samples: Vec<f64>,
}

impl Summary {
    pub fn of(samples: Vec<f64>) -> Summary {
        let n = samples.len().max(1) as f64;
        let mean = samples.iter().sum::<f64>() / n;
        let var = samples.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
        let mut sorted = samples.clone();
        sorted.sort_by(f64::total_cmp);
        let median = match sorted.len() {
            0 => 0.0,
            l if l % 2 == 1 => sorted[l / 2],
            l => (sorted[l / 2 - 1] + sorted[l / 2]) / 2.0,
        };
        Summary {
            mean,
            sd: var.sqrt(),
            median,
            samples,
        }
    }
}

/// Deterministic pseudo-random token ids (what llama-bench feeds too).
pub fn bench_tokens(n: usize, vocab: usize, salt: u64) -> Vec<u32> {
    let mut s = 0x2545_F491_4F6C_DD1Du64 ^ salt;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            // Stay clear of the special tokens at the start of most vocabularies.
            (1000 + s % (vocab.saturating_sub(1000).max(1) as u64)) as u32 % vocab as u32
        })
        .collect()
}

/// A new sequence holding `depth` committed tokens (llama-bench's `-d`).
/// Their keys and values are zeros ([`KvCache::pad_with_zeros`]): a pass
/// reads the same bytes and does the same arithmetic whatever the values,
/// and filling 30,000 tokens this way takes a fraction of a second instead
/// of minutes of prefill.
fn sequence_at_depth(kv: &mut KvCache, depth: usize) -> Result<usize, EngineError> {
    let seq = kv.add_sequence()?;
    if let Err(e) = kv.pad_with_zeros(seq, depth) {
        kv.remove_sequence(seq);
        return Err(e.into());
    }
    Ok(seq)
}

/// Seconds to prefill `p` tokens in one pass (logits for the last row only)
/// after `depth` committed tokens.
pub fn time_prefill(
    model: &Model,
    kv: &mut KvCache,
    p: usize,
    depth: usize,
    salt: u64,
) -> Result<f64, EngineError> {
    let toks = bench_tokens(p, model.config.vocab_size, salt);
    let seq = sequence_at_depth(kv, depth)?;
    let mut b = Batch::new();
    b.push_chain(seq, depth, &toks, |i| i + 1 == p);
    let t = Instant::now();
    let r = model.forward(&b, kv);
    let s = t.elapsed().as_secs_f64();
    kv.remove_sequence(seq);
    r?;
    Ok(s)
}

/// Seconds to generate `n` tokens one pass at a time after a BOS-like first
/// token (llama-bench's tg), each pass committing its row, after `depth`
/// committed tokens.
pub fn time_decode(
    model: &Model,
    kv: &mut KvCache,
    n: usize,
    depth: usize,
    salt: u64,
) -> Result<f64, EngineError> {
    let toks = bench_tokens(n + 1, model.config.vocab_size, salt);
    let seq = sequence_at_depth(kv, depth)?;
    let run = |kv: &mut KvCache| -> Result<f64, EngineError> {
        let mut b = Batch::new();
        b.push(Row {
            token: toks[0],
            pos: depth,
            seq,
            parent: None,
            logits: false,
        });
        model.forward(&b, kv)?;
        kv.commit(seq, &[0])?;
        let t = Instant::now();
        for (i, &tok) in toks[1..].iter().enumerate() {
            let mut b = Batch::new();
            b.push(Row {
                token: tok,
                pos: depth + i + 1,
                seq,
                parent: None,
                logits: true,
            });
            model.forward(&b, kv)?;
            kv.commit(seq, &[0])?;
        }
        Ok(t.elapsed().as_secs_f64())
    };
    let r = run(kv);
    kv.remove_sequence(seq);
    r
}

/// The greedy token of batch row `row` as decoding finds it: from the
/// head's screen and a few exact logits where the model has a screen,
/// else (or when too many tokens stay candidates) from the full head.
pub fn chosen_token(model: &Model, hidden: &Hidden, row: usize) -> Result<u32, EngineError> {
    let cfg = SamplerConfig::default();
    if let Some(b) = model.head_bounds(hidden, &[row])? {
        let mut exact = |ids: &[u32]| model.logits_of(hidden, row, ids);
        let chosen = choose_bounded(&cfg, &b.ub, b.likeliest[0], 0, &mut exact)?;
        model.record_screen(chosen.is_some());
        if let Some(t) = chosen {
            return Ok(t);
        }
    }
    let l = model.logits(hidden, &[row])?;
    Ok(sample(&cfg, l.row(row).expect("asked for"), &[], 0))
}

/// [`time_decode`] with each pass choosing its greedy token as decoding
/// does ([`chosen_token`]: the head's screen where the model has one)
/// instead of computing every logit.
pub fn time_decode_chosen(
    model: &Model,
    kv: &mut KvCache,
    n: usize,
    depth: usize,
    salt: u64,
) -> Result<f64, EngineError> {
    let toks = bench_tokens(n + 1, model.config.vocab_size, salt);
    let seq = sequence_at_depth(kv, depth)?;
    let run = |kv: &mut KvCache| -> Result<f64, EngineError> {
        let mut t = Instant::now();
        for (i, &tok) in toks.iter().enumerate() {
            let mut b = Batch::new();
            b.push(Row {
                token: tok,
                pos: depth + i,
                seq,
                parent: None,
                logits: true,
            });
            let hidden = model.forward_hidden(&b, kv)?;
            kv.commit(seq, &[0])?;
            if i == 0 {
                // The context pass, as in time_decode, is not timed.
                t = Instant::now();
                continue;
            }
            chosen_token(model, &hidden, 0)?;
        }
        Ok(t.elapsed().as_secs_f64())
    };
    let r = run(kv);
    kv.remove_sequence(seq);
    r
}

/// [`time_rows`] with only the last row's greedy token chosen, through
/// the head's screen where the model has one: a verification pass whose
/// walk reads one row.
pub fn time_rows_chosen(
    model: &Model,
    kv: &mut KvCache,
    rows: usize,
    context: usize,
    reps: usize,
) -> Result<Summary, EngineError> {
    time_chain_passes(model, kv, rows, context, reps, &|_, hidden| {
        chosen_token(model, &hidden, rows - 1).map(|_| ())
    })
}

/// [`time_rows`] with every row's greedy token chosen as a verification
/// pass's walk has them chosen ([`LazyLogits::compute_choosing`]: the head
/// over every row, each row's token picked as its logits are computed,
/// none stored), the screen not used.
pub fn time_rows_every_chosen(
    model: &Model,
    kv: &mut KvCache,
    rows: usize,
    context: usize,
    reps: usize,
) -> Result<Summary, EngineError> {
    let greedy = SamplerConfig::default();
    time_chain_passes(model, kv, rows, context, reps, &|batch, hidden| {
        let mut logits = LazyLogits::new(hidden, batch);
        let choose: Vec<(usize, &SamplerConfig)> = (0..rows).map(|r| (r, &greedy)).collect();
        logits.compute_choosing(model, &[], &choose)
    })
}

/// Times passes of a chain of `rows` rows after `context` committed
/// tokens, each pass's head run by `head` from its hidden states.
fn time_chain_passes(
    model: &Model,
    kv: &mut KvCache,
    rows: usize,
    context: usize,
    reps: usize,
    head: &dyn Fn(&Batch, Hidden) -> Result<(), EngineError>,
) -> Result<Summary, EngineError> {
    let vocab = model.config.vocab_size;
    let seq = kv.add_sequence()?;
    let run = |kv: &mut KvCache| -> Result<Summary, EngineError> {
        if context > 0 {
            let ctx = bench_tokens(context, vocab, 7);
            let mut b = Batch::new();
            let r = b.push_chain(seq, 0, &ctx, |_| false);
            model.forward(&b, kv)?;
            kv.commit(seq, &r.collect::<Vec<_>>())?;
        }
        let toks = bench_tokens(rows, vocab, 11);
        let mut b = Batch::new();
        b.push_chain(seq, context, &toks, |_| true);
        let pass = |kv: &mut KvCache| head(&b, model.forward_hidden(&b, kv)?);
        pass(kv)?; // warm-up
        let mut samples = Vec::with_capacity(reps);
        for _ in 0..reps.max(1) {
            let t = Instant::now();
            pass(kv)?;
            samples.push(t.elapsed().as_secs_f64());
        }
        Ok(Summary::of(samples))
    };
    let r = run(kv);
    kv.remove_sequence(seq);
    r
}

/// Mean seconds and call counts per op of a profiled pass, largest first
/// (as [`Model::take_op_times`] gives them).
pub type OpSeconds = Vec<(&'static str, f64, usize)>;

/// Seconds for one pass of `rows` rows (a chain, each with logits, as a
/// speculative verification asks) after `context` committed tokens, and,
/// when the model is profiling, the mean seconds per op of the timed passes
/// (the context's prefill and the warm-up left out; empty otherwise).
pub fn time_rows(
    model: &Model,
    kv: &mut KvCache,
    rows: usize,
    context: usize,
    reps: usize,
) -> Result<(Summary, OpSeconds), EngineError> {
    let vocab = model.config.vocab_size;
    let seq = kv.add_sequence()?;
    let run = |kv: &mut KvCache| -> Result<(Summary, OpSeconds), EngineError> {
        if context > 0 {
            let ctx = bench_tokens(context, vocab, 7);
            let mut b = Batch::new();
            let r = b.push_chain(seq, 0, &ctx, |_| false);
            model.forward(&b, kv)?;
            kv.commit(seq, &r.collect::<Vec<_>>())?;
        }
        let toks = bench_tokens(rows, vocab, 11);
        let mut b = Batch::new();
        b.push_chain(seq, context, &toks, |_| true);
        model.forward(&b, kv)?; // warm-up
        let _ = model.take_op_times();
        let mut samples = Vec::with_capacity(reps);
        for _ in 0..reps.max(1) {
            let t = Instant::now();
            model.forward(&b, kv)?;
            samples.push(t.elapsed().as_secs_f64());
        }
        let mut ops = model.take_op_times();
        ops.iter_mut().for_each(|o| o.1 /= samples.len() as f64);
        Ok((Summary::of(samples), ops))
    };
    let r = run(kv);
    kv.remove_sequence(seq);
    r
}

/// Runs the passes that need the most memory at context `ctx` with `batch`
/// sequences, so that a process's peak resident memory can be compared with
/// the planner's prediction: the last prefill chunk of one sequence (of
/// `min(chunk, ctx)` rows, after `ctx - rows` committed tokens), then one
/// decode pass with a row for each of `batch` sequences at the end of the
/// context, every row asking for logits, each then sampled. Committed KV is zeros
/// ([`KvCache::pad_with_zeros`]): a pass uses the same memory whatever the
/// values. `kv` must have `batch` free sequence slots of `ctx` tokens.
pub fn run_peak_memory_passes(
    model: &Model,
    kv: &mut KvCache,
    ctx: usize,
    batch: usize,
    chunk: usize,
) -> Result<(), EngineError> {
    let vocab = model.config.vocab_size;
    let seqs = (0..batch.max(1))
        .map(|_| kv.add_sequence())
        .collect::<Result<Vec<_>, _>>()?;
    let run = |kv: &mut KvCache| -> Result<(), EngineError> {
        // The largest prefill chunk, at the end of the context.
        let rows = chunk.min(ctx).max(1);
        kv.pad_with_zeros(seqs[0], ctx - rows)?;
        let mut b = Batch::new();
        let tokens = bench_tokens(rows, vocab, 7);
        b.push_chain(seqs[0], ctx - rows, &tokens, |i| i + 1 == rows);
        model.forward(&b, kv)?;
        // Every sequence decoding its last position.
        let mut b = Batch::new();
        for (i, &seq) in seqs.iter().enumerate() {
            kv.pad_with_zeros(seq, ctx - 1 - kv.seq_len(seq))?;
            b.push(Row {
                token: bench_tokens(1, vocab, i as u64)[0],
                pos: ctx - 1,
                seq,
                parent: None,
                logits: true,
            });
        }
        let logits = model.forward(&b, kv)?;
        // Sampled as generation would, with penalties and nucleus sampling.
        let cfg = SamplerConfig {
            temperature: 0.8,
            top_p: 0.9,
            repetition_penalty: 1.1,
            ..SamplerConfig::default()
        };
        let history = bench_tokens(64, vocab, 3);
        for i in 0..b.len() {
            if let Some(row) = logits.row(i) {
                crate::sampler::sample(&cfg, row, &history, ctx - 1);
            }
        }
        Ok(())
    };
    let r = run(kv);
    for &seq in &seqs {
        kv.remove_sequence(seq);
    }
    r
}
