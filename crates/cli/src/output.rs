//! The human forms: tables and diffs. Pure (strings in, strings out), so tests read them.

use std::fmt::Write;

use tgsync::core::rollout::Reaction;
use tgsync::core::{Plan, RolloutCheck, Target, UnixMillis};
use tgsync::report::{GroupReport, Outcome, Report};

use crate::status::Status;
use crate::style::Style;

/// Columns separated by two spaces, each as wide as its widest cell.
#[cfg(test)]
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    table_lines(header, rows)
        .into_iter()
        .map(|l| l + "\n")
        .collect()
}

/// The lines of a table: the header first, then one per row (aligned before any colour,
/// so escapes never skew the columns).
fn table_lines(header: &[&str], rows: &[Vec<String>]) -> Vec<String> {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut l = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                l.push_str(c);
            } else {
                let _ = write!(l, "{c:<w$}  ", w = widths[i]);
            }
        }
        l.trim_end().to_owned()
    };
    let mut out = vec![line(header.to_vec())];
    for row in rows {
        out.push(line(row.iter().map(String::as_str).collect()));
    }
    out
}

/// Appends a table: the header in bold, the rows `failing` says so in red.
fn push_table(
    out: &mut String,
    header: &[&str],
    rows: &[Vec<String>],
    failing: impl Fn(usize) -> bool,
    style: Style,
) {
    for (i, l) in table_lines(header, rows).into_iter().enumerate() {
        let painted = match i {
            0 => style.bold(&l),
            i if failing(i - 1) => style.red(&l),
            _ => l,
        };
        out.push_str(&painted);
        out.push('\n');
    }
}

/// `12 s ago`, `in 3 min`, from `now`.
fn relative(at: UnixMillis, now: UnixMillis) -> String {
    let (secs, future) = if at.0 >= now.0 {
        ((at.0 - now.0) / 1000, true)
    } else {
        ((now.0 - at.0) / 1000, false)
    };
    let span = match secs {
        0..120 => format!("{secs} s"),
        120..7200 => format!("{} min", secs / 60),
        _ => format!("{} h", secs / 3600),
    };
    if future {
        format!("in {span}")
    } else {
        format!("{span} ago")
    }
}

