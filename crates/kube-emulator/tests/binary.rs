//! The `kube-emulator` binary as the sandbox runs it.

mod common;

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

use hyper::Method;
use kube_emulator::{EXAMPLE_ACCESS_KEY_ID, EXAMPLE_SECRET_ACCESS_KEY, TokenRequest};
use serde_json::json;

struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn scratch_dir() -> std::path::PathBuf {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let dir =
        std::env::temp_dir().join(format!("kube-emulator-test-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[tokio::test]
async fn binary_prints_its_url_and_serves_seeded_pods() {
    let dir = scratch_dir();
    let ca_path = dir.join("ca.pem");
    let seed_path = dir.join("seed.json");
    std::fs::write(
        &seed_path,
        serde_json::to_vec(&json!({"kind": "PodList", "apiVersion": "v1", "items": [
            {"metadata": {"name": "web-1", "namespace": "default", "labels": {"app": "web"}},
             "spec": {"containers": [{"name": "app", "image": "nginx"}]},
             "status": {"phase": "Running", "podIP": "10.1.0.1"}}
        ]}))
        .unwrap(),
    )
    .unwrap();

    let mut child = Command::new(env!("CARGO_BIN_EXE_kube-emulator"))
        .args(["--cluster-name", "sandbox", "--port", "0", "--log", "warn"])
        .arg("--ca-out")
        .arg(&ca_path)
        .arg("--seed")
        .arg(&seed_path)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let running = Running(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    let url = line.trim().to_owned();
    assert!(url.starts_with("https://127.0.0.1:"), "{url:?}");
    let port: u16 = url.rsplit(':').next().unwrap().parse().unwrap();
    let ca = std::fs::read_to_string(&ca_path).unwrap();

    let token = TokenRequest::new(
        "sandbox",
        EXAMPLE_ACCESS_KEY_ID,
        EXAMPLE_SECRET_ACCESS_KEY,
        "us-east-1",
    )
    .token()
    .unwrap();
    let answer = common::send_raw(
        port,
        &ca,
        Method::GET,
        "/api/v1/namespaces/default/pods",
        Some(&token),
    )
    .await;
    assert_eq!(answer.status, 200);
    let list = answer.json();
    assert_eq!(list["items"][0]["metadata"]["name"], "web-1");
    assert_eq!(list["items"][0]["status"]["podIP"], "10.1.0.1");
    let unauthenticated = common::send_raw(port, &ca, Method::GET, "/api/v1/pods", None).await;
    assert_eq!(unauthenticated.status, 401);
    drop(running);
    let _ = std::fs::remove_dir_all(dir);
}
