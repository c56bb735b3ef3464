//! Discovery in a watching run: the first one binds the groups and enqueues the full
//! diff in its visit order (the groups looked at longest ago first); later ones, every
//! [`DISCOVERY_EVERY`], bind groups tagged while the run watches.

use super::*;

impl<P: PodSource, G: TargetGroupApi, S: StateStore> Run<'_, P, G, S> {
    /// Discovery, beside the watches: the bound groups replace the warm ones, and
    /// every one is enqueued for the full diff. Binding and run errors go into
    /// `report`. Returns the groups tagged for this cluster and the index as read (for
    /// the orphan report) and what discovery found (for the state table's index), or
    /// `None` when discovery failed.
    #[allow(clippy::type_complexity)]
    pub(super) async fn discover(
        &self,
        report: &mut Report,
    ) -> Option<(
        BTreeSet<String>,
        Option<BTreeSet<String>>,
        crate::reconcile::Bindings,
    )> {
        let engine = self.engine;
        let started = engine.core.clock.now();
        let priority = crate::groups::Priority::background();
        let Some(Found {
            bindings,
            tagged,
            indexed,
        }) = engine.discover_for_run(&priority, true, report).await
        else {
            *lock(&self.early) = None;
            self.read_wake.notify_one();
            self.compare_wake.notify_one();
            return None;
        };
        let bound = bindings.bound;
        let found = crate::reconcile::Bindings {
            bound: bound.clone(),
            errors: Vec::new(),
            accounts_failed: bindings.accounts_failed,
        };
        // The changes seen so far, for the groups the watch did not know when they came
        // (all of them in a cold container); later ones find the groups bound.
        let early = {
            let mut early = lock(&self.early);
            let known = engine.core.index.snapshot();
            engine.core.index.discovered(&bound, None);
            self.set_bound(&known, &bound);
            let now = engine.core.index.snapshot();
            early
                .take()
                .map(|e| e.marks(&now, &known))
                .unwrap_or_default()
        };
        self.read_wake.notify_one();
        self.compare_wake.notify_one();
        let (due, verification) = engine.core.rotation(&bound, started);
        report.verification = Some(verification);
        for e in &bindings.errors {
            engine.core.pass_done(e, false, None);
        }
        report.groups.extend(bindings.errors);
        let order = {
            let mut looked = lock(&engine.controller.looked);
            looked.runs += 1;
            let keep: HashSet<&str> = bound.iter().map(|b| b.group.arn.as_str()).collect();
            looked.at.retain(|arn, _| keep.contains(arn.as_str()));
            visit_order(
                bound.iter().map(|b| b.group.arn.as_str()),
                &looked.at,
                &Priority {
                    indexed: indexed.as_ref(),
                    due: &due,
                },
                &mut engine.core.jitter_rng(),
            )
        };
        let _ = self.ahead.set(crate::reconcile::ReadAhead::for_looks(
            order.iter().copied(),
            Some(&due),
            indexed.as_ref(),
            self.opts.use_checkpoint,
        ));
        {
            let mut verify = lock(&self.verify);
            verify.due = Some(due);
            verify.indexed = indexed.clone().map(Arc::new);
            verify.remaining = bound.iter().map(|b| b.group.arn.clone()).collect();
        }
        {
            let mut queue = lock(&self.engine.controller.queue);
            for arn in order {
                queue.request(arn, Want::verify());
            }
            for (arn, seen) in &early {
                queue.request(arn, Want::change(*seen));
            }
        }
        self.wake.notify_one();
        Some((tagged, indexed, found))
    }

    /// Discovery again, while the run watches: the index takes the bound groups found,
    /// the watch their namespaces, and a group bound since (or bound otherwise) gets a
    /// look of the full diff. A discovery that fails leaves the groups as they were.
    pub(super) async fn rediscover(&self) {
        let engine = self.engine;
        let bindings = match engine
            .core
            .bindings(&crate::groups::Priority::background())
            .await
        {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(error = %e, "discovering target groups again failed; the groups bound so far stay");
                return;
            }
        };
        for e in &bindings.errors {
            engine.core.pass_done(e, false, None);
        }
        let previous = engine.core.index.snapshot();
        engine.core.index.discovered(&bindings.bound, None);
        self.set_bound(&previous, &bindings.bound);
        {
            let mut queue = lock(&self.engine.controller.queue);
            let mut verify = lock(&self.verify);
            for b in &bindings.bound {
                let arn = &b.group.arn;
                if previous.get(arn).is_none_or(|p| p.binding != b.binding) {
                    verify.remaining.insert(arn.clone());
                    queue.request(arn, Want::verify());
                }
            }
        }
        self.wake.notify_one();
        engine.core.publish_bindings(&bindings).await;
    }

    /// Waits until the full diff has looked at every bound group.
    pub(super) async fn wait_full_diff(&self) {
        loop {
            let verified = self.verified.notified();
            let mut verified = std::pin::pin!(verified);
            verified.as_mut().enable();
            if lock(&self.verify).remaining.is_empty() {
                return;
            }
            verified.await;
        }
    }
}

/// What puts a group ahead of others looked at as long ago.
pub(super) struct Priority<'a> {
    /// This cluster's index: a group not in it is new (nothing registered here yet).
    pub(super) indexed: Option<&'a BTreeSet<String>>,
    /// Groups whose re-verification turn is this run's.
    pub(super) due: &'a HashSet<String>,
}

/// The order of a run's full diff: the groups this container looked at longest ago
/// first (never: first of all); among groups looked at as long ago, new ones, then the
/// rest, then the ones due for re-verification, shuffled. A group not due costs one
/// state read when it is at rest and holds a change when it is not, while a due one
/// waits for a paced Describe: behind 120 of them (the default budget of a run), a
/// just-bound group of a cold container waited a minute. A run that runs out of time is continued where it
/// stopped by the next run of a warm container, so a group waits at most until the
/// container has looked at every other group once (measured at 1,000 groups: a run at
/// Lambda's CPU share reaches fewer). A fresh container (no memory) starts in a shuffled
/// order, so what its short runs leave out differs from run to run.
pub(super) fn visit_order<'a>(
    bound: impl Iterator<Item = &'a str>,
    looked: &HashMap<String, u64>,
    priority: &Priority<'_>,
    rng: &mut fastrand::Rng,
) -> Vec<&'a str> {
    let mut order: Vec<&str> = bound.collect();
    rng.shuffle(&mut order);
    order.sort_by_cached_key(|arn| {
        let new = priority.indexed.is_some_and(|i| !i.contains(*arn));
        (
            looked.get(*arn).copied().unwrap_or(0),
            !new,
            priority.due.contains(*arn),
        )
    });
    order
}
