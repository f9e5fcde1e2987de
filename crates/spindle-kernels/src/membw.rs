//! The machine's own ceiling: how fast the pool's threads can read memory.

use std::time::Instant;

use crate::ThreadPool;

/// Read bandwidth in bytes per second: every thread sums its share of a
/// `bytes`-long array of u64, best of `reps` passes. Use an array well beyond
/// the last-level cache (1 GiB or more) to measure DRAM.
pub fn read_bandwidth(pool: &ThreadPool, bytes: usize, reps: usize) -> f64 {
    let words = (bytes / 8).max(1);
    // Touch every page so the first pass does not measure page faults.
    let data: Vec<u64> = (0..words as u64).collect();
    let mut best = f64::INFINITY;
    let sink = std::sync::atomic::AtomicU64::new(0);
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        pool.run(&|i, n| {
            let (a, b) = (words * i / n, words * (i + 1) / n);
            // Eight independent sums keep the loads in flight.
            let mut acc = [0u64; 8];
            let chunk = &data[a..b];
            let mut it = chunk.chunks_exact(8);
            for c in &mut it {
                for (s, &v) in acc.iter_mut().zip(c) {
                    *s = s.wrapping_add(v);
                }
            }
            for &v in it.remainder() {
                acc[0] = acc[0].wrapping_add(v);
            }
            let total = acc.iter().fold(0u64, |s, &v| s.wrapping_add(v));
            sink.fetch_add(total, std::sync::atomic::Ordering::Relaxed);
        });
        best = best.min(t.elapsed().as_secs_f64());
    }
    std::hint::black_box(sink.load(std::sync::atomic::Ordering::Relaxed));
    (words * 8) as f64 / best
}
