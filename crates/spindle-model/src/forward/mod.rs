//! The decoder: one pass of a `Batch` through every layer, top to bottom.

mod attention;
mod experts;
mod head;
mod row_ops;
mod spare_logits;

use std::ops::Range;

use spindle_kernels::activation::{gated, soft_cap};
use spindle_kernels::norm::{rms_norm, rms_norm_inplace};
use spindle_kernels::quant::panels::panel_row;
use spindle_kernels::quant::q8_act::ActRounding;
use spindle_kernels::quant::vertical::dequantize_vertical_row;
use spindle_kernels::rope::RopeTable;
use spindle_kernels::simd::{detected_isa, Isa};
use spindle_kernels::{ThreadPool, WeightLayout};

use crate::batch::{Batch, SeqId};
use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::kv_cache::{KvCache, KvLayout, KvType, BLOCK};
use crate::parallel::{for_each_row, for_each_row_range, for_each_task, DisjointChunks};
use crate::profile::{OpClock, OpTimes};
use crate::weights::{FeedForward, Matrix, Weights};

pub use head::{ScreenCounts, CALIBRATION_TEXT};
pub use spare_logits::spare_bytes as spare_logits_bytes;
pub use spare_logits::MAX_SPARE_BYTES as SPARE_LOGITS_MAX_BYTES;

/// A model ready to run: configuration, weights, rope tables, threads.
pub struct Model {
    pub config: ModelConfig,
    pub weights: Weights,
    /// One rope table per layer (bases differ between sliding and global layers).
    ropes: Vec<RopeTable>,
    /// LongRoPE's tables for caches longer than the original context they
    /// take over at (Phi-3).
    long_ropes: Option<(usize, Vec<RopeTable>)>,
    pool: ThreadPool,
    isa: Isa,
    /// How activations are rounded for quantized weights.
    act_rounding: ActRounding,
    profiling: bool,
    op_times: OpTimes,
    buffers: std::sync::Mutex<PassBuffers>,
    /// The output head's screen (see `head.rs`).
    screen: head::ScreenSlot,
    /// [`Weights::distinct_bytes`], counted once at construction.
    weights_bytes: usize,
}

/// Buffers reused from pass to pass, so a pass allocates nothing once they
/// have grown to its size (every one is fully overwritten before it is read).
#[derive(Default)]
struct PassBuffers {
    h: Vec<f32>,
    xn: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    o: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    hn: Vec<f32>,
    experts: experts::ExpertBuffers,
}

/// What a loaded model holds in memory, by part (`/metrics`,
/// `spindle:memory_bytes`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ModelMemory {
    /// Every distinct weight tensor's bytes (a tied head counted once).
    pub weights: usize,
    /// The output head's screen, once built.
    pub head_screen: usize,
    /// The dense pass buffers kept from pass to pass (they grow to the
    /// largest pass run, then stay).
    pub pass_buffers: usize,
}

impl PassBuffers {
    fn bytes(&self) -> usize {
        [
            &self.h, &self.xn, &self.q, &self.k, &self.v, &self.attn, &self.o, &self.gate,
            &self.up, &self.hn,
        ]
        .iter()
        .map(|v| v.capacity() * std::mem::size_of::<f32>())
        .sum()
    }
}

/// Logits of the rows of a pass that asked for them.
#[derive(Debug, Clone)]
pub struct Logits {
    pub vocab: usize,
    /// Batch row index of each stored row, in batch order.
    pub rows: Vec<usize>,
    pub data: Vec<f32>,
}

impl Logits {
    /// The logits of batch row `row`, if it asked for them.
    pub fn row(&self, row: usize) -> Option<&[f32]> {
        let i = self.rows.iter().position(|&r| r == row)?;
        Some(&self.data[i * self.vocab..(i + 1) * self.vocab])
    }
}

impl Drop for Logits {
    fn drop(&mut self) {
        spare_logits::give_back(std::mem::take(&mut self.data));
    }
}

/// Final normed hidden states of the rows of a pass that asked for logits
/// (see [`Model::forward_hidden`]).
#[derive(Debug, Clone)]
pub struct Hidden {
    pub n_embd: usize,
    /// Batch row index of each stored row, in batch order.
    pub rows: Vec<usize>,
    pub data: Vec<f32>,
}

