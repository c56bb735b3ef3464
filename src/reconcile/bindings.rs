//! Which groups are bound to this cluster, and the state table's record of them:
//! discovery's tag reads turned into bindings (or binding errors), the cluster index's
//! rows brought to a discovery, and the groups a run names read afresh.

use std::collections::{BTreeMap, BTreeSet};

use super::{BoundGroup, Reconciler};
use crate::core::{Binding, GroupFacts, UnixMillis};
use crate::groups::{Priority, TargetGroup, TargetGroupApi};
use crate::pods::PodSource;
use crate::report::{GroupReport, Outcome};
use crate::state::{StateError, StateStore};

/// Discovery result: bound groups plus reports for groups with bad tags.
#[derive(Debug, Default)]
pub struct Bindings {
    /// Groups with a valid binding for this cluster.
    pub bound: Vec<BoundGroup>,
    /// Binding errors, one report per group.
    pub errors: Vec<GroupReport>,
    /// Accounts whose discovery failed (their groups are unknown and left untouched):
    /// one run-level error each in the report.
    pub accounts_failed: Vec<crate::groups::AccountError>,
}

impl<P: PodSource, G: TargetGroupApi, S: StateStore> Reconciler<P, G, S> {
    /// Discovers target groups and splits them into valid bindings and binding errors
    /// (bad tags, or tags asking for more than the deployment's binding policy allows).
    /// An account whose discovery failed is listed in `accounts_failed`; `Err` only when
    /// the single account there is could not be read. Nothing is written: the caller
    /// makes them the container's ([`crate::index::BoundIndex::discovered`]) and, unless
    /// it is a dry run, the state table's ([`Reconciler::publish_bindings`]).
    pub async fn bindings(&self, priority: &Priority) -> Result<Bindings, crate::groups::ElbError> {
        let read_at = self.clock.now();
        let discovery = self.groups.discover_accounts(priority).await?;
        let mut out = Bindings {
            accounts_failed: discovery.failed,
            ..Bindings::default()
        };
        for group in discovery.groups {
            match self.bind(group, read_at) {
                None => {}
                Some(Ok(bound)) => out.bound.push(bound),
                Some(Err(report)) => out.errors.push(report),
            }
        }
        Ok(out)
    }

