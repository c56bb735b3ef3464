//! The ELBv2 adapter against moto's real ELBv2 wire protocol.

#[path = "support/moto.rs"]
mod moto;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use aws_sdk_elasticloadbalancingv2::Client;
use aws_sdk_elasticloadbalancingv2::types::{
    ProtocolEnum, Tag, TargetDescription, TargetGroupIpAddressTypeEnum, TargetTypeEnum,
};
use tgsync::aws::{Elbv2TargetGroups, MutationRate};
use tgsync::core::{AddressFamily, HealthState, Target};
use tgsync::groups::{ElbError, TargetGroupApi};
use tgsync::testkit::Unfenced;

async fn client() -> Client {
    // 450 groups of one test here would slow every later binary's discovery.
    moto::use_own_server();
    Client::new(&moto::sdk_config().await)
}

/// Creates a target group in moto and returns its ARN.
async fn create_group(
    client: &Client,
    name: &str,
    target_type: TargetTypeEnum,
    ipv6: bool,
    tags: &[(&str, &str)],
) -> String {
    let out = client
        .create_target_group()
        .name(name)
        .protocol(ProtocolEnum::Tcp)
        .port(8080)
        .vpc_id(moto::vpc_id())
        .target_type(target_type)
        .set_ip_address_type(ipv6.then_some(TargetGroupIpAddressTypeEnum::Ipv6))
        .set_tags(Some(
            tags.iter()
                .map(|(k, v)| Tag::builder().key(*k).value(*v).build())
                .collect(),
        ))
        .send()
        .await
        .unwrap_or_else(|e| panic!("create {name}: {}", tgsync::aws::error_summary(&e)));
    out.target_groups()[0]
        .target_group_arn()
        .expect("arn")
        .to_owned()
}

/// Target group names: at most 32 characters.
fn group_name(tag: &str) -> String {
    let mut name = moto::unique(tag).replace('_', "-");
    name.truncate(32);
    name.trim_end_matches('-').to_owned()
}

