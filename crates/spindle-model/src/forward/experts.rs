//! A mixture-of-experts feed-forward block. Each row's router picks its
//! experts; the pass then runs expert by expert over all the rows that
//! chose it, so each expert's weights are read once per pass (the
//! multi-row kernel) however many rows share it. Every row's result is
//! its own: the kernels give a row the same bits in any batch, and a row
//! sums its experts' outputs in its own top-k order, so which other rows
//! share the pass changes nothing.

use std::sync::Mutex;

use spindle_kernels::activation::gated;

use super::*;
use crate::config::{ExpertActivation, MoeConfig, Routing};
use crate::weights::ExpertWeights;

/// Buffers of the expert block, reused from pass to pass.
#[derive(Default)]
pub(super) struct ExpertBuffers {
    /// Router logits, `n x n_experts`.
    logits: Vec<f32>,
    /// Per row, its `n_used` choices: expert and weight, best first.
    choices: Vec<(usize, f32)>,
    /// One row's experts ranked, and its router probabilities.
    ranking: Ranking,
    /// Per expert, the slots (`row * n_used + rank`) that chose it.
    members: Vec<Vec<usize>>,
    /// One per expert task running at once: an expert's rows in, hidden,
    /// and out.
    scratch: Vec<Mutex<ExpertScratch>>,
    /// Every slot's expert output, `n x n_used x n_embd`.
    slots: Vec<f32>,
}

#[derive(Default)]
struct ExpertScratch {
    x: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    y: Vec<f32>,
}

/// The most rows an expert may have for the pass to run its experts as
/// tasks of their own: with few rows each matmul is too small to split
/// across threads, and one task per expert saves a dispatch per matmul.
const ROWS_PER_EXPERT_TASK: usize = 16;

impl Model {
    /// `out = sum over each row's chosen experts of weight x expert(xn)`.
    pub(super) fn experts_ffn(
        &self,
        w: &ExpertWeights,
        moe: &MoeConfig,
        xn: &[f32],
        n: usize,
        out: &mut [f32],
        b: &mut ExpertBuffers,
    ) -> Result<(), ModelError> {
        let e = self.config.n_embd;
        let (ne, k) = (moe.n_experts, moe.n_used);
        let ExpertBuffers {
            logits,
            choices,
            ranking,
            members,
            scratch,
            slots,
        } = b;
        logits.resize(n * ne, 0.0);
        self.matmul(&w.router, xn, n, logits)?;
        if let Some(bias) = &w.router_bias {
            for row in logits.chunks_exact_mut(ne) {
                row.iter_mut().zip(bias).for_each(|(l, b)| *l += b);
            }
        }

        choices.clear();
        for row in logits.chunks_exact(ne) {
            ranking.route(row, moe.routing, k, choices);
        }
        members.resize_with(ne, Vec::new);
        members.iter_mut().for_each(Vec::clear);
        for (slot, &(expert, _)) in choices.iter().enumerate() {
            members[expert].push(slot);
        }
        let hit: Vec<usize> = (0..ne).filter(|&j| !members[j].is_empty()).collect();
        let largest = hit.iter().map(|&j| members[j].len()).max().unwrap_or(0);

        // Each slot belongs to one expert: experts write disjoint chunks.
        slots.resize(n * k * e, 0.0);
        let out_slots = DisjointChunks::new(&mut slots[..], e);
        let run = |j: usize, s: &mut ExpertScratch| -> Result<(), ModelError> {
            self.run_expert(w, moe, j, &members[j], xn, s)?;
            for (r, &slot) in members[j].iter().enumerate() {
                // SAFETY: slot `slot` chose expert `j` alone, and each
                // expert runs once.
                unsafe { out_slots.chunk_mut(slot) }.copy_from_slice(&s.y[r * e..(r + 1) * e]);
            }
            Ok(())
        };
        if largest <= ROWS_PER_EXPERT_TASK && hit.len() > 1 && self.pool.n_threads() > 1 {
            // Matmuls called inside a task run on its thread (the pool runs
            // nested jobs inline), with the bits of a split run.
            if scratch.len() < hit.len() {
                scratch.resize_with(hit.len(), Mutex::default);
            }
            let failed = Mutex::new(None);
            for_each_task(&self.pool, hit.len(), |t| {
                let mut s = scratch[t].lock().unwrap_or_else(|p| p.into_inner());
                if let Err(err) = run(hit[t], &mut s) {
                    *failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(err);
                }
            });
            if let Some(err) = failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
                return Err(err);
            }
        } else {
            if scratch.is_empty() {
                scratch.push(Mutex::default());
            }
            let s = scratch[0].get_mut().unwrap_or_else(|p| p.into_inner());
            for &j in &hit {
                run(j, s)?;
            }
        }

