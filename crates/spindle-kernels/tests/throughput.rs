//! Manual throughput check, not a timed test:
//!
//! ```text
//! cargo test -p spindle-kernels --test throughput -- --ignored --nocapture
//! ```
//!
//! Prints GB/s of weights streamed for decode-shaped (n = 1) matvecs, Gemma 3
//! 270M's output head first, and GMAC/s for a few prefill-shaped ones.

mod common;

use common::{random_acts, random_weights};
use rand::rngs::StdRng;
use rand::SeedableRng;
use spindle_formats::storage::Storage;
use spindle_kernels::float_panels::{matmul_panels, PanelMatrix};
use spindle_kernels::matmul::matmul_with_isa;
use spindle_kernels::quant::vertical::{to_vertical, vertical_supported};
use spindle_kernels::simd::detected_isa;
use spindle_kernels::{GgmlType, ThreadPool, WeightLayout, WeightView};
use std::time::Instant;

fn bench(pool: &ThreadPool, ty: GgmlType, rows: usize, cols: usize, n: usize, min_secs: f64) {
    let mut rng = StdRng::seed_from_u64(1);
    let w = random_weights(&mut rng, ty, rows, cols);
    let x = random_acts(&mut rng, n, cols);
    let view = WeightView::new(ty, rows, cols, &w).unwrap();
    let mut out = vec![0.0f32; n * rows];
    let isa = detected_isa();
    for _ in 0..2 {
        matmul_with_isa(isa, &view, &x, n, &mut out, pool).unwrap();
    }
    // Best single call: the machine may be shared, and the best call is the
    // closest to what the kernel does on a quiet one.
    let start = Instant::now();
    let mut iters = 0u32;
    let mut best = f64::MAX;
    while iters < 5 || start.elapsed().as_secs_f64() < min_secs {
        let t = Instant::now();
        matmul_with_isa(isa, &view, &x, n, &mut out, pool).unwrap();
        best = best.min(t.elapsed().as_secs_f64());
        iters += 1;
    }
    let mean = start.elapsed().as_secs_f64() / iters as f64;
    let gbs = w.len() as f64 / best / 1e9;
    let gmacs = (rows * cols * n) as f64 / best / 1e9;
    println!(
        "{isa} {threads}t {ty:>5} {rows:>6}x{cols:<5} n={n:<4} best {ms:8.3} ms (mean {mean_ms:8.3})  {gbs:6.2} GB/s  {gmacs:7.2} GMAC/s",
        threads = pool.n_threads(),
        ms = best * 1e3,
        mean_ms = mean * 1e3,
    );
}

#[test]
#[ignore = "manual throughput check; run with --ignored --nocapture"]
fn matvec_throughput() {
    let pool = ThreadPool::new(2);
    // Gemma 3 270M tied output head, Q8_0, 171.5 MiB.
    bench(&pool, GgmlType::Q8_0, 262_144, 640, 1, 3.0);
    let one = ThreadPool::new(1);
    bench(&one, GgmlType::Q8_0, 262_144, 640, 1, 2.0);
    for (ty, rows, cols) in [
        (GgmlType::Q5_0, 1024, 640),
        (GgmlType::Q5_0, 2048, 640),
        (GgmlType::Q4_K, 640, 2048),
        (GgmlType::Q6_K, 640, 2048),
        (GgmlType::Q4_K, 640, 1024),
        (GgmlType::Q8_0, 256, 640),
        (GgmlType::F32, 2048, 640),
    ] {
        bench(&pool, ty, rows, cols, 1, 0.5);
        bench(&one, ty, rows, cols, 1, 0.5);
    }
    for (ty, rows, cols) in [
        (GgmlType::Q5_0, 2048, 640),
        (GgmlType::Q4_K, 640, 2048),
        (GgmlType::Q6_K, 640, 2048),
        (GgmlType::Q8_0, 2048, 640),
    ] {
        bench(&pool, ty, rows, cols, 64, 0.5);
    }
}

