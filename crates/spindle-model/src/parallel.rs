//! Splitting independent per-row work of a pass across the thread pool.

use std::sync::atomic::{AtomicUsize, Ordering};

use spindle_kernels::threadpool::row_share;
use spindle_kernels::ThreadPool;

/// Runs `f(task)` for every task in `0..n_tasks`, each task on exactly one
/// thread. Threads take the next unclaimed task from a shared counter, so
/// uneven tasks (causal attention: later rows see more keys) balance out.
/// The result of a task never depends on which thread ran it.
pub(crate) fn for_each_task(pool: &ThreadPool, n_tasks: usize, f: impl Fn(usize) + Sync) {
    if n_tasks <= 1 || pool.n_threads() <= 1 {
        (0..n_tasks).for_each(f);
        return;
    }
    let next = AtomicUsize::new(0);
    pool.run(&|_, _| loop {
        let t = next.fetch_add(1, Ordering::Relaxed);
        if t >= n_tasks {
            break;
        }
        f(t);
    });
}

/// Fewer values than this in a cheap row-wise step (a norm, a residual add)
/// and it runs on the calling thread: handing a few microseconds of work to
/// the pool can cost more than the work (docs/PERF.md §50).
const SERIAL_ROW_VALUES: usize = 24 * 1024;

/// Runs `f(row)` for rows `0..n_rows`, each thread its [`row_share`] (the
/// activations' quantization and prompt matmuls split rows the same way),
/// so a row-wise step finds its rows in the cache of the thread that wrote
/// them (the dynamic split of [`for_each_task`] sent them across dies: a
/// prompt pass's norms took 28 ms instead of 6 on a VM whose two cores sit
/// on different dies, docs/PERF.md §50).
pub(crate) fn for_each_row_range(pool: &ThreadPool, n_rows: usize, f: impl Fn(usize) + Sync) {
    if n_rows <= 1 || pool.n_threads() <= 1 {
        (0..n_rows).for_each(f);
        return;
    }
    pool.run(&|t, nt| row_share(n_rows, t, nt).for_each(&f));
}

/// [`for_each_row_range`] over `n_rows` rows of `row_values` values each, on
/// the calling thread alone when they are few.
pub(crate) fn for_each_row(
    pool: &ThreadPool,
    n_rows: usize,
    row_values: usize,
    f: impl Fn(usize) + Sync,
) {
    if n_rows.saturating_mul(row_values) < SERIAL_ROW_VALUES {
        (0..n_rows).for_each(f);
        return;
    }
    for_each_row_range(pool, n_rows, f)
}

/// A mutable slice shared by tasks that write disjoint chunks of it.
pub(crate) struct DisjointChunks<'a, T> {
    ptr: *mut T,
    len: usize,
    chunk: usize,
    _life: std::marker::PhantomData<&'a mut [T]>,
}

// SAFETY: tasks only reach the slice through `chunk_mut`, whose callers
// promise that no two live borrows name the same chunk.
unsafe impl<T: Send> Sync for DisjointChunks<'_, T> {}

impl<'a, T> DisjointChunks<'a, T> {
    pub(crate) fn new(slice: &'a mut [T], chunk: usize) -> Self {
        DisjointChunks {
            ptr: slice.as_mut_ptr(),
            len: slice.len(),
            chunk,
            _life: std::marker::PhantomData,
        }
    }

    /// Chunks `first..end` of the slice as one run (the last one may be
    /// shorter).
    ///
    /// # Safety
    /// No other live reference to any of those chunks may exist.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn run_mut(&self, first: usize, end: usize) -> &mut [T] {
        let start = first * self.chunk;
        let stop = (end * self.chunk).min(self.len);
        assert!(
            start <= stop && first < end,
            "chunks {first}..{end} out of range"
        );
        // SAFETY: in bounds (checked above); exclusive by the caller's promise.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), stop - start) }
    }

    /// Chunk `i` of the slice (the last one may be shorter).
    ///
    /// # Safety
    /// No other live reference to chunk `i` may exist.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn chunk_mut(&self, i: usize) -> &mut [T] {
        let start = i * self.chunk;
        assert!(start < self.len, "chunk {i} out of range");
        let len = self.chunk.min(self.len - start);
        // SAFETY: in bounds (checked above); exclusive by the caller's promise.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), len) }
    }
}
