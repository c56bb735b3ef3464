//! Per-operation API call counters, so benchmarks and reports can show how many AWS
//! calls a reconcile cost (ELBv2 Describe calls share a small per-account token bucket,
//! so the count is a first-class cost).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counts calls per API operation. One count per request sent by tgsync (each page of a
/// paginated call counts); the SDK's internal retries of that request are not counted.
#[derive(Debug)]
pub struct ApiCalls {
    ops: &'static [&'static str],
    counts: Box<[AtomicU64]>,
}

impl ApiCalls {
    /// Counters for a fixed set of operation names; an adapter lists the operations it
    /// calls, so a snapshot shows zeros for operations not used yet.
    pub fn new(ops: &'static [&'static str]) -> Self {
        Self {
            ops,
            counts: ops.iter().map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Counts one call of `op`. An operation not in the list is ignored (and caught by
    /// a debug assertion), so a counting slip can never fail a reconcile.
    pub fn count(&self, op: &'static str) {
        let index = self.ops.iter().position(|o| *o == op);
        debug_assert!(index.is_some(), "operation {op} not registered");
        if let Some(counter) = index.and_then(|i| self.counts.get(i)) {
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The counts so far, by operation name.
    pub fn snapshot(&self) -> BTreeMap<&'static str, u64> {
        self.ops
            .iter()
            .zip(self.counts.iter())
            .map(|(op, c)| (*op, c.load(Ordering::Relaxed)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_per_operation() {
        let calls = ApiCalls::new(&["A", "B"]);
        calls.count("A");
        calls.count("A");
        let snap = calls.snapshot();
        assert_eq!(snap.get("A"), Some(&2));
        assert_eq!(snap.get("B"), Some(&0));
    }
}
