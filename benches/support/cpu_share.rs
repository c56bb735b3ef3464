//! Running a benchmarked binary at Lambda's CPU share for a memory size (see
//! `scripts/bench/cpu-share.sh`), and what the quota and the process report.

use std::process::{Command, Stdio};
use std::time::Duration;

/// The CPU time (user + system) process `pid` has used, from `/proc/<pid>/stat`.
pub fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) start at `) `.
    let rest = stat.rsplit_once(") ").map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let hz = 100; // USER_HZ on Linux
    Duration::from_millis((ticks(11) + ticks(12)) * 1000 / hz)
}

/// The quota's throttling counters (`nr_throttled`, throttled time) for size `mb`.
pub fn throttled(mb: &str) -> (u64, Duration) {
    let v1 = format!("/sys/fs/cgroup/cpu/tgsync-{mb}/cpu.stat");
    let v2 = format!("/sys/fs/cgroup/tgsync-{mb}/cpu.stat");
    let stat = std::fs::read_to_string(&v1)
        .or_else(|_| std::fs::read_to_string(&v2))
        .unwrap_or_default();
    let get = |key: &str| {
        stat.lines()
            .find_map(|l| l.strip_prefix(key)?.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    let time = if stat.contains("throttled_usec") {
        Duration::from_micros(get("throttled_usec "))
    } else {
        Duration::from_nanos(get("throttled_time "))
    };
    (get("nr_throttled "), time)
}

/// `cmd` started under the CPU-share script for `mb`, or as it is for `full`.
pub fn under_share(mb: &str, cmd: &Command) -> Command {
    if mb == "full" {
        let mut c = Command::new(cmd.get_program());
        c.args(cmd.get_args());
        copy_env(cmd, &mut c);
        return c;
    }
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/bench/cpu-share.sh"
    );
    let mut c = Command::new("sh");
    c.arg(script)
        .arg(mb)
        .arg(cmd.get_program())
        .args(cmd.get_args());
    copy_env(cmd, &mut c);
    // The script's memory cap (`TGSYNC_MEMORY_LIMIT=1`), asked for by the bench's caller.
    if let Ok(limit) = std::env::var("TGSYNC_MEMORY_LIMIT") {
        c.env("TGSYNC_MEMORY_LIMIT", limit);
    }
    c
}

fn copy_env(from: &Command, to: &mut Command) {
    to.env_clear().stdout(Stdio::null()).stderr(Stdio::null());
    for (k, v) in from.get_envs() {
        if let Some(v) = v {
            to.env(k, v);
        }
    }
}
