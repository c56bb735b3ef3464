//! The docs against the repository, from the files alone: the README's length, every
//! relative link and anchor, the version the docs state, the source layout, the
//! Kubernetes permissions they attribute to `infra/rbac.yaml`, the Terraform provider
//! range, and the release assets they name. (What the docs say about `template.yaml`
//! and the code is checked in `tests/template.rs`.)

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: impl AsRef<Path>) -> String {
    let path = root().join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The docs a reader is sent to: the README, the pages under `docs/`, BENCHMARKS.md, the
/// CHANGELOG and `infra/README.md` (repository-relative paths).
fn markdown_files() -> Vec<String> {
    let mut files = vec![
        "README.md".to_owned(),
        "BENCHMARKS.md".to_owned(),
        "CHANGELOG.md".to_owned(),
        "infra/README.md".to_owned(),
    ];
    let mut pages: Vec<String> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .map(|e| e.expect("a docs/ entry").file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    pages.sort();
    files.extend(pages);
    files
}

/// The docs that state current facts (not the CHANGELOG's or the benchmark log's history).
fn current_docs() -> Vec<String> {
    markdown_files()
        .into_iter()
        .filter(|f| f != "CHANGELOG.md" && f != "docs/benchmarks-history.md")
        .collect()
}

/// The lines of a markdown text outside fenced code blocks, with their line numbers.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push((i + 1, line));
        }
    }
    out
}

/// The anchor GitHub gives a heading: lower case, letters, digits, `-` and `_` kept,
/// spaces made `-`, everything else dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a markdown file's headings (a repeated heading's get `-1`, `-2`, ...).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for (_, line) in prose_lines(text) {
        let Some(heading) = line.strip_prefix('#') else {
            continue;
        };
        let heading = heading.trim_start_matches('#');
        if !heading.starts_with(' ') {
            continue;
        }
        let base = slug(heading);
        let n = seen.entry(base.clone()).or_insert(0);
        out.insert(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// The targets of the inline links `[text](target)` of a line, outside code spans.
fn link_targets(line: &str) -> Vec<String> {
    // Drop code spans, so that `[a](b)` shown as code is no link.
    let mut prose = String::new();
    for (i, part) in line.split('`').enumerate() {
        if i % 2 == 0 {
            prose.push_str(part);
        }
    }
    let mut out = Vec::new();
    let mut rest = prose.as_str();
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let Some(end) = after.find(')') else { break };
        out.push(after[..end].to_owned());
        rest = &after[end..];
    }
    out
}

/// The README is what a newcomer reads in ten minutes: under 400 lines, and it sends
/// the reader to every page under docs/.
#[test]
fn readme_is_a_ten_minute_read_that_links_every_page() {
    let readme = read("README.md");
    let lines = readme.lines().count();
    assert!(
        lines < 400,
        "README.md has {lines} lines; keep it under 400"
    );
    let linked: BTreeSet<String> = prose_lines(&readme)
        .into_iter()
        .flat_map(|(_, l)| link_targets(l))
        .map(|t| t.split('#').next().unwrap_or_default().to_owned())
        .collect();
    for page in markdown_files() {
        if page.starts_with("docs/") {
            assert!(
                linked.contains(&page),
                "README.md does not link {page}: a page nobody is sent to"
            );
        }
    }
}

