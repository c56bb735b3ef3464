//! The built `tgsync` CLI against moto (behind the test proxy, which keeps one target
//! failing its health checks), the Kubernetes API emulator, and the model of the Lambda
//! service serving the template's manual function (reserved concurrency, release
//! alias) with the library's manual handler: what an operator types, what they see,
//! and the exit codes scripts rely on.

#[path = "support/binary.rs"]
mod binary;
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

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::Duration;

use binary::{text, tgsync_with};
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

    /// The environment of an operator's shell for this deployment: credentials, region,
    /// the local endpoints, and the deployment's names in `TGSYNC_*` variables.
    fn env(&self) -> Vec<(&'static str, String)> {
        let mut env = aws_env();
        env.extend([
            ("AWS_ENDPOINT_URL", self.proxy.url().to_owned()),
            ("AWS_ENDPOINT_URL_STS", moto::endpoint().to_owned()),
            (
                "AWS_ENDPOINT_URL_CLOUDFORMATION",
                moto::endpoint().to_owned(),
            ),
            ("AWS_ENDPOINT_URL_LAMBDA", self.lambda.endpoint().to_owned()),
            ("TGSYNC_CLUSTER_NAME", self.w.cluster.clone()),
            ("TGSYNC_TABLE_NAME", self.w.table.clone()),
            ("TGSYNC_MANUAL_FUNCTION", self.manual.clone()),
            ("TGSYNC_CLUSTER_ENDPOINT", self.w.emulator.url().to_string()),
            ("TGSYNC_CLUSTER_CA_FILE", self.ca.display().to_string()),
        ]);
        env
    }

    /// `tgsync ARGS` as an operator's shell runs it (no terminal: stdin is empty).
    fn tgsync(&self, args: &[&str]) -> Output {
        tgsync_with(args, &self.env())
    }
}

/// Credentials and region for moto, and nothing read from this machine's AWS files.
fn aws_env() -> Vec<(&'static str, String)> {
    [
        ("AWS_REGION", moto::REGION),
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_SESSION_TOKEN", "testing"),
        ("AWS_CONFIG_FILE", "/dev/null"),
        ("AWS_SHARED_CREDENTIALS_FILE", "/dev/null"),
        ("AWS_EC2_METADATA_DISABLED", "true"),
    ]
    .into_iter()
    .map(|(k, v)| (k, v.to_owned()))
    .collect()
}

