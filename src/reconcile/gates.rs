//! Readiness gates, in one place: a gated pod's `tgsync/target-health` condition is
//! True only when its target is healthy in every bound group that selects it, and False
//! with ELBv2's reason while it is not (see [`crate::core::gate`]); it is patched only
//! when that changes, on the pod's UID (never a namesake's).
//!
//! A group in a binding error is not bound and selects nothing, so it neither holds a
//! gate nor opens one. A group whose registrations back off keeps the gate closed
//! (`TargetNotRegistered`) until its target is registered and healthy there: a pod must
//! not turn Ready while one of its load balancers cannot send it traffic.
//!
//! An open gate stays open: the gate paces a rollout (as the pod's first readiness),
//! and closing it later on a failed health check would take the pod out of every group
//! it serves — the NLB already stops sending traffic to an unhealthy target.
//!
//! Target health read anywhere in the engine is remembered for [`HEALTH_FRESH`], so the
//! groups of a pod are read once per poll, not once per group that asks.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::{BoundGroup, Reconciler};
use crate::clock::Clock;
use crate::core::gate::{GateVerdict, GroupHealth, GroupView, verdict};
use crate::core::{PodFacts, SkipReason, Target, TargetHealth, holding};
use crate::groups::{ElbError, Priority, TargetGroupApi};
use crate::index::BoundIndex;
use crate::metrics::Sink;
use crate::pods::PodSource;
use crate::report::{GroupReport, PodError};
use crate::state::StateStore;

/// How long a target-health read stands for the group's health in a gate's verdict.
pub(crate) const HEALTH_FRESH: Duration = Duration::from_secs(1);

/// How long a gate write this container made stands for the pod's condition (a pod
/// read or the informer may not show it yet); after that the pod's own says.
pub(crate) const SAID_FOR: Duration = Duration::from_secs(60);

/// A group's target health as read, and when (real time).
type HealthRead = (Instant, Arc<Vec<TargetHealth>>);

/// What the gates remember between passes in this container.
#[derive(Default)]
pub(crate) struct GateMemory {
    /// Target health of groups as last read (real time of the read), shared by
    /// everything that reads it: a gate's verdict reuses a fresh read.
    health: Mutex<HashMap<String, HealthRead>>,
    /// What each gated pod's condition (by UID) was last written to say here, and when:
    /// settlers that run at once (a group's pass, another group's, the gate poll) write
    /// each change once.
    said: Mutex<HashMap<String, (Instant, Said)>>,
    /// When each gated pod's gate (by UID) was last found closed here: its target
    /// turned healthy everywhere after that, so a gate opened later took at most that
    /// long (the `GateLatency` metric).
    waiting: Mutex<HashMap<String, Instant>>,
}

/// A gate found closed longer ago than this is forgotten (its pod is gone, or its
/// target never turned healthy).
const WAITING_FOR: Duration = Duration::from_secs(600);

/// What a gate condition says: open, or closed with a reason and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Said {
    open: bool,
    reason: String,
    message: String,
}

/// What settling a pod's gate did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Settled {
    /// Opened now.
    Opened,
    /// Still closed; its condition now says why.
    Closed,
    /// Nothing to do (already as the verdict says, or no group selects it).
    Unchanged,
    /// The patch failed (a pod error in the report).
    Failed,
}

impl<P: PodSource, G: TargetGroupApi, S: StateStore> Reconciler<P, G, S> {
    /// One DescribeTargetHealth of `arn` at `priority`, remembered for the gates.
    pub(crate) async fn read_health(
        &self,
        arn: &str,
        priority: &Priority,
    ) -> Result<Vec<TargetHealth>, ElbError> {
        let health = self.groups.health(arn, priority).await?;
        self.memory.gates.remember_health(arn, health.clone());
        Ok(health)
    }

    /// The gates of this container's pods, over the parts of the core they use.
    pub(crate) fn gates(&self) -> Gates<'_, P, G> {
        Gates {
            pods: &self.pods,
            groups: &self.groups,
            index: &self.index,
            memory: &self.memory.gates,
            sink: self.sink.as_ref(),
            function: &self.owner_prefix,
            cluster: &self.cluster,
            clock: self.clock.as_ref(),
        }
    }
}

