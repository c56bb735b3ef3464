//! A cold container's first seconds: watches from the cluster's index rows before
//! discovery ends, the groups a change names read ahead of discovery, and first LISTs
//! compared with the indexed groups' ledgers (changes made while no container watched).

use super::*;

impl<P: PodSource, G: TargetGroupApi, S: StateStore> Run<'_, P, G, S> {
    /// A cold start: watches the namespaces recorded in this cluster's index (each with
    /// the selection its rows share) before discovery has read a single tag.
    pub(super) async fn watch_indexed(&self) {
        let rows = match self
            .engine
            .core
            .state
            .indexed_selections(&self.engine.core.cluster)
            .await
        {
            Ok(rows) => rows,
            Err(e) => {
                tracing::warn!(error = %e, "reading this cluster's index failed; the watch starts after discovery");
                return;
            }
        };
        // Rows of groups the last discovery found no longer bound are not watched.
        let rows: Vec<_> = rows.into_iter().filter(|r| r.bound).collect();
        if let Some(early) = lock(&self.early).as_mut() {
            early.index(&rows);
        }
        let mut namespaces: BTreeMap<String, Vec<Option<Selector>>> = BTreeMap::new();
        for row in rows {
            namespaces
                .entry(row.namespace)
                .or_default()
                .push(row.selector);
        }
        let selections = namespaces
            .into_iter()
            .map(|(ns, selectors)| {
                let common = if selectors.iter().all(Option::is_some) {
                    Selector::common(selectors.iter().flatten())
                } else {
                    None
                };
                (ns, common)
            })
            .collect();
        self.namespaces.send_replace(selections);
    }

    /// Until discovery is done, reads the groups pod changes named (`to_read`, 20 at a
    /// time) and binds those whose tags bind them in a watched namespace, each asking
    /// for a pass if a change kept so far can change it: a cold container's first
    /// changes are acted on without waiting for discovery's every page. Discovery's
    /// bindings replace these when it is done. A read that fails leaves its groups to
    /// discovery. (First LISTs are compared with the ledgers beside it:
    /// `compare_lists`.)
    pub(super) async fn read_ahead(&self) {
        let engine = self.engine;
        loop {
            let woken = self.read_wake.notified();
            let mut woken = std::pin::pin!(woken);
            woken.as_mut().enable();
            if lock(&self.early).is_none() {
                return;
            }
            let batch: Vec<String> = {
                let mut to_read = lock(&self.to_read);
                let n = to_read.len().min(crate::aws::elbv2::TAGS_BATCH);
                to_read.drain(..n).collect()
            };
            if batch.is_empty() {
                woken.await;
                continue;
            }
            let read_at = engine.core.clock.now();
            let batch = {
                let early = lock(&self.early);
                batch
                    .into_iter()
                    .map(|arn| {
                        let described = early.as_ref().and_then(|e| e.described(&arn)).cloned();
                        (arn, described)
                    })
                    .collect()
            };
            let (groups, undescribed) = match engine.core.read_groups(batch).await {
                Ok(read) => read,
                Err(e) => {
                    tracing::debug!(error = %e, "reading groups ahead of discovery failed; discovery binds them");
                    continue;
                }
            };
            let watched = self.namespaces.borrow().clone();
            let mut found: BTreeMap<String, BoundGroup> = groups
                .into_iter()
                .filter_map(|g| engine.core.bind(g, read_at)?.ok())
                .filter(|b| early::watched(&watched, &b.binding))
                .map(|b| (b.group.arn.clone(), b))
                .collect();
            let marks = {
                let early = lock(&self.early);
                let Some(early) = early.as_ref() else {
                    return;
                };
                found.retain(|arn, _| !engine.core.index.contains(arn));
                engine.core.index.bound_ahead(found.values().cloned());
                early.marks(&found, &BTreeMap::new())
            };
            self.ask_changes(marks.iter().map(|(arn, seen)| (arn.as_str(), *seen)));
            // Rows of the earlier layout learn their groups' names and facts, so the
            // next cold container reads these groups with DescribeTags alone.
            for b in found
                .values()
                .filter(|b| undescribed.contains(&b.group.arn))
            {
                let recorded = engine.core.record_bound(b).await;
                if let Err(e) = recorded {
                    tracing::debug!(target_group = %b.group.arn, error = %e, "recording the group's facts in this cluster's index failed; the next cold start describes it again");
                }
            }
        }
    }

    /// Until discovery is done, compares each namespace's first LIST with its groups'
    /// ledgers, beside [`Self::read_ahead`]: a comparison (a BatchGetItem of up to 100
    /// ledgers, ~1.2 MB at 100 targets each, then matching them with the LIST) never
    /// holds up the read-ahead of a change the watch saw. (Taking turns with it, the
    /// comparisons of 10 namespaces held a fresh container's watched changes until
    /// discovery ended at 1,000 groups × 100 pods.)
    pub(super) async fn compare_lists(&self) {
        loop {
            let woken = self.compare_wake.notified();
            let mut woken = std::pin::pin!(woken);
            woken.as_mut().enable();
            if lock(&self.early).is_none() {
                return;
            }
            // The oldest LIST first: its namespace has gone longest without a look.
            let first = lock(&self.to_compare).pop_front();
            match first {
                Some(first) => self.compare_first_list(&first).await,
                None => woken.await,
            }
        }
    }

    /// Compares a cold container's first LIST of a namespace with the ledgers of the
    /// groups its index names there (read in batches; no ELBv2 call), and names those
    /// out of step to be read ahead of discovery, as a change its watch saw would: a
    /// pod that changed while no container watched is then acted on without waiting
    /// for the full diff. A group already bound is asked for at once. A read that
    /// fails leaves the namespace to the full diff.
    pub(super) async fn compare_first_list(&self, first: &FirstList) {
        let engine = self.engine;
        for from in (0..).step_by(COMPARE_BATCH) {
            // Looked up batch by batch: `early`'s lock is not held across the reads.
            let chunk = match lock(&self.early).as_ref() {
                Some(early) => early.indexed(&first.namespace, from, COMPARE_BATCH),
                None => return,
            };
            if chunk.is_empty() {
                return;
            }
            let arns: Vec<String> = chunk.iter().map(|(arn, ..)| arn.clone()).collect();
            let states = match engine.core.state.load_many(&arns).await {
                Ok(states) => states,
                Err(e) => {
                    tracing::debug!(namespace = %first.namespace, error = %e, "reading ledgers to compare with a first LIST failed; the full diff compares them");
                    return;
                }
            };
            let ledgers: HashMap<&str, &crate::state::GroupState> =
                states.iter().map(|(arn, s)| (arn.as_str(), s)).collect();
            // In place, under the store's lock: a namespace may hold tens of thousands.
            let stepped = engine
                .controller
                .informer
                .with_pods(&first.namespace, |pods| {
                    let listed = early::ListedPods::new(&first.namespace, pods.values());
                    chunk
                        .iter()
                        .filter(|(arn, selector, family)| {
                            ledgers.get(arn.as_str()).is_some_and(|s| {
                                let ledger = &s.ledger;
                                early::out_of_step(
                                    selector,
                                    *family,
                                    &listed,
                                    ledger,
                                    &engine.core.cluster,
                                )
                            })
                        })
                        .map(|(arn, ..)| arn.clone())
                        .collect::<Vec<_>>()
                });
            let Some(stepped) = stepped.filter(|s| !s.is_empty()) else {
                continue;
            };
            tracing::debug!(namespace = %first.namespace, groups = stepped.len(), "a first LIST differs from these groups' ledgers; reading them ahead of discovery");
            let bound: Vec<String> = stepped
                .iter()
                .filter(|arn| engine.core.index.contains(arn))
                .cloned()
                .collect();
            let named = {
                let mut early = lock(&self.early);
                let Some(early) = early.as_mut() else {
                    return;
                };
                early.suspect(stepped, first.seen)
            };
            lock(&self.to_read).extend(named);
            self.read_wake.notify_one();
            self.ask_changes(bound.iter().map(|arn| (arn.as_str(), first.seen)));
        }
    }

    /// Asks for a change pass of each group, with when its change was seen, and tells
    /// its verification in flight (which the change waits for) to stand down or hurry.
    pub(super) fn ask_changes<'a>(
        &self,
        changes: impl Iterator<Item = (&'a str, UnixMillis)> + Clone,
    ) {
        if changes.clone().next().is_none() {
            return;
        }
        {
            let mut queue = lock(&self.engine.controller.queue);
            for (arn, seen) in changes.clone() {
                queue.request(arn, Want::change(seen));
            }
        }
        {
            let promotions = lock(&self.promotions);
            for p in changes.filter_map(|(arn, _)| promotions.get(arn)) {
                p.change_arrived();
            }
        }
        self.wake.notify_one();
    }
}