/// `env` without the variables named in `drop`.
fn without(env: &[(&'static str, String)], drop: &[&str]) -> Vec<(&'static str, String)> {
    env.iter()
        .filter(|(k, _)| !drop.contains(k))
        .cloned()
        .collect()
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.ca);
    }
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

/// `version = "..."` of the root Cargo.toml's `[workspace.package]`: the release's.
fn workspace_version() -> String {
    let manifest = std::fs::read_to_string(repo_root().join("Cargo.toml")).unwrap();
    let section = manifest
        .split("\n[")
        .find(|s| s.starts_with("workspace.package]"))
        .expect("[workspace.package] in Cargo.toml");
    section
        .lines()
        .find_map(|l| l.strip_prefix("version = "))
        .expect("a workspace version")
        .trim_matches('"')
        .to_owned()
}

#[test]
fn version_and_usage() {
    let o = Command::new(env!("CARGO_BIN_EXE_tgsync"))
        .arg("--version")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0));
    // The workspace's version, which every crate takes (the release's, the template's
    // SemanticVersion): not one the CLI's manifest pins.
    let version = workspace_version();
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        format!("tgsync {version}")
    );
    let manifest = std::fs::read_to_string(repo_root().join("Cargo.toml")).unwrap();
    let members = manifest
        .lines()
        .find_map(|l| l.strip_prefix("members = "))
        .expect("workspace members");
    for member in members
        .trim_matches(['[', ']'])
        .split(',')
        .map(|m| m.trim().trim_matches('"'))
    {
        let own = std::fs::read_to_string(repo_root().join(member).join("Cargo.toml")).unwrap();
        assert!(
            own.lines().any(|l| l.trim() == "version.workspace = true"),
            "{member}/Cargo.toml must take the workspace's version"
        );
    }
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
            .core
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
    // Times in the CLI's JSON are RFC 3339.
    assert_eq!(
        g["backoff"]["nextAttemptAt"],
        tgsync::logging::rfc3339(next),
        "{g}"
    );
    assert!(g["error"].as_str().unwrap().contains("back off"), "{g}");
    assert_eq!(g["pending"]["register"], json!(["10.0.1.4:8080"]), "{g}");
    // Its verification went with the lease taken to record the backoff (as a failed
    // pass drops it): verify fully next time.
    assert!(g.get("lastVerifiedAt").is_none(), "{g}");
    assert!(g.get("lease").is_none(), "{g}");
    let d = group(&db);
    assert!(
        d["lastVerifiedAt"]
            .as_str()
            .is_some_and(|at| at >= tgsync::logging::rfc3339(report.started_at.0).as_str()),
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
    // The rollout check on the pod (Kubernetes' default termination, no gate, an NLB).
    assert!(
        unhealthy["rollout"]
            .as_str()
            .is_some_and(|r| r.starts_with("no preStop sleep")),
        "{unhealthy}"
    );
    assert_eq!(g["rollout"]["loadBalancer"], "NLB", "{g}");
    assert_eq!(g["rollout"]["tooShort"], 4, "{g}");
    let a = group(&api);
    assert_eq!(a["lease"]["owner"], "resync-demo-7f3a", "{a}");
    assert_eq!(
        a["lease"]["until"],
        tgsync::logging::rfc3339(until.0),
        "{a}"
    );
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
    assert!(row.ends_with("4 too short, 4 no gate"), "{out}");
    assert!(
        out.lines().any(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            words.len() > 4
                && words[..4] == ["10.0.1.2:8080", "unhealthy", "tgsync", "(shop/web-2)"]
                && l.contains("no preStop sleep")
        }),
        "{out}"
    );
    assert!(
        out.lines().any(|l| l.split_whitespace().collect::<Vec<_>>()
            == ["10.0.9.9:8080", "healthy", "foreign", "-"]),
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

/// Creates stack `name` in moto with the template's shape: the `ClusterName` parameter
/// (and `AllowedNamespaces`), the `StateTableName` and `ManualFunctionName` outputs.
async fn create_stack(
    sdk: &aws_config::SdkConfig,
    name: &str,
    parameters: &[(&str, &str)],
    outputs: &[(&str, &str)],
) {
    let template = json!({
        "AWSTemplateFormatVersion": "2010-09-09",
        "Parameters": {
            "ClusterName": { "Type": "String" },
            "AllowedNamespaces": { "Type": "String", "Default": "" },
        },
        "Resources": { "Queue": { "Type": "AWS::SQS::Queue" } },
        "Outputs": outputs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), json!({ "Value": v })))
            .collect::<serde_json::Map<_, _>>(),
    });
    let cfn = aws_sdk_cloudformation::Client::new(sdk);
    cfn.create_stack()
        .stack_name(name)
        .template_body(template.to_string())
        .set_parameters(Some(
            parameters
                .iter()
                .map(|(k, v)| {
                    aws_sdk_cloudformation::types::Parameter::builder()
                        .parameter_key(*k)
                        .parameter_value(*v)
                        .build()
                })
                .collect(),
        ))
        .send()
        .await
        .expect("stack created");
}