/// The output head against the few rows of a speculative tree: the cost
/// curve of verification is mostly this.
#[test]
#[ignore = "manual throughput check; run with --ignored --nocapture"]
fn head_rows_throughput() {
    let pool = ThreadPool::new(2);
    for n in [1, 2, 4, 8, 16] {
        bench(&pool, GgmlType::Q8_0, 262_144, 640, n, 1.0);
    }
}

/// One layer's FFN matrices against the few rows of a speculative tree.
#[test]
#[ignore = "manual throughput check; run with --ignored --nocapture"]
fn layer_rows_throughput() {
    let pool = ThreadPool::new(2);
    for n in [1, 2, 4, 9, 16, 64] {
        bench(&pool, GgmlType::Q5_0, 2048, 640, n, 0.5);
    }
    for n in [1, 2, 4, 9, 16, 64] {
        bench(&pool, GgmlType::Q4_K, 640, 2048, n, 0.5);
    }
    for n in [4, 9, 16, 64] {
        bench(&pool, GgmlType::Q8_0, 2048, 640, n, 0.5);
    }
}

/// GB/s of a plain read of `data` split over the pool's threads: the memory
/// bandwidth the kernels can hope for on this machine right now.
fn read_baseline(pool: &ThreadPool, data: &[u8]) -> f64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    let sink = AtomicU64::new(0);
    let mut best = f64::MAX;
    for _ in 0..10 {
        let start = Instant::now();
        pool.run(&|t, nt| {
            let chunk = data.len() / nt;
            let part = &data[t * chunk..(t + 1) * chunk];
            let mut acc = [0u64; 8];
            for c in part.chunks_exact(64) {
                for (j, a) in acc.iter_mut().enumerate() {
                    *a ^= u64::from_le_bytes(c[8 * j..8 * j + 8].try_into().unwrap());
                }
            }
            sink.fetch_xor(acc.iter().fold(0, |x, y| x ^ y), Ordering::Relaxed);
        });
        best = best.min(start.elapsed().as_secs_f64());
    }
    data.len() as f64 / best / 1e9
}

#[test]
#[ignore = "manual throughput check; run with --ignored --nocapture"]
fn matvec_head_only() {
    // Gemma 3 270M tied output head, Q8_0, 171.5 MiB, 2 then 1 threads,
    // each beside a plain read of the same bytes.
    let mut rng = StdRng::seed_from_u64(1);
    let w = random_weights(&mut rng, GgmlType::Q8_0, 262_144, 640);
    for threads in [2, 1, 2] {
        let pool = ThreadPool::new(threads);
        println!(
            "plain read, {threads}t: {:.2} GB/s",
            read_baseline(&pool, &w)
        );
        bench(&pool, GgmlType::Q8_0, 262_144, 640, 1, 3.0);
    }
}

#[test]
#[ignore = "manual throughput check; run with --ignored --nocapture"]
fn kernels_in_cache() {
    // Small enough to stay in L2: the kernels' compute speed, one thread.
    let one = ThreadPool::new(1);
    for (ty, rows, cols) in [
        (GgmlType::Q8_0, 256, 640),
        (GgmlType::Q4_0, 256, 640),
        (GgmlType::Q5_0, 256, 640),
        (GgmlType::Q8_0, 256, 512),
        (GgmlType::Q4_K, 128, 1024),
        (GgmlType::Q5_K, 128, 1024),
        (GgmlType::Q6_K, 128, 1024),
        (GgmlType::F32, 64, 640),
        (GgmlType::F16, 64, 640),
    ] {
        bench(&one, ty, rows, cols, 1, 0.3);
    }
    for (ty, rows, cols, n) in [
        (GgmlType::Q8_0, 256, 640, 16),
        (GgmlType::Q5_0, 256, 640, 16),
        (GgmlType::Q4_K, 128, 1024, 16),
        (GgmlType::Q6_K, 128, 1024, 16),
        (GgmlType::Q4_K, 640, 2048, 1),
        (GgmlType::Q4_K, 640, 2048, 64),
    ] {
        bench(&one, ty, rows, cols, n, 0.3);
    }
}