impl Hidden {
    /// The hidden state of batch row `row`, if it asked for logits.
    pub fn row(&self, row: usize) -> Option<&[f32]> {
        let i = self.rows.iter().position(|&r| r == row)?;
        Some(&self.data[i * self.n_embd..(i + 1) * self.n_embd])
    }

    /// Whether batch row `row`'s hidden state is free of NaN and infinity
    /// (true for a row without one). Corrupt weights, or values past f32's
    /// range, make it NaN, and its logits would be meaningless: checking
    /// `n_embd` values here costs nothing beside the head's `vocab`.
    pub fn row_is_finite(&self, row: usize) -> bool {
        self.row(row).is_none_or(all_finite)
    }

    /// The first batch row whose hidden state has a NaN or an infinity.
    pub fn first_non_finite_row(&self) -> Option<usize> {
        self.rows
            .iter()
            .zip(self.data.chunks_exact(self.n_embd.max(1)))
            .find(|(_, h)| !all_finite(h))
            .map(|(&r, _)| r)
    }
}

fn all_finite(values: &[f32]) -> bool {
    values.iter().all(|v| v.is_finite())
}

/// Per-row facts of a validated batch.
struct RowPlan {
    /// Committed length of the row's sequence.
    ctx_len: usize,
    /// Batch rows the row attends to (ancestors root first, then itself).
    path: Vec<usize>,
}

impl Model {
    pub fn new(config: ModelConfig, weights: Weights, n_threads: usize) -> Self {
        use crate::config::RopeScaling;
        let (factors, long) = match &config.rope_scaling {
            RopeScaling::LongRope {
                short,
                long,
                original_context,
                ..
            } => (Some(short.clone()), Some((*original_context, long.clone()))),
            _ => (
                weights
                    .rope_freqs
                    .clone()
                    .or_else(|| config.llama3_freq_factors())
                    .or_else(|| config.yarn_freq_factors()),
                None,
            ),
        };
        let linear = match config.rope_scaling {
            RopeScaling::Linear { factor } => factor,
            _ => 1.0,
        };
        let tables = |factors: Option<&[f32]>| -> Vec<RopeTable> {
            (0..config.n_layers)
                .map(|l| {
                    let sliding = config.layer_sliding[l];
                    // Gemma 3 scales only its global layers.
                    let scale = if sliding { 1.0 } else { linear };
                    RopeTable::new(
                        config.rope_style,
                        config.layer_rope_base(l),
                        config.head_dim,
                        factors,
                        scale,
                    )
                })
                .collect()
        };
        let ropes = tables(factors.as_deref());
        let long_ropes = long.map(|(original, f)| (original, tables(Some(&f))));
        Model {
            weights_bytes: weights.distinct_bytes(),
            config,
            weights,
            ropes,
            long_ropes,
            pool: ThreadPool::new(n_threads.max(1)),
            isa: detected_isa(),
            act_rounding: ActRounding::default(),
            profiling: std::env::var("SPINDLE_PROFILE").is_ok_and(|v| v == "1"),
            op_times: OpTimes::default(),
            buffers: std::sync::Mutex::new(PassBuffers::default()),
            screen: head::ScreenSlot::default(),
        }
    }

    /// The same model running only the decoder layers in `keep` (in
    /// order), sharing this one's weights: a self-draft model, cheaper per
    /// token and close to the full model when the skipped layers matter
    /// little. Errors when `keep` is empty, unordered or out of range.
    pub fn with_layers(&self, keep: &[usize], n_threads: usize) -> Result<Model, ModelError> {
        let n = self.config.n_layers;
        if keep.is_empty() || keep.windows(2).any(|w| w[0] >= w[1]) || keep.iter().any(|&l| l >= n)
        {
            return Err(ModelError::InvalidBatch(format!(
                "layers to keep {keep:?} must be increasing indices below {n}"
            )));
        }
        let mut config = self.config.clone();
        config.n_layers = keep.len();
        config.layer_sliding = keep.iter().map(|&l| self.config.layer_sliding[l]).collect();
        let mut weights = self.weights.clone();
        weights.layers = keep
            .iter()
            .map(|&l| self.weights.layers[l].clone())
            .collect();
        let mut model = Model::new(config, weights, n_threads);
        model.isa = self.isa;
        model.act_rounding = self.act_rounding;
        Ok(model)
    }

