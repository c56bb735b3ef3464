//! The built `tgsync` CLI against moto (behind the test proxy, which keeps one target
//! failing its health checks), the Kubernetes API emulator, and the model of the Lambda
//! service serving the template's manual function (reserved concurrency, release
//! alias) with the library's manual handler: what an operator types, what they see,
//! and the exit codes scripts rely on.

#[path = "../../../tests/support/chaos_proxy.rs"]
mod chaos_proxy;
#[path = "../../../tests/support/lambda_service.rs"]
mod lambda_service;
#[path = "../../../tests/support/moto.rs"]
mod moto;
#[path = "../../../tests/support/runtime_api.rs"]
mod runtime_api;
#[path = "../../../tests/support/world.rs"]
mod world;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::Duration;

use chaos_proxy::ChaosProxy;
use lambda_service::{Call, Function, InProcess, LambdaService};
use serde_json::{Value, json};
use tgsync::core::{BackoffState, UnixMillis};
use tgsync::handlers::manual::Invocation;
use tgsync::state::{Acquire, StateStore};
use tgsync::testkit::PodBuilder;
use world::World;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// A world, the proxy in front of moto, and the Lambda model with the manual function.
struct Setup {
    w: World,
    proxy: ChaosProxy,
    lambda: LambdaService,
    ca: PathBuf,
    manual: String,
}

impl Setup {
    async fn new() -> Self {
        Self::with_delay(Duration::ZERO).await
    }

    /// A setup whose manual function takes `delay` longer for every invocation.
    async fn with_delay(delay: Duration) -> Self {
        let w = World::new().await;
        let proxy = ChaosProxy::transparent().await;
        let engine = Arc::new(
            world::build_engine_on(
                &w.cluster,
                &w.sdk,
                &w.emulator,
                &w.table,
                Arc::new(tgsync::clock::SystemClock),
                world::Creds::default().provider(),
            )
            .with_owner_prefix("manual"),
        );
        let code = move |call: Call| {
            let engine = engine.clone();
            async move {
                tokio::time::sleep(delay).await;
                let invocation = Invocation {
                    deadline: Some(UnixMillis(call.deadline_ms)),
                    invoked_function_arn: call.invoked_arn,
                };
                tgsync::handlers::manual::handle(&engine, &call.payload, &invocation)
                    .await
                    .map_err(
                        |e| json!({ "errorType": "HandlerError", "errorMessage": e.to_string() }),
                    )
            }
        };
        let deployed = lambda_service::deployed(&repo_root().join("template.yaml"));
        let manual = deployed
            .iter()
            .find(|d| d.logical_id == "ManualFunction")
            .expect("template.yaml has the manual function")
            .clone();
        let name = manual.name.clone();
        let lambda = LambdaService::start(vec![Function {
            deployed: manual,
            backend: Arc::new(InProcess::new(code)),
        }])
        .await;
        let ca = std::env::temp_dir().join(format!("{}-cli-ca.pem", w.cluster));
        std::fs::write(&ca, w.emulator.ca_pem().expect("TLS emulator")).unwrap();
        Self {
            w,
            proxy,
            lambda,
            ca,
            manual: name,
        }
    }

    /// `tgsync ARGS` as an operator's shell runs it (no terminal: stdin is empty).
    fn tgsync(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_tgsync"))
            .args(args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("AWS_REGION", moto::REGION)
            .env("AWS_ACCESS_KEY_ID", "testing")
            .env("AWS_SECRET_ACCESS_KEY", "testing")
            .env("AWS_SESSION_TOKEN", "testing")
            .env("AWS_CONFIG_FILE", "/dev/null")
            .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env("AWS_ENDPOINT_URL", self.proxy.url())
            .env("AWS_ENDPOINT_URL_STS", moto::endpoint())
            .env("AWS_ENDPOINT_URL_LAMBDA", self.lambda.endpoint())
            .env("TGSYNC_CLUSTER_NAME", &self.w.cluster)
            .env("TGSYNC_TABLE_NAME", &self.w.table)
            .env("TGSYNC_MANUAL_FUNCTION", &self.manual)
            .env("TGSYNC_CLUSTER_ENDPOINT", self.w.emulator.url())
            .env("TGSYNC_CLUSTER_CA_FILE", &self.ca)
            .stdin(Stdio::null())
            .output()
            .expect("tgsync runs")
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.ca);
    }
}

fn text(o: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}--- stderr\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn json_of(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(o)))
}

fn web_pod(name: &str, ip: &str) -> k8s_openapi::api::core::v1::Pod {
    PodBuilder::new("shop", name)
        .label("app", "web")
        .ip(ip)
        .build()
}

#[test]
fn version_and_usage() {
    let o = Command::new(env!("CARGO_BIN_EXE_tgsync"))
        .arg("--version")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        format!("tgsync {}", env!("CARGO_PKG_VERSION"))
    );
    for bad in [
        &["frobnicate"][..],
        &["release"][..],
        &["plan", "--bogus"][..],
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_tgsync"))
            .args(bad)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(64), "{bad:?}: {}", text(&o));
    }
}

