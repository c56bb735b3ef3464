//! Measurement (not a test): how many log lines and bytes one zero-drift resync of 100
//! bound groups writes, through the real resync handler and the real log setup
//! (`tgsync::logging::init_with`, JSON lines as Lambda's `LoggingConfig` asks for).
//! Every line is a CloudWatch Logs ingestion cost, so a run that changes nothing should
//! cost one summary line.
//!
//! ```sh
//! cargo run --example log_volume                  # INFO, in-memory fakes
//! cargo run --example log_volume -- debug         # any level or directive string
//! cargo run --example log_volume -- info --live   # also: the production adapters against
//!                                                 # moto and the Kubernetes API emulator
//! ```
//!
//! The fakes have no AWS SDK in them, so they show what tgsync itself writes; `--live`
//! adds what the SDK and kube write with the same filter (moto is started if
//! `TGSYNC_TEST_AWS_ENDPOINT` is not set; `scripts/test.sh` installs it). EMF metric
//! lines (stdout, `"_aws"`) are not counted: they are metrics, not logs.

#[path = "../tests/support/moto.rs"]
mod moto;
#[path = "../tests/support/world.rs"]
mod world;

use std::io::Write;
use std::sync::{Arc, Mutex};

use tgsync::clock::ManualClock;
use tgsync::core::UnixMillis;
use tgsync::fakes::{FakeElb, FakePods, FakeState};
use tgsync::reconcile::Engine;
use tgsync::testkit::{PodBuilder, bound_group};

const GROUPS: usize = 100;
const NAMESPACES: usize = 5;
const PODS_PER_GROUP: usize = 10;

/// Everything the subscriber writes, kept in memory.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut b) = self.0.lock() {
            b.extend_from_slice(buf);
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Capture {
    /// Takes what was written so far: (log lines without EMF lines, their bytes).
    fn take(&self) -> (Vec<String>, usize) {
        let text = self
            .0
            .lock()
            .map(|mut b| String::from_utf8_lossy(&std::mem::take(&mut *b)).into_owned())
            .unwrap_or_default();
        let lines: Vec<String> = text
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.contains("\"_aws\""))
            .map(str::to_owned)
            .collect();
        let bytes = lines.iter().map(|l| l.len() + 1).sum();
        (lines, bytes)
    }
}

fn pod(g: usize, p: usize) -> k8s_openapi::api::core::v1::Pod {
    let i = g * PODS_PER_GROUP + p;
    PodBuilder::new(&format!("ns-{}", g % NAMESPACES), &format!("svc-{g}-{p}"))
        .label("app", &format!("svc-{g}"))
        .ip(&format!("10.1.{}.{}", i / 250, 1 + i % 250))
        .build()
}

fn report(what: &str, capture: &Capture, verbose: bool) {
    let (lines, bytes) = capture.take();
    println!("{what}: {} log lines, {bytes} bytes", lines.len());
    if verbose {
        for l in &lines {
            println!("    {l}");
        }
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let live = args.iter().any(|a| a == "--live");
    let verbose = args.iter().any(|a| a == "--verbose");
    let level = args
        .iter()
        .find(|a| !a.starts_with("--"))
        .cloned()
        .unwrap_or_else(|| "info".to_owned());
    let capture = Capture::default();
    let writer = capture.clone();
    tgsync::logging::init_with(Some(&level), true, move || writer.clone());
    tgsync::app::install_crypto_provider();
    println!(
        "log level `{level}`, JSON lines; {GROUPS} groups in {NAMESPACES} namespaces, {PODS_PER_GROUP} ready pods each"
    );

    // In-memory fakes: only what tgsync itself logs.
    let clock = ManualClock::new(UnixMillis(1_800_000_000_000));
    let elb = FakeElb::default();
    let pods = FakePods::default();
    for g in 0..GROUPS {
        let arn = format!(
            "arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/svc-{g}/{g:016x}"
        );
        elb.add_group(bound_group(
            &arn,
            "demo",
            &format!("ns-{}", g % NAMESPACES),
            &format!("app=svc-{g}"),
            8080,
        ));
        for p in 0..PODS_PER_GROUP {
            pods.put(pod(g, p));
        }
    }
    let engine = Engine::new("demo", pods, elb, FakeState::default(), Arc::new(clock));
    let payload = serde_json::json!({});
    let first = tgsync::handlers::resync::handle(&engine, &payload, None)
        .await
        .expect("first resync");
    assert_eq!(
        first["totals"]["registered"],
        GROUPS * PODS_PER_GROUP,
        "the first run fills every group"
    );
    engine.groups.settle();
    report("fakes, first run (100 groups changed)", &capture, false);
    let second = tgsync::handlers::resync::handle(&engine, &payload, None)
        .await
        .expect("zero-drift resync");
    assert_eq!(second["totals"]["changed"], 0, "zero drift");
    report("fakes, zero-drift resync", &capture, verbose);

    if !live {
        return;
    }
    // The production adapters (AWS SDK, kube) against moto and the emulator.
    let w = world::World::new().await;
    for g in 0..GROUPS {
        let ns = format!("ns-{}", g % NAMESPACES);
        w.group(&ns, &format!("app=svc-{g}"), 8080, &[]).await;
        for p in 0..PODS_PER_GROUP {
            w.put_pod(pod(g, p));
        }
    }
    let _ = capture.take();
    let first = tgsync::handlers::resync::handle(&w.engine, &payload, None)
        .await
        .expect("first resync");
    assert_eq!(first["totals"]["registered"], GROUPS * PODS_PER_GROUP);
    report(
        "live (moto + emulator), first run (100 groups changed)",
        &capture,
        false,
    );
    let second = tgsync::handlers::resync::handle(&w.engine, &payload, None)
        .await
        .expect("zero-drift resync");
    assert_eq!(second["totals"]["changed"], 0, "zero drift");
    report(
        "live (moto + emulator), zero-drift resync",
        &capture,
        verbose,
    );
}
