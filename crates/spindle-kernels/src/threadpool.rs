//! A small persistent thread pool for data-parallel kernels.
//!
//! [`ThreadPool::run`] calls a closure once for every index `0..n_threads`
//! and returns when all calls are done. Index 0 runs on the caller; the others
//! are claimed by the workers, and any index no worker has claimed by the time
//! the caller is done with its own is run by the caller too. So a worker the
//! OS has not scheduled (more threads than free cores) never holds up a run:
//! an index is a share of the work, not a promise of a distinct thread.
//!
//! Workers spin briefly after a job (kernels come in quick succession during a
//! forward pass), then sleep on a condition variable. A run allocates nothing.
//!
//! Calling `run` from inside a running job (on any pool) does not deadlock: the
//! nested call runs every index in turn on the calling thread.

use std::cell::Cell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker spins before it sleeps.
const SPIN_TIME: Duration = Duration::from_micros(100);

/// How long the caller spins waiting for workers before it starts yielding.
const CALLER_SPIN_TIME: Duration = Duration::from_micros(20);

/// The ticket packs the job's epoch (high bits) with the next unclaimed index
/// (low bits).
const INDEX_BITS: u32 = 16;
const INDEX_MASK: u64 = (1 << INDEX_BITS) - 1;
/// Most threads a pool can have.
const MAX_THREADS: usize = INDEX_MASK as usize;

type Job = dyn Fn(usize, usize) + Sync;

/// A job pointer with its lifetime erased. It is only dereferenced by a
/// thread holding a claimed, unfinished index of the run that published it,
/// and that run does not return before every claimed index is finished.
#[derive(Clone, Copy)]
struct JobPtr(*const Job);

impl JobPtr {
    fn erase<'a>(f: &'a (dyn Fn(usize, usize) + Sync + 'a)) -> JobPtr {
        let ptr: *const (dyn Fn(usize, usize) + Sync + 'a) = f;
        // SAFETY: only the lifetime bound of the trait object is erased (same
        // layout). See the type's docs for why the pointee outlives its uses.
        JobPtr(unsafe {
            std::mem::transmute::<*const (dyn Fn(usize, usize) + Sync + 'a), *const Job>(ptr)
        })
    }
}

// SAFETY: the pointee is `Sync`, so calling it from several threads is
// allowed; `run` keeps it alive while any thread may call it.
unsafe impl Send for JobPtr {}

struct State {
    job: Option<JobPtr>,
    epoch: u64,
    shutdown: bool,
    sleepers: usize,
}

struct Shared {
    n_threads: usize,
    state: Mutex<State>,
    wake: Condvar,
    /// `epoch << INDEX_BITS | next unclaimed index` of the current job.
    ticket: AtomicU64,
    /// Indices of the current job finished.
    done: AtomicUsize,
    /// A job call panicked on a worker.
    panicked: AtomicBool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Claims the next unclaimed index of the current job, if any.
    fn claim(&self) -> Option<usize> {
        let mut t = self.ticket.load(Ordering::Acquire);
        loop {
            let index = (t & INDEX_MASK) as usize;
            if index >= self.n_threads {
                return None;
            }
            match self
                .ticket
                .compare_exchange_weak(t, t + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Some(index),
                Err(now) => t = now,
            }
        }
    }

    /// Runs index `i` of the current job (claimed by this thread) and counts
    /// it done.
    fn run_index(&self, i: usize) {
        let job = self.lock().job;
        if let Some(JobPtr(ptr)) = job {
            // SAFETY: this thread holds claimed, unfinished index `i`, so the
            // `run` call that published `ptr` is still waiting (it returns
            // only once `done` counts every index) and the closure is alive.
            let f = unsafe { &*ptr };
            if catch_unwind(AssertUnwindSafe(|| f(i, self.n_threads))).is_err() {
                self.panicked.store(true, Ordering::Relaxed);
            }
        }
        self.done.fetch_add(1, Ordering::Release);
    }
}

thread_local! {
    /// Set while this thread is running a pool job (workers: always).
    static IN_JOB: Cell<bool> = const { Cell::new(false) };
}

/// Thread `t` of `nt`'s share of `n` rows, contiguous: from `n * t / nt`
/// up to `n * (t + 1) / nt`. The activations' quantization, the row-wise
/// steps of a pass and the prompt-sized matmuls all split rows this way, so
/// a row stays in the cache (and on the die) of the thread that wrote it
/// from one step to the next (docs/PERF.md §50).
pub fn row_share(n: usize, t: usize, nt: usize) -> std::ops::Range<usize> {
    n * t / nt..n * (t + 1) / nt
}

/// Persistent worker threads; see the module docs.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    run_lock: Mutex<()>,
}

impl ThreadPool {
    /// A pool whose jobs are split `n_threads` ways: the caller of `run` plus
    /// `n_threads - 1` workers (0 is taken as 1, at most 65535). Should the
    /// OS refuse to start a worker, the others share its index.
    pub fn new(n_threads: usize) -> Self {
        let n = n_threads.clamp(1, MAX_THREADS);
        let shared = Arc::new(Shared {
            n_threads: n,
            state: Mutex::new(State {
                job: None,
                epoch: 0,
                shutdown: false,
                sleepers: 0,
            }),
            wake: Condvar::new(),
            // Epoch 0 has no unclaimed index.
            ticket: AtomicU64::new(INDEX_MASK),
            done: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
        });
        let mut workers = Vec::with_capacity(n - 1);
        for index in 1..n {
            let s = Arc::clone(&shared);
            match std::thread::Builder::new()
                .name(format!("spindle-worker-{index}"))
                .spawn(move || worker(&s))
            {
                Ok(h) => workers.push(h),
                Err(_) => break,
            }
        }
        ThreadPool {
            shared,
            workers,
            run_lock: Mutex::new(()),
        }
    }