/// `--stack` (or `TGSYNC_STACK`) is all a command needs: the cluster from the stack's
/// `ClusterName` parameter, the table and the manual function from its outputs, and the
/// functions' `AllowedNamespaces` for what `status` plans.
#[tokio::test(flavor = "multi_thread")]
async fn the_stack_names_the_deployment() {
    let s = Setup::new().await;
    let w = &s.w;
    let web = w.group("shop", "app=web", 8080, &[]).await;
    let elsewhere = w.group("other", "app=web", 8080, &[]).await;
    w.put_pod(web_pod("web-1", "10.0.1.1"));
    let stack = moto::unique("tgsync");
    create_stack(
        &w.sdk,
        &stack,
        &[("ClusterName", &w.cluster), ("AllowedNamespaces", "shop")],
        &[
            ("StateTableName", &w.table),
            ("ManualFunctionName", &s.manual),
        ],
    )
    .await;
    let env = without(
        &s.env(),
        &[
            "TGSYNC_CLUSTER_NAME",
            "TGSYNC_TABLE_NAME",
            "TGSYNC_MANUAL_FUNCTION",
        ],
    );
    // Without the stack, nothing says which deployment.
    let o = tgsync_with(&["status"], &env);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("--cluster is not set: pass --stack NAME"),
        "{}",
        text(&o)
    );

    let o = tgsync_with(&["--stack", &stack, "status", "--json"], &env);
    // The group of a namespace the stack does not allow is a binding error: exit 1.
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let status = json_of(&o);
    assert_eq!(status["cluster"], w.cluster.as_str(), "{status}");
    assert_eq!(status["table"], w.table.as_str(), "{status}");
    let group = |arn: &str| {
        status["groups"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["targetGroupArn"] == arn)
            .unwrap_or_else(|| panic!("{arn} in {status}"))
            .clone()
    };
    assert_eq!(group(&web)["desired"], 1, "{status}");
    assert!(group(&web).get("error").is_none(), "{status}");
    assert!(
        group(&elsewhere)["error"]
            .as_str()
            .is_some_and(|e| e.contains("may not serve")),
        "AllowedNamespaces from the stack: {status}"
    );

    // TGSYNC_STACK does the same; plan goes through the stack's manual function.
    let mut by_variable = env.clone();
    by_variable.push(("TGSYNC_STACK", stack.clone()));
    let o = tgsync_with(&["plan", &web], &by_variable);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("  + 10.0.1.1:8080"),
        "{}",
        text(&o)
    );
    assert_eq!(s.lambda.invocations(&s.manual), 1);
    // A flag wins over the stack's output.
    let o = tgsync_with(
        &["plan", "--function", "not-the-stacks", &web],
        &by_variable,
    );
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("function `not-the-stacks` not found"),
        "{}",
        text(&o)
    );
}

/// The error lines of `o`: stderr without the progress lines.
fn error_lines(o: &Output) -> Vec<String> {
    String::from_utf8_lossy(&o.stderr)
        .lines()
        .filter(|l| !l.ends_with(" ..."))
        .map(str::to_owned)
        .collect()
}

/// The `--verbose` lines with the SDK's account of a failure (`name: value` each, the
/// prefix taken off), one per line.
fn detail_lines(o: &Output) -> String {
    let lines: Vec<String> = String::from_utf8_lossy(&o.stderr)
        .lines()
        .filter_map(|l| l.strip_prefix("tgsync: detail: ").map(str::to_owned))
        .collect();
    assert!(!lines.is_empty(), "detail lines: {}", text(o));
    lines.join("\n")
}

/// A failure is one line on stderr that names the cause and what to do, exit 4, and
/// nothing on stdout; `--verbose` adds the SDK's account of it.
fn assert_one_line(o: &Output, says: &[&str]) {
    assert_eq!(o.status.code(), Some(4), "{}", text(o));
    assert!(o.stdout.is_empty(), "nothing on stdout: {}", text(o));
    let lines = error_lines(o);
    assert_eq!(lines.len(), 1, "one line: {}", text(o));
    for s in says {
        assert!(lines[0].contains(s), "{s:?}: {}", text(o));
    }
    for noise in [
        "DispatchFailure",
        "ConnectorError",
        "Some(",
        "sts:AssumeRole",
        "trusts the function roles",
    ] {
        assert!(!lines[0].contains(noise), "{noise:?}: {}", text(o));
    }
}

