//! One isolated tgsync world per test: a unique cluster name, an emulated EKS API server
//! (HTTPS, verifying the EKS token), target groups and a state table in the shared moto
//! server, and an engine wired with the production adapters. Assertions read ELBv2 and
//! DynamoDB through the raw SDK, as an operator's `aws` CLI would.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Arc;

use aws_credential_types::Credentials;
use aws_credential_types::provider::SharedCredentialsProvider;
use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_elasticloadbalancingv2::types::{ProtocolEnum, Tag, TargetDescription, TargetTypeEnum};
use kube_emulator::{Emulator, EmulatorConfig};
use tgsync::Engine;
use tgsync::aws::{DynamoState, Elbv2TargetGroups, MutationRate};
use tgsync::clock::ManualClock;
use tgsync::core::UnixMillis;
use tgsync::eks::{ClusterAccess, KubePods, Overrides};
use tgsync::reconcile::RunOptions;
use tgsync::report::Report;

use crate::moto;

/// The engine type every world runs.
pub type LiveEngine = Engine<KubePods, Elbv2TargetGroups, DynamoState>;

/// A test's private cluster, groups and table.
pub struct World {
    pub cluster: String,
    pub emulator: Emulator,
    pub sdk: aws_config::SdkConfig,
    pub elb: aws_sdk_elasticloadbalancingv2::Client,
    pub ddb: aws_sdk_dynamodb::Client,
    pub table: String,
    pub clock: ManualClock,
    pub engine: LiveEngine,
}

impl World {
    /// A fresh world with the right credentials.
    pub async fn new() -> Self {
        Self::with_secret("testing").await
    }

    /// A world whose tokens are signed with `secret` (the emulator only knows "testing").
    pub async fn with_secret(secret: &str) -> Self {
        Self::with_creds(
            Creds {
                secret: secret.to_owned(),
                ..Creds::default()
            },
            ("testing", "testing"),
        )
        .await
    }

    /// A world whose AWS calls and EKS tokens use `creds`, with an emulator that accepts
    /// tokens signed by `known` (access key id, secret).
    pub async fn with_creds(creds: Creds, known: (&str, &str)) -> Self {
        tgsync::app::install_crypto_provider();
        let cluster = moto::unique("c");
        let sdk = moto::config_loader()
            .credentials_provider(creds.provider())
            .load()
            .await;
        let moto_host = moto::endpoint().trim_start_matches("http://").to_owned();
        let mut config = EmulatorConfig::new(cluster.clone());
        config.credentials = vec![(known.0.to_owned(), known.1.to_owned())];
        config.allowed_sts_hosts = vec![moto_host];
        let emulator = Emulator::start(config).await.expect("emulator starts");
        let table = moto::unique("tgsync");
        let ddb = aws_sdk_dynamodb::Client::new(&sdk);
        tgsync::aws::create_table(&ddb, &table)
            .await
            .expect("table created");
        let clock = ManualClock::new(UnixMillis(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis() as u64,
        ));
        let engine = build_engine(&cluster, &sdk, &emulator, &table, &clock, creds.provider());
        Self {
            elb: aws_sdk_elasticloadbalancingv2::Client::new(&sdk),
            ddb,
            cluster,
            emulator,
            sdk,
            table,
            clock,
            engine,
        }
    }

    /// Records every group of `arns` as verified empty now: a fleet at rest, whose
    /// scheduled runs skip the Describe of each group not due for re-verification.
    pub async fn verified_empty(&self, arns: &[String]) {
        use tgsync::state::StateStore as _;
        let empty = tgsync::core::checkpoint::fingerprint(std::iter::empty());
        let now = tgsync::clock::Clock::now(&self.clock);
        for chunk in arns.chunks(16) {
            let mut writes = tokio::task::JoinSet::new();
            for arn in chunk {
                let (state, arn) = (self.engine.core.state.clone(), arn.clone());
                writes.spawn(async move {
                    let cp = tgsync::core::Checkpoint {
                        desired: empty,
                        verified_at: now,
                    };
                    let recorded = state.record_verified(&arn, 0, now, cp).await;
                    assert!(recorded.expect("a checkpoint"), "{arn} was not at rest");
                });
            }
            while let Some(done) = writes.join_next().await {
                done.expect("a checkpoint write");
            }
        }
    }

