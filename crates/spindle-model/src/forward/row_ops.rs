//! Row-wise steps of a layer: norms, residual adds, q/k norms with rope,
//! gated activations, biases, each over the rows of the pass, every thread
//! on its own contiguous rows (norms and residual adds on the calling thread
//! when the rows are few: `for_each_row`).

use super::*;

impl Model {
    /// `out = rms_norm(x) * w`, rows split over the pool.
    pub(super) fn norm_rows(&self, x: &[f32], w: &[f32], out: &mut [f32], n: usize) {
        let dim = w.len();
        let eps = self.config.rms_eps;
        let rows = DisjointChunks::new(&mut out[..n * dim], dim);
        for_each_row(&self.pool, n, dim, |i| {
            // SAFETY: row i belongs to this task alone.
            rms_norm(&x[i * dim..(i + 1) * dim], w, eps, unsafe {
                rows.chunk_mut(i)
            });
        });
    }

    /// `h += norm(o)` (or `h += o` without a post-norm), rows split over the pool.
    pub(super) fn add_residual(
        &self,
        h: &mut [f32],
        o: &mut [f32],
        post_norm: Option<&[f32]>,
        n: usize,
    ) {
        let dim = self.config.n_embd;
        let eps = self.config.rms_eps;
        let (hs, os) = (
            DisjointChunks::new(&mut h[..n * dim], dim),
            DisjointChunks::new(&mut o[..n * dim], dim),
        );
        for_each_row(&self.pool, n, dim, |i| {
            // SAFETY: row i of both belongs to this task alone.
            let (h_row, o_row) = unsafe { (hs.chunk_mut(i), os.chunk_mut(i)) };
            if let Some(w) = post_norm {
                rms_norm_inplace(o_row, w, eps);
            }
            h_row
                .iter_mut()
                .zip(o_row.iter())
                .for_each(|(a, b)| *a += b);
        });
    }

    /// Per-head q/k norms and rope for every row, rows split over the pool;
    /// `cache_len` picks LongRoPE's table, as llama.cpp does by the context.
    pub(super) fn qk_norm_rope(
        &self,
        layer: usize,
        batch: &Batch,
        q: &mut [f32],
        k: &mut [f32],
        cache_len: usize,
    ) {
        let ropes = match &self.long_ropes {
            Some((original, long)) if cache_len > *original => long,
            _ => &self.ropes,
        };
        let cfg = &self.config;
        let (qd, kvd, hd, eps) = (cfg.q_dim(), cfg.kv_dim(), cfg.head_dim, cfg.rms_eps);
        let lw = &self.weights.layers[layer];
        let n = batch.len();
        let (qs, ks) = (
            DisjointChunks::new(&mut q[..n * qd], qd),
            DisjointChunks::new(&mut k[..n * kvd], kvd),
        );
        for_each_row_range(&self.pool, n, |i| {
            // SAFETY: row i of both belongs to this task alone.
            let (q_row, k_row) = unsafe { (qs.chunk_mut(i), ks.chunk_mut(i)) };
            if let Some(w) = &lw.q_norm {
                q_row
                    .chunks_exact_mut(hd)
                    .for_each(|head| rms_norm_inplace(head, w, eps));
            }
            if let Some(w) = &lw.k_norm {
                k_row
                    .chunks_exact_mut(hd)
                    .for_each(|head| rms_norm_inplace(head, w, eps));
            }
            ropes[layer].apply_all(&mut [q_row, k_row], hd, batch.rows[i].pos);
        });
    }

    /// `gate = act(gate) * up`, rows split over the pool.
    pub(super) fn gated_rows(&self, gate: &mut [f32], up: &[f32], n: usize) {
        let ff = self.config.n_ff;
        let act = self.config.arch.activation;
        let rows = DisjointChunks::new(&mut gate[..n * ff], ff);
        for_each_row_range(&self.pool, n, |i| {
            // SAFETY: row i belongs to this task alone.
            gated(
                self.isa,
                act,
                unsafe { rows.chunk_mut(i) },
                &up[i * ff..(i + 1) * ff],
            );
        });
    }
}
