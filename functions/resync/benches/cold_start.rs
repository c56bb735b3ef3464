//! Benchmark (not a test): cold start of the release Lambda binaries — the time from
//! spawning the process to its first Runtime API request
//! (`GET /2018-06-01/runtime/invocation/next`), which is when Lambda's Init phase ends.
//!
//! Run: `scripts/bench.sh cold-start` (or `cargo bench -p tgsync-resync --bench
//! cold_start -- [SPAWNS]`, default 30). The Runtime API is a tiny TCP listener: accept,
//! read the request line, record the time, close. The environment is what Lambda sets
//! (runtime API as `host:port`, region, static role credentials, function name, memory,
//! version, log format) plus tgsync's required settings; no endpoint or CA overrides, so
//! the cluster is looked up with DescribeCluster on the first invocation, as deployed.
//!
//! `AWS_ENDPOINT_URL` points at a second listener that only counts connections: any AWS
//! call during init would show up there (and the first request line would not be the
//! runtime's). The binaries measured are `TGSYNC_RESYNC_BIN` / `TGSYNC_POD_EVENTS_BIN`
//! when set (scripts/bench.sh passes copies of `cargo build --release` output), else this
//! bench's `CARGO_BIN_EXE_tgsync-resync` and `target/release/tgsync-pod-events`.
//!
//! `TGSYNC_COLD_START_RUNNER` is a command the binary is started under, split on
//! whitespace: `scripts/bench.sh cold-start-arm64` sets it to `qemu-aarch64 -L
//! /usr/aarch64-linux-gnu` to start the arm64 bootstraps on an x86_64 machine. The time
//! then includes qemu's start-up and translation, so it is a pessimistic stand-in for
//! Graviton, not a measurement of it.

#[path = "../../../benches/support/measure.rs"]
mod measure;

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use measure::{ms, percentile, profile_dir};

/// Accepts connections on `listener` forever, sending each request line and the time it
/// was read.
fn runtime_api(listener: TcpListener, tx: mpsc::Sender<(Instant, String)>) {
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let mut line = String::new();
            let mut reader = BufReader::new(stream);
            if reader.read_line(&mut line).is_ok() {
                let at = Instant::now();
                let _ = tx.send((at, line.trim_end().to_owned()));
            }
            // Dropping the stream closes the connection: the runtime sees an error, which
            // does not matter, the process is killed next.
        }
    });
}

/// Counts connections to a listener standing in for every AWS endpoint.
fn trap(listener: TcpListener, hits: Arc<AtomicUsize>) {
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            hits.fetch_add(1, Ordering::SeqCst);
            drop(stream);
        }
    });
}

struct Measured {
    name: &'static str,
    bin: PathBuf,
    times: Vec<Duration>,
    first_lines: Vec<String>,
    aws_connections: usize,
}

/// The command that starts `bin`: the binary itself, or `runner` with `bin` appended.
fn command(runner: &[String], bin: &Path) -> Command {
    match runner.split_first() {
        Some((program, args)) => {
            let mut cmd = Command::new(program);
            cmd.args(args).arg(bin);
            cmd
        }
        None => Command::new(bin),
    }
}