    /// Advances the clock by whole schedule periods until the scheduled run at its time
    /// does not re-verify `arn` (the engine's rotation over the groups `arns`, `settings`'
    /// budget); the groups that run does re-verify.
    pub fn skip_to_a_run_not_re_verifying<'a>(
        &self,
        arn: &str,
        arns: &[&'a str],
        settings: &tgsync::reconcile::EngineSettings,
    ) -> Vec<&'a str> {
        use tgsync::core::checkpoint::{Rotation, rank_order};
        let period_ms = u64::try_from(settings.schedule_period.as_millis()).expect("period");
        let per_run = (settings.verify_describes_per_second
            * settings.schedule_period.as_secs_f64()) as usize;
        let ranked = rank_order(arns.iter().copied());
        loop {
            let now = tgsync::clock::Clock::now(&self.clock);
            let rotation = Rotation::new(ranked.len(), per_run, now.0 / period_ms);
            let due: Vec<&str> = ranked
                .iter()
                .enumerate()
                .filter(|(rank, _)| rotation.due(*rank))
                .map(|(_, a)| *a)
                .collect();
            if !due.contains(&arn) {
                return due;
            }
            self.clock.advance(period_ms);
        }
    }

    /// Creates an IP target group on `port` with binding tags for this cluster (plus
    /// `extra` tags) and returns its ARN.
    pub async fn group(
        &self,
        namespace: &str,
        selector: &str,
        port: i32,
        extra: &[(&str, &str)],
    ) -> String {
        let mut tags = vec![
            ("tgsync/cluster", self.cluster.as_str()),
            ("tgsync/namespace", namespace),
            ("tgsync/selector", selector),
        ];
        tags.extend_from_slice(extra);
        self.raw_group(TargetTypeEnum::Ip, port, &tags).await
    }

    /// Creates a target group with exactly these tags.
    pub async fn raw_group(
        &self,
        kind: TargetTypeEnum,
        port: i32,
        tags: &[(&str, &str)],
    ) -> String {
        let name = moto::unique("tg");
        let name: String = name
            .chars()
            .take(32)
            .collect::<String>()
            .trim_end_matches('-')
            .to_owned();
        create_group(&self.elb, &name, moto::vpc_id(), kind, port, tags).await
    }

    /// Puts a pod into the emulated cluster.
    pub fn put_pod(&self, pod: k8s_openapi::api::core::v1::Pod) {
        self.emulator.store().put_pod(pod).expect("pod stored");
    }

    /// Another process of the deployment takes `arn`'s lease as `holder`, for `lease`
    /// from the world's now; the group's state as it took it.
    pub async fn hold_lease(
        &self,
        arn: &str,
        holder: &str,
        lease: std::time::Duration,
    ) -> tgsync::state::GroupState {
        use tgsync::clock::Clock as _;
        use tgsync::state::{Acquire, StateStore as _};
        let now = self.clock.now();
        let taken = self
            .engine
            .core
            .state
            .acquire(arn, holder, now, now.plus(lease))
            .await
            .expect("acquire");
        let Acquire::Acquired(state) = taken else {
            panic!("not acquired: {taken:?}");
        };
        state
    }

    /// Registered targets as `ip:port`, sorted, as DescribeTargetHealth shows them
    /// (draining ones excluded).
    pub async fn targets(&self, arn: &str) -> Vec<String> {
        targets_in(&self.elb, arn).await
    }

    /// Registers a target by hand, as an operator would.
    pub async fn register_by_hand(&self, arn: &str, ip: &str, port: i32) {
        register_in(&self.elb, arn, ip, port).await;
    }

    /// Deregisters a target by hand.
    pub async fn deregister_by_hand(&self, arn: &str, ip: &str, port: i32) {
        self.elb
            .deregister_targets()
            .target_group_arn(arn)
            .targets(TargetDescription::builder().id(ip).port(port).build())
            .send()
            .await
            .expect("deregister by hand");
    }

    /// The group's ledger (`ip:port` of every entry, sorted), read straight from the
    /// group's item in DynamoDB.
    pub async fn ledger(&self, arn: &str) -> Vec<String> {
        let mut v: Vec<String> = self
            .item(arn)
            .await
            .and_then(|i| i.get("ledger").and_then(|l| l.as_m().ok()).cloned())
            // Tombstones (deregistered targets kept for the forget grace) left out.
            .map(|m| {
                m.into_iter()
                    .filter(|(_, e)| e.as_m().is_ok_and(|e| !e.contains_key("gone")))
                    .map(|(k, _)| k)
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }

    /// The group's item (consistent read), if it exists.
    pub async fn item(&self, arn: &str) -> Option<BTreeMap<String, AttributeValue>> {
        let out = self
            .ddb
            .get_item()
            .table_name(&self.table)
            .key("pk", AttributeValue::S(format!("tg#{arn}")))
            .key("sk", AttributeValue::S("group".into()))
            .consistent_read(true)
            .send()
            .await
            .expect("get item");
        out.item.map(|i| i.into_iter().collect())
    }

    /// Whether the group's item records a lease holder.
    pub async fn lease_recorded(&self, arn: &str) -> bool {
        self.item(arn)
            .await
            .is_some_and(|i| i.contains_key("owner"))
    }

    /// Puts the group in backoff, through the product's own lease-fenced write.
    pub async fn set_backoff(&self, arn: &str, backoff: tgsync::core::BackoffState) {
        use tgsync::state::{Acquire, Change, StateStore};
        let now = tgsync::clock::Clock::now(&self.clock);
        let until = now.plus(std::time::Duration::from_secs(15));
        let Acquire::Acquired(taken) = self
            .engine
            .core
            .state
            .acquire(arn, "test-setup", now, until)
            .await
            .expect("acquire")
        else {
            panic!("the group's lease is held");
        };
        let change = Change {
            backoff: Some(Some(backoff)),
            ..Change::default()
        };
        self.engine
            .core
            .state
            .abandon(arn, "test-setup", now, taken.version, &change, false, false)
            .await
            .expect("write backoff");
    }

    /// Number of items in the whole table that belong to groups (the cluster's index
    /// meta item, which holds the index's generation, is the cluster's: not counted).
    pub async fn table_items(&self) -> usize {
        let out = self
            .ddb
            .scan()
            .table_name(&self.table)
            .send()
            .await
            .expect("scan");
        out.items()
            .iter()
            .filter(|i| {
                i.get("pk")
                    .and_then(|v| v.as_s().ok())
                    .is_none_or(|pk| !pk.starts_with("meta#"))
            })
            .count()
    }

    /// An engine like the world's own, on its pods, table and clock, but over `groups`
    /// (another ELBv2 adapter: several accounts, a proxy).
    pub fn engine_over<G: tgsync::groups::TargetGroupApi>(
        &self,
        groups: G,
    ) -> Engine<KubePods, G, DynamoState> {
        let pods = kube_pods(
            &self.cluster,
            &self.sdk,
            &self.emulator,
            Creds::default().provider(),
        );
        let state = DynamoState::from_sdk_config(&self.sdk, &self.table, &self.cluster);
        Engine::new(
            self.cluster.as_str(),
            pods,
            groups,
            state,
            Arc::new(self.clock.clone()),
        )
        .with_seed(1)
    }

    /// A full resync with default options.
    pub async fn resync(&self) -> Report {
        self.engine.resync(&RunOptions::default()).await
    }

    /// A resync with options.
    pub async fn resync_with(&self, opts: RunOptions) -> Report {
        self.engine.resync(&opts).await
    }

    /// The command that starts function binary `bin` as Lambda `name` of this world:
    /// the Runtime API at `runtime_api`, AWS calls to `aws_endpoint` (the EKS token
    /// still names moto's STS, which the emulator trusts), the emulator's CA in a file,
    /// nothing else of this process's environment. The caller adds and spawns.
    pub fn function(
        &self,
        bin: &str,
        name: &str,
        runtime_api: &str,
        aws_endpoint: &str,
    ) -> std::process::Command {
        let ca = self.ca_file();
        std::fs::write(&ca, self.emulator.ca_pem().expect("TLS emulator")).expect("CA file");
        let mut command = std::process::Command::new(bin);
        command
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("AWS_LAMBDA_RUNTIME_API", runtime_api)
            .env("AWS_LAMBDA_FUNCTION_NAME", name)
            .env("AWS_LAMBDA_FUNCTION_VERSION", "1")
            .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "256")
            .env("AWS_REGION", moto::REGION)
            .env("AWS_ENDPOINT_URL", aws_endpoint)
            .env("AWS_ENDPOINT_URL_STS", moto::endpoint())
            .env("AWS_ACCESS_KEY_ID", "testing")
            .env("AWS_SECRET_ACCESS_KEY", "testing")
            .env("AWS_SESSION_TOKEN", "testing")
            .env("TGSYNC_CLUSTER_NAME", &self.cluster)
            .env("TGSYNC_TABLE_NAME", &self.table)
            .env("TGSYNC_CLUSTER_ENDPOINT", self.emulator.url())
            .env("TGSYNC_CLUSTER_CA_FILE", &ca)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        command
    }
}

