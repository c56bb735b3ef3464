//! Benchmark (not a test): the deployment-wide ELBv2 budget under a burst of pod events.
//! 100 pods start at once in one namespace and each sends its `Started` event: 100
//! pod-events invocations arrive together, while the scheduled resync watches the same
//! namespace. Every container is a separate engine with its own adapters and pacing, as
//! Lambda runs them; a counting proxy in front of moto records every ELBv2 request.
//!
//! Two deployments are compared:
//! - **as the template deploys it**: the resync with reserved concurrency 1 and 50 % of
//!   the budgets, pod-events with reserved concurrency 2 and 30 % (Lambda runs at most 2
//!   of the 100 invocations at a time; the others wait in its queue);
//! - **unbounded**: no reserved concurrency, every container paced to the whole budget
//!   (how every container was paced before): 100 pod-events containers at once.
//!
//! Reports the largest 1-s and 5-s windows of mutating and of Describe requests (every
//! attempt) against the budgets, and how long until every pod was registered.
//!
//! Run: `cargo bench --bench budget` (moto from `TGSYNC_TEST_AWS_ENDPOINT`, or started by
//! `tests/support/moto.rs`).

#[path = "../tests/support/chaos_proxy.rs"]
mod chaos_proxy;
#[path = "../tests/support/moto.rs"]
mod moto;
#[path = "../tests/support/world.rs"]
mod world;

use std::sync::Arc;
use std::time::{Duration, Instant};

use chaos_proxy::{ChaosProxy, is_describe, is_mutation, max_in_window, times_of};
use serde_json::{Value, json};
use tgsync::Engine;
use tgsync::aws::{DynamoState, Elbv2TargetGroups, MutationRate};
use tgsync::clock::SystemClock;
use tgsync::eks::{ClusterAccess, KubePods, Overrides};
use tgsync::reconcile::RunOptions;
use tgsync::testkit::PodBuilder;
use world::{LiveEngine, World};

const EVENTS: usize = 100;
const MUTATIONS: u32 = 5;
const DESCRIBES: u32 = 8;

/// One container: an engine with its own adapters, paced to `share` of the budgets
/// divided by `containers`.
fn container(
    w: &World,
    sdk: &aws_config::SdkConfig,
    share: f64,
    containers: u32,
    prefix: &str,
) -> LiveEngine {
    let access = ClusterAccess::new(
        w.cluster.as_str(),
        aws_sdk_eks::Client::new(sdk),
        world::Creds::default().provider(),
        moto::REGION,
        url::Url::parse(moto::endpoint()).expect("moto URL"),
        Overrides {
            endpoint: Some(url::Url::parse(w.emulator.url()).expect("emulator URL")),
            ca_pem: w.emulator.ca_pem().map(|p| p.as_bytes().to_vec()),
        },
    );
    let (mutations, describes) =
        MutationRate::container_shares(MUTATIONS, DESCRIBES, share, containers).expect("rates");
    let groups = Elbv2TargetGroups::from_sdk_config(sdk, mutations).with_describe_rate(describes);
    Engine::new(
        w.cluster.as_str(),
        KubePods::new(Arc::new(access)),
        groups,
        DynamoState::from_sdk_config(sdk, w.table.as_str(), w.cluster.as_str()),
        Arc::new(SystemClock),
    )
    .with_owner_prefix(prefix)
}

fn started_event(w: &World, pod: &str) -> Value {
    let path = format!("{}/events/pod-started.json", env!("CARGO_MANIFEST_DIR"));
    let mut ev: Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("event")).expect("JSON");
    ev["detail"]["clusterName"] = json!(w.cluster);
    ev["detail"]["involvedObject"]["name"] = json!(pod);
    ev
}

