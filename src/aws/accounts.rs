//! [`TargetGroupApi`] across accounts: this deployment's own account, plus one account
//! per role of `TGSYNC_TARGET_ACCOUNT_ROLES`.
//!
//! A central networking account often owns the load balancers (PrivateLink endpoint
//! services, shared ingress) while the pods run in workload accounts. The binding tags
//! live next to the target group, in the account that owns it; tgsync reaches that
//! account by assuming a role there with the SDK's own [`AssumeRoleProvider`] (each
//! account's ELBv2 client caches the assumed credentials and refreshes them before they
//! expire).
//!
//! - **Discovery** runs in every account at once. An account whose discovery fails (a
//!   role that cannot be assumed, a denied or throttled Describe) is reported by itself
//!   ([`Discovery::failed`]); every other account's groups are still reconciled, and the
//!   failed account's groups are left as they are.
//! - **Every other call** goes to the client of the account named in the target group's
//!   ARN (`arn:aws:elasticloadbalancing:<region>:<account>:targetgroup/…`). An ARN of an
//!   account this deployment has no client for is an error for that group alone.
//! - **Rates**: every account's adapter shares one mutation pace and one Describe pace
//!   (see [`Elbv2TargetGroups::for_client`]): `TGSYNC_ELB_*_PER_SECOND` are the
//!   deployment's budget, not a budget per account.
//!
//! With no roles this is exactly the single-account adapter: every call goes to it.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::sync::{Arc, RwLock};

use aws_config::SdkConfig;
use aws_config::sts::AssumeRoleProvider;
use aws_credential_types::provider::{self, ProvideCredentials, SharedCredentialsProvider};

use super::Elbv2TargetGroups;
use super::zone_names::{AccountZones, ZoneError, translate};
use crate::core::arn::arn_account;
use crate::core::{Target, TargetHealth};
use crate::groups::{
    AccountError, Discovery, ElbError, Fence, Priority, Refused, TagsByArn, TargetGroup,
    TargetGroupApi,
};

/// STS limits a role session name to 64 characters.
const MAX_SESSION_NAME: usize = 64;

/// Why a target of another account's group is not registered in its pod's zone when
/// this deployment cannot read that account's zones (an adapter built without EC2).
const ZONE_IN_ANOTHER_ACCOUNT: &str = "ELBv2 wants an Availability Zone of the group's VPC for this IP outside it (cross-zone load balancing is off), and zone names differ between accounts, so tgsync names none in another account; turn cross-zone load balancing on for the target group (attribute load_balancing.cross_zone.enabled) or run the pods in its VPC";

/// A role in another account, from `TGSYNC_TARGET_ACCOUNT_ROLES`, with the account id its
/// ARN names (the account whose target groups it reaches).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetAccountRole {
    arn: String,
    account: String,
}

impl TargetAccountRole {
    /// Parses `arn:<partition>:iam::<12-digit account>:role/<path/><name>`; the error
    /// says what is wrong, for the configuration message.
    pub fn parse(arn: &str) -> Result<Self, String> {
        let parts: Vec<&str> = arn.splitn(6, ':').collect();
        let [prefix, partition, service, region, account, resource] = parts[..] else {
            return Err(format!(
                "`{arn}` is not an IAM role ARN (arn:aws:iam::123456789012:role/name)"
            ));
        };
        let name = resource.strip_prefix("role/").unwrap_or_default();
        let name_ok = !name.is_empty()
            && !name.ends_with('/')
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"+=,.@_-/".contains(&b));
        if prefix != "arn"
            || partition.is_empty()
            || !partition
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b == b'-')
            || service != "iam"
            || !region.is_empty()
            || account.len() != 12
            || !account.bytes().all(|b| b.is_ascii_digit())
            || !name_ok
        {
            return Err(format!(
                "`{arn}` is not an IAM role ARN (arn:aws:iam::123456789012:role/name)"
            ));
        }
        Ok(Self {
            arn: arn.to_owned(),
            account: account.to_owned(),
        })
    }

    /// The role's ARN.
    pub fn arn(&self) -> &str {
        &self.arn
    }

    /// The account the role is in: the account whose target groups it reaches.
    pub fn account(&self) -> &str {
        &self.account
    }
}

