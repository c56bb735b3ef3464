//! One group's pass, for every function: its pods from where the run reads them
//! ([`Pods`]: the informer's store, or the run's LIST of the namespace), the look, and —
//! if something is to change — the leased pass. The schedule's job and the one-shot
//! runs' job both call [`Engine::look_and_pass`]; they differ only in where pods come
//! from and in what they keep of the result.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::informer::Informer;
use super::{Engine, STORE_WAIT};
use crate::core::{Binding, PodFacts, PodIndex, Selector};
use crate::groups::TargetGroupApi;
use crate::pods::{PodSource, PodsError};
use crate::reconcile::{
    Action, BoundGroup, Failure, Observed, PassError, PodReads, Reconciled, RunOptions, Scope,
};
use crate::report::{GroupReport, Outcome};
use crate::state::StateStore;
use crate::sync::lock;

/// Where a run's passes read pods.
pub(super) enum Pods<'a> {
    /// The informer's store (the watching run). A namespace the store has not listed
    /// within [`STORE_WAIT`] is listed for the group's selection; a leased pass takes
    /// the store's pods unless they are behind what the group's last pass decided from.
    Store(&'a Informer),
    /// The run's LIST of each namespace (one-shot runs); a leased pass lists afresh,
    /// or — `keep`, a pod event's — plans from this LIST when nothing was written to
    /// the group since (see `reconcile::reads::PriorRead`).
    Snapshots {
        /// The run's LISTs.
        snapshots: &'a Snapshots,
        /// Whether the leased pass may plan from the look's LIST.
        keep: bool,
    },
}

impl<P: PodSource, G: TargetGroupApi, S: StateStore> Engine<P, G, S> {
    /// `bound`'s pass: its pods from `pods`, the look under `opts` and `scope`, and if
    /// something is to change, the leased pass; the report (none when the look was not
    /// the business of the pod event that asked) and what should happen next.
    pub(super) async fn look_and_pass(
        &self,
        bound: &BoundGroup,
        opts: &RunOptions,
        scope: &Scope<'_>,
        pods: Pods<'_>,
    ) -> (Option<GroupReport>, Reconciled) {
        let namespace = &bound.binding.namespace;
        let listed = match self.read_pods(bound, &pods).await {
            Ok(listed) => listed,
            Err(e) => {
                pods.looked(namespace);
                let error = PassError::Failed(Failure::Pods(e));
                let report = GroupReport::with_error(
                    &bound.group.arn,
                    &bound.group.group_name(),
                    Outcome::Failed,
                    &error,
                );
                return (Some(report), Err(error));
            }
        };
        let index = PodIndex::new(&listed.0);
        let observed = self.core.observe(bound, &index, opts, scope).await;
        drop(index);
        pods.looked(namespace);
        let kept = matches!(pods, Pods::Snapshots { keep: true, .. }).then_some(listed);
        match observed {
            Observed::Done(report, result) => (Some(report), result),
            Observed::Irrelevant => (None, Ok(Action::Done)),
            Observed::Change(report, mut prior) => {
                prior.pods = kept;
                let view = |b: &Binding| match pods {
                    Pods::Store(informer) => informer.view(b),
                    Pods::Snapshots { .. } => None,
                };
                let reads = match pods {
                    Pods::Store(_) => PodReads::Held(&view),
                    Pods::Snapshots { .. } => PodReads::Fresh,
                };
                let (report, result) = self
                    .core
                    .reconcile_leased(bound.clone(), report, opts, &reads, Some(prior))
                    .await;
                (Some(report), result)
            }
        }
    }

    /// The pods `bound`'s look plans from (a superset of those it selects).
    async fn read_pods(&self, bound: &BoundGroup, pods: &Pods<'_>) -> Result<Listed, PodsError> {
        let namespace = &bound.binding.namespace;
        match pods {
            Pods::Snapshots { snapshots, .. } => snapshots.get(&self.core.pods, namespace).await,
            Pods::Store(informer) => {
                let give_up = tokio::time::Instant::now() + STORE_WAIT;
                let held = if informer.wait_live(namespace, give_up).await {
                    informer.view(&bound.binding)
                } else {
                    None
                };
                match held {
                    Some(view) => Ok(Arc::new(view)),
                    None => {
                        let listing = self
                            .core
                            .pods
                            .list_versioned(namespace, Some(&bound.binding.selector))
                            .await?;
                        Ok(Arc::new((listing.pods, listing.resource_version)))
                    }
                }
            }
        }
    }
}

impl Pods<'_> {
    /// A look at a group of `namespace` is done (a run's LIST goes with its last).
    fn looked(&self, namespace: &str) {
        if let Self::Snapshots { snapshots, .. } = self {
            snapshots.done(namespace);
        }
    }
}

/// A namespace's pods as one LIST read them, and its `resourceVersion`.
type Listed = Arc<(Vec<PodFacts>, String)>;

/// The run's LISTs, one per namespace: made when its first group is looked at (the
/// groups that wait for it share it), dropped when its last group's look is done.
pub(super) struct Snapshots {
    namespaces: Mutex<HashMap<String, Snapshot>>,
}

struct Snapshot {
    /// The selection every group of the namespace shares (`None`: all its pods).
    selector: Option<Selector>,
    /// Looks still to come.
    remaining: usize,
    listed: Arc<tokio::sync::OnceCell<Result<Listed, PodsError>>>,
}

impl Snapshots {
    /// The LISTs the looks at `groups` will share.
    pub(super) fn new(groups: &[BoundGroup]) -> Self {
        let namespaces = crate::index::by_namespace(groups)
            .into_iter()
            .map(|(ns, namespace)| {
                let snapshot = Snapshot {
                    selector: namespace.selector,
                    remaining: namespace.groups.len(),
                    listed: Arc::default(),
                };
                (ns.to_owned(), snapshot)
            })
            .collect();
        Self {
            namespaces: Mutex::new(namespaces),
        }
    }

    /// `namespace`'s LIST, made now if no look of this run has it.
    pub(super) async fn get<Q: PodSource>(
        &self,
        pods: &Q,
        namespace: &str,
    ) -> Result<Listed, PodsError> {
        let (cell, selector) = {
            let mut namespaces = lock(&self.namespaces);
            let snapshot = namespaces
                .entry(namespace.to_owned())
                .or_insert_with(|| Snapshot {
                    selector: None,
                    remaining: 0,
                    listed: Arc::default(),
                });
            (snapshot.listed.clone(), snapshot.selector.clone())
        };
        cell.get_or_init(|| async {
            match pods.list_versioned(namespace, selector.as_ref()).await {
                Ok(listing) => Ok(Arc::new((listing.pods, listing.resource_version))),
                Err(e) => {
                    // Never act on partial data: the error is every group's outcome.
                    tracing::error!(namespace, error = %e, "pod list failed; groups in this namespace are left untouched");
                    Err(e)
                }
            }
        })
        .await
        .clone()
    }

    /// A look at a group of `namespace` is done: the LIST goes with the last one (a
    /// look that comes back later lists again).
    pub(super) fn done(&self, namespace: &str) {
        let mut namespaces = lock(&self.namespaces);
        if let Some(snapshot) = namespaces.get_mut(namespace) {
            snapshot.remaining = snapshot.remaining.saturating_sub(1);
            if snapshot.remaining == 0 {
                snapshot.listed = Arc::default();
            }
        }
    }
}
