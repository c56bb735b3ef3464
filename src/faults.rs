//! Fault injection between the side effects of a group reconcile.
//!
//! The design promises convergence after a crash *anywhere*; the reconcile calls
//! [`Faults::check`] between every pair of side effects so tests can stop it exactly
//! there (no cleanup, lease left held, as a killed Lambda would) and prove the next run
//! puts everything right. In production the hook is [`NoFaults`].

use std::fmt;
use std::sync::Mutex;

use serde::Serialize;

/// A place between two side effects of a group reconcile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum FaultPoint {
    /// After the lease is acquired, before anything else.
    AfterLeaseAcquired,
    /// After ledger rows for a register chunk are written, before RegisterTargets.
    AfterLedgerWrite,
    /// After a RegisterTargets call succeeded.
    AfterRegisterChunk,
    /// After a DeregisterTargets call succeeded, before its ledger rows are deleted.
    AfterDeregisterChunk,
    /// After ledger rows of deregistered or forgotten targets are deleted.
    AfterLedgerDelete,
    /// After the backoff row is written or cleared.
    AfterBackoffWrite,
    /// After the verification checkpoint is written or cleared.
    AfterCheckpointWrite,
    /// Just before the lease is released.
    BeforeLeaseRelease,
}

impl FaultPoint {
    /// Every fault point, for tests that sweep them.
    pub const ALL: [FaultPoint; 8] = [
        Self::AfterLeaseAcquired,
        Self::AfterLedgerWrite,
        Self::AfterRegisterChunk,
        Self::AfterDeregisterChunk,
        Self::AfterLedgerDelete,
        Self::AfterBackoffWrite,
        Self::AfterCheckpointWrite,
        Self::BeforeLeaseRelease,
    ];
}

impl fmt::Display for FaultPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Decides whether to abort at a fault point.
pub trait Faults: Send + Sync {
    /// `Err(point)` aborts the reconcile there, as a crash would.
    fn check(&self, point: FaultPoint) -> Result<(), FaultPoint>;
}

/// Production: never aborts.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoFaults;

impl Faults for NoFaults {
    fn check(&self, _: FaultPoint) -> Result<(), FaultPoint> {
        Ok(())
    }
}

/// Aborts at the `nth` (0-based) time `point` is reached, once.
#[derive(Debug)]
pub struct CrashAt {
    point: FaultPoint,
    remaining: Mutex<Option<usize>>,
}

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