/// The layout `SPINDLE_BENCH_LAYOUT` asks for: `vertical` (matrices as the
/// loader rewrites them on VNNI machines) or `panels` (Q8_0 and Q5_0 ones in
/// panels of 16 rows, the others vertical); unset or anything else, the
/// file's order.
fn layout_asked() -> String {
    std::env::var("SPINDLE_BENCH_LAYOUT").unwrap_or_default()
}

/// Rewrites `w` into `layout` (as named by [`layout_asked`]) where its type
/// and shape allow.
fn rewrite_as(layout: &str, ty: GgmlType, rows: usize, cols: usize, w: &mut [u8]) -> WeightLayout {
    use spindle_kernels::quant::panels::{panels_supported, to_panels};
    let vertical = layout == "vertical" || layout == "panels";
    if layout == "panels" && panels_supported(ty, rows, cols) {
        to_panels(ty, rows, cols, w).unwrap();
        WeightLayout::Panels
    } else if vertical && vertical_supported(ty, cols) {
        to_vertical(ty, cols, w).unwrap();
        WeightLayout::Vertical
    } else {
        WeightLayout::Gguf
    }
}

/// A random matrix as the loader keeps it: rewritten into `layout` (see
/// [`rewrite_as`]) and in huge pages.
fn laid_out_as(
    layout: &str,
    rng: &mut StdRng,
    ty: GgmlType,
    rows: usize,
    cols: usize,
) -> (Storage, WeightLayout) {
    let mut w = random_weights(rng, ty, rows, cols);
    let layout = rewrite_as(layout, ty, rows, cols, &mut w);
    (Storage::resident_copy(&w, None).unwrap(), layout)
}

/// [`laid_out_as`] the layout asked.
fn laid_out(rng: &mut StdRng, ty: GgmlType, rows: usize, cols: usize) -> (Storage, WeightLayout) {
    laid_out_as(&layout_asked(), rng, ty, rows, cols)
}

/// Best seconds per call of an `n`-row matmul (see [`bench`]), without
/// printing.
fn time_call(pool: &ThreadPool, view: &WeightView<'_>, x: &[f32], n: usize, min_secs: f64) -> f64 {
    let mut out = vec![0.0f32; n * view.rows];
    let isa = detected_isa();
    matmul_with_isa(isa, view, x, n, &mut out, pool).unwrap();
    let start = Instant::now();
    let mut iters = 0u32;
    let mut best = f64::MAX;
    while iters < 3 || start.elapsed().as_secs_f64() < min_secs {
        let t = Instant::now();
        matmul_with_isa(isa, view, x, n, &mut out, pool).unwrap();
        best = best.min(t.elapsed().as_secs_f64());
        iters += 1;
    }
    best
}

/// Seconds per call of an `n`-row matmul with the weights not in cache, as
/// in a real forward pass (whose weights far exceed the L3 cache): calls
/// cycle `rounds` times over copies of the matrix totalling at least 128
/// MiB, laid out as `layout` names (see [`rewrite_as`]); best call.
fn time_call_cold(
    pool: &ThreadPool,
    rounds: usize,
    layout: &str,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    n: usize,
) -> f64 {
    let mut rng = StdRng::seed_from_u64(2);
    let mut one = random_weights(&mut rng, ty, rows, cols);
    let layout = rewrite_as(layout, ty, rows, cols, &mut one);
    let copies = (128usize << 20).div_ceil(one.len()).max(2);
    let all: Vec<u8> = (0..copies).flat_map(|_| one.iter().copied()).collect();
    // In huge pages, as the loader keeps weights.
    let all = Storage::resident_copy(&all, None).unwrap();
    let views: Vec<WeightView<'_>> = all
        .chunks_exact(one.len())
        .map(|w| {
            WeightView::new(ty, rows, cols, w)
                .unwrap()
                .with_layout(layout)
        })
        .collect();
    let x = random_acts(&mut rng, n, cols);
    let mut out = vec![0.0f32; n * rows];
    let isa = detected_isa();
    let mut best = f64::MAX;
    for _ in 0..rounds {
        for v in &views {
            let t = Instant::now();
            matmul_with_isa(isa, v, &x, n, &mut out, pool).unwrap();
            best = best.min(t.elapsed().as_secs_f64());
        }
    }
    best
}