/// The role session name of a deployment (`tgsync-<cluster>`, cut to STS's 64
/// characters): the target account's CloudTrail then says which cluster's tgsync acted.
pub fn session_name(cluster: &str) -> String {
    format!("tgsync-{cluster}")
        .chars()
        .take(MAX_SESSION_NAME)
        .collect()
}

/// The ELBv2 adapter of every account a deployment reaches. Cheap to clone; clones share
/// everything.
#[derive(Clone)]
pub struct Accounts {
    home: Elbv2TargetGroups,
    /// This account's zone names, to translate a node's zone for another account's
    /// group (see [`super::zone_names`]); `None` when built without.
    home_zones: Option<AccountZones>,
    roles: Arc<Vec<RoleAccount>>,
    /// This deployment's own account id(s), learnt from the ARNs its own discovery
    /// returns (no STS call needed): calls for them go to `home`.
    home_ids: Arc<RwLock<BTreeSet<String>>>,
}

/// One target account: its role and the adapters whose credentials come from it.
#[derive(Clone)]
struct RoleAccount {
    role: TargetAccountRole,
    elb: Elbv2TargetGroups,
    /// The account's zone names (see [`super::zone_names`]); `None` when built without.
    zones: Option<AccountZones>,
}

impl Debug for Accounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Accounts")
            .field(
                "roles",
                &self.roles.iter().map(|r| r.role.arn()).collect::<Vec<_>>(),
            )
            .field("home_ids", &self.home_ids())
            .finish_non_exhaustive()
    }
}

impl Accounts {
    /// This deployment's own account only (no roles): every call goes to `home`.
    pub fn new(home: Elbv2TargetGroups) -> Self {
        Self {
            home,
            home_zones: None,
            roles: Arc::new(Vec::new()),
            home_ids: Arc::default(),
        }
    }

    /// Reads this account's zone names with `ec2` (see [`super::zone_names`]).
    pub fn with_zones(mut self, ec2: aws_sdk_ec2::Client) -> Self {
        self.home_zones = Some(AccountZones::new(ec2));
        self
    }

    /// Adds a target account reached through `role` with the adapter `elb` (normally
    /// built by [`Accounts::assuming`]; tests may pass any adapter).
    /// Without [`Accounts::with_role_zones`], a zone is never named to its groups.
    pub fn with_role(self, role: TargetAccountRole, elb: Elbv2TargetGroups) -> Self {
        self.push_role(RoleAccount {
            role,
            elb,
            zones: None,
        })
    }

    /// Adds a target account as [`Accounts::with_role`] does, whose zone names `ec2`
    /// reads (with the role's credentials).
    pub fn with_role_zones(
        self,
        role: TargetAccountRole,
        elb: Elbv2TargetGroups,
        ec2: aws_sdk_ec2::Client,
    ) -> Self {
        self.push_role(RoleAccount {
            role,
            elb,
            zones: Some(AccountZones::new(ec2)),
        })
    }

    fn push_role(mut self, account: RoleAccount) -> Self {
        Arc::make_mut(&mut self.roles).push(account);
        self
    }

    /// `home` plus one account per role, each with an ELBv2 client (and an EC2 client,
    /// for its zone names) whose credentials come from [`AssumeRoleProvider`] (base
    /// credentials, region, endpoint, retries and timeouts from `sdk`; `external_id`
    /// when the target accounts' trust policies ask for one; `session_name` from
    /// [`session_name`]). Each adapter shares `home`'s paces. Nothing is called yet: a
    /// role that cannot be assumed fails its account's calls, not the construction.
    pub fn assuming(
        home: Elbv2TargetGroups,
        sdk: &SdkConfig,
        roles: &[TargetAccountRole],
        external_id: Option<&str>,
        session_name: &str,
    ) -> Self {
        let mut accounts = Self::new(home.clone());
        if !roles.is_empty() {
            accounts = accounts.with_zones(aws_sdk_ec2::Client::new(sdk));
        }
        for role in roles {
            let credentials = AssumedRole {
                role: role.arn().to_owned(),
                external_id: external_id.map(str::to_owned),
                session_name: session_name.to_owned(),
                base: sdk.clone(),
                provider: tokio::sync::OnceCell::new(),
            };
            let config = sdk
                .to_builder()
                .credentials_provider(SharedCredentialsProvider::new(credentials))
                .build();
            let client = aws_sdk_elasticloadbalancingv2::Client::new(&config);
            accounts = accounts.with_role_zones(
                role.clone(),
                home.for_client(client),
                aws_sdk_ec2::Client::new(&config),
            );
        }
        accounts
    }