/// The readiness gates (see the module docs): what settling one reads (the bound
/// groups, their target health, what a gate last said here) and where it writes (the
/// pod's condition, the gate-latency metric).
pub(crate) struct Gates<'a, P, G> {
    pods: &'a P,
    groups: &'a G,
    index: &'a BoundIndex,
    memory: &'a GateMemory,
    /// Told how long each gate opened took, for `function` in `cluster`.
    sink: &'a dyn Sink,
    function: &'a str,
    cluster: &'a str,
    clock: &'a dyn Clock,
}

impl GateMemory {
    /// Records `health` as `arn`'s target health as of now (a read, or what a pass's
    /// changes made of it), and returns it as kept.
    pub(super) fn remember_health(
        &self,
        arn: &str,
        health: Vec<TargetHealth>,
    ) -> Arc<Vec<TargetHealth>> {
        let health = Arc::new(health);
        if let Ok(mut cache) = self.health.lock() {
            cache.insert(arn.to_owned(), (Instant::now(), health.clone()));
        }
        health
    }

    /// `arn`'s target health if it was read less than [`HEALTH_FRESH`] ago.
    fn fresh_health(&self, arn: &str) -> Option<Arc<Vec<TargetHealth>>> {
        self.health.lock().ok().and_then(|c| {
            c.get(arn)
                .filter(|(at, _)| at.elapsed() < HEALTH_FRESH)
                .map(|(_, h)| h.clone())
        })
    }
}

