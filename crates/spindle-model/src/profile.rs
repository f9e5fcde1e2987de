//! Where a pass's time goes, op by op (enabled with `SPINDLE_PROFILE=1` or
//! [`crate::Model::set_profiling`]); off, it costs one branch per op.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

/// Time per op accumulated over passes.
#[derive(Default)]
pub struct OpTimes {
    totals: Mutex<BTreeMap<&'static str, (f64, usize)>>,
}

impl OpTimes {
    /// Seconds and call counts per op since the last call, largest first.
    pub fn take(&self) -> Vec<(&'static str, f64, usize)> {
        let mut map = self.totals.lock().unwrap_or_else(|e| e.into_inner());
        let mut v: Vec<_> = std::mem::take(&mut *map)
            .into_iter()
            .map(|(k, (s, n))| (k, s, n))
            .collect();
        v.sort_by(|a, b| b.1.total_cmp(&a.1));
        v
    }

    pub(crate) fn add(&self, clock: OpClock) {
        if clock.laps.is_empty() {
            return;
        }
        let mut map = self.totals.lock().unwrap_or_else(|e| e.into_inner());
        for (op, s) in clock.laps {
            let e = map.entry(op).or_insert((0.0, 0));
            e.0 += s;
            e.1 += 1;
        }
    }
}

/// Laps of one pass.
pub(crate) struct OpClock {
    last: Option<Instant>,
    laps: Vec<(&'static str, f64)>,
}

impl OpClock {
    pub(crate) fn new(enabled: bool) -> Self {
        OpClock {
            last: enabled.then(Instant::now),
            laps: Vec::new(),
        }
    }

    /// Charges the time since the previous mark to `op`.
    #[inline]
    pub(crate) fn mark(&mut self, op: &'static str) {
        if let Some(last) = self.last {
            let now = Instant::now();
            self.laps.push((op, (now - last).as_secs_f64()));
            self.last = Some(now);
        }
    }
}
