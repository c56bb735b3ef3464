//! Benchmark (not a test): a full resync at scale — 1,000 bound IP target groups holding
//! 100,000 ready pods in 10 namespaces (100 pods per group, label `app=svc-N`) — with the
//! production adapters against moto's server (with partition-local Query:
//! `scripts/bench/moto_server.py`) and the Kubernetes API emulator. The pods are
//! realistic (`PodBuilder::realistic`: managedFields, two containers with env, container
//! statuses; about 4.5 KB of JSON each, printed with the seed file), so LIST decoding
//! costs what it costs against a real cluster.
//!
//! Run: `scripts/bench.sh scale` (or `cargo bench --bench scale` with the venv present).
//! Sizes: `SCALE_GROUPS` (default 1000), `SCALE_PODS_PER_GROUP` (100),
//! `SCALE_NAMESPACES` (10), `SCALE_ROUNDS` (zero-drift rounds measured, default 3).
//!
//! The emulator runs as a separate process (the `kube-emulator` binary, built in release
//! by `scripts/bench.sh scale`), seeded with `--seed` from a generated PodList JSON file,
//! so this process holds only tgsync: its heap and RSS are what is measured.
//!
//! Steps: create the groups in moto (tagged for a fresh cluster), converge once with an
//! engine whose mutation rate and concurrency are raised for setup (this registers every
//! target), then measure zero-drift full resyncs with an engine built as the Lambda
//! builds it (defaults: concurrency 16, 5 mutations/s, LIST pages of 500): wall time,
//! peak heap (counting allocator around mimalloc), peak RSS (`VmHWM`, reset through
//! `/proc/self/clear_refs` before each run), CPU time, and API calls by kind. Kubernetes requests
//! are counted from the emulator's own request log (its `debug` line per request).

#[path = "support/adapter_floor.rs"]
mod adapter_floor;
#[path = "support/cpu_share.rs"]
#[allow(dead_code)]
mod cpu_share;
#[path = "support/heap.rs"]
mod heap;
#[path = "support/measure.rs"]
mod measure;
#[path = "../tests/support/moto.rs"]
mod moto;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::{Duration, Instant};

use aws_sdk_elasticloadbalancingv2::types::{ProtocolEnum, Tag, TargetTypeEnum};
use futures::StreamExt;
use measure::{proc_status_kib, proc_status_kib_of};
use tgsync::app::{App, LiveEngine};
use tgsync::clock::SystemClock;
use tgsync::config::Settings;
use tgsync::core::UnixMillis;
use tgsync::input::resync::ResyncRequest;
use tgsync::reconcile::RunOptions;
use tgsync::report::{Outcome, Report};
use tgsync::testkit::{PodBuilder, calls_since};

#[global_allocator]
static ALLOC: heap::Counting = heap::Counting;

const MIB: f64 = 1024.0 * 1024.0;

/// Heap and RSS peaks of one measured phase.
struct Memory {
    heap_before: isize,
    heap_peak: isize,
    rss_before_kib: u64,
    rss_peak_kib: Option<u64>,
}

/// Starts a measured phase: the heap peak restarts from the current heap, and the RSS
/// high-water mark from the current RSS (`echo 5 > /proc/self/clear_refs`, Linux >= 4.0).
fn memory_start() -> (isize, u64, bool) {
    note_hwm();
    let now = heap::restart_peak();
    let reset = measure::reset_rss_peak();
    (now, proc_status_kib("VmRSS").unwrap_or(0), reset)
}

fn memory_end((heap_before, rss_before_kib, reset): (isize, u64, bool)) -> Memory {
    note_hwm();
    Memory {
        heap_before,
        heap_peak: heap::peak(),
        rss_before_kib,
        rss_peak_kib: if reset {
            proc_status_kib("VmHWM")
        } else {
            None
        },
    }
}

/// The highest `VmHWM` seen across resets (the whole bench's peak RSS).
static MAX_HWM_KIB: AtomicIsize = AtomicIsize::new(0);

fn note_hwm() {
    if let Some(kib) = proc_status_kib("VmHWM") {
        MAX_HWM_KIB.fetch_max(kib as isize, Ordering::Relaxed);
    }
}

