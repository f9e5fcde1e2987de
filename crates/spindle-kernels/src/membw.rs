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

/// Round trip of one cache line between two of the pool's threads, in
/// seconds (best of `reps` runs of `rounds` exchanges), or `None` with
/// fewer than two threads or when the two did not run at once.
///
/// It tells apart where the OS and hypervisor put the threads, which moves
/// every multi-threaded number: tens of nanoseconds between cores that share
/// a cache, hundreds across dies (docs/PERF.md §50 found this VM's passes in
/// two such states).
pub fn handoff_round_trip(pool: &ThreadPool, rounds: usize, reps: usize) -> Option<f64> {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::time::Duration;
    if pool.n_threads() < 2 || rounds == 0 {
        return None;
    }
    // Exchanges before the clock starts: the second thread may still be
    // waking up.
    const WARM: u64 = 64;
    let mut best: Option<f64> = None;
    for _ in 0..reps.max(1) {
        let turn = AtomicU64::new(0);
        let gave_up = AtomicBool::new(false);
        let seconds = AtomicU64::new(f64::NAN.to_bits());
        let total = WARM + rounds as u64;
        pool.run(&|i, _| {
            if i > 1 {
                return;
            }
            // Thread 0 moves the count from even to odd, thread 1 back.
            let deadline = Instant::now() + Duration::from_millis(200);
            let mut start = None;
            for r in 0..total {
                let want = 2 * r + i as u64;
                let mut spins = 0u32;
                while turn.load(Ordering::Acquire) != want {
                    std::hint::spin_loop();
                    spins = spins.wrapping_add(1);
                    if spins.is_multiple_of(1024)
                        && (gave_up.load(Ordering::Relaxed) || Instant::now() > deadline)
                    {
                        gave_up.store(true, Ordering::Relaxed);
                        return;
                    }
                }
                if i == 0 && r == WARM {
                    start = Some(Instant::now());
                }
                turn.store(want + 1, Ordering::Release);
            }
            if let Some(t) = start {
                // Thread 0's last store is answered by thread 1's last one.
                while turn.load(Ordering::Acquire) != 2 * total {
                    if gave_up.load(Ordering::Relaxed) {
                        return;
                    }
                    std::hint::spin_loop();
                }
                let s = t.elapsed().as_secs_f64() / rounds as f64;
                seconds.store(s.to_bits(), Ordering::Relaxed);
            }
        });
        let s = f64::from_bits(seconds.load(Ordering::Relaxed));
        if !gave_up.load(Ordering::Relaxed) && s.is_finite() {
            best = Some(best.map_or(s, |b: f64| b.min(s)));
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handoff_needs_two_threads_and_is_a_plausible_time() {
        assert_eq!(handoff_round_trip(&ThreadPool::new(1), 1000, 1), None);
        // Two threads on a loaded test machine may not run at once (then
        // `None`); when they do, a round trip is well under a millisecond.
        if let Some(s) = handoff_round_trip(&ThreadPool::new(2), 2000, 3) {
            assert!(s > 0.0 && s < 1e-3, "round trip {s} s");
        }
    }
}