fn list(targets: &[Target]) -> String {
    targets
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether a plan changes anything.
fn plan_changes(p: &Plan) -> bool {
    !(p.register.is_empty() && p.deregister.is_empty() && p.adopt.is_empty() && p.forget.is_empty())
}

/// `tgsync status`.
pub fn status(s: &Status, with_targets: bool, style: Style) -> String {
    let now = s.read_at;
    let mut out = format!(
        "cluster {}, state table {}: {} group(s)\n\n",
        s.cluster,
        s.table,
        s.groups.len()
    );
    let rows: Vec<Vec<String>> = s
        .groups
        .iter()
        .map(|g| {
            vec![
                g.name.clone(),
                g.desired.map_or("?".into(), |d| d.to_string()),
                g.registered.to_string(),
                g.healthy.to_string(),
                g.owned.to_string(),
                (g.foreign + g.other_clusters).to_string(),
                g.backoff.as_ref().map_or("-".into(), |b| {
                    format!(
                        "{} failure(s), next {}",
                        b.failures,
                        relative(b.next_attempt_at, now)
                    )
                }),
                g.lease.as_ref().map_or("-".into(), |l| {
                    format!("{} (until {})", l.owner, relative(l.until, now))
                }),
                g.last_verified_at
                    .map_or("never".into(), |at| relative(at, now)),
                rollout_cell(g.rollout.as_ref()),
            ]
        })
        .collect();
    push_table(
        &mut out,
        &[
            "GROUP",
            "DESIRED",
            "REGISTERED",
            "HEALTHY",
            "OWNED",
            "FOREIGN",
            "BACKOFF",
            "LEASE",
            "VERIFIED",
            "ROLLOUT",
        ],
        &rows,
        |i| s.groups[i].error.is_some(),
        style,
    );
    for g in &s.groups {
        let mut notes = Vec::new();
        if let Some(e) = &g.error {
            notes.push(style.red(&format!("error: {e}")));
        }
        if let Some(p) = g.pending.as_ref().filter(|p| plan_changes(p)) {
            let mut parts = Vec::new();
            for (what, t) in [
                ("register", &p.register),
                ("deregister", &p.deregister),
                ("adopt", &p.adopt),
                ("forget", &p.forget),
            ] {
                if !t.is_empty() {
                    parts.push(format!("{what} {}", list(t)));
                }
            }
            notes.push(style.yellow(&format!("pending: {}", parts.join("; "))));
        }
        if g.other_clusters > 0 {
            notes.push(format!(
                "{} of the foreign targets are other clusters' (shared group)",
                g.other_clusters
            ));
        }
        if let Some(note) = g.rollout.as_ref().and_then(rollout_note) {
            notes.push(style.yellow(&note));
        }
        if !notes.is_empty() {
            out.push('\n');
            let _ = writeln!(out, "{}:", g.name);
            for n in notes {
                let _ = writeln!(out, "  {n}");
            }
        }
        if with_targets && !g.targets.is_empty() {
            out.push('\n');
            let _ = writeln!(out, "{} ({})", g.name, g.target_group_arn);
            // The rollout check's word on a target's pod, when it has one for any.
            let said = g.targets.iter().any(|t| t.rollout.is_some());
            let rows: Vec<Vec<String>> = g
                .targets
                .iter()
                .map(|t| {
                    let mut row = vec![
                        t.target.to_string(),
                        t.health.clone(),
                        match &t.pod {
                            Some(pod) => format!("{} ({pod})", t.owner),
                            None => t.owner.clone(),
                        },
                    ];
                    if said {
                        row.push(t.rollout.clone().unwrap_or_else(|| "-".into()));
                    }
                    row
                })
                .collect();
            let header: &[&str] = if said {
                &["TARGET", "HEALTH", "OWNER", "ROLLOUT"]
            } else {
                &["TARGET", "HEALTH", "OWNER"]
            };
            for (i, l) in table_lines(header, &rows).into_iter().enumerate() {
                let _ = writeln!(out, "  {}", if i == 0 { style.bold(&l) } else { l });
            }
        }
    }
    if !s.orphans.is_empty() {
        out.push_str("\norphaned (no longer bound, ledger still holds this cluster's targets; `tgsync release` them):\n");
        for o in &s.orphans {
            let _ = writeln!(out, "  {} ({} target(s))", o.target_group_arn, o.targets);
        }
    }
    for e in &s.errors {
        let _ = writeln!(out, "\n{}", style.red(&format!("error: {e}")));
    }
    out
}

/// The status table's ROLLOUT cell: `ok` when every pod's termination covers the
/// budget and every pod has the gate, else what is not (`2 too short`, `1 unknown`,
/// `3 no gate`); `?` when the termination could not be checked (see the note), `-`
/// without pods or a check.
fn rollout_cell(r: Option<&RolloutCheck>) -> String {
    let Some(r) = r.filter(|r| r.pods > 0) else {
        return "-".into();
    };
    let mut parts = Vec::new();
    if r.unchecked.is_some() {
        parts.push("?".to_owned());
    }
    for (n, what) in [
        (r.too_short, "too short"),
        (r.unknown, "unknown"),
        (r.without_gate, "no gate"),
    ] {
        if n > 0 {
            parts.push(format!("{n} {what}"));
        }
    }
    if parts.is_empty() {
        "ok".into()
    } else {
        parts.join(", ")
    }
}

/// The note under a group the rollout check has something to say about: the numbers it
/// used and what falls short (each pod's reason is in `--targets`).
fn rollout_note(r: &RolloutCheck) -> Option<String> {
    let mut said = Vec::new();
    if let Some(why) = &r.unchecked {
        said.push(format!("termination not checked: {why}"));
    }
    if let (Some(lb), Some(need)) = (r.load_balancer, r.pre_stop_needed_seconds) {
        let terms = format!(
            "{} {} s + {} {} s",
            mode_name(r.mode),
            r.latency_seconds,
            lb.as_str(),
            r.allowance_seconds.unwrap_or_default()
        );
        if r.too_short > 0 {
            said.push(format!(
                "{} of {} pod(s) terminate too soon for the {}: each needs a preStop sleep of at least {need} s ({terms}) and a terminationGracePeriodSeconds no shorter",
                r.too_short,
                r.pods,
                lb.as_str()
            ));
        }
        if r.unknown > 0 {
            said.push(format!(
                "{} pod(s) have a preStop tgsync cannot read (it should sleep at least {need} s: {terms})",
                r.unknown
            ));
        }
    }
    if r.without_gate > 0 {
        said.push(format!(
            "{} of {} pod(s) without the tgsync/target-health readiness gate",
            r.without_gate, r.pods
        ));
    }
    (!said.is_empty()).then(|| format!("rollout: {}", said.join("; ")))
}

/// How the rollout check's note names the deployment's mode.
fn mode_name(mode: Reaction) -> &'static str {
    match mode {
        Reaction::Watch => "watch",
        Reaction::PodEvents => "pod-events",
        Reaction::ScheduleOnly => "schedule only",
    }
}