impl std::fmt::Display for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "peak heap {:.1} MiB (+{:.1} MiB over the {:.1} MiB before the run)",
            self.heap_peak as f64 / MIB,
            (self.heap_peak - self.heap_before) as f64 / MIB,
            self.heap_before as f64 / MIB
        )?;
        match self.rss_peak_kib {
            Some(kib) => write!(
                f,
                ", peak RSS {:.1} MiB (RSS {:.1} MiB before)",
                kib as f64 / 1024.0,
                self.rss_before_kib as f64 / 1024.0
            ),
            None => write!(f, ", peak RSS not resettable here"),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Sizes.

#[derive(Clone, Copy, Debug)]
struct Sizes {
    groups: usize,
    pods_per_group: usize,
    namespaces: usize,
    rounds: usize,
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(default)
}

impl Sizes {
    fn from_env() -> Self {
        Self {
            groups: env_usize("SCALE_GROUPS", 1000),
            pods_per_group: env_usize("SCALE_PODS_PER_GROUP", 100),
            namespaces: env_usize("SCALE_NAMESPACES", 10),
            rounds: env_usize("SCALE_ROUNDS", 3),
        }
    }
    fn pods(&self) -> usize {
        self.groups * self.pods_per_group
    }
    /// Pods in each namespace (groups are spread round-robin).
    fn pods_in_namespace(&self, ns: usize) -> usize {
        (0..self.groups)
            .filter(|g| g % self.namespaces == ns)
            .count()
            * self.pods_per_group
    }
}

const PAGE_SIZE: u32 = 500;

fn namespace_of(group: usize, sizes: &Sizes) -> String {
    format!("ns-{}", group % sizes.namespaces)
}

fn pod_ip(i: usize) -> String {
    Ipv4Addr::from(0x0a01_0000u32 + 1 + i as u32).to_string()
}

/// Writes the seed PodList (all pods ready, `app=svc-N`, port `http`=8080, otherwise as
/// a real LIST returns them: `PodBuilder::realistic`) one pod at a time, so this process
/// never holds them all. Returns the average size of a pod's JSON, in bytes.
fn write_seed(path: &Path, sizes: &Sizes) -> usize {
    let file = std::fs::File::create(path).expect("create seed file");
    let mut out = BufWriter::new(file);
    out.write_all(br#"{"apiVersion":"v1","kind":"PodList","metadata":{},"items":["#)
        .unwrap();
    let mut first = true;
    let mut pod_bytes = 0usize;
    for g in 0..sizes.groups {
        let ns = namespace_of(g, sizes);
        let app = format!("svc-{g}");
        for p in 0..sizes.pods_per_group {
            let i = g * sizes.pods_per_group + p;
            let pod = PodBuilder::new(&ns, &format!("svc-{g}-{p}"))
                .label("app", &app)
                .ip(&pod_ip(i))
                .realistic()
                .build();
            if !first {
                out.write_all(b",").unwrap();
            }
            first = false;
            let json = serde_json::to_vec(&pod).unwrap();
            pod_bytes += json.len();
            out.write_all(&json).unwrap();
        }
    }
    out.write_all(b"]}").unwrap();
    out.flush().unwrap();
    pod_bytes / sizes.pods().max(1)
}

// ---------------------------------------------------------------------------------------
// The emulator process.

/// The emulator's command-line flags.
struct EmulatorArgs {
    seed: PathBuf,
    ca_out: PathBuf,
    cluster: String,
    sts_hosts: Vec<String>,
}

impl EmulatorArgs {
    fn to_args(&self) -> Vec<String> {
        let mut args: Vec<String> = vec![
            "--seed".into(),
            self.seed.display().to_string(),
            "--ca-out".into(),
            self.ca_out.display().to_string(),
            "--cluster-name".into(),
            self.cluster.clone(),
            "--credentials".into(),
            "testing:testing".into(),
            "--region".into(),
            moto::REGION.into(),
            "--log".into(),
            "debug".into(),
        ];
        for host in &self.sts_hosts {
            args.push("--allowed-sts-host".into());
            args.push(host.clone());
        }
        args
    }
}

/// A running `kube-emulator` process; killed on drop.
struct EmulatorProcess {
    child: Child,
    ready: std::sync::mpsc::Receiver<(String, Instant)>,
    log: PathBuf,
    spawned: Instant,
}

impl Drop for EmulatorProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl EmulatorProcess {
    fn spawn(args: &EmulatorArgs, log: PathBuf) -> Self {
        let bin = std::env::var_os("KUBE_EMULATOR_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| measure::profile_dir().join("kube-emulator"));
        assert!(
            bin.exists(),
            "{} not found: `cargo build --release -p kube-emulator` (scripts/bench.sh scale does)",
            bin.display()
        );
        let stderr = std::fs::File::create(&log).expect("emulator log file");
        let mut child = Command::new(bin)
            .args(args.to_args())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("start the emulator");
        // The ready line is timestamped when it arrives, while this process is busy
        // creating target groups.
        let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let (tx, ready) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = stdout.read_line(&mut line);
            let _ = tx.send((line, Instant::now()));
            // Keep draining so the child never blocks on a full pipe.
            let mut sink = Vec::new();
            let _ = stdout.read_to_end(&mut sink);
        });
        Self {
            child,
            ready,
            log,
            spawned: Instant::now(),
        }
    }

    /// Waits for the ready line (the base URL); returns it and the time since spawn.
    fn wait_ready(&mut self) -> (String, Duration) {
        let (line, at) = self
            .ready
            .recv()
            .unwrap_or_else(|_| (String::new(), Instant::now()));
        let url = line.trim().to_owned();
        assert!(
            url.starts_with("http"),
            "emulator did not start: {:?}; log {}:\n{}",
            line,
            self.log.display(),
            std::fs::read_to_string(&self.log).unwrap_or_default()
        );
        (url, at - self.spawned)
    }

    fn rss_mib(&self) -> (f64, f64) {
        let pid = self.child.id().to_string();
        let kib = |f| proc_status_kib_of(&pid, f).unwrap_or(0) as f64 / 1024.0;
        (kib("VmRSS"), kib("VmHWM"))
    }

    /// Requests the emulator has logged so far, as `(method, path_and_query)`.
    fn requests(&self) -> Vec<(String, String)> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines()
            .filter(|l| l.contains(": request method="))
            .filter_map(|l| {
                let field = |name: &str| {
                    l.split_whitespace()
                        .find_map(|w| w.strip_prefix(name))
                        .map(|v| v.trim_matches('"').to_owned())
                };
                Some((field("method=")?, field("path_and_query=")?))
            })
            .collect()
    }
}

