//! One-shot runs: one pass over what a run was asked for, through the same queue and
//! runner as the watching run, then the end — a manual run (dry run, resync, release),
//! a scheduled run without watch mode, a pod event's groups.
//!
//! Pods come from one consistent LIST per namespace, shared by its groups' looks (their
//! common selection, read when the namespace's first group is looked at and dropped
//! after its last); a group with something to change takes its lease and lists its pods
//! afresh (see `reconcile::leased`). A request parked on a lease another process holds
//! is served when the lease is given back, while the run's `lease_wait` allows; a gate
//! a pod event waits for is looked at every second while the invocation allows. What a
//! one-shot run leaves (a backoff, a retry) is the next run's. A release waits for a held
//! lease (and retries a failed take) while the invocation lasts; a group it could not
//! release is a failure.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;

use tokio::time::Instant;

use super::Engine;
use super::found::Found;
use super::look::{Pods, Snapshots};
use super::queue::{Queue, Want};
use super::runner::{Ending, Runner, Unserved, within};
use crate::core::{PodFacts, contribution};
use crate::groups::{Priority, TargetGroupApi};
use crate::pods::PodSource;
use crate::reconcile::{
    Action, Bindings, BoundGroup, DEFERRED, PassError, ReadAhead, Reconciled, RunOptions,
    START_CUTOFF, Scope, Settled, unreleased,
};
use crate::report::{GroupReport, Outcome, Report};
use crate::state::StateStore;
use crate::sync::lock;

/// A one-shot run's groups: their bindings and the reports of their last passes, in the
/// order they were asked for.
struct Results {
    order: Vec<String>,
    reports: Mutex<HashMap<String, GroupReport>>,
}

impl Results {
    /// Keeps `report` as the group's, with the gates earlier passes of this run opened.
    fn keep(&self, mut report: GroupReport) {
        let mut reports = lock(&self.reports);
        if let Some(earlier) = reports.get(&report.target_group_arn) {
            for opened in &earlier.gates_opened {
                if !report.gates_opened.contains(opened) {
                    report.gates_opened.push(opened.clone());
                }
            }
        }
        reports.insert(report.target_group_arn.clone(), report);
    }

    fn into_reports(self) -> Vec<GroupReport> {
        let mut reports = self
            .reports
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.order
            .iter()
            .filter_map(|arn| reports.remove(arn))
            .collect()
    }
}

impl<P: PodSource, G: TargetGroupApi, S: StateStore> Engine<P, G, S> {
    /// One pass over every bound group (or the requested ones), from fresh LISTs, and
    /// the end: a manual run, or a scheduled one without watch mode. (With watch mode
    /// the schedule runs the controller: [`Engine::run_scheduled`].)
    pub async fn resync(&self, opts: &RunOptions) -> Report {
        let started = self.core.clock.now();
        let mut report = Report::new("resync", &self.core.cluster, opts.dry_run, started);
        let Some(Found {
            bindings,
            tagged,
            indexed,
        }) = self
            .discover_for_run(&Priority::Reaction, opts.only.is_none(), &mut report)
            .await
        else {
            return report.finish(self.core.clock.now());
        };
        self.core.index.discovered(&bindings.bound, None);
        // Recorded in the state table once the groups have had their pass.
        let publish = (!opts.dry_run).then(|| Bindings {
            bound: bindings.bound.clone(),
            errors: Vec::new(),
            accounts_failed: bindings.accounts_failed.clone(),
        });
        let Bindings {
            mut bound,
            mut errors,
            accounts_failed,
        } = bindings;
        // A full resync also looks for ledgers of groups no longer bound (orphans).
        if let Some(only) = &opts.only {
            for arn in only {
                let known = bound.iter().any(|b| &b.group.arn == arn)
                    || errors.iter().any(|e| &e.target_group_arn == arn);
                // A group of an account that could not be read is covered by that
                // account's error.
                let unread = accounts_failed.iter().any(|f| {
                    f.account.is_some()
                        && f.account.as_deref() == crate::core::arn::arn_account(arn)
                });
                if !known && !unread {
                    report.errors.push(format!(
                        "target group {arn} was requested but is not bound to cluster `{}` (missing, or its tgsync/cluster tag does not name this cluster)",
                        self.core.cluster
                    ));
                }
            }
            bound.retain(|b| only.contains(&b.group.arn));
            errors.retain(|e| only.contains(&e.target_group_arn));
        }
        let mut due = None;
        if opts.use_checkpoint {
            let (in_turn, verification) = self.core.rotation(&bound, started);
            due = Some(in_turn);
            report.verification = Some(verification);
        }
        for e in &errors {
            self.core.pass_done(e, opts.dry_run, None);
        }
        report.groups.append(&mut errors);
        let scope = Scope {
            due: due.as_ref(),
            indexed: indexed.as_ref(),
            ..Scope::default()
        };
        let pressure = self.core.groups.pressure();
        let (groups, unserved) = self.one_pass(bound, opts, &scope, None).await;
        report.groups.extend(groups);
        unserved.record(&mut report);
        report.elb = pressure.since(self.core.groups.pressure());
        if let Some(found) = &publish {
            self.core.publish_bindings(found).await;
        }
        self.report_orphans(&tagged, indexed.as_ref(), opts.dry_run, &mut report)
            .await;
        report.finish(self.core.clock.now())
    }

