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

use tgsync::clock::ManualClock;
use tgsync::core::UnixMillis;
use tgsync::testkit::{Fleet, LogCapture};

const FLEET: Fleet = Fleet {
    groups: 100,
    namespaces: 5,
    pods_per_group: 10,
};

fn report(what: &str, capture: &LogCapture, verbose: bool) {
    let lines = capture.take();
    let bytes: usize = lines.iter().map(|l| l.len() + 1).sum();
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
    let capture = LogCapture::default();
    tgsync::logging::init_with(Some(&level), true, capture.clone());
    tgsync::app::install_crypto_provider();
    let Fleet {
        groups,
        namespaces,
        pods_per_group,
    } = FLEET;
    println!(
        "log level `{level}`, JSON lines; {groups} groups in {namespaces} namespaces, {pods_per_group} ready pods each"
    );

    // In-memory fakes: only what tgsync itself logs.
    let engine = FLEET.fake_engine(ManualClock::new(UnixMillis(1_800_000_000_000)));
    let payload = serde_json::json!({});
    let first =
        tgsync::handlers::resync::handle(&engine, &payload, None, std::time::Duration::ZERO)
            .await
            .expect("first resync");
    assert_eq!(
        first["totals"]["registered"],
        groups * pods_per_group,
        "the first run fills every group"
    );
    engine.core.groups.settle();
    report("fakes, first run (100 groups changed)", &capture, false);
    let second =
        tgsync::handlers::resync::handle(&engine, &payload, None, std::time::Duration::ZERO)
            .await
            .expect("zero-drift resync");
    assert_eq!(second["totals"]["changed"], 0, "zero drift");
    report("fakes, zero-drift resync", &capture, verbose);

    if !live {
        return;
    }
    // The production adapters (AWS SDK, kube) against moto and the emulator.
    let w = world::World::new().await;
    for g in 0..groups {
        w.group(&FLEET.namespace(g), &FLEET.selector(g), 8080, &[])
            .await;
        for p in 0..pods_per_group {
            w.put_pod(FLEET.pod(g, p));
        }
    }
    let _ = capture.take();
    let first =
        tgsync::handlers::resync::handle(&w.engine, &payload, None, std::time::Duration::ZERO)
            .await
            .expect("first resync");
    assert_eq!(first["totals"]["registered"], groups * pods_per_group);
    report(
        "live (moto + emulator), first run (100 groups changed)",
        &capture,
        false,
    );
    let second =
        tgsync::handlers::resync::handle(&w.engine, &payload, None, std::time::Duration::ZERO)
            .await
            .expect("zero-drift resync");
    assert_eq!(second["totals"]["changed"], 0, "zero drift");
    report(
        "live (moto + emulator), zero-drift resync",
        &capture,
        verbose,
    );
}
