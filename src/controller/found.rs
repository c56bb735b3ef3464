//! What a run's discovery found, and what the run owes it at its end — the same for the
//! watching run and a one-shot resync: account failures in the report, the groups
//! tagged for this cluster and the cluster's index as read (for the orphan report), and,
//! once the passes are done, the orphan report itself.

use std::collections::BTreeSet;

use super::Engine;
use crate::groups::{Priority, TargetGroupApi};
use crate::pods::PodSource;
use crate::reconcile::Bindings;
use crate::report::Report;
use crate::state::StateStore;

/// One discovery, as a run uses it.
pub(super) struct Found {
    /// Valid bindings, binding errors, and the accounts that could not be read.
    pub bindings: Bindings,
    /// Every group tagged for this cluster, bound or in error.
    pub tagged: BTreeSet<String>,
    /// The cluster's index of bound groups as read for the orphan report (`None`: not
    /// read, or not to be trusted because an unnamed account could not be read).
    pub indexed: Option<BTreeSet<String>>,
}

impl<P: PodSource, G: TargetGroupApi, S: StateStore> Engine<P, G, S> {
    /// Discovers every group at `priority` for a run: each account that could not be
    /// read is a run error in `report`, and with `orphans` the cluster's index is read
    /// for the orphan report (a group of an account whose discovery failed is not known
    /// to be unbound: it is left out, or the whole look when the account is not known).
    /// `None`, with the error in `report`, when discovery failed.
    pub(super) async fn discover_for_run(
        &self,
        priority: &Priority,
        orphans: bool,
        report: &mut Report,
    ) -> Option<Found> {
        let bindings = match self.core.bindings(priority).await {
            Ok(b) => b,
            Err(e) => {
                report
                    .errors
                    .push(format!("discovering target groups failed: {e}"));
                return None;
            }
        };
        report
            .errors
            .extend(bindings.accounts_failed.iter().map(ToString::to_string));
        let tagged = bindings
            .bound
            .iter()
            .map(|b| b.group.arn.clone())
            .chain(bindings.errors.iter().map(|e| e.target_group_arn.clone()))
            .collect();
        let indexed = if orphans {
            self.core
                .indexed_for_orphans(&bindings.accounts_failed, &mut report.errors)
                .await
        } else {
            None
        };
        Some(Found {
            bindings,
            tagged,
            indexed,
        })
    }

    /// The orphan report of a run whose discovery found `tagged` and read `indexed`: the
    /// groups of the index no longer tagged for this cluster whose ledger still holds
    /// its targets (see `Reconciler::orphans`; nothing changes in a dry run).
    pub(super) async fn report_orphans(
        &self,
        tagged: &BTreeSet<String>,
        indexed: Option<&BTreeSet<String>>,
        dry_run: bool,
        report: &mut Report,
    ) {
        if let Some(indexed) = indexed {
            let tagged = tagged.iter().map(String::as_str).collect();
            let orphans = self
                .core
                .orphans(indexed, &tagged, dry_run, &mut report.errors)
                .await;
            report.orphans = Some(orphans);
        }
    }
}
