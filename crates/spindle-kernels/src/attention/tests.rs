use half::f16;

use super::*;
use crate::simd::available_isas;

struct Rng(u32);

impl Rng {
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_mul(1664525).wrapping_add(1013904223);
        (self.0 >> 8) as f32 / (1u32 << 24) as f32 - 0.5
    }
}

/// Softmax attention of one head in f64: the independent reference.
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

/// Stored rows of `stride` values (two KV heads), as element type `E`.
fn store_rows<E: KvElem>(values: &[f32], stride: usize) -> Vec<Vec<E>> {
    values
        .chunks_exact(stride)
        .map(|r| {
            let mut out = vec![E::ZERO; stride / E::VALUES];
            E::store(r, &mut out);
            out
        })
        .collect()
}

/// `n` random stored key rows and value rows of `stride` values.
fn random_kv<E: KvElem>(rng: &mut Rng, n: usize, stride: usize) -> (Vec<Vec<E>>, Vec<Vec<E>>) {
    let kf: Vec<f32> = (0..n * stride).map(|_| rng.next()).collect();
    let vf: Vec<f32> = (0..n * stride).map(|_| rng.next()).collect();
    (store_rows::<E>(&kf, stride), store_rows::<E>(&vf, stride))
}

/// Attention of each row over `keys[range]` through chunks of `chunk`
/// positions starting at position 0, each row alone.
fn attend_alone<E: KvElem>(
    isa: Isa,
    group: &HeadGroup,
    q: &[f32],
    k: &[&[E]],
    v: &[&[E]],
    range: Range<usize>,
    chunk: usize,
) -> Vec<f32> {
    let mut state = vec![0.0; group.partial_len()];
    empty_partial(group, &mut state);
    let mut part = vec![0.0; group.partial_len()];
    let mut scratch = ChunkScratch::default();
    let mut c = range.start / chunk * chunk;
    while c < range.end {
        let (lo, hi) = (c.max(range.start), (c + chunk).min(range.end));
        let row = TileRow {
            q,
            keys: lo - c..hi - c,
        };
        let end = (c + chunk).min(k.len());
        chunk_partials(
            isa,
            group,
            &[row],
            &k[c..end],
            &v[c..end],
            &mut scratch,
            &mut part,
        );
        fold_partial(isa, group, &mut state, &part);
        c += chunk;
    }
    let mut out = vec![0.0; group.heads * group.head_dim];
    finish(group, &state, &mut out);
    out
}

