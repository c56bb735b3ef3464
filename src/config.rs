//! Settings from the environment, validated once, with one clear line per mistake.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use thiserror::Error;
use url::Url;

use crate::aws::accounts::TargetAccountRole;
use crate::core::BindingPolicy;
use crate::core::binding::is_namespace_name;

/// Everything the functions read from their environment.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// `TGSYNC_CLUSTER_NAME`: the EKS cluster this deployment serves.
    pub cluster_name: String,
    /// `TGSYNC_TABLE_NAME`: the state table.
    pub table_name: String,
    /// `TGSYNC_CLUSTER_ENDPOINT`: API server URL instead of DescribeCluster's.
    pub endpoint_override: Option<Url>,
    /// `TGSYNC_CLUSTER_CA_FILE`: PEM CA bundle instead of DescribeCluster's.
    pub ca_file: Option<PathBuf>,
    /// `TGSYNC_CONCURRENCY` (default 16): groups reconciled at once.
    pub concurrency: usize,
    /// `TGSYNC_PAGE_SIZE` (default 500): pods per LIST page.
    pub page_size: u32,
    /// `TGSYNC_ELB_MUTATIONS_PER_SECOND` (default 5): the deployment's budget of
    /// Register/DeregisterTargets calls per second (attempts included), shared by every
    /// container of every function (see `budget_share`).
    pub mutations_per_second: u32,
    /// `TGSYNC_READY_WAIT_SECONDS` (default 20): how long pod-events waits for a Running
    /// pod to turn Ready.
    pub ready_wait: Duration,
    /// `TGSYNC_ELB_DESCRIBES_PER_SECOND` (default 8): the deployment's budget of ELBv2
    /// Describe calls per second, bursts and retries included (ELBv2's Describe token
    /// bucket is shared per account), shared like the mutations but counted over 2-s
    /// windows (`aws::DESCRIBE_WINDOW_SECONDS`).
    pub describes_per_second: u32,
    /// `TGSYNC_VERIFY_DESCRIBES_PER_SECOND` (default 2): the share of the account's ELBv2
    /// Describe budget the schedule spends on re-verifying groups nothing changed (the
    /// only way to find hand edits). While the fleet fits, every group is verified on
    /// every run; beyond it, in turn (the report states the detection bound).
    pub verify_describes_per_second: f64,
    /// `TGSYNC_SCHEDULE_MINUTES` (default 1): the resync schedule's period, as the
    /// template sets it; with the rate above, how many groups one run re-verifies.
    pub schedule: Duration,
    /// `TGSYNC_MAX_CONTAINERS` (default 1): how many containers of this function can run
    /// at once (the template sets it to the function's reserved concurrency).
    pub max_containers: u32,
    /// `TGSYNC_BUDGET_SHARE` (default 1): this function's share (0–1) of the ELBv2
    /// budgets above, which are the whole deployment's: each container gets
    /// `budget × share / max_containers` calls per second, so however many containers of
    /// the functions run, together they stay within the budgets.
    pub budget_share: f64,
    /// `TGSYNC_WATCH_SECONDS` (default 0 = off; the template sets it just under the
    /// schedule's period): how long after it started a scheduled resync keeps watching
    /// the bound namespaces and reconciling groups as their pods change.
    pub watch: Duration,
    /// `TGSYNC_RELIST_MINUTES` (default 120; 0 = never): a watched namespace whose
    /// LIST is older than this is listed again. A safety net only: the watch resumes
    /// from its last version and relists at once on a gap (410) or an error; at 100,000
    /// pods a LIST is ~430 MiB, so every 2 h costs under 1 % of a LIST per minute.
    pub relist: Option<Duration>,
    /// `TGSYNC_ALLOWED_NAMESPACES` (space separated; empty or unset: any): the only
    /// namespaces a `tgsync/namespace` tag may name. Whoever can tag a group can point
    /// pods at it; this bounds what such a tag can reach.
    pub allowed_namespaces: Option<BTreeSet<String>>,
    /// `TGSYNC_ALLOW_EXCLUSIVE` (default `false`): whether a `tgsync/mode=exclusive`
    /// tag is honoured (it removes every target tgsync did not register).
    pub allow_exclusive: bool,
    /// `TGSYNC_TARGET_ACCOUNT_ROLES` (IAM role ARNs separated by spaces or commas; empty
    /// or unset: this account only): target groups owned by other accounts (a central
    /// networking account's NLBs) are reached by assuming these roles, one per account.
    pub target_account_roles: Vec<TargetAccountRole>,
    /// `TGSYNC_TARGET_ACCOUNT_EXTERNAL_ID` (optional): the external ID the target
    /// accounts' trust policies require of tgsync when it assumes their roles.
    pub target_account_external_id: Option<String>,
    /// `TGSYNC_NLB_PROPAGATION_SECONDS` (default 180): how long an NLB may keep sending
    /// new connections to a deregistered target, as the rollout check allows for it.
    pub nlb_propagation_seconds: u32,
    /// `TGSYNC_ALB_PROPAGATION_SECONDS` (default 60): the same for an ALB.
    pub alb_propagation_seconds: u32,
}