    /// How many ways each job is split (the caller included).
    pub fn n_threads(&self) -> usize {
        self.shared.n_threads
    }

    /// Calls `f(item)` once for every item in `0..items`: each thread first
    /// takes the items of its own contiguous share ([`row_share`]) in
    /// order, then helps with what is left of the others' shares. With no
    /// thread held up, the same items run on the same thread from one call
    /// to the next, so what they write stays in that core's cache (and on
    /// its die: a matmul of 16 rows whose items went to whichever thread
    /// came first took 93 us warm on two dies against 73 us, docs/PERF.md
    /// §58); a thread the OS holds up still does not hold up the others.
    pub fn run_items(&self, items: usize, f: &(dyn Fn(usize) + Sync)) {
        let n = self.n_threads();
        if n == 1 || items <= 1 {
            (0..items).for_each(f);
            return;
        }
        /// A share's next item, alone on its cache line.
        #[repr(align(64))]
        struct Next(AtomicUsize);
        let next: Vec<Next> = (0..n)
            .map(|t| Next(AtomicUsize::new(row_share(items, t, n).start)))
            .collect();
        self.run(&|t, nt| {
            for u in (0..nt).map(|k| (t + k) % nt) {
                let end = row_share(items, u, nt).end;
                loop {
                    let item = next[u].0.fetch_add(1, Ordering::Relaxed);
                    if item >= end {
                        break;
                    }
                    f(item);
                }
            }
        });
    }