    /// Calls made so far per operation, over every account (the adapters share their
    /// counters).
    pub fn api_calls(&self) -> BTreeMap<&'static str, u64> {
        self.home.api_calls()
    }

    /// The roles this deployment assumes, in configuration order.
    pub fn roles(&self) -> impl Iterator<Item = &TargetAccountRole> {
        self.roles.iter().map(|r| &r.role)
    }

    /// This deployment's own account id(s) as learnt so far.
    fn home_ids(&self) -> BTreeSet<String> {
        self.home_ids.read().map(|i| i.clone()).unwrap_or_default()
    }

    /// The role serving `account`, if any.
    fn role_for(&self, account: &str) -> Option<&RoleAccount> {
        self.roles.iter().find(|r| r.role.account() == account)
    }

    /// The adapter for the account of `arn`.
    fn route(&self, arn: &str) -> Result<&Elbv2TargetGroups, ElbError> {
        if self.roles.is_empty() {
            return Ok(&self.home);
        }
        let account = arn_account(arn);
        if let Some(account) = account {
            if let Some(r) = self.role_for(account) {
                return Ok(&r.elb);
            }
            if self.home_ids.read().is_ok_and(|ids| ids.contains(account)) {
                return Ok(&self.home);
            }
        }
        Err(ElbError::NoAccount {
            arn: arn.to_owned(),
            account: account.unwrap_or_default().to_owned(),
        })
    }

    /// This account's discovery: its groups minus those of an account a role serves (a
    /// role in this very account must not make its groups appear twice); their account
    /// ids are remembered for routing.
    fn own_groups(&self, groups: Vec<TargetGroup>) -> Vec<TargetGroup> {
        let groups: Vec<TargetGroup> = groups
            .into_iter()
            .filter(|g| arn_account(&g.arn).is_none_or(|a| self.role_for(a).is_none()))
            .collect();
        if let Ok(mut ids) = self.home_ids.write() {
            ids.extend(
                groups
                    .iter()
                    .filter_map(|g| arn_account(&g.arn))
                    .map(str::to_owned),
            );
        }
        groups
    }
}

impl TargetGroupApi for Accounts {
    /// Every group of every account; an error (naming the account) when any account's
    /// discovery failed. The engine uses [`TargetGroupApi::discover_accounts`] instead.
    async fn discover(&self, priority: &Priority) -> Result<Vec<TargetGroup>, ElbError> {
        let found = self.discover_accounts(priority).await?;
        match found.failed.into_iter().next() {
            None => Ok(found.groups),
            Some(failure) => Err(ElbError::Other {
                operation: "DescribeTargetGroups",
                message: failure.to_string(),
            }),
        }
    }

    async fn discover_accounts(&self, priority: &Priority) -> Result<Discovery, ElbError> {
        if self.roles.is_empty() {
            let groups = self.home.discover(priority).await?;
            return Ok(Discovery {
                groups: self.own_groups(groups),
                failed: Vec::new(),
            });
        }
        let (home, others) = futures::join!(
            self.home.discover(priority),
            futures::future::join_all(self.roles.iter().map(|r| r.elb.discover(priority)))
        );
        let mut found = Discovery::default();
        match home {
            Ok(groups) => found.groups = self.own_groups(groups),
            Err(error) => found.failed.push(AccountError {
                // Named when an earlier discovery taught it (usually the case).
                account: self.home_ids().into_iter().next(),
                role: None,
                error,
            }),
        }
        for (r, result) in self.roles.iter().zip(others) {
            match result {
                Ok(groups) => found.groups.extend(groups),
                Err(error) => {
                    tracing::debug!(account = r.role.account(), role = r.role.arn(), error = %error, "discovery failed in a target account");
                    found.failed.push(AccountError {
                        account: Some(r.role.account().to_owned()),
                        role: Some(r.role.arn().to_owned()),
                        error,
                    })
                }
            }
        }
        Ok(found)
    }

