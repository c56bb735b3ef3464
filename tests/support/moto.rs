//! moto's server for the AWS integration tests: the one `scripts/test.sh` started
//! (`TGSYNC_TEST_AWS_ENDPOINT`), or one started here once per test binary on a free
//! loopback port and stopped when the test binary exits.
//!
//! Tests share the server and run in parallel, so each uses unique names ([`unique`]).
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use aws_config::{Region, SdkConfig};
use aws_credential_types::Credentials;

/// The environment variable `scripts/test.sh` sets to its moto server's URL.
pub const ENDPOINT_ENV: &str = "TGSYNC_TEST_AWS_ENDPOINT";
/// The region every test uses.
pub const REGION: &str = "us-east-1";

/// This test binary's moto server.
static ENDPOINT: OnceLock<String> = OnceLock::new();

/// The moto server's base URL (`http://127.0.0.1:PORT`), starting it on first use.
pub fn endpoint() -> &'static str {
    ENDPOINT.get_or_init(|| match std::env::var(ENDPOINT_ENV) {
        Ok(url) if !url.is_empty() => url,
        _ => start_moto(),
    })
}

/// Gives this test binary a moto server of its own, not the shared one: for a test that
/// fills its account (a thousand target groups would slow every later test's discovery).
/// Call it before anything else uses moto.
pub fn use_own_server() {
    let own = ENDPOINT.get_or_init(start_moto);
    assert!(
        std::env::var(ENDPOINT_ENV).ok().as_ref() != Some(own),
        "moto was used before use_own_server"
    );
}

/// tgsync's loader pointed at moto (endpoint and region), without credentials.
pub fn config_loader() -> aws_config::ConfigLoader {
    tgsync::aws::config_loader()
        .endpoint_url(endpoint())
        .region(Region::new(REGION))
}

/// SDK configuration for moto: tgsync's own retry and timeout settings, with the
/// endpoint, region and fake credentials set explicitly (nothing read from the process
/// environment's credentials).
pub async fn sdk_config() -> SdkConfig {
    sdk_config_for(endpoint()).await
}

/// The same configuration for any local endpoint (also used for canned-response
/// servers in tests).
pub async fn sdk_config_for(endpoint: &str) -> SdkConfig {
    tgsync::aws::config_loader()
        .endpoint_url(endpoint)
        .region(Region::new(REGION))
        .credentials_provider(Credentials::new(
            "testing",
            "testing",
            Some("testing".to_owned()),
            None,
            "moto-tests",
        ))
        .load()
        .await
}

/// A name unique to this test run and call, made of `[a-z0-9-]` (valid for target
/// groups when `prefix` is short) so parallel tests never see each other's resources.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{prefix}-{:x}-{:x}-{}",
        std::process::id(),
        nanos,
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A VPC in moto (created once per test binary); ELBv2 IP target groups need one. Made
/// with a raw EC2 query request because the tests have no EC2 SDK client.
pub fn vpc_id() -> &'static str {
    static VPC: OnceLock<String> = OnceLock::new();
    VPC.get_or_init(|| {
        let body = "Action=CreateVpc&Version=2016-11-15&CidrBlock=10.0.0.0%2F16";
        let response = post_form(endpoint(), "ec2", body);
        let start = response
            .find("<vpcId>")
            .unwrap_or_else(|| panic!("no vpcId in CreateVpc answer: {response}"))
            + "<vpcId>".len();
        let end = start + response[start..].find('<').expect("vpcId closes");
        response[start..end].to_owned()
    })
}

/// A VPC in `account` (created once per test binary and account). moto keeps each
/// account's resources apart; its `x-moto-account-id` header picks the account.
pub fn vpc_in(account: &str) -> String {
    static VPCS: OnceLock<std::sync::Mutex<std::collections::HashMap<String, String>>> =
        OnceLock::new();
    let mut vpcs = VPCS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    vpcs.entry(account.to_owned())
        .or_insert_with(|| {
            let body = "Action=CreateVpc&Version=2016-11-15&CidrBlock=10.0.0.0%2F16";
            let response = post_form_as(endpoint(), "ec2", body, Some(account));
            between(&response, "<vpcId>", "<")
        })
        .clone()
}

