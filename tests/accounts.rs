//! Target groups in other accounts: a deployment assumes one role per target account
//! (`TGSYNC_TARGET_ACCOUNT_ROLES`) and fills the groups tagged for its cluster there, as
//! in its own account. Production adapters against moto, whose STS AssumeRole hands out
//! credentials of the role's account (moto keeps every account's resources apart), and
//! the Kubernetes API emulator. The engine's AWS calls go through a rule proxy in front
//! of moto: moto lets anyone assume any role, so the proxy refuses AssumeRole of the
//! roles a test wants unassumable, with STS's own AccessDenied answer.

#[path = "support/chaos_proxy.rs"]
mod chaos_proxy;
#[path = "support/moto.rs"]
mod moto;
#[path = "support/world.rs"]
mod world;

use aws_config::sts::AssumeRoleProvider;
use aws_credential_types::provider::SharedCredentialsProvider;
use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_elasticloadbalancingv2::Client;
use aws_sdk_elasticloadbalancingv2::types::TargetTypeEnum;
use chaos_proxy::{ChaosProxy, Fate};
use tgsync::Engine;
use tgsync::aws::accounts::session_name;
use tgsync::aws::{Accounts, DynamoState, Elbv2TargetGroups, MutationRate, TargetAccountRole};
use tgsync::eks::KubePods;
use tgsync::logging::LambdaLevel;
use tgsync::reconcile::{PodEvent, RunOptions};
use tgsync::report::Outcome;
use tgsync::testkit::PodBuilder;
use world::{World, create_group, register_in, targets_in};

/// moto's default account: the deployment's own (its plain credentials land there).
const HOME: &str = "123456789012";
/// The central networking account owning an NLB.
const NETWORK: &str = "222222222222";
/// An account whose role tgsync cannot assume.
const LOCKED: &str = "333333333333";

/// The external ID the target accounts' trust policies ask for.
const EXTERNAL_ID: &str = "tgsync-test-7f3a";

type AccountsEngine = Engine<KubePods, Accounts, DynamoState>;

fn role(account: &str) -> TargetAccountRole {
    TargetAccountRole::parse(&format!("arn:aws:iam::{account}:role/tgsync-net")).expect("role ARN")
}

fn web(name: &str, ip: &str) -> PodBuilder {
    PodBuilder::new("shop", name).label("app", "web").ip(ip)
}

/// An ELBv2 client acting in `account`, as that account's own operator (its IaC): a
/// role there, assumed straight from moto's STS.
async fn operator_in(account: &str) -> Client {
    let base = moto::sdk_config().await;
    let provider = AssumeRoleProvider::builder(role(account).arn())
        .configure(&base)
        .session_name("operator")
        .build()
        .await;
    let config = base
        .to_builder()
        .credentials_provider(SharedCredentialsProvider::new(provider))
        .build();
    Client::new(&config)
}

/// Creates an IP target group named `name` in the account of `elb`, tagged for `w`'s
/// cluster (plus `extra`), and returns its ARN.
async fn group_in(
    elb: &Client,
    account: &str,
    w: &World,
    name: &str,
    extra: &[(&str, &str)],
) -> String {
    let mut tags = vec![
        ("tgsync/cluster", w.cluster.as_str()),
        ("tgsync/namespace", "shop"),
        ("tgsync/selector", "app=web"),
    ];
    tags.extend_from_slice(extra);
    let arn = create_group(
        elb,
        name,
        &moto::vpc_in(account),
        TargetTypeEnum::Ip,
        8080,
        &tags,
    )
    .await;
    assert_eq!(tgsync::core::arn::arn_account(&arn), Some(account), "{arn}");
    arn
}

/// `w`'s deployment with target account `roles`, the external ID, and every AWS call
/// of the engine (STS, ELBv2) through a proxy that refuses AssumeRole of `denied` and
/// requires `AvailabilityZone=all` for IPs outside 10.0.0.0/16, as ELBv2 does.
async fn deployment(
    w: &World,
    roles: &[TargetAccountRole],
    denied: &[&TargetAccountRole],
) -> (ChaosProxy, AccountsEngine) {
    let proxy = ChaosProxy::transparent().await;
    proxy.set_rules(|r| {
        r.deny_assume_role = denied.iter().map(|d| d.arn().to_owned()).collect();
        r.vpc = Some(("10.0.0.0".parse().unwrap(), 16));
    });
    let sdk = chaos_proxy::sdk_config(&proxy).await;
    let home = Elbv2TargetGroups::from_sdk_config(&sdk, MutationRate::new(50, None).unwrap());
    let groups = Accounts::assuming(
        home,
        &sdk,
        roles,
        Some(EXTERNAL_ID),
        &session_name(&w.cluster),
    );
    (proxy, w.engine_over(groups))
}

