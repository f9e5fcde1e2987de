//! Splitting independent per-row work of a pass across the thread pool.

use spindle_kernels::ThreadPool;

/// Runs `f(task)` for every task in `0..n_tasks`, each task on exactly one
/// thread, contiguous ranges per thread. The result of a task never depends
/// on the split.
pub(crate) fn for_each_task(pool: &ThreadPool, n_tasks: usize, f: impl Fn(usize) + Sync) {
    if n_tasks <= 1 || pool.n_threads() <= 1 {
        (0..n_tasks).for_each(f);
        return;
    }
    pool.run(&|tid, nt| {
        let (start, end) = (n_tasks * tid / nt, n_tasks * (tid + 1) / nt);
        (start..end).for_each(&f);
    });
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

    /// Chunk `i` of the slice.
    ///
    /// # Safety
    /// No other live reference to chunk `i` may exist.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn chunk_mut(&self, i: usize) -> &mut [T] {
        let start = i * self.chunk;
        assert!(start + self.chunk <= self.len, "chunk {i} out of range");
        // SAFETY: in bounds (checked above); exclusive by the caller's promise.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), self.chunk) }
    }
}