/// Two subnets of [`vpc_id`] in different zones (an application load balancer needs
/// two), created once per test binary.
pub fn subnet_ids() -> &'static [String; 2] {
    static SUBNETS: OnceLock<[String; 2]> = OnceLock::new();
    SUBNETS.get_or_init(|| {
        let subnet = |cidr: &str, zone: &str| {
            let body = format!(
                "Action=CreateSubnet&Version=2016-11-15&VpcId={}&CidrBlock={}&AvailabilityZone={zone}",
                vpc_id(),
                cidr.replace('/', "%2F")
            );
            between(&post_form(endpoint(), "ec2", &body), "<subnetId>", "<")
        };
        [
            subnet("10.0.250.0/24", "us-east-1a"),
            subnet("10.0.251.0/24", "us-east-1b"),
        ]
    })
}

/// The text of `response` between `open` and the next `close`.
fn between(response: &str, open: &str, close: &str) -> String {
    let start = response
        .find(open)
        .unwrap_or_else(|| panic!("no {open} in moto's answer: {response}"))
        + open.len();
    let end = start + response[start..].find(close).expect("element closes");
    response[start..end].to_owned()
}

/// POSTs a form-encoded query-protocol request to moto, routed to `service` by the
/// credential scope of a (not verified) SigV4 header; returns the whole HTTP response.
fn post_form(endpoint: &str, service: &str, body: &str) -> String {
    post_form_as(endpoint, service, body, None)
}

/// [`post_form`] in `account` (moto's default account when `None`).
fn post_form_as(endpoint: &str, service: &str, body: &str, account: Option<&str>) -> String {
    let host = endpoint
        .strip_prefix("http://")
        .expect("moto endpoint is http://");
    let mut stream = TcpStream::connect(host).expect("connect to moto");
    let request = format!(
        "POST / HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/x-www-form-urlencoded\r\n\
         Authorization: AWS4-HMAC-SHA256 Credential=testing/20250101/{REGION}/{service}/aws4_request, \
         SignedHeaders=host, Signature=0\r\n{}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        account.map_or(String::new(), |a| format!("x-moto-account-id: {a}\r\n")),
        body.len()
    );
    stream.write_all(request.as_bytes()).expect("send to moto");
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .expect("read moto answer");
    assert!(
        response.starts_with("HTTP/1.1 200") || response.starts_with("HTTP/1.0 200"),
        "moto refused {body}: {response}"
    );
    response
}

/// The repository root: the nearest ancestor of the test's package holding
/// `scripts/lib.sh` (tests of `functions/*` include this file too).
fn root() -> &'static Path {
    let mut dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    while !dir.join("scripts/lib.sh").exists() {
        match dir.parent() {
            Some(parent) => dir = parent,
            None => return Path::new(env!("CARGO_MANIFEST_DIR")),
        }
    }
    dir
}

/// moto_server from the project venv, creating the venv with the project's own script
/// when it is missing.
fn moto_server() -> PathBuf {
    let venv = std::env::var_os("TGSYNC_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join(".venv"));
    let bin = venv.join("bin/moto_server");
    if !bin.exists() {
        let status = Command::new("bash")
            .arg("-c")
            .arg("source scripts/lib.sh && ensure_venv")
            .current_dir(root())
            .status()
            .expect("run scripts/lib.sh ensure_venv");
        assert!(status.success(), "could not create the venv with moto");
    }
    bin
}

/// Starts moto on a free port under a watchdog shell that stops it as soon as this test
/// process is gone (however it ends), and waits until it answers.
fn start_moto() -> String {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let bin = moto_server();
    let log = std::env::temp_dir().join(format!("tgsync-moto-{port}.log"));
    let script = format!(
        "'{bin}' -H 127.0.0.1 -p {port} >'{log}' 2>&1 & m=$!; \
         while kill -0 {parent} 2>/dev/null && kill -0 $m 2>/dev/null; do sleep 0.5; done; \
         kill $m 2>/dev/null; wait $m 2>/dev/null",
        bin = bin.display(),
        log = log.display(),
        parent = std::process::id(),
    );
    // Deliberately not waited on: the watchdog outlives this function and exits (and is
    // reaped by init) once the test process is gone.
    #[allow(clippy::zombie_processes)]
    Command::new("sh")
        .arg("-c")
        .arg(script)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start moto_server");
    let endpoint = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !answers(port) {
        assert!(
            Instant::now() < deadline,
            "moto_server did not answer on port {port}; log: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    endpoint
}

fn answers(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let request = "GET /moto-api/ HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    let mut head = [0u8; 12];
    stream.write_all(request.as_bytes()).is_ok()
        && stream.read_exact(&mut head).is_ok()
        && head.starts_with(b"HTTP/1.")
}