/// How a kind of line is coloured.
type Paint = fn(Style, &str) -> String;

/// One group's plan as a diff, indented.
fn diff(out: &mut String, p: &Plan, foreign_kept: &[Target], style: Style) {
    let kept: &[Target] = if p.foreign_kept.is_empty() {
        foreign_kept
    } else {
        &p.foreign_kept
    };
    let paints: [(&str, &str, &[Target], Paint); 5] = [
        ("-", "deregister", &p.deregister[..], Style::red),
        ("+", "register", &p.register[..], Style::green),
        (
            "~",
            "adopt (present, not yet owned)",
            &p.adopt[..],
            Style::yellow,
        ),
        (
            "x",
            "forget (gone; drop the ledger entry)",
            &p.forget[..],
            Style::dim,
        ),
        ("=", "foreign, kept", kept, Style::dim),
    ];
    for (mark, what, targets, paint) in paints {
        for t in targets {
            let line = format!("  {mark} {:<22} {what}", t.to_string());
            let _ = writeln!(out, "{}", paint(style, &line));
        }
    }
}

fn outcome_name(o: Outcome) -> String {
    serde_json::to_value(o)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// A group's trouble, if any: its error, its failed targets, the registrations that
/// wait target by target (when each is tried again, from `now`) and its pod errors.
fn trouble(out: &mut String, g: &GroupReport, now: UnixMillis, style: Style) {
    if let Some(e) = &g.error {
        let _ = writeln!(out, "{}", style.red(&format!("  ! {e}")));
    }
    for f in &g.failed_targets {
        let line = format!("  ! {} {}: {}", f.operation, f.target, f.error);
        let _ = writeln!(out, "{}", style.red(&line));
    }
    for w in &g.waiting {
        let line = format!(
            "  ~ waits {} (pod {}): {}; tried again {}",
            w.target,
            w.pod,
            w.reason,
            relative(w.retry_at, now)
        );
        let _ = writeln!(out, "{}", style.red(&line));
    }
    for e in &g.pod_errors {
        let _ = writeln!(
            out,
            "{}",
            style.red(&format!("  ! pod {}: {}", e.pod, e.error))
        );
    }
}

/// `tgsync plan`.
pub fn plan(r: &Report, style: Style) -> String {
    let mut out = format!(
        "plan of cluster {} (dry run): {} group(s), {} ms\n",
        r.cluster, r.totals.groups, r.duration_ms
    );
    let (mut reg, mut dereg, mut adopt, mut forget, mut changing) = (0, 0, 0, 0, 0);
    for g in &r.groups {
        out.push('\n');
        match &g.plan {
            Some(p) if plan_changes(p) => {
                changing += 1;
                reg += p.register.len();
                dereg += p.deregister.len();
                adopt += p.adopt.len();
                forget += p.forget.len();
                let _ = writeln!(
                    out,
                    "{}",
                    style.bold(&format!("{} ({} desired)", g.name, g.desired))
                );
                diff(&mut out, p, &g.foreign_kept, style);
            }
            Some(p) => {
                let _ = writeln!(out, "{}: in sync ({} desired)", g.name, g.desired);
                diff(&mut out, p, &[], style);
            }
            None => {
                let _ = writeln!(out, "{}: {}", g.name, outcome_name(g.outcome));
            }
        }
        trouble(
            &mut out,
            g,
            r.started_at
                .plus(std::time::Duration::from_millis(r.duration_ms)),
            style,
        );
    }
    for o in r.orphans.iter().flatten() {
        let _ = writeln!(
            out,
            "\norphaned: {} ({} target(s)); {}",
            o.target_group_arn, o.targets, o.action
        );
    }
    for e in &r.errors {
        let _ = writeln!(out, "\n{}", style.red(&format!("error: {e}")));
    }
    let summary = if changing == 0 {
        "nothing to do".to_owned()
    } else {
        format!(
            "{reg} to register, {dereg} to deregister, {adopt} to adopt, {forget} to forget, in {changing} of {} group(s)",
            r.groups.len()
        )
    };
    let _ = writeln!(out, "\n{}", style.bold(&summary));
    out
}

/// Whether a dry run plans changes.
pub fn has_changes(r: &Report) -> bool {
    r.groups
        .iter()
        .any(|g| g.plan.as_ref().is_some_and(plan_changes))
}

/// Whether anything failed: a run-level error, or a group that failed, has a binding
/// error or is backing off.
pub fn failed(r: &Report) -> bool {
    !r.errors.is_empty()
        || r.groups
            .iter()
            .any(|g| g.outcome.is_error() || !g.failed_targets.is_empty())
}

/// Whether a release failed: anything [`failed`] counts, or a group it did not release
/// (its holder kept the lease, the invocation ran out of time): a release that
/// released nothing is never a success, whatever the function's release calls it.
pub fn release_failed(r: &Report) -> bool {
    failed(r) || r.groups.iter().any(|g| g.outcome != Outcome::Released)
}

/// `tgsync sync`.
pub fn sync(r: &Report, style: Style) -> String {
    let mut out = format!(
        "sync of cluster {}: {} group(s), {} changed, {} ms\n\n",
        r.cluster, r.totals.groups, r.totals.changed, r.duration_ms
    );
    let rows: Vec<Vec<String>> = r
        .groups
        .iter()
        .map(|g| {
            vec![
                g.name.clone(),
                outcome_name(g.outcome),
                g.desired.to_string(),
                g.registered.len().to_string(),
                g.deregistered.len().to_string(),
                g.forgotten.len().to_string(),
                g.error.clone().unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    push_table(
        &mut out,
        &[
            "GROUP",
            "OUTCOME",
            "DESIRED",
            "REGISTERED",
            "DEREGISTERED",
            "FORGOTTEN",
            "ERROR",
        ],
        &rows,
        |i| r.groups[i].outcome.is_error() || r.groups[i].error.is_some(),
        style,
    );
    for e in &r.errors {
        let _ = writeln!(out, "\n{}", style.red(&format!("error: {e}")));
    }
    out
}

/// The release plan shown before asking.
pub fn release_plan(r: &Report, style: Style) -> String {
    let mut out = format!("release plan for cluster {} (dry run):\n", r.cluster);
    for g in &r.groups {
        out.push('\n');
        let _ = writeln!(
            out,
            "{}",
            style.bold(&format!("{} ({})", g.name, g.target_group_arn))
        );
        match &g.plan {
            Some(p) => diff(&mut out, p, &g.foreign_kept, style),
            None => {
                let _ = writeln!(out, "  {}", outcome_name(g.outcome));
            }
        }
        trouble(
            &mut out,
            g,
            r.started_at
                .plus(std::time::Duration::from_millis(r.duration_ms)),
            style,
        );
    }
    for n in &r.notes {
        let _ = writeln!(out, "\nnote: {n}");
    }
    for e in &r.errors {
        let _ = writeln!(out, "\n{}", style.red(&format!("error: {e}")));
    }
    out
}

/// The question before a release.
pub fn release_question(r: &Report) -> String {
    let deregister: usize = r
        .groups
        .iter()
        .filter_map(|g| g.plan.as_ref())
        .map(|p| p.deregister.len())
        .sum();
    format!(
        "\nRelease {} group(s) of cluster {}: deregister {deregister} target(s) and drop its ledger entries? The load balancer stops sending them traffic.",
        r.groups.len(),
        r.cluster
    )
}

/// The release's result.
pub fn released(r: &Report, style: Style) -> String {
    let mut out = format!(
        "released {} of {} group(s) of cluster {}:\n\n",
        r.totals.released,
        r.groups.len(),
        r.cluster
    );
    let rows: Vec<Vec<String>> = r
        .groups
        .iter()
        .map(|g| {
            vec![
                g.name.clone(),
                outcome_name(g.outcome),
                g.deregistered.len().to_string(),
                g.forgotten.len().to_string(),
                list(&g.foreign_kept),
                g.error.clone().unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    push_table(
        &mut out,
        &[
            "GROUP",
            "OUTCOME",
            "DEREGISTERED",
            "FORGOTTEN",
            "KEPT",
            "ERROR",
        ],
        &rows,
        |i| r.groups[i].outcome.is_error() || r.groups[i].error.is_some(),
        style,
    );
    for n in &r.notes {
        let _ = writeln!(out, "\nnote: {n}");
    }
    let unreleased: Vec<&str> = r
        .groups
        .iter()
        .filter(|g| g.outcome != Outcome::Released)
        .map(|g| g.name.as_str())
        .collect();
    if !unreleased.is_empty() {
        let line = format!(
            "error: {} of {} group(s) not released ({}): see ERROR, then run `tgsync release` for them again",
            unreleased.len(),
            r.groups.len(),
            unreleased.join(", ")
        );
        let _ = writeln!(out, "\n{}", style.red(&line));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_and_times_read_naturally() {
        let t = table(
            &["A", "LONGER"],
            &[
                vec!["wide cell".into(), "x".into()],
                vec!["b".into(), "".into()],
            ],
        );
        assert_eq!(t, "A          LONGER\nwide cell  x\nb\n");
        let now = UnixMillis(1_000_000);
        assert_eq!(relative(UnixMillis(988_000), now), "12 s ago");
        assert_eq!(relative(UnixMillis(1_300_000), now), "in 5 min");
    }

    /// A release the function answered with a group not released (its lease held by
    /// another process until the end, as a function of an earlier release answers) is
    /// a failure: `tgsync release` exits 1 and says what to do.
    #[test]
    fn a_release_that_released_nothing_fails() {
        let mut r = Report::new("manual", "demo", false, UnixMillis(1_000_000));
        let mut busy = GroupReport::new("arn:b", "busy", Outcome::LeaseHeld);
        busy.lease_until = Some(UnixMillis(1_015_000));
        busy.error = Some("another reconcile kept the group's lease".into());
        r.groups.push(busy);
        r.groups
            .push(GroupReport::new("arn:w", "web", Outcome::Released));
        let r = r.finish(UnixMillis(1_005_000));
        assert!(release_failed(&r), "{r:#?}");
        let text = released(&r, Style::PLAIN);
        assert!(
            text.contains("error: 1 of 2 group(s) not released (busy)")
                && text.contains("run `tgsync release` for them again"),
            "{text}"
        );
        // Every group released: a success, and no such line.
        let mut ok = Report::new("manual", "demo", false, UnixMillis(1_000_000));
        ok.groups
            .push(GroupReport::new("arn:w", "web", Outcome::Released));
        let ok = ok.finish(UnixMillis(1_005_000));
        assert!(!release_failed(&ok));
        assert!(!released(&ok, Style::PLAIN).contains("not released"));
    }

    #[test]
    fn a_waiting_registration_says_why_and_when() {
        let mut r = Report::new("manual", "demo", false, UnixMillis(1_000_000));
        let mut g = GroupReport::new("arn:a", "web", Outcome::Failed);
        g.waiting.push(tgsync::report::WaitingTarget {
            target: "10.0.1.9:80".parse().unwrap(),
            pod: "shop/web-9".into(),
            reason: "InvalidTarget: not in the VPC".into(),
            retry_at: UnixMillis(1_030_000),
        });
        r.groups.push(g);
        let r = r.finish(UnixMillis(1_000_000));
        let text = plan(&r, Style::PLAIN);
        assert!(
            text.contains("  ~ waits 10.0.1.9:80 (pod shop/web-9): InvalidTarget: not in the VPC; tried again in 30 s"),
            "{text}"
        );
    }

    /// `status` has a ROLLOUT column (what the rollout check found per group), a note
    /// with the numbers it used, and with `--targets` each of this cluster's targets
    /// whose pod falls short says why.
    #[test]
    fn the_status_table_shows_the_rollout_check_and_targets_say_why() {
        use crate::status::{GroupStatus, Status, TargetStatus};
        use tgsync::core::PodFacts;
        use tgsync::core::rollout::{Allowances, GroupAttributes, Latency, check};
        use tgsync::testkit::PodBuilder;
        let pod = |name: &str, b: fn(PodBuilder) -> PodBuilder| {
            PodFacts::from_pod(b(PodBuilder::new("shop", name).ip("10.0.1.1")).build())
        };
        let pods = [
            pod("web-1", |b| b),
            pod("web-2", |b| b.gated().grace_period(220).pre_stop_sleep(190)),
        ];
        let nlb = GroupAttributes {
            protocol: Some("TCP".into()),
            ..GroupAttributes::default()
        };
        let group = |name: &str, rollout: Option<RolloutCheck>| GroupStatus {
            target_group_arn: format!("arn:{name}"),
            name: name.into(),
            account: "123456789012".into(),
            desired: Some(2),
            registered: 2,
            healthy: 2,
            owned: 2,
            other_clusters: 0,
            foreign: 0,
            pending: None,
            backoff: None,
            lease: None,
            last_verified_at: None,
            error: None,
            rollout,
            targets: Vec::new(),
        };
        let checked = check(
            &pods,
            Latency::watch(),
            Ok(&nlb),
            Allowances::default(),
            true,
        );
        let mut web = group("web", Some(checked.clone()));
        web.targets = ["web-1", "web-2"]
            .iter()
            .enumerate()
            .map(|(i, name)| TargetStatus {
                target: format!("10.0.1.{}:8080", i + 1).parse().unwrap(),
                health: "healthy".into(),
                owner: "tgsync".into(),
                pod: Some(format!("shop/{name}")),
                rollout: checked
                    .findings
                    .iter()
                    .find(|f| f.pod == format!("shop/{name}"))
                    .map(|f| f.reason.clone()),
            })
            .collect();
        let covered = check(
            &pods[1..],
            Latency::watch(),
            Ok(&nlb),
            Allowances::default(),
            false,
        );
        let unread = check(
            &pods[1..],
            Latency::watch(),
            Err("the group's attributes are not read yet"),
            Allowances::default(),
            false,
        );
        let s = Status {
            cluster: "demo".into(),
            table: "t".into(),
            read_at: UnixMillis(1_000_000),
            groups: vec![
                web,
                group("api", Some(covered)),
                group("new", Some(unread)),
                group("old", None),
            ],
            orphans: Vec::new(),
            errors: Vec::new(),
        };
        let text = status(&s, false, Style::PLAIN);
        let column = |name: &str| {
            let header = text.lines().find(|l| l.starts_with("GROUP")).unwrap();
            let at = header.find("ROLLOUT").expect("a ROLLOUT column");
            let row = text.lines().find(|l| l.starts_with(name)).unwrap();
            row[at..].trim().to_owned()
        };
        assert_eq!(column("web"), "1 too short, 1 no gate");
        assert_eq!(column("api"), "ok");
        assert_eq!(column("new"), "?");
        assert_eq!(column("old"), "-");
        assert!(
            text.contains("  rollout: 1 of 2 pod(s) terminate too soon for the NLB: each needs a preStop sleep of at least 185 s (watch 5 s + NLB 180 s) and a terminationGracePeriodSeconds no shorter; 1 of 2 pod(s) without the tgsync/target-health readiness gate"),
            "{text}"
        );
        assert!(
            text.contains(
                "  rollout: termination not checked: the group's attributes are not read yet"
            ),
            "{text}"
        );
        let targets = status(&s, true, Style::PLAIN);
        assert!(
            targets.contains("TARGET         HEALTH   OWNER                ROLLOUT"),
            "{targets}"
        );
        assert!(
            targets.contains("10.0.1.1:8080  healthy  tgsync (shop/web-1)  no preStop sleep: SIGTERM at the deletion; it needs a preStop of at least 185 s (watch 5 s + NLB 180 s); no tgsync/target-health readiness gate"),
            "{targets}"
        );
        assert!(
            targets.contains("10.0.1.2:8080  healthy  tgsync (shop/web-2)  -"),
            "{targets}"
        );
        // Not a failure: the exit code stays 0.
        assert!(!s.has_errors());
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["groups"][0]["rollout"]["tooShort"], 1);
        assert!(
            json["groups"][0]["targets"][0]["rollout"]
                .as_str()
                .unwrap()
                .starts_with("no preStop sleep")
        );
    }

    #[test]
    fn a_plan_reads_as_a_diff() {
        let t = |s: &str| s.parse::<Target>().unwrap();
        let mut r = Report::new("manual", "demo", true, UnixMillis(0));
        let mut g = GroupReport::new("arn:a", "web", Outcome::Planned);
        g.desired = 2;
        g.plan = Some(Plan {
            register: vec![t("10.0.1.2:80")],
            deregister: vec![t("10.0.1.9:80")],
            foreign_kept: vec![t("10.0.9.9:80")],
            ..Plan::default()
        });
        r.groups.push(g);
        let r = r.finish(UnixMillis(5));
        let text = plan(&r, Style::PLAIN);
        assert!(text.contains("  - 10.0.1.9:80"), "{text}");
        assert!(text.contains("  + 10.0.1.2:80"), "{text}");
        assert!(text.contains("  = 10.0.9.9:80"), "{text}");
        assert!(text.contains("1 to register, 1 to deregister"), "{text}");
        assert!(has_changes(&r) && !failed(&r));
        let painted = plan(&r, Style::PAINTED);
        assert!(painted.contains("\x1b[32m  + 10.0.1.2:80"), "{painted}");
        assert!(painted.contains("\x1b[31m  - 10.0.1.9:80"), "{painted}");
        assert_eq!(
            painted
                .replace("\x1b[0m", "")
                .replace("\x1b[1m", "")
                .replace("\x1b[2m", "")
                .replace("\x1b[31m", "")
                .replace("\x1b[32m", ""),
            text,
            "the same text, painted"
        );
    }
}