/// A setting that is missing or wrong. The message names the variable and the fix.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ConfigError {
    /// A required variable is not set.
    #[error("{name} is not set: {hint}")]
    Missing {
        /// Variable name.
        name: &'static str,
        /// What to set it to.
        hint: &'static str,
    },
    /// A variable has a value tgsync cannot use.
    #[error("{name}={value:?} is not valid: {reason}")]
    Invalid {
        /// Variable name.
        name: &'static str,
        /// The value found.
        value: String,
        /// What is wrong and what is expected.
        reason: String,
    },
}

impl Settings {
    /// Reads settings from the process environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads settings through `lookup` (testable without touching the environment).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let get = |name: &str| {
            lookup(name)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let cluster_name = get("TGSYNC_CLUSTER_NAME").ok_or(ConfigError::Missing {
            name: "TGSYNC_CLUSTER_NAME",
            hint: "set it to the EKS cluster name whose pods fill the target groups",
        })?;
        if !cluster_name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            || cluster_name.len() > 100
        {
            return Err(invalid(
                "TGSYNC_CLUSTER_NAME",
                &cluster_name,
                "an EKS cluster name has at most 100 letters, digits, `-` and `_`",
            ));
        }
        let table_name = get("TGSYNC_TABLE_NAME").ok_or(ConfigError::Missing {
            name: "TGSYNC_TABLE_NAME",
            hint: "set it to the DynamoDB table created by template.yaml",
        })?;
        let endpoint_override = match get("TGSYNC_CLUSTER_ENDPOINT") {
            None => None,
            Some(v) => {
                let url = Url::parse(&v)
                    .map_err(|e| invalid("TGSYNC_CLUSTER_ENDPOINT", &v, &e.to_string()))?;
                if !matches!(url.scheme(), "https" | "http") || url.host().is_none() {
                    return Err(invalid(
                        "TGSYNC_CLUSTER_ENDPOINT",
                        &v,
                        "give the API server URL, e.g. https://ABC.gr7.us-east-1.eks.amazonaws.com",
                    ));
                }
                Some(url)
            }
        };
        let ca_file = match get("TGSYNC_CLUSTER_CA_FILE") {
            None => None,
            Some(v) => {
                let path = PathBuf::from(&v);
                if !path.is_file() {
                    return Err(invalid(
                        "TGSYNC_CLUSTER_CA_FILE",
                        &v,
                        "no such file; give the path of the cluster's PEM CA bundle",
                    ));
                }
                Some(path)
            }
        };
        Ok(Self {
            cluster_name,
            table_name,
            endpoint_override,
            ca_file,
            concurrency: number(&get, "TGSYNC_CONCURRENCY", 16, 1, 256)?,
            page_size: number(&get, "TGSYNC_PAGE_SIZE", 500, 10, 5000)?,
            mutations_per_second: number(&get, "TGSYNC_ELB_MUTATIONS_PER_SECOND", 5, 1, 100)?,
            ready_wait: Duration::from_secs(number(&get, "TGSYNC_READY_WAIT_SECONDS", 20, 0, 600)?),
            describes_per_second: number(&get, "TGSYNC_ELB_DESCRIBES_PER_SECOND", 8, 1, 100)?,
            verify_describes_per_second: decimal(
                &get,
                "TGSYNC_VERIFY_DESCRIBES_PER_SECOND",
                2.0,
                0.01,
                100.0,
            )?,
            schedule: Duration::from_secs(
                60 * number(&get, "TGSYNC_SCHEDULE_MINUTES", 1, 1, 1440)?,
            ),
            watch: Duration::from_secs(number(&get, "TGSYNC_WATCH_SECONDS", 0, 0, 840)?),
            relist: match number(&get, "TGSYNC_RELIST_MINUTES", 120u64, 0, 10_080)? {
                0 => None,
                minutes => Some(Duration::from_secs(60 * minutes)),
            },
            max_containers: number(&get, "TGSYNC_MAX_CONTAINERS", 1, 1, 1000)?,
            budget_share: decimal(&get, "TGSYNC_BUDGET_SHARE", 1.0, 0.01, 1.0)?,
            allowed_namespaces: namespaces(&get, "TGSYNC_ALLOWED_NAMESPACES")?,
            allow_exclusive: boolean(&get, "TGSYNC_ALLOW_EXCLUSIVE", false)?,
            target_account_roles: roles(&get, "TGSYNC_TARGET_ACCOUNT_ROLES")?,
            target_account_external_id: external_id(&get, "TGSYNC_TARGET_ACCOUNT_EXTERNAL_ID")?,
            nlb_propagation_seconds: number(
                &get,
                "TGSYNC_NLB_PROPAGATION_SECONDS",
                crate::core::rollout::NLB_PROPAGATION_SECONDS,
                0,
                3600,
            )?,
            alb_propagation_seconds: number(
                &get,
                "TGSYNC_ALB_PROPAGATION_SECONDS",
                crate::core::rollout::ALB_PROPAGATION_SECONDS,
                0,
                3600,
            )?,
        })
    }

    /// What the rollout check holds pods to: the deployment's deregistration latency
    /// (watch mode's when it watches, the schedule's otherwise) and the propagation
    /// allowances.
    pub fn rollout(&self) -> crate::settings::RolloutSettings {
        let minutes = u32::try_from(self.schedule.as_secs() / 60).unwrap_or(u32::MAX);
        crate::settings::RolloutSettings {
            latency: crate::core::rollout::Latency::of_deployment(!self.watch.is_zero(), minutes),
            allowances: crate::core::rollout::Allowances {
                nlb_seconds: self.nlb_propagation_seconds,
                alb_seconds: self.alb_propagation_seconds,
            },
        }
    }

    /// The limits on what binding tags may ask for.
    pub fn binding_policy(&self) -> BindingPolicy {
        BindingPolicy {
            allowed_namespaces: self.allowed_namespaces.clone(),
            allow_exclusive: self.allow_exclusive,
        }
    }
}