    /// Each account's groups from its own client (one call pair per account named).
    async fn describe(
        &self,
        arns: &[String],
        priority: &Priority,
    ) -> Result<Vec<TargetGroup>, ElbError> {
        let mut by_account: Vec<(&Elbv2TargetGroups, Vec<String>)> = Vec::new();
        for arn in arns {
            let elb = self.route(arn)?;
            match by_account.iter_mut().find(|(e, _)| std::ptr::eq(*e, elb)) {
                Some((_, named)) => named.push(arn.clone()),
                None => by_account.push((elb, vec![arn.clone()])),
            }
        }
        let mut groups = Vec::new();
        for (elb, named) in by_account {
            groups.extend(elb.describe(&named, priority).await?);
        }
        Ok(groups)
    }

    /// The first group's account's client, for the named groups it serves.
    async fn tags_of(&self, arns: &[String], priority: &Priority) -> Result<TagsByArn, ElbError> {
        let Some(first) = arns.first() else {
            return Ok(TagsByArn::new());
        };
        let elb = self.route(first)?;
        let same: Vec<String> = arns
            .iter()
            .filter(|a| self.route(a).is_ok_and(|e| std::ptr::eq(e, elb)))
            .cloned()
            .collect();
        elb.tags_of(&same, priority).await
    }

    async fn health(&self, arn: &str, priority: &Priority) -> Result<Vec<TargetHealth>, ElbError> {
        self.route(arn)?.health(arn, priority).await
    }

    async fn attributes(
        &self,
        arn: &str,
        priority: &Priority,
    ) -> Result<crate::core::rollout::GroupAttributes, ElbError> {
        self.route(arn)?.attributes(arn, priority).await
    }

    async fn register(
        &self,
        arn: &str,
        targets: &[Target],
        fence: &dyn Fence,
    ) -> Result<(), ElbError> {
        self.route(arn)?.register(arn, targets, fence).await
    }

    /// Availability Zone names are per account (the node's `us-east-1a` may be another
    /// zone in the group's account): another account's group is told that account's
    /// name for the same zone ID ([`super::zone_names`]). A target whose zone cannot be
    /// translated is refused with what to do; the others go in.
    async fn register_in_zones(
        &self,
        arn: &str,
        targets: &[(Target, String)],
        fence: &dyn Fence,
    ) -> Result<(), ElbError> {
        let elb = self.route(arn)?;
        if std::ptr::eq(elb, &self.home) {
            return elb.register_in_zones(arn, targets, fence).await;
        }
        let role = arn_account(arn).and_then(|a| self.role_for(a));
        let (Some(home), Some((role, their_zones))) = (
            &self.home_zones,
            role.and_then(|r| Some((r, r.zones.as_ref()?))),
        ) else {
            return Err(ElbError::Rejected {
                operation: "RegisterTargets",
                targets: targets
                    .iter()
                    .map(|(t, _)| Refused::target(*t, ZONE_IN_ANOTHER_ACCOUNT))
                    .collect(),
            });
        };
        let account = role.role.account();
        let mut named = Vec::with_capacity(targets.len());
        let mut refused = Vec::new();
        let maps = match (home.get().await, their_zones.get().await) {
            (Ok(h), Ok(t)) => Ok((h, t)),
            (Err(reason), _) => Err((
                "this deployment's account".to_owned(),
                reason,
                "the function's role",
            )),
            (_, Err(reason)) => Err((
                format!("account {account}"),
                reason,
                "the target account's role",
            )),
        };
        for (t, zone) in targets {
            let translated = match &maps {
                Ok((h, theirs)) => translate(h, theirs, zone, account),
                Err((whose, reason, who)) => Err(ZoneError::Read {
                    account: whose.clone(),
                    zone: zone.clone(),
                    reason: reason.clone(),
                    who,
                }),
            };
            match translated {
                Ok(name) => named.push((*t, name)),
                Err(e) => refused.push(Refused::target(*t, e.to_string())),
            }
        }
        if !named.is_empty() {
            match elb.register_in_zones(arn, &named, fence).await {
                Ok(()) => {}
                Err(ElbError::Rejected { targets, .. }) => refused.extend(targets),
                Err(e) => return Err(e),
            }
        }
        if refused.is_empty() {
            Ok(())
        } else {
            Err(ElbError::Rejected {
                operation: "RegisterTargets",
                targets: refused,
            })
        }
    }