/// `d`-value heads, the group reading the second of two KV heads (so a
/// Q8_0 block may straddle two heads when `d` is not a multiple of 32).
fn check_type<E: KvElem>(name: &str, d: usize) {
    if let Some(note) = crate::simd::untested_isas_note() {
        eprintln!("{note}");
    }
    let (heads, n, chunk) = (3, 45, 16);
    let stride = 2 * d;
    let mut rng = Rng(7);
    let (ks, vs) = random_kv::<E>(&mut rng, n, stride);
    let (k, v): (Vec<&[E]>, Vec<&[E]>) = (
        ks.iter().map(Vec::as_slice).collect(),
        vs.iter().map(Vec::as_slice).collect(),
    );
    let group = HeadGroup {
        heads,
        head_dim: d,
        kv_offset: d,
        scale: 0.3,
        softcap: None,
    };
    let queries: Vec<Vec<f32>> = (0..4)
        .map(|_| (0..heads * d).map(|_| rng.next() * 4.0).collect())
        .collect();
    // The stored values as the kernel sees them, widened by the scalar path.
    let widen = |rows: &[&[E]]| -> Vec<Vec<f32>> {
        rows.iter()
            .map(|r| {
                let mut all = vec![0.0; r.len() * E::VALUES];
                E::widen(r, &mut all);
                all[d..2 * d].to_vec()
            })
            .collect()
    };
    let (kw, vw) = (widen(&k), widen(&v));
    let ranges = [0..n, 5..n, 3..17, 16..33, 0..1];
    for isa in available_isas() {
        for (qi, q) in queries.iter().enumerate() {
            for range in ranges.clone() {
                let got = attend_alone(isa, &group, q, &k, &v, range.clone(), chunk);
                let scalar = attend_alone(Isa::Scalar, &group, q, &k, &v, range.clone(), chunk);
                assert_eq!(got, scalar, "{name} {isa}: differs from scalar");
                for h in 0..heads {
                    let want = reference(
                        &q[h * d..(h + 1) * d],
                        &kw[range.clone()],
                        &vw[range.clone()],
                        0.3,
                    );
                    for i in 0..d {
                        let err = (got[h * d + i] as f64 - want[i]).abs();
                        assert!(err < 1e-5, "{name} {isa} q{qi} {range:?} head {h}: {err}");
                    }
                }
            }
        }
        // A tile of rows gives each row what it gets alone.
        let c = 16;
        let row_ranges = [0..16, 2..9, 5..16, 0..0, 15..16];
        let rows: Vec<TileRow<'_>> = row_ranges
            .iter()
            .zip(queries.iter().cycle())
            .map(|(r, q)| TileRow { q, keys: r.clone() })
            .collect();
        let plen = group.partial_len();
        let mut tile = vec![0.0; rows.len() * plen];
        let mut scratch = ChunkScratch::default();
        chunk_partials(
            isa,
            &group,
            &rows,
            &k[c..c + 16],
            &v[c..c + 16],
            &mut scratch,
            &mut tile,
        );
        for (i, row) in rows.iter().enumerate() {
            let mut alone = vec![1.0; plen];
            chunk_partials(
                isa,
                &group,
                std::slice::from_ref(row),
                &k[c..c + 16],
                &v[c..c + 16],
                &mut ChunkScratch::default(),
                &mut alone,
            );
            assert_eq!(
                alone,
                tile[i * plen..(i + 1) * plen],
                "{name} {isa}: row {i} depends on its tile"
            );
        }
        // A head alone gives what it gives inside its group.
        let one = HeadGroup { heads: 1, ..group };
        let all = attend_alone(isa, &group, &queries[0], &k, &v, 0..n, chunk);
        for h in 0..heads {
            let alone = attend_alone(
                isa,
                &one,
                &queries[0][h * d..(h + 1) * d],
                &k,
                &v,
                0..n,
                chunk,
            );
            assert_eq!(
                alone,
                all[h * d..(h + 1) * d],
                "{name} {isa}: head {h} depends on its group"
            );
        }
    }
}

#[test]
fn chunked_attention_matches_reference_and_is_invariant_for_every_stored_type() {
    for d in [64, 48] {
        check_type::<f32>("f32", d);
        check_type::<f16>("f16", d);
        check_type::<BlockQ8>("q8_0", d);
    }
}

/// Many rows over a whole chunk (the wide kernels where the CPU has them,
/// `wide.rs`) give each row the bits it gets alone, and the scalar path's.
fn check_wide<E: KvElem>(name: &str, d: usize, n: usize) {
    let heads = 3;
    let stride = 2 * d;
    let mut rng = Rng(11);
    let (ks, vs) = random_kv::<E>(&mut rng, n, stride);
    let (k, v): (Vec<&[E]>, Vec<&[E]>) = (
        ks.iter().map(Vec::as_slice).collect(),
        vs.iter().map(Vec::as_slice).collect(),
    );
    for softcap in [None, Some(2.0)] {
        let group = HeadGroup {
            heads,
            head_dim: d,
            kv_offset: d,
            scale: 0.2,
            softcap,
        };
        let queries: Vec<Vec<f32>> = (0..9)
            .map(|_| (0..heads * d).map(|_| rng.next() * 3.0).collect())
            .collect();
        // Rows that see every key, some keys, one key and none.
        let ranges = [
            0..n,
            0..n,
            1..n,
            0..0,
            0..n,
            0..n / 2,
            3..n - 2,
            n - 1..n,
            0..n,
        ];
        let rows: Vec<TileRow<'_>> = ranges
            .iter()
            .zip(&queries)
            .map(|(r, q)| TileRow { q, keys: r.clone() })
            .collect();
        let plen = group.partial_len();
        let run = |isa: Isa, rows: &[TileRow<'_>]| {
            let mut out = vec![7.0; rows.len() * plen];
            chunk_partials(
                isa,
                &group,
                rows,
                &k,
                &v,
                &mut ChunkScratch::default(),
                &mut out,
            );
            out
        };
        let scalar = run(Isa::Scalar, &rows);
        for isa in available_isas() {
            let tile = run(isa, &rows);
            for (i, row) in rows.iter().enumerate() {
                let alone = run(isa, std::slice::from_ref(row));
                let got = &tile[i * plen..(i + 1) * plen];
                assert_eq!(
                    alone, got,
                    "{name} {isa} d={d} n={n}: row {i} depends on its tile"
                );
                assert_eq!(
                    &scalar[i * plen..(i + 1) * plen],
                    got,
                    "{name} {isa} d={d} n={n}: row {i} differs from scalar"
                );
            }
        }
    }
}

