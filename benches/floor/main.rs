//! Benchmark (not a test): the client CPU of a zero-drift full verification at 1,000
//! groups / 100,000 realistic pods (10 namespaces, LIST pages of 500, 100 targets per
//! group), three ways over the same bytes:
//!
//! - **physical floor** (`lean.rs`): the same requests with nothing but what they need —
//!   HTTP/1.1 over rustls, SigV4 per AWS request, the LIST decoded by tgsync's lean
//!   decoder, DescribeTargetHealth by a pull XML tokenizer, BatchGetItem (100 groups a
//!   request) into borrowed typed structs;
//! - **SDK floor**: the same requests through tgsync's adapters (the AWS SDK clients with
//!   the configuration the Lambda builds, the kube client), with no engine;
//! - **tgsync**: the engine's full verification (`RunOptions::default()`: every group's
//!   health is read), which also discovers the groups (DescribeTargetGroups, 50
//!   DescribeTags) and reads the cluster's index (one Query);
//! - **tgsync at rest** (`rest`, not in the default set): a scheduled run on the same
//!   world, whose items hold checkpoints of exactly their targets: the 120 groups due for
//!   re-verification (the default budget) read their health, the rest end on their
//!   checkpoints. `FLOOR_PROJECTION=0` makes the server ignore BatchGetItem's projection
//!   (whole items for the glances), to measure what leaving the ledgers out saves.
//!
//! The answers come from a canned HTTPS server (`server.rs`, this executable re-run as a
//! child process), so the measured process holds only the client: its CPU time (user +
//! system, every thread) per round is the figure. Rounds rotate the three paths.
//!
//! Run: `scripts/bench.sh floor`. Sizes: `FLOOR_GROUPS` (1000), `FLOOR_PODS_PER_GROUP`
//! (100), `FLOOR_NAMESPACES` (10), `FLOOR_ROUNDS` (5); `FLOOR_PATHS` (a comma-separated
//! subset of `physical,sdk,tgsync`; `physical:lists`, `sdk:groups` and the like measure
//! one half of a floor, the LISTs or the per-group reads). `FLOOR_LOGGING=0` runs without
//! the Lambda's log subscriber, `FLOOR_STALLED_STREAM=0` with the SDK's stalled-stream
//! protection off, `FLOOR_MIMALLOC_DEFAULTS=1` with mimalloc's defaults instead of the
//! functions' settings (`tgsync::allocator`): what each costs. `FLOOR_CPU_SHARE_MB=256`
//! puts the measured process (not the server) inside Lambda's CPU share for that memory
//! size once the world is built (`scripts/bench/cpu-share.sh`, root), so the wall time is
//! what a verification takes where it runs; `FLOOR_DESCRIBES_PER_SECOND` (100) sets
//! tgsync's Describe pace.

#[path = "../support/adapter_floor.rs"]
mod adapter_floor;
#[path = "../support/cpu_share.rs"]
#[allow(dead_code)]
mod cpu_share;
mod lean;
#[path = "../support/measure.rs"]
mod measure;
mod server;
mod world;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_credential_types::Credentials;
use tgsync::app::App;
use tgsync::clock::SystemClock;
use tgsync::config::Settings;
use tgsync::reconcile::RunOptions;
use tgsync::report::Outcome;
use tgsync::testkit::calls_since;

// The functions' allocator.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Pods per LIST page (tgsync's default).
pub const PAGE_SIZE: usize = 500;
/// The cluster the world belongs to.
pub const CLUSTER: &str = "floor";
/// The state table.
pub const TABLE: &str = "tgsync-floor";
/// The region requests are signed for.
pub const REGION: &str = "us-east-1";
/// The LIST's resourceVersion (also the items' `seen`).
pub const RESOURCE_VERSION: &str = "424242";

/// What to build and how often to measure.
pub struct Sizes {
    pub groups: usize,
    pub pods_per_group: usize,
    pub namespaces: usize,
    pub rounds: usize,
}

impl Sizes {
    pub fn from_env() -> Self {
        Self {
            groups: measure::env_or("FLOOR_GROUPS", 1000),
            pods_per_group: measure::env_or("FLOOR_PODS_PER_GROUP", 100),
            namespaces: measure::env_or("FLOOR_NAMESPACES", 10),
            rounds: measure::env_or("FLOOR_ROUNDS", 5),
        }
    }
}

/// A measured path, whole or one half of it (the LISTs, or the per-group AWS reads).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Path {
    Physical(Part),
    Sdk(Part),
    Tgsync,
    /// A scheduled run of tgsync at rest: the groups' checkpoints stand, and only those
    /// due for re-verification (120 a run, as at the default budget) read their health.
    AtRest,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Part {
    All,
    Lists,
    Groups,
}