    /// Runs every kernel on `isa` instead of the detected one (for tests
    /// that compare paths). Errors when this CPU lacks it.
    pub fn set_isa(&mut self, isa: Isa) -> Result<(), ModelError> {
        if !isa.is_available() {
            return Err(ModelError::Kernel(
                spindle_kernels::KernelError::Unsupported {
                    what: format!("instruction set {isa} on this CPU"),
                },
            ));
        }
        self.isa = isa;
        Ok(())
    }

    /// Rounds activations for quantized weights as `rounding` says
    /// (default [`ActRounding::Block32`]; [`ActRounding::Ggml`] to compare
    /// with llama.cpp number for number).
    pub fn set_act_rounding(&mut self, rounding: ActRounding) {
        self.act_rounding = rounding;
    }

    pub fn act_rounding(&self) -> ActRounding {
        self.act_rounding
    }

    /// Turns per-op timing on or off (see [`Model::take_op_times`]).
    pub fn set_profiling(&mut self, on: bool) {
        self.profiling = on;
    }

    /// Seconds and counts per op since the last call, largest first.
    pub fn take_op_times(&self) -> Vec<(&'static str, f64, usize)> {
        self.op_times.take()
    }

    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// What the model holds in memory now, by part.
    pub fn memory(&self) -> ModelMemory {
        ModelMemory {
            weights: self.weights_bytes,
            head_screen: self.head_screen_bytes(),
            pass_buffers: self.buffers.lock().map_or(0, |b| b.bytes()),
        }
    }

    pub fn n_threads(&self) -> usize {
        self.pool.n_threads()
    }

    /// The KV layout of this model for `max_seqs` sequences of up to
    /// `max_len` tokens: sliding-window layers hold only their window.
    pub fn kv_layout(&self, ty: KvType, max_len: usize, max_seqs: usize) -> KvLayout {
        let cfg = &self.config;
        KvLayout {
            ty,
            kv_dim: cfg.kv_dim(),
            windows: (0..cfg.n_layers)
                .map(|l| cfg.sliding_window.filter(|_| cfg.layer_sliding[l]))
                .collect(),
            max_len,
            max_seqs,
            rollback: 0,
            pool_tokens: None,
        }
    }

    /// A KV cache for this model holding `max_seqs` sequences of up to
    /// `max_len` tokens, all allocated now.
    pub fn new_kv_cache(&self, ty: KvType, max_len: usize, max_seqs: usize) -> KvCache {
        KvCache::new(self.kv_layout(ty, max_len, max_seqs))
    }

    /// The KV type that keeps this model's accuracy: f32 for float32 weights
    /// (reference models), f16 otherwise.
    pub fn default_kv_type(&self) -> KvType {
        if self
            .weights
            .layers
            .first()
            .is_some_and(|l| l.wq.ty == spindle_formats::GgmlType::F32)
        {
            KvType::F32
        } else {
            KvType::F16
        }
    }

    fn plan(&self, batch: &Batch, kv: &KvCache) -> Result<Vec<RowPlan>, ModelError> {
        let invalid = |m: String| Err(ModelError::InvalidBatch(m));
        let mut plans: Vec<RowPlan> = Vec::with_capacity(batch.len());
        for (i, row) in batch.rows.iter().enumerate() {
            let Some(seq) = kv.seq(row.seq) else {
                return invalid(format!("row {i}: sequence {} does not exist", row.seq));
            };
            if row.token as usize >= self.config.vocab_size {
                return invalid(format!(
                    "row {i}: token {} is outside the vocabulary of {}",
                    row.token, self.config.vocab_size
                ));
            }
            // A root row follows the committed context: all of it, or (a
            // branch from earlier, e.g. a content-free prompt) its first
            // `pos` positions; its descendants see what it sees.
            let (want_pos, ctx_len) = match row.parent {
                None if row.pos < seq.len => {
                    self.check_branch_kept(kv, row.seq, row.pos)
                        .map_err(|m| ModelError::InvalidBatch(format!("row {i}: {m}")))?;
                    (row.pos, row.pos)
                }
                None => (seq.len, seq.len),
                Some(p) if p < i && batch.rows[p].seq == row.seq => {
                    (batch.rows[p].pos + 1, plans[p].ctx_len)
                }
                Some(p) => {
                    return invalid(format!(
                        "row {i}: parent {p} is not an earlier row of sequence {}",
                        row.seq
                    ))
                }
            };
            if row.pos != want_pos {
                return invalid(format!(
                    "row {i}: position {} should be {want_pos}",
                    row.pos
                ));
            }
            if row.pos >= kv.max_len() {
                return Err(ModelError::ContextFull {
                    seq: row.seq,
                    len: row.pos + 1,
                    ctx: kv.max_len(),
                });
            }
            plans.push(RowPlan {
                ctx_len,
                path: batch.path(i),
            });
        }
        Ok(plans)
    }