    /// Reconciles the given bound groups: one consistent pod LIST per namespace to look
    /// at them, and the leases (and a fresh LIST) only for the groups with something to
    /// change.
    pub async fn reconcile_groups(
        &self,
        bound: Vec<BoundGroup>,
        opts: &RunOptions,
    ) -> Vec<GroupReport> {
        // Each pass reads its group's binding from the index (see `one_pass`).
        self.core.index.bound_ahead(bound.iter().cloned());
        self.one_pass(bound, opts, &Scope::default(), None).await.0
    }

    /// Releases the groups `arns` (see `reconcile::release`); with `opts.dry_run`,
    /// reports the plan of each and changes nothing.
    pub async fn release(&self, arns: &[String], opts: &RunOptions) -> Report {
        let started = self.core.clock.now();
        let mut report = Report::new("resync", &self.core.cluster, opts.dry_run, started);
        let arns: BTreeSet<&String> = arns.iter().collect();
        let results = Results {
            order: arns.iter().map(|a| (*a).clone()).collect(),
            reports: Mutex::default(),
        };
        let notes: Mutex<BTreeMap<String, String>> = Mutex::default();
        let queue = Mutex::new(Queue::default());
        for arn in &arns {
            lock(&queue).request(arn, Want::verify());
        }
        let wake = tokio::sync::Notify::new();
        Runner::new(self, &queue, &wake)
            .run(self.release_ending(opts), |arn, want| {
                let (results, notes) = (&results, &notes);
                async move {
                    let (group, note, result) = self.core.release_group(&arn, opts).await;
                    self.core.pass_done(&group, opts.dry_run, None);
                    results.keep(group);
                    if let Some(note) = note {
                        lock(notes).insert(arn.clone(), note);
                    }
                    (arn, want, result)
                }
            })
            .await;
        report.groups = results.into_reports();
        // What the invocation could not serve released nothing: a failure.
        report.groups.iter_mut().for_each(unreleased);
        report.notes.extend(
            notes
                .into_inner()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .into_values(),
        );
        report.finish(self.core.clock.now())
    }

    /// How a release ends: once each named group is released or failed for good, or
    /// when the invocation must stop starting passes ([`START_CUTOFF`] before its
    /// deadline) — a group whose lease another process holds is waited for until then
    /// (the holder may give it back any time), and a failed lease take is tried again.
    /// Without a deadline, a held lease is waited for `lease_wait`.
    fn release_ending(&self, opts: &RunOptions) -> Ending {
        let left = self
            .time_to_start(opts)
            .unwrap_or_else(|| self.core.settings.lease_wait.unwrap_or_default());
        Ending::Drain {
            until: Instant::now() + left,
        }
    }

    /// How long a one-shot run may still start passes: until [`START_CUTOFF`] before
    /// its deadline; `None` without one (a deadline not in the future is not a real one:
    /// `cargo lambda watch` sends a duration there).
    fn time_to_start(&self, opts: &RunOptions) -> Option<std::time::Duration> {
        let now = self.core.clock.now();
        opts.deadline
            .filter(|d| *d > now)
            .map(|d| std::time::Duration::from_millis(d.0 - now.0).saturating_sub(START_CUTOFF))
    }

    /// How a one-shot run ends: once nothing is left, keeping requests parked on a
    /// lease another process holds for `lease_wait`, and (with `gates`) a pod's gate
    /// looked at for as long as the invocation allows — always [`START_CUTOFF`] before
    /// its deadline.
    pub(crate) fn one_shot_ending(&self, opts: &RunOptions, gates: bool) -> Ending {
        let left = self.time_to_start(opts);
        let by_deadline = within(left);
        let leases = within(
            self.core
                .settings
                .lease_wait
                .or(Some(std::time::Duration::ZERO)),
        )
        .min(by_deadline);
        let gates = if gates && left.is_some() {
            by_deadline
        } else {
            Instant::now()
        };
        Ending::Idle { leases, gates }
    }

