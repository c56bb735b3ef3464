//! docs/cli.md against the CLI itself: its flags table (flag, variable, default), its
//! commands table, its shells and its exit codes are the ones clap and [`crate::exit`]
//! define, so the manual cannot drift from the binary without this failing.

use std::collections::BTreeSet;

use clap::{CommandFactory, ValueEnum};

use crate::{Cli, exit};

const PAGE: &str = include_str!("../../../docs/cli.md");

/// The rows of the table under `heading`: each row's cells, trimmed.
fn table(heading: &str) -> Vec<Vec<String>> {
    let start = PAGE
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("docs/cli.md has `{heading}`"));
    let section = &PAGE[start + heading.len() + 2..];
    let section = &section[..section.find("\n## ").unwrap_or(section.len())];
    section
        .lines()
        .filter(|l| l.starts_with('|') && !l.starts_with("|---"))
        .skip(1) // the header
        .map(|l| {
            l.trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_owned())
                .collect()
        })
        .collect()
}

/// The `` `code` `` spans of a cell.
fn spans(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).collect()
}

#[test]
fn the_flags_table_is_the_clis() {
    let rows = table("## Flags and variables");
    let command = Cli::command();
    let flags: Vec<_> = command
        .get_arguments()
        .filter(|a| a.is_global_set())
        .filter_map(|a| Some((a.get_long()?, a)))
        .filter(|(long, _)| !matches!(*long, "help" | "version"))
        .collect();
    let documented: BTreeSet<String> = rows
        .iter()
        .flat_map(|r| spans(&r[0]))
        .filter_map(|s| s.split(' ').next())
        .filter(|f| f.starts_with("--"))
        .map(|f| f.trim_start_matches("--").to_owned())
        .collect();
    let defined: BTreeSet<String> = flags.iter().map(|(l, _)| (*l).to_owned()).collect();
    assert_eq!(
        documented, defined,
        "docs/cli.md's flags table against clap's"
    );
    for (long, arg) in flags {
        let row = rows
            .iter()
            .find(|r| {
                spans(&r[0])
                    .iter()
                    .any(|s| s.split(' ').next() == Some(format!("--{long}").as_str()))
            })
            .unwrap_or_else(|| panic!("a row for --{long}"));
        if let Some(env) = arg.get_env() {
            let env = env.to_string_lossy();
            assert_eq!(spans(&row[1]), [env.as_ref()], "--{long}'s variable");
        }
        // A switch's implicit `false` is no documented default.
        let values = arg.get_action().takes_values();
        for default in arg.get_default_values().iter().filter(|_| values) {
            let default = format!("`{}`", default.to_string_lossy());
            assert!(
                row[2].contains(&default),
                "--{long}'s default {default}: {row:?}"
            );
        }
        if let Some(short) = arg.get_short() {
            assert!(
                spans(&row[0]).contains(&format!("-{short}").as_str()),
                "-{short}"
            );
        }
    }
}

#[test]
fn the_commands_table_and_its_shells_are_the_clis() {
    let rows = table("## Commands");
    let command = Cli::command();
    let documented: BTreeSet<String> = rows
        .iter()
        .filter_map(|r| spans(&r[0]).first()?.split(' ').nth(1).map(str::to_owned))
        .collect();
    let defined: BTreeSet<String> = command
        .get_subcommands()
        .map(|c| c.get_name().to_owned())
        .filter(|n| n != "help")
        .collect();
    assert_eq!(
        documented, defined,
        "docs/cli.md's commands table against clap's"
    );
    for sub in command.get_subcommands() {
        let Some(row) = rows
            .iter()
            .find(|r| r[0].starts_with(&format!("`tgsync {}", sub.get_name())))
        else {
            continue;
        };
        for long in sub
            .get_arguments()
            .filter(|a| !a.is_global_set())
            .filter_map(|a| a.get_long())
        {
            assert!(
                row[0].contains(&format!("--{long}")),
                "{}: --{long}",
                sub.get_name()
            );
        }
    }
    let shells = rows
        .iter()
        .find(|r| r[0].starts_with("`tgsync completions"))
        .map(|r| {
            spans(&r[1])
                .into_iter()
                .map(str::to_owned)
                .collect::<BTreeSet<_>>()
        })
        .unwrap_or_default();
    let defined: BTreeSet<String> = clap_complete::Shell::value_variants()
        .iter()
        .filter_map(|s| Some(s.to_possible_value()?.get_name().to_owned()))
        .collect();
    assert_eq!(shells, defined, "the shells docs/cli.md lists");
}

#[test]
fn the_exit_codes_table_is_the_clis() {
    let documented: BTreeSet<u8> = table("## Exit codes")
        .iter()
        .map(|r| r[0].parse().unwrap_or_else(|_| panic!("a code: {r:?}")))
        .collect();
    let defined = BTreeSet::from([
        exit::OK,
        exit::ERROR,
        exit::CHANGES,
        exit::NOT_CONFIRMED,
        exit::SETUP,
        exit::USAGE,
    ]);
    assert_eq!(documented, defined);
}

/// `--help` lists the same exit codes as docs/cli.md and [`crate::exit`], its examples
/// are command lines the CLI accepts, and the global options stand under their own
/// heading.
#[test]
fn the_help_shows_valid_examples_the_exit_codes_and_the_global_options_apart() {
    let help = Cli::command().render_help().to_string();
    assert!(help.contains("Global options:"), "{help}");
    let codes = &help[help.find("Exit codes:").expect("an exit codes section")..];
    let listed: BTreeSet<u8> = codes
        .lines()
        .skip(1)
        .map_while(|l| l.split_whitespace().next()?.parse().ok())
        .collect();
    let documented: BTreeSet<u8> = table("## Exit codes")
        .iter()
        .filter_map(|r| r[0].parse().ok())
        .collect();
    assert_eq!(
        listed, documented,
        "--help's exit codes against docs/cli.md's"
    );
    let examples: Vec<&str> = help
        .lines()
        .skip_while(|l| *l != "Examples:")
        .skip(1)
        .take_while(|l| !l.is_empty())
        .filter_map(|l| {
            let line = l.trim_start();
            line.starts_with("tgsync ")
                .then(|| line.split("  ").next().unwrap_or(line))
        })
        .collect();
    assert!(examples.len() >= 4, "{examples:?}");
    for example in examples {
        let args: Vec<&str> = example.split_whitespace().collect();
        if let Err(e) = <Cli as clap::Parser>::try_parse_from(&args) {
            panic!("the example `{example}` does not parse: {e}");
        }
    }
}
