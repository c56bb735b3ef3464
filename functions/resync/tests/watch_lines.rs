//! What an SRE tailing the resync's log group sees while it watches: the built
//! `tgsync-resync` binary, invoked through a Runtime API stand-in with watch mode on,
//! against moto and the Kubernetes API emulator over real HTTP. A pod that turns up and
//! one that is deleted each produce, within seconds, one time-stamped line on stdout (what
//! Lambda sends to CloudWatch Logs) whose EMF block counts the change — not one summary at
//! the end of the invocation.

#[path = "../../../tests/support/moto.rs"]
mod moto;
#[path = "../../../tests/support/runtime_api.rs"]
mod runtime_api;
#[path = "../../../tests/support/world.rs"]
mod world;

use std::io::BufRead;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use runtime_api::RuntimeApi;
use serde_json::Value;
use tgsync::testkit::PodBuilder;
use world::World;

/// How soon after a change its line must be on stdout.
const WITHIN: Duration = Duration::from_secs(5);

fn web(name: &str, ip: &str) -> PodBuilder {
    PodBuilder::new("shop", name).label("app", "web").ip(ip)
}

fn event(file: &str) -> Value {
    let path = format!("{}/../../events/{file}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(path).expect("event file")).expect("JSON")
}

/// A line of the binary's stdout, and when it was read.
#[derive(Clone)]
struct Line {
    at: Instant,
    json: Value,
}

/// Lines read so far from the binary's stdout (the JSON ones).
type Lines = Arc<Mutex<Vec<Line>>>;

/// Waits (up to `within` after `since`) for the first line after `since` that is the
/// pass line of group `name` with `field` ≥ 1.
async fn line_counting(
    lines: &Lines,
    since: Instant,
    within: Duration,
    name: &str,
    field: &str,
) -> Option<Line> {
    while since.elapsed() < within {
        let found = lines
            .lock()
            .unwrap()
            .iter()
            .find(|l| {
                l.at >= since
                    && l.json["TargetGroup"] == name
                    && l.json[field].as_u64().is_some_and(|n| n >= 1)
            })
            .cloned();
        if found.is_some() {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

#[tokio::test(flavor = "multi_thread")]
async fn the_watch_logs_each_change_with_its_metrics_within_seconds() {
    let w = World::new().await;
    let arn = w.group("shop", "app=web", 8080, &[]).await;
    let name = arn.split('/').nth(1).unwrap().to_owned();
    w.put_pod(web("web-1", "10.0.1.1").build());
    let runtime = RuntimeApi::start().await;
    let mut function = w
        .function(
            env!("CARGO_BIN_EXE_tgsync-resync"),
            "tgsync-resync",
            runtime.address(),
            moto::endpoint(),
        )
        .env("TGSYNC_WATCH_SECONDS", "20")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("function binary starts");
    let stdout = function.stdout.take().expect("stdout piped");
    let lines: Lines = Arc::default();
    let reading = lines.clone();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Ok(json) = serde_json::from_str(&line) {
                reading.lock().unwrap().push(Line {
                    at: Instant::now(),
                    json,
                });
            }
        }
    });
    let id = runtime.invoke(event("scheduled.json"), Duration::from_secs(60));
    // The first full diff registers web-1.
    let first = line_counting(
        &lines,
        Instant::now(),
        Duration::from_secs(30),
        &name,
        "Registered",
    )
    .await
    .expect("the first pass's line");
    assert_eq!(w.targets(&arn).await, ["10.0.1.1:8080"]);
    assert_eq!(first.json["Registered"], 1);

    // A new pod: its registration's line is on stdout within seconds.
    let added = Instant::now();
    let added_ms = unix_ms();
    w.put_pod(web("web-2", "10.0.1.2").build());
    let line = line_counting(&lines, added, WITHIN, &name, "Registered")
        .await
        .expect("a line counting the registration within 5 s");
    eprintln!(
        "registration line {:?} after the pod was added",
        line.at - added
    );
    assert_eq!(line.json["Registered"], 1, "{}", line.json);
    assert_eq!(line.json["Function"], "resync");
    assert_timestamped(&line.json, added_ms);
    assert_eq!(w.targets(&arn).await, ["10.0.1.1:8080", "10.0.1.2:8080"]);

    // A deleted pod: its deregistration's line likewise.
    let deleted = Instant::now();
    let deleted_ms = unix_ms();
    w.emulator.store().delete_pod("shop", "web-1");
    let line = line_counting(&lines, deleted, WITHIN, &name, "Deregistered")
        .await
        .expect("a line counting the deregistration within 5 s");
    eprintln!(
        "deregistration line {:?} after the pod was deleted",
        line.at - deleted
    );
    assert_eq!(line.json["Deregistered"], 1, "{}", line.json);
    assert_timestamped(&line.json, deleted_ms);
    assert_eq!(w.targets(&arn).await, ["10.0.1.2:8080"]);

    // The invocation still ends as scheduled, with its run line.
    let answer = runtime.answer(&id, Duration::from_secs(40)).await;
    let _ = function.kill();
    let _ = function.wait();
    assert!(answer.is_some(), "the invocation answered");
    let run_lines = lines
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.json.get("RunsCompleted").is_some())
        .count();
    assert_eq!(run_lines, 1, "one run line at the end");
}

/// The line carries the EMF block (metrics CloudWatch extracts, with their timestamp) and
/// a log timestamp, both taken when the change was made — not at the invocation's end.
fn assert_timestamped(json: &Value, changed_ms: u64) {
    let emf = json["_aws"]["Timestamp"].as_u64().expect("EMF Timestamp");
    assert!(
        emf >= changed_ms && emf <= changed_ms + WITHIN.as_millis() as u64,
        "EMF Timestamp {emf} is not within seconds of the change at {changed_ms}: {json}"
    );
    let metrics: Vec<&str> = json["_aws"]["CloudWatchMetrics"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|d| d["Metrics"].as_array().into_iter().flatten())
        .filter_map(|m| m["Name"].as_str())
        .collect();
    assert!(
        metrics.contains(&"Registered") && metrics.contains(&"Deregistered"),
        "{json}"
    );
    assert!(
        json["timestamp"].as_str().is_some_and(|t| t.ends_with('Z')),
        "{json}"
    );
}
