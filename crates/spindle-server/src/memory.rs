//! Where the server's memory goes, by part: the engine's (weights, KV pool,
//! caches, buffers), the server's own caches, the allocator's view and the
//! process's resident set. `/metrics` reports it as `spindle:memory_bytes`
//! and `process_resident_memory_bytes`; `spindle serve` trims the heap and
//! logs it at debug level every [`LOG_EVERY`] (target
//! `spindle_server::memory`).

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::AppState;
use crate::Shared;

/// How often the memory line is logged (at debug level).
pub const LOG_EVERY: Duration = Duration::from_secs(10);

/// The resident set just after the last periodic trim (0 before the
/// first): the process's memory without the freed pages the arenas hold
/// between trims, so what grows here is held, not merely reused.
static RESIDENT_AFTER_TRIM: AtomicU64 = AtomicU64::new(0);

/// The memory of the server by part, in bytes (parts that overlap say so
/// in their names: `kv_prefix_cached` is inside `kv_pool`; the allocator's
/// parts count every heap allocation, the caches included).
pub fn parts(state: &AppState) -> Vec<(&'static str, u64)> {
    let mut parts = state.engine.metrics.memory_parts();
    parts.push(("decide_priors", state.priors.bytes() as u64));
    parts.push((
        "resident_after_trim",
        RESIDENT_AFTER_TRIM.load(Ordering::Relaxed),
    ));
    if let Some(a) = allocator() {
        parts.push(("allocator_in_use", a.in_use));
        parts.push(("allocator_free_held", a.free_held));
    }
    parts
}

/// The bounds of everything that grows with the traffic served, in bytes,
/// for `/props` and the start-up line.
pub fn bounds(state: &AppState) -> Vec<(&'static str, u64)> {
    let mut bounds = vec![
        ("decide_priors", state.priors.max_bytes() as u64),
        ("spare_logits", spindle_model::SPARE_LOGITS_MAX_BYTES as u64),
    ];
    if let Some(t) = state
        .props
        .speculation
        .as_ref()
        .and_then(|s| s.traffic_cache_bytes)
    {
        bounds.push(("spec_traffic_cache", t as u64));
    }
    bounds
}

/// `spindle:memory_bytes{part}`, `spindle:memory_bound_bytes{part}` and
/// `process_resident_memory_bytes`, in Prometheus text format.
pub fn render(state: &AppState) -> String {
    let mut out = String::new();
    let families = [
        (
            "spindle:memory_bytes",
            "Memory by part: weights, head_screen, kv_pool (allocated up front; kv_prefix_cached is inside it), pass_buffers, spare_logits, spec_traffic_cache, decide_priors, the resident set just after the last periodic heap trim, and the allocator's bytes in use and free but held.",
            parts(state),
        ),
        (
            "spindle:memory_bound_bytes",
            "The bound of each part that grows with the traffic served.",
            bounds(state),
        ),
    ];
    for (name, help, values) in families {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for (part, bytes) in values {
            let _ = writeln!(
                out,
                "{name}{{model_name=\"{}\",part=\"{part}\"}} {bytes}",
                state.model_name
            );
        }
    }
    if let Some(rss) = resident_bytes() {
        let name = "process_resident_memory_bytes";
        let _ = writeln!(
            out,
            "# HELP {name} Resident memory size in bytes.\n# TYPE {name} gauge\n{name} {rss}"
        );
    }
    out
}

/// One line for the log: the resident set, then every part, in MiB.
pub fn summary(state: &AppState) -> String {
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let mut line = match resident_bytes() {
        Some(rss) => format!("resident {:.1} MiB:", mib(rss)),
        None => "memory:".to_string(),
    };
    for (part, bytes) in parts(state) {
        let _ = write!(line, " {part} {:.1}", mib(bytes));
    }
    line
}

/// Every [`LOG_EVERY`] until the runtime stops: hands the heap's free pages
/// back to the system, then logs [`summary`] at debug level.
///
/// glibc keeps freed blocks resident unless they end an arena, and serves
/// logits buffers of several MiB from its arenas once it has freed one
/// (its mmap threshold rises); without the trim `bench/soak` saw the
/// resident set step up by 14-25 MiB at a time while the heap in use stayed
/// flat. Mapping those buffers on their own instead (a fixed threshold)
/// kept RSS flat but cost 12-13% of `bench/agentic`'s throughput in page
/// faults; a trim every 10 s costs a few milliseconds (docs/PERF.md §37).
pub fn spawn_housekeeping(state: Shared) {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(LOG_EVERY);
        loop {
            every.tick().await;
            let trimmed = tokio::task::spawn_blocking(|| {
                spindle_model::heap::release_freed_memory();
                resident_bytes()
            })
            .await;
            if let Ok(Some(rss)) = trimmed {
                RESIDENT_AFTER_TRIM.store(rss, Ordering::Relaxed);
            }
            if tracing::enabled!(target: "spindle_server::memory", tracing::Level::DEBUG) {
                tracing::debug!(target: "spindle_server::memory", "{}", summary(&state));
            }
        }
    });
}

/// The process's resident set (`VmRSS` of /proc/self/status), where the
/// system reports it.
pub fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// What the C allocator holds: bytes handed out, and bytes freed but kept
/// (not returned to the system).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocatorBytes {
    pub in_use: u64,
    pub free_held: u64,
}

/// glibc's `mallinfo2` over every arena; `None` on other C libraries.
pub fn allocator() -> Option<AllocatorBytes> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        #[repr(C)]
        struct Mallinfo2 {
            arena: usize,
            ordblks: usize,
            smblks: usize,
            hblks: usize,
            hblkhd: usize,
            usmblks: usize,
            fsmblks: usize,
            uordblks: usize,
            fordblks: usize,
            keepcost: usize,
        }
        extern "C" {
            fn mallinfo2() -> Mallinfo2;
        }
        // SAFETY: mallinfo2 (glibc 2.33+) takes no arguments and returns
        // a plain struct of counters; it locks each arena while it reads it.
        let m = unsafe { mallinfo2() };
        Some(AllocatorBytes {
            // Small blocks in use, and blocks mapped on their own.
            in_use: (m.uordblks + m.hblkhd) as u64,
            free_held: m.fordblks as u64,
        })
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_resident_set_and_the_allocator_see_a_large_allocation() {
        let Some(before) = resident_bytes() else {
            return;
        };
        let heap_before = allocator();
        let big = vec![1u8; 64 << 20];
        std::hint::black_box(&big);
        let after = resident_bytes().expect("read before");
        // Other tests of this binary run beside it: margins, not equalities.
        assert!(
            after >= before + (48 << 20),
            "{before} -> {after} bytes resident"
        );
        if let (Some(a), Some(b)) = (heap_before, allocator()) {
            assert!(
                b.in_use >= a.in_use + (48 << 20),
                "{} -> {} bytes in use",
                a.in_use,
                b.in_use
            );
        }
        drop(big);
    }
}
