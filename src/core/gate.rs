//! The readiness gate's verdict: a pod that declares `tgsync/target-health` may turn
//! Ready only when its target is healthy in **every** bound group that selects it — a
//! pod behind two listeners (TG-80 and TG-443, or two load balancers) whose gate opened
//! on the first group's health would let its Deployment move on and drain old pods from
//! the second group while the new one is not serving there yet. While it is not, the
//! condition is False and says why, in ELBv2's words, so `kubectl describe pod` shows
//! what the rollout waits for.

use super::health::TargetHealth;
use super::target::{HealthState, Target};

/// The condition's reason when the gate is open.
pub const OPEN_REASON: &str = "TargetHealthy";

/// What one group that selects the pod says about its target.
#[derive(Debug, Clone, Copy)]
pub enum GroupHealth<'a> {
    /// The group's target health as read: the pod's target among it, or absent (not
    /// registered yet — e.g. the group's registrations back off after failures).
    Read(Option<&'a TargetHealth>),
    /// The group's target health could not be read.
    Unreadable,
    /// The group selects the pod but cannot hold it as it is, and why.
    CannotHold(&'a super::desired::SkipReason),
}

/// One group that selects the pod: its name, the pod's target in it, and its health.
#[derive(Debug, Clone, Copy)]
pub struct GroupView<'a> {
    /// The group's name (for the message).
    pub group: &'a str,
    /// The pod's target in that group (ports may differ between groups); none when
    /// the group cannot hold the pod.
    pub target: Option<Target>,
    /// What the group says.
    pub health: GroupHealth<'a>,
}

/// The gate condition to set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateVerdict {
    /// True: the target is healthy in every group that selects the pod.
    pub open: bool,
    /// A CamelCase reason, as Kubernetes condition reasons must be.
    pub reason: String,
    /// What the rollout waits for, in ELBv2's words.
    pub message: String,
}

