//! What a pass does with the registrations ELBv2 refused ([`ElbError::Rejected`]), by
//! what each refusal takes ([`Refusal`]). A target is not its group: neither kind of
//! refusal backs the group off, nor holds back any other target.
//! - A target refused for itself is reported (its pod, address and ELBv2's code) and
//!   backs off alone ([`Holds::refuse`]); when due it is sent again in a call of its own.
//! - A registration beyond the group's capacity (`TooManyTargets`) tells the group its
//!   capacity ([`Holds::filled`]): later passes register only what that leaves room for
//!   and probe beyond it with one registration once per growing interval, whatever the
//!   number of chunks, changes or runs, so a full group costs the other groups' budget
//!   at most one refused call an interval.
//! - A target ELBv2 wants in a named zone (an ALB group with cross-zone load balancing
//!   off, the IP outside its VPC) is registered again in its pod's node's zone.

use std::collections::HashMap;
use std::sync::Arc;

use super::Reconciler;
use super::notes::fail;
use crate::core::{Desired, Holds, Target, UnixMillis, Wait};
use crate::groups::{ElbError, Refusal, Refused, TargetGroupApi};
use crate::lease::Lease;
use crate::pods::PodSource;
use crate::report::{FailedTarget, GroupReport, WaitingTarget};
use crate::state::StateStore;

/// What the refusals of one call come to, once settled.
#[derive(Debug, Default)]
pub(super) struct Settled {
    /// Failures of the group (a zone that cannot be found): the group backs off.
    pub failures: usize,
    /// The group's capacity was reached.
    pub full: bool,
}

/// The group's error while registrations wait target by target: what happened and what
/// to do.
pub(super) fn waiting_error(waiting: &[WaitingTarget], holds: &Holds) -> String {
    let refused = waiting
        .iter()
        .filter(|w| holds.refused.contains_key(&w.target))
        .count();
    let mut parts = Vec::new();
    if refused > 0 {
        parts.push(format!(
            "{refused} target(s) refused by ELBv2 for themselves wait (see waiting: pod, address, ELBv2's code); each is tried again alone on its own backoff and the group's other targets went ahead; fix the pod (an address ELBv2 takes) or exclude it"
        ));
    }
    if let Some(full) = holds.full {
        let room = waiting.len() - refused;
        parts.push(format!(
            "{room} registration(s) do not fit: ELBv2 refused a registration for capacity at {} targets (TooManyTargets); deregistrations go ahead, and the group probes for room with one registration once per growing interval. Raise the Elastic Load Balancing quota on targets (Service Quotas: targets per target group, per load balancer, per Availability Zone) or split the pods over more target groups",
            full.capacity
        ));
    }
    parts.join("; ")
}

/// The report's entries for the registrations `holds` keeps waiting at `now`, of those
/// in `unsent` (the plan's registrations that did not go in), for a group holding
/// `present` targets.
pub(super) fn waiting(
    holds: &Holds,
    unsent: &[Target],
    present: usize,
    desired: &Desired,
    now: UnixMillis,
) -> Vec<WaitingTarget> {
    holds
        .sort(unsent, present, now)
        .waiting
        .into_iter()
        .map(|(target, wait)| WaitingTarget {
            target,
            pod: desired
                .targets
                .get(&target)
                .map(|d| d.pod.to_string())
                .unwrap_or_default(),
            retry_at: wait.until(),
            reason: match wait {
                Wait::Refused { reason, .. } => reason,
                Wait::Full { capacity, .. } => format!(
                    "the group is full: ELBv2 refused a registration at {capacity} targets (TooManyTargets)"
                ),
            },
        })
        .collect()
}

impl<P: PodSource, G: TargetGroupApi, S: StateStore> Reconciler<P, G, S> {
    /// Settles the targets of one RegisterTargets call that ELBv2 refused, in `holds`
    /// (a full group's capacity is for the caller to record); the targets registered on
    /// a second try (in a zone) go to `report.registered`.
    pub(super) async fn settle_refusals(
        &self,
        arn: &str,
        refused: Vec<Refused>,
        desired: &Desired,
        report: &mut GroupReport,
        lease: &Lease<'_, S>,
        holds: &mut Holds,
    ) -> Settled {
        let mut settled = Settled::default();
        let mut last = Vec::new();
        let mut zoned = Vec::new();
        for r in refused {
            match r.refusal {
                Refusal::ZoneRequired => zoned.push(r.target),
                _ => last.push(r),
            }
        }
        if !zoned.is_empty() {
            settled.failures += self
                .register_in_zones(arn, zoned, desired, report, lease, &mut last)
                .await;
        }
        let now = self.clock.now();
        let mut rng = self.jitter_rng();
        for r in last {
            tracing::warn!(target = %r.target, error = %r.reason, "ELBv2 refused a registration");
            report.failed_targets.push(FailedTarget {
                target: r.target,
                operation: "register",
                error: r.reason.clone(),
            });
            match r.refusal {
                Refusal::Capacity => settled.full = true,
                // A target refused for itself, or refused a zone a second time.
                Refusal::Target | Refusal::ZoneRequired => {
                    holds.refuse(
                        r.target,
                        &r.reason,
                        &self.cluster,
                        now,
                        &self.settings.target_backoff,
                        &mut rng,
                    );
                }
            }
        }
        settled
    }