/// A space-separated list of namespace names; `None` when unset or empty (any).
fn namespaces(
    get: &impl Fn(&str) -> Option<String>,
    name: &'static str,
) -> Result<Option<BTreeSet<String>>, ConfigError> {
    let Some(v) = get(name) else {
        return Ok(None);
    };
    let mut set = BTreeSet::new();
    for ns in v.split_whitespace() {
        if !is_namespace_name(ns) {
            return Err(invalid(
                name,
                &v,
                &format!(
                    "`{ns}` is not a namespace name; give namespace names separated by spaces (lowercase letters, digits and `-`), or leave it empty for any namespace"
                ),
            ));
        }
        set.insert(ns.to_owned());
    }
    Ok(Some(set))
}

/// Role ARNs separated by spaces or commas (CloudFormation list parameters join with
/// either), at most one per account: calls are routed by the account in a target group's
/// ARN, so two roles for one account could not be told apart.
fn roles(
    get: &impl Fn(&str) -> Option<String>,
    name: &'static str,
) -> Result<Vec<TargetAccountRole>, ConfigError> {
    let Some(v) = get(name) else {
        return Ok(Vec::new());
    };
    let mut roles: Vec<TargetAccountRole> = Vec::new();
    for arn in v.split(|c: char| c.is_whitespace() || c == ',') {
        if arn.is_empty() {
            continue;
        }
        let role = TargetAccountRole::parse(arn).map_err(|reason| {
            invalid(
                name,
                &v,
                &format!("{reason}; give IAM role ARNs separated by spaces, or leave it empty for this account only"),
            )
        })?;
        if let Some(other) = roles.iter().find(|r| r.account() == role.account()) {
            return Err(invalid(
                name,
                &v,
                &format!(
                    "`{}` and `{}` are both in account {}; give one role per account",
                    other.arn(),
                    role.arn(),
                    role.account()
                ),
            ));
        }
        roles.push(role);
    }
    Ok(roles)
}

