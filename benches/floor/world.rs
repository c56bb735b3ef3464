//! The canned answers of a zero-drift full verification: every namespace's LIST pages of
//! realistic pods, each group's DescribeTargetHealth (all targets healthy), its state item
//! (a ledger entry per target, as tgsync writes it, and a checkpoint of exactly those
//! targets), the cluster's index rows, discovery's pages and tags. Built once by the server process; the measured clients only read them.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;
use std::net::Ipv4Addr;

use hyper::body::Bytes;
use serde_json::{Value, json};
use tgsync::core::Target;
use tgsync::core::checkpoint::fingerprint;
use tgsync::testkit::PodBuilder;

use crate::{CLUSTER, PAGE_SIZE, REGION, RESOURCE_VERSION, Sizes};

/// ELBv2's XML namespace.
const XMLNS: &str = "http://elasticloadbalancing.amazonaws.com/doc/2015-12-01/";

/// When the ledger says every target was registered (epoch ms).
const REGISTERED_AT: u64 = 1_764_000_000_000;

/// The ARN of group `g`.
pub fn arn(g: usize) -> String {
    format!("arn:aws:elasticloadbalancing:{REGION}:123456789012:targetgroup/floor-{g}/{g:016x}")
}

/// The namespace of group `g` (groups are spread round-robin).
pub fn namespace(g: usize, sizes: &Sizes) -> String {
    format!("ns-{}", g % sizes.namespaces)
}

fn pod_ip(i: usize) -> String {
    Ipv4Addr::from(0x0a01_0000u32 + 1 + i as u32).to_string()
}

/// Everything the server answers with.
pub struct World {
    /// LIST pages by namespace, in order.
    pub pages: HashMap<String, Vec<Bytes>>,
    /// Group index by ARN.
    pub arns: HashMap<String, usize>,
    /// DescribeTargetGroups `<member>` of each group.
    pub group_members: Vec<String>,
    /// DescribeTags `<member>` of each group.
    pub tag_members: Vec<String>,
    /// DescribeTargetHealth answer of each group.
    pub health: Vec<Bytes>,
    /// The state item of each group (DynamoDB JSON), as GetItem and BatchGetItem
    /// answer it.
    pub items: Vec<Bytes>,
    /// The same items without `ledger` and `seen`, as a BatchGetItem that leaves them out
    /// of its projection answers them.
    pub glances: Vec<Bytes>,
    /// The Query answer of the cluster's index.
    pub index: Bytes,
}

impl World {
    /// Builds the world of `sizes` (about 4.5 KB of JSON per pod).
    pub fn build(sizes: &Sizes) -> Self {
        let mut pods_by_ns: HashMap<String, Vec<Vec<u8>>> = HashMap::new();
        let mut health = Vec::with_capacity(sizes.groups);
        let mut items = Vec::with_capacity(sizes.groups);
        let mut glances = Vec::with_capacity(sizes.groups);
        let mut index_rows = Vec::with_capacity(sizes.groups);
        let mut group_members = Vec::with_capacity(sizes.groups);
        let mut tag_members = Vec::with_capacity(sizes.groups);
        for g in 0..sizes.groups {
            let ns = namespace(g, sizes);
            let app = format!("svc-{g}");
            let arn = arn(g);
            let mut targets = String::new();
            let mut ledger = serde_json::Map::new();
            let mut desired = BTreeSet::new();
            for p in 0..sizes.pods_per_group {
                let ip = pod_ip(g * sizes.pods_per_group + p);
                let name = format!("svc-{g}-{p}");
                let pod = PodBuilder::new(&ns, &name)
                    .label("app", &app)
                    .ip(&ip)
                    .realistic()
                    .build();
                let uid = pod.metadata.uid.clone().unwrap_or_default();
                pods_by_ns
                    .entry(ns.clone())
                    .or_default()
                    .push(serde_json::to_vec(&pod).unwrap_or_default());
                let _ = write!(
                    targets,
                    "\n      <member>\n        <Target>\n          <Id>{ip}</Id>\n          <Port>8080</Port>\n        </Target>\n        <HealthCheckPort>8080</HealthCheckPort>\n        <TargetHealth>\n          <State>healthy</State>\n        </TargetHealth>\n      </member>"
                );
                desired.insert(Target::new(ip.parse().expect("pod IP"), 8080));
                ledger.insert(
                    format!("{ip}:8080"),
                    json!({"M": {
                        "c": {"S": CLUSTER}, "ns": {"S": ns}, "pod": {"S": name},
                        "uid": {"S": uid}, "at": {"N": REGISTERED_AT.to_string()},
                    }}),
                );
            }
            health.push(Bytes::from(format!(
                "<DescribeTargetHealthResponse xmlns=\"{XMLNS}\">\n  <DescribeTargetHealthResult>\n    <TargetHealthDescriptions>{targets}\n    </TargetHealthDescriptions>\n  </DescribeTargetHealthResult>\n  <ResponseMetadata>\n    <RequestId>{}</RequestId>\n  </ResponseMetadata>\n</DescribeTargetHealthResponse>\n",
                request_id(g)
            )));
            // Verified with exactly these targets: a scheduled run finds the group at rest.
            let checkpoint = format!("{:016x}", fingerprint(desired.iter()));
            let mut item = json!({
                "pk": {"S": format!("tg#{arn}")}, "sk": {"S": "group"},
                "version": {"N": "3"},
                "migrated": {"SS": [CLUSTER]},
                "checkpoint": {"M": {"fp": {"S": checkpoint}, "at": {"N": REGISTERED_AT.to_string()}}},
            });
            glances.push(Bytes::from(item.to_string()));
            if let Value::Object(fields) = &mut item {
                fields.insert(
                    "seen".into(),
                    json!({"M": {CLUSTER: {"S": RESOURCE_VERSION}}}),
                );
                fields.insert("ledger".into(), json!({"M": Value::Object(ledger)}));
            }
            items.push(Bytes::from(item.to_string()));
            index_rows.push(json!({
                "pk": {"S": format!("owners#{CLUSTER}")}, "sk": {"S": arn},
                "ns": {"S": ns}, "sel": {"S": format!("app={app}")},
            }));
            group_members.push(format!(
                "\n      <member>\n        <TargetGroupArn>{arn}</TargetGroupArn>\n        <TargetGroupName>floor-{g}</TargetGroupName>\n        <Protocol>TCP</Protocol>\n        <Port>8080</Port>\n        <VpcId>vpc-0f1007</VpcId>\n        <HealthCheckProtocol>TCP</HealthCheckProtocol>\n        <HealthCheckPort>traffic-port</HealthCheckPort>\n        <HealthCheckEnabled>true</HealthCheckEnabled>\n        <HealthCheckIntervalSeconds>10</HealthCheckIntervalSeconds>\n        <HealthCheckTimeoutSeconds>10</HealthCheckTimeoutSeconds>\n        <HealthyThresholdCount>3</HealthyThresholdCount>\n        <UnhealthyThresholdCount>3</UnhealthyThresholdCount>\n        <LoadBalancerArns/>\n        <TargetType>ip</TargetType>\n        <IpAddressType>ipv4</IpAddressType>\n      </member>"
            ));
            let tag = |k: &str, v: &str| {
                format!(
                    "\n          <member>\n            <Key>{k}</Key>\n            <Value>{v}</Value>\n          </member>"
                )
            };
            tag_members.push(format!(
                "\n      <member>\n        <ResourceArn>{arn}</ResourceArn>\n        <Tags>{}{}{}\n        </Tags>\n      </member>",
                tag("tgsync/cluster", CLUSTER),
                tag("tgsync/namespace", &ns),
                tag("tgsync/selector", &format!("app={app}")),
            ));
        }
        let count = index_rows.len();
        let index = json!({"Count": count, "ScannedCount": count, "Items": index_rows});
        let pages = pods_by_ns
            .into_iter()
            .map(|(ns, pods)| (ns, list_pages(&pods)))
            .collect();
        let arns = (0..sizes.groups).map(|g| (arn(g), g)).collect();
        Self {
            pages,
            arns,
            group_members,
            tag_members,
            health,
            items,
            glances,
            index: Bytes::from(index.to_string()),
        }
    }

