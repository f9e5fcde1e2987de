//! A decoder (any GGUF chat or base model) as an embedder, as llama.cpp's
//! `--pooling mean|last` offers: the texts run as prompts, each in its own
//! sequence of one pass, and their final normed hidden states are pooled.
//! Nothing is kept: each text's sequence is removed after its pass.

use spindle_model::encoder::{normalize, pool, Pooling};
use spindle_model::{Batch, KvCache, Model};

use crate::error::RequestError;

/// One vector per text (`texts` are token ids, BOS included as the
/// tokenizer adds it), in passes of at most `max_batch_tokens` rows. `kv`
/// must hold the longest text; it is left empty.
pub fn embed_with_decoder(
    model: &Model,
    kv: &mut KvCache,
    texts: &[Vec<u32>],
    pooling: Pooling,
    normalized: bool,
    max_batch_tokens: usize,
) -> Result<Vec<Vec<f32>>, RequestError> {
    let fault = |e: spindle_model::ModelError| RequestError::internal(e.to_string());
    if let Some((i, t)) = texts
        .iter()
        .enumerate()
        .find(|(_, t)| t.is_empty() || t.len() > kv.max_len())
    {
        return Err(RequestError::invalid(
            "input",
            format!(
                "input {i} has {} tokens; this model embeds 1 to {} tokens",
                t.len(),
                kv.max_len()
            ),
        ));
    }
    let mut out = Vec::with_capacity(texts.len());
    let mut start = 0;
    while start < texts.len() {
        let mut batch = Batch::default();
        let mut seqs = Vec::new();
        let mut spans = Vec::new();
        let mut rows = 0;
        while start + seqs.len() < texts.len() && kv.free_sequences() > 0 {
            let t = &texts[start + seqs.len()];
            if !seqs.is_empty() && rows + t.len() > max_batch_tokens {
                break;
            }
            let seq = kv.add_sequence().map_err(fault)?;
            // Mean pooling reads every row, last-token pooling one.
            let last = t.len() - 1;
            let span = batch.push_chain(seq, 0, t, |i| pooling != Pooling::Last || i == last);
            rows += t.len();
            seqs.push(seq);
            spans.push(span);
        }
        let hidden = model.forward_hidden(&batch, kv);
        for &seq in &seqs {
            kv.remove_sequence(seq);
        }
        let hidden = hidden.map_err(fault)?;
        let e = hidden.n_embd;
        for span in &spans {
            // The span's stored rows, in order (rows not asked for are absent).
            let first = hidden
                .rows
                .iter()
                .position(|&r| span.contains(&r))
                .expect("rows of the span");
            let count = hidden.rows[first..]
                .iter()
                .take_while(|&&r| span.contains(&r))
                .count();
            let mut v = pool(&hidden.data, first..first + count, e, pooling);
            if normalized {
                normalize(&mut v);
            }
            out.push(v);
        }
        start += seqs.len();
    }
    Ok(out)
}
