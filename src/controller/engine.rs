//! The engine every function runs: the reconcile core (one group's pass and what passes
//! share, [`Reconciler`]) and the controller's warm state beside it (the informer's
//! stores, the queue, the full diff's rotation), kept between the invocations a
//! container serves. The reconcile core knows nothing of the controller: this type,
//! here, is what puts the two together.

use std::sync::Arc;

use super::Controller;
use crate::clock::Clock;
use crate::groups::TargetGroupApi;
use crate::pods::PodSource;
use crate::reconcile::{EngineSettings, Reconciler};
use crate::state::StateStore;

/// The reconcile core and the controller's warm state, side by side: the controller's
/// code names which of the two it reaches for. Cheap to share behind an `Arc`.
pub struct Engine<P, G, S> {
    /// The reconcile core: its I/O, clock, settings and index.
    pub core: Reconciler<P, G, S>,
    /// The controller's warm state (watch stores, the queue), kept between the
    /// scheduled invocations a container serves.
    pub controller: Controller,
}

impl<P: PodSource, G: TargetGroupApi, S: StateStore> Engine<P, G, S> {
    /// An engine with default settings, the system clock and no faults.
    pub fn new(
        cluster: impl Into<String>,
        pods: P,
        groups: G,
        state: S,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self {
            core: Reconciler::new(cluster, pods, groups, state, clock),
            controller: Controller::default(),
        }
    }

    /// Replaces the fault hook (tests).
    #[cfg(any(test, feature = "testing"))]
    pub fn with_faults(self, faults: Arc<dyn crate::faults::Faults>) -> Self {
        self.map(|r| r.with_faults(faults))
    }

    /// Replaces the settings.
    pub fn with_settings(self, settings: EngineSettings) -> Self {
        self.map(|r| r.with_settings(settings))
    }

    /// Replaces where passes are told (tests).
    pub fn with_sink(self, sink: Arc<dyn crate::metrics::Sink>) -> Self {
        self.map(|r| r.with_sink(sink))
    }

    /// Names lease owners after the calling function.
    pub fn with_owner_prefix(self, prefix: impl Into<String>) -> Self {
        self.map(|r| r.with_owner_prefix(prefix))
    }

    /// Seeds the jitter source (tests).
    pub fn with_seed(self, seed: u64) -> Self {
        self.map(|r| r.with_seed(seed))
    }

    fn map(self, f: impl FnOnce(Reconciler<P, G, S>) -> Reconciler<P, G, S>) -> Self {
        Self {
            core: f(self.core),
            controller: self.controller,
        }
    }
}
