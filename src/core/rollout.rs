//! The rollout check, sans IO: whether a group's pods keep serving long enough after
//! their deletion for the load balancer to stop sending them new connections, and
//! whether they carry the readiness gate.
//!
//! The order it checks is docs/operations.md's ("Graceful termination"):
//!
//! ```text
//! tgsync's deregistration latency + the load balancer's propagation  <=  preStop  <=  terminationGracePeriodSeconds
//! ```
//!
//! What it reads of a pod is [`super::termination`]'s.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::pod::PodFacts;
use super::termination::{PreStop, Termination};

/// tgsync's deregistration latency budget in watch mode (docs/operations.md's table).
pub const WATCH_LATENCY_SECONDS: u32 = 5;
/// The budget of pod-events without watch mode.
pub const POD_EVENTS_LATENCY_SECONDS: u32 = 10;
/// Schedule only: the schedule's period plus this (the next run's diff).
pub const SCHEDULE_DIFF_SECONDS: u32 = 30;
/// The default propagation allowance of an NLB (`TGSYNC_NLB_PROPAGATION_SECONDS`).
pub const NLB_PROPAGATION_SECONDS: u32 = 180;
/// The default propagation allowance of an ALB (`TGSYNC_ALB_PROPAGATION_SECONDS`).
pub const ALB_PROPAGATION_SECONDS: u32 = 60;
/// Distinct terminations a report lists (the counts cover every pod).
pub const TERMINATIONS_LISTED: usize = 8;

/// How quickly tgsync deregisters a deleted pod's target in this deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Reaction {
    /// Watch mode (`TGSYNC_WATCH_SECONDS` > 0).
    Watch,
    /// pod-events without watch mode.
    PodEvents,
    /// The schedule alone.
    ScheduleOnly,
}

/// tgsync's deregistration latency budget for this deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Latency {
    /// The mode the budget is for.
    pub reaction: Reaction,
    /// The budget.
    pub seconds: u32,
}

impl Latency {
    /// Watch mode's budget.
    pub fn watch() -> Self {
        Self {
            reaction: Reaction::Watch,
            seconds: WATCH_LATENCY_SECONDS,
        }
    }

    /// pod-events' budget (without watch mode).
    pub fn pod_events() -> Self {
        Self {
            reaction: Reaction::PodEvents,
            seconds: POD_EVENTS_LATENCY_SECONDS,
        }
    }

    /// The schedule's alone, every `minutes`.
    pub fn schedule_only(minutes: u32) -> Self {
        Self {
            reaction: Reaction::ScheduleOnly,
            seconds: minutes
                .saturating_mul(60)
                .saturating_add(SCHEDULE_DIFF_SECONDS),
        }
    }

    /// A deployment's budget from its settings: watch mode when it watches, otherwise
    /// the schedule's. pod-events' is never assumed: whether pod events arrive depends
    /// on an exporter tgsync cannot see, and when they do not the schedule is what
    /// deregisters.
    pub fn of_deployment(watches: bool, schedule_minutes: u32) -> Self {
        if watches {
            Self::watch()
        } else {
            Self::schedule_only(schedule_minutes)
        }
    }
}

/// The kind of load balancer a target group serves, from its protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LoadBalancerType {
    /// A Network Load Balancer (TCP, UDP, TCP_UDP, TLS, QUIC, TCP_QUIC groups).
    #[serde(rename = "NLB")]
    Nlb,
    /// An Application Load Balancer (HTTP, HTTPS groups).
    #[serde(rename = "ALB")]
    Alb,
}

impl LoadBalancerType {
    /// The type of a group of `protocol` (ELBv2's string); `None` for a Gateway Load
    /// Balancer's (GENEVE), a group without one (`lambda`) or one this version does not
    /// know.
    pub fn of_protocol(protocol: &str) -> Option<Self> {
        match protocol {
            "TCP" | "UDP" | "TCP_UDP" | "TLS" | "QUIC" | "TCP_QUIC" => Some(Self::Nlb),
            "HTTP" | "HTTPS" => Some(Self::Alb),
            _ => None,
        }
    }

