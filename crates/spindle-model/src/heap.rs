//! How the process's heap gives memory back to the system (glibc; other C
//! libraries keep their defaults).
//!
//! glibc keeps a freed block resident unless it ends its arena, and serves
//! a large request from the arenas once it has freed a mapped block of that
//! size (it raises its mmap threshold, up to 32 MiB): after loading, after
//! the head screen's build, and while a server runs, freed memory stays in
//! the resident set until it is trimmed (docs/PERF.md §37).

/// Hands memory freed in the arenas back to the system: the free pages of
/// every arena, not only their tops. Called after work that frees much at
/// once (loading, the head screen's build) and by a server every few
/// seconds; it takes a few milliseconds.
pub fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        extern "C" {
            fn malloc_trim(pad: usize) -> std::ffi::c_int;
        }
        // SAFETY: malloc_trim only returns free heap pages to the kernel; it
        // has no preconditions and locks each arena while it works.
        unsafe { malloc_trim(0) };
    }
}