        for i in 0..n {
            let o = &mut out[i * e..(i + 1) * e];
            o.fill(0.0);
            for rank in 0..k {
                let slot = i * k + rank;
                let weight = choices[slot].1;
                let y = &slots[slot * e..(slot + 1) * e];
                o.iter_mut().zip(y).for_each(|(a, v)| *a += weight * v);
            }
        }
        Ok(())
    }

    /// Expert `j` over the rows of `slots` (`row * n_used + rank`): gathers
    /// them from `xn` and leaves the expert's outputs in `s.y`, one row per
    /// slot in order.
    fn run_expert(
        &self,
        w: &ExpertWeights,
        moe: &MoeConfig,
        j: usize,
        slots: &[usize],
        xn: &[f32],
        s: &mut ExpertScratch,
    ) -> Result<(), ModelError> {
        let e = self.config.n_embd;
        let (k, ff, m) = (moe.n_used, moe.n_ff, slots.len());
        s.x.resize(m * e, 0.0);
        for (r, &slot) in slots.iter().enumerate() {
            let row = slot / k;
            s.x[r * e..(r + 1) * e].copy_from_slice(&xn[row * e..(row + 1) * e]);
        }
        s.gate.resize(m * ff, 0.0);
        s.up.resize(m * ff, 0.0);
        s.y.resize(m * e, 0.0);
        self.matmul_shared(
            &mut [(&w.gate[j], &mut s.gate), (&w.up[j], &mut s.up)],
            &s.x,
            m,
        )?;
        let bias = |biases: &Option<Vec<Vec<f32>>>, rows: &mut [f32], width: usize| {
            if let Some(bias) = biases {
                for row in rows.chunks_exact_mut(width) {
                    row.iter_mut().zip(&bias[j]).for_each(|(v, b)| *v += b);
                }
            }
        };
        bias(&w.gate_bias, &mut s.gate, ff);
        bias(&w.up_bias, &mut s.up, ff);
        let act = self.config.arch.activation;
        for (g, u) in s.gate.chunks_exact_mut(ff).zip(s.up.chunks_exact(ff)) {
            match moe.activation {
                ExpertActivation::Silu => gated(self.isa, act, g, u),
                ExpertActivation::ClampedSwiglu { alpha, limit } => {
                    clamped_swiglu(g, u, alpha, limit)
                }
            }
        }
        self.matmul(&w.down[j], &s.gate, m, &mut s.y)?;
        bias(&w.down_bias, &mut s.y, e);
        Ok(())
    }
}

/// Scratch of [`Ranking::route`], kept so routing allocates nothing.
#[derive(Default)]
struct Ranking {
    order: Vec<usize>,
    probs: Vec<f32>,
}

impl Ranking {
    /// Appends a row's `k` choices (expert, weight), best first; ties go to
    /// the lower expert index, so the choice is a function of the logits
    /// alone.
    fn route(
        &mut self,
        logits: &[f32],
        routing: Routing,
        k: usize,
        choices: &mut Vec<(usize, f32)>,
    ) {
        let Ranking { order, probs } = self;
        let rank = |order: &mut Vec<usize>, by: &[f32]| {
            order.clear();
            order.extend(0..by.len());
            order.sort_by(|&a, &b| by[b].total_cmp(&by[a]).then(a.cmp(&b)));
        };
        match routing {
            Routing::TopKSoftmax => {
                rank(order, logits);
                let top = &order[..k];
                let max = logits[top[0]];
                let total: f32 = top.iter().map(|&j| (logits[j] - max).exp()).sum();
                for &j in top {
                    choices.push((j, (logits[j] - max).exp() / total));
                }
            }
            Routing::SoftmaxTopK { renormalize } => {
                let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                probs.clear();
                probs.extend(logits.iter().map(|&l| (l - max).exp()));
                let total: f32 = probs.iter().sum();
                rank(order, probs);
                let top = &order[..k];
                let kept: f32 = top.iter().map(|&j| probs[j] / total).sum();
                for &j in top {
                    let p = probs[j] / total;
                    choices.push((j, if renormalize { p / kept } else { p }));
                }
            }
        }
    }
}

/// gpt-oss's expert activation, in place in `gate`: the same scalar
/// operations on every path, so every ISA gives the same bits.
fn clamped_swiglu(gate: &mut [f32], up: &[f32], alpha: f32, limit: f32) {
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = g.min(limit);
        let u = u.clamp(-limit, limit);
        *g = x / (1.0 + (-alpha * x).exp()) * (u + 1.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing_keeps_the_top_k_of_the_softmax() {
        let logits = [0.0f32, 2.0, 1.0, 2.0];
        let mut c = Vec::new();
        let mut r = Ranking::default();
        r.route(
            &logits,
            Routing::SoftmaxTopK { renormalize: false },
            2,
            &mut c,
        );
        // Ties go to the lower index; weights are softmax probabilities.
        let z: f64 = logits.iter().map(|&l| (l as f64).exp()).sum();
        assert_eq!((c[0].0, c[1].0), (1, 3));
        assert!((c[0].1 as f64 - 2f64.exp() / z).abs() < 1e-6);
        c.clear();
        r.route(
            &logits,
            Routing::SoftmaxTopK { renormalize: true },
            2,
            &mut c,
        );
        assert!((c[0].1 - 0.5).abs() < 1e-6 && (c[1].1 - 0.5).abs() < 1e-6);
        // gpt-oss: the top k logits, then a softmax over those k only.
        c.clear();
        r.route(&[0.0, 3.0, 1.0, -1.0], Routing::TopKSoftmax, 2, &mut c);
        let w1 = 1.0 / (1.0 + (-2.0f64).exp());
        assert_eq!((c[0].0, c[1].0), (1, 2));
        assert!((c[0].1 as f64 - w1).abs() < 1e-6, "{c:?}");
        assert!((c[1].1 as f64 - (1.0 - w1)).abs() < 1e-6, "{c:?}");
    }
}
