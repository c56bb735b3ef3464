//! What this container's passes remember between them: fresh reads one pass may reuse
//! for the next, what a gate last said, and whose leases the container holds. Nothing
//! here is a fact of its own: each is a copy of something ELBv2, Kubernetes or the state
//! table says, kept only while it is fresh.

use super::{elsewhere, gates, rollout, tag_reads};

/// The reads and verdicts the passes of one container share (see the module docs).
#[derive(Default)]
pub(super) struct Memory {
    /// Target health as last read per group (the gates' verdicts reuse fresh reads).
    pub(super) health: gates::HealthCache,
    /// What each gated pod's condition was last written to say (its writes are
    /// patched only when the verdict changes, whoever in this container settles it).
    pub(super) gates_said: gates::GatesSaid,
    /// When each gated pod's gate was last found closed (for its latency once opened).
    pub(super) gates_waiting: gates::GatesWaiting,
    /// Each group's newest tag read in this container (a pass's re-read serves the
    /// passes after it for `binding_max_age`).
    pub(super) tag_reads: tag_reads::TagReads,
    /// The leases this container's passes hold, and since when looks find each group's
    /// lease held elsewhere (see [`elsewhere`]).
    pub(super) leases: elsewhere::Leases,
    /// Each group's attributes as the rollout check last read them (see [`rollout`]).
    pub(super) attribute_reads: rollout::AttributeReads,
}
