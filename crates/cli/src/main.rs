//! `tgsync`: the operator's command line for a tgsync deployment.
//!
//! - `status` reads (DynamoDB GetItem/Query on the state table, ELBv2 Describe calls,
//!   and the cluster's pods for the desired count) and never invokes anything;
//! - `plan`, `sync` and `release` go through the manual function (`tgsync-manual`), the
//!   way the README's `aws lambda invoke` does; a release goes through its `release`
//!   alias, after showing its plan and asking.
//!
//! The deployment is named by its CloudFormation stack (`--stack`, whose outputs give the
//! cluster, state table and manual function) or by those names themselves. Everything
//! it prints for people goes to stdout as tables (stderr for progress and errors, each
//! error one line with what to do); `--json` prints the machine form instead. Exit
//! codes: [`exit`]. docs/cli.md is its manual.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod error;
mod invoke;
mod json_times;
#[cfg(test)]
mod manual_page;
mod output;
mod progress;
mod session;
mod stack;
mod status;
mod style;

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, Parser, Subcommand};
use serde_json::{Value, json};

use crate::error::CliError;
use crate::invoke::Manual;
use crate::session::Session;
use crate::stack::{Deployment, Given};
use crate::style::{ColorChoice, Style};

/// The exit codes, as docs/cli.md documents them.
pub mod exit {
    /// Done; for `plan`, nothing to do.
    pub const OK: u8 = 0;
    /// Something failed: an AWS call, the function, or a group.
    pub const ERROR: u8 = 1;
    /// `plan`: changes are planned.
    pub const CHANGES: u8 = 2;
    /// `release`: not confirmed (answered no, or no terminal and no `--yes`).
    pub const NOT_CONFIRMED: u8 = 3;
    /// The deployment could not be looked at: no credentials or region, access denied,
    /// the stack, one of its outputs or the manual function not found, a setting
    /// missing or invalid, an endpoint out of reach. Nothing was read or changed.
    pub const SETUP: u8 = 4;
    /// The command line is wrong.
    pub const USAGE: u8 = 64;
}

/// What `--help` shows after the options: examples, and the exit codes ([`exit`]; a test
/// holds the two to each other and to docs/cli.md).
const AFTER_HELP: &str = "\
Examples:
  export TGSYNC_STACK=tgsync           name the deployment once
  tgsync status                        every bound group, read-only
  tgsync status web-tg --targets       one group's targets and their pods
  tgsync plan -o json                  the dry run, for a script
  tgsync sync --force web-tg           one pass now, ignoring backoff
  tgsync release web-tg                show the plan, ask, then release

Exit codes:
  0   done; plan: nothing to do
  1   an error (a call, the function, a group)
  2   plan: changes are planned
  3   release: not confirmed
  4   the deployment could not be looked at (credentials, region, stack, function)
  64  the command line is wrong

Manual: docs/cli.md";