    /// The DescribeTargetGroups page starting at group `from`.
    pub fn groups_page(&self, from: usize, size: usize) -> Bytes {
        let end = (from + size).min(self.group_members.len());
        let members: String = self.group_members[from.min(end)..end].concat();
        let marker = if end < self.group_members.len() {
            format!("\n    <NextMarker>{end}</NextMarker>")
        } else {
            String::new()
        };
        Bytes::from(format!(
            "<DescribeTargetGroupsResponse xmlns=\"{XMLNS}\">\n  <DescribeTargetGroupsResult>\n    <TargetGroups>{members}\n    </TargetGroups>{marker}\n  </DescribeTargetGroupsResult>\n  <ResponseMetadata>\n    <RequestId>{}</RequestId>\n  </ResponseMetadata>\n</DescribeTargetGroupsResponse>\n",
            request_id(from)
        ))
    }

    /// The DescribeTags answer for `groups`.
    pub fn tags(&self, groups: &[usize]) -> Bytes {
        let members: String = groups
            .iter()
            .filter_map(|g| self.tag_members.get(*g))
            .map(String::as_str)
            .collect();
        Bytes::from(format!(
            "<DescribeTagsResponse xmlns=\"{XMLNS}\">\n  <DescribeTagsResult>\n    <TagDescriptions>{members}\n    </TagDescriptions>\n  </DescribeTagsResult>\n  <ResponseMetadata>\n    <RequestId>{}</RequestId>\n  </ResponseMetadata>\n</DescribeTagsResponse>\n",
            request_id(groups.len())
        ))
    }
}

fn request_id(n: usize) -> String {
    format!("{n:08x}-0000-4000-8000-00000000f1007")
}

/// A namespace's pods as LIST pages of [`PAGE_SIZE`], each with its continue token and
/// remaining count as the API server sends them.
fn list_pages(pods: &[Vec<u8>]) -> Vec<Bytes> {
    let chunks: Vec<&[Vec<u8>]> = pods.chunks(PAGE_SIZE).collect();
    let mut sent = 0;
    chunks
        .iter()
        .enumerate()
        .map(|(n, chunk)| {
            sent += chunk.len();
            let remaining = pods.len() - sent;
            let more = if remaining > 0 {
                format!(r#","continue":"p{}","remainingItemCount":{remaining}"#, n + 1)
            } else {
                String::new()
            };
            let mut page = format!(
                r#"{{"kind":"PodList","apiVersion":"v1","metadata":{{"resourceVersion":"{RESOURCE_VERSION}"{more}}},"items":["#
            )
            .into_bytes();
            for (i, pod) in chunk.iter().enumerate() {
                if i > 0 {
                    page.push(b',');
                }
                page.extend_from_slice(pod);
            }
            page.extend_from_slice(b"]}");
            Bytes::from(page)
        })
        .collect()
}
