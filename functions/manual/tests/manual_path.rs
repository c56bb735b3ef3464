//! The README's manual command against a model of the Lambda service that enforces each
//! function's reserved concurrency as `template.yaml` sets it
//! (`tests/support/lambda_service.rs`): while the scheduled resync holds its one slot
//! watching, the command still gets a dry-run plan within seconds, from the built
//! `tgsync-manual` binary behind the model's Runtime API. And a release through that
//! binary needs its `release` alias.
//!
//! With the command aimed at the resync function (as it was), the model answers 429
//! `TooManyRequestsException` for as long as the watch runs.

#[path = "../../../tests/support/lambda_service.rs"]
mod lambda_service;
#[path = "../../../tests/support/moto.rs"]
mod moto;
#[path = "../../../tests/support/process.rs"]
mod process;
#[path = "../../../tests/support/runtime_api.rs"]
mod runtime_api;
#[path = "../../../tests/support/world.rs"]
mod world;

use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_sdk_lambda::primitives::Blob;
use aws_sdk_lambda::types::InvocationType;
use lambda_service::{Call, Deployed, Function, InProcess, LambdaService, Processes};
use process::{Reaper, repo_root};
use runtime_api::RuntimeApi;
use serde_json::{Value, json};
use tgsync::core::UnixMillis;
use tgsync::testkit::PodBuilder;
use world::World;

/// How long the scheduled resync watches here (the template's default is 55 s).
const WATCH: Duration = Duration::from_secs(40);

/// The `aws lambda invoke` command of README's "Manual resync and dry run" section, as
/// (function name, qualifier, payload), checked to be the AWS CLI v2 form.
fn readme_command() -> (String, Option<String>, Value) {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).expect("README.md");
    let section = readme
        .split("## Manual resync and dry run")
        .nth(1)
        .expect("README has the section");
    let block = section
        .split("```sh")
        .skip(1)
        .filter_map(|b| b.split("```").next())
        .find(|b| b.contains("aws lambda invoke"))
        .expect("the section shows an `aws lambda invoke` command");
    let command = block
        .lines()
        .skip_while(|l| !l.contains("aws lambda invoke"))
        .map(|l| l.trim().trim_end_matches('\\').trim())
        .take_while(|l| !l.is_empty() && !l.starts_with('#'))
        .collect::<Vec<_>>()
        .join(" ");
    // Words, with '…' quoting (what the README uses for the JSON payload).
    let mut words = Vec::new();
    let mut rest = command.as_str();
    while let Some(start) = rest.find(|c: char| !c.is_whitespace()) {
        rest = &rest[start..];
        let (word, after) = if let Some(quoted) = rest.strip_prefix('\'') {
            let end = quoted.find('\'').expect("closing quote");
            (&quoted[..end], &quoted[end + 1..])
        } else {
            let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
            (&rest[..end], &rest[end..])
        };
        words.push(word.to_owned());
        rest = after;
    }
    let arg = |flag: &str| {
        words
            .iter()
            .position(|w| w == flag)
            .map(|i| words[i + 1].clone())
    };
    assert_eq!(
        arg("--cli-binary-format").as_deref(),
        Some("raw-in-base64-out"),
        "AWS CLI v2 reads --payload as base64 without it: {command}"
    );
    let function = arg("--function-name").expect("--function-name");
    let payload = serde_json::from_str(&arg("--payload").expect("--payload")).expect("JSON");
    (function, arg("--qualifier"), payload)
}

/// A Lambda client for the model, retrying as the AWS CLI v2 does by default (standard
/// mode, 3 attempts; TooManyRequestsException is retried).
fn lambda_client(endpoint: &str) -> aws_sdk_lambda::Client {
    use aws_sdk_lambda::config::{BehaviorVersion, Credentials, Region, retry::RetryConfig};
    let conf = aws_sdk_lambda::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(moto::REGION))
        .endpoint_url(endpoint)
        .credentials_provider(Credentials::new("testing", "testing", None, None, "test"))
        .retry_config(RetryConfig::standard().with_max_attempts(3))
        .build();
    aws_sdk_lambda::Client::from_conf(conf)
}

/// The functions of template.yaml; `name` of the one with this logical id.
fn function<'a>(functions: &'a [Deployed], logical_id: &str) -> &'a Deployed {
    functions
        .iter()
        .find(|f| f.logical_id == logical_id)
        .unwrap_or_else(|| panic!("template.yaml has no {logical_id}"))
}

