//! The built `tgsync-resync` binary under `cargo lambda watch` (the Lambda Runtime API
//! emulator), invoked with `cargo lambda invoke` and the payloads in `events/`: the same
//! path a deployed function takes, from the runtime's `next` request to the response.

#[path = "../../../tests/support/moto.rs"]
mod moto;
#[path = "../../../tests/support/process.rs"]
mod process;
#[path = "../../../tests/support/world.rs"]
mod world;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use process::{Reaper, repo_root};
use serde_json::Value;
use tgsync::testkit::PodBuilder;
use world::World;

fn cargo_lambda() -> PathBuf {
    let venv = std::env::var_os("TGSYNC_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".venv"));
    let bin = venv.join("bin/cargo-lambda");
    assert!(
        bin.exists(),
        "{} not found: run scripts/test.sh (it installs cargo-lambda into the venv)",
        bin.display()
    );
    bin
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn wait_for_port(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "cargo lambda watch did not listen on {port}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn invoke(port: u16, event: &str) -> Value {
    let (ok, stdout, stderr) = invoke_raw(port, event);
    assert!(ok, "invoke {event} failed: {stdout}\n{stderr}");
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("report is JSON ({e}): {stdout}"))
}

/// `cargo lambda invoke` with `event`: whether it succeeded, its stdout and stderr.
fn invoke_raw(port: u16, event: &str) -> (bool, String, String) {
    let out = Command::new(cargo_lambda())
        .args([
            "lambda",
            "invoke",
            "--invoke-address",
            "127.0.0.1",
            "--invoke-port",
        ])
        .arg(port.to_string())
        .arg("--data-file")
        .arg(repo_root().join("events").join(event))
        .arg("--output-format")
        .arg("json")
        .arg("_")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo lambda invoke runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn built_binary_converges_a_group_under_cargo_lambda() {
    let w = World::new().await;
    let arn = w.group("shop", "app=web", 8080, &[]).await;
    for (name, ip) in [("web-1", "10.0.1.1"), ("web-2", "10.0.1.2")] {
        w.put_pod(
            PodBuilder::new("shop", name)
                .label("app", "web")
                .ip(ip)
                .build(),
        );
    }

    let port = free_port();
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
            .expect("cargo lambda watch starts"),
    );
    wait_for_port(port);
    let _function = Reaper(
        w.function(
            env!("CARGO_BIN_EXE_tgsync-resync"),
            "_",
            &format!("http://127.0.0.1:{port}/.rt"),
            moto::endpoint(),
        )
        .env("RUST_LOG", "info")
        .spawn()
        .expect("function binary starts"),
    );

    // A manual payload is refused (manual runs go to tgsync-manual), and changes nothing.
    let (ok, stdout, stderr) = invoke_raw(port, "resync-dry-run.json");
    assert!(!ok, "a dry run is not the resync function's: {stdout}");
    assert!(
        format!("{stdout}{stderr}").contains("invoke the manual function"),
        "the refusal names the way: {stdout}{stderr}"
    );
    assert!(w.targets(&arn).await.is_empty());

    // The scheduled event converges the group.
    let report = invoke(port, "scheduled.json");
    assert_eq!(report["groups"][0]["outcome"], "changed", "{report}");
    assert_eq!(w.targets(&arn).await, ["10.0.1.1:8080", "10.0.1.2:8080"]);
    assert_eq!(w.ledger(&arn).await, ["10.0.1.1:8080", "10.0.1.2:8080"]);
}