/// Every relative link of the docs names a file that exists, and every `#anchor` a
/// heading of that file: moving a section breaks no link without this failing.
#[test]
fn every_relative_link_and_anchor_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in markdown_files() {
        let text = read(&file);
        let dir = Path::new(&file).parent().unwrap_or(Path::new(""));
        for (line_no, line) in prose_lines(&text) {
            for target in link_targets(line) {
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                let (path, fragment) = match target.split_once('#') {
                    Some((p, f)) => (p, Some(f)),
                    None => (target.as_str(), None),
                };
                let resolved = if path.is_empty() {
                    PathBuf::from(&file)
                } else {
                    dir.join(path)
                };
                checked += 1;
                let full = root().join(&resolved);
                if !full.exists() {
                    broken.push(format!("{file}:{line_no}: {target}: no such file"));
                    continue;
                }
                if let Some(fragment) = fragment {
                    assert!(
                        resolved.extension().is_some_and(|e| e == "md"),
                        "{file}:{line_no}: {target}: an anchor into a file that is not markdown"
                    );
                    let in_target = anchors(&read(&resolved));
                    if !in_target.contains(fragment) {
                        broken.push(format!(
                            "{file}:{line_no}: {target}: {} has no heading #{fragment}",
                            resolved.display()
                        ));
                    }
                }
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} links found: is the parser broken?"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// A semantic version at the start of `s` (`1.2.3`), if any.
fn version_at(s: &str) -> Option<String> {
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let v = s[..end].trim_end_matches('.');
    (v.split('.').count() == 3 && v.split('.').all(|p| !p.is_empty())).then(|| v.to_owned())
}

/// Every place the docs state tgsync's version (the install's `VERSION=`, what `tgsync
/// --version` prints, a Serverless Application Repository version, a release's S3
/// prefix) names the workspace's version: a release never ships docs for another.
#[test]
fn the_version_the_docs_state_is_the_workspaces() {
    // The root package takes `[workspace.package]`'s version (`version.workspace`).
    let version = env!("CARGO_PKG_VERSION").to_owned();
    // The ways the docs state it; each is followed by the version.
    let markers = [
        "VERSION=",
        "version=",
        "# tgsync ",
        "--semantic-version ",
        "semantic_version = \"",
        "SemanticVersion: ",
        "/tgsync/",
    ];
    let mut stated = Vec::new();
    for file in current_docs() {
        let text = read(&file);
        for marker in markers {
            for (at, _) in text.match_indices(marker) {
                if let Some(v) = version_at(&text[at + marker.len()..]) {
                    stated.push((file.clone(), marker, v));
                }
            }
        }
    }
    let wrong: Vec<_> = stated.iter().filter(|(_, _, v)| *v != version).collect();
    assert!(
        wrong.is_empty(),
        "the workspace is {version}, the docs state {wrong:?}"
    );
    // Not vacuous: the README's install states it, and the docs show what `tgsync
    // --version` prints.
    assert!(
        stated
            .iter()
            .any(|(f, m, _)| f == "README.md" && *m == "VERSION="),
        "README.md's install no longer states the version: {stated:?}"
    );
    assert!(
        stated.iter().any(|(_, m, _)| *m == "# tgsync "),
        "no doc shows what `tgsync --version` prints: {stated:?}"
    );
}

/// The release assets the docs name (`tgsync-<function>-<version>-arm64.zip`) are the
/// functions of the workspace: one zip per package under functions/, and no other.
#[test]
fn the_function_zips_the_docs_name_are_the_workspaces_functions() {
    let mut packages = BTreeSet::new();
    for entry in std::fs::read_dir(root().join("functions")).expect("functions/") {
        let dir = entry.expect("a functions/ entry").path();
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).expect("Cargo.toml");
        let name = manifest
            .split("[package]")
            .nth(1)
            .and_then(|p| {
                p.lines().find_map(|l| {
                    let (k, v) = l.split_once('=')?;
                    (k.trim() == "name").then(|| v.trim().trim_matches('"').to_owned())
                })
            })
            .expect("a package name");
        packages.insert(name);
    }
    for file in ["README.md", "docs/install.md"] {
        let text = read(file);
        let mut named = BTreeSet::new();
        for version in ["-$VERSION-arm64.zip", "-<version>-arm64.zip"] {
            for (at, _) in text.match_indices(version) {
                let start = text[..at]
                    .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                    .map_or(0, |i| i + 1);
                named.insert(text[start..at].to_owned());
            }
        }
        assert_eq!(
            named, packages,
            "{file}: the function zips it names and the packages under functions/ differ"
        );
    }
}

/// docs/architecture.md's `## Layout` names only paths that exist, and every module of
/// `src/`: when modules move, the section is rewritten.
#[test]
fn the_source_layout_names_every_module() {
    let text = read("docs/architecture.md");
    let section = text
        .split("\n## Layout\n")
        .nth(1)
        .expect("docs/architecture.md has a `## Layout` section");
    let section = section.split("\n## ").next().unwrap_or(section);
    let mut named = BTreeSet::new();
    for line in section.lines().filter(|l| l.starts_with("| `")) {
        let first = line.split('|').nth(1).unwrap_or_default();
        for path in first.split('`').skip(1).step_by(2) {
            named.insert(path.trim_end_matches('/').to_owned());
        }
    }
    assert!(!named.is_empty(), "the Layout table has no paths");
    for path in &named {
        // `functions/*/benches`: the part before the wildcard.
        let fixed = path.split('*').next().unwrap_or(path);
        assert!(
            root().join(fixed).exists(),
            "docs/architecture.md, Layout: {path} does not exist"
        );
    }
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(root().join("src")).expect("src/") {
        let name = entry
            .expect("a src/ entry")
            .file_name()
            .into_string()
            .unwrap();
        let path = format!("src/{}", name.trim_end_matches('/'));
        if !named.contains(&path) {
            missing.push(path);
        }
    }
    missing.sort();
    assert!(
        missing.is_empty(),
        "docs/architecture.md, Layout, does not name {missing:?}"
    );
}

/// The Kubernetes permissions docs/install.md attributes to `infra/rbac.yaml` are its
/// ClusterRoles' rules, each role has its row, and no row claims the manifest grants
/// what it does not (reading pods comes from the access entries).
#[test]
fn the_rbac_rows_of_the_docs_are_the_manifest() {
    let manifest = read("infra/rbac.yaml");
    let mut roles: BTreeMap<String, BTreeSet<(String, String)>> = BTreeMap::new();
    for doc in serde_norway::Deserializer::from_str(&manifest) {
        let doc = Value::deserialize(doc).expect("infra/rbac.yaml is YAML");
        if doc["kind"] != "ClusterRole" {
            continue;
        }
        let name = doc["metadata"]["name"].as_str().expect("a name").to_owned();
        let mut grants = BTreeSet::new();
        for rule in doc["rules"].as_array().expect("rules") {
            for resource in rule["resources"].as_array().expect("resources") {
                for verb in rule["verbs"].as_array().expect("verbs") {
                    grants.insert((
                        resource.as_str().unwrap().to_owned(),
                        verb.as_str().unwrap().to_owned(),
                    ));
                }
            }
        }
        roles.insert(name, grants);
    }
    assert!(roles.len() >= 2, "{roles:?}");
    let text = read("docs/install.md");
    let header = "| resource | verbs | for | granted by |";
    let rows: Vec<&str> = text
        .lines()
        .skip_while(|l| l.trim() != header)
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .collect();
    assert!(!rows.is_empty(), "docs/install.md has no table {header}");
    let mut documented: BTreeMap<String, BTreeSet<(String, String)>> = BTreeMap::new();
    for row in &rows {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let code = |cell: &str| -> Vec<String> {
            cell.split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_owned)
                .collect()
        };
        let (resources, verbs, granted_by) = (code(cells[1]), code(cells[2]), cells[4]);
        if !granted_by.contains("infra/rbac.yaml") {
            continue;
        }
        let role = code(granted_by)
            .into_iter()
            .find(|c| roles.contains_key(c))
            .unwrap_or_else(|| panic!("{row}: names no ClusterRole of infra/rbac.yaml"));
        let grants = documented.entry(role).or_default();
        for r in &resources {
            for v in &verbs {
                grants.insert((r.clone(), v.clone()));
            }
        }
    }
    assert_eq!(
        documented, roles,
        "docs/install.md's infra/rbac.yaml rows and the manifest differ"
    );
}