#[test]
#[ignore = "manual throughput check; run with --ignored --nocapture"]
fn multi_row_throughput() {
    // Gemma 3 270M's matrices (rows = output features), n activation rows:
    // time per call, GMAC/s, and the cost of 16 rows relative to 1 row.
    // Q8_0 at the Q5_0 layers' shapes too: the layouts compared on one
    // shape (docs/PERF.md §52).
    let shapes: [(GgmlType, usize, usize, &[usize]); 11] = [
        (GgmlType::Q5_0, 1024, 640, &[1, 4, 16, 64, 512]),
        (GgmlType::Q5_0, 2048, 640, &[1, 4, 16, 64, 512]),
        (GgmlType::Q8_0, 1024, 640, &[1, 4, 16, 64, 512]),
        (GgmlType::Q8_0, 2048, 640, &[1, 4, 16, 64, 512]),
        (GgmlType::Q8_0, 256, 640, &[1, 4, 16, 64, 512]),
        (GgmlType::Q4_K, 640, 1024, &[1, 4, 16, 64, 512]),
        (GgmlType::Q4_K, 640, 2048, &[1, 4, 16, 64, 512]),
        (GgmlType::Q6_K, 640, 2048, &[1, 4, 16, 64, 512]),
        (GgmlType::Q4_K, 4096, 4096, &[1, 4, 16]),
        (GgmlType::Q6_K, 4096, 4096, &[1, 4, 16]),
        (GgmlType::Q8_0, 262_144, 640, &[1, 4, 16]),
    ];
    let filter = std::env::var("SPINDLE_BENCH_FILTER").unwrap_or_default();
    for threads in [1, 2] {
        let pool = ThreadPool::new(threads);
        for &(ty, rows, cols, ns) in &shapes {
            let name = format!("{ty} {rows}x{cols}");
            if !name.contains(filter.as_str()) {
                continue;
            }
            let mut rng = StdRng::seed_from_u64(1);
            let (w, layout) = laid_out(&mut rng, ty, rows, cols);
            let view = WeightView::new(ty, rows, cols, &w)
                .unwrap()
                .with_layout(layout);
            let min_secs = if rows > 100_000 { 2.0 } else { 0.4 };
            let mut t1 = None;
            for &n in ns {
                let x = random_acts(&mut rng, n, cols);
                let best = time_call(&pool, &view, &x, n, min_secs);
                let gmacs = (rows * cols * n) as f64 / best / 1e9;
                let ratio = match (n, t1) {
                    (1, _) => {
                        t1 = Some(best);
                        String::new()
                    }
                    (16, Some(t)) => format!("  16/1 = {:.2}x", best / t),
                    _ => String::new(),
                };
                println!(
                    "{threads}t {name:<18} n={n:<4} {us:10.1} us/call {gmacs:7.2} GMAC/s{ratio}",
                    us = best * 1e6,
                );
            }
            if rows < 100_000 {
                // As in a forward pass: weights from DRAM.
                let c1 = time_call_cold(&pool, 3, &layout_asked(), ty, rows, cols, 1);
                let c16 = time_call_cold(&pool, 3, &layout_asked(), ty, rows, cols, 16);
                println!(
                    "{threads}t {name:<18} cold: n=1 {:8.1} us, n=16 {:8.1} us  16/1 = {:.2}x",
                    c1 * 1e6,
                    c16 * 1e6,
                    c16 / c1
                );
            }
        }
    }
}