    /// Whether every layer still holds the committed positions a branch
    /// from position `pos` of `seq` attends to (sliding layers may have
    /// dropped blocks further than a window back from the end).
    fn check_branch_kept(&self, kv: &KvCache, seq: SeqId, pos: usize) -> Result<(), String> {
        use crate::kv_cache::BLOCK;
        if pos == 0 {
            return Ok(());
        }
        for l in 0..self.config.n_layers {
            let from = match self.config.layer_sliding[l] {
                true => self
                    .config
                    .sliding_window
                    .map_or(0, |w| (pos + 1).saturating_sub(w)),
                false => 0,
            };
            let table = kv.block_table(seq, l);
            if (from / BLOCK..=(pos - 1) / BLOCK).any(|b| table.get(b).copied().flatten().is_none())
            {
                return Err(format!(
                    "a branch from position {pos} reads KV that layer {l} no longer keeps"
                ));
            }
        }
        Ok(())
    }

    /// Runs a batch through the model. Writes every row's K/V into the cache's
    /// scratch (see [`KvCache::commit`]) and returns logits for the rows that
    /// asked for them.
    pub fn forward(&self, batch: &Batch, kv: &mut KvCache) -> Result<Logits, ModelError> {
        let hidden = self.forward_hidden(batch, kv)?;
        if let Some(row) = hidden.first_non_finite_row() {
            return Err(ModelError::NonFiniteActivations { row });
        }
        self.logits(&hidden, &hidden.rows)
    }