/// `status` of a group with owned, foreign, unhealthy and backing-off targets, and of a
/// group whose lease another run holds.
#[tokio::test(flavor = "multi_thread")]
async fn status_shows_what_each_group_holds() {
    let s = Setup::new().await;
    let w = &s.w;
    let web = w.group("shop", "app=web", 8080, &[]).await;
    let api = w.group("shop", "app=api", 9090, &[]).await;
    for (name, ip) in [
        ("web-1", "10.0.1.1"),
        ("web-2", "10.0.1.2"),
        ("web-3", "10.0.1.3"),
    ] {
        w.put_pod(web_pod(name, ip));
    }
    w.put_pod(
        PodBuilder::new("shop", "api-1")
            .label("app", "api")
            .ip("10.0.2.1")
            .build(),
    );
    // A group nobody touches after the resync: its verification is what status shows.
    let db = w.group("shop", "app=db", 5432, &[]).await;
    w.put_pod(
        PodBuilder::new("shop", "db-1")
            .label("app", "db")
            .ip("10.0.3.1")
            .build(),
    );
    let report = w.resync().await;
    assert_eq!(report.totals.registered, 5, "{report:?}");
    w.register_by_hand(&web, "10.0.9.9", 8080).await;
    s.proxy
        .set_rules(|r| r.unhealthy = vec!["10.0.1.2:8080".to_owned()]);
    w.put_pod(web_pod("web-4", "10.0.1.4"));
    let next = now_ms() + 300_000;
    w.set_backoff(
        &web,
        BackoffState {
            failures: 3,
            next_attempt: UnixMillis(next),
        },
    )
    .await;
    let now = UnixMillis(now_ms());
    let until = UnixMillis(now.0 + 120_000);
    assert!(matches!(
        w.engine
            .state
            .acquire(&api, "resync-demo-7f3a", now, until)
            .await
            .unwrap(),
        Acquire::Acquired(_)
    ));

    // A group backing off is failing: exit 1, as for an error.
    let o = s.tgsync(&["status", "--json"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let status = json_of(&o);
    let group = |arn: &str| {
        status["groups"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["targetGroupArn"] == arn)
            .unwrap_or_else(|| panic!("{arn} in {status}"))
            .clone()
    };
    let g = group(&web);
    assert_eq!(g["desired"], 4, "{g}");
    assert_eq!(g["registered"], 4, "{g}");
    assert_eq!(g["healthy"], 3, "{g}");
    assert_eq!(g["owned"], 3, "{g}");
    assert_eq!(g["foreign"], 1, "{g}");
    assert_eq!(g["backoff"]["failures"], 3, "{g}");
    assert_eq!(g["backoff"]["nextAttemptAt"], next, "{g}");
    assert!(g["error"].as_str().unwrap().contains("back off"), "{g}");
    assert_eq!(g["pending"]["register"], json!(["10.0.1.4:8080"]), "{g}");
    // Its verification went with the lease taken to record the backoff (as a failed
    // pass drops it): verify fully next time.
    assert!(g.get("lastVerifiedAt").is_none(), "{g}");
    assert!(g.get("lease").is_none(), "{g}");
    let d = group(&db);
    assert!(
        d["lastVerifiedAt"]
            .as_u64()
            .is_some_and(|at| at >= report.started_at.0),
        "{d}"
    );
    let unhealthy = g["targets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["target"] == "10.0.1.2:8080")
        .unwrap();
    assert_eq!(unhealthy["health"], "unhealthy");
    assert_eq!(unhealthy["owner"], "tgsync");
    assert_eq!(unhealthy["pod"], "shop/web-2");
    let a = group(&api);
    assert_eq!(a["lease"]["owner"], "resync-demo-7f3a", "{a}");
    assert_eq!(a["lease"]["until"], until.0, "{a}");
    assert_eq!(
        (a["desired"].clone(), a["owned"].clone()),
        (json!(1), json!(1))
    );

    // The same for people, and a group named by name.
    let name = web.rsplit('/').nth(1).unwrap();
    let o = s.tgsync(&["status", "--targets", name]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let row = out
        .lines()
        .find(|l| l.starts_with(name))
        .unwrap_or_else(|| panic!("a row for {name}: {out}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(&cells[1..6], ["4", "4", "3", "3", "1"], "{out}");
    assert!(row.contains("3 failure(s), next in 4 min"), "{out}");
    assert!(out.contains("pending: register 10.0.1.4:8080"), "{out}");
    assert!(
        out.lines().any(|l| l.split_whitespace().collect::<Vec<_>>()
            == ["10.0.1.2:8080", "unhealthy", "tgsync", "(shop/web-2)"]),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>()
                == ["10.0.9.9:8080", "healthy", "foreign"]),
        "{out}"
    );
    assert!(!out.contains(&api), "only the named group: {out}");
    // Read-only: no invocation, and the lease still the other run's.
    assert_eq!(s.lambda.invocations(&s.manual), 0);
    assert!(w.lease_recorded(&api).await);
}

/// `plan`: 2 while something would change, 0 once nothing would, 1 when the plan
/// cannot be made; `sync` in between; all through the manual function.
#[tokio::test(flavor = "multi_thread")]
async fn plan_exit_codes_say_whether_anything_would_change() {
    let s = Setup::new().await;
    let w = &s.w;
    let web = w.group("shop", "app=web", 8080, &[]).await;
    w.put_pod(web_pod("web-1", "10.0.1.1"));
    w.register_by_hand(&web, "10.0.9.9", 8080).await;

    let o = s.tgsync(&["plan", &web]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("  + 10.0.1.1:8080"), "{out}");
    assert!(out.contains("  = 10.0.9.9:8080"), "{out}");
    assert!(out.contains("1 to register"), "{out}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("planning"),
        "progress on stderr: {}",
        text(&o)
    );
    assert!(
        w.targets(&web).await == ["10.0.9.9:8080"],
        "a plan changes nothing"
    );

    let o = s.tgsync(&["sync", "--json", &web]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(
        json_of(&o)["groups"][0]["registered"],
        json!(["10.0.1.1:8080"])
    );
    assert_eq!(json_of(&o)["function"], "manual");

    let o = s.tgsync(&["plan", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(json_of(&o)["dryRun"], true);
    let o = s.tgsync(&["plan"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("nothing to do"));

    // A group whose tags are wrong cannot be planned: an error, not "nothing to do".
    let broken = w
        .raw_group(
            aws_sdk_elasticloadbalancingv2::types::TargetTypeEnum::Ip,
            8080,
            &[
                ("tgsync/cluster", w.cluster.as_str()),
                ("tgsync/namespace", "shop"),
            ],
        )
        .await;
    let o = s.tgsync(&["plan", &broken]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("tgsync/selector"),
        "{}",
        text(&o)
    );
    // So is a name that names no group.
    let o = s.tgsync(&["plan", "no-such-group"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no target group named `no-such-group`"));
}

/// `release` shows its plan and, with nobody to ask, changes nothing; `--yes` releases
/// (through the function's release alias).
#[tokio::test(flavor = "multi_thread")]
async fn release_needs_a_confirmation_or_yes() {
    let s = Setup::new().await;
    let w = &s.w;
    let web = w.group("shop", "app=web", 8080, &[]).await;
    for (name, ip) in [("web-1", "10.0.1.1"), ("web-2", "10.0.1.2")] {
        w.put_pod(web_pod(name, ip));
    }
    w.register_by_hand(&web, "10.0.9.9", 8080).await;
    w.resync().await;
    w.elb
        .remove_tags()
        .resource_arns(&web)
        .tag_keys("tgsync/cluster")
        .send()
        .await
        .unwrap();

    let o = s.tgsync(&["release", &web]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("  - 10.0.1.1:8080") && out.contains("  - 10.0.1.2:8080"),
        "{out}"
    );
    assert!(out.contains("  = 10.0.9.9:8080"), "{out}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("pass --yes"),
        "{}",
        text(&o)
    );
    assert_eq!(
        w.targets(&web).await,
        ["10.0.1.1:8080", "10.0.1.2:8080", "10.0.9.9:8080"],
        "nothing released"
    );
    assert_eq!(w.ledger(&web).await.len(), 2);

    let o = s.tgsync(&["release", "--yes", "--json", &web]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out = json_of(&o);
    assert_eq!(out["plan"]["dryRun"], true);
    assert_eq!(out["release"]["groups"][0]["outcome"], "released", "{out}");
    assert_eq!(w.targets(&web).await, ["10.0.9.9:8080"]);
    assert!(w.ledger(&web).await.is_empty());
}

/// A second manual run meanwhile finds the manual function's one slot busy (429): the
/// CLI tries again within `--wait`, says so, and gets its answer; with no time to wait
/// it gives up with the reason.
#[tokio::test(flavor = "multi_thread")]
async fn a_busy_manual_function_is_waited_for() {
    let s = Setup::with_delay(Duration::from_secs(3)).await;
    let w = &s.w;
    let web = w.group("shop", "app=web", 8080, &[]).await;
    w.put_pod(web_pod("web-1", "10.0.1.1"));
    std::thread::scope(|scope| {
        let first = scope.spawn(|| s.tgsync(&["plan", &web]));
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while s.lambda.in_flight(&s.manual) == 0 {
            assert!(std::time::Instant::now() < until, "the first plan runs");
            std::thread::sleep(Duration::from_millis(20));
        }
        let o = s.tgsync(&["plan", "--wait", "0", &web]);
        assert_eq!(o.status.code(), Some(1), "{}", text(&o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("429 TooManyRequestsException"),
            "{}",
            text(&o)
        );
        let o = s.tgsync(&["plan", &web]);
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        assert!(
            String::from_utf8_lossy(&o.stderr)
                .contains("is busy (another manual run holds its slot)"),
            "{}",
            text(&o)
        );
        assert_eq!(first.join().unwrap().status.code(), Some(2));
    });
    assert!(s.lambda.throttles(&s.manual) >= 2);
}