/// Whether the state table holds the item of group `arn`.
async fn has_item(w: &World, arn: &str) -> bool {
    w.ddb
        .get_item()
        .table_name(&w.table)
        .key("pk", AttributeValue::S(format!("tg#{arn}")))
        .key("sk", AttributeValue::S("group".into()))
        .consistent_read(true)
        .send()
        .await
        .expect("get item")
        .item
        .is_some()
}

/// Groups of the same name in this account and in a networking account both fill with
/// the cluster's pods; each keeps its own ledger (keyed by the ARN, which names the
/// account), each report names its account, a hand-registered target in the other
/// account stays, and an IP outside the VPC goes in with `AvailabilityZone=all` there
/// too. The role is assumed with the external ID and a session name naming the cluster.
#[tokio::test]
async fn groups_in_two_accounts_converge_without_colliding() {
    let w = World::new().await;
    let net = operator_in(NETWORK).await;
    let name = moto::unique("x").chars().take(32).collect::<String>();
    let name = name.trim_end_matches('-');
    let home_elb = operator_in(HOME).await;
    let home_arn = group_in(&home_elb, HOME, &w, name, &[]).await;
    let net_arn = group_in(&net, NETWORK, &w, name, &[]).await;
    assert_ne!(home_arn, net_arn);
    register_in(&net, &net_arn, "10.0.200.9", 8080).await;
    w.put_pod(web("web-1", "10.0.1.1").build());
    w.put_pod(web("web-2", "10.0.1.2").build());
    w.put_pod(web("web-3", "192.168.5.5").build());
    let (proxy, engine) = deployment(&w, &[role(NETWORK)], &[]).await;

    let r = engine.resync(&RunOptions::default()).await;
    assert!(r.errors.is_empty(), "{r:#?}");
    let want = ["10.0.1.1:8080", "10.0.1.2:8080", "192.168.5.5:8080"];
    for (arn, account) in [(&home_arn, HOME), (&net_arn, NETWORK)] {
        let g = r
            .group(arn)
            .unwrap_or_else(|| panic!("{arn} reported: {r:#?}"));
        assert_eq!(g.outcome, Outcome::Changed, "{r:#?}");
        assert_eq!(g.account, account);
        assert_eq!(g.name, name);
        assert_eq!(w.ledger(arn).await, want, "{arn}");
    }
    assert_eq!(targets_in(&home_elb, &home_arn).await, want);
    assert_eq!(
        targets_in(&net, &net_arn).await,
        [
            "10.0.1.1:8080",
            "10.0.1.2:8080",
            "10.0.200.9:8080",
            "192.168.5.5:8080"
        ],
        "the hand-registered target stays"
    );
    assert_eq!(r.group(&net_arn).unwrap().foreign_kept.len(), 1, "{r:#?}");
    // Reports and metric lines name the account.
    let json = serde_json::to_value(&r).unwrap();
    let accounts: Vec<&str> = json["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["account"].as_str().unwrap())
        .collect();
    assert_eq!(accounts.len(), 2);
    assert!(
        accounts.contains(&HOME) && accounts.contains(&NETWORK),
        "{json}"
    );
    let lines: Vec<serde_json::Value> = r
        .groups
        .iter()
        .flat_map(|g| {
            tgsync::metrics::pass_lines(
                &tgsync::metrics::PassDone {
                    function: "resync",
                    cluster: &r.cluster,
                    report: g,
                    dry_run: false,
                    reaction: None,
                    at: r.started_at,
                },
                LambdaLevel::Info,
            )
        })
        .map(|l| serde_json::from_str(&l).unwrap())
        .collect();
    assert!(
        lines
            .iter()
            .any(|l| l["Account"] == NETWORK && l["TargetGroupArn"] == net_arn.as_str()),
        "{lines:#?}"
    );
    // The out-of-VPC IP went with AvailabilityZone=all in both accounts (moto does not
    // show zones, so the calls that went through are read), the others without.
    let registers: Vec<String> = proxy
        .records()
        .into_iter()
        .filter(|r| r.operation == "RegisterTargets" && r.fate == Fate::Forwarded)
        .map(|r| r.body)
        .collect();
    for arn in [&home_arn, &net_arn] {
        let encoded = arn.replace(':', "%3A").replace('/', "%2F");
        let of_group: Vec<&String> = registers.iter().filter(|b| b.contains(&encoded)).collect();
        assert!(
            of_group.iter().any(|b| b.contains("192.168.5.5")
                && b.contains("AvailabilityZone=all")
                && b.matches("AvailabilityZone").count() == 1),
            "{arn}: {of_group:#?}"
        );
    }
    // The role was assumed through STS with the external ID and the cluster's session
    // name; each account's groups were changed with its own credentials.
    let assumed: Vec<String> = proxy
        .records()
        .into_iter()
        .filter(|r| r.operation == "AssumeRole")
        .map(|r| r.body)
        .collect();
    assert!(!assumed.is_empty(), "no AssumeRole went out");
    for body in &assumed {
        assert!(
            body.contains(&format!("ExternalId={EXTERNAL_ID}")),
            "{body}"
        );
        assert!(
            body.contains(&format!("RoleSessionName={}", session_name(&w.cluster))),
            "{body}"
        );
        assert!(body.contains(NETWORK), "{body}");
    }

    // A pod leaves: deregistered in both accounts; the foreign target stays.
    w.emulator.store().delete_pod("shop", "web-2");
    let r = engine.resync(&RunOptions::default()).await;
    for arn in [&home_arn, &net_arn] {
        let gone: Vec<String> = r
            .group(arn)
            .unwrap()
            .deregistered
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(gone, ["10.0.1.2:8080"], "{r:#?}");
    }
    assert_eq!(
        targets_in(&net, &net_arn).await,
        ["10.0.1.1:8080", "10.0.200.9:8080", "192.168.5.5:8080"]
    );
    let r = engine.resync(&RunOptions::default()).await;
    assert!(
        r.groups.iter().all(|g| g.outcome == Outcome::InSync),
        "{r:#?}"
    );
    // The credentials were cached by the client: one AssumeRole for three runs.
    let assumed = proxy
        .records()
        .iter()
        .filter(|r| r.operation == "AssumeRole")
        .count();
    assert_eq!(assumed, 1, "assumed once, then cached");
}

/// A role that cannot be assumed fails its account alone: one run-level error naming the
/// account and the role (counted by the metrics), that account's group untouched (not
/// even a state row), the other accounts converged; the refusal is not retried call by
/// call. pod-events, which reads the namespace's groups from this cluster's index, serves
/// the other accounts meanwhile. Once the role can be assumed, the account converges.
#[tokio::test]
async fn a_role_that_cannot_be_assumed_fails_only_its_account() {
    let w = World::new().await;
    let net = operator_in(NETWORK).await;
    let locked = operator_in(LOCKED).await;
    let home_arn = w.group("shop", "app=web", 8080, &[]).await;
    let net_arn = group_in(&net, NETWORK, &w, &tg_name(), &[]).await;
    // Exclusive: if tgsync reached it, the hand-registered target would go.
    let locked_arn = group_in(
        &locked,
        LOCKED,
        &w,
        &tg_name(),
        &[("tgsync/mode", "exclusive")],
    )
    .await;
    register_in(&locked, &locked_arn, "10.0.200.9", 8080).await;
    w.put_pod(web("web-1", "10.0.1.1").build());
    let (locked_role, net_role) = (role(LOCKED), role(NETWORK));
    let (proxy, engine) = deployment(
        &w,
        &[net_role.clone(), locked_role.clone()],
        &[&locked_role],
    )
    .await;

    let started = std::time::Instant::now();
    let r = engine.resync(&RunOptions::default()).await;
    assert_eq!(r.errors.len(), 1, "{r:#?}");
    let error = &r.errors[0];
    for needed in [
        format!("account {LOCKED}"),
        locked_role.arn().to_owned(),
        "AccessDenied".to_owned(),
        "left untouched".to_owned(),
    ] {
        assert!(error.contains(&needed), "{needed} in {error}");
    }
    assert!(r.group(&locked_arn).is_none(), "{r:#?}");
    for arn in [&home_arn, &net_arn] {
        assert_eq!(r.group(arn).unwrap().outcome, Outcome::Changed, "{r:#?}");
    }
    assert_eq!(w.targets(&home_arn).await, ["10.0.1.1:8080"]);
    assert_eq!(targets_in(&net, &net_arn).await, ["10.0.1.1:8080"]);
    assert_eq!(targets_in(&locked, &locked_arn).await, ["10.0.200.9:8080"]);
    assert!(
        !has_item(&w, &locked_arn).await,
        "no state for an unread account"
    );
    let run_line: serde_json::Value =
        serde_json::from_str(&tgsync::metrics::emf_lines(&r, LambdaLevel::Info)[0]).unwrap();
    assert_eq!(run_line["ReconcileErrors"], 1, "{run_line}");
    // One refused AssumeRole, not a retry storm (the provider's STS client retries what
    // is transient; an AccessDenied is not).
    let denied = proxy
        .records()
        .iter()
        .filter(|r| r.operation == "AssumeRole" && r.fate == Fate::Refused)
        .count();
    assert_eq!(denied, 1, "{:#?}", proxy.records());
    assert!(
        started.elapsed() < std::time::Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );

    // Asking for the locked group alone: the account's error says why, once.
    let only = engine
        .resync(&RunOptions {
            only: Some(vec![locked_arn.clone()]),
            ..RunOptions::default()
        })
        .await;
    assert_eq!(only.errors.len(), 1, "{only:#?}");
    assert!(only.errors[0].contains(LOCKED), "{only:#?}");

    // pod-events reads the namespace's groups from this cluster's index (home's and
    // net's hold its targets): it serves them without discovering every account, so the
    // locked account, which holds none of this cluster's targets, is the resync's to
    // report.
    w.put_pod(web("web-2", "10.0.1.2").build());
    let event = PodEvent {
        namespace: "shop".into(),
        name: "web-2".into(),
        uid: None,
        labels: None,
        deleted: false,
        reason: "invoke".into(),
    };
    let r = engine
        .pod_event(&event, std::time::Duration::ZERO, &RunOptions::default())
        .await
        .expect("pod event");
    assert!(r.errors.is_empty(), "{r:#?}");
    assert_eq!(
        w.targets(&home_arn).await,
        ["10.0.1.1:8080", "10.0.1.2:8080"]
    );
    assert_eq!(
        targets_in(&net, &net_arn).await,
        ["10.0.1.1:8080", "10.0.1.2:8080"],
        "{r:#?}"
    );
    assert_eq!(targets_in(&locked, &locked_arn).await, ["10.0.200.9:8080"]);

    // The role's trust is fixed: the next run converges that account as well.
    proxy.set_rules(|r| r.deny_assume_role.clear());
    let r = engine.resync(&RunOptions::default()).await;
    assert!(r.errors.is_empty(), "{r:#?}");
    assert_eq!(r.group(&locked_arn).unwrap().account, LOCKED);
    assert_eq!(
        targets_in(&locked, &locked_arn).await,
        ["10.0.1.1:8080", "10.0.1.2:8080"],
        "{r:#?}"
    );

    // A new container whose role is refused again: the group it filled in that account
    // is not known to be unbound, so it is not reported orphaned (nor touched).
    let (_proxy, refused) = deployment(&w, &[net_role, locked_role.clone()], &[&locked_role]).await;
    let r = refused.resync(&RunOptions::default()).await;
    assert_eq!(r.errors.len(), 1, "{r:#?}");
    assert_eq!(r.orphans.as_deref(), Some(&[][..]), "{r:#?}");
    assert_eq!(
        targets_in(&locked, &locked_arn).await,
        ["10.0.1.1:8080", "10.0.1.2:8080"]
    );
}

/// A valid target group name unique to this call.
fn tg_name() -> String {
    moto::unique("x")
        .chars()
        .take(32)
        .collect::<String>()
        .trim_end_matches('-')
        .to_owned()
}

/// A node labelled with `zone` (in the cluster's account's naming).
fn node_in(name: &str, zone: &str) -> k8s_openapi::api::core::v1::Node {
    k8s_openapi::api::core::v1::Node {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(name.into()),
            labels: Some(std::collections::BTreeMap::from([(
                "topology.kubernetes.io/zone".to_owned(),
                zone.to_owned(),
            )])),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// An ALB group with cross-zone load balancing off, in the networking account, wants its
/// targets outside the VPC in a named zone of that account. Zone names differ between
/// accounts (the proxy names the networking account's zones differently from moto's,
/// which are this account's; zone IDs are the same): each target goes in the networking
/// account's name for its node's zone ID, and a node in a zone that account does not
/// have is reported with what to do while the others go in.
#[tokio::test]
async fn another_accounts_group_gets_its_own_name_of_the_pods_zone() {
    let w = World::new().await;
    let net = operator_in(NETWORK).await;
    let net_arn = group_in(&net, NETWORK, &w, &tg_name(), &[]).await;
    let (proxy, engine) = deployment(&w, &[role(NETWORK)], &[]).await;
    // moto's names, this account's: us-east-1a is use1-az6, us-east-1b use1-az1,
    // us-east-1f use1-az5. The networking account calls use1-az6 `us-east-1c` and
    // use1-az1 `us-east-1d`, and has no use1-az5; its VPC spans those two zones.
    let theirs = [
        ("us-east-1a", "use1-az3"),
        ("us-east-1b", "use1-az4"),
        ("us-east-1c", "use1-az6"),
        ("us-east-1d", "use1-az1"),
        ("us-east-1e", "use1-az2"),
    ];
    proxy.set_rules(|r| {
        r.cross_zone_off = vec![net_arn.clone()];
        r.zones = vec!["us-east-1c".into(), "us-east-1d".into()];
        r.zone_names = vec![(
            NETWORK.to_owned(),
            theirs
                .iter()
                .map(|(n, i)| ((*n).to_owned(), (*i).to_owned()))
                .collect(),
        )];
    });
    let nodes = w.emulator.store();
    nodes.put_node(node_in("node-a", "us-east-1a"));
    nodes.put_node(node_in("node-b", "us-east-1b"));
    nodes.put_node(node_in("node-f", "us-east-1f"));
    w.put_pod(web("web-1", "192.168.0.1").node("node-a").build());
    w.put_pod(web("web-2", "192.168.0.2").node("node-b").build());
    w.put_pod(web("web-3", "192.168.0.3").node("node-f").build());

    let r = engine.resync(&RunOptions::default()).await;
    let g = r
        .group(&net_arn)
        .unwrap_or_else(|| panic!("reported: {r:#?}"));
    let registered: Vec<String> = g.registered.iter().map(ToString::to_string).collect();
    assert_eq!(
        registered,
        ["192.168.0.1:8080", "192.168.0.2:8080"],
        "{r:#?}"
    );
    let held = proxy.held(&net_arn);
    assert_eq!(held["192.168.0.1:8080"].0.as_deref(), Some("us-east-1c"));
    assert_eq!(held["192.168.0.2:8080"].0.as_deref(), Some("us-east-1d"));
    assert!(!held.contains_key("192.168.0.3:8080"), "{held:?}");
    let said = serde_json::to_string(g).unwrap();
    assert!(
        said.contains("192.168.0.3:8080")
            && said.contains("(use1-az5) is not a zone of account 222222222222"),
        "{said}"
    );
    assert_eq!(
        targets_in(&net, &net_arn).await,
        ["192.168.0.1:8080", "192.168.0.2:8080"]
    );
    // Each account's zones were read once: this account's from moto, the networking
    // account's with the role's credentials.
    let zone_reads = || {
        proxy
            .records()
            .iter()
            .filter(|r| r.operation == "DescribeAvailabilityZones")
            .count()
    };
    assert_eq!(zone_reads(), 2, "one read per account");

    // A later pod goes in its zone (translated from what this container read) and leaves
    // as any other.
    w.put_pod(web("web-4", "192.168.0.4").node("node-b").build());
    w.emulator.store().delete_pod("shop", "web-1");
    let r = engine
        .resync(&RunOptions {
            force: true,
            ..RunOptions::default()
        })
        .await;
    let g = r.group(&net_arn).unwrap();
    let registered: Vec<String> = g.registered.iter().map(ToString::to_string).collect();
    assert_eq!(registered, ["192.168.0.4:8080"], "{r:#?}");
    assert_eq!(
        proxy.held(&net_arn)["192.168.0.4:8080"].0.as_deref(),
        Some("us-east-1d")
    );
    assert_eq!(
        targets_in(&net, &net_arn).await,
        ["192.168.0.2:8080", "192.168.0.4:8080"]
    );
    assert_eq!(zone_reads(), 2, "zones are read once per container");
}