    async fn deregister(
        &self,
        arn: &str,
        targets: &[Target],
        fence: &dyn Fence,
    ) -> Result<(), ElbError> {
        self.route(arn)?.deregister(arn, targets, fence).await
    }

    fn pressure(&self) -> crate::report::ElbPressure {
        // Every account's adapter shares the home adapter's paces.
        self.home.pressure()
    }
}

/// The credentials of one role: the SDK's [`AssumeRoleProvider`], built on first use
/// (its builder is async, and containers are configured without awaiting). The ELBv2
/// client's identity cache holds what it returns until shortly before expiry, so the
/// role is assumed once an hour per container, not once per call.
#[derive(Debug)]
struct AssumedRole {
    role: String,
    external_id: Option<String>,
    session_name: String,
    base: SdkConfig,
    provider: tokio::sync::OnceCell<AssumeRoleProvider>,
}

impl ProvideCredentials for AssumedRole {
    fn provide_credentials<'a>(&'a self) -> provider::future::ProvideCredentials<'a>
    where
        Self: 'a,
    {
        provider::future::ProvideCredentials::new(async move {
            let provider = self
                .provider
                .get_or_init(|| async {
                    let mut builder = AssumeRoleProvider::builder(self.role.as_str())
                        .configure(&self.base)
                        .session_name(self.session_name.as_str());
                    if let Some(id) = &self.external_id {
                        builder = builder.external_id(id.as_str());
                    }
                    builder.build().await
                })
                .await;
            provider.provide_credentials().await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_arns_are_checked() {
        let r = TargetAccountRole::parse("arn:aws:iam::222222222222:role/ops/tgsync-prod").unwrap();
        assert_eq!(r.account(), "222222222222");
        assert_eq!(r.arn(), "arn:aws:iam::222222222222:role/ops/tgsync-prod");
        assert!(TargetAccountRole::parse("arn:aws-us-gov:iam::222222222222:role/x").is_ok());
        for bad in [
            "arn:aws:iam::22222222222:role/x",
            "arn:aws:iam::222222222222:user/x",
            "arn:aws:iam::222222222222:role/",
            "arn:aws:sts::222222222222:role/x",
            "arn:aws:iam:us-east-1:222222222222:role/x",
            "222222222222",
            "arn:aws:iam::222222222222:role/a,b c",
        ] {
            assert!(TargetAccountRole::parse(bad).is_err(), "{bad}");
        }
    }

    fn group(arn: &str) -> TargetGroup {
        TargetGroup {
            arn: arn.to_owned(),
            name: "web".into(),
            facts: crate::core::GroupFacts {
                target_type: "ip".into(),
                port: Some(80),
                family: crate::core::AddressFamily::Ipv4,
                quic: false,
            },
            tags: BTreeMap::new(),
        }
    }

    fn tg_arn(account: &str) -> String {
        format!("arn:aws:elasticloadbalancing:us-east-1:{account}:targetgroup/web/0123456789abcdef")
    }

    fn accounts(roles: &[&str]) -> Accounts {
        let sdk = SdkConfig::builder()
            .behavior_version(aws_config::BehaviorVersion::latest())
            .region(aws_config::Region::new("us-east-1"))
            .build();
        let home = Elbv2TargetGroups::from_sdk_config(&sdk, super::super::MutationRate::default());
        let roles: Vec<TargetAccountRole> = roles
            .iter()
            .map(|a| TargetAccountRole::parse(&format!("arn:aws:iam::{a}:role/tgsync")).unwrap())
            .collect();
        Accounts::assuming(home, &sdk, &roles, Some("x-1"), "tgsync-test")
    }

    /// Calls go to the client of the account in the ARN: a role's account to the role's
    /// client, this account (once discovery has shown its id) to its own, and an account
    /// with no client is an error for that group alone, with no call made.
    #[tokio::test]
    async fn calls_are_routed_by_the_account_in_the_arn() {
        let a = accounts(&["222222222222"]);
        assert!(std::ptr::eq(
            a.route(&tg_arn("222222222222")).unwrap(),
            &a.roles[0].elb
        ));
        // This account's id is not known before its discovery names it.
        assert!(a.route(&tg_arn("111111111111")).is_err());
        let own = a.own_groups(vec![group(&tg_arn("111111111111"))]);
        assert_eq!(own.len(), 1);
        assert!(std::ptr::eq(
            a.route(&tg_arn("111111111111")).unwrap(),
            &a.home
        ));
        let err = a
            .health(&tg_arn("444444444444"), &Priority::Reaction)
            .await
            .unwrap_err();
        assert!(
            matches!(&err, ElbError::NoAccount { account, .. } if account == "444444444444"),
            "{err}"
        );
        assert!(
            err.to_string().contains("TGSYNC_TARGET_ACCOUNT_ROLES"),
            "{err}"
        );
        assert!(matches!(
            a.register("arn:tg", &[], &crate::testkit::Unfenced).await,
            Err(ElbError::NoAccount { .. })
        ));
        // Without roles, every call goes to this account's client, as before.
        let single = accounts(&[]);
        assert!(std::ptr::eq(single.route("arn:tg").unwrap(), &single.home));
        assert!(std::ptr::eq(
            single.route(&tg_arn("444444444444")).unwrap(),
            &single.home
        ));
    }

    /// An account whose zone names this deployment cannot read (an adapter built
    /// without EC2) is never told a zone: its targets are refused with what to do.
    /// (Translated names: `tests/accounts.rs`.)
    #[tokio::test]
    async fn without_their_zone_names_no_zone_is_named_to_another_accounts_group() {
        let sdk = SdkConfig::builder()
            .behavior_version(aws_config::BehaviorVersion::latest())
            .region(aws_config::Region::new("us-east-1"))
            .build();
        let home = Elbv2TargetGroups::from_sdk_config(&sdk, super::super::MutationRate::default());
        let role = TargetAccountRole::parse("arn:aws:iam::222222222222:role/tgsync").unwrap();
        let a = Accounts::new(home.clone())
            .with_zones(aws_sdk_ec2::Client::new(&sdk))
            .with_role(role, home);
        let t: Target = "192.168.0.1:80".parse().unwrap();
        let err = a
            .register_in_zones(
                &tg_arn("222222222222"),
                &[(t, "us-east-1a".into())],
                &crate::testkit::Unfenced,
            )
            .await
            .unwrap_err();
        let ElbError::Rejected { targets, .. } = &err else {
            panic!("{err}");
        };
        assert_eq!(targets.len(), 1);
        assert_eq!(targets[0].target, t);
        assert!(
            targets[0].reason.contains("cross-zone load balancing on"),
            "{err}"
        );
    }

    /// A role in this very account: its groups come once, through the role.
    #[test]
    fn a_role_in_this_account_does_not_duplicate_its_groups() {
        let a = accounts(&["111111111111"]);
        let own = a.own_groups(vec![group(&tg_arn("111111111111"))]);
        assert!(own.is_empty());
        assert!(std::ptr::eq(
            a.route(&tg_arn("111111111111")).unwrap(),
            &a.roles[0].elb
        ));
    }

    #[test]
    fn session_names_fit_sts() {
        assert_eq!(session_name("prod"), "tgsync-prod");
        let long = "c".repeat(100);
        assert_eq!(session_name(&long).len(), 64);
    }
}