/// The verdict for a pod selected by the groups in `views` (none: nothing to wait for,
/// which callers never ask). Open only when every group reads the target `healthy` (a
/// zonal shift does not change that: the target is still registered and healthy);
/// otherwise closed with the first group that is not, and the state of each.
pub fn verdict(views: &[GroupView<'_>]) -> GateVerdict {
    // (reason, what the group says, whether it is only on its way: `initial`).
    let mut waiting: Vec<(String, String, bool)> = Vec::new();
    for v in views {
        let on_its_way = matches!(
            v.health,
            GroupHealth::Read(Some(h)) if h.state == HealthState::Initial
        );
        let (reason, said) = match v.health {
            GroupHealth::Read(Some(h)) if h.state == HealthState::Healthy => continue,
            GroupHealth::Read(Some(h)) => (
                h.reason
                    .as_deref()
                    .map(condition_reason)
                    .unwrap_or_else(|| format!("Target{}", camel(h.state.as_str()))),
                h.explain(),
            ),
            GroupHealth::Read(None) => (
                "TargetNotRegistered".to_owned(),
                "not registered yet".to_owned(),
            ),
            GroupHealth::Unreadable => (
                "TargetHealthUnknown".to_owned(),
                "its target health could not be read".to_owned(),
            ),
            GroupHealth::CannotHold(why) => (
                "PodCannotBeTarget".to_owned(),
                format!("the pod cannot be its target: {why}"),
            ),
        };
        let said = match v.target {
            Some(target) => format!("{target} in {}: {said}", v.group),
            None => format!("{}: {said}", v.group),
        };
        waiting.push((reason, said, on_its_way));
    }
    let groups: Vec<&str> = views.iter().map(|v| v.group).collect();
    // The reason shown is the first group's that needs more than time (a failing health
    // check says more than a registration in progress elsewhere).
    let shown = waiting
        .iter()
        .find(|(_, _, on_its_way)| !on_its_way)
        .or(waiting.first());
    match shown {
        None => GateVerdict {
            open: true,
            reason: OPEN_REASON.to_owned(),
            message: format!(
                "the pod's target is healthy in every target group that selects it ({}); set by tgsync",
                groups.join(", ")
            ),
        },
        Some((reason, _, _)) => GateVerdict {
            open: false,
            reason: reason.clone(),
            message: format!(
                "waiting for the target to be healthy in every target group that selects the pod: {}",
                waiting
                    .iter()
                    .map(|(_, m, _)| m.as_str())
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
        },
    }
}

/// ELBv2's reason code as a Kubernetes condition reason (letters, digits and `_` only:
/// `Elb.RegistrationInProgress` → `ElbRegistrationInProgress`).
fn condition_reason(code: &str) -> String {
    let reason: String = code
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    match reason.chars().next() {
        Some(c) if c.is_ascii_alphabetic() => reason,
        _ => format!("Target{reason}"),
    }
}

/// `unhealthy.draining` → `UnhealthyDraining`.
fn camel(state: &str) -> String {
    state
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(|w| {
            let mut chars = w.chars();
            chars
                .next()
                .map(|first| first.to_ascii_uppercase().to_string() + chars.as_str())
                .unwrap_or_default()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Target {
        s.parse().unwrap()
    }

    #[test]
    fn open_only_when_healthy_in_every_group() {
        let healthy = TargetHealth::new(t("10.0.1.9:80"), HealthState::Healthy);
        let initial = TargetHealth::new(t("10.0.1.9:443"), HealthState::Initial).with_reason(
            "Elb.RegistrationInProgress",
            Some("Target registration is in progress"),
        );
        let both = [
            GroupView {
                group: "web-80",
                target: Some(t("10.0.1.9:80")),
                health: GroupHealth::Read(Some(&healthy)),
            },
            GroupView {
                group: "web-443",
                target: Some(t("10.0.1.9:443")),
                health: GroupHealth::Read(Some(&initial)),
            },
        ];
        let v = verdict(&both);
        assert!(!v.open);
        assert_eq!(v.reason, "ElbRegistrationInProgress");
        assert!(
            v.message.contains(
                "10.0.1.9:443 in web-443: initial (Elb.RegistrationInProgress: Target registration is in progress)"
            ),
            "{}",
            v.message
        );
        assert!(!v.message.contains("web-80"), "{}", v.message);
        let v = verdict(&both[..1]);
        assert!(v.open);
        assert_eq!(v.reason, OPEN_REASON);
    }

    #[test]
    fn a_failing_group_gives_the_reason_before_one_still_registering() {
        let target = t("10.0.1.9:80");
        let initial = TargetHealth::new(target, HealthState::Initial)
            .with_reason("Elb.RegistrationInProgress", None);
        let failing = TargetHealth::new(target, HealthState::Unhealthy).with_reason(
            "Target.ResponseCodeMismatch",
            Some("Health checks failed with these codes: [503]"),
        );
        let v = verdict(&[
            GroupView {
                group: "a",
                target: Some(target),
                health: GroupHealth::Read(Some(&initial)),
            },
            GroupView {
                group: "b",
                target: Some(target),
                health: GroupHealth::Read(Some(&failing)),
            },
        ]);
        assert_eq!(v.reason, "TargetResponseCodeMismatch");
        assert!(
            v.message.contains("in a: initial") && v.message.contains("[503]"),
            "{}",
            v.message
        );
    }

    #[test]
    fn reasons_are_valid_condition_reasons() {
        let valid = |r: &str| {
            r.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
                && r.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        };
        let target = t("10.0.1.9:80");
        for (state, reason) in [
            (HealthState::Unused, Some("Target.NotInUse")),
            (HealthState::Unhealthy, Some("Target.ResponseCodeMismatch")),
            (HealthState::UnhealthyDraining, None),
            (HealthState::Initial, None),
            (HealthState::Other("weird state".into()), Some("9.odd")),
        ] {
            let mut h = TargetHealth::new(target, state);
            if let Some(r) = reason {
                h = h.with_reason(r, None);
            }
            let v = verdict(&[GroupView {
                group: "g",
                target: Some(target),
                health: GroupHealth::Read(Some(&h)),
            }]);
            assert!(!v.open);
            assert!(valid(&v.reason), "{}", v.reason);
        }
        for health in [GroupHealth::Read(None), GroupHealth::Unreadable] {
            let v = verdict(&[GroupView {
                group: "g",
                target: Some(target),
                health,
            }]);
            assert!(!v.open && valid(&v.reason), "{v:?}");
        }
        assert_eq!(camel("unhealthy.draining"), "UnhealthyDraining");
        assert_eq!(condition_reason("Target.NotInUse"), "TargetNotInUse");
    }
}
