//! What the controller's integration tests share: one scheduled invocation as the
//! function runs it, a pod of an app, and waiting for a group's targets.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use serde_json::Value;
use tgsync::clock::Clock as _;
use tgsync::testkit::PodBuilder;

use crate::world::World;

/// The scheduled event EventBridge sends.
pub fn scheduled_event() -> Value {
    serde_json::from_str(include_str!("../../events/scheduled.json")).expect("event JSON")
}

/// One scheduled invocation of `engine` watching for `watch`, as the function runs it
/// (180 s deadline); its report.
pub async fn invoke<P, G, S>(
    engine: &tgsync::Engine<P, G, S>,
    clock: &tgsync::clock::ManualClock,
    watch: Duration,
) -> Value
where
    P: tgsync::pods::PodSource,
    G: tgsync::groups::TargetGroupApi,
    S: tgsync::state::StateStore,
{
    let deadline = clock.now().plus(Duration::from_secs(180));
    tgsync::handlers::resync::handle(engine, &scheduled_event(), Some(deadline), watch)
        .await
        .expect("a scheduled invocation answers")
}

pub fn pod(namespace: &str, app: &str, name: &str, ip: &str) -> PodBuilder {
    PodBuilder::new(namespace, name).label("app", app).ip(ip)
}

/// Waits (up to `limit`) until `arn`'s targets are `want`; how long it took.
pub async fn until_targets(w: &World, arn: &str, want: &[&str], limit: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let now = w.targets(arn).await;
        if now == want {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < limit,
            "targets of {arn}: {now:?}, waited {limit:?} for {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}
