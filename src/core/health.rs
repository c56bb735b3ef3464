//! What DescribeTargetHealth says about one target beyond its state: ELBv2's reason and
//! description, and an administrative override (an NLB zonal shift).
//!
//! The state alone drives the diff (a draining target counts as absent). The rest is for
//! people and for readiness gates: a target `unused` because its group is attached to no
//! load balancer (`Target.NotInUse`) is registered and right as far as the diff goes,
//! yet gets no traffic; a target in a zone an NLB zonal shift moved traffic away from is
//! registered, healthy and right, and only routed around for a while.

use serde::{Deserialize, Serialize};

use super::target::{HealthState, Target};

/// ELBv2's `TargetHealth.Reason` for a target that is not registered (it shows only when
/// targets are asked for by name, which tgsync never does).
pub const NOT_REGISTERED: &str = "Target.NotRegistered";

/// `AdministrativeOverride.State` while no override applies.
pub const NO_OVERRIDE: &str = "no_override";

/// One entry of DescribeTargetHealth.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetHealth {
    /// The target as ELBv2 describes it (with its QUIC server ID in a QUIC group).
    pub target: Target,
    /// Its state.
    pub state: HealthState,
    /// ELBv2's reason code (`Target.NotInUse`, `Elb.RegistrationInProgress`,
    /// `Target.ResponseCodeMismatch`, …); none for a healthy target.
    pub reason: Option<String>,
    /// ELBv2's description of the state, in words.
    pub description: Option<String>,
    /// An administrative override in force (a zonal shift); `None` when there is none
    /// (`no_override`, or a load balancer that does not report one).
    pub administrative_override: Option<AdministrativeOverride>,
}

/// `AdministrativeOverride` of a target: the load balancer routes around it for a reason
/// that is not the target's health.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdministrativeOverride {
    /// `zonal_shift_active`, `zonal_shift_delegated_to_dns` or `unknown`.
    pub state: String,
    /// `AdministrativeOverride.ZonalShiftActive`, …
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// ELBv2's description.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

impl TargetHealth {
    /// A target in `state` with nothing more said about it.
    pub fn new(target: Target, state: HealthState) -> Self {
        Self {
            target,
            state,
            reason: None,
            description: None,
            administrative_override: None,
        }
    }

    /// This entry with ELBv2's reason code and description.
    pub fn with_reason(mut self, reason: &str, description: Option<&str>) -> Self {
        self.reason = Some(reason.to_owned());
        self.description = description.map(str::to_owned);
        self
    }

    /// The `(target, state)` pair the diff reads.
    pub fn pair(&self) -> (&Target, &HealthState) {
        (&self.target, &self.state)
    }

    /// Whether the target is registered but the load balancer does not use it (`unused`:
    /// its group has no load balancer or listener, its zone is not enabled, it is in an
    /// invalid state, its IP is reserved) or cannot tell its health (`unavailable`). It
    /// is still right for the diff — deregistering it would fix nothing — but an
    /// operator must act, and a readiness gate must not open on it.
    pub fn gets_no_traffic(&self) -> bool {
        match self.state {
            HealthState::Unused => self.reason.as_deref() != Some(NOT_REGISTERED),
            HealthState::Unavailable => true,
            _ => false,
        }
    }

    /// The state with ELBv2's reason, as reports and gate conditions say it:
    /// `unused (Target.NotInUse: Target group is not configured to receive traffic from
    /// the load balancer)`.
    pub fn explain(&self) -> String {
        let state = self.state.as_str();
        match (&self.reason, &self.description) {
            (Some(r), Some(d)) => format!("{state} ({r}: {d})"),
            (Some(r), None) => format!("{state} ({r})"),
            (None, Some(d)) => format!("{state} ({d})"),
            (None, None) => state.to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t() -> Target {
        "10.0.0.1:80".parse().unwrap()
    }

    #[test]
    fn unused_and_unavailable_targets_get_no_traffic_but_not_unregistered_ones() {
        let unused = TargetHealth::new(t(), HealthState::Unused);
        assert!(
            unused
                .clone()
                .with_reason("Target.NotInUse", None)
                .gets_no_traffic()
        );
        assert!(
            unused
                .clone()
                .with_reason("Target.InvalidState", None)
                .gets_no_traffic()
        );
        assert!(unused.clone().gets_no_traffic());
        assert!(!unused.with_reason(NOT_REGISTERED, None).gets_no_traffic());
        assert!(
            TargetHealth::new(t(), HealthState::Unavailable)
                .with_reason("Target.HealthCheckDisabled", None)
                .gets_no_traffic()
        );
        for s in [
            HealthState::Healthy,
            HealthState::Initial,
            HealthState::Unhealthy,
            HealthState::Draining,
        ] {
            assert!(!TargetHealth::new(t(), s).gets_no_traffic());
        }
    }

    #[test]
    fn explain_says_state_reason_and_description() {
        let h = TargetHealth::new(t(), HealthState::Unused).with_reason(
            "Target.NotInUse",
            Some("Target group is not configured to receive traffic from the load balancer"),
        );
        assert_eq!(
            h.explain(),
            "unused (Target.NotInUse: Target group is not configured to receive traffic from the load balancer)"
        );
        assert_eq!(
            TargetHealth::new(t(), HealthState::Initial)
                .with_reason("Elb.RegistrationInProgress", None)
                .explain(),
            "initial (Elb.RegistrationInProgress)"
        );
        assert_eq!(
            TargetHealth::new(t(), HealthState::Healthy).explain(),
            "healthy"
        );
    }
}
