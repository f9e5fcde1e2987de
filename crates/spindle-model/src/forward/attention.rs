//! Attention inside the pass: every row over its window of committed KV and
//! its own path in the batch, read in place from the cache's blocks and the
//! pass's scratch rows, in their stored type (no widened copy).
//!
//! Rows are gathered into tiles (a run of rows each following the one
//! before, as a prompt's rows do), positions into fixed [`CHUNK`]s; a work
//! item is one tile, one slice of a KV head's query heads and one chunk.
//! How items are grouped into tasks follows the batch and the thread count,
//! but a row's result never does: each chunk's partial is computed the same
//! way wherever it runs, and partials are folded in position order.

use spindle_kernels::attention::{
    chunk_partials, empty_partial, finish, fold_partial, fold_sinks, BlockQ8, ChunkScratch,
    HeadGroup, KvElem, TileRow, CHUNK,
};

use super::*;
use crate::kv_cache::KvBuf;

/// Most rows in a tile: every key and value row a tile reads is widened once
/// for all of them (a prompt's rows share nearly every key).
const TILE_ROWS: usize = 32;

/// Most bytes of chunk partials a pass of many rows but too few tiles for
/// the threads may take to split its tiles by chunk (see `attention_in`).
pub(crate) const SPLIT_PARTIALS_BYTES: usize = 8 << 20;

/// A run of batch rows, each following the row before (one sequence).
struct Tile {
    rows: Range<usize>,
    seq: SeqId,
    ctx_len: usize,
    /// Batch rows at positions `ctx_len..`: the last row's path.
    chain: Vec<usize>,
    /// Positions the tile's rows see, together.
    seen: Range<usize>,
}

impl Tile {
    fn chunks(&self) -> Range<usize> {
        self.seen.start / CHUNK..self.seen.end.div_ceil(CHUNK)
    }
}

/// Where the keys and values of one layer lie: the cache's blocks and the
/// pass's scratch rows, as stored elements.
struct LayerKv<'a, E> {
    stored_k: &'a [E],
    stored_v: &'a [E],
    pass_k: &'a [E],
    pass_v: &'a [E],
    /// Elements per stored row (`kv_dim / E::VALUES`).
    row: usize,
}

impl Model {
    /// Every row of the pass attends over its window of committed KV and its
    /// path in the batch; `out` gets `n_head * head_dim` values per row.
    pub(super) fn attention(
        &self,
        layer: usize,
        batch: &Batch,
        plans: &[RowPlan],
        kv: &KvCache,
        q: &[f32],
        out: &mut [f32],
    ) {
        let stored = kv.layer(layer);
        let pass = &kv.scratch.layers[layer];
        match (&stored.k, &stored.v, &pass.k, &pass.v) {
            (KvBuf::F32(a), KvBuf::F32(b), KvBuf::F32(c), KvBuf::F32(d)) => {
                self.attention_in(layer, batch, plans, kv, q, out, self.layer_kv(a, b, c, d))
            }
            (KvBuf::F16(a), KvBuf::F16(b), KvBuf::F16(c), KvBuf::F16(d)) => {
                self.attention_in(layer, batch, plans, kv, q, out, self.layer_kv(a, b, c, d))
            }
            (KvBuf::Q8_0(a), KvBuf::Q8_0(b), KvBuf::Q8_0(c), KvBuf::Q8_0(d)) => self
                .attention_in::<BlockQ8>(
                    layer,
                    batch,
                    plans,
                    kv,
                    q,
                    out,
                    self.layer_kv(a, b, c, d),
                ),
            _ => unreachable!("KV buffers of one cache share a type"),
        }
    }

