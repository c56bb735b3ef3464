//! `tgsync status`: what each bound group holds and what tgsync knows about it, read
//! without invoking anything and without writing anything.
//!
//! It runs the library's engine as the functions do, but only its dry run (which takes
//! no lease and writes nothing: bindings from ELBv2 Describe calls, each group's item
//! with a consistent GetItem, the namespace's pods with one LIST, DescribeTargetHealth
//! and the plan), then reads each group's item and target health once more for the
//! lease, backoff, checkpoint and per-target ownership. Its AWS calls: ELBv2
//! DescribeTargetGroups, DescribeTags, DescribeTargetHealth and (the rollout check)
//! DescribeTargetGroupAttributes; DynamoDB GetItem and
//! Query; EKS DescribeCluster, then the Kubernetes API (list pods) with the caller's EKS
//! token.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde::Serialize;
use tgsync::app::App;
use tgsync::clock::{Clock, SystemClock};
use tgsync::config::Settings;
use tgsync::core::{HealthState, Plan, RolloutCheck, Target, UnixMillis};
use tgsync::groups::TargetGroupApi;
use tgsync::reconcile::RunOptions;
use tgsync::report::{Orphan, Outcome};
use tgsync::state::StateStore;

use crate::error::{Call, CliError};
use crate::progress::Progress;
use crate::session::Session;

/// Everything `status` shows.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    /// The cluster.
    pub cluster: String,
    /// The state table.
    pub table: String,
    /// When it was read (unix ms).
    pub read_at: UnixMillis,
    /// One entry per group, sorted by name.
    pub groups: Vec<GroupStatus>,
    /// Groups no longer bound whose ledger still holds this cluster's targets.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub orphans: Vec<Orphan>,
    /// What could not be read (an account, a requested group).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
}

impl Status {
    /// Whether something could not be read or a group is failing.
    pub fn has_errors(&self) -> bool {
        !self.errors.is_empty() || self.groups.iter().any(|g| g.error.is_some())
    }
}

/// One group.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupStatus {
    /// ARN.
    pub target_group_arn: String,
    /// Name.
    pub name: String,
    /// Account owning it.
    pub account: String,
    /// Targets the cluster's ready pods make (`None` when they could not be read).
    pub desired: Option<usize>,
    /// Registered targets (draining ones not counted).
    pub registered: usize,
    /// Of those, `healthy`.
    pub healthy: usize,
    /// Registered targets in this cluster's ledger (tgsync registered or adopted them).
    pub owned: usize,
    /// Registered targets of another cluster's ledger (a group shared by clusters).
    pub other_clusters: usize,
    /// Registered targets in no ledger (by hand, another tool).
    pub foreign: usize,
    /// What a run would change now (`None` when it could not be planned).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pending: Option<Plan>,
    /// Consecutive failures and the next attempt, while the group backs off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backoff: Option<Backoff>,
    /// Who holds the group's lease, while it is held.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease: Option<Lease>,
    /// When target health was last found (or made) right by a run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_verified_at: Option<UnixMillis>,
    /// Why the group is not right now (binding error, pods or health unreadable).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The rollout check: whether the pods' termination covers tgsync's deregistration
    /// latency and the load balancer's propagation, and whether they carry the gate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutCheck>,
    /// Every registered target and every ledger entry of the group.
    pub targets: Vec<TargetStatus>,
}

/// A backing-off group.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Backoff {
    /// Consecutive failed reconciles.
    pub failures: u32,
    /// No automatic attempt before (unix ms).
    pub next_attempt_at: UnixMillis,
}

/// A held lease.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Lease {
    /// The holder (`<function>-<cluster>-<random>`).
    pub owner: String,
    /// Valid until (unix ms).
    pub until: UnixMillis,
}

/// One target.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TargetStatus {
    /// `ip:port`.
    pub target: Target,
    /// DescribeTargetHealth's state (`-` when not registered).
    pub health: String,
    /// `tgsync`, `cluster <name>` or `foreign`.
    pub owner: String,
    /// The pod, for a ledger entry.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// What the rollout check says of the pod (its termination is too short, it lacks
    /// the readiness gate).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rollout: Option<String>,
}

