//! The transcripts of docs/cli.md are what the built `tgsync` prints: a deployment named
//! as the template names it (stack `tgsync`, cluster `demo`, table `tgsync-state`,
//! function `tgsync-manual`, group `shop-web-8080`) in a moto server of this test's own
//! (so the names are free), the Kubernetes API emulator and the model of the Lambda
//! service; and the shell of a user without credentials. A change of what the CLI
//! prints fails here until the page shows it.

#[path = "support/binary.rs"]
mod binary;
#[path = "../../../tests/support/lambda_service.rs"]
mod lambda_service;
#[path = "../../../tests/support/moto.rs"]
mod moto;
#[path = "../../../tests/support/runtime_api.rs"]
mod runtime_api;
#[path = "../../../tests/support/world.rs"]
mod world;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use aws_sdk_elasticloadbalancingv2::types::TargetTypeEnum;
use binary::{text, tgsync_with};
use kube_emulator::{Emulator, EmulatorConfig};
use lambda_service::{Call, Function, InProcess, LambdaService};
use serde_json::json;
use tgsync::core::UnixMillis;
use tgsync::handlers::manual::Invocation;
use tgsync::testkit::PodBuilder;

const STACK: &str = "tgsync";
const CLUSTER: &str = "demo";
const TABLE: &str = "tgsync-state";
const GROUP: &str = "shop-web-8080";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The console blocks of docs/cli.md: each `$ command` line with the lines after it, up
/// to the next `$` line or the end of the block.
fn documented() -> Vec<String> {
    let page = std::fs::read_to_string(repo_root().join("docs/cli.md")).expect("docs/cli.md");
    let mut blocks = Vec::new();
    let mut inside = false;
    let mut current: Option<String> = None;
    for line in page.lines() {
        if line.starts_with("```") {
            blocks.extend(current.take());
            inside = !inside;
            continue;
        }
        if !inside {
            continue;
        }
        if line.starts_with("$ ") {
            blocks.extend(current.take());
            current = Some(String::new());
        }
        if let Some(c) = current.as_mut() {
            c.push_str(line);
            c.push('\n');
        }
    }
    blocks
}

/// Times that differ from run to run (`3 s ago`, `83 ms`, `0.4 s`) as `#`.
fn timeless(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find(|c: char| c.is_ascii_digit()) {
        let (before, from) = rest.split_at(i);
        out.push_str(before);
        let len = from
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(from.len());
        let (number, after) = from.split_at(len);
        // A number is a time when a unit follows it (and it does not end a longer word).
        let is_time = [" s ago", " ms", " s\n", " s "]
            .iter()
            .any(|unit| after.starts_with(unit))
            && !out.ends_with(|c: char| c.is_ascii_alphanumeric() || c == '-');
        out.push_str(if is_time { "#" } else { number });
        rest = after;
    }
    out.push_str(rest);
    out
}

/// Asserts that docs/cli.md shows `command`'s output `shown` (times aside).
fn assert_documented(command: &str, shown: &str) {
    let want = timeless(&format!("$ {command}\n{shown}"));
    let blocks = documented();
    assert!(
        blocks.iter().any(|b| timeless(b) == want),
        "docs/cli.md has no console block showing exactly this (times aside):\n{want}\nwhat this run printed:\n$ {command}\n{shown}\nthe page's blocks for `{command}`:\n{}",
        blocks
            .iter()
            .filter(|b| b.starts_with(&format!("$ {command}\n")))
            .cloned()
            .collect::<Vec<_>>()
            .join("---\n")
    );
}

