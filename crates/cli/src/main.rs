//! `tgsync`: the operator's command line for a tgsync deployment.
//!
//! - `status` reads (DynamoDB GetItem/Query on the state table, ELBv2 Describe calls,
//!   and the cluster's pods for the desired count) and never invokes anything;
//! - `plan`, `sync` and `release` go through the manual function (`tgsync-manual`), the
//!   way the README's `aws lambda invoke` does; a release goes through its `release`
//!   alias, after showing its plan and asking.
//!
//! Everything it prints for people goes to stdout as tables (stderr for progress and
//! errors); `--json` prints the machine form instead. Exit codes: [`exit`].
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod error;
mod invoke;
mod output;
mod progress;
mod status;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use serde_json::{Value, json};

use crate::error::CliError;
use crate::invoke::Manual;

/// The exit codes, as the README documents them.
pub mod exit {
    /// Done; for `plan`, nothing to do.
    pub const OK: u8 = 0;
    /// Something failed: an AWS call, the function, or a group.
    pub const ERROR: u8 = 1;
    /// `plan`: changes are planned.
    pub const CHANGES: u8 = 2;
    /// `release`: not confirmed (answered no, or no terminal and no `--yes`).
    pub const NOT_CONFIRMED: u8 = 3;
    /// The command line is wrong.
    pub const USAGE: u8 = 64;
}

/// Look at and drive a tgsync deployment.
#[derive(Debug, Parser)]
#[command(name = "tgsync", version, about, long_about = None)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Args)]
struct Global {
    /// The EKS cluster the deployment serves (status).
    #[arg(long, env = "TGSYNC_CLUSTER_NAME", global = true)]
    cluster: Option<String>,
    /// The deployment's state table, the stack's StateTableName output (status).
    #[arg(long, env = "TGSYNC_TABLE_NAME", global = true)]
    table: Option<String>,
    /// The manual function, the stack's ManualFunctionName output (plan, sync, release).
    #[arg(
        long = "function",
        env = "TGSYNC_MANUAL_FUNCTION",
        default_value = "tgsync-manual",
        global = true
    )]
    function: String,
    /// Print JSON for machines instead of tables.
    #[arg(long, global = true)]
    json: bool,
    /// How long to keep retrying while another manual run holds the manual function's
    /// slot (Lambda answers 429).
    #[arg(long, default_value_t = 60, value_name = "SECONDS", global = true)]
    wait: u64,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Per group: desired, registered, healthy, owned and foreign targets, backoff,
    /// lease holder, last error, last verification. Read-only; invokes nothing.
    Status {
        /// Target group names or ARNs (default: every group bound to the cluster).
        groups: Vec<String>,
        /// Also list each group's targets.
        #[arg(long)]
        targets: bool,
    },
    /// The dry run, as a diff. Exit 0: nothing to do; 2: changes planned; 1: error.
    Plan {
        /// Target group names or ARNs (default: every bound group).
        groups: Vec<String>,
    },
    /// Reconcile now, one pass (what the schedule does), and show what changed.
    Sync {
        /// Ignore backoff and read every group's target health.
        #[arg(long)]
        force: bool,
        /// Target group names or ARNs (default: every bound group).
        groups: Vec<String>,
    },
    /// Take tgsync out of groups: deregister what it owns there and drop its ledger.
    /// Shows the plan and asks on a terminal.
    Release {
        /// Target group names or ARNs.
        #[arg(required = true)]
        groups: Vec<String>,
        /// Release without asking (scripts).
        #[arg(long, short = 'y')]
        yes: bool,
    },
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // Help and version go to stdout with 0; mistakes to stderr with USAGE (not
            // clap's 2, which `plan` uses for "changes").
            let code = if e.use_stderr() {
                exit::USAGE
            } else {
                exit::OK
            };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    tgsync::app::install_crypto_provider();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("tgsync: cannot start: {e}");
            return ExitCode::from(exit::ERROR);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("tgsync: {e}");
            ExitCode::from(exit::ERROR)
        }
    }
}

async fn run(cli: Cli) -> Result<u8, CliError> {
    let g = cli.global;
    match cli.command {
        Command::Status { groups, targets } => {
            let cluster = g.cluster.ok_or(CliError::Missing {
                flag: "--cluster",
                variable: "TGSYNC_CLUSTER_NAME",
            })?;
            let table = g.table.ok_or(CliError::Missing {
                flag: "--table",
                variable: "TGSYNC_TABLE_NAME",
            })?;
            let status = status::read(&cluster, &table, &groups).await?;
            if g.json {
                print_json(&status)?;
            } else {
                print!("{}", output::status(&status, targets));
            }
            Ok(if status.has_errors() {
                exit::ERROR
            } else {
                exit::OK
            })
        }
        Command::Plan { groups } => {
            let manual = Manual::new(&g.function, Duration::from_secs(g.wait)).await;
            let arns = manual.resolve(&groups).await?;
            let report = manual
                .run(payload(&arns, json!({ "dryRun": true })), None, "planning")
                .await?;
            if g.json {
                print_json(&report)?;
            } else {
                print!("{}", output::plan(&report));
            }
            Ok(if output::failed(&report) {
                exit::ERROR
            } else if output::has_changes(&report) {
                exit::CHANGES
            } else {
                exit::OK
            })
        }
        Command::Sync { force, groups } => {
            let manual = Manual::new(&g.function, Duration::from_secs(g.wait)).await;
            let arns = manual.resolve(&groups).await?;
            let body = if force {
                json!({ "force": true })
            } else {
                json!({})
            };
            let report = manual.run(payload(&arns, body), None, "syncing").await?;
            if g.json {
                print_json(&report)?;
            } else {
                print!("{}", output::sync(&report));
            }
            Ok(if output::failed(&report) {
                exit::ERROR
            } else {
                exit::OK
            })
        }
        Command::Release { groups, yes } => {
            let manual = Manual::new(&g.function, Duration::from_secs(g.wait)).await;
            let arns = manual.resolve(&groups).await?;
            let plan = manual
                .run(
                    json!({ "release": arns, "dryRun": true }),
                    None,
                    "planning the release",
                )
                .await?;
            if !g.json {
                print!("{}", output::release_plan(&plan));
            }
            if output::failed(&plan) {
                if g.json {
                    print_json(&json!({ "plan": plan, "release": Value::Null }))?;
                }
                return Ok(exit::ERROR);
            }
            if !yes && !progress::confirm(&output::release_question(&plan))? {
                if g.json {
                    print_json(&json!({ "plan": plan, "release": Value::Null }))?;
                }
                eprintln!(
                    "tgsync: release not confirmed; nothing changed{}",
                    if progress::interactive() {
                        ""
                    } else {
                        " (no terminal to ask on: pass --yes to release without asking)"
                    }
                );
                return Ok(exit::NOT_CONFIRMED);
            }
            let report = manual
                .run(
                    json!({ "release": arns }),
                    Some(tgsync::handlers::manual::RELEASE_ALIAS),
                    "releasing",
                )
                .await?;
            if g.json {
                print_json(&json!({ "plan": plan, "release": report }))?;
            } else {
                print!("{}", output::released(&report));
            }
            Ok(if output::failed(&report) {
                exit::ERROR
            } else {
                exit::OK
            })
        }
    }
}

/// A manual payload: `body`, narrowed to `arns` when any are named.
fn payload(arns: &[String], mut body: Value) -> Value {
    if !arns.is_empty() {
        body["targetGroups"] = json!(arns);
    }
    body
}

fn print_json(value: &impl serde::Serialize) -> Result<(), CliError> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}
