//! One encoder pass over many texts at once, packed without padding: the
//! texts' rows one after another, each text attending only to its own rows.
//!
//! Every step is per row (embeddings, matmuls, norms, GELU) or per text
//! (attention), and the matmuls give each row the same bits whatever else is
//! in the pass, so a text's output does not depend on what shares its pass.

use std::ops::Range;

use spindle_kernels::activation::gelu_erf;
use spindle_kernels::encoder_attention::text_attention;
use spindle_kernels::norm::layer_norm_inplace;

use super::weights::{EncoderLayer, EncoderMatrix};
use super::Encoder;
use crate::error::ModelError;
use crate::parallel::{for_each_task, DisjointChunks};

/// A text's ids and segments, as the tokenizer gave them.
#[derive(Debug, Clone, Copy)]
pub struct EncoderInput<'a> {
    pub ids: &'a [u32],
    /// Segment of each id; all 0 when `None`.
    pub type_ids: Option<&'a [u32]>,
}

/// The last layer's rows of every text, and which rows are whose.
pub struct EncoderRows {
    pub hidden: Vec<f32>,
    pub spans: Vec<Range<usize>>,
}

impl Encoder {
    /// The final hidden states of `inputs`, in one pass.
    pub fn hidden_states(&self, inputs: &[EncoderInput<'_>]) -> Result<EncoderRows, ModelError> {
        let c = &self.config;
        let h = c.hidden;
        let mut spans = Vec::with_capacity(inputs.len());
        let mut total = 0;
        for (i, input) in inputs.iter().enumerate() {
            self.check_input(i, input)?;
            spans.push(total..total + input.ids.len());
            total += input.ids.len();
        }
        let mut x = vec![0.0f32; total * h];
        self.embed_rows(inputs, &mut x)?;
        let mut buf = Buffers::new(total, h, c.ffn);
        for layer in &self.weights.layers {
            self.layer(layer, &spans, &mut x, &mut buf)?;
        }
        Ok(EncoderRows { hidden: x, spans })
    }

    fn check_input(&self, index: usize, input: &EncoderInput<'_>) -> Result<(), ModelError> {
        let c = &self.config;
        if input.ids.is_empty() {
            return Err(ModelError::InvalidBatch(format!(
                "input {index} has no tokens"
            )));
        }
        if input.ids.len() > c.max_positions {
            return Err(ModelError::InputTooLong {
                index,
                tokens: input.ids.len(),
                max: c.max_positions,
            });
        }
        if let Some(&id) = input.ids.iter().find(|&&id| id as usize >= c.vocab) {
            return Err(ModelError::InvalidBatch(format!(
                "input {index} holds token id {id}, past the vocabulary of {}",
                c.vocab
            )));
        }
        if let Some(types) = input.type_ids {
            if types.len() != input.ids.len()
                || types.iter().any(|&t| t as usize >= c.type_vocab.max(1))
            {
                return Err(ModelError::InvalidBatch(format!(
                    "input {index}: its segment ids must be one per token, below {}",
                    c.type_vocab.max(1)
                )));
            }
        }
        Ok(())
    }

    /// `LayerNorm(word + segment + position)` for every row.
    fn embed_rows(&self, inputs: &[EncoderInput<'_>], x: &mut [f32]) -> Result<(), ModelError> {
        let h = self.config.hidden;
        let w = &self.weights;
        let row_bytes = w.tokens.n_bytes() / w.tokens.rows;
        let mut rows = x.chunks_exact_mut(h);
        for input in inputs {
            for (pos, &id) in input.ids.iter().enumerate() {
                let row = rows.next().expect("one row per token");
                let id = id as usize;
                spindle_kernels::dequantize(
                    w.tokens.ty,
                    &w.tokens.data[id * row_bytes..(id + 1) * row_bytes],
                    row,
                )?;
                let segment = input.type_ids.map_or(0, |t| t[pos] as usize);
                let types = &w.token_types[segment * h..(segment + 1) * h];
                let positions = &w.positions[pos * h..(pos + 1) * h];
                // As BERT adds them: (word + segment) + position.
                for ((v, &t), &p) in row.iter_mut().zip(types).zip(positions) {
                    *v = (*v + t) + p;
                }
                layer_norm_inplace(row, &w.embed_norm.0, &w.embed_norm.1, self.config.eps);
            }
        }
        Ok(())
    }

    fn layer(
        &self,
        l: &EncoderLayer,
        spans: &[Range<usize>],
        x: &mut [f32],
        b: &mut Buffers,
    ) -> Result<(), ModelError> {
        let c = &self.config;
        let (h, n) = (c.hidden, spans.last().map_or(0, |s| s.end));
        self.linear(&l.qkv, &l.qkv_bias, x, n, &mut b.qkv)?;
        self.attention(spans, &b.qkv, &mut b.attn);
        // The other biases are added inside the next row step (one pass
        // over each buffer fewer; the same operations in the same order).
        self.matmul(&l.out, &b.attn, n, &mut b.proj)?;
        let proj = &b.proj;
        self.rows_parallel(x, h, |r, row| {
            let p = &proj[r * h..(r + 1) * h];
            for ((v, &o), &bias) in row.iter_mut().zip(p).zip(&l.out_bias) {
                *v += o + bias;
            }
            layer_norm_inplace(row, &l.attn_norm.0, &l.attn_norm.1, c.eps);
        });
        self.matmul(&l.up, x, n, &mut b.up)?;
        self.rows_parallel(&mut b.up, c.ffn, |_, row| {
            for (v, &bias) in row.iter_mut().zip(&l.up_bias) {
                *v += bias;
            }
            gelu_erf(self.isa, row);
        });
        self.matmul(&l.down, &b.up, n, &mut b.proj)?;
        let proj = &b.proj;
        self.rows_parallel(x, h, |r, row| {
            let p = &proj[r * h..(r + 1) * h];
            for ((v, &o), &bias) in row.iter_mut().zip(p).zip(&l.down_bias) {
                *v += o + bias;
            }
            layer_norm_inplace(row, &l.out_norm.0, &l.out_norm.1, c.eps);
        });
        Ok(())
    }

    /// `out = x · mᵀ` for `n` rows.
    fn matmul(
        &self,
        m: &EncoderMatrix,
        x: &[f32],
        n: usize,
        out: &mut [f32],
    ) -> Result<(), ModelError> {
        let out = &mut out[..n * m.rows()];
        match m {
            EncoderMatrix::Panels { m, .. } => {
                spindle_kernels::float_panels::matmul_panels(self.isa, m, x, n, out, &self.pool)?
            }
            EncoderMatrix::Quantized(m) => spindle_kernels::matmul::matmul_with(
                self.isa,
                Default::default(),
                &m.view(),
                x,
                n,
                out,
                &self.pool,
            )?,
        }
        Ok(())
    }

    /// `out = x · mᵀ + bias` for `n` rows.
    pub(super) fn linear(
        &self,
        m: &EncoderMatrix,
        bias: &[f32],
        x: &[f32],
        n: usize,
        out: &mut [f32],
    ) -> Result<(), ModelError> {
        self.matmul(m, x, n, out)?;
        self.rows_parallel(&mut out[..n * m.rows()], m.rows(), |_, row| {
            for (v, &b) in row.iter_mut().zip(bias) {
                *v += b;
            }
        });
        Ok(())
    }

    /// `f(r, row r)` for every row of `data` (rows of `width`), in blocks
    /// of rows spread over the threads; each row's result is the same
    /// whichever thread runs it.
    fn rows_parallel(&self, data: &mut [f32], width: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
        const BLOCK_ROWS: usize = 32;
        let n = data.len() / width;
        let blocks = DisjointChunks::new(data, BLOCK_ROWS * width);
        for_each_task(&self.pool, n.div_ceil(BLOCK_ROWS), |t| {
            // SAFETY: each task is one block, and each block one task.
            let block = unsafe { blocks.chunk_mut(t) };
            for (i, row) in block.chunks_exact_mut(width).enumerate() {
                f(t * BLOCK_ROWS + i, row);
            }
        });
    }

    /// Each text's heads, one task per text.
    fn attention(&self, spans: &[Range<usize>], qkv: &[f32], out: &mut [f32]) {
        let c = &self.config;
        let h = c.hidden;
        let rows = DisjointChunks::new(out, h);
        for_each_task(&self.pool, spans.len(), |t| {
            let span = spans[t].clone();
            // SAFETY: the text's rows are one run of whole chunks (rows),
            // and each text is one task.
            let out = unsafe { rows.run_mut(span.start, span.end) };
            let qkv = &qkv[span.start * 3 * h..span.end * 3 * h];
            text_attention(self.isa, qkv, span.len(), c.heads, out);
        });
    }
}

/// The pass's scratch, sized once for its rows.
struct Buffers {
    qkv: Vec<f32>,
    attn: Vec<f32>,
    proj: Vec<f32>,
    up: Vec<f32>,
}

impl Buffers {
    fn new(n: usize, h: usize, ffn: usize) -> Buffers {
        Buffers {
            qkv: vec![0.0; n * 3 * h],
            attn: vec![0.0; n * h],
            proj: vec![0.0; n * h],
            up: vec![0.0; n * ffn],
        }
    }
}
