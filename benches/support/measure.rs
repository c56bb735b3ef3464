//! Small helpers shared by the benchmarks that report latencies and run built binaries.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;

#[path = "../../tests/support/process.rs"]
mod process;
#[allow(unused_imports)] // not every bench starts a process
pub use process::Reaper;

/// `name` from the environment, parsed, else `default`.
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The `p` quantile (0–1) of `sorted`, nearest rank.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

/// `d` in milliseconds, for printing.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// `target/<profile>` (a bench runs from `target/<profile>/deps`), where the binaries
/// of the same build are.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("own path");
    exe.parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .expect("bench executable lives in target/<profile>/deps")
}

/// A `kB` field of `/proc/<pid>/status` (`self` for this process).
pub fn proc_status_kib_of(pid: &str, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| {
        l.strip_prefix(field)?
            .strip_prefix(':')?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    })
}

/// A `kB` field of this process's `/proc/self/status` (`VmRSS`, `VmHWM`).
pub fn proc_status_kib(field: &str) -> Option<u64> {
    proc_status_kib_of("self", field)
}

/// Restarts this process's RSS high-water mark (`VmHWM`) from its current RSS
/// (`echo 5 > /proc/self/clear_refs`, Linux >= 4.0); false where that is not allowed.
pub fn reset_rss_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}
