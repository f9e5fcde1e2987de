//! Attention over keys and values read where they are stored, in their
//! stored type, split into chunks of positions and merged in a fixed order
//! (flash-decoding).
//!
//! A row sees a contiguous run of positions (its window of committed KV and
//! its path in the pass). The positions are cut into [`CHUNK`]-sized chunks
//! by absolute position, never by thread count or batch shape. For each
//! chunk that a row sees, [`chunk_partials`] computes the row's partial
//! (per head: the chunk's largest score, the sum of the exponentials and
//! the weighted values); [`fold_partial`] then merges the partials in
//! position order and [`finish`] normalises. A row's result therefore
//! depends only on the keys it sees: the same alone, in a batch, in a token
//! tree, on any thread count, and whether a key comes from the committed
//! cache or from the pass itself.
//!
//! Rows that share keys (a prompt's rows, a chain of a tree) are handed to
//! [`chunk_partials`] together as a tile: each key and value row is read
//! from memory and widened once for all of them and for every query head
//! of the group (grouped-query attention), while each row's arithmetic
//! stays exactly what it would be alone.

mod kernel;
mod softmax;
mod stored;
mod vector;
mod wide;

use std::ops::Range;

pub use stored::{BlockQ8, KvElem};
pub use vector::axpy;

use crate::simd::Isa;

/// Positions per chunk. A fixed constant: results depend on where chunks
/// start, so it never follows the thread count or the batch.
pub const CHUNK: usize = 256;

/// Where a group of query heads reads its KV head, and how it scores.
#[derive(Debug, Clone, Copy)]
pub struct HeadGroup {
    /// Query heads that share the KV head.
    pub heads: usize,
    pub head_dim: usize,
    /// Offset of the KV head inside a stored row, in values.
    pub kv_offset: usize,
    /// Score multiplier (`1/sqrt(d)` or the model's own).
    pub scale: f32,
    /// Gemma 2's attention soft-cap.
    pub softcap: Option<f32>,
}

impl HeadGroup {
    /// Floats of one row's partial (and of a fold state):
    /// per head, `head_dim` weighted values, then the max, then the sum.
    pub fn partial_len(&self) -> usize {
        self.heads * (self.head_dim + 2)
    }
}

/// One row of a tile: its rotated queries (`heads * head_dim`) and the
/// keys of the chunk it sees (a range of the tile's key list).
#[derive(Debug, Clone)]
pub struct TileRow<'a> {
    pub q: &'a [f32],
    pub keys: Range<usize>,
}

/// Buffers [`chunk_partials`] reuses between calls.
#[derive(Default)]
pub struct ChunkScratch {
    scores: Vec<f32>,
    wide: wide::WideScratch,
}

/// A fold state or partial with nothing in it (no key seen).
pub fn empty_partial(group: &HeadGroup, out: &mut [f32]) {
    let d = group.head_dim;
    for h in out.chunks_exact_mut(d + 2).take(group.heads) {
        h[..d].fill(0.0);
        h[d] = f32::NEG_INFINITY;
        h[d + 1] = 0.0;
    }
}