impl World {
    /// Where [`World::function`] writes the emulator's CA.
    fn ca_file(&self) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("{}-ca.pem", self.cluster))
    }
}

impl Drop for World {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.ca_file());
    }
}

/// Creates target group `name` (TCP on `port`, of `kind`, in `vpc`) with exactly these
/// tags through `elb` (whose credentials pick the account), and returns its ARN.
pub async fn create_group(
    elb: &aws_sdk_elasticloadbalancingv2::Client,
    name: &str,
    vpc: &str,
    kind: TargetTypeEnum,
    port: i32,
    tags: &[(&str, &str)],
) -> String {
    let out = elb
        .create_target_group()
        .name(name)
        .protocol(ProtocolEnum::Tcp)
        .port(port)
        .vpc_id(vpc)
        .target_type(kind)
        .set_tags(Some(
            tags.iter()
                .map(|(k, v)| Tag::builder().key(*k).value(*v).build())
                .collect(),
        ))
        .send()
        .await
        .expect("target group created");
    out.target_groups()[0]
        .target_group_arn()
        .unwrap()
        .to_owned()
}

/// Registered targets of `arn` as `ip:port`, sorted, read through `elb` (the group's
/// account) as DescribeTargetHealth shows them (draining ones excluded).
pub async fn targets_in(elb: &aws_sdk_elasticloadbalancingv2::Client, arn: &str) -> Vec<String> {
    let out = elb
        .describe_target_health()
        .target_group_arn(arn)
        .send()
        .await
        .expect("describe target health");
    let mut v: Vec<String> = out
        .target_health_descriptions()
        .iter()
        .filter(|d| {
            d.target_health()
                .and_then(|h| h.state())
                .is_none_or(|s| s.as_str() != "draining")
        })
        .map(|d| {
            let t = d.target().unwrap();
            format!(
                "{}:{}",
                t.id().unwrap_or_default(),
                t.port().unwrap_or_default()
            )
        })
        .collect();
    v.sort();
    v
}