async fn deployment(bounded: bool) {
    let w = World::new().await;
    let arn = w.group("shop", "app=web", 8080, &[]).await;
    let proxy = ChaosProxy::transparent().await;
    let sdk = chaos_proxy::sdk_config(&proxy).await;
    let (resync_share, pod_share, pod_containers) = if bounded {
        (0.5, 0.3, 2u32)
    } else {
        (1.0, 1.0, 1u32)
    };
    let concurrency = if bounded { 2 } else { EVENTS };
    let resync = container(&w, &sdk, resync_share, 1, "resync");
    let pod_events: Vec<LiveEngine> = (0..concurrency)
        .map(|i| {
            container(
                &w,
                &sdk,
                pod_share,
                pod_containers,
                &format!("pod-events-{i}"),
            )
        })
        .collect();
    // The pods start; the resync is watching.
    let started = Instant::now();
    let until = tgsync::core::UnixMillis(tgsync::clock::Clock::now(&SystemClock).0 + 40_000);
    let opts = RunOptions {
        use_checkpoint: true,
        ..RunOptions::default()
    };
    let watching = resync.run_scheduled(&opts, until);
    // Lambda runs at most `concurrency` invocations at once: each container takes the
    // next queued event when it is done.
    let queue = std::sync::Mutex::new(std::collections::VecDeque::new());
    let pods_started = async {
        tokio::time::sleep(Duration::from_secs(2)).await;
        // A rollout's worth of pods, 25 ms apart, each with its event queued.
        for i in 0..EVENTS {
            w.put_pod(
                PodBuilder::new("shop", &format!("web-{i}"))
                    .label("app", "web")
                    .ip(&format!("10.0.{}.{}", 1 + i / 250, 1 + i % 250))
                    .build(),
            );
            if let Ok(mut q) = queue.lock() {
                q.push_back(i);
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    };
    let all_registered = async {
        loop {
            if w.targets(&arn).await.len() == EVENTS {
                return started.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let events = async {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let deadline = tgsync::core::UnixMillis(tgsync::clock::Clock::now(&SystemClock).0 + 60_000);
        futures::future::join_all(pod_events.iter().map(|engine| {
            let (queue, w) = (&queue, &w);
            async move {
                let mut idle = 0;
                loop {
                    let Some(i) = queue.lock().ok().and_then(|mut q| q.pop_front()) else {
                        idle += 1;
                        if idle > 60 {
                            return;
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    };
                    idle = 0;
                    let ev = started_event(w, &format!("web-{i}"));
                    let _ = tgsync::handlers::pod_events::handle(
                        engine,
                        &ev,
                        Duration::ZERO,
                        Some(deadline),
                    )
                    .await;
                }
            }
        }))
        .await;
        started.elapsed()
    };
    let (_, (), all_registered, events_done) =
        tokio::join!(watching, pods_started, all_registered, events);
    let records = proxy.records();
    let mutations = times_of(&records, is_mutation, false);
    let describes = times_of(&records, is_describe, false);
    println!(
        "{}: {EVENTS} pod events, pod-events at most {concurrency} at once, the resync watching\n  \
         all {EVENTS} pods registered {:.1} s after the first started; the last event handled after {:.1} s\n  \
         mutating requests: {} in all, largest 1-s window {} (5-s: {}) against a budget of {MUTATIONS}/s\n  \
         Describe requests: {} in all, largest 1-s window {} (5-s: {}) against a budget of {DESCRIBES}/s",
        if bounded {
            "as the template deploys it (resync 1 container, 50 %; pod-events 2 containers, 30 %)"
        } else {
            "unbounded (no reserved concurrency, every container paced to the whole budget)"
        },
        all_registered.as_secs_f64() - 2.0,
        events_done.as_secs_f64() - 2.0,
        mutations.len(),
        max_in_window(&mutations, Duration::from_secs(1)),
        max_in_window(&mutations, Duration::from_secs(5)),
        describes.len(),
        max_in_window(&describes, Duration::from_secs(1)),
        max_in_window(&describes, Duration::from_secs(5)),
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    tgsync::app::install_crypto_provider();
    deployment(true).await;
    deployment(false).await;
}