fn pod(name: &str, ip: &str) -> k8s_openapi::api::core::v1::Pod {
    PodBuilder::new("shop", name)
        .label("app", "web")
        .ip(ip)
        .build()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_pages_transcripts_are_what_tgsync_prints() {
    moto::use_own_server();
    tgsync::app::install_crypto_provider();
    let sdk = moto::sdk_config().await;
    let creds = world::Creds::default();
    let mut config = EmulatorConfig::new(CLUSTER.to_owned());
    config.credentials = vec![("testing".to_owned(), "testing".to_owned())];
    config.allowed_sts_hosts = vec![moto::endpoint().trim_start_matches("http://").to_owned()];
    let emulator = Emulator::start(config).await.expect("emulator starts");
    let ca = std::env::temp_dir().join(moto::unique("transcript-ca.pem"));
    std::fs::write(&ca, emulator.ca_pem().expect("TLS emulator")).unwrap();
    tgsync::aws::create_table(&aws_sdk_dynamodb::Client::new(&sdk), TABLE)
        .await
        .expect("table created");
    let elb = aws_sdk_elasticloadbalancingv2::Client::new(&sdk);
    let web = world::create_group(
        &elb,
        GROUP,
        moto::vpc_id(),
        TargetTypeEnum::Ip,
        8080,
        &[
            ("tgsync/cluster", CLUSTER),
            ("tgsync/namespace", "shop"),
            ("tgsync/selector", "app=web"),
        ],
    )
    .await;
    world::register_in(&elb, &web, "10.0.9.9", 8080).await;
    for (name, ip) in [
        ("web-7d9f8c6b5-2xk4p", "10.0.1.11"),
        ("web-7d9f8c6b5-7hq9m", "10.0.1.12"),
        ("web-7d9f8c6b5-c5v8r", "10.0.1.13"),
    ] {
        emulator.store().put_pod(pod(name, ip)).unwrap();
    }

    // The manual function, as the template deploys it, running the library's handler.
    let engine = Arc::new(
        world::build_engine_on(
            CLUSTER,
            &sdk,
            &emulator,
            TABLE,
            Arc::new(tgsync::clock::SystemClock),
            creds.provider(),
        )
        .with_owner_prefix("manual"),
    );
    let code = move |call: Call| {
        let engine = engine.clone();
        async move {
            let invocation = Invocation {
                deadline: Some(UnixMillis(call.deadline_ms)),
                invoked_function_arn: call.invoked_arn,
            };
            tgsync::handlers::manual::handle(&engine, &call.payload, &invocation)
                .await
                .map_err(|e| json!({ "errorType": "HandlerError", "errorMessage": e.to_string() }))
        }
    };
    let manual = lambda_service::deployed(&repo_root().join("template.yaml"))
        .into_iter()
        .find(|d| d.logical_id == "ManualFunction")
        .expect("template.yaml has the manual function");
    let function = manual.name.clone();
    assert_eq!(function, "tgsync-manual", "the template's default name");
    let lambda = LambdaService::start(vec![Function {
        deployed: manual,
        backend: Arc::new(InProcess::new(code)),
    }])
    .await;

    // The stack: the template's ClusterName parameter and its outputs.
    let template = json!({
        "AWSTemplateFormatVersion": "2010-09-09",
        "Parameters": { "ClusterName": { "Type": "String" } },
        "Resources": { "Queue": { "Type": "AWS::SQS::Queue" } },
        "Outputs": {
            "StateTableName": { "Value": TABLE },
            "ManualFunctionName": { "Value": function },
        },
    });
    aws_sdk_cloudformation::Client::new(&sdk)
        .create_stack()
        .stack_name(STACK)
        .template_body(template.to_string())
        .parameters(
            aws_sdk_cloudformation::types::Parameter::builder()
                .parameter_key("ClusterName")
                .parameter_value(CLUSTER)
                .build(),
        )
        .send()
        .await
        .expect("stack created");

    // An operator's shell: credentials and region; the endpoints are the local peers
    // (in AWS, the cluster's endpoint and CA come from EKS DescribeCluster).
    let env: Vec<(&str, String)> = vec![
        ("AWS_REGION", moto::REGION.to_owned()),
        ("AWS_ACCESS_KEY_ID", "testing".to_owned()),
        ("AWS_SECRET_ACCESS_KEY", "testing".to_owned()),
        ("AWS_SESSION_TOKEN", "testing".to_owned()),
        ("AWS_CONFIG_FILE", "/dev/null".to_owned()),
        ("AWS_SHARED_CREDENTIALS_FILE", "/dev/null".to_owned()),
        ("AWS_EC2_METADATA_DISABLED", "true".to_owned()),
        ("AWS_ENDPOINT_URL", moto::endpoint().to_owned()),
        ("AWS_ENDPOINT_URL_LAMBDA", lambda.endpoint().to_owned()),
        ("TGSYNC_CLUSTER_ENDPOINT", emulator.url().to_string()),
        ("TGSYNC_CLUSTER_CA_FILE", ca.display().to_string()),
    ];
    let shown = |args: &[&str], code: i32| {
        let o = tgsync_with(args, &env);
        assert_eq!(o.status.code(), Some(code), "{}", text(&o));
        let command = format!("tgsync {}", args.join(" "));
        assert_documented(&command, &String::from_utf8_lossy(&o.stdout));
        o
    };
    shown(&["--stack", STACK, "plan"], 2);
    shown(&["--stack", STACK, "sync"], 0);
    // A pod turns up after the sync: status shows it pending.
    emulator
        .store()
        .put_pod(pod("web-7d9f8c6b5-m4tzw", "10.0.1.14"))
        .unwrap();
    let o = shown(&["--stack", STACK, "status"], 0);
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("reading the status of cluster demo"),
        "{}",
        text(&o)
    );

    // A user without credentials: a home without ~/.aws, no AWS variables.
    let home = std::env::temp_dir().join(moto::unique("home"));
    std::fs::create_dir_all(&home).unwrap();
    let bare = [
        ("HOME", home.display().to_string()),
        ("AWS_EC2_METADATA_DISABLED", "true".to_owned()),
    ];
    let o = tgsync_with(&["--stack", STACK, "status"], &bare);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    assert!(o.stdout.is_empty(), "{}", text(&o));
    assert_documented(
        &format!("tgsync --stack {STACK} status"),
        &String::from_utf8_lossy(&o.stderr),
    );
    let _ = std::fs::remove_dir_all(&home);
    let _ = std::fs::remove_file(&ca);
}

#[test]
fn times_are_set_aside_and_nothing_else() {
    assert_eq!(
        timeless("web  4  5  -  12 s ago\nplan: 1 group(s), 830 ms\ntook 0.4 s\n"),
        "web  4  5  -  # s ago\nplan: 1 group(s), # ms\ntook # s\n"
    );
    assert_eq!(
        timeless("shop-web-8080 (4 desired)"),
        "shop-web-8080 (4 desired)"
    );
    assert_eq!(timeless("10.0.1.11:8080"), "10.0.1.11:8080");
}