    /// [`Model::forward`] without the output head: the final normed hidden
    /// state of every row that asked for logits. [`Model::logits`] then
    /// computes logits for any subset of them, bit-identical to what
    /// `forward` returns for those rows, so a caller that turns out to need
    /// only some rows (a speculative walk that stops early) does not pay the
    /// head for the others.
    pub fn forward_hidden(&self, batch: &Batch, kv: &mut KvCache) -> Result<Hidden, ModelError> {
        let cfg = &self.config;
        let plans = self.plan(batch, kv)?;
        let mut clock = OpClock::new(self.profiling);
        let n = batch.len();
        let (e, qd, kvd) = (cfg.n_embd, cfg.q_dim(), cfg.kv_dim());
        let w = &self.weights;

        // Embeddings.
        let mut guard = self.buffers.lock().unwrap_or_else(|p| p.into_inner());
        let PassBuffers {
            h,
            xn,
            q,
            k,
            v,
            attn,
            o,
            gate,
            up,
            experts: expert_buffers,
            ..
        } = &mut *guard;
        for (buf, len) in [
            (&mut *h, n * e),
            (&mut *xn, n * e),
            (&mut *q, n * qd),
            (&mut *k, n * kvd),
            (&mut *v, n * kvd),
            (&mut *attn, n * qd),
            (&mut *o, n * e),
            (&mut *gate, if cfg.moe.is_some() { 0 } else { n * cfg.n_ff }),
            (&mut *up, if cfg.moe.is_some() { 0 } else { n * cfg.n_ff }),
        ] {
            buf.resize(len, 0.0);
        }
        let row_bytes = w.embed.data.len() / w.embed.rows;
        // A tied head in panels: each row gathered into the file's bytes.
        let mut file_row = Vec::new();
        for (i, row) in batch.rows.iter().enumerate() {
            let t = row.token as usize;
            let (src, dst) = (
                &w.embed.data[t * row_bytes..(t + 1) * row_bytes],
                &mut h[i * e..(i + 1) * e],
            );
            match w.embed.layout {
                WeightLayout::Gguf => spindle_kernels::dequantize(w.embed.ty, src, dst)?,
                // A head tied to the embeddings, rewritten with the layers.
                WeightLayout::Vertical => {
                    dequantize_vertical_row(w.embed.ty, w.embed.cols, src, dst)?
                }
                WeightLayout::Panels => {
                    file_row.resize(row_bytes, 0);
                    panel_row(w.embed.ty, w.embed.cols, &w.embed.data, t, &mut file_row)?;
                    spindle_kernels::dequantize(w.embed.ty, &file_row, dst)?
                }
            }
        }
        if cfg.arch.embed_scale {
            let s = (e as f32).sqrt();
            h.iter_mut().for_each(|v| *v *= s);
        }

        kv.scratch.rows = batch.rows.iter().map(|r| (r.seq, r.pos, r.token)).collect();
        clock.mark("embedding");

        for (l, lw) in w.layers.iter().enumerate() {
            // Attention block.
            self.norm_rows(h, &lw.attn_norm, xn, n);
            clock.mark("norms, residual");
            self.matmul_shared(&mut [(&lw.wq, q), (&lw.wk, k), (&lw.wv, v)], xn, n)?;
            clock.mark("matmul qkv");
            add_bias(q, lw.bq.as_deref());
            add_bias(k, lw.bk.as_deref());
            add_bias(v, lw.bv.as_deref());
            self.qk_norm_rope(l, batch, q, k, kv.max_len());
            let scratch = &mut kv.scratch.layers[l];
            scratch.k.resize(n * kvd);
            scratch.v.resize(n * kvd);
            scratch.k.write(0, k);
            scratch.v.write(0, v);
            clock.mark("qk-norm, rope, kv write");
            self.attention(l, batch, &plans, kv, q, attn);
            clock.mark("attention");
            self.matmul(&lw.wo, attn, n, o)?;
            add_bias(o, lw.bo.as_deref());
            clock.mark("matmul o");
            self.add_residual(h, o, lw.post_attn_norm.as_deref(), n);

            // Feed-forward block.
            self.norm_rows(h, &lw.ffn_norm, xn, n);
            clock.mark("norms, residual");
            match (&lw.ffn, &cfg.moe) {
                (FeedForward::Experts(x), Some(moe)) => {
                    self.experts_ffn(x, moe, xn, n, o, expert_buffers)?;
                    clock.mark("experts");
                }
                (
                    FeedForward::Dense {
                        gate: wg,
                        up: wu,
                        down: wd,
                    },
                    _,
                ) => {
                    self.matmul_shared(&mut [(wg, gate), (wu, up)], xn, n)?;
                    clock.mark("matmul gate+up");
                    self.gated_rows(gate, up, n);
                    clock.mark("activation");
                    self.matmul(wd, gate, n, o)?;
                    clock.mark("matmul down");
                }
                (FeedForward::Experts(_), None) => {
                    return Err(ModelError::InvalidBatch(
                        "a layer has experts but the config has none".into(),
                    ))
                }
            }
            self.add_residual(h, o, lw.post_ffn_norm.as_deref(), n);
        }

        clock.mark("norms, residual");
        let rows: Vec<usize> = (0..n).filter(|&i| batch.rows[i].logits).collect();
        let mut data = vec![0.0f32; rows.len() * e];
        for (j, &i) in rows.iter().enumerate() {
            rms_norm(
                &h[i * e..(i + 1) * e],
                &w.output_norm,
                cfg.rms_eps,
                &mut data[j * e..(j + 1) * e],
            );
        }
        clock.mark("output norm");
        self.op_times.add(clock);
        Ok(Hidden {
            n_embd: e,
            rows,
            data,
        })
    }

    /// Logits of the batch rows `rows` (each must be in `hidden.rows`), in
    /// the order given: the output head over their hidden states.
    pub fn logits(&self, hidden: &Hidden, rows: &[usize]) -> Result<Logits, ModelError> {
        let keep = vec![true; rows.len()];
        self.logits_visiting(hidden, rows, &keep, &|_, _, _| {})
    }