impl Path {
    fn parse(s: &str) -> Option<Self> {
        let (path, part) = s.trim().split_once(':').unwrap_or((s.trim(), ""));
        let part = match part {
            "" => Part::All,
            "lists" => Part::Lists,
            "groups" => Part::Groups,
            _ => return None,
        };
        match path {
            "physical" => Some(Path::Physical(part)),
            "sdk" => Some(Path::Sdk(part)),
            "tgsync" if part == Part::All => Some(Path::Tgsync),
            "rest" if part == Part::All => Some(Path::AtRest),
            _ => None,
        }
    }

    fn name(self) -> String {
        let part = |p| match p {
            Part::All => "",
            Part::Lists => ", LISTs",
            Part::Groups => ", state reads + DTH",
        };
        match self {
            Path::Physical(p) => format!("physical floor{}", part(p)),
            Path::Sdk(p) => format!("SDK floor{}", part(p)),
            Path::Tgsync => "tgsync".to_owned(),
            Path::AtRest => "tgsync at rest".to_owned(),
        }
    }
}

fn main() {
    if let Ok(ca_file) = std::env::var("TGSYNC_FLOOR_SERVE") {
        server::main(&ca_file);
        return;
    }
    tgsync::app::install_crypto_provider();
    // The allocator as the functions set it up (purged memory handed back lazily).
    // `FLOOR_MIMALLOC_DEFAULTS=1` leaves mimalloc's defaults (handed back at once).
    if measure::env_or("FLOOR_MIMALLOC_DEFAULTS", 0) == 0 {
        tgsync::allocator::configure();
    }
    // Logging as the Lambda sets it up (JSON lines, default level), written nowhere: what
    // the enabled spans and events cost is part of the client's CPU.
    // `FLOOR_LOGGING=0` leaves it out, to measure what it costs.
    if measure::env_or("FLOOR_LOGGING", 1) == 1 {
        tgsync::logging::init_with(None, true, std::io::sink);
    }
    let sizes = Sizes::from_env();
    let dir = std::env::temp_dir().join(format!("tgsync-floor-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let ca_file = dir.join("ca.pem");
    let started = Instant::now();
    let child = Command::new(std::env::current_exe().expect("own path"))
        .env("TGSYNC_FLOOR_SERVE", &ca_file)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("server process");
    let mut server = measure::Reaper(child);
    let mut line = String::new();
    BufReader::new(server.0.stdout.take().expect("server stdout"))
        .read_line(&mut line)
        .expect("server ready line");
    let port: u16 = line
        .trim()
        .strip_prefix("ready ")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("server said {line:?}"));
    println!(
        "floor: {} groups x {} pods in {} namespaces, LIST pages of {PAGE_SIZE}; world built by the server (pid {}) in {:.1} s",
        sizes.groups,
        sizes.pods_per_group,
        sizes.namespaces,
        server.0.id(),
        started.elapsed().as_secs_f64()
    );
    let share = std::env::var("FLOOR_CPU_SHARE_MB").unwrap_or_else(|_| "full".to_owned());
    if share != "full" {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/bench/cpu-share.sh");
        let moved = Command::new("sh")
            .args([script, &share, "--pid", &std::process::id().to_string()])
            .status()
            .expect("cpu-share.sh runs");
        assert!(moved.success(), "cpu-share.sh {share} --pid failed (root?)");
        println!("the measured process runs at Lambda's CPU share for {share} MB");
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(bench(&sizes, port, &ca_file, &share));
    let _ = std::fs::remove_dir_all(&dir);
}

async fn bench(sizes: &Sizes, port: u16, ca_file: &std::path::Path, share: &str) {
    let base = format!("https://127.0.0.1:{port}");
    let ca_pem = std::fs::read_to_string(ca_file).expect("CA file");
    let credentials = Credentials::new(
        "AKIAIOSFODNN7EXAMPLE",
        "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        None,
        None,
        "floor",
    );
    let sdk = sdk_config(&base, ca_pem.as_bytes(), credentials.clone()).await;
    let app = engine(&base, ca_file, &sdk, None);
    let at_rest_app = engine(&base, ca_file, &sdk, Some(AT_REST_VERIFY));
    // The server does not check the bearer token; this one is as long as an EKS token.
    let bearer = format!("k8s-aws-v1.{}", "a".repeat(1200));
    let lean = lean::Lean::new(&base, &ca_pem, credentials, bearer);
    let namespaces: Vec<String> = (0..sizes.namespaces).map(|n| format!("ns-{n}")).collect();
    let arns: Vec<String> = (0..sizes.groups).map(world::arn).collect();
    let paths: Vec<Path> = std::env::var("FLOOR_PATHS")
        .unwrap_or_else(|_| "physical,sdk,tgsync".into())
        .split(',')
        .map(|p| {
            Path::parse(p).unwrap_or_else(|| {
                panic!("FLOOR_PATHS: unknown path {p:?} (physical, sdk, tgsync, rest; physical and sdk take :lists or :groups)")
            })
        })
        .collect();
    let pods = sizes.groups * sizes.pods_per_group;

    // One warm-up of each path: connections, the token, first-use allocations.
    let mut cpu: BTreeMap<String, Vec<Duration>> = BTreeMap::new();
    let mut wall: BTreeMap<String, Vec<Duration>> = BTreeMap::new();
    for round in 0..=sizes.rounds {
        for i in 0..paths.len() {
            let path = paths[(i + round) % paths.len()];
            let me = std::process::id();
            let cpu0 = cpu_share::cpu_time(me);
            let throttled0 = cpu_share::throttled(share);
            let rss_reset = measure::reset_rss_peak();
            let t = Instant::now();
            let detail = match path {
                Path::Physical(part) => {
                    let lists = async { lean.lists(&namespaces).await };
                    let groups = async { lean.groups(&arns).await };
                    check(path, part, pods, lists, groups).await
                }
                Path::Sdk(part) => {
                    let lists = adapter_floor::lists(&app.engine, &namespaces);
                    let groups = adapter_floor::group_reads(&app.engine, &arns);
                    check(path, part, pods, lists, groups).await
                }
                Path::Tgsync => verification(&app, sizes).await,
                Path::AtRest => at_rest(&at_rest_app, sizes).await,
            };
            let (c, w) = (cpu_share::cpu_time(me).saturating_sub(cpu0), t.elapsed());
            let label = if round == 0 { "warm-up" } else { "round" };
            let throttled = match share {
                "full" => String::new(),
                _ => {
                    let (n, time) = cpu_share::throttled(share);
                    format!(
                        ", throttled {} periods ({:.1} s)",
                        n.saturating_sub(throttled0.0),
                        time.saturating_sub(throttled0.1).as_secs_f64()
                    )
                }
            };
            // The round's peak RSS and what stays mapped after it.
            let mib = |field| measure::proc_status_kib(field).unwrap_or(0) as f64 / 1024.0;
            let rss = if rss_reset {
                format!(
                    ", RSS peak {:.0} MiB, after {:.0} MiB",
                    mib("VmHWM"),
                    mib("VmRSS")
                )
            } else {
                String::new()
            };
            println!(
                "{label} {round} {:>14}: CPU {:>6.0} ms, wall {:>6.0} ms{rss}{throttled}{detail}",
                path.name(),
                measure::ms(c),
                measure::ms(w)
            );
            if round > 0 {
                cpu.entry(path.name()).or_default().push(c);
                wall.entry(path.name()).or_default().push(w);
            }
        }
    }
    println!(
        "\n| path | CPU per full verification, median of {} | range | wall, median |",
        sizes.rounds
    );
    println!("|---|---|---|---|");
    for path in &paths {
        let (Some(c), Some(w)) = (cpu.get_mut(&path.name()), wall.get_mut(&path.name())) else {
            continue;
        };
        c.sort();
        w.sort();
        println!(
            "| {} | {:.2} s | {:.2}–{:.2} s | {:.1} s |",
            path.name(),
            measure::percentile(c, 0.5).as_secs_f64(),
            c[0].as_secs_f64(),
            c[c.len() - 1].as_secs_f64(),
            measure::percentile(w, 0.5).as_secs_f64()
        );
    }
}

/// The SDK configuration the Lambda builds (tgsync's loader: retries, timeouts), with the
/// default HTTPS client trusting the canned server's CA.
async fn sdk_config(base: &str, ca_pem: &[u8], credentials: Credentials) -> aws_config::SdkConfig {
    use aws_smithy_http_client::tls::{self, TlsContext, TrustStore};
    let trust = TrustStore::empty()
        .with_native_roots(false)
        .with_pem_certificate(ca_pem.to_vec());
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(
            tls::rustls_provider::CryptoMode::AwsLc,
        ))
        .tls_context(
            TlsContext::builder()
                .with_trust_store(trust)
                .build()
                .expect("TLS"),
        )
        .build_https();
    let mut loader = tgsync::aws::config_loader();
    // `FLOOR_STALLED_STREAM=0`: the SDK's stalled-stream protection off, to measure it.
    if measure::env_or("FLOOR_STALLED_STREAM", 1) == 0 {
        loader = loader.stalled_stream_protection(
            aws_config::stalled_stream_protection::StalledStreamProtectionConfig::disabled(),
        );
    }
    loader
        .http_client(http)
        .endpoint_url(base)
        .region(aws_config::Region::new(REGION))
        .credentials_provider(credentials)
        .load()
        .await
}

/// tgsync as the Lambda builds it, pointed at the canned server; the ELBv2 Describe
/// budget raised to its maximum so a round is not paced for minutes (pacing waits, it
/// costs no CPU).
fn engine(
    base: &str,
    ca_file: &std::path::Path,
    sdk: &aws_config::SdkConfig,
    verify: Option<&str>,
) -> App {
    let describes = measure::env_or("FLOOR_DESCRIBES_PER_SECOND", 100u32).to_string();
    let verify = verify.map_or_else(|| describes.clone(), str::to_owned);
    let env: BTreeMap<&str, String> = [
        ("TGSYNC_CLUSTER_NAME", CLUSTER.to_owned()),
        ("TGSYNC_TABLE_NAME", TABLE.to_owned()),
        ("TGSYNC_CLUSTER_ENDPOINT", base.to_owned()),
        ("TGSYNC_CLUSTER_CA_FILE", ca_file.display().to_string()),
        ("TGSYNC_ELB_DESCRIBES_PER_SECOND", describes.clone()),
        ("TGSYNC_VERIFY_DESCRIBES_PER_SECOND", verify),
    ]
    .into_iter()
    .collect();
    let settings = Settings::from_lookup(|k| env.get(k).cloned()).expect("settings");
    App::build(settings, sdk, Arc::new(SystemClock), "resync").expect("engine builds")
}

/// Runs the halves of a floor `part` asks for and checks each saw every pod.
async fn check(
    path: Path,
    part: Part,
    pods: usize,
    lists: impl std::future::Future<Output = usize>,
    groups: impl std::future::Future<Output = (usize, usize)>,
) -> String {
    if part != Part::Groups {
        assert_eq!(lists.await, pods, "{} listed every pod", path.name());
    }
    if part != Part::Lists {
        assert_eq!(
            groups.await,
            (pods, pods),
            "{} read every target",
            path.name()
        );
    }
    String::new()
}

/// The re-verification budget of the at-rest path: the default, 2 Describes a second of
/// a 1-minute schedule, so 120 groups a run.
const AT_REST_VERIFY: &str = "2";

/// A scheduled run of tgsync on a fleet at rest; every group must come out in sync with
/// no write, all but those due for re-verification on their checkpoints.
async fn at_rest(app: &App, sizes: &Sizes) -> String {
    let e = &app.engine;
    let (elb0, ddb0) = (e.core.groups.api_calls(), e.core.state.api_calls());
    let report = e
        .resync(&RunOptions {
            use_checkpoint: true,
            ..RunOptions::default()
        })
        .await;
    let in_sync = report
        .groups
        .iter()
        .filter(|g| g.outcome == Outcome::InSync)
        .count();
    let skipped = report
        .groups
        .iter()
        .filter(|g| g.verification_skipped)
        .count();
    let ddb = calls_since(&e.core.state.api_calls(), &ddb0);
    assert!(
        in_sync == sizes.groups && report.errors.is_empty() && !ddb.contains_key("UpdateItem"),
        "not a run at rest: {in_sync} in sync, errors {:?}, DynamoDB {ddb:?}",
        report.errors
    );
    let elb = calls_since(&e.core.groups.api_calls(), &elb0);
    format!(
        ", {in_sync} groups in sync ({skipped} on their checkpoints), ELBv2 {elb:?}, DynamoDB {ddb:?}"
    )
}

/// tgsync's full verification; every group must come out in sync with no write.
async fn verification(app: &App, sizes: &Sizes) -> String {
    let e = &app.engine;
    let (elb0, ddb0) = (e.core.groups.api_calls(), e.core.state.api_calls());
    let report = e.resync(&RunOptions::default()).await;
    let in_sync = report
        .groups
        .iter()
        .filter(|g| g.outcome == Outcome::InSync)
        .count();
    let elb = calls_since(&e.core.groups.api_calls(), &elb0);
    let ddb = calls_since(&e.core.state.api_calls(), &ddb0);
    assert!(
        in_sync == sizes.groups && report.errors.is_empty(),
        "not a zero-drift verification: {in_sync} in sync, errors {:?}",
        report.errors
    );
    format!(", {in_sync} groups in sync, ELBv2 {elb:?}, DynamoDB {ddb:?}")
}
