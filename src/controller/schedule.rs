//! The watching run: one scheduled invocation's controller (watches, the full diff and
//! every pod change, until the run's time is up), and one job of its runner (a group's
//! pass, its gates, what it reports).

use super::*;

impl<P: PodSource, G: TargetGroupApi, S: StateStore> Engine<P, G, S> {
    /// The scheduled resync as a controller (see the module docs): watches, the full
    /// diff of every bound group, and every pod change acted on, until `until`; passes
    /// still running then finish (or are cut cleanly and ask for another pass).
    pub async fn run_scheduled(&self, opts: &RunOptions, until: UnixMillis) -> Report {
        let started = self.core.clock.now();
        let real_until =
            tokio::time::Instant::now() + Duration::from_millis(until.0.saturating_sub(started.0));
        let mut report = Report::new("resync", &self.core.cluster, false, started);
        let pressure = self.core.groups.pressure();
        self.controller.informer.suspend();
        let drain_end = until.plus(DRAIN);
        let run = Run {
            engine: self,
            opts: RunOptions {
                dry_run: false,
                force: false,
                only: None,
                deadline: opts.deadline,
                priority: Priority::Reaction,
                use_checkpoint: true,
                cut_at: Some(match opts.deadline {
                    Some(d) if d > started => drain_end.min(UnixMillis(d.0.saturating_sub(3_000))),
                    _ => drain_end,
                }),
            },
            wake: tokio::sync::Notify::new(),
            namespaces: tokio::sync::watch::Sender::new(BTreeMap::new()),
            early: Mutex::new(Some(Early::default())),
            to_read: Mutex::new(Vec::new()),
            to_compare: Mutex::default(),
            read_wake: tokio::sync::Notify::new(),
            compare_wake: tokio::sync::Notify::new(),
            verify: Mutex::new(Verify::default()),
            verified: tokio::sync::Notify::new(),
            ahead: std::sync::OnceLock::new(),
            promotions: Mutex::new(HashMap::new()),
            out: Mutex::new(Outcomes::default()),
        };
        // Watch first: the namespaces known now, before discovery.
        // A warm container knows its last discovery's groups: the next invocation
        // watches their namespaces and reacts for them from its first second.
        if self.core.index.is_discovered() {
            run.set_bound(&Snapshot::default(), &self.core.index.all());
        } else {
            run.watch_indexed().await;
        }
        // The pod changes earlier runs handed on go first.
        run.take_handed_on().await;
        let full_diff = async {
            let outcome = run.discover(&mut report).await;
            if let Some((tagged, indexed, found)) = outcome {
                // The state table's index follows the discovery while the full diff runs.
                futures::join!(run.wait_full_diff(), self.core.publish_bindings(&found));
                self.report_orphans(&tagged, indexed.as_ref(), false, &mut report)
                    .await;
            }
            // A group tagged while the run watches is bound within a discovery interval.
            loop {
                tokio::time::sleep(DISCOVERY_EVERY).await;
                run.rediscover().await;
            }
        };
        // Boxed: the full diff, watches and passes make a large future (28 KB in a debug
        // build), which would otherwise sit on the caller's stack.
        let background = Box::pin(async {
            futures::join!(
                full_diff,
                run.reflectors(),
                run.read_ahead(),
                run.compare_lists()
            );
        });
        // The one exit: the runner ends the invocation (at `until`, after draining);
        // the watches, discovery and gate polls end with it.
        let runner = runner::Runner::new(self, &self.controller.queue, &run.wake);
        let running = Box::pin(runner.run(runner::Ending::At(real_until), |arn, want| {
            run.job(arn, want)
        }));
        let unserved = tokio::select! {
            unserved = running => unserved,
            () = background => runner::Unserved::default(),
        };
        // The warm container keeps the reactions it could not serve for its next
        // invocation (they are handed on too, should another container run it).
        lock(&self.controller.queue).keep_reactions();
        let Outcomes {
            full,
            mut watch,
            reactions: _,
        } = run.out.into_inner().unwrap_or_else(|p| p.into_inner());
        watch.watched_ms = self.core.clock.now().0.saturating_sub(started.0);
        watch.namespaces = run.namespaces.borrow().len();
        watch.stored_pods = self.controller.informer.pods_held() as u64;
        report.groups.extend(full.into_values());
        report.elb = pressure.since(self.core.groups.pressure());
        // Groups the full diff did not reach before the end: the next run does them.
        let verify = run.verify.into_inner().unwrap_or_else(|p| p.into_inner());
        let bound = self.core.index.snapshot();
        report
            .groups
            .extend(verify.remaining.iter().filter_map(|arn| {
                let b = bound.get(arn)?;
                Some(GroupReport::with_error(
                    arn,
                    &b.group.group_name(),
                    Outcome::Deferred,
                    crate::reconcile::DEFERRED,
                ))
            }));
        unserved.record(&mut report);
        report.watch = Some(watch);
        report.finish(self.core.clock.now())
    }
}