/// The AWS provider range the docs state is the Terraform module's.
#[test]
fn the_terraform_provider_range_the_docs_state_is_the_modules() {
    let versions = read("infra/terraform/modules/tgsync/versions.tf");
    let range = versions
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k.trim() == "version").then(|| v.trim().trim_matches('"').to_owned())
        })
        .expect("versions.tf names the provider's version");
    let example = read("infra/terraform/example-nlb.tf");
    assert!(
        example.contains(&format!("version = \"{range}\"")),
        "infra/terraform/example-nlb.tf asks for another range than the module's {range}"
    );
    let mut stated = 0;
    for file in current_docs() {
        let text = read(&file).replace('\n', " ");
        for (at, _) in text.match_indices("AWS provider") {
            let after = &text[at..(at + 80).min(text.len())];
            let Some(code) = after.split('`').nth(1) else {
                continue;
            };
            if code.starts_with('~') || code.starts_with('>') || code.starts_with('=') {
                assert_eq!(code, range, "{file}: {after}");
                stated += 1;
            }
        }
    }
    assert!(
        stated >= 2,
        "the docs state the provider range {stated} time(s)"
    );
}

/// The app's side of a QUIC server ID, as the README and docs/configuration.md give it
/// (a shell line on `POD_UID`), computes the ID tgsync registers the pod with.
#[test]
fn the_documented_quic_server_id_is_the_one_registered() {
    let uid = "9f0c2d4e-1b7a-4c3e-8d2f-5a6b7c8d9e0f";
    let want = tgsync::core::QuicServerId::from_uid(uid).to_string();
    for file in ["README.md", "docs/configuration.md"] {
        let text = read(file);
        let line = text
            .lines()
            .find(|l| l.contains("sha256sum") && l.contains("POD_UID"))
            .unwrap_or_else(|| panic!("{file} gives no shell line for the server ID"));
        let command = line
            .split_once("printf '0x%s'")
            .map(|(_, rest)| format!("printf '0x%s'{rest}"))
            .unwrap_or_else(|| panic!("{file}: {line}"));
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(&command)
            .env("POD_UID", uid)
            .output()
            .expect("sh runs");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            want,
            "{file}: `{command}`"
        );
    }
}

