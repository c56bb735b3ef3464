#![allow(dead_code)] // each bench uses a part of it
//! What the resync binary's benches share: starting the release binary on a Runtime
//! API stand-in, the scheduled event, the recording proxy, and finding the ELBv2 call
//! that applied a change.

use std::time::{Duration, Instant};

use crate::chaos_proxy::{ChaosProxy, Record};
use crate::cpu_share::under_share;
use crate::measure::{Reaper, percentile};
use crate::runtime_api::RuntimeApi;
use crate::world::World;

/// The first ELBv2 call `op` naming `ip` that arrived after `since`.
pub fn record_for<'a>(
    records: &'a [Record],
    ip: &str,
    op: &str,
    since: Instant,
) -> Option<&'a Record> {
    let names =
        |r: &&Record| r.body.contains(&format!("={ip}&")) || r.body.ends_with(&format!("={ip}"));
    records
        .iter()
        .filter(|r| r.at >= since && r.operation == op)
        .find(names)
}

/// When the first ELBv2 call `op` naming `ip` after `since` arrived.
pub fn call_for(records: &[Record], ip: &str, op: &str, since: Instant) -> Option<Instant> {
    record_for(records, ip, op, since).map(|r| r.at)
}

/// The `p` quantile (0–1), zero for no samples.
pub fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        Duration::ZERO
    } else {
        percentile(sorted, p)
    }
}

/// Starts the release binary on `runtime` in watch mode for `watch` seconds, its AWS
/// calls through `proxy`; inside Lambda's CPU share for `TGSYNC_CPU_SHARE_MB` (a memory
/// size, `scripts/bench/cpu-share.sh`; root) when that is set, else on the full machine.
pub fn start_function(w: &World, proxy: &ChaosProxy, runtime: &RuntimeApi, watch: u64) -> Reaper {
    let mb = cpu_share_mb();
    let mut function = w.function(
        env!("CARGO_BIN_EXE_tgsync-resync"),
        "tgsync-resync",
        runtime.address(),
        proxy.url(),
    );
    function
        .env("TGSYNC_WATCH_SECONDS", watch.to_string())
        .env("AWS_LAMBDA_LOG_LEVEL", "WARN")
        .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", memory_size(&mb));
    Reaper(
        under_share(&mb, &function)
            .spawn()
            .expect("function binary starts"),
    )
}

/// The memory size whose CPU share the function gets (`TGSYNC_CPU_SHARE_MB`), or `full`.
pub fn cpu_share_mb() -> String {
    std::env::var("TGSYNC_CPU_SHARE_MB").unwrap_or_else(|_| "full".to_owned())
}

/// `AWS_LAMBDA_FUNCTION_MEMORY_SIZE` for a share: a full vCPU is 1,769 MB.
pub fn memory_size(mb: &str) -> &str {
    if mb == "full" { "1769" } else { mb }
}

/// The EventBridge Scheduler event of `events/scheduled.json`.
pub fn scheduled() -> serde_json::Value {
    let path = format!("{}/../../events/scheduled.json", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(path).expect("event")).expect("JSON")
}

/// A recording proxy in front of moto that keeps new targets `initial` for
/// `initial_for`, as an NLB does until its health checks pass.
pub async fn proxy(initial_for: Option<Duration>) -> ChaosProxy {
    let proxy = ChaosProxy::transparent().await;
    proxy.set_rules(|r| r.initial_for = initial_for);
    proxy
}

/// Whether `name`'s `tgsync/target-health` condition is True.
pub fn gate_is_open(w: &World, namespace: &str, name: &str) -> bool {
    w.emulator
        .store()
        .get_pod(namespace, name)
        .and_then(|p| p.status)
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .iter()
        .any(|c| c.type_ == "tgsync/target-health" && c.status == "True")
}