    /// Registers `zoned` (refused for wanting a named zone) in their pods' nodes' zones;
    /// what ELBv2 refuses again goes to `refused`. Returns the group failures (a zone
    /// that cannot be found).
    async fn register_in_zones(
        &self,
        arn: &str,
        zoned: Vec<Target>,
        desired: &Desired,
        report: &mut GroupReport,
        lease: &Lease<'_, S>,
        refused: &mut Vec<Refused>,
    ) -> usize {
        let mut failures = 0;
        let mut in_zones: Vec<(Target, String)> = Vec::with_capacity(zoned.len());
        let mut zones: HashMap<Arc<str>, Result<Option<String>, String>> = HashMap::new();
        for t in zoned {
            let Some(node) = desired.targets.get(&t).and_then(|d| d.node.clone()) else {
                failures += fail(
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
                    failures += fail(
                        report,
                        &[t],
                        "register",
                        &format!(
                            "ELBv2 wants an Availability Zone of the group's VPC for this IP (cross-zone load balancing is off) and node `{node}` has no `topology.kubernetes.io/zone` label; label the node with the zone it should count in"
                        ),
                    )
                }
                Some(Err(e)) => failures += fail(report, &[t], "register", e),
                None => {}
            }
        }
        if in_zones.is_empty() {
            return failures;
        }
        let sent = match lease.ready().await {
            Ok(()) => self.groups.register_in_zones(arn, &in_zones, lease).await,
            // Shutting down: the pass is cut at its next step, and another asked for.
            Err(crate::state::StateError::HandedOver { .. }) => return failures,
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
                refused.extend(targets);
            }
            Err(e) => {
                let targets: Vec<Target> = in_zones.iter().map(|(t, _)| *t).collect();
                failures += fail(report, &targets, "register", &e.to_string());
            }
        }
        failures
    }
}

#[cfg(test)]
mod tests {
    use super::super::RunOptions;
    use super::super::tests::{TG, fake_engine, web_group};
    use crate::clock::Clock;
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
    async fn a_full_group_registers_what_fits_then_probes_once_an_interval() {
        let elb = web_group();
        elb.set_quota(TG, 2);
        let (e, clock) = fake_engine(FakePods::default(), elb, 1);
        for i in 1..=4 {
            e.core
                .pods
                .put(web(&format!("web-{i}"), &format!("10.0.1.{i}")).build());
        }
        let r = e.resync(&RunOptions::default()).await;
        let g = r.group(TG).unwrap();
        assert_eq!(g.registered, [t("10.0.1.1:8080"), t("10.0.1.2:8080")]);
        assert_eq!(g.failed_targets.len(), 2, "{r:#?}");
        assert!(g.failed_targets[0].error.contains("TooManyTargets"));
        assert_eq!(g.outcome, Outcome::Failed);
        assert!(g.error.as_deref().unwrap().contains("Raise the"), "{r:#?}");
        assert_eq!((g.next_attempt_at, e.core.state.backoff(TG)), (None, None));
        // The report says which pods wait, why, and until when.
        let pods: Vec<&str> = g.waiting.iter().map(|w| w.pod.as_str()).collect();
        assert_eq!(pods, ["shop/web-3", "shop/web-4"], "{r:#?}");
        assert!(g.waiting[0].reason.contains("full") && g.waiting[0].reason.contains("2 targets"));
        let probe_at = g.waiting[0].retry_at;
        assert!(probe_at.0 >= clock.now().0 + 15_000, "{r:#?}");
        // Until the probe is due no run sends anything, whatever changes.
        let before = e.core.groups.calls()["RegisterTargets"];
        e.core.pods.put(web("web-5", "10.0.1.5").build());
        let r = e.resync(&RunOptions::default()).await;
        let g = r.group(TG).unwrap();
        assert_eq!(g.outcome, Outcome::Failed);
        assert_eq!(g.waiting.len(), 3, "{r:#?}");
        assert_eq!(e.core.groups.calls()["RegisterTargets"], before);
        // Due: one registration of one target, refused; the next interval is longer.
        clock.advance(probe_at.0 - clock.now().0);
        let r = e.resync(&RunOptions::default()).await;
        let g = r.group(TG).unwrap();
        assert_eq!(
            e.core.groups.calls()["RegisterTargets"],
            before + 1,
            "{r:#?}"
        );
        let next = g.waiting[0].retry_at;
        assert!(next.0 >= probe_at.0 + 15_000, "{r:#?}");
        assert_eq!(
            e.core.state.stored(TG).held.full.map(|f| f.failures),
            Some(2)
        );
        assert_eq!(e.core.state.backoff(TG), None);
        // A raised quota: the next probe goes in, and the rest with it.
        e.core.groups.set_quota(TG, 10);
        clock.advance(next.0 - clock.now().0);
        let r = e.resync(&RunOptions::default()).await;
        let g = r.group(TG).unwrap();
        assert_eq!(g.outcome, Outcome::Changed, "{r:#?}");
        assert_eq!(g.registered.len(), 3, "{r:#?}");
        assert!(g.waiting.is_empty() && g.error.is_none(), "{r:#?}");
        assert!(e.core.state.stored(TG).held.is_empty());
    }