/// No credentials and no region, as on a machine that never ran `aws configure`.
#[test]
fn without_credentials_or_region_one_line_says_what_to_do() {
    let home = std::env::temp_dir().join(moto::unique("empty-home"));
    std::fs::create_dir_all(&home).unwrap();
    let bare = vec![
        ("HOME", home.display().to_string()),
        ("AWS_EC2_METADATA_DISABLED", "true".to_owned()),
    ];
    let mut with_region = bare.clone();
    with_region.push(("AWS_REGION", "eu-west-1".to_owned()));
    for args in [
        &["--cluster", "prod", "--table", "t", "status"][..],
        &["plan"][..],
        &["--stack", "tgsync", "status"][..],
        &["release", "--yes", "web"][..],
    ] {
        let o = tgsync_with(args, &with_region);
        assert_one_line(
            &o,
            &[
                "no AWS credentials: run `aws configure` or `aws sso login`",
                "AWS_PROFILE",
            ],
        );
    }
    // A profile asked for, and none of it there.
    let o = tgsync_with(&["--profile", "prod", "plan"], &with_region);
    assert_one_line(
        &o,
        &["no AWS credentials for profile `prod`: run `aws sso login --profile prod`"],
    );
    // Under --verbose, what the SDK said too.
    let o = tgsync_with(&["plan", "--verbose"], &with_region);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.lines()
            .skip(1)
            .all(|l| l.starts_with("tgsync: detail: ")),
        "{}",
        text(&o)
    );
    let detail = detail_lines(&o);
    assert!(detail.starts_with("kind: no credentials\n"), "{}", text(&o));
    assert!(
        detail.contains("no providers in chain provided credentials"),
        "{}",
        text(&o)
    );

    let mut no_region = bare.clone();
    no_region.extend([
        ("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE".to_owned()),
        ("AWS_SECRET_ACCESS_KEY", "secret".to_owned()),
    ]);
    let o = tgsync_with(&["plan"], &no_region);
    assert_one_line(&o, &["no AWS region: pass --region, set AWS_REGION"]);
    // --region is enough (the call then fails on its endpoint: a closed local port).
    let closed = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    no_region.push(("AWS_ENDPOINT_URL", format!("http://{closed}")));
    let o = tgsync_with(
        &[
            "--region",
            "eu-west-1",
            "--cluster",
            "c",
            "--table",
            "t",
            "status",
        ],
        &no_region,
    );
    assert_one_line(&o, &["cannot reach ELBv2", "check the network"]);
    let _ = std::fs::remove_dir_all(&home);
}

/// A stack or a function that is not there, against moto and the Lambda model.
#[tokio::test(flavor = "multi_thread")]
async fn what_is_not_there_is_named() {
    let s = Setup::new().await;
    let missing = moto::unique("no-such-stack");
    let o = s.tgsync(&["--stack", &missing, "status"]);
    assert_one_line(
        &o,
        &[&format!(
            "stack `{missing}` not found in us-east-1: check the name (--stack or TGSYNC_STACK) and the region"
        )],
    );
    let o = s.tgsync(&["--function", "tgsync-nope", "plan"]);
    assert_one_line(
        &o,
        &[
            "function `tgsync-nope` not found in us-east-1",
            "--stack",
            "--function",
        ],
    );
    let o = s.tgsync(&["--function", "tgsync-nope", "plan", "-v"]);
    let detail = detail_lines(&o);
    assert!(
        detail.contains("code: ResourceNotFoundException\nmessage: Function not found"),
        "{}",
        text(&o)
    );
    // A stack without the outputs of tgsync's template.
    let other = moto::unique("other-stack");
    create_stack(
        &s.w.sdk,
        &other,
        &[("ClusterName", "prod")],
        &[("Something", "else")],
    )
    .await;
    let o = s.tgsync(&["--stack", &other, "--cluster", "x", "status"]);
    let o2 = tgsync_with(
        &["--stack", &other, "status"],
        &without(&s.env(), &["TGSYNC_CLUSTER_NAME", "TGSYNC_TABLE_NAME"]),
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout)
            .starts_with(&format!("cluster x, state table {}: 0 group(s)", s.w.table)),
        "--cluster and TGSYNC_TABLE_NAME win over the stack: {}",
        text(&o)
    );
    assert_one_line(
        &o2,
        &[
            &format!("stack `{other}` (CREATE_COMPLETE) has no output `StateTableName`"),
            "--table",
        ],
    );
}

/// A local endpoint that refuses every call as IAM does: 403 with AccessDenied in the
/// body of the service's protocol (Lambda's JSON for Invoke, the query protocol's XML
/// for CloudFormation and ELBv2).
fn denying_endpoint() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || deny(stream));
        }
    });
    url
}

