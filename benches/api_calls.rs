//! Benchmark (not a test): API calls per kind for a zero-drift resync of 100 bound
//! groups, with the production adapters against moto and the Kubernetes API emulator.
//!
//! Run: `scripts/bench.sh api-calls` (or `cargo bench --bench api_calls` with the venv
//! present). 100 groups in 5 namespaces, 10 ready pods each (1,000 pods), page size 500.

#[path = "../tests/support/moto.rs"]
mod moto;
#[path = "../tests/support/world.rs"]
mod world;

use tgsync::eks::KubePods;
use tgsync::report::Outcome;
use tgsync::testkit::{PodBuilder, calls_since};
use world::World;

const GROUPS: usize = 100;
const NAMESPACES: usize = 5;
const PODS_PER_GROUP: usize = 10;

#[tokio::main]
async fn main() {
    let mut w = World::new().await;
    w.engine.core.pods = KubePods::new(w.engine.core.pods.access().clone()).with_page_size(500);
    for g in 0..GROUPS {
        let ns = format!("ns-{}", g % NAMESPACES);
        w.group(&ns, &format!("app=svc-{g}"), 8080, &[]).await;
        for p in 0..PODS_PER_GROUP {
            let i = g * PODS_PER_GROUP + p;
            w.put_pod(
                PodBuilder::new(&ns, &format!("svc-{g}-{p}"))
                    .label("app", &format!("svc-{g}"))
                    .ip(&format!("10.1.{}.{}", i / 250, 1 + i % 250))
                    .build(),
            );
        }
    }
    let first = w.resync().await;
    assert_eq!(
        first.totals.registered,
        GROUPS * PODS_PER_GROUP,
        "{:?}",
        first.totals
    );
    let (elb0, ddb0) = (
        w.engine.core.groups.api_calls(),
        w.engine.core.state.api_calls(),
    );
    w.emulator.faults().clear_requests();
    let started = std::time::Instant::now();
    let r = w.resync().await;
    let wall = started.elapsed();
    assert!(
        r.groups.iter().all(|g| g.outcome == Outcome::InSync),
        "drift found"
    );
    let elb = calls_since(&w.engine.core.groups.api_calls(), &elb0);
    let ddb = calls_since(&w.engine.core.state.api_calls(), &ddb0);
    let lists = w
        .emulator
        .faults()
        .requests()
        .iter()
        .filter(|q| q.method == "GET")
        .count();
    println!(
        "zero-drift resync of {GROUPS} groups ({} pods, {NAMESPACES} namespaces) in {:.0} ms",
        GROUPS * PODS_PER_GROUP,
        wall.as_secs_f64() * 1e3
    );
    println!("| API | calls |\n|---|---|");
    for (k, v) in &elb {
        println!("| elasticloadbalancing:{k} | {v} |");
    }
    for (k, v) in &ddb {
        println!("| dynamodb:{k} | {v} |");
    }
    println!("| kubernetes: LIST pods (pages) | {lists} |");
}
