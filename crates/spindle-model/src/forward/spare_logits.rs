//! Logits buffers kept for the next pass.
//!
//! A row of the default model's logits is 1 MiB (262,144 f32), and a tree's
//! walk takes the head over several rows at once: a fresh buffer per call
//! is memory the allocator maps and the kernel zeroes page by page (about 5%
//! of a speculative server's time went to those page faults, docs/PERF.md
//! §34). Dropped [`super::Logits`] give their buffer back here and the next
//! call reuses it. The pool is bounded by bytes (and by count), so what it
//! holds does not grow with the requests served.

use std::sync::Mutex;

/// Most bytes the spare buffers hold together: 32 rows of a 262k
/// vocabulary, what a batch of four sequences' walks take in one pass
/// (bench/soak held 51 MiB of spares under a 64 MiB bound, all of it on
/// top of the steady RSS; 32 keeps the common passes without that).
pub const MAX_SPARE_BYTES: usize = 32 << 20;
/// Most buffers kept.
const MAX_SPARE: usize = 8;

static SPARE: Mutex<Vec<Vec<f32>>> = Mutex::new(Vec::new());

fn bytes(v: &Vec<f32>) -> usize {
    v.capacity() * std::mem::size_of::<f32>()
}

/// A buffer of `len` values for the caller to overwrite whole: a spare one
/// when one is large enough, holding what its last user wrote (the head's
/// matmul writes every logit, so zeroing 20 MiB for a 20-row walk, ~2% of
/// a speculative server's time, bought nothing), or fresh zeros.
pub(super) fn take(len: usize) -> Vec<f32> {
    let mut spare = SPARE.lock().unwrap_or_else(|p| p.into_inner());
    // The smallest spare that fits, so large buffers stay for large calls.
    let best = spare
        .iter()
        .enumerate()
        .filter(|(_, v)| v.capacity() >= len)
        .min_by_key(|(_, v)| v.capacity())
        .map(|(i, _)| i);
    let mut v = match best {
        Some(i) => spare.swap_remove(i),
        None => Vec::with_capacity(len),
    };
    drop(spare);
    if v.len() >= len {
        v.truncate(len);
    } else {
        v.resize(len, 0.0);
    }
    v
}

/// Keeps `v` for a later [`take`] if the pool has room for it, freeing
/// smaller spares to make room. A buffer larger than the whole bound is
/// freed, and so is one that only fits by displacing spares at least as
/// large as itself.
pub(super) fn give_back(v: Vec<f32>) {
    if v.capacity() == 0 || bytes(&v) > MAX_SPARE_BYTES {
        return;
    }
    // Kept at its length (not cleared): a later `take` that fits has
    // nothing to fill.
    let mut spare = SPARE.lock().unwrap_or_else(|p| p.into_inner());
    // Smaller spares make way for a larger one: a small call fits in a
    // large buffer, not the other way round.
    loop {
        let held: usize = spare.iter().map(bytes).sum();
        if spare.len() < MAX_SPARE && held + bytes(&v) <= MAX_SPARE_BYTES {
            spare.push(v);
            return;
        }
        let smallest = spare
            .iter()
            .enumerate()
            .min_by_key(|(_, s)| s.capacity())
            .map(|(i, s)| (i, s.capacity()));
        match smallest {
            Some((i, c)) if c < v.capacity() => drop(spare.swap_remove(i)),
            _ => return,
        }
    }
}

/// Bytes the spare buffers hold now.
pub fn spare_bytes() -> usize {
    SPARE
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(bytes)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuses_and_stays_bounded() {
        let a = take(1000);
        assert_eq!(a.len(), 1000);
        let ptr = a.as_ptr();
        give_back(a);
        let b = take(500);
        assert_eq!(b.len(), 500);
        assert_eq!(b.as_ptr(), ptr, "the spare buffer is reused");
        give_back(b);
        // Far more than the bound: the pool keeps at most MAX_SPARE_BYTES.
        for _ in 0..20 {
            give_back(Vec::with_capacity(MAX_SPARE_BYTES / 4));
        }
        assert!(spare_bytes() <= MAX_SPARE_BYTES);
        give_back(Vec::with_capacity(MAX_SPARE_BYTES / 4 + MAX_SPARE_BYTES));
        assert!(spare_bytes() <= MAX_SPARE_BYTES);
    }
}