    fn layer_kv<'a, E: KvElem>(
        &self,
        stored_k: &'a [E],
        stored_v: &'a [E],
        pass_k: &'a [E],
        pass_v: &'a [E],
    ) -> LayerKv<'a, E> {
        LayerKv {
            stored_k,
            stored_v,
            pass_k,
            pass_v,
            row: self.config.kv_dim() / E::VALUES,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn attention_in<E: KvElem>(
        &self,
        layer: usize,
        batch: &Batch,
        plans: &[RowPlan],
        kv: &KvCache,
        q: &[f32],
        out: &mut [f32],
        lkv: LayerKv<'_, E>,
    ) {
        let cfg = &self.config;
        let window = if cfg.layer_sliding[layer] {
            cfg.sliding_window
        } else {
            None
        };
        let first_visible = |pos: usize| window.map_or(0, |w| (pos + 1).saturating_sub(w));
        let units = units(tiles(batch, plans, first_visible));

        let n_kv = cfg.n_head_kv.max(1);
        let group_size = cfg.n_head / n_kv;
        let hd = cfg.head_dim;
        let threads = self.pool.n_threads();
        // Few rows (decoding): each chunk is its own task, and a KV head's
        // query heads may be split too, so one row still uses every thread.
        // Many rows (prompts, trees, batches): a task is a tile and a head
        // slice, folding its chunks as it goes, so partials need no buffer.
        // (The planner counts the split's partials with the same rule.)
        // Also when the tiles are too few to give every thread a task (one
        // sequence's chain or tree: a single tile would leave the other
        // threads idle), as long as the chunks' partials stay small.
        let partial_bytes = batch.len()
            * cfg.n_head
            * (hd + 2)
            * units.iter().map(Unit::n_chunks).max().unwrap_or(0)
            * std::mem::size_of::<f32>();
        let split_chunks = batch.len() * n_kv < 4 * threads
            || (units.len() * n_kv < threads && partial_bytes <= SPLIT_PARTIALS_BYTES);
        let items: usize = units.iter().map(Unit::n_chunks).sum::<usize>() * n_kv;
        // Every unit one chunk: nothing to fold across items, so each task
        // finishes its rows itself (no partials buffer, no second run).
        let one_step = units.iter().all(|u| u.n_chunks() <= 1);
        // Items of equal work (one tile's one chunk, per KV head) balance
        // with one per thread; each slice of heads more widens the chunk's
        // keys again (16 rows at 144 positions: 1.73-1.78 ms a pass against
        // 1.98-2.04 with two per thread, docs/PERF.md §58). Items of unequal
        // work (chunks of different lengths) balance better in two per
        // thread.
        let per_thread = if one_step && units.len() == 1 { 1 } else { 2 };
        let parts = if split_chunks && items < per_thread * threads {
            (per_thread * threads)
                .div_ceil(items.max(1))
                .clamp(1, group_size)
        } else {
            1
        };
        let per_part = group_size.div_ceil(parts);
        let parts = group_size.div_ceil(per_part);
        // Slices of query heads: the first head, and the heads as a group
        // reading their KV head.
        let slices: Vec<(usize, HeadGroup)> = (0..n_kv)
            .flat_map(|g| {
                (0..parts).map(move |p| {
                    let lo = p * per_part;
                    let group = HeadGroup {
                        heads: per_part.min(group_size - lo),
                        head_dim: hd,
                        kv_offset: g * hd,
                        scale: cfg.attn_scale,
                        softcap: cfg.attn_softcap,
                    };
                    (g * group_size + lo, group)
                })
            })
            .collect();
        let key_rows = |tile: &Tile, c: usize| -> (Range<usize>, Vec<&[E]>, Vec<&[E]>) {
            let span = (c * CHUNK).max(tile.seen.start)..((c + 1) * CHUNK).min(tile.seen.end);
            let table = kv.block_table(tile.seq, layer);
            let (mut ks, mut vs) = (
                Vec::with_capacity(span.len()),
                Vec::with_capacity(span.len()),
            );
            let mut push = |committed: bool, r: usize| {
                let (k, v) = if committed {
                    (lkv.stored_k, lkv.stored_v)
                } else {
                    (lkv.pass_k, lkv.pass_v)
                };
                ks.push(&k[r * lkv.row..(r + 1) * lkv.row]);
                vs.push(&v[r * lkv.row..(r + 1) * lkv.row]);
            };
            let mut pos = span.start;
            // Committed positions, a block (one table lookup) at a time.
            while pos < span.end.min(tile.ctx_len) {
                let block = table[pos / BLOCK].expect("attention reads only kept blocks");
                let end = ((pos / BLOCK + 1) * BLOCK).min(span.end).min(tile.ctx_len);
                for p in pos..end {
                    push(true, block * BLOCK + p % BLOCK);
                }
                pos = end;
            }
            // Then the pass's own rows along the tile's chain.
            for p in pos..span.end {
                push(false, tile.chain[p - tile.ctx_len]);
            }
            (span, ks, vs)
        };
        // One chunk's partials for every row of a tile, `rows.len() *
        // partial_len` floats.
        let partials = |tile: &Tile,
                        (head0, group): &(usize, HeadGroup),
                        c: usize,
                        scratch: &mut ChunkScratch,
                        dst: &mut [f32]| {
            let (span, ks, vs) = key_rows(tile, c);
            let rows: Vec<TileRow<'_>> = tile
                .rows
                .clone()
                .map(|i| {
                    let pos = batch.rows[i].pos;
                    let lo = first_visible(pos).max(span.start);
                    let hi = (pos + 1).min(span.end);
                    let q_at = (i * cfg.n_head + head0) * hd;
                    TileRow {
                        q: &q[q_at..q_at + group.heads * hd],
                        keys: if lo < hi {
                            lo - span.start..hi - span.start
                        } else {
                            0..0
                        },
                    }
                })
                .collect();
            chunk_partials(self.isa, group, &rows, &ks, &vs, scratch, dst);
        };
        let out_heads = DisjointChunks::new(out, hd);
        let sinks = self.weights.layers[layer].attn_sinks.as_deref();
        let write_out = |unit: &Unit, (head0, group): &(usize, HeadGroup), states: &mut [f32]| {
            let mut dst = vec![0.0f32; group.heads * hd];
            for (i, state) in unit
                .rows()
                .zip(states.chunks_exact_mut(group.partial_len()))
            {
                if let Some(sinks) = sinks {
                    fold_sinks(group, state, &sinks[*head0..*head0 + group.heads]);
                }
                finish(group, state, &mut dst);
                for (h, src) in (*head0..head0 + group.heads).zip(dst.chunks_exact(hd)) {
                    // SAFETY: head h of row i belongs to this tile and slice alone.
                    unsafe { out_heads.chunk_mut(i * cfg.n_head + h) }.copy_from_slice(src);
                }
            }
        };
        let new_states = |unit: &Unit, group: &HeadGroup| {
            let plen = group.partial_len();
            let mut states = vec![0.0f32; unit.rows().len() * plen];
            states
                .chunks_exact_mut(plen)
                .for_each(|s| empty_partial(group, s));
            states
        };
        let fold_all = |group: &HeadGroup, states: &mut [f32], parts: &[f32]| {
            let plen = group.partial_len();
            for (s, p) in states.chunks_exact_mut(plen).zip(parts.chunks_exact(plen)) {
                fold_partial(self.isa, group, s, p);
            }
        };

        // The rows of `states` (a unit's) that `tile` holds.
        let states_of = |unit: &Unit, tile: &Tile, plen: usize| {
            let from = tile.rows.start - unit.rows().start;
            from * plen..(from + tile.rows.len()) * plen
        };
        if !split_chunks || one_step {
            for_each_task(&self.pool, units.len() * slices.len(), |t| {
                let (unit, slice) = (&units[t / slices.len()], &slices[t % slices.len()]);
                let plen = slice.1.partial_len();
                let mut states = new_states(unit, &slice.1);
                let mut part = vec![0.0f32; states.len()];
                let mut scratch = ChunkScratch::default();
                for (tile, c) in unit.steps() {
                    let at = states_of(unit, tile, plen);
                    let part = &mut part[..at.len()];
                    partials(tile, slice, c, &mut scratch, part);
                    fold_all(&slice.1, &mut states[at], part);
                }
                write_out(unit, slice, &mut states);
            });
            return;
        }

        // Every (unit, slice, step) item computes into its own place, then
        // each (unit, slice) folds its steps in position order. Items of
        // one (unit, slice) are consecutive, from `first_item[t]`.
        let mut items: Vec<(usize, usize, &Tile, usize)> = Vec::new();
        let mut first_item = Vec::with_capacity(units.len() * slices.len() + 1);
        for (ui, unit) in units.iter().enumerate() {
            for si in 0..slices.len() {
                first_item.push(items.len());
                items.extend(unit.steps().map(|(tile, c)| (ui, si, tile, c)));
            }
        }
        first_item.push(items.len());
        let len_of = |&(_, si, tile, _): &(usize, usize, &Tile, usize)| {
            slices[si].1.partial_len() * tile.rows.len()
        };
        let mut buf = vec![0.0f32; items.iter().map(len_of).sum()];
        let mut places = Vec::with_capacity(items.len());
        let mut rest = &mut buf[..];
        for item in &items {
            let (here, tail) = rest.split_at_mut(len_of(item));
            places.push(std::sync::Mutex::new(here));
            rest = tail;
        }
        for_each_task(&self.pool, items.len(), |t| {
            let (_, si, tile, c) = items[t];
            let mut dst = places[t].lock().unwrap_or_else(|p| p.into_inner());
            partials(tile, &slices[si], c, &mut ChunkScratch::default(), &mut dst);
        });
        for_each_task(&self.pool, units.len() * slices.len(), |t| {
            let (unit, slice) = (&units[t / slices.len()], &slices[t % slices.len()]);
            let plen = slice.1.partial_len();
            let mut states = new_states(unit, &slice.1);
            for (place, item) in places[first_item[t]..first_item[t + 1]]
                .iter()
                .zip(&items[first_item[t]..first_item[t + 1]])
            {
                let part = place.lock().unwrap_or_else(|p| p.into_inner());
                fold_all(&slice.1, &mut states[states_of(unit, item.2, plen)], &part);
            }
            write_out(unit, slice, &mut states);
        });
    }
}

