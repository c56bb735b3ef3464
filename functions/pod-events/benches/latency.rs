//! Benchmark (not a test): warm latency of the built `tgsync-pod-events` binary under
//! `cargo lambda watch`, from the Invoke API request to its response, for `Started`
//! events of ready pods. The handler answers only after RegisterTargets has completed, so
//! the response time is "invoke to target registered". AWS is moto's server, Kubernetes
//! the emulator (HTTPS, verified EKS token), on this machine.
//!
//! Run: `scripts/bench.sh pod-events` (or `cargo bench -p tgsync-pod-events --bench
//! latency -- [EVENTS]` with the venv present; default 220 events, 10 warm-up).
//! `TGSYNC_GROUP_TARGETS=N` registers N ready pods first (an in-process resync), so the
//! events add to a group of N targets; `TGSYNC_CPU_SHARE_MB=256` runs the function at
//! Lambda's CPU share for that memory size (`scripts/bench/cpu-share.sh`, needs root).
//! `TGSYNC_POD_EVENTS_BIN` runs another build of the function binary.
//! `TGSYNC_EVENT_GAP_MS=N` waits N ms after each response before the next event (default
//! 0: back to back, where the function's mutation pace bounds each event: one
//! RegisterTargets per pace period); `TGSYNC_FUNCTION_ENV="K=V,K=V"` adds settings to the
//! function's environment (e.g. the template's `TGSYNC_BUDGET_SHARE=0.3,TGSYNC_MAX_CONTAINERS=2`).
//! `TGSYNC_OTHER_GROUPS=N` adds N groups of this cluster bound in other namespaces: what
//! a discovery of the account reads besides the events' group (pod-events keeps its
//! bindings a minute, so run the events over more than a minute to see one).
//! Besides the round trip, the function's own `durationMs` (from its report) is shown:
//! their difference is time spent outside the handler's timer. The function reaches moto
//! through a transparent recording proxy, so each AWS operation's calls per event and
//! the time moto took to answer them are shown too (the rest of an event's time is the
//! function's own: Kubernetes calls, pacing waits, CPU).

#[path = "../../../tests/support/chaos_proxy.rs"]
mod chaos_proxy;
#[path = "../../../benches/support/cpu_share.rs"]
mod cpu_share;
#[path = "../../../benches/support/measure.rs"]
mod measure;
#[path = "../../../tests/support/moto.rs"]
mod moto;
#[path = "../../../tests/support/world.rs"]
mod world;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use measure::{Reaper, env_or, ms, percentile};

use serde_json::{Value, json};
use tgsync::testkit::PodBuilder;
use world::World;

fn cargo_lambda() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    std::env::var_os("TGSYNC_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join(".venv"))
        .join("bin/cargo-lambda")
}

/// POSTs to the Lambda Invoke API and returns the response body.
fn invoke(port: u16, body: &str) -> String {
    let mut stream =
        TcpStream::connect(("127.0.0.1", port)).expect("connect to cargo lambda watch");
    let request = format!(
        "POST /2015-03-31/functions/_/invocations HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).expect("send");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read");
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    assert!(
        head.starts_with("HTTP/1.1 200"),
        "invoke failed: {response}"
    );
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_owned()
    }
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        body = &rest[n + 2..];
    }
    out
}

