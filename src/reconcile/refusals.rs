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

use super::Reconciler;
use super::pass::fail;
use crate::core::{Desired, Target};
use crate::groups::{ElbError, Refusal, Refused, TargetGroupApi};
use crate::lease::Lease;
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

impl<P: PodSource, G: TargetGroupApi, S: StateStore> Reconciler<P, G, S> {
    /// Settles the targets of one RegisterTargets call that ELBv2 refused; the targets
    /// registered on a second try (in a zone) go to `report.registered`.
    pub(super) async fn settle_refusals(
        &self,
        arn: &str,
        refused: Vec<Refused>,
        desired: &Desired,
        report: &mut GroupReport,
        lease: &Lease<'_, S>,
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
        let sent = match lease.ready().await {
            Ok(()) => self.groups.register_in_zones(arn, &in_zones, lease).await,
            // Shutting down: the pass is cut at its next step, and another asked for.
            Err(crate::state::StateError::HandedOver { .. }) => return settled,
            Err(e) => Err(ElbError::Fenced {
                operation: "RegisterTargets",
                reason: e.to_string(),
            }),
        };
        match sent {
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

#[cfg(test)]
mod tests {
    use super::super::RunOptions;
    use super::super::tests::{TG, fake_engine, web_group};
    use crate::core::{AdministrativeOverride, Target};
    use crate::fakes::FakePods;
    use crate::report::Outcome;
    use crate::testkit::PodBuilder;

    fn web(name: &str, ip: &str) -> PodBuilder {
        PodBuilder::new("shop", name).label("app", "web").ip(ip)
    }

    fn t(s: &str) -> Target {
        s.parse().unwrap()
    }

    #[tokio::test]
    async fn a_full_group_registers_what_fits_and_does_not_back_off() {
        let elb = web_group();
        elb.set_quota(TG, 2);
        let (e, _) = fake_engine(FakePods::default(), elb, 1);
        for i in 1..=3 {
            e.pods
                .put(web(&format!("web-{i}"), &format!("10.0.1.{i}")).build());
        }
        let r = e.resync(&RunOptions::default()).await;
        let g = r.group(TG).unwrap();
        assert_eq!(g.registered, [t("10.0.1.1:8080"), t("10.0.1.2:8080")]);
        assert_eq!(g.failed_targets.len(), 1, "{r:#?}");
        assert!(g.failed_targets[0].error.contains("TooManyTargets"));
        assert_eq!(g.outcome, Outcome::Failed);
        assert!(g.error.as_deref().unwrap().contains("Raise the"), "{r:#?}");
        assert_eq!((g.next_attempt_at, e.state.backoff(TG)), (None, None));
        // Every run tries again, never held back.
        let before = e.groups.calls()["RegisterTargets"];
        let r = e.resync(&RunOptions::default()).await;
        assert_eq!(r.group(TG).unwrap().outcome, Outcome::Failed);
        assert_eq!(e.groups.calls()["RegisterTargets"], before + 1);
        assert_eq!(e.state.backoff(TG), None);
    }

    #[tokio::test]
    async fn targets_that_need_a_zone_go_in_their_nodes_zones() {
        let elb = web_group();
        elb.require_zones(TG);
        let pods = FakePods::default();
        pods.set_node_zone("node-a", "eu-west-1a");
        let (e, _) = fake_engine(pods, elb, 1);
        e.pods
            .put(web("web-1", "192.168.0.1").node("node-a").build());
        e.pods
            .put(web("web-2", "192.168.0.2").node("node-x").build());
        let r = e.resync(&RunOptions::default()).await;
        let g = r.group(TG).unwrap();
        assert_eq!(g.registered, [t("192.168.0.1:8080")], "{r:#?}");
        assert_eq!(
            e.groups.zone_of(TG, &t("192.168.0.1:8080")).as_deref(),
            Some("eu-west-1a")
        );
        assert_eq!(g.failed_targets.len(), 1, "{r:#?}");
        assert!(
            g.failed_targets[0]
                .error
                .contains("node `node-x` has no `topology.kubernetes.io/zone` label"),
            "{r:#?}"
        );
        // A failure to fix (label the node): the group backs off.
        assert_eq!(g.outcome, Outcome::Failed);
        assert!(e.state.backoff(TG).is_some());
    }

    #[tokio::test]
    async fn unused_and_shifted_targets_are_reported_and_kept() {
        let (e, _) = fake_engine(FakePods::default(), web_group(), 1);
        e.pods.put(web("web-1", "10.0.1.1").build());
        e.pods.put(web("web-2", "10.0.1.2").build());
        e.resync(&RunOptions::default()).await;
        e.groups.settle();
        e.groups
            .add_target(TG, t("10.0.1.1:8080"), crate::core::HealthState::Unused);
        e.groups
            .set_reason(TG, t("10.0.1.1:8080"), "Target.NotInUse", None);
        e.groups.set_override(
            TG,
            t("10.0.1.2:8080"),
            Some(AdministrativeOverride {
                state: "zonal_shift_active".into(),
                reason: Some("AdministrativeOverride.ZonalShiftActive".into()),
                description: None,
            }),
        );
        let r = e.resync(&RunOptions::default()).await;
        let g = r.group(TG).unwrap();
        assert_eq!(g.outcome, Outcome::InSync, "{r:#?}");
        assert_eq!(g.unused_targets.len(), 1);
        assert_eq!(g.unused_targets[0].target, t("10.0.1.1:8080"));
        assert_eq!(
            g.unused_targets[0].reason.as_deref(),
            Some("Target.NotInUse")
        );
        assert_eq!(g.administrative_overrides.len(), 1);
        assert_eq!(g.administrative_overrides[0].target, t("10.0.1.2:8080"));
        assert_eq!(g.administrative_overrides[0].state, "healthy");
        assert!(g.is_eventful());
        assert_eq!(e.groups.live_targets(TG).len(), 2);
    }
}