/// The rows of the markdown table in `text` whose header row starts with `header`.
fn table_rows<'a>(text: &'a str, header: &str) -> Vec<Vec<&'a str>> {
    text.lines()
        .skip_while(|l| !l.starts_with(header))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| l.trim_matches('|').split('|').map(str::trim).collect())
        .collect()
}

/// docs/operations.md sizes `ResyncMemorySize` by measured peaks: each "N MiB at P pods"
/// it quotes is a row of BENCHMARKS.md's memory table (the measurement), so a new
/// measurement there cannot leave the sizing table behind.
#[test]
fn the_memory_sizes_quote_the_benchmarks_peaks() {
    let benchmarks = read("BENCHMARKS.md");
    let measured: BTreeSet<(String, String)> =
        table_rows(&benchmarks, "| pods watched (1,000 groups")
            .into_iter()
            .map(|r| (r[0].to_owned(), r[2].to_owned()))
            .collect();
    assert!(
        measured.len() >= 3,
        "BENCHMARKS.md's memory table: {measured:?}"
    );
    let operations = read("docs/operations.md");
    let rows = table_rows(&operations, "| pods watched | `ResyncMemorySize`");
    let mut quoted = 0;
    for row in &rows {
        let peak = row[2];
        let Some((mib, rest)) = peak.split_once(" MiB at ") else {
            continue;
        };
        let pods: String = rest
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == ',')
            .collect();
        assert!(
            measured.contains(&(pods.clone(), format!("{mib} MiB"))),
            "docs/operations.md quotes {mib} MiB at {pods} pods; BENCHMARKS.md measured {measured:?}"
        );
        quoted += 1;
    }
    assert!(quoted >= 3, "docs/operations.md's sizing table: {rows:?}");
}

/// The reaction times the README quotes are current figures of BENCHMARKS.md's summary
/// table (each as a p50 there), so a new measurement cannot leave the README behind.
#[test]
fn the_readmes_reaction_times_are_the_benchmarks() {
    let readme = read("README.md");
    let row = readme
        .lines()
        .find(|l| l.starts_with("| Reaction time |"))
        .expect("README.md's comparison has a Reaction time row");
    let tgsync = row.split('|').nth(2).expect("the row's tgsync cell");
    let benchmarks = read("BENCHMARKS.md");
    let summary: Vec<&str> = benchmarks
        .lines()
        .skip_while(|l| !l.starts_with("| benchmark | current figure |"))
        .take_while(|l| l.starts_with('|'))
        .collect();
    let words: Vec<&str> = tgsync.split_whitespace().collect();
    let mut quoted = 0;
    for (i, w) in words.iter().enumerate() {
        if !w.starts_with("ms") || i == 0 {
            continue;
        }
        let figure = words[i - 1];
        assert!(
            summary
                .iter()
                .any(|l| l.contains(&format!("p50 {figure} ms"))),
            "README.md quotes a reaction of {figure} ms; BENCHMARKS.md's summary has no p50 {figure} ms"
        );
        quoted += 1;
    }
    assert!(quoted >= 2, "README.md's reaction row: {tgsync}");
}