fn started_event(cluster: &str, pod: &str) -> String {
    let mut ev: Value =
        serde_json::from_str(include_str!("../../../events/pod-started.json")).unwrap();
    ev["detail"]["clusterName"] = json!(cluster);
    ev["detail"]["involvedObject"]["name"] = json!(pod);
    ev.to_string()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() {
    let events: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(220);
    let warmup = 10;
    let w = World::new().await;
    let arn = w.group("shop", "app=web", 8080, &[]).await;
    let others: usize = env_or("TGSYNC_OTHER_GROUPS", 0);
    for i in 0..others {
        w.group(&format!("other-{i}"), "app=x", 8080, &[]).await;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let _watch = Reaper(
        Command::new(cargo_lambda())
            .args([
                "lambda",
                "watch",
                "--only-lambda-apis",
                "--invoke-address",
                "127.0.0.1",
                "--invoke-port",
            ])
            .arg(port.to_string())
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("cargo lambda watch (run scripts/test.sh once to create the venv)"),
    );
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        std::thread::sleep(Duration::from_millis(50));
    }
    let preload: usize = env_or("TGSYNC_GROUP_TARGETS", 0);
    for i in 0..preload {
        let ip = format!("10.9.{}.{}", i / 250, 1 + i % 250);
        w.put_pod(
            PodBuilder::new("shop", &format!("base-{i}"))
                .label("app", "web")
                .ip(&ip)
                .build(),
        );
    }
    if preload > 0 {
        w.resync().await;
        assert_eq!(w.targets(&arn).await.len(), preload, "preloaded targets");
    }
    let share = std::env::var("TGSYNC_CPU_SHARE_MB").unwrap_or_else(|_| "full".into());
    // `TGSYNC_POD_EVENTS_BIN`: another build of the function (a before/after in one
    // sitting), else this package's.
    let bin = std::env::var("TGSYNC_POD_EVENTS_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_tgsync-pod-events").to_owned());
    let proxy = chaos_proxy::ChaosProxy::transparent().await;
    let mut function = w.function(
        &bin,
        "_",
        &format!("http://127.0.0.1:{port}/.rt"),
        proxy.url(),
    );
    function.env("AWS_LAMBDA_LOG_LEVEL", "warn");
    let extra = std::env::var("TGSYNC_FUNCTION_ENV").unwrap_or_default();
    for (k, v) in extra.split(',').filter_map(|kv| kv.split_once('=')) {
        function.env(k.trim(), v.trim());
    }
    let gap = Duration::from_millis(env_or("TGSYNC_EVENT_GAP_MS", 0));
    let throttled_before = cpu_share::throttled(&share);
    let child = cpu_share::under_share(&share, &function)
        .spawn()
        .expect("function binary starts");
    let pid = child.id();
    let _function = Reaper(child);
    let mut cpu_from = None;
    let mut calls_from = 0;
    let mut samples = Vec::with_capacity(events);
    let mut handler = Vec::with_capacity(events);
    for i in 0..(warmup + events) {
        let name = format!("web-{i}");
        let ip = format!("10.0.{}.{}", 1 + i / 250, 1 + i % 250);
        w.put_pod(
            PodBuilder::new("shop", &name)
                .label("app", "web")
                .ip(&ip)
                .build(),
        );
        let body = started_event(&w.cluster, &name);
        let port_copy = port;
        let started = Instant::now();
        let response = tokio::task::spawn_blocking(move || invoke(port_copy, &body))
            .await
            .unwrap();
        let elapsed = started.elapsed();
        tokio::time::sleep(gap).await;
        let report: Value =
            serde_json::from_str(&response).unwrap_or_else(|e| panic!("{e}: {response}"));
        assert_eq!(
            report["groups"][0]["registered"],
            json!([format!("{ip}:8080")]),
            "{report}"
        );
        if i + 1 == warmup {
            cpu_from = Some(cpu_share::cpu_time(pid));
            calls_from = proxy.records().len();
        }
        if i >= warmup {
            samples.push(elapsed);
            let own = report["durationMs"].as_u64().unwrap_or(0);
            handler.push(Duration::from_millis(own));
        }
    }
    assert_eq!(w.targets(&arn).await.len(), preload + warmup + events);
    samples.sort();
    handler.sort();
    println!(
        "pod-events warm latency, group of {preload} + {warmup} targets growing by one per event, {others} other groups, CPU share {share}, gap {} ms, {extra:?}, invoke -> RegisterTargets done, {} events ({} over 1 s): p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        gap.as_millis(),
        samples.len(),
        samples
            .iter()
            .filter(|s| **s > Duration::from_secs(1))
            .count(),
        ms(percentile(&samples, 0.50)),
        ms(percentile(&samples, 0.90)),
        ms(percentile(&samples, 0.99)),
        ms(*samples.last().unwrap())
    );
    print_calls(&proxy.records()[calls_from..], samples.len());
    let cpu = cpu_share::cpu_time(pid).saturating_sub(cpu_from.unwrap_or_default());
    let (throttled, throttled_for) = cpu_share::throttled(&share);
    println!(
        "  the handler's own durationMs: p50 {:.0} ms, p99 {:.0} ms; the function's CPU {:.1} ms per event; quota throttled {} periods ({:.1} s)",
        ms(percentile(&handler, 0.50)),
        ms(percentile(&handler, 0.99)),
        ms(cpu) / samples.len().max(1) as f64,
        throttled.saturating_sub(throttled_before.0),
        throttled_for
            .saturating_sub(throttled_before.1)
            .as_secs_f64(),
    );
}

/// Per AWS operation: calls per event and how long moto took to answer them.
fn print_calls(records: &[chaos_proxy::Record], events: usize) {
    let mut by_op: std::collections::BTreeMap<&str, Vec<Duration>> = Default::default();
    for r in records {
        by_op
            .entry(r.operation.as_str())
            .or_default()
            .push(r.answered_after.unwrap_or_default());
    }
    let mut answering = Duration::ZERO;
    for (op, mut took) in by_op {
        answering += took.iter().sum::<Duration>();
        took.sort();
        println!(
            "  {op:<22} {:>5.2} per event, moto answered in p50 {:>6.1} ms",
            took.len() as f64 / events.max(1) as f64,
            ms(percentile(&took, 0.5)),
        );
    }
    println!(
        "  moto's answering, all AWS calls: {:.1} ms per event",
        ms(answering) / events.max(1) as f64
    );
}