    /// [`Model::logits`] of the rows of `rows` that `keep` marks, while the
    /// logits of every other row go to `visit(j, first, values)` (`j` its
    /// index in `rows`; `values` the logits of tokens `first..first +
    /// values.len()`) in pieces as the head computes them: each logit in
    /// one piece, pieces in any order and on any thread
    /// ([`spindle_kernels::matmul::matmul_visit`]). The same bits as
    /// `logits`. For rows that only need the token a sampler picks: their
    /// logits are never stored whole, and the picking runs on every core.
    pub fn logits_visiting(
        &self,
        hidden: &Hidden,
        rows: &[usize],
        keep: &[bool],
        visit: &(dyn Fn(usize, usize, &mut [f32]) + Sync),
    ) -> Result<Logits, ModelError> {
        let cfg = &self.config;
        let e = hidden.n_embd;
        let mut clock = OpClock::new(self.profiling);
        let mut guard = self.buffers.lock().unwrap_or_else(|p| p.into_inner());
        let hn = &mut guard.hn;
        hn.resize(rows.len() * e, 0.0);
        for (j, &row) in rows.iter().enumerate() {
            let x = hidden.row(row).ok_or(ModelError::InvalidBatch(format!(
                "logits asked for batch row {row}, which did not ask for them in the pass"
            )))?;
            hn[j * e..(j + 1) * e].copy_from_slice(x);
        }
        if keep.len() != rows.len() {
            return Err(ModelError::InvalidBatch(format!(
                "{} rows marked kept or visited for a head call of {} rows",
                keep.len(),
                rows.len()
            )));
        }
        let kept: Vec<usize> = rows
            .iter()
            .zip(keep)
            .filter(|(_, &k)| k)
            .map(|(&r, _)| r)
            .collect();
        let mut data = spare_logits::take(kept.len() * cfg.vocab_size);
        let out = &self.weights.output;
        let capped = |j: usize, first: usize, piece: &mut [f32]| {
            if let Some(cap) = cfg.final_softcap {
                soft_cap(piece, cap);
            }
            visit(j, first, piece);
        };
        if !rows.is_empty() {
            spindle_kernels::matmul::matmul_visit(
                self.isa,
                self.act_rounding,
                &out.view(),
                &hn[..rows.len() * out.cols],
                rows.len(),
                keep,
                &mut data,
                &self.pool,
                &capped,
            )?;
        }
        if let Some(cap) = cfg.final_softcap {
            soft_cap(&mut data, cap);
        }
        clock.mark("output head");
        self.op_times.add(clock);
        Ok(Logits {
            vocab: cfg.vocab_size,
            rows: kept,
            data,
        })
    }

    fn matmul(&self, m: &Matrix, x: &[f32], n: usize, out: &mut [f32]) -> Result<(), ModelError> {
        spindle_kernels::matmul::matmul_with(
            self.isa,
            self.act_rounding,
            &m.view(),
            &x[..n * m.cols],
            n,
            &mut out[..n * m.rows],
            &self.pool,
        )?;
        Ok(())
    }

    /// [`Self::matmul`] of several matrices that read the same `x`: the
    /// kernels quantize and pack `x` once for neighbours of one type and
    /// share one run of the pool between them (the same bits).
    fn matmul_shared(
        &self,
        parts: &mut [(&Matrix, &mut Vec<f32>)],
        x: &[f32],
        n: usize,
    ) -> Result<(), ModelError> {
        let cols = parts.first().map_or(0, |(m, _)| m.cols);
        let mut views: Vec<_> = parts
            .iter_mut()
            .map(|(m, out)| (m.view(), &mut out[..n * m.rows]))
            .collect();
        spindle_kernels::matmul::matmul_shared(
            self.isa,
            self.act_rounding,
            &mut views,
            &x[..n * cols],
            n,
            &self.pool,
        )?;
        Ok(())
    }
}

fn add_bias(x: &mut [f32], bias: Option<&[f32]>) {
    if let Some(b) = bias {
        for row in x.chunks_exact_mut(b.len()) {
            row.iter_mut().zip(b).for_each(|(v, bb)| *v += bb);
        }
    }
}