    #[tokio::test]
    async fn a_refused_target_backs_off_alone_and_the_others_go_in_at_once() {
        let elb = web_group();
        elb.refuse(t("10.0.1.9:8080"), "ELBv2 RegisterTargets failed: InvalidTarget: The IP address 10.0.1.9 is not in the VPC");
        let (e, clock) = fake_engine(FakePods::default(), elb, 1);
        e.core.pods.put(web("bad", "10.0.1.9").build());
        e.core.pods.put(web("web-1", "10.0.1.1").build());
        let r = e.resync(&RunOptions::default()).await;
        let g = r.group(TG).unwrap();
        assert_eq!(g.registered, [t("10.0.1.1:8080")], "{r:#?}");
        assert_eq!(g.waiting.len(), 1, "{r:#?}");
        assert_eq!(g.waiting[0].pod, "shop/bad");
        assert!(g.waiting[0].reason.contains("InvalidTarget"), "{r:#?}");
        assert_eq!(
            (g.next_attempt_at, e.core.state.backoff(TG)),
            (None, None),
            "the group does not back off"
        );
        let retry_at = g.waiting[0].retry_at;
        // A new pod of the same group goes in at once, in a call without the refused one.
        e.core.pods.put(web("web-2", "10.0.1.2").build());
        let before = e.core.groups.calls()["RegisterTargets"];
        let r = e.resync(&RunOptions::default()).await;
        let g = r.group(TG).unwrap();
        assert_eq!(g.registered, [t("10.0.1.2:8080")], "{r:#?}");
        assert_eq!(e.core.groups.calls()["RegisterTargets"], before + 1);
        // Due: sent again alone, refused again, and the delay grows.
        clock.advance(retry_at.0 - clock.now().0);
        let r = e.resync(&RunOptions::default()).await;
        let g = r.group(TG).unwrap();
        assert_eq!(
            e.core.groups.calls()["RegisterTargets"],
            before + 2,
            "{r:#?}"
        );
        assert!(g.waiting[0].retry_at.0 - retry_at.0 >= 5_000, "{r:#?}");
        assert_eq!(
            e.core.state.stored(TG).held.refused[&t("10.0.1.9:8080")].failures,
            2
        );
        // The pod goes: its refusal is forgotten.
        e.core.pods.delete("shop", "bad");
        let r = e.resync(&RunOptions::default()).await;
        assert!(r.group(TG).unwrap().waiting.is_empty(), "{r:#?}");
        assert!(e.core.state.stored(TG).held.is_empty());
    }

    #[tokio::test]
    async fn targets_that_need_a_zone_go_in_their_nodes_zones() {
        let elb = web_group();
        elb.require_zones(TG);
        let pods = FakePods::default();
        pods.set_node_zone("node-a", "eu-west-1a");
        let (e, _) = fake_engine(pods, elb, 1);
        e.core
            .pods
            .put(web("web-1", "192.168.0.1").node("node-a").build());
        e.core
            .pods
            .put(web("web-2", "192.168.0.2").node("node-x").build());
        let r = e.resync(&RunOptions::default()).await;
        let g = r.group(TG).unwrap();
        assert_eq!(g.registered, [t("192.168.0.1:8080")], "{r:#?}");
        assert_eq!(
            e.core.groups.zone_of(TG, &t("192.168.0.1:8080")).as_deref(),
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
        assert!(e.core.state.backoff(TG).is_some());
    }

    #[tokio::test]
    async fn unused_and_shifted_targets_are_reported_and_kept() {
        let (e, _) = fake_engine(FakePods::default(), web_group(), 1);
        e.core.pods.put(web("web-1", "10.0.1.1").build());
        e.core.pods.put(web("web-2", "10.0.1.2").build());
        e.resync(&RunOptions::default()).await;
        e.core.groups.settle();
        e.core
            .groups
            .add_target(TG, t("10.0.1.1:8080"), crate::core::HealthState::Unused);
        e.core
            .groups
            .set_reason(TG, t("10.0.1.1:8080"), "Target.NotInUse", None);
        e.core.groups.set_override(
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
        assert_eq!(e.core.groups.live_targets(TG).len(), 2);
    }
}
