//! The sans-IO reconcile core: everything that decides, nothing that talks to a network.
//!
//! Inputs are plain values (tags, pods, target health, ledger rows, a clock reading and a
//! random source); outputs are plans. Keeping I/O out is what lets the diff be property
//! tested and lets both Lambda functions share exactly the same decisions.

pub mod arn;
pub mod backoff;
pub mod binding;
pub mod checkpoint;
pub mod desired;
pub mod gate;
pub mod health;
pub mod holds;
pub mod index;
pub mod lease_protocol;
pub mod plan;
pub mod pod;
pub mod rollout;
pub mod selector;
pub mod target;
pub mod termination;

#[cfg(test)]
mod plan_properties;
#[cfg(test)]
mod test_fixtures;

pub use backoff::{BackoffPolicy, BackoffState, Gate, UnixMillis};
pub use binding::{Binding, BindingError, BindingPolicy, GroupFacts, Mode, PortSpec};
pub use checkpoint::{Checkpoint, Rotation};
pub use desired::{Desired, SkipReason, contribution, desired_targets, holding, serving_ip};
pub use health::{AdministrativeOverride, TargetHealth};
pub use holds::{Holds, Sorted, Wait};
pub use index::PodIndex;
pub use plan::{
    Call, Claim, FORGET_GRACE, MAX_TARGETS_PER_CALL, Plan, Rules, TargetSet, plan, release_plan,
};
pub use pod::{PodFacts, PodRef};
pub use rollout::RolloutCheck;
pub use selector::{Labels, Selector, SelectorError};
pub use target::{AddressFamily, HealthState, QuicServerId, QuicServerIdError, Target};
pub use termination::{PreStop, Termination};