/// The README's "Try it" gives the two commands a newcomer runs, and CI runs the README's
/// test command (the one `.ci/run` says it runs), so the two cannot drift apart.
#[test]
fn ci_runs_the_readmes_test_command() {
    let readme = read("README.md");
    let try_it: Vec<&str> = readme
        .lines()
        .skip_while(|l| *l != "## Try it")
        .skip(1)
        .take_while(|l| !l.starts_with("## "))
        .collect();
    let commands: Vec<&str> = try_it
        .iter()
        .skip_while(|l| !l.starts_with("```sh"))
        .skip(1)
        .take_while(|l| !l.starts_with("```"))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(
        commands,
        ["scripts/sandbox.sh", "scripts/test.sh"],
        "README.md's Try it: {try_it:#?}"
    );
    for command in &commands {
        assert!(root().join(command).is_file(), "{command} does not exist");
    }
    let ci = read(".ci/run");
    let last = ci
        .lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty() && !l.starts_with('#'))
        .unwrap_or_default();
    assert_eq!(
        last.split_whitespace().next(),
        Some(commands[1]),
        ".ci/run must end by running the README's test command; it ends with `{last}`"
    );
}

/// The first number in a table cell such as `**190 s** (5 + 180, rounded up)`.
fn seconds(cell: &str) -> u64 {
    let digits: String = cell
        .chars()
        .skip_while(|c| !c.is_ascii_digit())
        .take_while(char::is_ascii_digit)
        .collect();
    digits
        .parse()
        .unwrap_or_else(|_| panic!("no number in `{cell}`"))
}

/// The value of `key:` in the first YAML code block of `text` that has it.
fn yaml_value(text: &str, key: &str) -> u64 {
    text.lines()
        .find_map(|l| l.trim().strip_prefix(key))
        .map(seconds)
        .unwrap_or_else(|| panic!("no `{key}` in the example"))
}