fn unanswered(call: Call) -> std::future::Ready<lambda_service::Answer> {
    std::future::ready(Err(json!({
        "errorType": "NotInThisTest",
        "errorMessage": format!("{} is not run in this test", call.invoked_arn),
    })))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_readme_command_plans_while_the_schedule_watches() {
    let w = World::new().await;
    let arn = w.group("shop", "app=web", 8080, &[]).await;
    w.register_by_hand(&arn, "10.0.9.9", 8080).await;
    for (name, ip) in [("web-1", "10.0.1.1"), ("web-2", "10.0.1.2")] {
        w.put_pod(
            PodBuilder::new("shop", name)
                .label("app", "web")
                .ip(ip)
                .build(),
        );
    }

    let deployed = lambda_service::deployed(&repo_root().join("template.yaml"));
    let resync = function(&deployed, "ResyncFunction").clone();
    // The scheduled resync, in this process: the library's handler on the system clock
    // (the watch ends by it), in the model's slot of the resync function.
    let engine = Arc::new(world::build_engine_on(
        &w.cluster,
        &w.sdk,
        &w.emulator,
        &w.table,
        Arc::new(tgsync::clock::SystemClock),
        world::Creds::default().provider(),
    ));
    let resync_code = move |call: Call| {
        let engine = engine.clone();
        async move {
            tgsync::handlers::resync::handle_schedule(
                &engine,
                &call.payload,
                Some(UnixMillis(call.deadline_ms)),
                WATCH,
            )
            .await
            .map_err(|e| json!({ "errorType": "HandlerError", "errorMessage": e.to_string() }))
        }
    };
    // The manual function: the built binary, polling the model's Runtime API.
    let runtime = Arc::new(RuntimeApi::start().await);
    let _manual_process = Reaper(
        w.function(
            env!("CARGO_BIN_EXE_tgsync-manual"),
            "tgsync-manual",
            runtime.address(),
            moto::endpoint(),
        )
        .spawn()
        .expect("the manual binary starts"),
    );
    let functions = deployed
        .iter()
        .map(|d| Function {
            deployed: d.clone(),
            backend: match d.logical_id.as_str() {
                "ResyncFunction" => Arc::new(InProcess::new(resync_code.clone())),
                "ManualFunction" => Arc::new(Processes(runtime.clone())),
                _ => Arc::new(InProcess::new(unanswered)),
            },
        })
        .collect();
    let lambda = LambdaService::start(functions).await;
    let client = lambda_client(lambda.endpoint());

    // EventBridge's scheduled event, an asynchronous invoke: it takes the slot, runs
    // its full diff, then watches.
    let scheduled = std::fs::read(repo_root().join("events/scheduled.json")).unwrap();
    client
        .invoke()
        .function_name(&resync.name)
        .invocation_type(InvocationType::Event)
        .payload(Blob::new(scheduled))
        .send()
        .await
        .expect("the schedule's invoke is accepted");
    assert!(
        lambda
            .running(
                &resync.name,
                resync.reserved.unwrap_or(1),
                Duration::from_secs(5)
            )
            .await,
        "the scheduled resync holds every slot of {}",
        resync.name
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while w.targets(&arn).await.len() < 3 {
        assert!(
            Instant::now() < deadline,
            "the full diff registers the pods"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The README's command, while the resync watches.
    let (name, qualifier, payload) = readme_command();
    assert_eq!(payload, json!({ "dryRun": true }), "the README's dry run");
    let started = Instant::now();
    let answer = client
        .invoke()
        .function_name(&name)
        .set_qualifier(qualifier)
        .payload(Blob::new(payload.to_string()))
        .send()
        .await;
    let took = started.elapsed();
    let answer = answer.unwrap_or_else(|e| {
        panic!(
            "`aws lambda invoke --function-name {name}` failed after {took:?}: {}",
            aws_sdk_lambda::error::DisplayErrorContext(&e)
        )
    });
    assert_eq!(answer.function_error(), None, "{answer:?}");
    let report: Value = serde_json::from_slice(answer.payload().unwrap().as_ref()).unwrap();
    assert!(took < Duration::from_secs(10), "answered in {took:?}");
    assert_eq!(report["dryRun"], true, "{report}");
    assert_eq!(report["function"], "manual", "{report}");
    let group = &report["groups"][0];
    assert_eq!(group["targetGroupArn"], arn.as_str(), "{report}");
    assert_eq!(group["outcome"], "planned", "{report}");
    assert_eq!(group["plan"]["foreignKept"], json!(["10.0.9.9:8080"]));
    assert_eq!(
        lambda.in_flight(&resync.name),
        1,
        "the scheduled resync was still watching"
    );
    assert_eq!(lambda.throttles(&name), 0);

    // A release through the function itself is refused; through its alias it runs.
    let manual = function(&deployed, "ManualFunction").clone();
    let alias = manual
        .alias
        .clone()
        .expect("the manual function has an alias");
    w.elb
        .remove_tags()
        .resource_arns(&arn)
        .tag_keys("tgsync/cluster")
        .send()
        .await
        .expect("untag");
    let release = json!({ "release": [arn] }).to_string();
    let refused = client
        .invoke()
        .function_name(&manual.name)
        .payload(Blob::new(release.clone()))
        .send()
        .await
        .expect("invoke");
    assert_eq!(refused.function_error(), Some("Unhandled"));
    let error = String::from_utf8_lossy(refused.payload().unwrap().as_ref()).into_owned();
    assert!(error.contains("`release` alias"), "{error}");
    assert_eq!(w.targets(&arn).await.len(), 3, "nothing released");
    let released = client
        .invoke()
        .function_name(&manual.name)
        .qualifier(&alias)
        .payload(Blob::new(release))
        .send()
        .await
        .expect("invoke");
    assert_eq!(released.function_error(), None, "{released:?}");
    let report: Value = serde_json::from_slice(released.payload().unwrap().as_ref()).unwrap();
    assert_eq!(report["groups"][0]["outcome"], "released", "{report}");
    assert_eq!(w.targets(&arn).await, ["10.0.9.9:8080"]);
}