/// An STS external ID: 2 to 1224 characters of `[A-Za-z0-9+=,.@:/_-]` (what AssumeRole
/// accepts), so a typo fails the configuration instead of every AssumeRole.
fn external_id(
    get: &impl Fn(&str) -> Option<String>,
    name: &'static str,
) -> Result<Option<String>, ConfigError> {
    let Some(v) = get(name) else {
        return Ok(None);
    };
    let ok = (2..=1224).contains(&v.len())
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"+=,.@:/_-".contains(&b));
    if !ok {
        return Err(invalid(
            name,
            &v,
            "an external ID has 2 to 1224 letters, digits and `+=,.@:/_-`",
        ));
    }
    Ok(Some(v))
}

fn boolean(
    get: &impl Fn(&str) -> Option<String>,
    name: &'static str,
    default: bool,
) -> Result<bool, ConfigError> {
    match get(name) {
        None => Ok(default),
        Some(v) if v.eq_ignore_ascii_case("true") => Ok(true),
        Some(v) if v.eq_ignore_ascii_case("false") => Ok(false),
        Some(v) => Err(invalid(name, &v, "expected `true` or `false`")),
    }
}

fn invalid(name: &'static str, value: &str, reason: &str) -> ConfigError {
    ConfigError::Invalid {
        name,
        value: value.to_owned(),
        reason: reason.to_owned(),
    }
}

fn decimal(
    get: &impl Fn(&str) -> Option<String>,
    name: &'static str,
    default: f64,
    min: f64,
    max: f64,
) -> Result<f64, ConfigError> {
    match get(name) {
        None => Ok(default),
        Some(v) => match v.parse::<f64>() {
            Ok(n) if n.is_finite() && (min..=max).contains(&n) => Ok(n),
            _ => Err(invalid(
                name,
                &v,
                &format!("expected a number from {min} to {max}"),
            )),
        },
    }
}

