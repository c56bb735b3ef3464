//! The controller inside the scheduled resync: kube-runtime's Controller, from outside
//! the cluster.
//!
//! ```text
//!   informer (LIST once, WATCH always; stores kept in the warm container)
//!      │ pod changes, relists                discovery (tags) ─┐
//!      ▼                                                        ▼
//!   queue (one key per target group: dedupe, re-run if changed, wait until a time)
//!      │                                     ▲ the full diff: every bound group
//!      ▼                                     │
//!   runner (each key's pass on its own: nothing waits for another group)
//!      │
//!      ▼
//!   one group's pass (`reconcile`: observe → lease → pods → health → plan → apply)
//! ```
//!
//! One scheduled invocation runs the controller until shortly before the next tick:
//! the watches start at once — from the bindings the warm container holds, or the
//! state table's index on a cold start — while discovery reads every group's tags
//! beside them; every bound group is then enqueued for the full diff (verified against
//! ELBv2 within the Describe budget), and every pod change for the groups it can
//! change (a change seen before discovery has bound its groups, as soon as the groups
//! the index names for it are read ahead of discovery, or discovery binds them; a
//! change made before a cold container's first LIST, likewise, once that LIST is
//! compared with the indexed groups' ledgers: see `early`). A group's pass knows
//! nothing of watches: it gets pods the store holds (or
//! reads them afresh when the store is behind the group's last pass) and runs under
//! the group's lease like any other pass. A pass that waits — for a lease another
//! process holds, for its backoff — gives its turn back to the queue with a time to
//! come back, so no group ever waits for another.

mod cold_start;
mod discovery;
mod early;
mod engine;
mod found;
mod hooks;
pub mod informer;
mod look;
mod one_pass;
pub mod pod_event;
pub mod queue;
mod runner;
mod schedule;
mod watches;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use futures::stream::FuturesUnordered;

use crate::core::{Selector, UnixMillis, contribution};
use crate::groups::{Priority, TargetGroupApi};
use crate::index::Snapshot;
use crate::pods::PodSource;
use crate::reconcile::{Action, BoundGroup, PassError, Reconciled, RunOptions};
use crate::report::{GroupReport, Outcome, Report, WatchReport};
use crate::state::StateStore;
use crate::sync::lock;
use early::Early;
pub use engine::Engine;
use found::Found;
use informer::{Informer, ReflectorSettings, StoreEvent};
use look::Pods;
use queue::{Queue, Want};

pub use queue::GATE_POLL;

pub use crate::settings::{RELIST_AFTER, WATCH_REQUEST};

/// A watching run discovers the bound groups again this often: a group tagged (or
/// untagged) while it watches is bound (or let go) within this.
pub const DISCOVERY_EVERY: Duration = Duration::from_secs(60);

/// How long passes still running when the controller's time is up may take to finish
/// (they are cut, cleanly, at the end of it).
const DRAIN: Duration = Duration::from_secs(5);

/// How long a job waits for its namespace's store to be listed before it reads the
/// group's pods itself.
const STORE_WAIT: Duration = Duration::from_secs(30);

/// Groups whose ledgers one comparison with a first LIST reads at a time (BatchGetItem's
/// limit; at ~120 bytes a target, about 1.2 MB at 100 targets a group).
const COMPARE_BATCH: usize = 100;

/// A namespace's first LIST in a cold container, to compare with the ledgers of the
/// groups its index rows name (see `early`).
#[derive(Debug)]
struct FirstList {
    namespace: String,
    /// When the LIST was seen.
    seen: UnixMillis,
}

/// What the controller keeps in the warm container between invocations.
#[derive(Debug, Default)]
pub struct Controller {
    /// The pod stores.
    pub informer: Informer,
    /// The work queue: the requests one invocation could not serve are the next one's
    /// first (they are handed on to the state table too, should another container run).
    pub queue: Mutex<Queue>,
    /// The full diffs this container ran, and the last of them that looked at each
    /// group: the next full diff starts with the groups looked at longest ago.
    looked: Mutex<Looked>,
}

/// When each group last had its full-diff look in this container.
#[derive(Debug, Default)]
struct Looked {
    /// Full diffs started (the current one's number).
    runs: u64,
    /// Group ARN → the number of the last full diff that looked at it.
    at: HashMap<String, u64>,
}
/// One invocation's controller state.
struct Run<'e, P, G, S> {
    engine: &'e Engine<P, G, S>,
    /// Options of every pass (never a dry run).
    opts: RunOptions,
    /// Signalled when the queue gets a request.
    wake: tokio::sync::Notify,
    /// The namespaces to watch, each with the selection its groups share.
    namespaces: tokio::sync::watch::Sender<BTreeMap<String, Option<Selector>>>,
    /// The pod changes seen until discovery binds the groups (then replayed for the
    /// groups the watch did not know yet; `None` after).
    early: Mutex<Option<Early>>,
    /// Indexed groups a pod change named before discovery, to read ahead of it
    /// (`read_ahead`).
    to_read: Mutex<Vec<String>>,
    /// First LISTs of a cold container to compare with the ledgers (`compare_lists`).
    to_compare: Mutex<std::collections::VecDeque<FirstList>>,
    /// Signalled when `to_read` gets a group, and when discovery is done.
    read_wake: tokio::sync::Notify,
    /// Signalled when `to_compare` gets a LIST, and when discovery is done.
    compare_wake: tokio::sync::Notify,
    /// The full diff's verification plan, once discovery is done.
    verify: Mutex<Verify>,
    /// Signalled when a group of the full diff has had its look.
    verified: tokio::sync::Notify,
    /// The full diff's read-ahead of the groups' states, in its visit order.
    ahead: std::sync::OnceLock<crate::reconcile::ReadAhead>,
    /// The verifications in flight, stood down or promoted when a pod change of their
    /// group arrives (the change waits for them: one pass per group at a time).
    promotions: Mutex<HashMap<String, crate::groups::Promotion>>,
    /// What happened, for the report.
    out: Mutex<Outcomes>,
}

/// The full diff's verification plan.
#[derive(Debug, Default)]
struct Verify {
    /// Groups whose re-verification turn has come.
    due: Option<HashSet<String>>,
    /// This cluster's index, as read at the start (shared: every look borrows it).
    indexed: Option<Arc<BTreeSet<String>>>,
    /// Groups the full diff has not looked at yet.
    remaining: HashSet<String>,
}

/// What the passes of one invocation did.
#[derive(Debug, Default)]
struct Outcomes {
    /// The full diff's report of each group (its last verification pass).
    full: BTreeMap<String, GroupReport>,
    watch: WatchReport,
    /// Reaction latencies (pod change seen → its pass answered), ms.
    reactions: Vec<u64>,
}
#[cfg(test)]
mod tests;