    /// `NLB` or `ALB`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Nlb => "NLB",
            Self::Alb => "ALB",
        }
    }
}

/// How long each type of load balancer may keep sending new connections to a target
/// after it was deregistered (`TGSYNC_NLB_PROPAGATION_SECONDS`,
/// `TGSYNC_ALB_PROPAGATION_SECONDS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allowances {
    /// An NLB's.
    pub nlb_seconds: u32,
    /// An ALB's.
    pub alb_seconds: u32,
}

impl Default for Allowances {
    fn default() -> Self {
        Self {
            nlb_seconds: NLB_PROPAGATION_SECONDS,
            alb_seconds: ALB_PROPAGATION_SECONDS,
        }
    }
}

impl Allowances {
    /// The allowance of `lb`.
    pub fn of(self, lb: LoadBalancerType) -> u32 {
        match lb {
            LoadBalancerType::Nlb => self.nlb_seconds,
            LoadBalancerType::Alb => self.alb_seconds,
        }
    }
}

/// What the check reads of a target group besides its pods: its protocol and health
/// check (the group's description) and its attributes (DescribeTargetGroupAttributes).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupAttributes {
    /// `Protocol` (`TCP`, `HTTP`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// `HealthCheckIntervalSeconds`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check_interval_seconds: Option<u32>,
    /// `UnhealthyThresholdCount`: with the interval, how soon a target failing its
    /// health check stops getting new connections (the shorter pattern).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unhealthy_threshold_count: Option<u32>,
    /// `deregistration_delay.timeout_seconds`: how long existing connections may finish.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deregistration_delay_seconds: Option<u32>,
    /// `deregistration_delay.connection_termination.enabled` (NLB groups only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection_termination: Option<bool>,
}

impl GroupAttributes {
    /// The group's load balancer type, when its protocol tells one.
    pub fn load_balancer(&self) -> Option<LoadBalancerType> {
        self.protocol
            .as_deref()
            .and_then(LoadBalancerType::of_protocol)
    }
}

/// What the check needs beyond the pods: the deployment's latency and the group's load
/// balancer and its allowance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// tgsync's deregistration latency.
    pub latency: Latency,
    /// The group's load balancer.
    pub load_balancer: LoadBalancerType,
    /// Its propagation allowance.
    pub allowance_seconds: u32,
}

impl Budget {
    /// The shortest `preStop` sleep that covers the budget.
    pub fn pre_stop_needed(self) -> u32 {
        self.latency.seconds.saturating_add(self.allowance_seconds)
    }

    /// `(watch 5 s + NLB 180 s)`.
    fn terms(self) -> String {
        let mode = match self.latency.reaction {
            Reaction::Watch => "watch",
            Reaction::PodEvents => "pod-events",
            Reaction::ScheduleOnly => "schedule only",
        };
        format!(
            "{mode} {} s + {} {} s",
            self.latency.seconds,
            self.load_balancer.as_str(),
            self.allowance_seconds
        )
    }
}

/// Whether one pod's termination covers the budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Verdict {
    /// `preStop` sleeps at least the budget, and the grace period is no shorter.
    Covered,
    /// The pod may be stopped (or stop accepting) while the load balancer still sends
    /// it new connections.
    TooShort,
    /// Its `preStop` cannot be read, and its grace period would cover the budget.
    Unknown,
}

/// The verdict on `t` under `budget`, and for a pod too short, why.
pub fn verdict(t: Termination, budget: Budget) -> (Verdict, Option<String>) {
    let need = budget.pre_stop_needed();
    let grace = t.grace_seconds;
    match t.pre_stop {
        PreStop::None => (
            Verdict::TooShort,
            Some(format!(
                "no preStop sleep: SIGTERM at the deletion; it needs a preStop of at least {need} s ({})",
                budget.terms()
            )),
        ),
        PreStop::Sleep(s) if s < need => (
            Verdict::TooShort,
            Some(format!(
                "preStop sleeps {s} s; it needs at least {need} s ({})",
                budget.terms()
            )),
        ),
        PreStop::Sleep(s) if grace < s => (
            Verdict::TooShort,
            Some(format!(
                "terminationGracePeriodSeconds {grace} s ends the preStop sleep of {s} s early (SIGKILL)"
            )),
        ),
        PreStop::Sleep(_) => (Verdict::Covered, None),
        PreStop::Unknown if grace < need => (
            Verdict::TooShort,
            Some(format!(
                "terminationGracePeriodSeconds {grace} s is under {need} s ({}), whatever its preStop does",
                budget.terms()
            )),
        ),
        PreStop::Unknown => (Verdict::Unknown, None),
    }
}

