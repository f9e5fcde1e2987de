//! Attention inside the pass: every row over its window of committed KV and
//! its own path in the batch, one task per (row, KV head) group, with K/V
//! widened to f32 once per pass.

use super::*;

impl Model {
    /// Every row of the pass attends over its window of committed KV and its
    /// path in the batch. K/V are widened to f32 once per pass (committed
    /// windows per sequence, and the pass's own rows as rounded into the
    /// cache, so a row reads exactly what a later pass would read back).
    /// A task is one row's heads that share a KV head, or a slice of them so
    /// that decoding one row still uses every thread; the split never changes
    /// a head's result.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attention(
        &self,
        layer: usize,
        batch: &Batch,
        plans: &[RowPlan],
        kv: &KvCache,
        q: &[f32],
        out: &mut [f32],
        views: &mut KvViews,
    ) {
        let cfg = &self.config;
        let window = if cfg.layer_sliding[layer] {
            cfg.sliding_window
        } else {
            None
        };
        let first_visible = |pos: usize| window.map_or(0, |w| (pos + 1).saturating_sub(w));
        let stride = cfg.kv_dim();

        // The pass's rows, as stored.
        let scratch = &kv.scratch.layers[layer];
        let all = 0..scratch.k.len();
        self.widen_into(&scratch.k, std::slice::from_ref(&all), &mut views.pass_k);
        self.widen_into(&scratch.v, std::slice::from_ref(&all), &mut views.pass_v);
        // Each sequence's committed window, from the earliest position any of its rows sees.
        views.n_seqs = 0;
        for (row, plan) in batch.rows.iter().zip(plans) {
            let base = first_visible(row.pos).min(plan.ctx_len);
            let used = views.n_seqs;
            match views.committed[..used].iter_mut().find(|c| c.0 == row.seq) {
                Some(c) => c.1 = c.1.min(base),
                None => {
                    if used == views.committed.len() {
                        views
                            .committed
                            .push((row.seq, base, Vec::new(), Vec::new()));
                    }
                    let c = &mut views.committed[used];
                    (c.0, c.1) = (row.seq, base);
                    views.n_seqs += 1;
                }
            }
        }
        for (seq, base, k, v) in &mut views.committed[..views.n_seqs] {
            let len = kv.seq_len(*seq);
            let ranges = kv.layer_ranges(*seq, layer, *base, len);
            let stored = kv.layer(layer);
            self.widen_into(&stored.k, &ranges, k);
            self.widen_into(&stored.v, &ranges, v);
        }
        let committed = &views.committed[..views.n_seqs];
        let (pass_k, pass_v) = (&views.pass_k, &views.pass_v);

        let n_kv = cfg.n_head_kv.max(1);
        let group = cfg.n_head / n_kv;
        let hd = cfg.head_dim;
        let groups = batch.len() * n_kv;
        let parts = self.pool.n_threads().div_ceil(groups).clamp(1, group);
        let per_part = group.div_ceil(parts);
        let parts = group.div_ceil(per_part);
        let out_heads = DisjointChunks::new(out, hd);
        let task = |t: usize| {
            let (g, part) = (t / parts, t % parts);
            let (i, kv_head) = (g / n_kv, g % n_kv);
            let heads = kv_head * group + part * per_part
                ..kv_head * group + ((part + 1) * per_part).min(group);
            let (row, plan) = (&batch.rows[i], &plans[i]);
            let first = first_visible(row.pos);
            let (_, base, ck, cv) = committed
                .iter()
                .find(|c| c.0 == row.seq)
                .expect("collected above");
            let ctx = first.min(plan.ctx_len) - base..plan.ctx_len - base;
            let tail: Vec<usize> = plan
                .path
                .iter()
                .copied()
                .filter(|&r| batch.rows[r].pos >= first)
                .collect();
            let q_row = i * cfg.n_head;
            let query = GroupQuery {
                q: &q[(q_row + heads.start) * hd..(q_row + heads.end) * hd],
                head_dim: hd,
                kv_offset: kv_head * hd,
                scale: cfg.attn_scale,
                softcap: cfg.attn_softcap,
            };
            let mut dst = vec![0.0f32; heads.len() * hd];
            attend_group(
                self.isa,
                &query,
                KvRows {
                    k: ck,
                    v: cv,
                    stride,
                },
                ctx,
                KvRows {
                    k: pass_k,
                    v: pass_v,
                    stride,
                },
                &tail,
                &mut Vec::new(),
                &mut dst,
            );
            for (h, src) in heads.zip(dst.chunks_exact(hd)) {
                // SAFETY: head h of row i belongs to this task alone.
                unsafe { out_heads.chunk_mut(q_row + h) }.copy_from_slice(src);
            }
        };
        for_each_task(&self.pool, groups * parts, task);
    }

    /// The stored values of `ranges`, one after the other, widened to f32
    /// into `out` (resized; every element overwritten), in parallel.
    fn widen_into(&self, buf: &KvBuf, ranges: &[Range<usize>], out: &mut Vec<f32>) {
        const CHUNK: usize = 1 << 14;
        // Where each range starts in `out`.
        let mut starts = Vec::with_capacity(ranges.len());
        let mut len = 0;
        for r in ranges {
            starts.push(len);
            len += r.len();
        }
        out.resize(len, 0.0);
        let chunks = DisjointChunks::new(out, CHUNK);
        for_each_task(&self.pool, len.div_ceil(CHUNK), |c| {
            // SAFETY: chunk c belongs to this task alone.
            let dst = unsafe { chunks.chunk_mut(c) };
            // A chunk may span several ranges (one per block).
            let mut done = 0;
            let mut r = starts.partition_point(|&s| s <= c * CHUNK) - 1;
            while done < dst.len() {
                let off = c * CHUNK + done - starts[r];
                let range = &ranges[r];
                let n = (dst.len() - done).min(range.len() - off);
                let (src, d) = (
                    range.start + off..range.start + off + n,
                    &mut dst[done..done + n],
                );
                // Q8_0 in whole blocks: ranges and chunks are multiples of 32.
                buf.read_into(src, d);
                done += n;
                r += 1;
            }
        });
    }
}
