//! What this container's passes remember between them: fresh reads one pass may reuse
//! for the next, what a gate last said, and whose leases the container holds. Nothing
//! here is a fact of its own: each is a copy of something ELBv2, Kubernetes or the state
//! table says, kept only while it is fresh.

use super::{elsewhere, gates, rollout, tag_reads};

/// The reads and verdicts the passes of one container share (see the module docs).
#[derive(Default)]
pub(super) struct Memory {
    /// The gates' memory: target health as last read per group (their verdicts reuse
    /// fresh reads), what each gated pod's condition was last written to say, and when
    /// each gate was last found closed.
    pub(super) gates: gates::GateMemory,
    /// Each group's newest tag read in this container (a pass's re-read serves the
    /// passes after it for `binding_max_age`).
    pub(super) tag_reads: tag_reads::TagReads,
    /// The leases this container's passes hold, and since when looks find each group's
    /// lease held elsewhere (see [`elsewhere`]).
    pub(super) leases: elsewhere::Leases,
    /// Each group's attributes as the rollout check last read them (see [`rollout`]).
    pub(super) attribute_reads: rollout::AttributeReads,
}