/// LIST requests (GET on a namespace's `pods` collection) among `requests`, per namespace.
fn list_pages(requests: &[(String, String)]) -> BTreeMap<String, usize> {
    let mut pages = BTreeMap::new();
    for (method, pq) in requests {
        let path = pq.split('?').next().unwrap_or(pq);
        let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        if method == "GET"
            && let ["api", "v1", "namespaces", ns, "pods"] = parts.as_slice()
        {
            *pages.entry((*ns).to_owned()).or_default() += 1;
        }
    }
    pages
}

// ---------------------------------------------------------------------------------------
// AWS side.

struct Cluster {
    name: String,
    url: String,
    ca_file: PathBuf,
    table: String,
}

/// The engine exactly as the Lambda builds it (`tgsync::app::App::build` from settings
/// read through the same parser as the environment), plus `extra` settings.
fn engine(c: &Cluster, sdk: &aws_config::SdkConfig, extra: &[(&str, &str)]) -> App {
    let mut env: BTreeMap<String, String> = [
        ("TGSYNC_CLUSTER_NAME", c.name.as_str()),
        ("TGSYNC_TABLE_NAME", c.table.as_str()),
        ("TGSYNC_CLUSTER_ENDPOINT", c.url.as_str()),
        ("TGSYNC_CLUSTER_CA_FILE", c.ca_file.to_str().unwrap()),
        ("TGSYNC_PAGE_SIZE", &PAGE_SIZE.to_string()),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    for (k, v) in extra {
        env.insert(k.to_string(), v.to_string());
    }
    let settings = Settings::from_lookup(|k| env.get(k).cloned()).expect("settings");
    App::build(settings, sdk, Arc::new(SystemClock), "resync").expect("engine builds")
}

async fn create_groups(sdk: &aws_config::SdkConfig, cluster: &str, sizes: &Sizes) -> usize {
    let elb = aws_sdk_elasticloadbalancingv2::Client::new(sdk);
    let vpc = moto::vpc_id().to_owned();
    let tag = |k: &str, v: &str| Tag::builder().key(k).value(v).build();
    futures::stream::iter(0..sizes.groups)
        .map(|g| {
            let elb = elb.clone();
            let vpc = vpc.clone();
            let tags = vec![
                tag("tgsync/cluster", cluster),
                tag("tgsync/namespace", &namespace_of(g, sizes)),
                tag("tgsync/selector", &format!("app=svc-{g}")),
            ];
            let name = format!("sc{:x}-{g}", std::process::id());
            async move {
                elb.create_target_group()
                    .name(name)
                    .protocol(ProtocolEnum::Tcp)
                    .port(8080)
                    .vpc_id(vpc)
                    .target_type(TargetTypeEnum::Ip)
                    .set_tags(Some(tags))
                    .send()
                    .await
                    .expect("target group created")
            }
        })
        .buffer_unordered(8)
        .count()
        .await
}

/// CPU time (user + system, every thread) this process has used.
fn cpu_time() -> Duration {
    cpu_share::cpu_time(std::process::id())
}

/// One measured resync: report, wall time, memory, ELBv2 and DynamoDB calls, LIST pages.
struct Run {
    report: Report,
    wall: Duration,
    cpu: Duration,
    memory: Memory,
    elb: BTreeMap<&'static str, u64>,
    ddb: BTreeMap<&'static str, u64>,
    lists: BTreeMap<String, usize>,
    other_k8s: usize,
}

async fn measured(engine: &LiveEngine, emulator: &EmulatorProcess, opts: &RunOptions) -> Run {
    let (elb0, ddb0) = (
        engine.core.groups.api_calls(),
        engine.core.state.api_calls(),
    );
    let logged0 = emulator.requests().len();
    let mem = memory_start();
    let cpu0 = cpu_time();
    let started = Instant::now();
    let report = engine.resync(opts).await;
    let wall = started.elapsed();
    let cpu = cpu_time().saturating_sub(cpu0);
    let memory = memory_end(mem);
    let requests = emulator.requests();
    let new = &requests[logged0.min(requests.len())..];
    let lists = list_pages(new);
    let other_k8s = new.len() - lists.values().sum::<usize>();
    Run {
        report,
        wall,
        cpu,
        memory,
        elb: calls_since(&engine.core.groups.api_calls(), &elb0),
        ddb: calls_since(&engine.core.state.api_calls(), &ddb0),
        lists,
        other_k8s,
    }
}

/// The floor of a zero-drift full verification: the same requests made straight through
/// the production adapters, with no engine (no plan, no ledger logic, no report):
/// discovery, every namespace's LIST decoded (4 namespaces at a time), then the groups'
/// states in batched consistent reads and one DescribeTargetHealth per group (16 groups
/// at a time, as the engine's concurrency), paced by the same Describe limiter. CPU and
/// wall time.
async fn floor(live: &App, sizes: &Sizes) -> (Duration, Duration) {
    use tgsync::groups::TargetGroupApi as _;
    let e = &live.engine;
    let cpu0 = cpu_time();
    let started = Instant::now();
    let arns: Vec<String> = e
        .core
        .groups
        .discover(&tgsync::groups::Priority::Reaction)
        .await
        .expect("discovery")
        .into_iter()
        .map(|g| g.arn)
        .collect();
    let namespaces: Vec<String> = (0..sizes.namespaces).map(|n| format!("ns-{n}")).collect();
    let pods = adapter_floor::lists(e, &namespaces).await;
    assert_eq!(pods, sizes.pods(), "the floor listed every pod");
    adapter_floor::group_reads(e, &arns).await;
    (cpu_time().saturating_sub(cpu0), started.elapsed())
}

fn count(report: &Report, outcome: Outcome) -> usize {
    report
        .groups
        .iter()
        .filter(|g| g.outcome == outcome)
        .count()
}

fn outcomes(report: &Report) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for g in &report.groups {
        *m.entry(format!("{:?}", g.outcome)).or_default() += 1;
    }
    m
}

