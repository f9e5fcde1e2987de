//! Content-free answers kept between decisions: what a question's options
//! score after the content-free state depends on the question, its options,
//! the mode and the template, never on the state, so a question asked again
//! (an agent asks the same ones about every new state) needs no
//! content-free branch in its pass. The kept values are the ones the
//! branch gives (rows do not depend on what else is in the pass), so
//! answers are the same either way.

use std::collections::HashMap;
use std::sync::Mutex;

/// Content-free option log-probabilities by the exact tokens that asked
/// for them; at most `capacity` kept (the oldest dropped first).
#[derive(Debug)]
pub struct PriorCache {
    capacity: usize,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    map: HashMap<Vec<u32>, Vec<f64>>,
    order: std::collections::VecDeque<Vec<u32>>,
}

impl PriorCache {
    pub fn new(capacity: usize) -> Self {
        PriorCache {
            capacity,
            inner: Mutex::new(Inner::default()),
        }
    }

    pub fn get(&self, key: &[u32]) -> Option<Vec<f64>> {
        self.inner.lock().ok()?.map.get(key).cloned()
    }

    pub fn insert(&self, key: Vec<u32>, value: Vec<f64>) {
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        if self.capacity == 0 || inner.map.contains_key(&key) {
            return;
        }
        while inner.map.len() >= self.capacity {
            match inner.order.pop_front() {
                Some(old) => {
                    inner.map.remove(&old);
                }
                None => break,
            }
        }
        inner.order.push_back(key.clone());
        inner.map.insert(key, value);
    }

    pub fn len(&self) -> usize {
        self.inner.lock().map_or(0, |i| i.map.len())
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
    fn keeps_at_most_its_capacity_oldest_out_first() {
        let c = PriorCache::new(2);
        c.insert(vec![1], vec![0.1]);
        c.insert(vec![2], vec![0.2]);
        c.insert(vec![3], vec![0.3]);
        assert_eq!(c.len(), 2);
        assert_eq!(c.get(&[1]), None);
        assert_eq!(c.get(&[3]), Some(vec![0.3]));
        assert_ne!(
            key(0, &[5], &[vec![1, 2], vec![3]]),
            key(0, &[5], &[vec![1], vec![2, 3]])
        );
    }
}