/// Each row's partial over the keys it sees of one chunk: `k[j]` and `v[j]`
/// are whole stored rows (the group reads its head at `kv_offset`), in
/// position order. Writes `rows.len()` partials of
/// [`HeadGroup::partial_len`] floats into `out`; a row that sees no key
/// gets [`empty_partial`].
///
/// Per (row, head) the operations are fixed: each score a dot product of
/// eight lanes reduced by a fixed tree, times the scale; the chunk's max;
/// `exp(score - max)` summed in eight lanes (see `softmax.rs`); and the
/// values accumulated in key order with fused multiply-adds (see
/// `kernel.rs`).
pub fn chunk_partials<E: KvElem>(
    isa: Isa,
    group: &HeadGroup,
    rows: &[TileRow<'_>],
    k: &[&[E]],
    v: &[&[E]],
    scratch: &mut ChunkScratch,
    out: &mut [f32],
) {
    let (d, heads) = (group.head_dim, group.heads);
    let plen = group.partial_len();
    // A tile of enough rows goes through the wide kernels together (the
    // same bits, see `wide.rs`).
    let seeing = rows.iter().filter(|r| !r.keys.is_empty()).count();
    let wide = wide::fits(isa, group) && seeing >= wide::MIN_ROWS;
    if wide {
        return wide_partials(isa, group, rows, k, v, scratch, out);
    }
    // The rows of a tile run one after the other over the same chunk, which
    // the first has brought into cache for the rest.
    for (r, row) in rows.iter().enumerate() {
        let part = &mut out[r * plen..(r + 1) * plen];
        empty_partial(group, part);
        let n = row.keys.len();
        if n == 0 {
            continue;
        }
        let scores = &mut scratch.scores;
        scores.resize(heads * n, 0.0);
        let (keys, values) = (&k[row.keys.clone()], &v[row.keys.clone()]);
        // Only the first row of a tile brings the chunk into cache.
        let fetch = if r == 0 { values } else { &[] };
        kernel::scores(isa, group, row.q, keys, fetch, scores);
        for (h, acc) in part.chunks_exact_mut(d + 2).enumerate() {
            let sc = &mut scores[h * n..(h + 1) * n];
            (acc[d], acc[d + 1]) = softmax::weights(isa, sc, group.scale, group.softcap);
        }
        kernel::values(isa, group, scores, values, part);
    }
}

/// [`chunk_partials`] for a tile's rows together: every score against
/// every key of the chunk, then each row's softmax and values over its own
/// range.
fn wide_partials<E: KvElem>(
    isa: Isa,
    group: &HeadGroup,
    rows: &[TileRow<'_>],
    k: &[&[E]],
    v: &[&[E]],
    scratch: &mut ChunkScratch,
    out: &mut [f32],
) {
    let (d, heads, n) = (group.head_dim, group.heads, k.len());
    let plen = group.partial_len();
    let seeing = |r: &&TileRow<'_>| !r.keys.is_empty();
    let queries: Vec<&[f32]> = rows
        .iter()
        .filter(seeing)
        .flat_map(|r| (0..heads).map(move |h| &r.q[h * d..(h + 1) * d]))
        .collect();
    let seen: Vec<Range<usize>> = rows
        .iter()
        .filter(seeing)
        .flat_map(|r| std::iter::repeat_n(r.keys.clone(), heads))
        .collect();
    let scores = &mut scratch.scores;
    scores.resize(queries.len() * n, 0.0);
    wide::scores(isa, group, &queries, k, &mut scratch.wide, scores);
    let mut acc: Vec<&mut [f32]> = Vec::with_capacity(queries.len());
    let mut q = 0;
    for (row, part) in rows.iter().zip(out.chunks_exact_mut(plen)) {
        empty_partial(group, part);
        if row.keys.is_empty() {
            continue;
        }
        for head in part.chunks_exact_mut(d + 2).take(heads) {
            let sc = &mut scores[q * n + row.keys.start..q * n + row.keys.end];
            (head[d], head[d + 1]) = softmax::weights(isa, sc, group.scale, group.softcap);
            acc.push(&mut head[..d]);
            q += 1;
        }
    }
    wide::values(isa, group, scores, &seen, v, &mut scratch.wide, &mut acc);
}

/// Merges a chunk's partial into a row's fold state (both
/// [`HeadGroup::partial_len`] floats). Partials must arrive in position
/// order; an empty one changes nothing, and the first non-empty one is
/// copied. Otherwise, per head: `m = max(M, m_c)`, the state scaled by
/// `exp(M - m)` and the partial added with weight `exp(m_c - m)`.
pub fn fold_partial(isa: Isa, group: &HeadGroup, state: &mut [f32], part: &[f32]) {
    let d = group.head_dim;
    for (st, p) in state
        .chunks_exact_mut(d + 2)
        .zip(part.chunks_exact(d + 2))
        .take(group.heads)
    {
        let (pm, ps) = (p[d], p[d + 1]);
        if pm == f32::NEG_INFINITY {
            continue;
        }
        if st[d] == f32::NEG_INFINITY {
            st.copy_from_slice(p);
            continue;
        }
        let m = st[d].max(pm);
        let (alpha, beta) = ((st[d] - m).exp(), (pm - m).exp());
        st[d + 1] = ps.mul_add(beta, st[d + 1] * alpha);
        st[d] = m;
        st[..d].iter_mut().for_each(|x| *x *= alpha);
        axpy(isa, beta, &p[..d], &mut st[..d]);
    }
}

/// Adds attention sinks to a finished fold state: per head, a logit
/// `sinks[h]` that joins the softmax without a value (gpt-oss), so the
/// head's weights sum to less than one. Fixed scalar operations: the same
/// bits on every path.
pub fn fold_sinks(group: &HeadGroup, state: &mut [f32], sinks: &[f32]) {
    let d = group.head_dim;
    for (st, &sink) in state.chunks_exact_mut(d + 2).zip(sinks).take(group.heads) {
        let m = st[d].max(sink);
        let alpha = if st[d] == f32::NEG_INFINITY {
            0.0
        } else {
            (st[d] - m).exp()
        };
        st[d + 1] = st[d + 1] * alpha + (sink - m).exp();
        st[d] = m;
        st[..d].iter_mut().for_each(|x| *x *= alpha);
    }
}

/// A row's attention output (`heads * head_dim`) from its fold state.
pub fn finish(group: &HeadGroup, state: &[f32], out: &mut [f32]) {
    let d = group.head_dim;
    for (st, o) in state
        .chunks_exact(d + 2)
        .zip(out.chunks_exact_mut(d))
        .take(group.heads)
    {
        let inv = 1.0 / st[d + 1];
        for (o, &x) in o.iter_mut().zip(&st[..d]) {
            *o = x * inv;
        }
    }
}

#[cfg(test)]
mod tests;