/// Registers `ip:port` in `arn` by hand through `elb`, as an operator would.
pub async fn register_in(
    elb: &aws_sdk_elasticloadbalancingv2::Client,
    arn: &str,
    ip: &str,
    port: i32,
) {
    elb.register_targets()
        .target_group_arn(arn)
        .targets(TargetDescription::builder().id(ip).port(port).build())
        .send()
        .await
        .expect("register by hand");
}

/// AWS credentials of a world (moto accepts any).
#[derive(Debug, Clone)]
pub struct Creds {
    pub access_key_id: String,
    pub secret: String,
    pub session_token: String,
}

impl Default for Creds {
    fn default() -> Self {
        Self {
            access_key_id: "testing".into(),
            secret: "testing".into(),
            session_token: "testing".into(),
        }
    }
}

impl Creds {
    pub fn provider(&self) -> SharedCredentialsProvider {
        SharedCredentialsProvider::new(Credentials::new(
            self.access_key_id.clone(),
            self.secret.clone(),
            Some(self.session_token.clone()),
            None,
            "world",
        ))
    }
}

/// The production adapters, pointed at moto and the emulator, on the world's manual
/// clock.
pub fn build_engine(
    cluster: &str,
    sdk: &aws_config::SdkConfig,
    emulator: &Emulator,
    table: &str,
    clock: &ManualClock,
    credentials: SharedCredentialsProvider,
) -> LiveEngine {
    build_engine_on(
        cluster,
        sdk,
        emulator,
        table,
        Arc::new(clock.clone()),
        credentials,
    )
}

/// [`build_engine`] on any clock (the system clock, to meet a real process's leases).
pub fn build_engine_on(
    cluster: &str,
    sdk: &aws_config::SdkConfig,
    emulator: &Emulator,
    table: &str,
    clock: Arc<dyn tgsync::clock::Clock>,
    credentials: SharedCredentialsProvider,
) -> LiveEngine {
    let pods = kube_pods(cluster, sdk, emulator, credentials);
    let groups = Elbv2TargetGroups::from_sdk_config(sdk, MutationRate::new(50, None).unwrap());
    let state = DynamoState::from_sdk_config(sdk, table, cluster);
    Engine::new(cluster, pods, groups, state, clock).with_seed(1)
}

/// The pod source of a world: the emulator, with EKS tokens signed by `credentials`.
fn kube_pods(
    cluster: &str,
    sdk: &aws_config::SdkConfig,
    emulator: &Emulator,
    credentials: SharedCredentialsProvider,
) -> KubePods {
    let access = ClusterAccess::new(
        cluster,
        aws_sdk_eks::Client::new(sdk),
        credentials,
        moto::REGION,
        url::Url::parse(moto::endpoint()).unwrap(),
        Overrides {
            endpoint: Some(url::Url::parse(emulator.url()).unwrap()),
            ca_pem: emulator.ca_pem().map(|p| p.as_bytes().to_vec()),
        },
    );
    KubePods::new(Arc::new(access)).with_page_size(100)
}