impl<P: PodSource, G: TargetGroupApi, S: StateStore> Run<'_, P, G, S> {
    /// Watches the namespaces of `bound` (the index's groups now), and forgets the
    /// requests of the groups of `previous` no longer among them.
    pub(super) fn set_bound(&self, previous: &Snapshot, bound: &[BoundGroup]) {
        let by_arn: BTreeSet<&str> = bound.iter().map(|b| b.group.arn.as_str()).collect();
        let selections: BTreeMap<String, Option<Selector>> = crate::index::by_namespace(bound)
            .into_iter()
            .map(|(ns, namespace)| (ns.to_owned(), namespace.selector))
            .collect();
        {
            let mut queue = lock(&self.engine.controller.queue);
            for arn in previous.keys() {
                if !by_arn.contains(arn.as_str()) {
                    queue.forget(arn);
                }
            }
        }
        self.engine
            .controller
            .informer
            .retain(|ns| selections.contains_key(ns));
        self.namespaces.send_replace(selections);
    }

    /// Asks for the passes of the groups whose pod changes an earlier run (of this
    /// container or another) handed on, before anything else: a group this container
    /// knows bound at once, any other once it is bound (read ahead of discovery, as a
    /// group a first LIST shows out of step is). Their `dirty` flags stay set until a
    /// pass serves them; a read that fails leaves them to those flags.
    pub(super) async fn take_handed_on(&self) {
        let engine = self.engine;
        let requested: Vec<String> = match engine.core.state.index_meta(&engine.core.cluster).await
        {
            Ok(meta) => meta.requested.into_iter().collect(),
            Err(e) => {
                tracing::debug!(error = %e, "reading the requests earlier runs handed on failed; their groups' dirty flags stay set");
                return;
            }
        };
        if requested.is_empty() {
            return;
        }
        let seen = engine.core.clock.now();
        let (bound, unknown): (Vec<&String>, Vec<&String>) = requested
            .iter()
            .partition(|arn| engine.core.index.contains(arn));
        tracing::info!(
            groups = requested.len(),
            "serving first the pod changes earlier runs handed on"
        );
        if !unknown.is_empty() {
            let named = match lock(&self.early).as_mut() {
                Some(early) => early.suspect(unknown.into_iter().cloned().collect(), seen),
                None => Vec::new(),
            };
            lock(&self.to_read).extend(named);
            self.read_wake.notify_one();
        }
        self.ask_changes(bound.iter().map(|arn| (arn.as_str(), seen)));
        if let Err(e) = engine
            .core
            .state
            .take_requests(&engine.core.cluster, &requested)
            .await
        {
            tracing::debug!(error = %e, "taking the handed-on requests failed; the next run asks for them again");
        }
    }

    /// One key's pass: observe the group from the store's pods, and under its lease
    /// change what must change. Returns what should happen next (the queue decides
    /// when).
    pub(super) async fn job(&self, arn: String, want: Want) -> (String, Want, Reconciled) {
        let Some(bound) = self.engine.core.index.get(&arn) else {
            self.finished(&arn, want, None, &Ok(Action::Done));
            return (arn, want, Ok(Action::Done));
        };
        if want.gates_only() {
            let action = self.settle_waiting_gates(&bound).await;
            return (arn, want, Ok(action));
        }
        let (report, result) = if want.verify && !want.changed {
            let promotion = crate::groups::Promotion::default();
            lock(&self.promotions).insert(arn.clone(), promotion.clone());
            let priority = Priority::Background(promotion.clone());
            // Boxed, here and below: a pass's state is large (its AWS calls), and a job
            // holds one of the two.
            let looked = crate::groups::until_stood_down(
                promotion,
                Box::pin(self.pass(&bound, want, priority)),
            )
            .await;
            lock(&self.promotions).remove(&arn);
            match looked {
                Some(report) => report,
                // A pod change arrived before it read anything: the change's pass, asked
                // for, now also does the full diff's look (one health read, not two).
                None => return (arn, want, Err(PassError::Yielded)),
            }
        } else {
            Box::pin(self.pass(&bound, want, Priority::Reaction)).await
        };
        self.finished(&arn, want, report, &result);
        // A gated pod it selects waits for its target to turn healthy: its gate is
        // looked at again soon.
        let result = match result {
            Ok(Action::Done) if self.gate_pending(&bound) => Ok(Action::GatesPending),
            other => other,
        };
        (arn, want, result)
    }

    /// Settles the gates of `bound`'s pods waiting on theirs (see `reconcile::gates`:
    /// open once the target is healthy in every group that selects the pod; closed with
    /// ELBv2's reason meanwhile). No lease: the patch carries the pod's UID, and a gate
    /// changes no target. Gates still waiting are looked at again soon.
    pub(super) async fn settle_waiting_gates(&self, bound: &BoundGroup) -> Action {
        let engine = self.engine;
        let waiting: Vec<crate::core::PodFacts> = engine
            .controller
            .informer
            .view(&bound.binding)
            .map(|(pods, _)| pods)
            .unwrap_or_default()
            .into_iter()
            .filter(|p| matches!(contribution(p, &bound.binding), Some((_, Some(false)))))
            .collect();
        let arn = &bound.group.arn;
        let mut still = false;
        for pod in waiting {
            let mut r = GroupReport::new(arn, &bound.group.group_name(), Outcome::InSync);
            match engine.core.gates().settle(&pod, &mut r).await {
                crate::reconcile::Settled::Opened => lock(&self.out)
                    .watch
                    .gates_opened
                    .append(&mut r.gates_opened),
                crate::reconcile::Settled::Failed => lock(&self.out).watch.changes.push(r),
                crate::reconcile::Settled::Closed | crate::reconcile::Settled::Unchanged => {
                    still = true;
                }
            }
        }
        if still {
            Action::GatesPending
        } else {
            Action::Done
        }
    }

    /// Observe, and if something is to change, the leased pass, its reads at
    /// `priority`; what should happen next.
    pub(super) async fn pass(
        &self,
        bound: &BoundGroup,
        want: Want,
        priority: Priority,
    ) -> (Option<GroupReport>, Reconciled) {
        let engine = self.engine;
        let (due, indexed) = {
            let verify = lock(&self.verify);
            let due = if want.changed {
                None
            } else {
                verify.due.as_ref().map(|d| {
                    let mut one = HashSet::new();
                    if d.contains(&bound.group.arn) {
                        one.insert(bound.group.arn.clone());
                    }
                    one
                })
            };
            (due, verify.indexed.clone())
        };
        let opts = RunOptions {
            use_checkpoint: !want.changed,
            priority,
            ..self.opts.clone()
        };
        let scope = crate::reconcile::Scope {
            due: due.as_ref(),
            indexed: indexed.as_deref(),
            // A pod change's pass reads its group's state alone, now.
            ahead: self.ahead.get().filter(|_| !want.changed),
            ..Default::default()
        };
        let pods = Pods::Store(&engine.controller.informer);
        engine.look_and_pass(bound, &opts, &scope, pods).await
    }

    /// Records a finished pass, which ended with `result`: the full diff's result, the
    /// watch's counts, the gates it leaves waiting.
    pub(super) fn finished(
        &self,
        arn: &str,
        want: Want,
        report: Option<GroupReport>,
        result: &Reconciled,
    ) {
        if let Some(r) = &report {
            let reaction = want
                .since
                .zip(r.applied_at)
                .map(|(since, applied)| Duration::from_millis(applied.0.saturating_sub(since.0)));
            self.engine.core.pass_done(r, false, reaction);
            let mut out = lock(&self.out);
            if want.changed {
                out.watch.passes += 1;
                out.watch.registered += r.registered.len();
                out.watch.deregistered += r.deregistered.len();
                out.watch
                    .gates_opened
                    .extend(r.gates_opened.iter().cloned());
                if let Some(reaction) = reaction {
                    out.reactions
                        .push(u64::try_from(reaction.as_millis()).unwrap_or(u64::MAX));
                }
                if r.is_eventful() || !r.gates_opened.is_empty() {
                    out.watch.changes.push(r.clone());
                }
            }
            if want.verify {
                out.full.insert(arn.to_owned(), r.clone());
            }
        }
        // A pass deferred or cut before it finished (it asks to run again) did not look:
        // its group stays at the front for the next full diff.
        let looked_at = !matches!(
            result,
            Err(PassError::Cut | PassError::Deferred | PassError::Yielded)
        );
        if want.verify {
            if looked_at {
                let mut looked = lock(&self.engine.controller.looked);
                let run = looked.runs;
                looked.at.insert(arn.to_owned(), run);
            }
            if lock(&self.verify).remaining.remove(arn) {
                self.verified.notify_waiters();
            }
        }
    }

    /// Whether a gated pod of `b` waits for its gate (as the store has the pods).
    pub(super) fn gate_pending(&self, b: &BoundGroup) -> bool {
        self.engine
            .controller
            .informer
            .view(&b.binding)
            .is_some_and(|(pods, _)| {
                pods.iter()
                    .any(|p| matches!(contribution(p, &b.binding), Some((_, Some(false)))))
            })
    }
}