/// One chunk of attention for a tile of rows, one thread: Gemma 3 270M's
/// shape (4 query heads of 256 on one f16 KV head), 256 keys. Rows that see
/// the whole chunk take the wide kernels where the CPU has them.
#[test]
#[ignore]
fn attention_chunk_throughput() {
    use half::f16;
    use spindle_kernels::attention::{chunk_partials, ChunkScratch, HeadGroup, TileRow};
    let isa = detected_isa();
    let (heads, d, n) = (4, 256, 256);
    let mut x = 0x1234_5678u32;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        (x as f32 / u32::MAX as f32) - 0.5
    };
    let rows_f16: Vec<Vec<f16>> = (0..2 * n)
        .map(|_| (0..d).map(|_| f16::from_f32(next())).collect())
        .collect();
    let (k, v): (Vec<&[f16]>, Vec<&[f16]>) = (
        rows_f16[..n].iter().map(Vec::as_slice).collect(),
        rows_f16[n..].iter().map(Vec::as_slice).collect(),
    );
    let group = HeadGroup {
        heads,
        head_dim: d,
        kv_offset: 0,
        scale: 0.0625,
        softcap: None,
    };
    for tile in [1, 4, 16, 32, 64] {
        let qs: Vec<Vec<f32>> = (0..tile)
            .map(|_| (0..heads * d).map(|_| next()).collect())
            .collect();
        let rows: Vec<TileRow<'_>> = qs.iter().map(|q| TileRow { q, keys: 0..n }).collect();
        let mut out = vec![0.0f32; tile * group.partial_len()];
        let mut scratch = ChunkScratch::default();
        let mut calls = 0usize;
        let start = Instant::now();
        while start.elapsed().as_secs_f64() < 1.0 {
            chunk_partials(isa, &group, &rows, &k, &v, &mut scratch, &mut out);
            calls += 1;
        }
        let secs = start.elapsed().as_secs_f64() / calls as f64;
        let macs = (tile * heads * n * d * 2) as f64;
        println!(
            "attention chunk ({isa}, 1 thread): {tile:>2} rows x {heads} heads x {n} keys x {d}: {:.1} us, {:.1} GFMA/s",
            secs * 1e6,
            macs / secs / 1e9
        );
    }
}

/// The matrices of a small BERT encoder (all-MiniLM-L6-v2: width 384,
/// FFN 1536) against a batch of sentences' rows, in each weight type an
/// embedding model may be run in.
#[test]
#[ignore = "manual throughput check; run with --ignored --nocapture"]
fn encoder_rows_throughput() {
    let pool = ThreadPool::new(2);
    for ty in [GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0] {
        for (rows, cols) in [(384, 384), (1536, 384), (384, 1536)] {
            bench(&pool, ty, rows, cols, 512, 0.5);
        }
    }
    for (rows, cols) in [(384, 384), (1536, 384), (384, 1536)] {
        bench_panels(&pool, rows, cols, 512, 0.5);
    }
}

