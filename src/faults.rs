//! Fault injection between the side effects of a group reconcile.
//!
//! The design promises convergence after a crash *anywhere*; the reconcile names a
//! [`FaultPoint`] between every pair of side effects so tests can stop it exactly there
//! (no cleanup, lease left held, as a killed Lambda would) and prove the next run puts
//! everything right. The injection itself ([`Faults`], [`CrashAt`]) exists only in test
//! builds (the `testing` feature): release builds carry no hook at all.

use std::fmt;
#[cfg(any(test, feature = "testing"))]
use std::sync::Mutex;

use serde::Serialize;

/// A place between two side effects of a group reconcile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum FaultPoint {
    /// After the lease is taken (at the start of each pass), before anything else.
    AfterLeaseAcquired,
    /// After the ledger entries of a register chunk are stored, before RegisterTargets.
    AfterLedgerWrite,
    /// After a RegisterTargets call.
    AfterRegisterChunk,
    /// After a DeregisterTargets call succeeded, before its entries leave the ledger.
    AfterDeregisterChunk,
    /// After every ELBv2 call of the pass, before the write that ends it (ledger
    /// removals, backoff, checkpoint) and the lease release.
    BeforeLeaseRelease,
}

impl FaultPoint {
    /// Every fault point, for tests that sweep them.
    pub const ALL: [FaultPoint; 5] = [
        Self::AfterLeaseAcquired,
        Self::AfterLedgerWrite,
        Self::AfterRegisterChunk,
        Self::AfterDeregisterChunk,
        Self::BeforeLeaseRelease,
    ];
}

impl fmt::Display for FaultPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Decides whether to abort at a fault point.
#[cfg(any(test, feature = "testing"))]
pub trait Faults: Send + Sync {
    /// `Err(point)` aborts the reconcile there, as a crash would.
    fn check(&self, point: FaultPoint) -> Result<(), FaultPoint>;
}

/// Never aborts (the default in tests).
#[cfg(any(test, feature = "testing"))]
#[derive(Debug, Clone, Copy, Default)]
pub struct NoFaults;

#[cfg(any(test, feature = "testing"))]
impl Faults for NoFaults {
    fn check(&self, _: FaultPoint) -> Result<(), FaultPoint> {
        Ok(())
    }
}

/// Aborts at the `nth` (0-based) time `point` is reached, once.
#[cfg(any(test, feature = "testing"))]
#[derive(Debug)]
pub struct CrashAt {
    point: FaultPoint,
    remaining: Mutex<Option<usize>>,
}

#[cfg(any(test, feature = "testing"))]
impl CrashAt {
    /// Crash the first time `point` is reached.
    pub fn first(point: FaultPoint) -> Self {
        Self::nth(point, 0)
    }

    /// Crash the `nth` time `point` is reached.
    pub fn nth(point: FaultPoint, nth: usize) -> Self {
        Self {
            point,
            remaining: Mutex::new(Some(nth)),
        }
    }

    /// Whether the crash has happened.
    pub fn fired(&self) -> bool {
        self.remaining.lock().map(|r| r.is_none()).unwrap_or(true)
    }
}

#[cfg(any(test, feature = "testing"))]
impl Faults for CrashAt {
    fn check(&self, point: FaultPoint) -> Result<(), FaultPoint> {
        if point != self.point {
            return Ok(());
        }
        let Ok(mut remaining) = self.remaining.lock() else {
            return Ok(());
        };
        match *remaining {
            Some(0) => {
                *remaining = None;
                Err(point)
            }
            Some(n) => {
                *remaining = Some(n - 1);
                Ok(())
            }
            None => Ok(()),
        }
    }
}