fn print_calls(run: &Run) {
    let pods: usize = run.report.groups.iter().map(|g| g.desired).sum();
    println!(
        "  tgsync CPU time (user + system) {:.2} s in {:.1} s of wall time ({:.1} ms per 1,000 desired pods)",
        run.cpu.as_secs_f64(),
        run.wall.as_secs_f64(),
        run.cpu.as_secs_f64() * 1e6 / pods.max(1) as f64
    );
    for (k, v) in &run.elb {
        println!("  elasticloadbalancing:{k} = {v}");
    }
    for (k, v) in &run.ddb {
        println!("  dynamodb:{k} = {v}");
    }
    let pages: usize = run.lists.values().sum();
    println!(
        "  kubernetes LIST pods pages = {pages} ({} namespaces: {:?}); other Kubernetes requests = {}",
        run.lists.len(),
        run.lists.values().collect::<Vec<_>>(),
        run.other_k8s
    );
}

fn main() {
    // Cargo passes `--bench`; nothing else is read from the command line. The runtime is
    // the functions' (`current_thread`), or `SCALE_RUNTIME=multi` for comparison.
    let runtime = match std::env::var("SCALE_RUNTIME").as_deref() {
        Ok("multi") => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap(),
        _ => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap(),
    };
    println!(
        "runtime: {}",
        if std::env::var("SCALE_RUNTIME").as_deref() == Ok("multi") {
            "multi-thread"
        } else {
            "current-thread (as the Lambda functions run)"
        }
    );
    runtime.block_on(bench(Sizes::from_env()));
}