fn number<T>(
    get: &impl Fn(&str) -> Option<String>,
    name: &'static str,
    default: T,
    min: T,
    max: T,
) -> Result<T, ConfigError>
where
    T: std::str::FromStr + PartialOrd + std::fmt::Display + Copy,
{
    match get(name) {
        None => Ok(default),
        Some(v) => match v.parse::<T>() {
            Ok(n) if n >= min && n <= max => Ok(n),
            _ => Err(invalid(
                name,
                &v,
                &format!("expected a whole number from {min} to {max}"),
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// The settings of the two required variables and `extra`.
    fn with(extra: &[(&str, &str)]) -> Result<Settings, ConfigError> {
        let mut pairs = vec![("TGSYNC_CLUSTER_NAME", "prod"), ("TGSYNC_TABLE_NAME", "t")];
        pairs.extend_from_slice(extra);
        settings(&pairs)
    }

    fn settings(pairs: &[(&str, &str)]) -> Result<Settings, ConfigError> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Settings::from_lookup(|k| map.get(k).cloned())
    }

    #[test]
    fn minimal_settings_take_defaults() {
        let s = settings(&[
            ("TGSYNC_CLUSTER_NAME", "prod"),
            ("TGSYNC_TABLE_NAME", "tgsync-state"),
        ])
        .unwrap();
        assert_eq!(s.cluster_name, "prod");
        assert_eq!(s.concurrency, 16);
        assert_eq!(s.page_size, 500);
        assert_eq!(s.ready_wait, Duration::from_secs(20));
        assert_eq!(s.endpoint_override, None);
        // Tags may name any namespace, but not ask for exclusive mode.
        assert_eq!(s.binding_policy(), BindingPolicy::default());
        assert_eq!(s.allowed_namespaces, None);
        assert!(!s.allow_exclusive);
    }

    /// The rollout check's numbers: the allowances (180 s for an NLB, 60 s for an ALB
    /// unless set) and tgsync's latency, watch mode's when the deployment watches and the
    /// schedule's otherwise.
    #[test]
    fn the_rollout_checks_numbers_are_read() {
        use crate::core::rollout::{Allowances, Latency};
        let s = with(&[]).unwrap();
        assert_eq!(s.rollout().allowances, Allowances::default());
        assert_eq!(s.rollout().latency, Latency::schedule_only(1));
        let s = with(&[
            ("TGSYNC_WATCH_SECONDS", "55"),
            ("TGSYNC_NLB_PROPAGATION_SECONDS", "120"),
            ("TGSYNC_ALB_PROPAGATION_SECONDS", "0"),
        ])
        .unwrap();
        let r = s.rollout();
        assert_eq!(r.latency, Latency::watch());
        assert_eq!(
            (r.allowances.nlb_seconds, r.allowances.alb_seconds),
            (120, 0)
        );
        let s = with(&[("TGSYNC_SCHEDULE_MINUTES", "3")]).unwrap();
        assert_eq!(s.rollout().latency.seconds, 3 * 60 + 30);
        let err = with(&[("TGSYNC_NLB_PROPAGATION_SECONDS", "3601")])
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("TGSYNC_NLB_PROPAGATION_SECONDS=\"3601\" is not valid: expected a whole number from 0 to 3600"),
            "{err}"
        );
    }

    #[test]
    fn binding_limits_are_read() {
        let s = with(&[
            ("TGSYNC_ALLOWED_NAMESPACES", " shop  kafka\tshop "),
            ("TGSYNC_ALLOW_EXCLUSIVE", "TRUE"),
        ])
        .unwrap();
        assert_eq!(
            s.binding_policy(),
            BindingPolicy {
                allowed_namespaces: Some(BTreeSet::from(["kafka".to_owned(), "shop".to_owned()])),
                allow_exclusive: true,
            }
        );
        // Empty means any, like unset (the template passes an empty parameter).
        let s = with(&[
            ("TGSYNC_ALLOWED_NAMESPACES", ""),
            ("TGSYNC_ALLOW_EXCLUSIVE", "false"),
        ])
        .unwrap();
        assert_eq!(s.binding_policy(), BindingPolicy::default());
        for (pairs, want) in [
            (
                [("TGSYNC_ALLOWED_NAMESPACES", "shop,kafka")],
                "TGSYNC_ALLOWED_NAMESPACES=\"shop,kafka\" is not valid: `shop,kafka` is not a namespace name",
            ),
            (
                [("TGSYNC_ALLOW_EXCLUSIVE", "yes")],
                "TGSYNC_ALLOW_EXCLUSIVE=\"yes\" is not valid: expected `true` or `false`",
            ),
        ] {
            let err = with(&pairs).unwrap_err().to_string();
            assert!(err.starts_with(want), "{err}");
        }
    }

    #[test]
    fn each_mistake_names_its_variable() {
        let cases: Vec<(Vec<(&str, &str)>, &str)> = vec![
            (
                vec![("TGSYNC_TABLE_NAME", "t")],
                "TGSYNC_CLUSTER_NAME is not set",
            ),
            (
                vec![("TGSYNC_CLUSTER_NAME", "prod")],
                "TGSYNC_TABLE_NAME is not set",
            ),
            (
                vec![("TGSYNC_CLUSTER_NAME", "pr od"), ("TGSYNC_TABLE_NAME", "t")],
                "TGSYNC_CLUSTER_NAME=\"pr od\"",
            ),
            (
                vec![
                    ("TGSYNC_CLUSTER_NAME", "p"),
                    ("TGSYNC_TABLE_NAME", "t"),
                    ("TGSYNC_CLUSTER_ENDPOINT", "ftp://x"),
                ],
                "TGSYNC_CLUSTER_ENDPOINT",
            ),
            (
                vec![
                    ("TGSYNC_CLUSTER_NAME", "p"),
                    ("TGSYNC_TABLE_NAME", "t"),
                    ("TGSYNC_CLUSTER_CA_FILE", "/nope.pem"),
                ],
                "TGSYNC_CLUSTER_CA_FILE",
            ),
            (
                vec![
                    ("TGSYNC_CLUSTER_NAME", "p"),
                    ("TGSYNC_TABLE_NAME", "t"),
                    ("TGSYNC_CONCURRENCY", "0"),
                ],
                "TGSYNC_CONCURRENCY=\"0\" is not valid: expected a whole number from 1 to 256",
            ),
        ];
        for (pairs, want) in cases {
            let err = settings(&pairs).unwrap_err().to_string();
            assert!(err.starts_with(want), "{err} should start with {want}");
            assert!(!err.contains('\n'), "one line: {err}");
        }
    }

    #[test]
    fn target_account_roles_are_read() {
        let s = with(&[]).unwrap();
        assert!(s.target_account_roles.is_empty());
        assert_eq!(s.target_account_external_id, None);
        // Empty means this account only, like unset (the template passes an empty list).
        let s = with(&[
            ("TGSYNC_TARGET_ACCOUNT_ROLES", " "),
            ("TGSYNC_TARGET_ACCOUNT_EXTERNAL_ID", ""),
        ])
        .unwrap();
        assert!(s.target_account_roles.is_empty());
        assert_eq!(s.target_account_external_id, None);
        let s = with(&[
            (
                "TGSYNC_TARGET_ACCOUNT_ROLES",
                "arn:aws:iam::222222222222:role/tgsync-prod  arn:aws:iam::333333333333:role/net/tgsync,arn:aws:iam::444444444444:role/t",
            ),
            ("TGSYNC_TARGET_ACCOUNT_EXTERNAL_ID", "prod-7f3a"),
        ])
        .unwrap();
        let accounts: Vec<&str> = s.target_account_roles.iter().map(|r| r.account()).collect();
        assert_eq!(accounts, ["222222222222", "333333333333", "444444444444"]);
        assert_eq!(s.target_account_external_id.as_deref(), Some("prod-7f3a"));
        for (pairs, want) in [
            (
                [("TGSYNC_TARGET_ACCOUNT_ROLES", "222222222222")],
                "TGSYNC_TARGET_ACCOUNT_ROLES=\"222222222222\" is not valid: `222222222222` is not an IAM role ARN",
            ),
            (
                [(
                    "TGSYNC_TARGET_ACCOUNT_ROLES",
                    "arn:aws:iam::222222222222:role/a arn:aws:iam::222222222222:role/b",
                )],
                "TGSYNC_TARGET_ACCOUNT_ROLES=\"arn:aws:iam::222222222222:role/a arn:aws:iam::222222222222:role/b\" is not valid: `arn:aws:iam::222222222222:role/a` and `arn:aws:iam::222222222222:role/b` are both in account 222222222222",
            ),
            (
                [("TGSYNC_TARGET_ACCOUNT_EXTERNAL_ID", "a b")],
                "TGSYNC_TARGET_ACCOUNT_EXTERNAL_ID=\"a b\" is not valid",
            ),
        ] {
            let err = with(&pairs).unwrap_err().to_string();
            assert!(err.starts_with(want), "{err}");
        }
    }

    #[test]
    fn explicit_http_endpoint_is_allowed() {
        let s = settings(&[
            ("TGSYNC_CLUSTER_NAME", "p"),
            ("TGSYNC_TABLE_NAME", "t"),
            ("TGSYNC_CLUSTER_ENDPOINT", "http://127.0.0.1:6443"),
        ])
        .unwrap();
        assert_eq!(s.endpoint_override.unwrap().scheme(), "http");
    }
}
