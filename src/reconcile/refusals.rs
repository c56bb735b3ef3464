//! What a pass does with the registrations ELBv2 refused ([`ElbError::Rejected`]), by
//! what each refusal takes ([`Refusal`]):
//! - a target refused for itself is a failure: reported per target, and the group backs
//!   off;
//! - a target beyond the group's targets quota is reported per target with ELBv2's
//!   message, and the group does not back off (only a larger quota or a split group
//!   helps, and retrying every run costs one refused call);
//! - a target ELBv2 wants in a named zone (an ALB group with cross-zone load balancing
//!   off, the IP outside its VPC) is registered again in its pod's node's zone.

use std::collections::HashMap;
use std::sync::Arc;

use super::Engine;
use super::pass::fail;
use crate::core::{Desired, Target};
use crate::groups::{ElbError, Refusal, Refused, TargetGroupApi};
use crate::pods::PodSource;
use crate::report::{FailedTarget, GroupReport};
use crate::state::StateStore;

/// What the pass must remember of the refusals it settled.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Settled {
    /// Refusals that are failures (the group backs off).
    pub failures: usize,
    /// Registrations that did not fit the group's quota (no backoff).
    pub over_capacity: usize,
}

impl std::ops::AddAssign for Settled {
    fn add_assign(&mut self, other: Self) {
        self.failures += other.failures;
        self.over_capacity += other.over_capacity;
    }
}

/// The group's error when registrations did not fit: what happened and what to do.
pub(super) fn capacity_error(over_capacity: usize) -> String {
    format!(
        "{over_capacity} registration(s) do not fit: ELBv2 refused them for capacity (see failedTargets); deregistrations went ahead. Raise the Elastic Load Balancing quota on targets (Service Quotas: targets per target group, per load balancer, per Availability Zone; registrations per target) or split the pods over more target groups; tried again every run, without backoff"
    )
}

impl<P: PodSource, G: TargetGroupApi, S: StateStore> Engine<P, G, S> {
    /// Settles the targets of one RegisterTargets call that ELBv2 refused; the targets
    /// registered on a second try (in a zone) go to `report.registered`.
    pub(super) async fn settle_refusals(
        &self,
        arn: &str,
        refused: Vec<Refused>,
        desired: &Desired,
        report: &mut GroupReport,
    ) -> Settled {
        let mut settled = Settled::default();
        let mut zoned = Vec::new();
        for r in refused {
            match r.refusal {
                Refusal::ZoneRequired => zoned.push(r.target),
                _ => settled += note(report, &r),
            }
        }
        if zoned.is_empty() {
            return settled;
        }
        let mut in_zones: Vec<(Target, String)> = Vec::with_capacity(zoned.len());
        let mut zones: HashMap<Arc<str>, Result<Option<String>, String>> = HashMap::new();
        for t in zoned {
            let Some(node) = desired.targets.get(&t).and_then(|d| d.node.clone()) else {
                settled.failures += fail(
                    report,
                    &[t],
                    "register",
                    "ELBv2 wants an Availability Zone of the group's VPC for this IP (cross-zone load balancing is off) and the pod runs on no node",
                );
                continue;
            };
            if !zones.contains_key(&node) {
                let zone = self.pods.node_zone(&node).await.map_err(|e| e.to_string());
                zones.insert(node.clone(), zone);
            }
            match zones.get(&node) {
                Some(Ok(Some(zone))) => in_zones.push((t, zone.clone())),
                Some(Ok(None)) => {
                    settled.failures += fail(
                        report,
                        &[t],
                        "register",
                        &format!(
                            "ELBv2 wants an Availability Zone of the group's VPC for this IP (cross-zone load balancing is off) and node `{node}` has no `topology.kubernetes.io/zone` label; label the node with the zone it should count in"
                        ),
                    )
                }
                Some(Err(e)) => settled.failures += fail(report, &[t], "register", e),
                None => {}
            }
        }
        if in_zones.is_empty() {
            return settled;
        }
        match self.groups.register_in_zones(arn, &in_zones).await {
            Ok(()) => report.registered.extend(in_zones.iter().map(|(t, _)| *t)),
            Err(ElbError::Rejected { targets, .. }) => {
                report.registered.extend(
                    in_zones
                        .iter()
                        .map(|(t, _)| *t)
                        .filter(|t| !targets.iter().any(|r| r.target == *t)),
                );
                for r in &targets {
                    settled += note(report, r);
                }
            }
            Err(e) => {
                let targets: Vec<Target> = in_zones.iter().map(|(t, _)| *t).collect();
                settled.failures += fail(report, &targets, "register", &e.to_string());
            }
        }
        settled
    }
}

/// Records one refused target in the report, as a failure or as over capacity.
fn note(report: &mut GroupReport, r: &Refused) -> Settled {
    match r.refusal {
        Refusal::Capacity => {
            tracing::warn!(target = %r.target, error = %r.reason, "registration does not fit the group's quota");
            report.failed_targets.push(FailedTarget {
                target: r.target,
                operation: "register",
                error: r.reason.clone(),
            });
            Settled {
                failures: 0,
                over_capacity: 1,
            }
        }
        // A target refused for itself, or refused a zone a second time.
        Refusal::Target | Refusal::ZoneRequired => Settled {
            failures: fail(
                report,
                std::slice::from_ref(&r.target),
                "register",
                &r.reason,
            ),
            over_capacity: 0,
        },
    }
}
