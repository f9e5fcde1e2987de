//! Scoring text: the log-probability of each actual next token, and the
//! perplexity protocol of llama.cpp's `perplexity` tool.

use spindle_model::{Batch, KvCache, Model};

use crate::error::EngineError;

/// One scored position: the actual next token and the best alternatives.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PositionScore {
    pub id: u32,
    pub logprob: f64,
    pub top: Vec<TokenLogprob>,
}

#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct TokenLogprob {
    pub id: u32,
    pub logprob: f64,
}

/// Log-softmax of one row of logits, in f64.
pub fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let z: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    let lz = max + z.ln();
    logits.iter().map(|&l| l as f64 - lz).collect()
}

/// The `k` most likely tokens of a log-probability row, best first (lowest id on ties).
pub fn top_k(logprobs: &[f64], k: usize) -> Vec<TokenLogprob> {
    let mut idx: Vec<u32> = (0..logprobs.len() as u32).collect();
    let k = k.min(idx.len());
    let cmp = |a: &u32, b: &u32| {
        logprobs[*b as usize]
            .total_cmp(&logprobs[*a as usize])
            .then(a.cmp(b))
    };
    if k == 0 {
        return vec![];
    }
    if k < idx.len() {
        idx.select_nth_unstable_by(k - 1, cmp);
        idx.truncate(k);
    }
    idx.sort_by(cmp);
    idx.into_iter()
        .map(|id| TokenLogprob {
            id,
            logprob: logprobs[id as usize],
        })
        .collect()
}

/// Rows per scoring pass: each returns a full row of logits (1 MiB for a
/// 262k vocabulary), so long texts are scored in chunks of this many.
pub const SCORE_CHUNK: usize = 512;

/// Scores every position after the first of `tokens` in one pass (chunks of
/// [`SCORE_CHUNK`] for long inputs), calling `visit(i, logprobs)`
/// with the log-probabilities predicting token `i + 1`, for `i` in `from..len-1`.
pub fn score_positions(
    model: &Model,
    kv: &mut KvCache,
    tokens: &[u32],
    from: usize,
    mut visit: impl FnMut(usize, &[f64]),
) -> Result<usize, EngineError> {
    if tokens.len() < 2 {
        return Err(EngineError::TooFewToScore(tokens.len()));
    }
    if tokens.len() > kv.max_len() {
        return Err(EngineError::PromptTooLong {
            tokens: tokens.len(),
            ctx: kv.max_len(),
        });
    }
    let seq = kv.add_sequence()?;
    let mut passes = 0;
    let result = (|| {
        let last = tokens.len() - 1;
        for (c, chunk) in tokens.chunks(SCORE_CHUNK).enumerate() {
            let base = c * SCORE_CHUNK;
            let mut batch = Batch::new();
            let rows = batch.push_chain(seq, kv.seq_len(seq), chunk, |i| {
                let p = base + i;
                p >= from && p < last
            });
            let logits = model.forward(&batch, kv)?;
            kv.commit(seq, &rows.clone().collect::<Vec<_>>())?;
            passes += 1;
            for (j, &r) in logits.rows.iter().enumerate() {
                let lp = log_softmax(&logits.data[j * logits.vocab..(j + 1) * logits.vocab]);
                visit(base + r, &lp);
            }
        }
        Ok(passes)
    })();
    kv.remove_sequence(seq);
    result
}

/// For each position after the first: the actual token's log-probability and
/// the top `k` alternatives.
pub fn score(
    model: &Model,
    kv: &mut KvCache,
    tokens: &[u32],
    k: usize,
) -> Result<Vec<PositionScore>, EngineError> {
    let mut out = Vec::with_capacity(tokens.len().saturating_sub(1));
    score_positions(model, kv, tokens, 0, |i, lp| {
        let id = tokens[i + 1];
        out.push(PositionScore {
            id,
            logprob: lp[id as usize],
            top: top_k(lp, k),
        });
    })?;
    Ok(out)
}

/// Result of [`perplexity`].
#[derive(Debug, Clone, serde::Serialize)]
pub struct Perplexity {
    pub perplexity: f64,
    pub chunks: usize,
    pub tokens_scored: usize,
}

/// llama.cpp's protocol: chunks of `ctx` tokens, each starting with BOS, the
/// second half of each chunk scored.
pub fn perplexity(
    model: &Model,
    kv: &mut KvCache,
    tokens: &[u32],
    ctx: usize,
    bos: Option<u32>,
    mut progress: impl FnMut(usize, usize, f64),
) -> Result<Perplexity, EngineError> {
    let n_chunks = tokens.len() / ctx.max(1);
    if ctx < 4 || n_chunks == 0 {
        return Err(EngineError::TextTooShort {
            tokens: tokens.len(),
            ctx,
        });
    }
    let first = ctx / 2;
    let mut nll = 0.0f64;
    let mut count = 0usize;
    for c in 0..n_chunks {
        let mut chunk = tokens[c * ctx..(c + 1) * ctx].to_vec();
        if let Some(b) = bos {
            chunk[0] = b;
        }
        score_positions(model, kv, &chunk, first, |i, lp| {
            nll -= lp[chunk[i + 1] as usize];
            count += 1;
        })?;
        progress(c + 1, n_chunks, (nll / count as f64).exp());
    }
    Ok(Perplexity {
        perplexity: (nll / count as f64).exp(),
        chunks: n_chunks,
        tokens_scored: count,
    })
}