    /// Calls `f(index, n_threads)` once for every `index` in `0..n_threads`
    /// and returns when all calls are done. Index 0 runs on the calling
    /// thread, the others on whichever pool thread claims them first. A panic
    /// in any call is re-raised here after all calls have finished.
    pub fn run(&self, f: &(dyn Fn(usize, usize) + Sync)) {
        let shared = &*self.shared;
        let n = shared.n_threads;
        if n == 1 || IN_JOB.with(Cell::get) {
            for i in 0..n {
                f(i, n);
            }
            return;
        }
        let _serial = self.run_lock.lock().unwrap_or_else(PoisonError::into_inner);

        shared.done.store(0, Ordering::Relaxed);
        {
            let mut st = shared.lock();
            st.job = Some(JobPtr::erase(f));
            st.epoch += 1;
            // Index 0 is the caller's.
            shared
                .ticket
                .store((st.epoch << INDEX_BITS) | 1, Ordering::Release);
            if st.sleepers > 0 {
                shared.wake.notify_all();
            }
        }

        IN_JOB.with(|c| c.set(true));
        let mut panic_payload = catch_unwind(AssertUnwindSafe(|| f(0, n))).err();
        if panic_payload.is_none() {
            // Take over the indices no worker has claimed yet.
            while let Some(i) = shared.claim() {
                let r = catch_unwind(AssertUnwindSafe(|| f(i, n)));
                shared.done.fetch_add(1, Ordering::Relaxed);
                if let Err(p) = r {
                    panic_payload = Some(p);
                    break;
                }
            }
        }
        IN_JOB.with(|c| c.set(false));
        if panic_payload.is_some() {
            // Close the job to workers that have not claimed an index yet,
            // and count the indices nobody will run as done.
            let t = shared.ticket.fetch_or(INDEX_MASK, Ordering::AcqRel);
            let unclaimed = n.saturating_sub((t & INDEX_MASK) as usize);
            shared.done.fetch_add(unclaimed, Ordering::Relaxed);
        }

        // Every index but 0 is counted in `done`.
        let target = n - 1;
        let start = Instant::now();
        while shared.done.load(Ordering::Acquire) < target {
            if start.elapsed() < CALLER_SPIN_TIME {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        shared.lock().job = None;

        if let Some(payload) = panic_payload {
            shared.panicked.store(false, Ordering::Relaxed);
            resume_unwind(payload);
        }
        if shared.panicked.swap(false, Ordering::Relaxed) {
            panic!("a thread pool job panicked on a worker thread");
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        {
            let mut st = self.shared.lock();
            st.shutdown = true;
            st.epoch += 1;
            self.shared
                .ticket
                .store((st.epoch << INDEX_BITS) | INDEX_MASK, Ordering::Release);
            self.shared.wake.notify_all();
        }
        for h in self.workers.drain(..) {
            // A worker never panics outside a job call (those are caught).
            let _ = h.join();
        }
    }
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadPool")
            .field("n_threads", &self.shared.n_threads)
            .finish()
    }
}

fn worker(shared: &Shared) {
    IN_JOB.with(|c| c.set(true));
    let mut seen = 0u64;
    loop {
        // Spin a little: the next job usually follows soon.
        let start = Instant::now();
        let mut spins = 0u32;
        while shared.ticket.load(Ordering::Acquire) >> INDEX_BITS == seen {
            std::hint::spin_loop();
            spins = spins.wrapping_add(1);
            if spins & 63 == 0 && start.elapsed() > SPIN_TIME {
                break;
            }
        }
        {
            let mut st = shared.lock();
            while st.epoch == seen && !st.shutdown {
                st.sleepers += 1;
                st = shared.wake.wait(st).unwrap_or_else(PoisonError::into_inner);
                st.sleepers -= 1;
            }
            if st.shutdown {
                return;
            }
            seen = st.epoch;
        }
        while let Some(i) = shared.claim() {
            shared.run_index(i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_index_once() {
        for n in [1, 2, 3, 5] {
            let pool = ThreadPool::new(n);
            assert_eq!(pool.n_threads(), n);
            for _ in 0..200 {
                let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                pool.run(&|i, nt| {
                    assert_eq!(nt, n);
                    hits[i].fetch_add(1, Ordering::Relaxed);
                });
                assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
            }
        }
    }

    #[test]
    fn run_items_runs_every_item_once_and_a_held_up_share_is_taken_over() {
        for n in [1, 2, 3, 5] {
            let pool = ThreadPool::new(n);
            for items in [0, 1, 2, 7, 64] {
                let hits: Vec<AtomicUsize> = (0..items).map(|_| AtomicUsize::new(0)).collect();
                pool.run_items(items, &|i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                });
                assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
            }
        }
        // The first item of the last share blocks until every other item
        // has run: only taking over the other shares' items gets there.
        let pool = ThreadPool::new(2);
        let items = 40;
        let done = AtomicUsize::new(0);
        let hits: Vec<AtomicUsize> = (0..items).map(|_| AtomicUsize::new(0)).collect();
        let start = row_share(items, 1, 2).start;
        let gave_up = AtomicBool::new(false);
        pool.run_items(items, &|i| {
            if i == start {
                let t = std::time::Instant::now();
                while done.load(Ordering::Acquire) < items - 1 {
                    if t.elapsed().as_secs() >= 5 {
                        gave_up.store(true, Ordering::Relaxed);
                        break;
                    }
                    std::thread::yield_now();
                }
            }
            hits[i].fetch_add(1, Ordering::Relaxed);
            done.fetch_add(1, Ordering::Release);
        });
        assert!(
            !gave_up.load(Ordering::Relaxed),
            "nobody took over the held-up share"
        );
        assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
    }

    #[test]
    fn nested_run_is_serial() {
        let pool = ThreadPool::new(2);
        let count = AtomicUsize::new(0);
        pool.run(&|_, _| {
            pool.run(&|_, _| {
                count.fetch_add(1, Ordering::Relaxed);
            });
        });
        assert_eq!(count.load(Ordering::Relaxed), 4);
    }

    #[test]
    fn worker_panic_propagates_and_pool_survives() {
        let pool = ThreadPool::new(3);
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.run(&|i, _| {
                if i == 2 {
                    panic!("boom");
                }
            })
        }));
        assert!(r.is_err());
        let count = AtomicUsize::new(0);
        pool.run(&|_, _| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn caller_panic_propagates_and_pool_survives() {
        let pool = ThreadPool::new(3);
        for _ in 0..20 {
            let r = catch_unwind(AssertUnwindSafe(|| {
                pool.run(&|i, _| {
                    if i == 0 {
                        panic!("boom");
                    }
                })
            }));
            assert!(r.is_err());
        }
        let count = AtomicUsize::new(0);
        pool.run(&|_, _| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn more_threads_than_cores() {
        let pool = ThreadPool::new(9);
        for _ in 0..500 {
            let hits: Vec<AtomicUsize> = (0..9).map(|_| AtomicUsize::new(0)).collect();
            pool.run(&|i, _| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
        }
    }

    #[test]
    fn sleeping_workers_wake() {
        let pool = ThreadPool::new(2);
        std::thread::sleep(SPIN_TIME * 5);
        let count = AtomicUsize::new(0);
        pool.run(&|_, _| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 2);
    }
}
