//! Content-free answers kept between decisions: what a question's options
//! score after the content-free state depends on the question, its options,
//! the mode and the template, never on the state, so a question asked again
//! (an agent asks the same ones about every new state) needs no
//! content-free branch in its pass. The kept values are the ones the
//! branch gives (rows do not depend on what else is in the pass), so
//! answers are the same either way.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

/// The server's bound: a question of 6 options of a few tokens each after a
/// template's content-free state is ~1 KiB, so some thousands of distinct
/// questions.
pub const DEFAULT_PRIOR_CACHE_BYTES: usize = 8 << 20;

/// Bytes an entry takes besides its key and values: the map's slot, the
/// recency index's node and the two vectors' headers.
const ENTRY_OVERHEAD: usize = 128;

/// Content-free option log-probabilities by the exact tokens that asked
/// for them, within a bound in bytes; the least recently used go first.
#[derive(Debug)]
pub struct PriorCache {
    max_bytes: usize,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Values and the clock of their last use.
    map: HashMap<Vec<u32>, (Vec<f64>, u64)>,
    /// Keys by the clock of their last use, oldest first.
    by_use: BTreeMap<u64, Vec<u32>>,
    clock: u64,
    bytes: usize,
}

/// What an entry counts against the bound (its key is held twice: in the
/// map and in the recency index).
fn entry_bytes(key: &[u32], value: &[f64]) -> usize {
    2 * std::mem::size_of_val(key) + std::mem::size_of_val(value) + ENTRY_OVERHEAD
}

impl PriorCache {
    /// A cache of at most `max_bytes` (0: keeps nothing).
    pub fn new(max_bytes: usize) -> Self {
        PriorCache {
            max_bytes,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// Its bound in bytes.
    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    pub fn get(&self, key: &[u32]) -> Option<Vec<f64>> {
        let mut inner = self.inner.lock().ok()?;
        inner.clock += 1;
        let now = inner.clock;
        let (value, used) = inner.map.get_mut(key)?;
        let (value, before) = (value.clone(), std::mem::replace(used, now));
        if let Some(k) = inner.by_use.remove(&before) {
            inner.by_use.insert(now, k);
        }
        Some(value)
    }

    pub fn insert(&self, key: Vec<u32>, value: Vec<f64>) {
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        let size = entry_bytes(&key, &value);
        if size > self.max_bytes || inner.map.contains_key(&key) {
            return;
        }
        while inner.bytes + size > self.max_bytes {
            let Some((_, old)) = inner.by_use.pop_first() else {
                break;
            };
            if let Some((v, _)) = inner.map.remove(&old) {
                inner.bytes -= entry_bytes(&old, &v);
            }
        }
        inner.clock += 1;
        let now = inner.clock;
        inner.by_use.insert(now, key.clone());
        inner.map.insert(key, (value, now));
        inner.bytes += size;
    }

    pub fn len(&self) -> usize {
        self.inner.lock().map_or(0, |i| i.map.len())
    }

    /// Bytes held, as the bound counts them.
    pub fn bytes(&self) -> usize {
        self.inner.lock().map_or(0, |i| i.bytes)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The key of a content-free question: the mode, the branch's tokens and
/// each option's tokens, separated by a value no token id takes.
pub(crate) fn key(mode: u32, branch: &[u32], options: &[Vec<u32>]) -> Vec<u32> {
    const SEP: u32 = u32::MAX;
    let mut k =
        Vec::with_capacity(2 + branch.len() + options.iter().map(|o| o.len() + 1).sum::<usize>());
    k.push(mode);
    k.extend_from_slice(branch);
    for o in options {
        k.push(SEP);
        k.extend_from_slice(o);
    }
    k
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_within_its_bytes_least_recently_used_out_first() {
        let one = entry_bytes(&[1], &[0.1]);
        let c = PriorCache::new(2 * one);
        c.insert(vec![1], vec![0.1]);
        c.insert(vec![2], vec![0.2]);
        // Using 1 makes 2 the least recently used.
        assert_eq!(c.get(&[1]), Some(vec![0.1]));
        c.insert(vec![3], vec![0.3]);
        assert_eq!(c.len(), 2);
        assert_eq!(c.bytes(), 2 * one);
        assert_eq!(c.get(&[2]), None);
        assert_eq!(c.get(&[1]), Some(vec![0.1]));
        assert_eq!(c.get(&[3]), Some(vec![0.3]));
        // A larger entry displaces as many as it needs; one over the bound
        // is not kept.
        c.insert(vec![4, 4, 4, 4, 4, 4, 4, 4], vec![0.4]);
        assert!(c.bytes() <= 2 * one, "{} bytes", c.bytes());
        assert_eq!(c.get(&[1]), None);
        c.insert(vec![5; 1000], vec![0.5]);
        assert_eq!(c.get(&[5; 1000]), None);
        assert!(c.bytes() <= 2 * one);
        assert_ne!(
            key(0, &[5], &[vec![1, 2], vec![3]]),
            key(0, &[5], &[vec![1], vec![2, 3]])
        );
    }
}