/// Look at and drive a tgsync deployment.
#[derive(Debug, Parser)]
#[command(name = "tgsync", version, about, long_about = None, after_help = AFTER_HELP)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Args)]
#[command(next_help_heading = "Global options")]
struct Global {
    /// The deployment's CloudFormation stack: the cluster, state table and manual
    /// function are read from its outputs (flags and variables below win over it).
    #[arg(long, env = "TGSYNC_STACK", global = true, value_name = "NAME")]
    stack: Option<String>,
    /// The EKS cluster the deployment serves (status; the stack's ClusterName).
    #[arg(long, env = "TGSYNC_CLUSTER_NAME", global = true)]
    cluster: Option<String>,
    /// The deployment's state table (status; the stack's StateTableName output).
    #[arg(long, env = "TGSYNC_TABLE_NAME", global = true)]
    table: Option<String>,
    /// The manual function (plan, sync, release; the stack's ManualFunctionName output;
    /// without a stack: tgsync-manual).
    #[arg(long = "function", env = "TGSYNC_MANUAL_FUNCTION", global = true)]
    function: Option<String>,
    /// The AWS region (default: AWS_REGION, then the profile's).
    #[arg(long, global = true)]
    region: Option<String>,
    /// The AWS profile of the shared config files (default: AWS_PROFILE, then default).
    #[arg(long, global = true)]
    profile: Option<String>,
    /// Print JSON for machines instead of tables (never coloured): `-o json`.
    #[arg(long, global = true)]
    json: bool,
    /// What stdout gets: tables for people, or JSON for machines (`--json`).
    #[arg(long, short = 'o', value_enum, default_value_t = Format::Table, global = true, value_name = "FORMAT")]
    output: Format,
    /// Colour: auto (on a terminal, unless NO_COLOR is set and not empty), always or never.
    #[arg(long, value_enum, default_value_t = ColorChoice::Auto, global = true, value_name = "WHEN")]
    color: ColorChoice,
    /// On failure, also print what the AWS SDK said.
    #[arg(long, short = 'v', global = true)]
    verbose: bool,
    /// How long to keep retrying while another manual run holds the manual function's
    /// slot (Lambda answers 429).
    #[arg(long, default_value_t = 60, value_name = "SECONDS", global = true)]
    wait: u64,
}

/// What stdout gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Format {
    /// Tables for people.
    Table,
    /// JSON for machines (never coloured).
    Json,
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
    /// The dry run, as a diff. Exit 0: nothing to do; 2: changes planned; 1 or 4: error.
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
    /// Print the shell completion script (e.g. `tgsync completions bash >
    /// ~/.local/share/bash-completion/completions/tgsync`).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff; e.g. `tgsync man | man -l -`); with `--dir`, write
    /// it and a page per command there (tgsync.1, tgsync-status.1, …).
    Man {
        /// Write the pages into this directory instead of printing tgsync.1.
        #[arg(long, value_name = "DIR")]
        dir: Option<std::path::PathBuf>,
    },
}

/// `tgsync man`: the manual page on stdout, or every page written into `dir`. Both name
/// the same commands: no `help` (clap's own, which has no page of its own; `tgsync
/// help` still works).
fn manual(dir: Option<&std::path::Path>) -> ExitCode {
    let command = Cli::command().disable_help_subcommand(true);
    let written = match dir {
        None => clap_mangen::Man::new(command).render(&mut std::io::stdout().lock()),
        Some(dir) => {
            std::fs::create_dir_all(dir).and_then(|()| clap_mangen::generate_to(command, dir))
        }
    };
    match written {
        // `tgsync man | head` is not a failure.
        Ok(()) => ExitCode::from(exit::OK),
        Err(e) if dir.is_none() && e.kind() == std::io::ErrorKind::BrokenPipe => {
            ExitCode::from(exit::OK)
        }
        Err(e) => {
            let place = dir.map_or_else(|| "stdout".to_owned(), |d| d.display().to_string());
            eprintln!("tgsync: writing the manual page to {place} failed: {e}");
            ExitCode::from(exit::ERROR)
        }
    }
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
    match &cli.command {
        Command::Completions { shell } => {
            clap_complete::generate(
                *shell,
                &mut Cli::command(),
                "tgsync",
                &mut std::io::stdout(),
            );
            return ExitCode::from(exit::OK);
        }
        Command::Man { dir } => return manual(dir.as_deref()),
        _ => {}
    }
    cli.global.color.apply();
    let (verbose, errors) = (cli.global.verbose, Style::stderr());
    tgsync::app::install_crypto_provider();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            anstream::eprintln!("{} cannot start: {e}", errors.red("tgsync:"));
            return ExitCode::from(exit::ERROR);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            // One line: the cause and what to do; the SDK's account only when asked.
            let line = e.to_string().replace('\n', " ");
            anstream::eprintln!("{} {line}", errors.red("tgsync:"));
            if verbose && let Some(detail) = e.detail() {
                for line in detail.lines() {
                    anstream::eprintln!("{} {line}", errors.dim("tgsync: detail:"));
                }
            }
            ExitCode::from(e.exit_code())
        }
    }
}