#[test]
fn rows_sharing_a_whole_chunk_get_their_own_bits_on_every_path() {
    for (d, n) in [(64, 256), (128, 200), (64, 37)] {
        check_wide::<f32>("f32", d, n);
        check_wide::<f16>("f16", d, n);
        check_wide::<BlockQ8>("q8_0", d, n);
    }
}

/// Values `i..i+8` as the AVX2 path loads them, or as the scalar path reads them.
fn eight<E: KvElem>(isa: Isa, row: &[E], i: usize) -> [f32; 8] {
    #[cfg(target_arch = "x86_64")]
    if isa.uses_avx2() {
        let mut out = [0.0f32; 8];
        // SAFETY: Avx2 is listed only on CPUs with AVX2 and F16C; i + 8 <= 96.
        unsafe { std::arch::x86_64::_mm256_storeu_ps(out.as_mut_ptr(), E::load8(row, i)) };
        return out;
    }
    let _ = isa;
    std::array::from_fn(|l| E::value(row, i + l))
}

#[test]
fn widening_is_exact_and_the_same_on_every_path() {
    if let Some(note) = crate::simd::untested_isas_note() {
        eprintln!("{note}");
    }
    let mut rng = Rng(3);
    let x: Vec<f32> = (0..96).map(|_| rng.next() * 10.0).collect();
    let h: Vec<f16> = x.iter().map(|&v| f16::from_f32(v)).collect();
    let mut b = vec![BlockQ8::ZERO; 3];
    BlockQ8::store(&x, &mut b);
    for isa in available_isas() {
        for i in (0..96).step_by(8) {
            let got = eight(isa, &h, i);
            assert!(
                got.iter().zip(&h[i..]).all(|(o, h)| *o == h.to_f32()),
                "{isa} f16"
            );
            for (l, o) in eight(isa, &b, i).iter().enumerate() {
                let blk = &b[(i + l) / 32];
                assert_eq!(
                    *o,
                    blk.d.to_f32() * blk.qs[(i + l) % 32] as f32,
                    "{isa} q8_0 value {}",
                    i + l
                );
            }
        }
    }
}

#[test]
fn folding_an_empty_partial_changes_nothing() {
    let group = HeadGroup {
        heads: 2,
        head_dim: 4,
        kv_offset: 0,
        scale: 1.0,
        softcap: None,
    };
    let mut state = vec![0.0; group.partial_len()];
    empty_partial(&group, &mut state);
    let part: Vec<f32> = (0..group.partial_len()).map(|i| i as f32 * 0.25).collect();
    fold_partial(Isa::Scalar, &group, &mut state, &part);
    assert_eq!(state, part, "the first partial is copied");
    let mut empty = vec![0.0; group.partial_len()];
    empty_partial(&group, &mut empty);
    fold_partial(Isa::Scalar, &group, &mut state, &empty);
    assert_eq!(state, part);
}
