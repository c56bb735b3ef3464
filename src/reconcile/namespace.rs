//! One namespace at a time: take the leases of its groups, then one consistent pod LIST,
//! then reconcile each group from that list.
//!
//! The LIST comes *after* the leases so that a pod-events reconcile that finished just
//! before cannot be undone by pods this run read earlier; an event that arrives later
//! finds the lease held, sets `dirty`, and the group is reconciled again with a fresh list.

use std::sync::Arc;

use futures::future::join_all;
use tokio::sync::Semaphore;

use super::group::Prepared;
use super::{BoundGroup, Engine, RunOptions};
use crate::core::{PodIndex, Selector};
use crate::groups::TargetGroupApi;
use crate::pods::PodSource;
use crate::report::GroupReport;
use crate::state::StateStore;

impl<P: PodSource, G: TargetGroupApi, S: StateStore> Engine<P, G, S> {
    pub(super) async fn reconcile_namespace(
        &self,
        namespace: String,
        groups: Vec<BoundGroup>,
        opts: &RunOptions,
        permits: Arc<Semaphore>,
    ) -> Vec<GroupReport> {
        let prepared = join_all(groups.into_iter().map(|bound| {
            let permits = permits.clone();
            async move {
                let _permit = permits.acquire().await;
                self.prepare(bound, opts).await
            }
        }))
        .await;
        let mut reports = Vec::new();
        let mut held = Vec::new();
        for p in prepared {
            match p {
                Prepared::Done(report) => reports.push(report),
                Prepared::Held(h) => held.push(h),
            }
        }
        if held.is_empty() {
            return reports;
        }
        let selector = Selector::common(held.iter().map(|h| &h.bound.binding.selector));
        let listed = self.pods.list(&namespace, selector.as_ref()).await;
        if let Err(e) = &listed {
            tracing::error!(namespace = %namespace, error = %e, "pod list failed; groups in this namespace are left untouched");
        }
        let index = listed.as_ref().map(|pods| PodIndex::new(pods));
        let runs = held.into_iter().map(|h| {
            let permits = permits.clone();
            let first = index.as_ref().map_err(|e| *e);
            async move {
                let _permit = permits.acquire().await;
                self.run_held(h, first, opts).await
            }
        });
        reports.extend(join_all(runs).await);
        reports
    }
}