/// [`bench`] for the packed float matmul encoders run (`float_panels`).
fn bench_panels(pool: &ThreadPool, rows: usize, cols: usize, n: usize, min_secs: f64) {
    let mut rng = StdRng::seed_from_u64(1);
    let w = random_weights(&mut rng, GgmlType::F32, rows, cols);
    let x = random_acts(&mut rng, n, cols);
    let m = PanelMatrix::from_rows(rows, cols, |r, dst: &mut [f32]| {
        for (d, b) in dst.iter_mut().zip(w[r * cols * 4..].chunks_exact(4)) {
            *d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
        Ok::<(), ()>(())
    })
    .unwrap();
    let mut out = vec![0.0f32; n * rows];
    let isa = detected_isa();
    matmul_panels(isa, &m, &x, n, &mut out, pool).unwrap();
    let start = Instant::now();
    let (mut iters, mut best) = (0u32, f64::MAX);
    while iters < 5 || start.elapsed().as_secs_f64() < min_secs {
        let t = Instant::now();
        matmul_panels(isa, &m, &x, n, &mut out, pool).unwrap();
        best = best.min(t.elapsed().as_secs_f64());
        iters += 1;
    }
    println!(
        "{isa} {threads}t panels {rows:>6}x{cols:<5} n={n:<4} best {ms:8.3} ms  {gmacs:7.2} GMAC/s",
        threads = pool.n_threads(),
        ms = best * 1e3,
        gmacs = (rows * cols * n) as f64 / best / 1e9,
    );
}

/// One matmul shape, for profiling: `SPINDLE_BENCH_SHAPE=TYPE,ROWS,COLS,N[,THREADS]`
/// (default Q8_0,256,640,512 on one thread), weights in the vertical layout where
/// the type has it, or as `SPINDLE_BENCH_LAYOUT` says; with
/// `SPINDLE_BENCH_COLD=1` also with the weights from DRAM (the same layout),
/// with `SPINDLE_BENCH_COLD=only` only that, over many rounds (for `perf`).
#[test]
#[ignore = "manual throughput check; run with --ignored --nocapture"]
fn one_shape() {
    let spec = std::env::var("SPINDLE_BENCH_SHAPE").unwrap_or_else(|_| "Q8_0,256,640,512".into());
    let f: Vec<&str> = spec.split(',').collect();
    let ty = (0..64)
        .filter_map(GgmlType::from_id)
        .find(|t| t.name().eq_ignore_ascii_case(f[0]))
        .expect("a type name");
    let (rows, cols, n): (usize, usize, usize) = (
        f[1].parse().unwrap(),
        f[2].parse().unwrap(),
        f[3].parse().unwrap(),
    );
    let threads = f.get(4).map_or(1, |t| t.parse().unwrap());
    let pool = ThreadPool::new(threads);
    let mut rng = StdRng::seed_from_u64(1);
    let asked = std::env::var("SPINDLE_BENCH_LAYOUT").unwrap_or_else(|_| "vertical".into());
    let (w, layout) = laid_out_as(&asked, &mut rng, ty, rows, cols);
    let view = WeightView::new(ty, rows, cols, &w)
        .unwrap()
        .with_layout(layout);
    let x = random_acts(&mut rng, n, cols);
    let cold_asked = std::env::var("SPINDLE_BENCH_COLD").unwrap_or_default();
    if cold_asked == "only" {
        // Long enough for a profiler's samples to be the cold calls'.
        let cold = time_call_cold(&pool, 60, &asked, ty, rows, cols, n);
        println!("cold only: {:.1} us", cold * 1e6);
        return;
    }
    let best = time_call(&pool, &view, &x, n, 3.0);
    // Where the threads sit moves multi-threaded timings (docs/PERF.md §50).
    let handoff = spindle_kernels::membw::handoff_round_trip(&pool, 2000, 3)
        .map_or(String::new(), |s| format!(", hand-off {:.0} ns", s * 1e9));
    println!(
        "{} {threads}t {ty} {rows}x{cols} n={n} {layout:?}: {:.1} us, {:.1} GMAC/s{handoff}",
        detected_isa(),
        best * 1e6,
        (rows * cols * n) as f64 / best / 1e9
    );
    if cold_asked == "1" {
        let cold = time_call_cold(&pool, 3, &asked, ty, rows, cols, n);
        println!("  cold (weights from DRAM): {:.1} us", cold * 1e6);
    }
}

/// An encoder's attention as all-MiniLM-L6-v2 runs it on `bench/embed`'s
/// texts: heads of 32 dimensions, texts of 8 to 80 rows, Q, K and V read
/// from one row of 3 x 384; best of several rounds, one thread.
#[test]
#[ignore = "manual throughput check; run with --ignored --nocapture"]
fn encoder_attention_throughput() {
    use spindle_kernels::encoder_attention::text_attention;
    let (h, heads) = (384usize, 12usize);
    let mut rng = StdRng::seed_from_u64(3);
    let lens: Vec<usize> = (0..200).map(|i| 8 + (i * 37) % 73).collect();
    let texts: Vec<Vec<f32>> = lens
        .iter()
        .map(|&len| random_acts(&mut rng, len, 3 * h))
        .collect();
    let isa = detected_isa();
    let mut best = f64::MAX;
    let mut out = vec![0.0f32; 80 * h];
    for _ in 0..5 {
        let t = Instant::now();
        for (qkv, &len) in texts.iter().zip(&lens) {
            text_attention(isa, qkv, len, heads, &mut out[..len * h]);
        }
        best = best.min(t.elapsed().as_secs_f64());
    }
    let pairs: usize = lens.iter().map(|l| l * l).sum::<usize>() * heads;
    println!(
        "{isa} 1t encoder attention, 200 texts of 8-80 rows, 12 heads of 32: best {:.3} ms, {:.2} ns per query-key pair",
        best * 1e3,
        best / pairs as f64 * 1e9
    );
}

/// The exact GELU over an encoder pass's FFN rows (1536 wide), in place, one
/// thread: an L1-sized buffer and a 12 MB one.
#[test]
#[ignore = "manual throughput check; run with --ignored --nocapture"]
fn gelu_erf_throughput() {
    use spindle_kernels::activation::gelu_erf;
    let isa = detected_isa();
    let mut rng = StdRng::seed_from_u64(4);
    for n in [4096usize, 3 << 20] {
        let x0 = random_acts(&mut rng, n / 1536 + 1, 1536);
        let mut x = x0[..n].to_vec();
        let rounds = (64 << 20) / n;
        let mut best = f64::MAX;
        for _ in 0..3 {
            let t = Instant::now();
            for _ in 0..rounds {
                x.copy_from_slice(&x0[..n]);
                gelu_erf(isa, &mut x);
            }
            best = best.min(t.elapsed().as_secs_f64());
        }
        println!(
            "{isa} 1t gelu_erf over {n} values: {:.3} ns per value (copy included)",
            best / (rounds * n) as f64 * 1e9
        );
    }
}

/// One-row matmul on rows of growing length, the same values each (4M by
/// default: in L3, out of L2; `SPINDLE_BENCH_VALUES=120000000` puts them in
/// DRAM), as the loader lays them out: whether a long row (an 8B model's
/// `ffn_down`, 14,336 columns) streams slower than a short one
/// (docs/PERF.md §51, §56). `SPINDLE_BENCH_FILTER` picks types.
#[test]
#[ignore = "manual throughput check; run with --ignored --nocapture"]
fn one_row_long_rows_throughput() {
    let filter = std::env::var("SPINDLE_BENCH_FILTER").unwrap_or_default();
    let values: usize = std::env::var("SPINDLE_BENCH_VALUES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4 << 20);
    let widths: Vec<usize> = std::env::var("SPINDLE_BENCH_COLS")
        .ok()
        .map(|v| v.split(',').filter_map(|c| c.parse().ok()).collect())
        .unwrap_or_else(|| vec![2048, 4096, 8192, 14336, 28672]);
    for threads in [1, 2] {
        let pool = ThreadPool::new(threads);
        for ty in [
            GgmlType::Q4_K,
            GgmlType::Q6_K,
            GgmlType::Q8_0,
            GgmlType::Q5_0,
        ] {
            if !ty.to_string().contains(filter.as_str()) {
                continue;
            }
            for &cols in &widths {
                let rows = values / cols;
                let mut rng = StdRng::seed_from_u64(1);
                let (w, layout) = laid_out(&mut rng, ty, rows, cols);
                let view = WeightView::new(ty, rows, cols, &w)
                    .unwrap()
                    .with_layout(layout);
                let x = random_acts(&mut rng, 1, cols);
                let best = time_call(&pool, &view, &x, 1, 0.4);
                println!(
                    "{threads}t {ty:>5} {rows:>5}x{cols:<6} {layout:?} n=1 {us:8.1} us {gbs:6.2} GB/s {gmacs:6.2} GMAC/s",
                    us = best * 1e6,
                    gbs = w.len() as f64 / best / 1e9,
                    gmacs = (rows * cols) as f64 / best / 1e9,
                );
            }
        }
    }
}