async fn run(cli: Cli) -> Result<u8, CliError> {
    let g = cli.global;
    let json = g.json || g.output == Format::Json;
    let style = Style::stdout(json);
    let session = Session::connect(g.region.as_deref(), g.profile.as_deref()).await?;
    let deployment = Deployment::resolve(
        &session,
        Given {
            stack: g.stack,
            cluster: g.cluster,
            table: g.table,
            function: g.function,
        },
    )
    .await?;
    let wait = Duration::from_secs(g.wait);
    match cli.command {
        Command::Status { groups, targets } => {
            let cluster = deployment.cluster()?;
            let table = deployment.table()?;
            let status =
                status::read(&session, &cluster, &table, &groups, &deployment.settings()).await?;
            if json {
                print_json(&status)?;
            } else {
                print(&output::status(&status, targets, style))?;
            }
            Ok(if status.has_errors() {
                exit::ERROR
            } else {
                exit::OK
            })
        }
        Command::Plan { groups } => {
            let manual = Manual::new(&session, &deployment.function()?, wait).await;
            let arns = manual.resolve(&groups).await?;
            let report = manual
                .run(payload(&arns, json!({ "dryRun": true })), None, "planning")
                .await?;
            if json {
                print_json(&report)?;
            } else {
                print(&output::plan(&report, style))?;
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
            let manual = Manual::new(&session, &deployment.function()?, wait).await;
            let arns = manual.resolve(&groups).await?;
            let body = if force {
                json!({ "force": true })
            } else {
                json!({})
            };
            let report = manual.run(payload(&arns, body), None, "syncing").await?;
            if json {
                print_json(&report)?;
            } else {
                print(&output::sync(&report, style))?;
            }
            Ok(if output::failed(&report) {
                exit::ERROR
            } else {
                exit::OK
            })
        }
        Command::Release { groups, yes } => {
            let manual = Manual::new(&session, &deployment.function()?, wait).await;
            let arns = manual.resolve(&groups).await?;
            let plan = manual
                .run(
                    json!({ "release": arns, "dryRun": true }),
                    None,
                    "planning the release",
                )
                .await?;
            if !json {
                print(&output::release_plan(&plan, style))?;
            }
            if output::failed(&plan) {
                if json {
                    print_json(&json!({ "plan": plan, "release": Value::Null }))?;
                }
                return Ok(exit::ERROR);
            }
            if !yes && !progress::confirm(&output::release_question(&plan))? {
                if json {
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
            if json {
                print_json(&json!({ "plan": plan, "release": report }))?;
            } else {
                print(&output::released(&report, style))?;
            }
            Ok(if output::release_failed(&report) {
                exit::ERROR
            } else {
                exit::OK
            })
        }
        // Answered in main, before any AWS setup.
        Command::Completions { .. } | Command::Man { .. } => Ok(exit::OK),
    }
}

/// A manual payload: `body`, narrowed to `arns` when any are named.
fn payload(arns: &[String], mut body: Value) -> Value {
    if !arns.is_empty() {
        body["targetGroups"] = json!(arns);
    }
    body
}

/// Prints `value` as JSON, its times as RFC 3339 (see [`json_times`]).
fn print_json(value: &impl serde::Serialize) -> Result<(), CliError> {
    let mut value = serde_json::to_value(value)?;
    json_times::rfc3339(&mut value);
    print(&format!("{}\n", serde_json::to_string_pretty(&value)?))
}

/// Writes `text` to stdout (through `anstream`: see [`style`]); a closed pipe (`tgsync
/// status | head`) ends quietly instead of panicking as `print!` does.
fn print(text: &str) -> Result<(), CliError> {
    let mut out = anstream::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(CliError::Io(e)),
        _ => Ok(()),
    }
}