    /// Brings the state table's index of bound groups to a discovery's result: a row
    /// for every bound group that has none for its binding, and rows of groups no
    /// longer bound (in accounts that could be read) marked so; the index's generation
    /// is bumped when anything changed (and the container's view follows it), so
    /// pod-events and the gates of every function see the groups the last discovery
    /// found. Nothing is written when the rows say so already. A failure is logged: the
    /// rows are brought there by the next discovery.
    pub(crate) async fn publish_bindings(&self, found: &Bindings) {
        let rows = match self.state.indexed_selections(&self.cluster).await {
            Ok(rows) => rows,
            Err(e) => {
                tracing::warn!(error = %e, "reading this cluster's index in the state table failed; it is brought to the bound groups at the next discovery");
                return;
            }
        };
        let recorded: std::collections::HashMap<&str, &crate::state::IndexedGroup> =
            rows.iter().map(|r| (r.group.as_str(), r)).collect();
        let mut updates: Vec<crate::state::IndexUpdate<'_>> = found
            .bound
            .iter()
            .filter(|b| {
                recorded.get(b.group.arn.as_str()).is_none_or(|r| {
                    !r.bound || r.binding != Some(b.binding.fingerprint()) || r.described.is_none()
                })
            })
            .map(|b| crate::state::IndexUpdate::Bound {
                group: &b.group.arn,
                binding: &b.binding,
                described: (&b.group.name, &b.group.facts),
            })
            .collect();
        let bound: BTreeSet<&str> = found.bound.iter().map(|b| b.group.arn.as_str()).collect();
        let unread: BTreeSet<Option<&str>> = found
            .accounts_failed
            .iter()
            .map(|f| f.account.as_deref())
            .collect();
        // An account that could not be read (or whose name is not known) may still
        // bind its groups.
        let readable = |arn: &str| {
            !unread.contains(&None) && !unread.contains(&crate::core::arn::arn_account(arn))
        };
        updates.extend(
            rows.iter()
                .filter(|r| r.bound && !bound.contains(r.group.as_str()) && readable(&r.group))
                .map(|r| crate::state::IndexUpdate::Unbound { group: &r.group }),
        );
        if updates.is_empty() {
            return;
        }
        let before = self.index.generation();
        match self.state.sync_index(&self.cluster, &updates).await {
            Ok(Some(generation)) => self.index.wrote(before, generation),
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(error = %e, "writing this cluster's index of bound groups failed; tried again at the next discovery");
            }
        }
    }

    /// Records `bound` in the state table's index of bound groups (a pass before the
    /// group's first entry of this cluster, and a group found in the ledgers but missing
    /// from the index), keeping the container's view current when its own write is the
    /// index's only change.
    pub(crate) async fn record_bound(&self, bound: &BoundGroup) -> Result<(), StateError> {
        let before = self.index.generation();
        let update = crate::state::IndexUpdate::Bound {
            group: &bound.group.arn,
            binding: &bound.binding,
            described: (&bound.group.name, &bound.group.facts),
        };
        let written = self.state.sync_index(&self.cluster, &[update]).await?;
        if let Some(generation) = written {
            self.index.wrote(before, generation);
        }
        Ok(())
    }

    /// The groups of `batch` (at most [`crate::aws::elbv2::TAGS_BATCH`]) as they are
    /// now: those whose index rows record their names and facts (which ELBv2 never
    /// changes) from one DescribeTags, the others described as discovery does (one
    /// DescribeTargetGroups more); these are returned too. What reads a few groups
    /// without discovering every group of the account.
    pub(crate) async fn read_groups(
        &self,
        batch: Vec<(String, Option<(String, GroupFacts)>)>,
    ) -> Result<(Vec<TargetGroup>, BTreeSet<String>), crate::groups::ElbError> {
        let mut described = Vec::new();
        let mut undescribed = BTreeSet::new();
        for (arn, recorded) in batch {
            match recorded {
                Some((name, facts)) => described.push(TargetGroup {
                    name,
                    facts,
                    tags: BTreeMap::new(),
                    arn,
                }),
                None => {
                    undescribed.insert(arn);
                }
            }
        }
        let mut groups = Vec::with_capacity(described.len() + undescribed.len());
        if !described.is_empty() {
            let arns: Vec<String> = described.iter().map(|g| g.arn.clone()).collect();
            let mut tags = self.groups.tags_of(&arns, &Priority::Reaction).await?;
            for mut group in described {
                match tags.remove(&group.arn) {
                    Some(t) => {
                        group.tags = t;
                        groups.push(group);
                    }
                    // Another account's (one DescribeTags reads one account's groups).
                    None => {
                        undescribed.insert(group.arn);
                    }
                }
            }
        }
        if !undescribed.is_empty() {
            let arns: Vec<String> = undescribed.iter().cloned().collect();
            groups.extend(self.groups.describe(&arns, &Priority::Reaction).await?);
        }
        Ok((groups, undescribed))
    }

    /// `group` bound to this cluster under the deployment's binding policy, its tags
    /// read at `read_at`: `None` when its tags do not name this cluster, its report
    /// when they are wrong.
    pub(crate) fn bind(
        &self,
        group: crate::groups::TargetGroup,
        read_at: UnixMillis,
    ) -> Option<Result<BoundGroup, GroupReport>> {
        let policy = &self.settings.binding_policy;
        match Binding::for_cluster(&group.tags, &group.facts, &self.cluster, policy)? {
            Ok(binding) => Some(Ok(BoundGroup {
                group,
                binding,
                read_at,
            })),
            Err(e) => {
                // DEBUG: the report carries it, and the resync handler logs one line
                // per failing group every run; pod-events, which rediscovers every
                // minute, would only repeat it.
                tracing::debug!(target_group = %group.arn, error = %e, "binding error");
                Some(Err(GroupReport::with_error(
                    &group.arn,
                    &group.group_name(),
                    Outcome::BindingError,
                    e,
                )))
            }
        }
    }
}
