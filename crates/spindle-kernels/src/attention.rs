//! Attention of one query head over the keys a row may see.
//!
//! A row sees a window of its sequence's committed KV plus a list of rows of
//! the current pass (its ancestors and itself). Keys are visited in position
//! order, one at a time, so a row's result depends only on the keys it sees:
//! the same whether it runs alone, in a batch or inside a token tree.

use half::f16;

/// An element type the KV cache can hold.
pub trait KvElem: Copy + Send + Sync + 'static {
    fn from_f32(v: f32) -> Self;
    fn to_f32(self) -> f32;
    /// Widens a slice to f32 (exact for both types; SIMD where the CPU has it).
    fn load(src: &[Self], dst: &mut [f32]);
}

impl KvElem for f32 {
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn load(src: &[Self], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
}

impl KvElem for f16 {
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline(always)]
    fn load(src: &[Self], dst: &mut [f32]) {
        use half::slice::HalfFloatSliceExt;
        src.convert_to_f32_slice(dst);
    }
}

/// Keys and values laid out as rows of `stride` elements.
#[derive(Clone, Copy)]
pub struct KvRows<'a, E> {
    pub k: &'a [E],
    pub v: &'a [E],
    pub stride: usize,
}

/// What one query head attends to.
pub struct HeadQuery<'a> {
    /// The query head, already rotated and scaled by nothing.
    pub q: &'a [f32],
    /// Offset of the matching KV head inside a KV row.
    pub kv_offset: usize,
    /// Score multiplier (`1/sqrt(d)` or the model's own).
    pub scale: f32,
    /// Gemma 2's attention soft-cap.
    pub softcap: Option<f32>,
}

/// Attends `query` over `committed` rows `ctx_from..ctx_to`, then over the
/// pass rows listed in `tail_rows` (in position order). Writes the head's
/// output into `out`; `scores` is scratch.
pub fn attend_head<E: KvElem>(
    query: &HeadQuery<'_>,
    committed: KvRows<'_, E>,
    ctx_range: std::ops::Range<usize>,
    tail: KvRows<'_, E>,
    tail_rows: &[usize],
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let d = query.q.len();
    assert!(d <= MAX_HEAD_DIM, "head size {d} > {MAX_HEAD_DIM}");
    let mut buf = [0.0f32; MAX_HEAD_DIM];
    let row = &mut buf[..d];
    scores.clear();
    let mut max = f32::NEG_INFINITY;
    let off = query.kv_offset;
    let keys = ctx_range
        .clone()
        .map(|r| head_of(committed.k, r * committed.stride + off, d))
        .chain(
            tail_rows
                .iter()
                .map(|&r| head_of(tail.k, r * tail.stride + off, d)),
        );
    for k in keys {
        E::load(k, row);
        let mut s = dot(query.q, row) * query.scale;
        if let Some(cap) = query.softcap {
            s = (s / cap).tanh() * cap;
        }
        max = max.max(s);
        scores.push(s);
    }
    let mut sum = 0.0f32;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        sum += *s;
    }
    let inv = 1.0 / sum;
    out.fill(0.0);
    let values = ctx_range
        .map(|r| head_of(committed.v, r * committed.stride + off, d))
        .chain(
            tail_rows
                .iter()
                .map(|&r| head_of(tail.v, r * tail.stride + off, d)),
        );
    for (v, &p) in values.zip(scores.iter()) {
        E::load(v, row);
        let w = p * inv;
        for (o, &x) in out.iter_mut().zip(row.iter()) {
            *o += w * x;
        }
    }
}

/// Largest head size the attention kernel takes (Gemma 2/3 use 256).
pub const MAX_HEAD_DIM: usize = 512;

#[inline(always)]
fn head_of<E>(rows: &[E], at: usize, d: usize) -> &[E] {
    &rows[at..at + d]
}

/// Dot product in a fixed order (element `i` into lane `i % 8`, then a fixed
/// tree), so the result never depends on where the key came from.
#[inline]
fn dot(q: &[f32], k: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (qc, kc) = (q.chunks_exact(8), k.chunks_exact(8));
    let (qr, kr) = (qc.remainder(), kc.remainder());
    for (a, b) in qc.zip(kc) {
        for ((l, &x), &y) in acc.iter_mut().zip(a).zip(b) {
            *l += x * y;
        }
    }
    for ((l, &x), &y) in acc.iter_mut().zip(qr).zip(kr) {
        *l += x * y;
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(q: &[f32], keys: &[Vec<f32>], vals: &[Vec<f32>], scale: f32) -> Vec<f64> {
        let s: Vec<f64> = keys
            .iter()
            .map(|k| {
                q.iter()
                    .zip(k)
                    .map(|(a, b)| (*a as f64) * (*b as f64))
                    .sum::<f64>()
                    * scale as f64
            })
            .collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
        let z: f64 = e.iter().sum();
        let mut out = vec![0.0f64; q.len()];
        for (w, v) in e.iter().zip(vals) {
            for (o, x) in out.iter_mut().zip(v) {
                *o += w / z * *x as f64;
            }
        }
        out
    }

    #[test]
    fn matches_softmax_reference_and_is_split_invariant() {
        let d = 12;
        let stride = 2 * d; // two KV heads, we use the second
        let n = 7;
        let mut seed = 1u32;
        let mut rnd = || {
            seed = seed.wrapping_mul(1664525).wrapping_add(1013904223);
            (seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        };
        let k: Vec<f32> = (0..n * stride).map(|_| rnd()).collect();
        let v: Vec<f32> = (0..n * stride).map(|_| rnd()).collect();
        let q: Vec<f32> = (0..d).map(|_| rnd() * 4.0).collect();
        let hq = HeadQuery {
            q: &q,
            kv_offset: d,
            scale: 0.3,
            softcap: None,
        };
        let all = KvRows {
            k: &k,
            v: &v,
            stride,
        };
        let mut scores = Vec::new();
        // all committed
        let mut a = vec![0.0; d];
        attend_head(&hq, all, 0..n, all, &[], &mut scores, &mut a);
        // split: 4 committed, 3 from the pass
        let mut b = vec![0.0; d];
        attend_head(&hq, all, 0..4, all, &[4, 5, 6], &mut scores, &mut b);
        assert_eq!(a, b, "split between committed and pass rows changed bits");
        let keys: Vec<Vec<f32>> = (0..n)
            .map(|r| k[r * stride + d..r * stride + 2 * d].to_vec())
            .collect();
        let vals: Vec<Vec<f32>> = (0..n)
            .map(|r| v[r * stride + d..r * stride + 2 * d].to_vec())
            .collect();
        let want = reference(&q, &keys, &vals, 0.3);
        for i in 0..d {
            assert!((a[i] as f64 - want[i]).abs() < 1e-5, "{i}");
        }
    }
}
