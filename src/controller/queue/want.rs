//! What a request asks of a group's next pass, and how two requests merge.

use crate::core::UnixMillis;

/// What a group's next pass is asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Want {
    /// Its pods changed (or may have): reconcile it now, whatever its checkpoint says.
    pub changed: bool,
    /// The schedule's full diff: look at it, verifying target health within the
    /// Describe budget.
    pub verify: bool,
    /// A gated pod of the group waits for its target to turn healthy: settle its gate
    /// (a pass that changes or verifies the group does that too).
    pub gates: bool,
    /// When the oldest pod change behind this request was seen (reaction latency).
    pub since: Option<UnixMillis>,
}

impl Want {
    /// A pod change seen at `at`.
    pub fn change(at: UnixMillis) -> Self {
        Self {
            changed: true,
            since: Some(at),
            ..Self::default()
        }
    }

    /// The full diff's look at a group.
    pub fn verify() -> Self {
        Self {
            verify: true,
            ..Self::default()
        }
    }

    /// Another look at the gates waiting in a group.
    pub fn gates() -> Self {
        Self {
            gates: true,
            ..Self::default()
        }
    }

    /// Whether it asks for nothing but a look at the gates.
    pub fn gates_only(self) -> bool {
        self.gates && !self.changed && !self.verify
    }

    /// Whether it is a reaction (a pod change, a gate): it takes the runner's room for
    /// reactions, not a verification's.
    pub fn reacts(self) -> bool {
        self.changed || self.gates
    }

    /// Both requests in one: a pass that does what either asks.
    pub(super) fn merge(self, other: Self) -> Self {
        Self {
            changed: self.changed || other.changed,
            verify: self.verify || other.verify,
            gates: self.gates || other.gates,
            since: match (self.since, other.since) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            },
        }
    }
}