fn measure(name: &'static str, bin: &Path, runner: &[String], spawns: usize) -> Measured {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = mpsc::channel();
    runtime_api(listener, tx);
    let trap_listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let trap_port = trap_listener.local_addr().unwrap().port();
    let hits = Arc::new(AtomicUsize::new(0));
    trap(trap_listener, hits.clone());

    let mut times = Vec::with_capacity(spawns);
    let mut first_lines = Vec::new();
    for _ in 0..spawns {
        let mut cmd = command(runner, bin);
        cmd.env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("LANG", "en_US.UTF-8")
            .env("TZ", ":UTC")
            .env("LAMBDA_TASK_ROOT", "/var/task")
            .env("LAMBDA_RUNTIME_DIR", "/var/runtime")
            .env("AWS_LAMBDA_RUNTIME_API", format!("127.0.0.1:{port}"))
            .env("AWS_LAMBDA_FUNCTION_NAME", format!("tgsync-{name}"))
            .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
            .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "256")
            .env(
                "AWS_LAMBDA_LOG_GROUP_NAME",
                format!("/aws/lambda/tgsync-{name}"),
            )
            .env(
                "AWS_LAMBDA_LOG_STREAM_NAME",
                "2026/11/21/[$LATEST]0123456789abcdef",
            )
            .env("AWS_LAMBDA_LOG_FORMAT", "JSON")
            .env("AWS_LAMBDA_LOG_LEVEL", "INFO")
            .env("AWS_LAMBDA_INITIALIZATION_TYPE", "on-demand")
            .env("AWS_EXECUTION_ENV", "AWS_Lambda_provided.al2023")
            .env("AWS_REGION", "us-east-1")
            .env("AWS_DEFAULT_REGION", "us-east-1")
            .env("AWS_ACCESS_KEY_ID", "ASIAEXAMPLEEXAMPLE00")
            .env(
                "AWS_SECRET_ACCESS_KEY",
                "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            )
            .env("AWS_SESSION_TOKEN", "IQoJb3JpZ2luX2VjEXAMPLETOKEN")
            .env("AWS_ENDPOINT_URL", format!("http://127.0.0.1:{trap_port}"))
            .env("TGSYNC_CLUSTER_NAME", "prod")
            .env("TGSYNC_TABLE_NAME", "tgsync-state")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let started = Instant::now();
        let mut child = cmd.spawn().expect("spawn the function binary");
        let got = rx.recv_timeout(Duration::from_secs(10));
        let _ = child.kill();
        let _ = child.wait();
        let (at, line) = got.unwrap_or_else(|_| {
            panic!("{} made no Runtime API request within 10 s", bin.display())
        });
        times.push(at - started);
        if !first_lines.contains(&line) {
            first_lines.push(line);
        }
        // Let the listener drain any retry the runtime sent before it was killed.
        std::thread::sleep(Duration::from_millis(20));
        while rx.try_recv().is_ok() {}
    }
    Measured {
        name,
        bin: bin.to_path_buf(),
        times,
        first_lines,
        aws_connections: hits.load(Ordering::SeqCst),
    }
}

fn size_mib(path: &Path) -> Option<f64> {
    std::fs::metadata(path)
        .ok()
        .map(|m| m.len() as f64 / (1024.0 * 1024.0))
}

fn main() {
    let spawns: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(30);
    let resync = std::env::var_os("TGSYNC_RESYNC_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_tgsync-resync")));
    let pod_events = std::env::var_os("TGSYNC_POD_EVENTS_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| profile_dir().join("tgsync-pod-events"));
    let runner: Vec<String> = std::env::var("TGSYNC_COLD_START_RUNNER")
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    if !runner.is_empty() {
        println!("started under: {}", runner.join(" "));
    }
    let mut results = vec![measure("resync", &resync, &runner, spawns)];
    if pod_events.exists() {
        results.push(measure("pod-events", &pod_events, &runner, spawns));
    } else {
        println!(
            "({} not built; `cargo build --release -p tgsync-pod-events` to include it)",
            pod_events.display()
        );
    }
    println!("\ncold start: spawn → first Runtime API request, {spawns} spawns each\n");
    println!("| binary | size | min | p50 | p90 | max | goal < 50 ms |");
    println!("|---|---|---|---|---|---|---|");
    for m in &results {
        let mut sorted = m.times.clone();
        sorted.sort();
        let p50 = percentile(&sorted, 0.5);
        println!(
            "| tgsync-{} | {:.1} MiB | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} ms | {} |",
            m.name,
            size_mib(&m.bin).unwrap_or(0.0),
            ms(sorted[0]),
            ms(p50),
            ms(percentile(&sorted, 0.9)),
            ms(sorted[sorted.len() - 1]),
            if p50 < Duration::from_millis(50) {
                "met"
            } else {
                "missed"
            }
        );
    }
    for m in &results {
        println!(
            "\n{}: {}\n  first request line(s): {:?}\n  connections to AWS_ENDPOINT_URL before it: {}",
            m.name,
            m.bin.display(),
            m.first_lines,
            m.aws_connections
        );
    }
}
