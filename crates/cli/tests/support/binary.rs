//! Running the `tgsync` binary under test, and showing what it printed: shared by the
//! CLI's test binaries.

use std::process::{Command, Output, Stdio};

/// `tgsync ARGS` with exactly `env` (and PATH), stdin empty, no terminal.
pub fn tgsync_with(args: &[&str], env: &[(&str, String)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tgsync"))
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .envs(env.iter().map(|(k, v)| (*k, v)))
        .stdin(Stdio::null())
        .output()
        .expect("tgsync runs")
}

/// Exit code, stdout and stderr of `o`, for assertion messages.
pub fn text(o: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}--- stderr\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}
