//! Waiting requests, taken in turns between tenants: one tenant's thousand
//! queued requests wait behind each other, not in front of another tenant's
//! five.

use std::collections::{HashMap, VecDeque};

/// A queue per tenant, served round-robin.
#[derive(Debug)]
pub struct FairQueue<T> {
    /// Tenants with waiting items, in the order they are served next.
    turn: VecDeque<String>,
    queues: HashMap<String, VecDeque<T>>,
    len: usize,
    /// First come, first served across tenants instead (for comparison).
    fifo: Option<VecDeque<T>>,
}

impl<T> FairQueue<T> {
    /// A fair queue, or a plain FIFO when `fair` is false.
    pub fn new(fair: bool) -> FairQueue<T> {
        FairQueue {
            turn: VecDeque::new(),
            queues: HashMap::new(),
            len: 0,
            fifo: (!fair).then(VecDeque::new),
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn push(&mut self, tenant: &str, item: T) {
        self.len += 1;
        if let Some(fifo) = &mut self.fifo {
            fifo.push_back(item);
            return;
        }
        let q = self.queues.entry(tenant.to_string()).or_default();
        if q.is_empty() {
            self.turn.push_back(tenant.to_string());
        }
        q.push_back(item);
    }

    /// The next item: the oldest of the tenant whose turn it is.
    pub fn pop(&mut self) -> Option<T> {
        if let Some(fifo) = &mut self.fifo {
            let item = fifo.pop_front();
            self.len -= item.is_some() as usize;
            return item;
        }
        let tenant = self.turn.pop_front()?;
        let q = self
            .queues
            .get_mut(&tenant)
            .expect("a tenant in turn has a queue");
        let item = q.pop_front().expect("a tenant in turn has items");
        if q.is_empty() {
            self.queues.remove(&tenant);
        } else {
            self.turn.push_back(tenant);
        }
        self.len -= 1;
        Some(item)
    }

    /// Drops the items `keep` rejects (cancelled requests).
    pub fn retain(&mut self, mut keep: impl FnMut(&T) -> bool) {
        if let Some(fifo) = &mut self.fifo {
            fifo.retain(&mut keep);
            self.len = fifo.len();
            return;
        }
        for q in self.queues.values_mut() {
            q.retain(&mut keep);
        }
        self.queues.retain(|_, q| !q.is_empty());
        let queues = &self.queues;
        self.turn.retain(|t| queues.contains_key(t));
        self.len = self.queues.values().map(VecDeque::len).sum();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenants_take_turns() {
        let mut q = FairQueue::new(true);
        for i in 0..5 {
            q.push("big", ("big", i));
        }
        q.push("small", ("small", 0));
        q.push("other", ("other", 0));
        q.push("small", ("small", 1));
        let order: Vec<_> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(
            order,
            vec![
                ("big", 0),
                ("small", 0),
                ("other", 0),
                ("big", 1),
                ("small", 1),
                ("big", 2),
                ("big", 3),
                ("big", 4)
            ]
        );
        assert!(q.is_empty());
    }

    #[test]
    fn fifo_keeps_arrival_order_and_retain_drops() {
        let mut q = FairQueue::new(false);
        for i in 0..4 {
            q.push(if i % 2 == 0 { "a" } else { "b" }, i);
        }
        q.retain(|&i| i != 1);
        assert_eq!(q.len(), 3);
        let order: Vec<_> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(order, vec![0, 2, 3]);

        let mut q = FairQueue::new(true);
        for i in 0..4 {
            q.push(if i < 3 { "a" } else { "b" }, i);
        }
        q.retain(|&i| i != 3);
        assert_eq!(q.len(), 3);
        assert_eq!(
            std::iter::from_fn(|| q.pop()).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
    }
}