/// One termination the group's pods have, and how many have it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TerminationSeen {
    /// `terminationGracePeriodSeconds`.
    pub grace_seconds: u32,
    /// The `preStop` sleep read (none: no hook, or one not readable: see `preStop`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pre_stop_seconds: Option<u32>,
    /// `sleep`, `none` or `unknown`.
    pub pre_stop: String,
    /// Pods with it.
    pub pods: usize,
    /// The verdict (none when the group's load balancer is not known).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<Verdict>,
    /// Why it is too short.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A pod of the group the check has something to say about (its termination is too
/// short, it lacks the readiness gate), and what.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodFinding {
    /// `namespace/name`.
    pub pod: String,
    /// What, in words (`; `-separated when both).
    pub reason: String,
}

/// What the check says of a pod without the readiness gate.
pub const NO_GATE: &str = "no tgsync/target-health readiness gate: a rolling update may delete it before its successor is healthy in the load balancer";

/// The rollout check of one group: what its pods' terminations and gates are, against
/// the numbers it used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RolloutCheck {
    /// The group's load balancer (none when unknown: see `unchecked`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_balancer: Option<LoadBalancerType>,
    /// The deployment's mode the latency budget is for.
    pub mode: Reaction,
    /// tgsync's deregistration latency budget.
    pub latency_seconds: u32,
    /// The load balancer's propagation allowance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowance_seconds: Option<u32>,
    /// The shortest `preStop` sleep that covers both.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pre_stop_needed_seconds: Option<u32>,
    /// The group's pods (selected, not excluded, not finished).
    pub pods: usize,
    /// Of them, covered.
    pub covered: usize,
    /// Of them, too short.
    pub too_short: usize,
    /// Of them, with a `preStop` tgsync cannot read (and a grace period that would
    /// cover the budget).
    pub unknown: usize,
    /// Of them, without the `tgsync/target-health` readiness gate.
    pub without_gate: usize,
    /// The distinct terminations, the worst first (at most [`TERMINATIONS_LISTED`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub terminations: Vec<TerminationSeen>,
    /// The group's settings the check read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<GroupAttributes>,
    /// Why the terminations were not checked (the group's settings not read, or not an
    /// NLB or ALB group).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unchecked: Option<String>,
    /// The pods too short or without the gate, each with what (not part of the JSON
    /// report: kept only when asked, for `tgsync status --targets`).
    #[serde(skip)]
    pub findings: Vec<PodFinding>,
}

impl RolloutCheck {
    /// Pods without the readiness gate, or (when checked) too short.
    pub fn has_findings(&self) -> bool {
        self.too_short > 0 || self.without_gate > 0
    }
}

/// Whether the check counts `pod`: not excluded, not finished.
fn counted(pod: &PodFacts) -> bool {
    !pod.excluded && !matches!(pod.phase.as_str(), "Succeeded" | "Failed")
}

