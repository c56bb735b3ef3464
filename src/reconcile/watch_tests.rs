//! Watch mode against the in-memory fakes: what needs a full diff held up at will.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::tests::no_waiting;
use super::{Engine, RunOptions};
use crate::clock::{Clock, ManualClock};
use crate::core::{Target, UnixMillis};
use crate::fakes::{FakeElb, FakePods, FakeState};
use crate::testkit::{PodBuilder, bound_group};

const SHOP: &str =
    "arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/web/0123456789abcdef";
const SLOW: &str =
    "arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/slow/1123456789abcdef";

fn web(name: &str, ip: &str) -> k8s_openapi::api::core::v1::Pod {
    PodBuilder::new("shop", name)
        .label("app", "web")
        .ip(ip)
        .build()
}

/// A large fleet's full diff is paced through its Describe budget for most of the
/// minute. The watch of a namespace starts as soon as the full diff has listed it, not
/// when the whole diff is over: a pod that turns up while another namespace's group
/// still waits for its health read is registered meanwhile.
#[tokio::test]
async fn a_namespace_is_watched_while_the_full_diff_still_works_on_others() {
    let clock = ManualClock::new(UnixMillis(1_800_000_000_000));
    let elb = FakeElb::default();
    elb.add_group(bound_group(SHOP, "demo", "shop", "app=web", 8080));
    elb.add_group(bound_group(SLOW, "demo", "batch", "app=job", 9000));
    let held = elb.hold_health(SLOW);
    let pods = FakePods::default();
    pods.put(web("web-1", "10.0.1.1"));
    let e = Engine::new(
        "demo",
        pods,
        elb,
        FakeState::default(),
        Arc::new(clock.clone()),
    )
    .with_settings(no_waiting());
    let until = clock.now().plus(Duration::from_secs(4));
    let opts = RunOptions {
        use_checkpoint: true,
        ..RunOptions::default()
    };
    let diff_over = AtomicBool::new(false);
    let watching = async {
        let report = e.resync_and_watch(&opts, until).await;
        diff_over.store(true, Ordering::SeqCst);
        report
    };
    let t = |s: &str| s.parse::<Target>().unwrap();
    let changes = async {
        // The full diff registers web-1, and is still held on the other group.
        while e.groups.live_targets(SHOP) != [t("10.0.1.1:8080")] {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        e.pods.put(web("web-2", "10.0.1.2"));
        let mut waited = Duration::ZERO;
        while e.groups.live_targets(SHOP).len() < 2 && waited < Duration::from_secs(2) {
            tokio::time::sleep(Duration::from_millis(10)).await;
            waited += Duration::from_millis(10);
        }
        let registered = e.groups.live_targets(SHOP).len() == 2;
        let diff_was_over = diff_over.load(Ordering::SeqCst);
        held.add_permits(1_000);
        (registered, diff_was_over)
    };
    let (report, (registered, diff_was_over)) = tokio::join!(watching, changes);
    assert!(
        !diff_was_over,
        "the full diff was still held: the race was staged"
    );
    assert!(
        registered,
        "web-2 registered by the watch during the full diff"
    );
    let watch = report.watch.expect("watch report");
    assert_eq!(watch.registered, 1, "{watch:#?}");
    assert_eq!(
        e.groups.live_targets(SHOP),
        [t("10.0.1.1:8080"), t("10.0.1.2:8080")]
    );
}