fn deny(mut stream: TcpStream) {
    let mut request = Vec::new();
    let mut chunk = [0u8; 8192];
    let (head_end, length) = loop {
        let Ok(n) = stream.read(&mut chunk) else {
            return;
        };
        if n == 0 {
            return;
        }
        request.extend_from_slice(&chunk[..n]);
        if let Some(end) = request.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&request[..end]).to_ascii_lowercase();
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            break (end + 4, length);
        }
    };
    while request.len() < head_end + length {
        let Ok(n) = stream.read(&mut chunk) else {
            return;
        };
        if n == 0 {
            break;
        }
        request.extend_from_slice(&chunk[..n]);
    }
    let head = String::from_utf8_lossy(&request[..head_end]);
    let path = head.split_whitespace().nth(1).unwrap_or("/");
    let who = "User: arn:aws:iam::123456789012:user/dev is not authorized to perform";
    let (kind, extra, body) = if path.starts_with("/2015-03-31/functions/") {
        (
            "application/json",
            "x-amzn-ErrorType: AccessDeniedException\r\n",
            json!({ "Type": "User", "Message": format!("{who}: lambda:InvokeFunction because no identity-based policy allows the lambda:InvokeFunction action") }).to_string(),
        )
    } else {
        (
            "text/xml",
            "",
            format!(
                "<ErrorResponse><Error><Type>Sender</Type><Code>AccessDenied</Code><Message>{who} this action</Message></Error><RequestId>7a62c49f-347e-4fc4-9331-6e8eEXAMPLE</RequestId></ErrorResponse>"
            ),
        )
    };
    let _ = write!(
        stream,
        "HTTP/1.1 403 Forbidden\r\nContent-Type: {kind}\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

/// IAM's refusal names the action, and under --verbose what AWS said (the identity).
#[test]
fn access_denied_names_the_action() {
    let denied = denying_endpoint();
    let mut env = aws_env();
    env.push(("AWS_ENDPOINT_URL", denied.clone()));
    let o = tgsync_with(&["--stack", "tgsync", "status"], &env);
    assert_one_line(
        &o,
        &[
            "access denied: cloudformation:DescribeStacks on stack `tgsync`; use credentials that may describe the stack",
        ],
    );
    let o = tgsync_with(&["--cluster", "prod", "--table", "t", "status"], &env);
    assert_one_line(
        &o,
        &[
            "access denied: elasticloadbalancing:DescribeTargetGroups; use credentials that may read target groups",
        ],
    );
    let o = tgsync_with(&["--function", "tgsync-manual", "sync"], &env);
    assert_one_line(
        &o,
        &[
            "access denied: lambda:InvokeFunction on `tgsync-manual`; your credentials need lambda:InvokeFunction",
        ],
    );
    let o = tgsync_with(&["--function", "tgsync-manual", "sync", "--verbose"], &env);
    let detail = detail_lines(&o);
    assert!(
        detail.contains("code: AccessDeniedException")
            && detail
                .contains("message: User: arn:aws:iam::123456789012:user/dev is not authorized"),
        "{}",
        text(&o)
    );
}

/// Colour on a terminal (run under `script`, which gives the command one), none with
/// a non-empty NO_COLOR, TERM=dumb, --json, or when stdout is a pipe.
#[tokio::test(flavor = "multi_thread")]
async fn colour_only_on_a_terminal() {
    let s = Setup::new().await;
    let web = s.w.group("shop", "app=web", 8080, &[]).await;
    s.w.put_pod(web_pod("web-1", "10.0.1.1"));
    let on_a_terminal = |args: &str, extra: &[(&'static str, String)]| {
        let mut env = s.env();
        // What a terminal sets (the environment is cleared below).
        env.push(("TERM", "xterm-256color".to_owned()));
        env.extend_from_slice(extra);
        let command = format!("{} {args}", env!("CARGO_BIN_EXE_tgsync"));
        let o = Command::new("script")
            .args(["-qec", &command, "/dev/null"])
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(env.iter().map(|(k, v)| (*k, v)))
            .stdin(Stdio::null())
            .output()
            .expect("script (util-linux) runs");
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let painted = on_a_terminal(&format!("plan {web}"), &[]);
    assert!(painted.contains("\x1b[32m  + 10.0.1.1:8080"), "{painted:?}");
    let plain = on_a_terminal(&format!("plan {web}"), &[("NO_COLOR", "1".to_owned())]);
    assert!(
        plain.contains("  + 10.0.1.1:8080") && !plain.contains("\x1b[3"),
        "{plain:?}"
    );
    // An empty NO_COLOR is ignored (https://no-color.org), as docs/cli.md says.
    let empty = on_a_terminal(&format!("plan {web}"), &[("NO_COLOR", String::new())]);
    assert!(empty.contains("\x1b[32m  + 10.0.1.1:8080"), "{empty:?}");
    let dumb = on_a_terminal(&format!("plan {web}"), &[("TERM", "dumb".to_owned())]);
    assert!(!dumb.contains("\x1b[3"), "{dumb:?}");
    let json = on_a_terminal(&format!("plan --json {web}"), &[]);
    assert!(
        json.contains("\"dryRun\"") && !json.contains("\x1b[3"),
        "{json:?}"
    );
    let forced = s.tgsync(&["plan", "--color", "always", &web]);
    assert!(
        String::from_utf8_lossy(&forced.stdout).contains("\x1b[32m  + 10.0.1.1:8080"),
        "{}",
        text(&forced)
    );
    let piped = s.tgsync(&["plan", &web]);
    assert!(
        !String::from_utf8_lossy(&piped.stdout).contains('\x1b'),
        "{}",
        text(&piped)
    );
}

/// `tgsync completions bash` completes subcommands and flags in a real bash.
#[test]
fn shell_completions() {
    let script = Command::new(env!("CARGO_BIN_EXE_tgsync"))
        .args(["completions", "bash"])
        .env_clear()
        .output()
        .unwrap();
    assert_eq!(script.status.code(), Some(0), "{}", text(&script));
    let file = std::env::temp_dir().join(moto::unique("tgsync-completion.bash"));
    std::fs::write(&file, &script.stdout).unwrap();
    let complete = |line: &str| {
        let words: Vec<&str> = line.split(' ').collect();
        let program = format!(
            "source '{}'; COMP_WORDS=({}); COMP_CWORD={}; COMP_LINE='{line}'; COMP_POINT={}; _tgsync tgsync '{}' '{}'; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            file.display(),
            words
                .iter()
                .map(|w| format!("'{w}'"))
                .collect::<Vec<_>>()
                .join(" "),
            words.len() - 1,
            line.len(),
            words[words.len() - 1],
            words[words.len() - 2],
        );
        let o = Command::new("bash")
            .args(["--norc", "-c", &program])
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert_eq!(complete("tgsync st"), ["status"]);
    assert!(complete("tgsync status --st").contains(&"--stack".to_owned()));
    assert!(complete("tgsync completions ").contains(&"zsh".to_owned()));
    let _ = std::fs::remove_file(&file);
    for shell in ["zsh", "fish"] {
        let o = Command::new(env!("CARGO_BIN_EXE_tgsync"))
            .args(["completions", shell])
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        for word in [
            "status", "plan", "sync", "release", "stack", "region", "profile",
        ] {
            assert!(out.contains(word), "{shell}: {word}");
        }
    }
}

/// `tgsync man` prints a manual page (roff) that names every command, with no AWS call
/// (no credentials, no stack); `--dir` writes it and one page per command, as a release's
/// archive carries them.
#[test]
fn manual_pages() {
    let page = Command::new(env!("CARGO_BIN_EXE_tgsync"))
        .args(["man", "--stack", "no-such-stack"])
        .env_clear()
        .output()
        .unwrap();
    assert_eq!(page.status.code(), Some(0), "{}", text(&page));
    let roff = String::from_utf8_lossy(&page.stdout);
    assert!(roff.contains(".TH tgsync 1"), "{roff}");
    let commands = ["status", "plan", "sync", "release", "completions", "man"];
    for command in commands {
        assert!(
            roff.contains(&format!("tgsync\\-{command}(1)")),
            "{command}: {roff}"
        );
    }
    // The after-help's exit codes are in the page too.
    assert!(roff.contains("Exit codes"), "{roff}");
    let dir = std::env::temp_dir().join(moto::unique("tgsync-man"));
    let written = Command::new(env!("CARGO_BIN_EXE_tgsync"))
        .args(["man", "--dir"])
        .arg(&dir)
        .env_clear()
        .output()
        .unwrap();
    assert_eq!(written.status.code(), Some(0), "{}", text(&written));
    let mut pages: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    pages.sort();
    let mut want: Vec<String> = commands.iter().map(|c| format!("tgsync-{c}.1")).collect();
    want.push("tgsync.1".into());
    want.sort();
    assert_eq!(pages, want);
    // The printed page names no page `--dir` does not write (clap's `help` has none).
    for rest in roff.split("tgsync\\-").skip(1) {
        let name: String = rest
            .chars()
            .take_while(char::is_ascii_alphanumeric)
            .collect();
        if rest[name.len()..].starts_with("(1)") {
            assert!(
                pages.contains(&format!("tgsync-{name}.1")),
                "the page names tgsync-{name}(1), which `man --dir` does not write"
            );
        }
    }
    let release = std::fs::read_to_string(dir.join("tgsync-release.1")).unwrap();
    assert!(release.contains("\\-\\-yes"), "{release}");
    let _ = std::fs::remove_dir_all(&dir);
}