/// docs/operations.md's graceful termination sizes the pod's side from tgsync's
/// deregistration latency and the load balancer's propagation: each recommended `preStop`
/// covers the watch's budget plus its load balancer's allowance, each grace period leaves
/// the app 30 s after it, and the README's example pod template is the NLB row (its ALB
/// figures the ALB row), the same as the page's own.
#[test]
fn the_termination_example_covers_the_documented_budgets() {
    let ops = read("docs/operations.md");
    let section: String = ops
        .lines()
        .skip_while(|l| *l != "## Graceful termination")
        .take_while(|l| *l == "## Graceful termination" || !l.starts_with("## "))
        .map(|l| format!("{l}\n"))
        .collect();
    let budgets: BTreeMap<String, u64> = table_rows(&section, "| | budget |")
        .into_iter()
        .map(|r| (r[0].to_owned(), seconds(r[1])))
        .collect();
    let watch = budgets["tgsync, watch mode (the default)"];
    // The rollout check holds pods to the same numbers: its budgets and allowances are
    // the table's.
    {
        use tgsync::core::rollout::{
            ALB_PROPAGATION_SECONDS, Allowances, Latency, LoadBalancerType,
            NLB_PROPAGATION_SECONDS, POD_EVENTS_LATENCY_SECONDS, SCHEDULE_DIFF_SECONDS,
            WATCH_LATENCY_SECONDS,
        };
        let code = [
            ("tgsync, watch mode (the default)", WATCH_LATENCY_SECONDS),
            (
                "tgsync, pod-events without watch mode",
                POD_EVENTS_LATENCY_SECONDS,
            ),
            ("NLB propagation", NLB_PROPAGATION_SECONDS),
            ("ALB propagation", ALB_PROPAGATION_SECONDS),
        ];
        for (row, seconds) in code {
            assert_eq!(
                budgets.get(row).copied(),
                Some(u64::from(seconds)),
                "docs/operations.md's `{row}` and the rollout check's number differ"
            );
        }
        assert_eq!(Latency::watch().seconds, WATCH_LATENCY_SECONDS);
        assert_eq!(Latency::pod_events().seconds, POD_EVENTS_LATENCY_SECONDS);
        let allowances = Allowances::default();
        assert_eq!(
            allowances.of(LoadBalancerType::Nlb),
            NLB_PROPAGATION_SECONDS
        );
        assert_eq!(
            allowances.of(LoadBalancerType::Alb),
            ALB_PROPAGATION_SECONDS
        );
        // Schedule only: `ScheduleMinutes` × 60 s + the diff's seconds.
        let schedule = table_rows(&section, "| | budget |")
            .into_iter()
            .find(|r| r[0] == "tgsync, schedule only")
            .expect("the schedule-only row");
        let (per, plus) = schedule[1]
            .split_once(" + ")
            .unwrap_or_else(|| panic!("`{}`: N × 60 s + M s", schedule[1]));
        assert!(per.contains("× 60 s"), "`{}`", schedule[1]);
        assert_eq!(seconds(plus), u64::from(SCHEDULE_DIFF_SECONDS));
        for minutes in [1, 2, 3] {
            assert_eq!(
                Latency::schedule_only(minutes).seconds,
                minutes * 60 + SCHEDULE_DIFF_SECONDS
            );
        }
        // The template's allowances default to them too.
        let template = read("template.yaml");
        for (parameter, seconds) in [
            ("NlbPropagationSeconds", NLB_PROPAGATION_SECONDS),
            ("AlbPropagationSeconds", ALB_PROPAGATION_SECONDS),
        ] {
            let default = template
                .split(&format!("\n  {parameter}:\n"))
                .nth(1)
                .and_then(|p| p.lines().find_map(|l| l.trim().strip_prefix("Default: ")))
                .unwrap_or_else(|| panic!("template.yaml has no {parameter} default"));
            assert_eq!(default, seconds.to_string(), "{parameter}");
        }
    }
    let sized = table_rows(&section, "| load balancer | `preStop` sleep |");
    assert_eq!(sized.len(), 2, "{sized:?}");
    let mut by_type = BTreeMap::new();
    for row in &sized {
        let (pre_stop, grace) = (seconds(row[1]), seconds(row[2]));
        let propagation = budgets[&format!("{} propagation", row[0])];
        assert!(
            pre_stop >= watch + propagation && pre_stop < watch + propagation + 10,
            "{}: a preStop of {pre_stop} s for {watch} s + {propagation} s",
            row[0]
        );
        assert!(grace >= pre_stop + 30, "{}: grace {grace} s", row[0]);
        by_type.insert(row[0], (pre_stop, grace));
    }
    let readme = read("README.md");
    let example: String = readme
        .lines()
        .skip_while(|l| !l.starts_with("**Pods that roll without dropped connections.**"))
        .take_while(|l| !l.starts_with("### "))
        .map(|l| format!("{l}\n"))
        .collect();
    let (nlb_pre_stop, nlb_grace) = by_type["NLB"];
    assert_eq!(yaml_value(&example, "seconds:"), nlb_pre_stop);
    assert_eq!(
        yaml_value(&example, "terminationGracePeriodSeconds:"),
        nlb_grace
    );
    let (alb_pre_stop, alb_grace) = by_type["ALB"];
    assert!(
        example.contains(&format!("{alb_pre_stop} s and {alb_grace} s")),
        "README.md's ALB figures are not {alb_pre_stop} s and {alb_grace} s"
    );
    let block = |text: &str| -> String {
        text.lines()
            .skip_while(|l| *l != "```yaml")
            .skip(1)
            .take_while(|l| *l != "```")
            .map(|l| format!("{l}\n"))
            .collect()
    };
    let page_example: String = section
        .lines()
        .skip_while(|l| !l.starts_with("The pod template for an NLB group"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(
        block(&example),
        block(&page_example),
        "README.md and docs/operations.md show different pod templates"
    );
}