async fn bench(sizes: Sizes) {
    tgsync::app::install_crypto_provider();
    let t_all = Instant::now();
    println!(
        "scale: {} groups x {} pods = {} pods in {} namespaces, LIST page {PAGE_SIZE}; {} zero-drift rounds",
        sizes.groups,
        sizes.pods_per_group,
        sizes.pods(),
        sizes.namespaces,
        sizes.rounds
    );
    let cluster_name = moto::unique("scale");
    let dir = std::env::temp_dir().join(&cluster_name);
    std::fs::create_dir_all(&dir).unwrap();
    let seed = dir.join("pods.json");
    let t = Instant::now();
    let pod_size = write_seed(&seed, &sizes);
    println!(
        "seed file: {:.1} MiB written in {:.1} s; realistic pods, {pod_size} bytes of JSON each on average",
        std::fs::metadata(&seed).unwrap().len() as f64 / MIB,
        t.elapsed().as_secs_f64()
    );

    // The emulator seeds itself while moto gets its groups.
    let moto_host = moto::endpoint().trim_start_matches("http://").to_owned();
    let emulator_args = EmulatorArgs {
        seed: seed.clone(),
        ca_out: dir.join("ca.pem"),
        cluster: cluster_name.clone(),
        // The token names the STS endpoint from AWS_ENDPOINT_URL(_STS), else the
        // regional one; the emulator verifies the signature offline either way.
        sts_hosts: vec![
            moto_host,
            format!("sts.{}.amazonaws.com", moto::REGION),
            "sts.amazonaws.com".to_owned(),
        ],
    };
    let mut emulator = EmulatorProcess::spawn(&emulator_args, dir.join("emulator.log"));

    let sdk = moto::sdk_config().await;
    let table = moto::unique("tgsync-scale");
    tgsync::aws::create_table(&aws_sdk_dynamodb::Client::new(&sdk), &table)
        .await
        .expect("table created");
    let t = Instant::now();
    let created = create_groups(&sdk, &cluster_name, &sizes).await;
    println!(
        "moto: {created} target groups created in {:.1} s",
        t.elapsed().as_secs_f64()
    );

    let (url, ready_after) = emulator.wait_ready();
    let (rss, hwm) = emulator.rss_mib();
    println!(
        "emulator (kube-emulator process, pid {}): ready after {:.1} s with {} pods at {url}; RSS {rss:.0} MiB (peak {hwm:.0} MiB)",
        emulator.child.id(),
        ready_after.as_secs_f64(),
        sizes.pods()
    );
    let cluster = Cluster {
        name: cluster_name.clone(),
        url,
        ca_file: emulator_args.ca_out.clone(),
        table,
    };

    // Converge once, with setup-only settings (raised rates and concurrency).
    let setup_settings = [
        ("TGSYNC_ELB_MUTATIONS_PER_SECOND", "100"),
        ("TGSYNC_ELB_DESCRIBES_PER_SECOND", "100"),
        ("TGSYNC_CONCURRENCY", "32"),
    ];
    let setup = engine(&cluster, &sdk, &setup_settings);
    println!("\nsetup engine settings: {:?}", setup.settings);
    let first = measured(&setup.engine, &emulator, &RunOptions::default()).await;
    let registered = first.report.totals.registered;
    println!(
        "converging run: {:.1} s, {} registered, {}, outcomes {:?}",
        first.wall.as_secs_f64(),
        registered,
        first.memory,
        outcomes(&first.report)
    );
    print_calls(&first);
    if !first.report.errors.is_empty() {
        println!("  errors: {:?}", first.report.errors);
    }
    assert_eq!(
        registered,
        sizes.pods(),
        "converging run did not register every pod: {:?}",
        first.report.totals
    );
    drop(first);
    drop(setup);

    // Zero-drift rounds with the engine as the Lambda builds it (default settings),
    // full verification (`RunOptions::default()`: every group's health is read).
    let live = engine(&cluster, &sdk, &[]);
    println!("\nproduction engine settings: {:?}", live.settings);
    let mut runs = Vec::new();
    for round in 1..=sizes.rounds {
        let run = measured(&live.engine, &emulator, &RunOptions::default()).await;
        let in_sync = count(&run.report, Outcome::InSync);
        println!(
            "\nzero-drift round {round}, full verification: {:.1} s, {in_sync}/{} groups in sync, {}",
            run.wall.as_secs_f64(),
            run.report.groups.len(),
            run.memory
        );
        print_calls(&run);
        if !run.report.errors.is_empty() || in_sync != sizes.groups {
            println!(
                "  NOT CLEAN: outcomes {:?}, errors {:?}",
                outcomes(&run.report),
                run.report.errors
            );
        }
        runs.push(run);
    }

    // Two runs as the schedule invokes them: the scheduled event's options and the
    // resync function's deadline (template.yaml: Timeout 180 s). Every group's desired
    // set is already checkpointed by the converging run, so each run re-verifies only the
    // groups whose turn in the Describe budget has come.
    let scheduled: serde_json::Value =
        serde_json::from_str(include_str!("../events/scheduled.json")).unwrap();
    for tick in 1..=2 {
        let mut opts = ResyncRequest::parse(&scheduled)
            .expect("scheduled event")
            .options();
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        opts.deadline = Some(UnixMillis(now_ms + 180_000));
        let sched = measured(&live.engine, &emulator, &opts).await;
        println!(
            "\nscheduled run {tick} ({opts:?}, deadline 180 s after start): {:.1} s, outcomes {:?}, {}, verification {:?}",
            sched.wall.as_secs_f64(),
            outcomes(&sched.report),
            sched.memory,
            sched.report.verification
        );
        print_calls(&sched);
        if !sched.report.errors.is_empty() {
            println!("  errors: {:?}", sched.report.errors);
        }
    }

    // The floor: what a zero-drift full verification cannot avoid, with no engine.
    let mut floors = Vec::new();
    for round in 1..=sizes.rounds.min(3) {
        let (cpu, wall) = floor(&live, &sizes).await;
        println!(
            "\nfloor {round} (discovery, every namespace's LIST decoded, the states read in batches and one DescribeTargetHealth per group, no engine): \
             tgsync CPU {:.2} s in {:.1} s of wall time",
            cpu.as_secs_f64(),
            wall.as_secs_f64()
        );
        floors.push(cpu);
    }
    floors.sort();
    let rounds_cpu = {
        let mut v: Vec<Duration> = runs.iter().map(|r| r.cpu).collect();
        v.sort();
        v[v.len() / 2]
    };
    if let Some(f) = floors.get(floors.len() / 2) {
        println!(
            "median CPU: zero-drift round {:.2} s, floor {:.2} s: {:.2}x the floor",
            rounds_cpu.as_secs_f64(),
            f.as_secs_f64(),
            rounds_cpu.as_secs_f64() / f.as_secs_f64().max(1e-9)
        );
    }

    let (rss, hwm) = emulator.rss_mib();
    println!("\nemulator process: RSS {rss:.0} MiB, peak {hwm:.0} MiB");

    // Floors and the verdict, from the last round.
    let last = runs.last().expect("at least one round");
    let per_ns_floor: Vec<usize> = (0..sizes.namespaces)
        .map(|ns| sizes.pods_in_namespace(ns).div_ceil(PAGE_SIZE as usize))
        .collect();
    let list_floor: usize = per_ns_floor.iter().sum();
    let list_pages: usize = last.lists.values().sum();
    let get = |m: &BTreeMap<&'static str, u64>, k: &str| m.get(k).copied().unwrap_or(0) as usize;
    println!("\n| API | calls | floor | |");
    println!("|---|---|---|---|");
    let row = |name: &str, got: usize, floor: usize, note: &str| {
        let verdict = if got <= floor {
            "at floor"
        } else {
            "ABOVE floor"
        };
        println!("| {name} | {got} | {floor} | {verdict}{note} |");
    };
    row(
        "elasticloadbalancing:DescribeTargetGroups",
        get(&last.elb, "DescribeTargetGroups"),
        created.div_ceil(400),
        " (moto returns every group in one page, ignoring PageSize)",
    );
    row(
        "elasticloadbalancing:DescribeTags",
        get(&last.elb, "DescribeTags"),
        created.div_ceil(20),
        "",
    );
    row(
        "elasticloadbalancing:DescribeTargetHealth",
        get(&last.elb, "DescribeTargetHealth"),
        sizes.groups,
        "",
    );
    row(
        "elasticloadbalancing:Register/DeregisterTargets",
        get(&last.elb, "RegisterTargets") + get(&last.elb, "DeregisterTargets"),
        0,
        "",
    );
    row("kubernetes LIST pods (pages)", list_pages, list_floor, "");
    for (k, v) in &last.ddb {
        // A resync reads each namespace's groups' states in batched consistent reads (16
        // groups twice, then as many as its looks take in 2.5 s: all of the rest at the
        // setup's Describe pace); a zero-drift run writes nothing.
        let per_namespace = sizes.groups.div_ceil(sizes.namespaces.max(1));
        let floor = if *k == "BatchGetItem" {
            sizes.namespaces
                * (1 + usize::from(per_namespace > 16)
                    + per_namespace.saturating_sub(32).div_ceil(100))
        } else {
            0
        };
        row(&format!("dynamodb:{k}"), *v as usize, floor, "");
    }
    if sizes.groups != 1000 || sizes.pods_per_group != 100 || sizes.namespaces != 10 {
        let g = 1000usize;
        println!(
            "\ncomputed for 1,000 groups x 100 pods in 10 namespaces (the counts are linear; not measured): \
             DescribeTargetGroups {} (real paging), DescribeTags {}, DescribeTargetHealth {g}, \
             LIST pages {}, DynamoDB BatchGetItem {}, no write",
            g.div_ceil(400),
            g.div_ceil(20),
            10 * (10_000usize.div_ceil(PAGE_SIZE as usize)),
            30
        );
    }
    note_hwm();
    println!(
        "\nthis process: peak RSS over the whole bench {:.1} MiB (includes setup); total bench time {:.0} s",
        MAX_HWM_KIB.load(Ordering::Relaxed) as f64 / 1024.0,
        t_all.elapsed().as_secs_f64()
    );
    let walls: Vec<String> = runs
        .iter()
        .map(|r| format!("{:.1} s", r.wall.as_secs_f64()))
        .collect();
    println!("zero-drift wall times: {}", walls.join(", "));
    let _ = std::fs::remove_file(&seed);
}