/// ELBv2's name of a health state.
pub fn health_name(h: &HealthState) -> String {
    match h {
        HealthState::Initial => "initial".into(),
        HealthState::Healthy => "healthy".into(),
        HealthState::Unhealthy => "unhealthy".into(),
        HealthState::UnhealthyDraining => "unhealthy.draining".into(),
        HealthState::Unused => "unused".into(),
        HealthState::Draining => "draining".into(),
        HealthState::Unavailable => "unavailable".into(),
        HealthState::Other(s) => s.clone(),
    }
}

/// Reads the status of `groups` (names or ARNs; all bound groups when empty) of
/// `cluster`'s deployment, whose state is in `table`. The other settings of the
/// functions (`TGSYNC_TARGET_ACCOUNT_ROLES`, `TGSYNC_CLUSTER_ENDPOINT`, ...) are read
/// from the environment as they would be, else from `defaults` (the stack's).
///
/// A failure before anything could be read (the caller may not list target groups, no
/// group named so, every account's discovery failed) is an error, not an empty table.
pub async fn read(
    session: &Session,
    cluster: &str,
    table: &str,
    groups: &[String],
    defaults: &[(&'static str, String)],
) -> Result<Status, CliError> {
    let mut vars: HashMap<String, String> = defaults
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect();
    vars.extend(std::env::vars().filter(|(k, _)| k.starts_with("TGSYNC_")));
    // Without a stack (or a variable) saying otherwise, the functions watch as the
    // template's default has them: the rollout check's latency is watch mode's.
    vars.entry("TGSYNC_WATCH_SECONDS".into())
        .or_insert_with(|| crate::stack::TEMPLATE_WATCH_SECONDS.to_string());
    vars.insert("TGSYNC_CLUSTER_NAME".into(), cluster.to_owned());
    vars.insert("TGSYNC_TABLE_NAME".into(), table.to_owned());
    let settings = Settings::from_lookup(|k| vars.get(k).cloned())?;
    let sdk = &session.sdk;
    let clock = Arc::new(SystemClock);
    let app = App::build(settings, sdk, clock.clone(), "cli")?;
    let engine = &app.engine;
    may_list_target_groups(sdk).await?;
    let elb =
        tgsync::aws::Elbv2TargetGroups::from_sdk_config(sdk, tgsync::aws::MutationRate::default());
    let only = if groups.is_empty() {
        None
    } else {
        Some(crate::invoke::resolve(&elb, groups).await?)
    };
    let progress = Progress::start(format!("reading the status of cluster {cluster}"));
    let plan = engine
        .resync(&RunOptions {
            dry_run: true,
            only,
            ..RunOptions::default()
        })
        .await;
    let mut out = Status {
        cluster: cluster.to_owned(),
        table: table.to_owned(),
        read_at: clock.now(),
        groups: Vec::new(),
        orphans: plan.orphans.clone().unwrap_or_default(),
        errors: plan.errors.clone(),
    };
    let now = clock.now();
    for g in &plan.groups {
        let mut s = GroupStatus {
            target_group_arn: g.target_group_arn.clone(),
            name: g.name.clone(),
            account: g.account.clone(),
            desired: None,
            registered: 0,
            healthy: 0,
            owned: 0,
            other_clusters: 0,
            foreign: 0,
            pending: g.plan.clone(),
            backoff: None,
            lease: None,
            last_verified_at: None,
            error: g.error.clone(),
            rollout: g.rollout.clone(),
            targets: Vec::new(),
        };
        if g.outcome == Outcome::BindingError {
            out.groups.push(s);
            continue;
        }
        if g.plan.is_some() {
            s.desired = Some(g.desired);
        }
        match engine.core.state.peek(&g.target_group_arn).await {
            Ok(state) => {
                s.backoff = state.backoff.map(|b| Backoff {
                    failures: b.failures,
                    next_attempt_at: b.next_attempt,
                });
                s.lease = state.lease.filter(|l| l.until >= now).map(|l| Lease {
                    owner: l.owner,
                    until: l.until,
                });
                s.last_verified_at = state.checkpoint.map(|c| c.verified_at);
                let mut targets: BTreeMap<Target, TargetStatus> = state
                    .ledger
                    .into_iter()
                    .map(|(t, e)| {
                        let owner = if e.cluster == cluster {
                            "tgsync".to_owned()
                        } else {
                            format!("cluster {}", e.cluster)
                        };
                        (
                            t,
                            TargetStatus {
                                target: t,
                                health: "-".into(),
                                owner,
                                pod: Some(format!("{}/{}", e.pod.namespace, e.pod.name)),
                                rollout: None,
                            },
                        )
                    })
                    .collect();
                match engine
                    .core
                    .groups
                    .health(&g.target_group_arn, &tgsync::groups::Priority::Reaction)
                    .await
                {
                    Ok(health) => {
                        for th in health {
                            let (t, h) = (th.target, th.state);
                            if h == HealthState::Draining {
                                if let Some(row) = targets.get_mut(&t) {
                                    row.health = health_name(&h);
                                }
                                continue;
                            }
                            s.registered += 1;
                            s.healthy += usize::from(h == HealthState::Healthy);
                            let row = targets.entry(t).or_insert_with(|| TargetStatus {
                                target: t,
                                health: String::new(),
                                owner: "foreign".into(),
                                pod: None,
                                rollout: None,
                            });
                            row.health = health_name(&h);
                            match row.owner.as_str() {
                                "tgsync" => s.owned += 1,
                                "foreign" => s.foreign += 1,
                                _ => s.other_clusters += 1,
                            }
                        }
                    }
                    Err(e) => {
                        s.error.get_or_insert_with(|| e.to_string());
                    }
                }
                s.targets = targets.into_values().collect();
                note_rollout(&mut s.targets, g.rollout.as_ref());
            }
            Err(e) => {
                s.error.get_or_insert_with(|| e.to_string());
            }
        }
        out.groups.push(s);
    }
    out.groups.sort_by(|a, b| {
        a.name
            .cmp(&b.name)
            .then_with(|| a.target_group_arn.cmp(&b.target_group_arn))
    });
    if out.groups.is_empty() && out.orphans.is_empty() && !out.errors.is_empty() {
        return Err(CliError::Unread(out.errors.join("; ")));
    }
    progress.done();
    Ok(out)
}

/// Puts what the rollout check says of each target's pod (this cluster's targets: their
/// ledger entries name the pod) beside the target.
fn note_rollout(targets: &mut [TargetStatus], rollout: Option<&RolloutCheck>) {
    let Some(rollout) = rollout else {
        return;
    };
    let said: HashMap<&str, &str> = rollout
        .findings
        .iter()
        .map(|f| (f.pod.as_str(), f.reason.as_str()))
        .collect();
    for t in targets.iter_mut().filter(|t| t.owner == "tgsync") {
        if let Some(reason) = t.pod.as_deref().and_then(|p| said.get(p)) {
            t.rollout = Some((*reason).to_owned());
        }
    }
}

/// One DescribeTargetGroups of a single group in the caller's account: what every read
/// of `status` starts with, tried first so that a refusal (or an endpoint out of reach)
/// is one line about the caller's credentials, not an error per account in a table.
async fn may_list_target_groups(sdk: &aws_config::SdkConfig) -> Result<(), CliError> {
    aws_sdk_elasticloadbalancingv2::Client::new(sdk)
        .describe_target_groups()
        .page_size(1)
        .send()
        .await
        .map(|_| ())
        .map_err(|e| {
            CliError::from_sdk(
                &e,
                Call {
                    service: "ELBv2",
                    operation: "ELBv2 DescribeTargetGroups",
                    action: "elasticloadbalancing:DescribeTargetGroups",
                    on: None,
                    advice: "use credentials that may read target groups, the state table and the cluster (docs/cli.md lists the permissions)",
                },
            )
        })
}