impl<P: PodSource, G: TargetGroupApi> Gates<'_, P, G> {
    /// `arn`'s target health read less than [`HEALTH_FRESH`] ago, or read now (a gate's
    /// read: a pod in a rollout waits for it, so at a reaction's priority); `None` when
    /// it cannot be read.
    async fn health(&self, arn: &str) -> Option<Arc<Vec<TargetHealth>>> {
        if let Some(h) = self.memory.fresh_health(arn) {
            return Some(h);
        }
        let health = self.groups.health(arn, &Priority::Reaction).await.ok()?;
        Some(self.memory.remember_health(arn, health))
    }

    /// The bound groups of `pod`'s namespace whose bindings select it (see
    /// [`holding`]): each with the pod's target in it, or why it cannot hold the pod.
    fn selecting(&self, pod: &PodFacts) -> Vec<(BoundGroup, Result<Target, SkipReason>)> {
        let bound = self.index.in_namespace(&pod.pod.namespace);
        bound
            .iter()
            .filter_map(|b| Some((b.clone(), holding(pod, &b.binding)?)))
            .collect()
    }

    /// The verdict for `pod`'s gate from every group that selects it: the health of
    /// those that hold it, and why the others cannot (`None` when no bound group
    /// selects it).
    pub(crate) async fn verdict(&self, pod: &PodFacts) -> Option<GateVerdict> {
        let groups = self.selecting(pod);
        if groups.is_empty() {
            return None;
        }
        let mut reads = Vec::with_capacity(groups.len());
        for (b, held) in &groups {
            reads.push(match held {
                Ok(_) => self.health(&b.group.arn).await,
                Err(_) => None,
            });
        }
        let names: Vec<String> = groups.iter().map(|(b, _)| b.group.group_name()).collect();
        let views: Vec<GroupView<'_>> = groups
            .iter()
            .zip(&reads)
            .zip(&names)
            .map(|(((_, held), read), name)| match held {
                Ok(target) => GroupView {
                    group: name,
                    target: Some(*target),
                    health: match read {
                        Some(h) => GroupHealth::Read(h.iter().find(|th| th.target == *target)),
                        None => GroupHealth::Unreadable,
                    },
                },
                Err(why) => GroupView {
                    group: name,
                    target: None,
                    health: GroupHealth::CannotHold(why),
                },
            })
            .collect();
        Some(verdict(&views))
    }

    /// Settles `pod`'s gate (see the module docs), recording an opened gate or a failed
    /// patch in `report`, and telling the sink how long an opened one took.
    pub(crate) async fn settle(&self, pod: &PodFacts, report: &mut GroupReport) -> Settled {
        if pod.gate.is_none() || pod.gate == Some(true) {
            return Settled::Unchanged;
        }
        let asked = Instant::now();
        let Some(v) = self.verdict(pod).await else {
            return Settled::Unchanged;
        };
        if !v.open
            && let Ok(mut waiting) = self.memory.waiting.lock()
        {
            waiting.retain(|_, at| at.elapsed() < WAITING_FOR);
            waiting.insert(pod.pod.uid.clone(), asked);
        }
        let Some((last, transition)) = self.claim(pod, &v) else {
            return Settled::Unchanged;
        };
        let name = pod.pod.to_string();
        let written = self
            .pods
            .set_gate(
                &pod.pod.namespace,
                &pod.pod.name,
                &pod.pod.uid,
                &v,
                transition,
            )
            .await;
        if written.is_err() {
            self.unclaim(&pod.pod.uid, last);
        }
        match written {
            Ok(()) if v.open => {
                if !report.gates_opened.contains(&name) {
                    report.gates_opened.push(name);
                }
                let since = self
                    .memory
                    .waiting
                    .lock()
                    .ok()
                    .and_then(|mut w| w.remove(&pod.pod.uid))
                    .unwrap_or(asked);
                self.sink.gate(
                    self.function,
                    self.cluster,
                    self.clock.now(),
                    since.elapsed(),
                );
                Settled::Opened
            }
            Ok(()) => Settled::Closed,
            Err(e) => {
                report.pod_errors.push(PodError {
                    pod: name,
                    error: e.to_string(),
                    unusable_address: None,
                });
                Settled::Failed
            }
        }
    }

    /// Claims the write of verdict `v` for `pod`'s gate: `None` when its condition
    /// already says so (as last written here, or as the pod shows); else what it said
    /// before (to restore if the write fails) and whether the status changes.
    fn claim(&self, pod: &PodFacts, v: &GateVerdict) -> Option<(Option<Said>, bool)> {
        let now = Instant::now();
        let mut said = self.memory.said.lock().ok()?;
        said.retain(|_, (at, _)| now.duration_since(*at) < SAID_FOR);
        let written = said.get(&pod.pod.uid).map(|(_, s)| s.clone());
        let shown = match (&written, &pod.gate_said) {
            (Some(s), _) => Some(s.clone()),
            (None, Some((reason, message))) => Some(Said {
                open: pod.gate == Some(true),
                reason: reason.clone(),
                message: message.clone(),
            }),
            (None, None) => None,
        };
        let next = Said {
            open: v.open,
            reason: v.reason.clone(),
            message: v.message.clone(),
        };
        let transition = match &shown {
            // An open gate is never closed again (see the module docs).
            Some(s) if s.open => return None,
            Some(s) if *s == next => return None,
            Some(s) => s.open != v.open,
            None => true,
        };
        said.insert(pod.pod.uid.clone(), (now, next));
        Some((written, transition))
    }

    /// Puts back what `uid`'s gate said before a write that failed.
    fn unclaim(&self, uid: &str, before: Option<Said>) {
        if let Ok(mut said) = self.memory.said.lock() {
            match before {
                Some(s) => {
                    said.insert(uid.to_owned(), (Instant::now(), s));
                }
                None => {
                    said.remove(uid);
                }
            }
        }
    }

    /// Settles the gates of the gated pods among `pods` that `bound` selects, after a
    /// health read of `bound`'s group (in hand, so remembered for the verdict).
    pub(crate) async fn settle_selected<'p>(
        &self,
        bound: &BoundGroup,
        pods: impl IntoIterator<Item = &'p PodFacts>,
        report: &mut GroupReport,
    ) {
        for pod in pods {
            if pod.gate == Some(false) && holding(pod, &bound.binding).is_some() {
                self.settle(pod, report).await;
            }
        }
    }
}