/// The check of a group's `pods` (those its binding selects) for `latency`, against
/// its `group` settings (`Err`: why they are not known) and `allowances`. With
/// `name_pods`, each pod too short or without the gate is named in
/// [`RolloutCheck::findings`].
pub fn check<'a>(
    pods: impl IntoIterator<Item = &'a PodFacts>,
    latency: Latency,
    group: Result<&GroupAttributes, &str>,
    allowances: Allowances,
    name_pods: bool,
) -> RolloutCheck {
    let lb = group.ok().and_then(GroupAttributes::load_balancer);
    let budget = lb.map(|lb| Budget {
        latency,
        load_balancer: lb,
        allowance_seconds: allowances.of(lb),
    });
    let unchecked = match (group, budget) {
        (Err(why), _) => Some(why.to_owned()),
        (Ok(g), None) => Some(format!(
            "the group's protocol ({}) is not an NLB's or an ALB's",
            g.protocol.as_deref().unwrap_or("none")
        )),
        (Ok(_), Some(_)) => None,
    };
    let mut out = RolloutCheck {
        load_balancer: lb,
        mode: latency.reaction,
        latency_seconds: latency.seconds,
        allowance_seconds: budget.map(|b| b.allowance_seconds),
        pre_stop_needed_seconds: budget.map(Budget::pre_stop_needed),
        pods: 0,
        covered: 0,
        too_short: 0,
        unknown: 0,
        without_gate: 0,
        terminations: Vec::new(),
        group: group.ok().cloned(),
        unchecked,
        findings: Vec::new(),
    };
    let mut seen: BTreeMap<Termination, usize> = BTreeMap::new();
    for pod in pods.into_iter().filter(|p| counted(p)) {
        out.pods += 1;
        out.without_gate += usize::from(pod.gate.is_none());
        *seen.entry(pod.termination).or_default() += 1;
        let mut said = Vec::new();
        if let Some(budget) = budget {
            match verdict(pod.termination, budget) {
                (Verdict::Covered, _) => out.covered += 1,
                (Verdict::Unknown, _) => out.unknown += 1,
                (Verdict::TooShort, reason) => {
                    out.too_short += 1;
                    said.extend(reason);
                }
            }
        }
        if pod.gate.is_none() {
            said.push(NO_GATE.to_owned());
        }
        if name_pods && !said.is_empty() {
            out.findings.push(PodFinding {
                pod: pod.pod.to_string(),
                reason: said.join("; "),
            });
        }
    }
    let mut terminations: Vec<TerminationSeen> = seen
        .into_iter()
        .map(|(t, pods)| {
            let (verdict, reason) = budget.map(|b| verdict(t, b)).unzip();
            TerminationSeen {
                grace_seconds: t.grace_seconds,
                pre_stop_seconds: t.pre_stop.seconds(),
                pre_stop: match t.pre_stop {
                    PreStop::None => "none",
                    PreStop::Sleep(_) => "sleep",
                    PreStop::Unknown => "unknown",
                }
                .to_owned(),
                pods,
                verdict,
                reason: reason.flatten(),
            }
        })
        .collect();
    let rank = |v: Option<Verdict>| match v {
        Some(Verdict::TooShort) => 0,
        Some(Verdict::Unknown) => 1,
        None => 2,
        Some(Verdict::Covered) => 3,
    };
    terminations.sort_by(|a, b| {
        rank(a.verdict)
            .cmp(&rank(b.verdict))
            .then(b.pods.cmp(&a.pods))
    });
    terminations.truncate(TERMINATIONS_LISTED);
    out.terminations = terminations;
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::PodBuilder;

    fn exec(words: &[&str]) -> PreStop {
        PreStop::exec(words)
    }

    #[test]
    fn the_sleeps_it_can_read() {
        assert_eq!(PreStop::native_sleep(190), PreStop::Sleep(190));
        assert_eq!(PreStop::native_sleep(0), PreStop::Sleep(0));
        for command in [
            &["sleep", "190"][..],
            &["/bin/sleep", "190"],
            &["/usr/bin/sleep", "190s"],
            &["sh", "-c", "sleep 190"],
            &["/bin/sh", "-c", "  sleep   190 "],
            &["bash", "-c", "sleep 190"],
            &["/bin/ash", "-c", "sleep 190s"],
        ] {
            assert_eq!(exec(command), PreStop::Sleep(190), "{command:?}");
        }
    }

    #[test]
    fn what_it_cannot_read_is_unknown() {
        assert_eq!(PreStop::native_sleep(-1), PreStop::Unknown);
        for command in [
            &[][..],
            &["sleep"],
            &["sleep", ""],
            &["sleep", "1.5"],
            &["sleep", "3m"],
            &["sleep", "-5"],
            &["sleep", "190", "&&", "true"],
            &["sleep", "99999999999"],
            &["bin/sleep", "190"],
            &["/bin/", "190"],
            &["slep", "190"],
            &["sh", "-c", "sleep 190 && kill -TERM 1"],
            &["sh", "-c", "sleep 190;"],
            &["sh", "-c", "echo bye; sleep 190"],
            &["sh", "-c", "sleep"],
            &["sh", "190"],
            &["python", "-c", "sleep 190"],
            &["sh", "-e", "sleep 190"],
            &["/app/drain.sh"],
        ] {
            assert_eq!(exec(command), PreStop::Unknown, "{command:?}");
        }
    }

    /// The typed reader ([`PodFacts::from_pod`], what the lean LIST decoder is held to)
    /// on pods as the API server returns them.
    #[test]
    fn the_fixtures_termination() {
        use crate::core::test_fixtures::fixture;
        let read = |name| PodFacts::from_pod(fixture(name)).termination;
        assert_eq!(
            read("graceful"),
            Termination {
                grace_seconds: 220,
                pre_stop: PreStop::Sleep(190)
            }
        );
        // `terminationGracePeriodSeconds: 30` written out, no hook.
        assert_eq!(read("running"), Termination::default());
        assert_eq!(read("gated"), Termination::default());
    }

    #[test]
    fn several_containers_take_the_longest_readable_sleep() {
        use PreStop::{None as No, Sleep, Unknown};
        assert_eq!(Sleep(10).longest(Sleep(190)), Sleep(190));
        assert_eq!(Sleep(190).longest(Unknown), Sleep(190));
        assert_eq!(Unknown.longest(Sleep(5)), Sleep(5));
        assert_eq!(No.longest(Sleep(5)), Sleep(5));
        assert_eq!(No.longest(Unknown), Unknown);
        assert_eq!(No.longest(No), No);
    }

    #[test]
    fn the_grace_period_defaults_to_thirty_seconds() {
        assert_eq!(Termination::grace(None), 30);
        assert_eq!(Termination::grace(Some(220)), 220);
        assert_eq!(Termination::grace(Some(0)), 0);
        assert_eq!(Termination::grace(Some(-3)), 0);
        assert_eq!(Termination::grace(Some(i64::MAX)), u32::MAX);
        assert_eq!(
            Termination::default().grace_seconds,
            crate::core::termination::DEFAULT_GRACE_SECONDS
        );
    }

    #[test]
    fn the_latency_budget_follows_the_deployments_mode() {
        assert_eq!(Latency::of_deployment(true, 3), Latency::watch());
        assert_eq!(Latency::watch().seconds, 5);
        assert_eq!(Latency::pod_events().seconds, 10);
        let schedule = Latency::of_deployment(false, 2);
        assert_eq!(schedule.reaction, Reaction::ScheduleOnly);
        assert_eq!(schedule.seconds, 2 * 60 + 30);
    }

    #[test]
    fn the_load_balancer_type_comes_from_the_protocol() {
        for p in ["TCP", "UDP", "TCP_UDP", "TLS", "QUIC", "TCP_QUIC"] {
            assert_eq!(
                LoadBalancerType::of_protocol(p),
                Some(LoadBalancerType::Nlb)
            );
        }
        for p in ["HTTP", "HTTPS"] {
            assert_eq!(
                LoadBalancerType::of_protocol(p),
                Some(LoadBalancerType::Alb)
            );
        }
        for p in ["GENEVE", "", "tcp"] {
            assert_eq!(LoadBalancerType::of_protocol(p), None, "{p}");
        }
    }

    fn nlb(latency: Latency) -> Budget {
        Budget {
            latency,
            load_balancer: LoadBalancerType::Nlb,
            allowance_seconds: NLB_PROPAGATION_SECONDS,
        }
    }

    fn t(grace: u32, pre_stop: PreStop) -> Termination {
        Termination {
            grace_seconds: grace,
            pre_stop,
        }
    }

    #[test]
    fn verdicts_follow_the_documented_order() {
        let b = nlb(Latency::watch());
        assert_eq!(b.pre_stop_needed(), 185);
        let v = |t| verdict(t, b).0;
        assert_eq!(v(t(220, PreStop::Sleep(190))), Verdict::Covered);
        assert_eq!(v(t(185, PreStop::Sleep(185))), Verdict::Covered);
        assert_eq!(v(t(220, PreStop::Sleep(184))), Verdict::TooShort);
        assert_eq!(v(t(189, PreStop::Sleep(190))), Verdict::TooShort);
        assert_eq!(v(t(600, PreStop::None)), Verdict::TooShort);
        assert_eq!(v(t(220, PreStop::Unknown)), Verdict::Unknown);
        assert_eq!(v(t(184, PreStop::Unknown)), Verdict::TooShort);
        // Schedule only: the interval counts too.
        let b = nlb(Latency::schedule_only(1));
        assert_eq!(b.pre_stop_needed(), 60 + 30 + 180);
        assert_eq!(verdict(t(220, PreStop::Sleep(190)), b).0, Verdict::TooShort);
        let (_, why) = verdict(t(220, PreStop::Sleep(190)), b);
        assert_eq!(
            why.as_deref(),
            Some("preStop sleeps 190 s; it needs at least 270 s (schedule only 90 s + NLB 180 s)")
        );
    }

    fn nlb_group() -> GroupAttributes {
        GroupAttributes {
            protocol: Some("TCP".into()),
            ..GroupAttributes::default()
        }
    }

    fn pod(name: &str, b: impl FnOnce(PodBuilder) -> PodBuilder) -> PodFacts {
        let builder = PodBuilder::new("shop", name)
            .label("app", "web")
            .ip("10.0.1.1")
            .ready(true);
        PodFacts::from_pod(b(builder).build())
    }

    /// Part 3 of the issue, as a unit: a pod template with a 30-s grace and no preStop
    /// is too short for an NLB group; the documented template (docs/operations.md:
    /// a 190-s sleep, a 220-s grace) is covered.
    #[test]
    fn the_default_template_is_too_short_and_the_documented_one_covered() {
        let default = pod("web-default", |b| b.gated());
        assert_eq!(default.termination, Termination::default());
        let documented = pod("web-documented", |b| {
            b.gated().grace_period(220).pre_stop_sleep(190)
        });
        let group = nlb_group();
        let c = check(
            [&default],
            Latency::watch(),
            Ok(&group),
            Allowances::default(),
            true,
        );
        assert_eq!((c.pods, c.too_short, c.covered), (1, 1, 0));
        assert_eq!(c.load_balancer, Some(LoadBalancerType::Nlb));
        assert_eq!(c.pre_stop_needed_seconds, Some(185));
        assert_eq!(c.findings[0].pod, "shop/web-default");
        assert!(
            c.findings[0].reason.starts_with("no preStop sleep"),
            "{:?}",
            c.findings
        );
        let c = check(
            [&documented],
            Latency::watch(),
            Ok(&group),
            Allowances::default(),
            true,
        );
        assert_eq!(
            (c.pods, c.too_short, c.covered, c.without_gate),
            (1, 0, 1, 0)
        );
        assert_eq!(
            c.terminations,
            [TerminationSeen {
                grace_seconds: 220,
                pre_stop_seconds: Some(190),
                pre_stop: "sleep".into(),
                pods: 1,
                verdict: Some(Verdict::Covered),
                reason: None,
            }]
        );
        // The same as an exec of sleep, as the docs give it for clusters before 1.30.
        let exec = pod("web-exec", |b| {
            b.gated().grace_period(220).pre_stop_exec(&["sleep", "190"])
        });
        let c = check(
            [&exec],
            Latency::watch(),
            Ok(&group),
            Allowances::default(),
            false,
        );
        assert_eq!(c.covered, 1);
        assert!(c.findings.is_empty(), "nothing to say");
        let ungated = pod("web-ungated", |b| b.grace_period(220).pre_stop_sleep(190));
        let c = check(
            [&ungated],
            Latency::watch(),
            Ok(&group),
            Allowances::default(),
            true,
        );
        assert_eq!((c.covered, c.without_gate), (1, 1));
        assert_eq!(c.findings[0].reason, NO_GATE);
        let c = check(
            [&default],
            Latency::watch(),
            Ok(&group),
            Allowances::default(),
            false,
        );
        assert!(c.findings.is_empty(), "named only when asked");
    }

    #[test]
    fn a_rollout_between_two_templates_counts_both() {
        let old: Vec<PodFacts> = (0..3).map(|i| pod(&format!("old-{i}"), |b| b)).collect();
        let new: Vec<PodFacts> = (0..2)
            .map(|i| {
                pod(&format!("new-{i}"), |b| {
                    b.gated().grace_period(100).pre_stop_sleep(70)
                })
            })
            .collect();
        let mut excluded = pod("excluded", |b| b.annotation("tgsync/exclude", "true"));
        excluded.excluded = true;
        let mut done = pod("done", |b| b);
        done.phase = "Succeeded".into();
        let alb = GroupAttributes {
            protocol: Some("HTTP".into()),
            ..GroupAttributes::default()
        };
        let all: Vec<&PodFacts> = old.iter().chain(&new).chain([&excluded, &done]).collect();
        let c = check(
            all.iter().copied(),
            Latency::watch(),
            Ok(&alb),
            Allowances::default(),
            false,
        );
        assert_eq!(c.load_balancer, Some(LoadBalancerType::Alb));
        assert_eq!(c.pre_stop_needed_seconds, Some(65));
        assert_eq!(
            (c.pods, c.too_short, c.covered, c.without_gate),
            (5, 3, 2, 3)
        );
        assert_eq!(c.terminations.len(), 2);
        assert_eq!(c.terminations[0].verdict, Some(Verdict::TooShort));
        assert_eq!(c.terminations[0].pods, 3);
        // Longer allowances are the operator's to set.
        let c = check(
            all.iter().copied(),
            Latency::watch(),
            Ok(&alb),
            Allowances {
                nlb_seconds: 180,
                alb_seconds: 120,
            },
            false,
        );
        assert_eq!((c.too_short, c.covered), (5, 0));
    }

    #[test]
    fn without_the_groups_settings_only_the_gates_are_counted() {
        let pods = [pod("a", |b| b), pod("b", |b| b.gated())];
        let c = check(
            &pods,
            Latency::watch(),
            Err("not read yet"),
            Allowances::default(),
            true,
        );
        assert_eq!(c.unchecked.as_deref(), Some("not read yet"));
        assert_eq!(
            (c.pods, c.too_short, c.covered, c.without_gate),
            (2, 0, 0, 1)
        );
        assert!(c.has_findings());
        assert_eq!(c.terminations[0].verdict, None);
        let geneve = GroupAttributes {
            protocol: Some("GENEVE".into()),
            ..GroupAttributes::default()
        };
        let c = check(
            &pods,
            Latency::watch(),
            Ok(&geneve),
            Allowances::default(),
            false,
        );
        assert!(c.unchecked.unwrap().contains("GENEVE"));
        assert_eq!(c.allowance_seconds, None);
    }

    #[test]
    fn the_check_reads_back_as_it_was_written() {
        let pods = [pod("a", |b| b.grace_period(40).pre_stop_sleep(20))];
        let group = GroupAttributes {
            protocol: Some("TCP".into()),
            health_check_interval_seconds: Some(10),
            unhealthy_threshold_count: Some(2),
            deregistration_delay_seconds: Some(300),
            connection_termination: Some(false),
        };
        let c = check(
            &pods,
            Latency::watch(),
            Ok(&group),
            Allowances::default(),
            false,
        );
        let json = serde_json::to_value(&c).unwrap();
        assert_eq!(json["loadBalancer"], "NLB");
        assert_eq!(json["mode"], "watch");
        assert_eq!(json["latencySeconds"], 5);
        assert_eq!(json["allowanceSeconds"], 180);
        assert_eq!(json["tooShort"], 1);
        assert_eq!(json["terminations"][0]["graceSeconds"], 40);
        assert_eq!(json["terminations"][0]["preStopSeconds"], 20);
        assert_eq!(json["group"]["deregistrationDelaySeconds"], 300);
        let back: RolloutCheck = serde_json::from_value(json).unwrap();
        assert_eq!(back, c);
    }
}