/// The tiles of one task: one tile, or a sequence's consecutive tiles (the
/// branches of its tree) with the chunks they all see before their rows
/// (every key committed) computed once for all their rows as a `shared`
/// tile; each branch then computes only the chunks from its first own row.
/// Every row still folds each of its chunks once, in position order, and a
/// chunk's partial of a row is the same whichever tile computes it.
struct Unit {
    shared: Option<Tile>,
    tiles: Vec<Tile>,
}

impl Unit {
    /// Batch rows of the unit (its tiles are consecutive).
    fn rows(&self) -> Range<usize> {
        let first = self.tiles.first().map_or(0, |t| t.rows.start);
        first..self.tiles.last().map_or(first, |t| t.rows.end)
    }

    /// Every (tile, chunk) to compute, in the order a row folds them.
    fn steps(&self) -> impl Iterator<Item = (&Tile, usize)> {
        let shared = self
            .shared
            .iter()
            .flat_map(|t| t.chunks().map(move |c| (t, c)));
        shared.chain(
            self.tiles
                .iter()
                .flat_map(|t| t.chunks().map(move |c| (t, c))),
        )
    }

    fn n_chunks(&self) -> usize {
        self.steps().count()
    }
}

/// Groups consecutive tiles of one sequence and one committed context (a
/// tree's branches, up to [`TILE_ROWS`] rows) into units; the chunks every
/// branch sees whole before the context's end move to the unit's shared tile.
fn units(tiles: Vec<Tile>) -> Vec<Unit> {
    let mut units: Vec<Unit> = Vec::new();
    for tile in tiles {
        if let Some(u) = units.last_mut() {
            let t0 = &u.tiles[0];
            if t0.seq == tile.seq
                && t0.ctx_len == tile.ctx_len
                && u.rows().end == tile.rows.start
                && u.rows().len() + tile.rows.len() <= TILE_ROWS
            {
                u.tiles.push(tile);
                continue;
            }
        }
        units.push(Unit {
            shared: None,
            tiles: vec![tile],
        });
    }
    for u in &mut units {
        if u.tiles.len() < 2 {
            continue;
        }
        // Chunks wholly before the context's end.
        let own_from = (u.tiles[0].ctx_len / CHUNK) * CHUNK;
        let start = u.tiles.iter().map(|t| t.seen.start).min().unwrap_or(0);
        if start >= own_from {
            continue;
        }
        u.shared = Some(Tile {
            rows: u.rows(),
            seq: u.tiles[0].seq,
            ctx_len: u.tiles[0].ctx_len,
            chain: Vec::new(),
            seen: start..own_from,
        });
        for t in &mut u.tiles {
            t.seen.start = t.seen.start.max(own_from);
        }
    }
    units
}

/// The batch's rows as tiles: a row joins the tile of the row before when it
/// follows that row, up to [`TILE_ROWS`].
fn tiles(batch: &Batch, plans: &[RowPlan], first_visible: impl Fn(usize) -> usize) -> Vec<Tile> {
    let mut tiles: Vec<Tile> = Vec::new();
    for (i, (row, plan)) in batch.rows.iter().zip(plans).enumerate() {
        if let Some(t) = tiles.last_mut() {
            if row.parent == Some(i - 1) && t.rows.len() < TILE_ROWS {
                t.rows.end = i + 1;
                t.chain.push(i);
                t.seen.end = row.pos + 1;
                continue;
            }
        }
        let chain: Vec<usize> = plan.path.clone();
        tiles.push(Tile {
            rows: i..i + 1,
            seq: row.seq,
            ctx_len: plan.ctx_len,
            chain,
            seen: first_visible(row.pos)..row.pos + 1,
        });
    }
    tiles
}