fn t(s: &str) -> Target {
    s.parse().expect("target")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovers_more_than_a_page_of_groups_with_tags() {
    let client = client().await;
    let mut prefix = group_name("d");
    prefix.truncate(27); // room for "-449" within the 32-character limit
    let prefix = prefix.trim_end_matches('-').to_owned();
    // 450 groups: more than one DescribeTargetGroups page (400) and many DescribeTags
    // batches (20). Created concurrently, a few at a time.
    let names: Vec<String> = (0..450).map(|i| format!("{prefix}-{i}")).collect();
    let mut arns = BTreeMap::new();
    for chunk in names.chunks(16) {
        let created = futures::future::join_all(chunk.iter().map(|name| {
            let client = &client;
            let prefix = &prefix;
            async move {
                let tags = [("tgsync/cluster", "c1"), ("index", name.as_str())];
                let target_type = if *name == format!("{prefix}-7") {
                    TargetTypeEnum::Instance
                } else {
                    TargetTypeEnum::Ip
                };
                let ipv6 = *name == format!("{prefix}-9");
                (
                    name.clone(),
                    create_group(client, name, target_type, ipv6, &tags).await,
                )
            }
        }))
        .await;
        arns.extend(created);
    }

    let elb = Elbv2TargetGroups::new(client.clone(), MutationRate::default());
    let found: Vec<_> = elb
        .discover(&tgsync::groups::Priority::Reaction)
        .await
        .expect("discover")
        .into_iter()
        .filter(|g| g.name.starts_with(&format!("{prefix}-")))
        .collect();
    assert_eq!(found.len(), 450);
    for g in &found {
        assert_eq!(arns.get(&g.name), Some(&g.arn), "{}", g.name);
        assert_eq!(g.tags.get("tgsync/cluster").map(String::as_str), Some("c1"));
        assert_eq!(g.tags.get("index"), Some(&g.name));
        assert_eq!(g.facts.port, Some(8080));
        let expected_family = if g.name == format!("{prefix}-9") {
            AddressFamily::Ipv6
        } else {
            AddressFamily::Ipv4
        };
        assert_eq!(g.facts.family, expected_family, "{}", g.name);
    }
    let instance: Vec<_> = found
        .iter()
        .filter(|g| g.facts.target_type == "instance")
        .map(|g| g.name.as_str())
        .collect();
    assert_eq!(instance, [format!("{prefix}-7").as_str()]);

    let calls = elb.api_calls();
    // moto 5.2.5 ignores PageSize/Marker for DescribeTargetGroups and answers with one
    // page; real ELBv2 would need two. Other tests' groups share the server, hence ≥.
    assert!(calls["DescribeTargetGroups"] >= 1);
    assert!(calls["DescribeTags"] >= 450u64.div_ceil(20), "{calls:?}");
    assert_eq!(calls["RegisterTargets"], 0);
}

/// `(target, state)` of each entry of a health read.
fn pairs(health: Vec<tgsync::core::TargetHealth>) -> Vec<(Target, HealthState)> {
    health.into_iter().map(|h| (h.target, h.state)).collect()
}

#[tokio::test]
async fn register_shows_targets_and_deregister_removes_them() {
    let client = client().await;
    let arn = create_group(&client, &group_name("h"), TargetTypeEnum::Ip, false, &[]).await;
    let elb = Elbv2TargetGroups::new(client.clone(), MutationRate::default());

    assert_eq!(
        elb.health(&arn, &tgsync::groups::Priority::Reaction)
            .await
            .expect("health"),
        vec![]
    );
    let targets = [t("10.0.1.7:8080"), t("10.0.1.8:8080"), t("10.0.1.9:9090")];
    elb.register(&arn, &targets, &Unfenced)
        .await
        .expect("register");
    let mut health = pairs(
        elb.health(&arn, &tgsync::groups::Priority::Reaction)
            .await
            .expect("health"),
    );
    health.sort_by_key(|(t, _)| *t);
    // moto reports a registered target as `healthy` at once (real ELBv2: `initial`, or
    // `unused` when no listener uses the group).
    assert_eq!(
        health,
        targets
            .iter()
            .map(|t| (*t, HealthState::Healthy))
            .collect::<Vec<_>>()
    );

    // A target whose Id is not an IP cannot be tgsync's: health leaves it out (moto
    // accepts any Id in an IP group, which lets this be tested).
    client
        .register_targets()
        .target_group_arn(&arn)
        .targets(
            TargetDescription::builder()
                .id("i-0123456789abcdef0")
                .port(80)
                .build(),
        )
        .send()
        .await
        .expect("register an instance id");
    assert_eq!(
        elb.health(&arn, &tgsync::groups::Priority::Reaction)
            .await
            .expect("health")
            .len(),
        3
    );

    elb.deregister(&arn, &targets[..2], &Unfenced)
        .await
        .expect("deregister");
    // moto drops a deregistered target at once (real ELBv2 shows it `draining` for the
    // deregistration delay).
    assert_eq!(
        pairs(
            elb.health(&arn, &tgsync::groups::Priority::Reaction)
                .await
                .expect("health")
        ),
        vec![(targets[2], HealthState::Healthy)]
    );
    let calls = elb.api_calls();
    assert_eq!(calls["RegisterTargets"], 1);
    assert_eq!(calls["DeregisterTargets"], 1);
    assert_eq!(calls["DescribeTargetHealth"], 4);
}

#[tokio::test]
async fn ipv6_targets_round_trip() {
    let client = client().await;
    let arn = create_group(&client, &group_name("v6"), TargetTypeEnum::Ip, true, &[]).await;
    let elb = Elbv2TargetGroups::new(client, MutationRate::default());
    let target = t("[fd00:10::7]:443");
    elb.register(&arn, &[target], &Unfenced)
        .await
        .expect("register");
    assert_eq!(
        pairs(
            elb.health(&arn, &tgsync::groups::Priority::Reaction)
                .await
                .expect("health")
        ),
        vec![(target, HealthState::Healthy)]
    );
}

/// The groups a cold container reads ahead of discovery: only those named, with their
/// tags (and the tags alone, of several groups in one call); a deleted one among them
/// fails the read (discovery decides then).
#[tokio::test]
async fn describes_the_named_groups_with_their_tags() {
    let client = client().await;
    let mut named = Vec::new();
    for tag in ["named-a", "named-b"] {
        let tags = [("tgsync/cluster", "c1"), ("which", tag)];
        named.push(create_group(&client, &group_name(tag), TargetTypeEnum::Ip, false, &tags).await);
    }
    let other = create_group(
        &client,
        &group_name("other"),
        TargetTypeEnum::Ip,
        false,
        &[],
    )
    .await;
    let elb = Elbv2TargetGroups::new(client.clone(), MutationRate::default());
    let found = elb
        .describe(&named, &tgsync::groups::Priority::Reaction)
        .await
        .expect("describe");
    let mut which: Vec<(&str, &str)> = found
        .iter()
        .map(|g| (g.arn.as_str(), g.tags["which"].as_str()))
        .collect();
    which.sort();
    let mut want = vec![
        (named[0].as_str(), "named-a"),
        (named[1].as_str(), "named-b"),
    ];
    want.sort();
    assert_eq!(which, want, "{other} was not named");
    let calls = elb.api_calls();
    assert_eq!(
        (calls["DescribeTargetGroups"], calls["DescribeTags"]),
        (1, 1)
    );
    // A pass's tag re-read names several groups in one DescribeTags.
    let tags = elb
        .tags_of(&named, &tgsync::groups::Priority::Reaction)
        .await
        .expect("tags");
    let which: Vec<Option<&str>> = named
        .iter()
        .map(|arn| {
            tags.get(arn)
                .and_then(|t| t.get("which"))
                .map(String::as_str)
        })
        .collect();
    assert_eq!(which, [Some("named-a"), Some("named-b")]);
    assert_eq!(elb.api_calls()["DescribeTags"], 2);

    client
        .delete_target_group()
        .target_group_arn(&named[1])
        .send()
        .await
        .expect("delete");
    assert!(
        elb.describe(&named, &tgsync::groups::Priority::Reaction)
            .await
            .is_err(),
        "a deleted group named"
    );
}

#[tokio::test]
async fn missing_group_is_not_found() {
    let client = client().await;
    let arn = create_group(&client, &group_name("gone"), TargetTypeEnum::Ip, false, &[]).await;
    client
        .delete_target_group()
        .target_group_arn(&arn)
        .send()
        .await
        .expect("delete");
    let elb = Elbv2TargetGroups::new(client, MutationRate::default());
    for result in [
        elb.health(&arn, &tgsync::groups::Priority::Reaction)
            .await
            .map(drop),
        elb.register(&arn, &[t("10.0.0.1:80")], &Unfenced).await,
        elb.deregister(&arn, &[t("10.0.0.1:80")], &Unfenced).await,
    ] {
        match result {
            Err(ElbError::NotFound { arn: a }) => assert_eq!(a, arn),
            other => panic!("expected NotFound, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn deregistering_a_target_that_is_not_registered_succeeds() {
    let client = client().await;
    let arn = create_group(&client, &group_name("inv"), TargetTypeEnum::Ip, false, &[]).await;
    let elb = Elbv2TargetGroups::new(client, MutationRate::default());
    // ELBv2 (and moto) refuse it with InvalidTarget: the target is already gone, which
    // is what a deregistration wants (a retry after a lost answer, a hand removal).
    // Other errors carry their code and message: `canned::throttling_is_retried_by_the_adapter_then_reported`.
    elb.deregister(&arn, &[t("10.9.9.9:80")], &Unfenced)
        .await
        .expect("an absent target counts as deregistered");
}

#[tokio::test]
async fn mutations_are_rate_limited_across_clones() {
    let client = client().await;
    let arn = create_group(&client, &group_name("rate"), TargetTypeEnum::Ip, false, &[]).await;
    let elb = Elbv2TargetGroups::new(client, MutationRate::new(4, Some(1)).expect("rate"));
    let clone = elb.clone();
    let start = Instant::now();
    let a = async {
        for i in 0..3 {
            elb.register(&arn, &[t(&format!("10.0.2.{i}:80"))], &Unfenced)
                .await
                .expect("register");
        }
    };
    let b = async {
        for i in 0..2 {
            clone
                .register(&arn, &[t(&format!("10.0.3.{i}:80"))], &Unfenced)
                .await
                .expect("register");
        }
    };
    futures::join!(a, b);
    // 5 calls at 4/s with burst 1: the last waits at least 4 × 250 ms.
    assert!(
        start.elapsed() >= Duration::from_millis(950),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(elb.api_calls()["RegisterTargets"], 5);
    assert_eq!(
        elb.health(&arn, &tgsync::groups::Priority::Reaction)
            .await
            .expect("health")
            .len(),
        5
    );
}

#[tokio::test]
async fn large_registrations_are_split_into_calls_of_200() {
    let client = client().await;
    let arn = create_group(&client, &group_name("big"), TargetTypeEnum::Ip, false, &[]).await;
    let elb = Elbv2TargetGroups::new(client, MutationRate::new(100, None).expect("rate"));
    let targets: Vec<Target> = (0..450u32)
        .map(|i| Target::new(std::net::Ipv4Addr::from(0x0a00_0000 + i).into(), 80))
        .collect();
    elb.register(&arn, &targets, &Unfenced)
        .await
        .expect("register");
    assert_eq!(elb.api_calls()["RegisterTargets"], 3);
    assert_eq!(
        elb.health(&arn, &tgsync::groups::Priority::Reaction)
            .await
            .expect("health")
            .len(),
        450
    );
}

/// What moto cannot show: real pagination of DescribeTargetGroups, DescribeTags failing
/// for a group deleted mid-discovery, and errors that survive the SDK's retries. A tiny
/// HTTP server answers with canned ELBv2 (awsQuery XML) responses.
mod canned {
    use std::collections::BTreeMap;
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::TcpListener;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use aws_config::retry::RetryConfig;
    use aws_sdk_elasticloadbalancingv2::{Client, config};
    use tgsync::aws::{Elbv2TargetGroups, MutationRate};
    use tgsync::groups::{ElbError, TargetGroupApi};

    type Params = BTreeMap<String, String>;
    type Handler = dyn Fn(&Params) -> (u16, String) + Send + Sync;

    /// Serves `handler` on a free port; returns the URL and the log of request params.
    fn serve(handler: Box<Handler>) -> (String, Arc<Mutex<Vec<Params>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let log = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&log);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let Some(params) = read_request(&mut stream) else {
                    continue;
                };
                let (status, body) = handler(&params);
                seen.lock().expect("log").push(params);
                let response = format!(
                    "HTTP/1.1 {status} X\r\nContent-Type: text/xml\r\nContent-Length: {}\r\n\
                     Connection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(response.as_bytes());
            }
        });
        (url, log)
    }

    fn read_request(stream: &mut std::net::TcpStream) -> Option<Params> {
        let mut reader = BufReader::new(stream);
        let mut length = 0;
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).ok()?;
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((k, v)) = line.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                length = v.trim().parse().ok()?;
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body).ok()?;
        Some(
            String::from_utf8(body)
                .ok()?
                .split('&')
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (decode(k), decode(v)))
                .collect(),
        )
    }

    fn decode(s: &str) -> String {
        let mut out = Vec::new();
        let bytes = s.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'%' if i + 2 < bytes.len() => {
                    let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).expect("hex");
                    out.push(u8::from_str_radix(hex, 16).expect("hex"));
                    i += 3;
                }
                b'+' => {
                    out.push(b' ');
                    i += 1;
                }
                b => {
                    out.push(b);
                    i += 1;
                }
            }
        }
        String::from_utf8(out).expect("utf8")
    }

    fn ok(action: &str, result: &str) -> (u16, String) {
        (
            200,
            format!(
                "<{action}Response xmlns=\"http://elasticloadbalancing.amazonaws.com/doc/2015-12-01/\">\
                 <{action}Result>{result}</{action}Result>\
                 <ResponseMetadata><RequestId>r</RequestId></ResponseMetadata></{action}Response>"
            ),
        )
    }

    fn error(status: u16, code: &str, message: &str) -> (u16, String) {
        (
            status,
            format!(
                "<ErrorResponse xmlns=\"http://elasticloadbalancing.amazonaws.com/doc/2015-12-01/\">\
                 <Error><Type>Sender</Type><Code>{code}</Code><Message>{message}</Message></Error>\
                 <RequestId>r</RequestId></ErrorResponse>"
            ),
        )
    }

    fn arn(name: &str) -> String {
        format!("arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/{name}/0")
    }

    fn group_xml(name: &str) -> String {
        format!(
            "<member><TargetGroupArn>{}</TargetGroupArn><TargetGroupName>{name}</TargetGroupName>\
             <Port>80</Port><TargetType>ip</TargetType></member>",
            arn(name)
        )
    }

    /// ARNs named in a DescribeTags request.
    fn arns_of(params: &Params) -> Vec<String> {
        params
            .iter()
            .filter(|(k, _)| k.starts_with("ResourceArns.member."))
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// A client for `url` with tgsync's settings but millisecond retry backoff, so
    /// retries are observable without waiting seconds.
    async fn client(url: &str) -> Client {
        let sdk = super::moto::sdk_config_for(url).await;
        let conf = config::Builder::from(&sdk)
            .retry_config(
                RetryConfig::standard()
                    .with_max_attempts(tgsync::aws::MAX_ATTEMPTS)
                    .with_initial_backoff(Duration::from_millis(1))
                    .with_max_backoff(Duration::from_millis(5)),
            )
            .build();
        Client::from_conf(conf)
    }

    #[tokio::test]
    async fn discovery_follows_markers_and_drops_groups_deleted_meanwhile() {
        let (url, log) = serve(Box::new(|p: &Params| {
            match p.get("Action").map(String::as_str) {
                Some("DescribeTargetGroups") => match p.get("Marker") {
                    None => ok(
                        "DescribeTargetGroups",
                        &format!(
                            "<TargetGroups>{}{}</TargetGroups><NextMarker>m1</NextMarker>",
                            group_xml("a"),
                            group_xml("gone")
                        ),
                    ),
                    Some(_) => ok(
                        "DescribeTargetGroups",
                        &format!("<TargetGroups>{}</TargetGroups>", group_xml("b")),
                    ),
                },
                Some("DescribeTags") => {
                    let arns = arns_of(p);
                    if arns.contains(&arn("gone")) {
                        return error(
                            400,
                            "TargetGroupNotFound",
                            "One or more target groups not found",
                        );
                    }
                    let members: String = arns
                        .iter()
                        .map(|a| {
                            format!(
                                "<member><ResourceArn>{a}</ResourceArn><Tags><member>\
                                 <Key>tgsync/cluster</Key><Value>c1</Value></member></Tags></member>"
                            )
                        })
                        .collect();
                    ok(
                        "DescribeTags",
                        &format!("<TagDescriptions>{members}</TagDescriptions>"),
                    )
                }
                _ => error(400, "InvalidAction", "unexpected"),
            }
        }));
        let elb = Elbv2TargetGroups::new(client(&url).await, MutationRate::default());
        let groups = elb
            .discover(&tgsync::groups::Priority::Reaction)
            .await
            .expect("discover");
        let names: Vec<_> = groups.iter().map(|g| g.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        assert!(groups.iter().all(|g| g.tags["tgsync/cluster"] == "c1"));

        let log = log.lock().expect("log");
        let pages: Vec<_> = log
            .iter()
            .filter(|p| p["Action"] == "DescribeTargetGroups")
            .collect();
        assert_eq!(pages.len(), 2);
        assert_eq!(pages[0].get("PageSize").map(String::as_str), Some("400"));
        assert_eq!(pages[1].get("Marker").map(String::as_str), Some("m1"));
        // One batch of three fails; then one call per ARN.
        let calls = elb.api_calls();
        assert_eq!(calls["DescribeTargetGroups"], 2);
        assert_eq!(calls["DescribeTags"], 4);
    }

    #[tokio::test]
    async fn throttling_is_retried_by_the_adapter_then_reported() {
        let (url, log) = serve(Box::new(|p: &Params| match p["Action"].as_str() {
            "RegisterTargets" => error(400, "Throttling", "Rate exceeded"),
            "DeregisterTargets" => error(400, "AccessDenied", "not authorized to deregister"),
            _ => error(503, "ServiceUnavailable", "try later"),
        }));
        let elb = Elbv2TargetGroups::new(client(&url).await, MutationRate::default());
        let target = ["10.0.0.1:80".parse().expect("target")];

        match elb
            .register(&arn("x"), &target, &tgsync::testkit::Unfenced)
            .await
        {
            Err(ElbError::Throttled { operation }) => assert_eq!(operation, "RegisterTargets"),
            other => panic!("expected Throttled, got {other:?}"),
        }
        match elb
            .deregister(&arn("x"), &target, &tgsync::testkit::Unfenced)
            .await
        {
            Err(ElbError::AccessDenied { operation, message }) => {
                assert_eq!(operation, "DeregisterTargets");
                assert_eq!(message, "AccessDenied: not authorized to deregister");
            }
            other => panic!("expected AccessDenied, got {other:?}"),
        }
        match elb
            .health(&arn("x"), &tgsync::groups::Priority::Reaction)
            .await
        {
            Err(ElbError::Other { operation, message }) => {
                assert_eq!(operation, "DescribeTargetHealth");
                assert!(message.starts_with("ServiceUnavailable"), "{message}");
            }
            other => panic!("expected Other, got {other:?}"),
        }

        let log = log.lock().expect("log");
        let attempts = |action: &str| log.iter().filter(|p| p["Action"] == action).count();
        // Throttling and 5xx: every attempt allowed, by the adapter's own paced loop
        // (this client retries too: the adapter turns the SDK's retries off, or the
        // attempts would multiply); access denied: one.
        assert_eq!(
            attempts("RegisterTargets"),
            tgsync::aws::MAX_ATTEMPTS as usize
        );
        assert_eq!(
            attempts("DescribeTargetHealth"),
            tgsync::aws::MAX_ATTEMPTS as usize
        );
        assert_eq!(attempts("DeregisterTargets"), 1);
        // Our counters count calls, not the SDK's attempts.
        assert_eq!(elb.api_calls()["RegisterTargets"], 1);
    }
}

/// The rollout check's read of a group (one DescribeTargetGroups of it, one
/// DescribeTargetGroupAttributes), against moto: the protocol, the health check, the
/// deregistration delay and connection termination as set; a deleted group is
/// `NotFound`.
#[tokio::test]
async fn reads_a_groups_attributes_for_the_rollout_check() {
    use aws_sdk_elasticloadbalancingv2::types::TargetGroupAttribute;
    let client = client().await;
    let arn = create_group(
        &client,
        &group_name("attrs"),
        TargetTypeEnum::Ip,
        false,
        &[],
    )
    .await;
    client
        .modify_target_group()
        .target_group_arn(&arn)
        .health_check_interval_seconds(10)
        .unhealthy_threshold_count(2)
        .send()
        .await
        .unwrap_or_else(|e| panic!("modify: {}", tgsync::aws::error_summary(&e)));
    let attribute = |k: &str, v: &str| TargetGroupAttribute::builder().key(k).value(v).build();
    client
        .modify_target_group_attributes()
        .target_group_arn(&arn)
        .attributes(attribute("deregistration_delay.timeout_seconds", "120"))
        .attributes(attribute(
            "deregistration_delay.connection_termination.enabled",
            "true",
        ))
        .send()
        .await
        .unwrap_or_else(|e| panic!("modify attributes: {}", tgsync::aws::error_summary(&e)));
    let elb = Elbv2TargetGroups::new(client.clone(), MutationRate::default());
    let read = elb
        .attributes(&arn, &tgsync::groups::Priority::Reaction)
        .await
        .expect("attributes");
    assert_eq!(read.protocol.as_deref(), Some("TCP"));
    assert_eq!(
        read.load_balancer(),
        Some(tgsync::core::rollout::LoadBalancerType::Nlb)
    );
    assert_eq!(read.health_check_interval_seconds, Some(10));
    assert_eq!(read.unhealthy_threshold_count, Some(2));
    assert_eq!(read.deregistration_delay_seconds, Some(120));
    assert_eq!(read.connection_termination, Some(true));
    let calls = elb.api_calls();
    assert_eq!(
        (
            calls["DescribeTargetGroups"],
            calls["DescribeTargetGroupAttributes"]
        ),
        (1, 1)
    );
    client
        .delete_target_group()
        .target_group_arn(&arn)
        .send()
        .await
        .expect("delete");
    assert!(
        matches!(
            elb.attributes(&arn, &tgsync::groups::Priority::Reaction)
                .await,
            Err(ElbError::NotFound { .. })
        ),
        "a deleted group is not found"
    );
}