    /// One pass over `bound` through a one-shot run (see the module docs): the groups in
    /// a shuffled order, namespace by namespace (a run that runs out of time does not
    /// leave the same groups every time), each looked at from its namespace's LIST under
    /// `scope`. With `gated`, the pod event's gated pod: its gate is looked at again
    /// while it waits, for as long as the invocation allows. Returns the groups'
    /// reports and what the run could not serve (handed on, or not; see [`Ending`]).
    pub(crate) async fn one_pass(
        &self,
        bound: Vec<BoundGroup>,
        opts: &RunOptions,
        scope: &Scope<'_>,
        gated: Option<&PodFacts>,
    ) -> (Vec<GroupReport>, Unserved) {
        let mut rng = self.core.jitter_rng();
        let mut by_namespace: Vec<Vec<BoundGroup>> = crate::index::by_namespace(&bound)
            .into_values()
            .map(|namespace| namespace.groups.into_iter().cloned().collect())
            .collect();
        drop(bound);
        rng.shuffle(&mut by_namespace);
        for groups in &mut by_namespace {
            rng.shuffle(groups);
        }
        let order: Vec<BoundGroup> = by_namespace.into_iter().flatten().collect();
        let snapshots = Snapshots::new(&order);
        // A resync reads its groups' states ahead in batches, in the order their looks
        // start; a pod event's few groups each read theirs.
        let ahead =
            (scope.focus.is_none() && scope.ahead.is_none() && !opts.dry_run && order.len() > 1)
                .then(|| {
                    ReadAhead::for_looks(
                        order.iter().map(|b| b.group.arn.as_str()),
                        scope.due,
                        scope.indexed,
                        opts.use_checkpoint,
                    )
                });
        let scope = &Scope {
            due: scope.due,
            focus: scope.focus,
            indexed: scope.indexed,
            ahead: ahead.as_ref().or(scope.ahead),
        };
        let queue = Mutex::new(Queue::default());
        for b in &order {
            lock(&queue).request(&b.group.arn, Want::verify());
        }
        let results = Results {
            order: order.iter().map(|b| b.group.arn.clone()).collect(),
            reports: Mutex::default(),
        };
        drop(order);
        let wake = tokio::sync::Notify::new();
        let gates = gated.is_some() && !opts.dry_run;
        let runner = Runner::new(self, &queue, &wake);
        let unserved = Box::pin(runner.run(self.one_shot_ending(opts, gates), |arn, want| {
            let (snapshots, results) = (&snapshots, &results);
            async move {
                // The binding as the container's index has it now: a group unbound, or
                // re-read, since the run began is acted on as it is now. (An unbound
                // group's namespace LIST, if other groups share it, is kept until the run
                // ends.)
                let Some(bound) = self.core.index.get(&arn) else {
                    results.keep(GroupReport::with_error(
                        &arn,
                        crate::core::arn::arn_name(&arn),
                        Outcome::BindingError,
                        format!(
                            "no longer bound to cluster `{}` (untagged, deleted or bound to other pods since the run began); left untouched",
                            self.core.cluster
                        ),
                    ));
                    return (arn, want, Ok(Action::Done));
                };
                let bound = &bound;
                // The pod event's gated pod, if this group selects it and its gate
                // waits for its target to turn healthy.
                let waiting = gated.filter(|p| {
                    gates && matches!(contribution(p, &bound.binding), Some((_, Some(false))))
                });
                let result = match waiting {
                    Some(pod) if want.gates_only() => {
                        match self.look_at_gate(bound, pod, results).await {
                            Settled::Closed | Settled::Unchanged => Ok(Action::GatesPending),
                            Settled::Opened | Settled::Failed => Ok(Action::Done),
                        }
                    }
                    _ if want.gates_only() => Ok(Action::Done),
                    _ => match self.look(bound, opts, scope, snapshots, results).await {
                        Ok(Action::Done) if waiting.is_some_and(|p| !opened(p, results)) => {
                            Ok(Action::GatesPending)
                        }
                        other => other,
                    },
                };
                (arn, want, result)
            }
        }))
        .await;
        (results.into_reports(), unserved)
    }

    /// One group's look and, if something is to change, its leased pass; the report is
    /// kept in `results`.
    async fn look(
        &self,
        bound: &BoundGroup,
        opts: &RunOptions,
        scope: &Scope<'_>,
        snapshots: &Snapshots,
        results: &Results,
    ) -> Reconciled {
        let namespace = &bound.binding.namespace;
        if self.core.past_start_deadline(opts) {
            snapshots.done(namespace);
            let deferred = GroupReport::with_error(
                &bound.group.arn,
                &bound.group.group_name(),
                Outcome::Deferred,
                DEFERRED,
            );
            self.core.pass_done(&deferred, opts.dry_run, None);
            results.keep(deferred);
            return Err(PassError::Deferred);
        }
        // A pod event's pass plans from the look's LIST when nothing was written since;
        // a resync's lists afresh.
        let pods = Pods::Snapshots {
            snapshots,
            keep: scope.focus.is_some(),
        };
        let (report, result) = self.look_and_pass(bound, opts, scope, pods).await;
        if let Some(report) = report {
            self.core.pass_done(&report, opts.dry_run, None);
            results.keep(report);
        }
        result
    }

    /// Another look at the gate of the pod event's gated `pod`, which `bound` selects.
    async fn look_at_gate(&self, bound: &BoundGroup, pod: &PodFacts, results: &Results) -> Settled {
        let mut report = lock(&results.reports)
            .get(&bound.group.arn)
            .cloned()
            .unwrap_or_else(|| {
                GroupReport::new(&bound.group.arn, &bound.group.group_name(), Outcome::InSync)
            });
        let settled = self.core.gates().settle(pod, &mut report).await;
        results.keep(report);
        settled
    }
}

/// Whether a pass of this run opened `pod`'s gate.
fn opened(pod: &PodFacts, results: &Results) -> bool {
    let name = pod.pod.to_string();
    lock(&results.reports)
        .values()
        .any(|r| r.gates_opened.contains(&name))
}
