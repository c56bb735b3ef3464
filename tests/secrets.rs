//! No EKS token and no AWS credential ever appears in logs (at TRACE, every crate), in
//! reports, or in metric lines — on the success path and on the 401 path.

#[path = "support/moto.rs"]
mod moto;
#[path = "support/world.rs"]
mod world;

use std::io::Write;
use std::sync::{Arc, Mutex};

use tgsync::testkit::PodBuilder;
use world::{Creds, World};

const AKID: &str = "AKIACANARYCANARY0000";
const SECRET: &str = "CanarySecretKey+DoNotLog/0123456789abcd";
const SESSION: &str = "CanarySessionToken//DoNotLog==";

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn assert_clean(what: &str, text: &str) {
    for needle in [
        "k8s-aws-v1.",
        SECRET,
        SESSION,
        "X-Amz-Signature",
        "X-Amz-Credential",
        "Bearer ",
    ] {
        if let Some(i) = text.find(needle) {
            let start = text[..i]
                .rfind("TRACE")
                .or(text[..i].rfind("DEBUG"))
                .unwrap_or(0);
            let end = text[i..].find('\n').map_or(text.len(), |n| i + n);
            panic!(
                "{what} contains {needle:?} in: {}",
                &text[start..end.min(start + 1500)]
            );
        }
    }
}

#[tokio::test]
async fn tokens_and_credentials_never_reach_any_output() {
    let logs = Captured::default();
    let writer = logs.clone();
    // The product's own log setup, at the most verbose level an operator could pick.
    tgsync::logging::init_with(Some("trace"), false, move || writer.clone());

    let creds = Creds {
        access_key_id: AKID.into(),
        secret: SECRET.into(),
        session_token: SESSION.into(),
    };
    // Success path: the emulator knows the canary key.
    let ok = World::with_creds(creds.clone(), (AKID, SECRET)).await;
    let arn = ok.group("shop", "app=web", 8080, &[]).await;
    ok.put_pod(
        PodBuilder::new("shop", "web-1")
            .label("app", "web")
            .ip("10.0.1.1")
            .build(),
    );
    let report = ok.resync().await;
    assert_eq!(ok.targets(&arn).await, ["10.0.1.1:8080"], "{report:#?}");
    let json = serde_json::to_string(&report).unwrap();
    assert_clean("report", &json);
    for line in tgsync::metrics::emf_lines(&report, tgsync::logging::LambdaLevel::Info) {
        assert_clean("metrics", &line);
    }

    // 401 path: the emulator knows another secret for this key.
    let refused = World::with_creds(creds, (AKID, "the-real-secret")).await;
    let arn = refused.group("shop", "app=web", 8080, &[]).await;
    refused.put_pod(
        PodBuilder::new("shop", "web-1")
            .label("app", "web")
            .ip("10.0.1.1")
            .build(),
    );
    let report = refused.resync().await;
    let error = report
        .group(&arn)
        .unwrap()
        .error
        .clone()
        .unwrap_or_default();
    assert!(error.contains("401"), "{error}");
    assert_clean("report", &serde_json::to_string(&report).unwrap());

    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert!(
        text.len() > 10_000,
        "TRACE logs were captured ({} bytes)",
        text.len()
    );
    assert!(
        text.contains("RegisterTargets") || text.contains("register"),
        "logs cover the run"
    );
    assert_clean("logs", &text);
}
