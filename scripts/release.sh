#!/usr/bin/env bash
# One command for a release, the one the release workflow (.github/workflows/release.yml)
# runs on a version tag. Builds into dist/ (git-ignored):
#   - every Lambda function of the workspace (each package under functions/*) for arm64,
#     release profile, zipped as Lambda wants it (`bootstrap` at the root):
#     dist/<package>-<version>-arm64.zip;
#   - the operator CLI (package tgsync-cli, binary `tgsync`), static (musl, linked by zig
#     through cargo-zigbuild) for each CLI target (default: x86_64-unknown-linux-musl and
#     aarch64-unknown-linux-musl): dist/tgsync-<version>-<target>.tar.gz holding
#     tgsync-<version>/{tgsync,LICENSE,README.md} with the manual pages (man/) and every
#     shell's completion script (completions/), packed by scripts/release_assets.py (the
#     release workflow's macOS and Windows runners pack theirs with it too);
#   - the packaged template dist/template.yaml: template.yaml with each function's CodeUri
#     pointing at its zip (next to it), deployable with `sam deploy --template-file
#     template.yaml` from a directory holding just it and the zips (so without the
#     LicenseUrl and ReadmeUrl of its Serverless Application Repository metadata, which
#     `sam package` would want beside it; --sar-publish puts them back);
#   - dist/SHA256SUMS of those files: dist/ is exactly the release's assets.
# Needs Rust (rustup) and Python 3; installs the Rust targets (rustup) and cargo-lambda,
# cargo-zigbuild, zig and SAM CLI (PyPI, into .venv) when missing. No Docker, no AWS
# account. A CLI target rustup cannot install is skipped, saying so (with --tag, it
# fails the release instead).
#
# Usage:
#   scripts/release.sh [--no-cli] [--cli-target TRIPLE]... [--tag vX.Y.Z [--github-release]]
#   scripts/release.sh --tag vX.Y.Z --publish-only
#   scripts/release.sh --tag vX.Y.Z --sar-publish BUCKET
#
#   --no-cli            no CLI in this release
#   --cli-target T      build the CLI for T only (repeatable; .ci/run builds one)
#   --tag vX.Y.Z        the tag being released: must be v<workspace version>; every CLI
#                       target must build
#   --github-release    then publish dist/ as the tag's GitHub release (`gh`, GH_TOKEN)
#   --publish-only      build nothing: publish dist/ as an earlier run built it (checked
#                       against SHA256SUMS) as the tag's GitHub release (the release
#                       workflow builds without a write token and publishes in a job of
#                       its own)
#   --sar-publish B     publish the tag's release to the Serverless Application
#                       Repository instead of building: its assets (dist/, else
#                       downloaded with `gh release download`) checked against
#                       SHA256SUMS, `sam package` to S3 bucket B, `sam publish`
#                       (AWS credentials and region from the environment;
#                       TGSYNC_SAR_PACKAGE_ONLY=1 stops before `sam publish`)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"

usage() { sed -n '/^# Usage:/,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
build_cli=1
cli_targets=()
tag=""
github_release=0
publish_only=0
sar_bucket=""
while [ $# -gt 0 ]; do
  case "$1" in
    --no-cli) build_cli=0 ;;
    --cli-target) [ $# -ge 2 ] || usage; cli_targets+=("$2"); shift ;;
    --tag) [ $# -ge 2 ] || usage; tag="$2"; shift ;;
    --github-release) github_release=1 ;;
    --publish-only) publish_only=1 ;;
    --sar-publish) [ $# -ge 2 ] || usage; sar_bucket="$2"; shift ;;
    -h | --help) usage ;;
    *) echo "scripts/release.sh: unknown argument $1" >&2; usage ;;
  esac
  shift
done
given_targets=${#cli_targets[@]}
[ "${#cli_targets[@]}" -gt 0 ] || cli_targets=(x86_64-unknown-linux-musl aarch64-unknown-linux-musl)
if { [ "$github_release" = 1 ] || [ "$publish_only" = 1 ] || [ -n "$sar_bucket" ]; } && [ -z "$tag" ]; then
  echo "scripts/release.sh: --github-release, --publish-only and --sar-publish need --tag" >&2
  exit 2
fi
if [ -n "$tag" ] && [ -z "$sar_bucket" ] && { [ "$build_cli" = 0 ] || [ "$given_targets" -ne 0 ]; }; then
  echo "scripts/release.sh: a tagged release builds the CLI for both targets (no --no-cli, no --cli-target)" >&2
  exit 2
fi

ensure_venv

# The workspace as cargo sees it: version, Lambda packages (functions/*), the CLI.
metadata="$(cargo metadata --format-version 1 --no-deps --locked)"
read_meta() { python3 -c "$1" <<<"$metadata"; }
version="$(read_meta 'import json,sys; m=json.load(sys.stdin); print(next(p["version"] for p in m["packages"] if p["name"]=="tgsync"))')"
target_dir="$(read_meta 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
if [ -n "$tag" ] && [ "$tag" != "v$version" ]; then
  echo "scripts/release.sh: the tag is $tag but the workspace version is $version (tag v$version, or bump [workspace.package] version)" >&2
  exit 1
fi
dist="$ROOT/dist"

# The release notes: the CHANGELOG's section of this version. Every build reads it, so
# the step a tag runs is the one .ci/run runs; a tagged release needs the section dated.
notes="$(mktemp)"
notes_state="$(python3 - "$version" "$notes" <<'PY'
import re, sys
version, out = sys.argv[1], sys.argv[2]
text = open("CHANGELOG.md").read()
m = re.search(rf"^## {re.escape(version)}\b([^\n]*)\n(.*?)(?=^## |\Z)", text, re.M | re.S)
open(out, "w").write(m.group(2).strip() + "\n" if m else "")
print("missing" if not m else "unreleased" if "unreleased" in m.group(1).lower() else "dated")
PY
)"
if [ "$notes_state" = dated ]; then
  log "release notes: CHANGELOG.md's $version section ($(wc -l <"$notes") lines)"
elif [ -n "$tag" ] && [ -z "$sar_bucket" ]; then
  echo "scripts/release.sh: CHANGELOG.md's section for $version is $notes_state: give it the release's date (## $version ($(date -u +%F))) before tagging $tag" >&2
  exit 1
else
  log "release notes: CHANGELOG.md's $version section is $notes_state (a tagged release refuses that)"
fi

# --- A release an earlier run built: publish it -------------------------------------------
if [ "$publish_only" = 1 ]; then
  [ -s "$dist/SHA256SUMS" ] || { echo "scripts/release.sh: --publish-only publishes dist/ as an earlier run built it, and dist/SHA256SUMS is missing" >&2; exit 1; }
  log "checking dist/ against SHA256SUMS"
  (cd "$dist" && sha256sum --strict -c SHA256SUMS)
  files=("$dist"/*)
  listed=$(wc -l <"$dist/SHA256SUMS")
  [ "${#files[@]}" -eq $((listed + 1)) ] || { echo "scripts/release.sh: dist/ holds ${#files[@]} files, SHA256SUMS lists $listed (and itself): publish exactly what was built" >&2; exit 1; }
  log "publishing the GitHub release $tag (${#files[@]} assets)"
  gh release create "$tag" --verify-tag --title "tgsync $version" --notes-file "$notes" "${files[@]}"
  rm -f "$notes"
  exit 0
fi

# --- Serverless Application Repository ----------------------------------------------------
if [ -n "$sar_bucket" ]; then
  rm -f "$notes"
  if [ ! -s "$dist/SHA256SUMS" ]; then
    log "downloading the assets of the GitHub release $tag"
    rm -rf "$dist"
    mkdir -p "$dist"
    gh release download "$tag" --dir "$dist"
  fi
  log "checking dist/ against SHA256SUMS"
  (cd "$dist" && sha256sum --strict -c SHA256SUMS)
  # The application's template: the release's, with the license and readme of the tag.
  sar="$(mktemp -d)"
  cp "$dist"/*-arm64.zip LICENSE README.md "$sar/"
  python3 - "$dist/template.yaml" "$sar/template.yaml" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
text, n = re.subn(r"^(    SpdxLicenseId: .*\n)", r"\g<1>    LicenseUrl: LICENSE\n    ReadmeUrl: README.md\n", text, flags=re.M)
if n != 1:
    sys.exit(f"{sys.argv[1]}: expected one SpdxLicenseId in its AWS::ServerlessRepo::Application metadata, found {n}")
open(sys.argv[2], "w").write(text)
PY
  log "sam package: the zips, LICENSE and README.md to s3://$sar_bucket/tgsync/$version"
  sam package --template-file "$sar/template.yaml" --s3-bucket "$sar_bucket" \
    --s3-prefix "tgsync/$version" --output-template-file "$sar/packaged.yaml" --no-progressbar
  if [ -n "${TGSYNC_SAR_PACKAGE_ONLY:-}" ]; then
    log "TGSYNC_SAR_PACKAGE_ONLY: not publishing; the packaged template is $sar/packaged.yaml"
    exit 0
  fi
  log "sam publish: tgsync $version"
  sam publish --template "$sar/packaged.yaml" --semantic-version "$version"
  rm -rf "$sar"
  exit 0
fi

# --- build --------------------------------------------------------------------------------
mapfile -t functions < <(read_meta '
import json, os, sys
m = json.load(sys.stdin)
root = m["workspace_root"]
for p in sorted(m["packages"], key=lambda p: p["manifest_path"]):
    rel = os.path.relpath(os.path.dirname(p["manifest_path"]), root)
    if rel.startswith("functions" + os.sep) and p["id"] in m["workspace_members"]:
        print(p["name"] + " " + rel)
')
cli="$(read_meta 'import json,sys; m=json.load(sys.stdin); print(next((p["name"] for p in m["packages"] if p["name"]=="tgsync-cli" and p["id"] in m["workspace_members"]), ""))')"
[ "${#functions[@]}" -gt 0 ] || { echo "no packages under functions/" >&2; exit 1; }

# rust_target T: T installed (rustup adds it when missing); false, saying why, when not.
rust_target() {
  rustup target list --installed | grep -qx "$1" && return 0
  log "installing the Rust target $1"
  rustup target add "$1" && return 0
  echo "scripts/release.sh: rustup could not install the Rust target $1" >&2
  return 1
}

rm -rf "$dist"
mkdir -p "$dist"
started=$SECONDS

rust_target aarch64-unknown-linux-gnu
packages=()
for f in "${functions[@]}"; do packages+=(-p "${f%% *}"); done
log "tgsync $version: building ${#functions[@]} function(s) for arm64 (${functions[*]%% *})"
cargo lambda build --release --arm64 --locked --output-format zip "${packages[@]}"
zips=()
for f in "${functions[@]}"; do
  name="${f%% *}"
  zip="$name-$version-arm64.zip"
  cp "$target_dir/lambda/$name/bootstrap.zip" "$dist/$zip"
  zips+=("$name=$(cut -d' ' -f2 <<<"$f")=$zip")
done
log "functions built in $((SECONDS - started)) s"

# check_static FILE TARGET: FILE is an ELF executable for TARGET's machine with no
# program interpreter (statically linked: runs on any Linux of that architecture).
check_static() {
  python3 - "$1" "$2" <<'PY'
import struct, sys
path, target = sys.argv[1], sys.argv[2]
machines = {"x86_64": 62, "aarch64": 183}
want = machines[target.split("-")[0]]
data = open(path, "rb").read()
if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
    sys.exit(f"{path}: not a 64-bit little-endian ELF file")
machine, = struct.unpack_from("<H", data, 18)
if machine != want:
    sys.exit(f"{path}: ELF machine {machine}, {target} wants {want}")
phoff, = struct.unpack_from("<Q", data, 32)
phentsize, phnum = struct.unpack_from("<HH", data, 54)
for i in range(phnum):
    p_type, = struct.unpack_from("<I", data, phoff + i * phentsize)
    if p_type == 3:  # PT_INTERP: linked against a dynamic loader
        sys.exit(f"{path}: dynamically linked (has a program interpreter)")
PY
}

built_at="$(git log -1 --format=%ct 2>/dev/null || echo 0)"
cli_built=()
cli_skipped=()
if [ -n "$cli" ] && [ "$build_cli" = 1 ]; then
  # The manual pages and completions: written by the first CLI that runs, for every
  # archive.
  extras="$(mktemp -d)"
  for target in "${cli_targets[@]}"; do
    case "$target" in
      *-linux-musl) ;;
      *) echo "scripts/release.sh: --cli-target $target: the release's CLI is static, a *-linux-musl target" >&2; exit 2 ;;
    esac
    if ! rust_target "$target"; then
      if [ -n "$tag" ]; then
        echo "scripts/release.sh: the release $tag needs the CLI for $target" >&2
        exit 1
      fi
      log "SKIPPED: the CLI for $target (its Rust target is not installed and rustup could not install it)"
      cli_skipped+=("$target")
      continue
    fi
    cli_started=$SECONDS
    log "building the CLI ($cli, binary tgsync) for $target, static (cargo zigbuild)"
    cargo zigbuild --release --locked -p "$cli" --bin tgsync --target "$target"
    bin="$target_dir/$target/release/tgsync"
    check_static "$bin" "$target"
    # It runs and says its version (here, or under qemu-user when installed), and the
    # first that runs writes the manual pages and completions every archive holds.
    arch="${target%%-*}"
    run=()
    [ "$arch" = "$(uname -m)" ] || run=(--run "qemu-$arch")
    if [ "${#run[@]}" -gt 0 ] && ! command -v "qemu-$arch" >/dev/null 2>&1; then
      if [ -n "$tag" ]; then
        echo "scripts/release.sh: the release $tag runs every CLI it ships once: $bin is for $arch (install qemu-user)" >&2
        exit 1
      fi
      run=(--no-run)
    fi
    python3 scripts/release_assets.py cli --bin "$bin" --target "$target" --version "$version" \
      --dist "$dist" --extras "$extras" --epoch "$built_at" "${run[@]}"
    cli_built+=("$target")
    log "the CLI for $target: static, built in $((SECONDS - cli_started)) s"
  done
  rm -rf "$extras"
elif [ -z "$cli" ]; then
  log "no tgsync-cli package in the workspace: no CLI in this release"
else
  log "--no-cli: no CLI in this release"
fi

# The packaged template: CodeUri of each function -> its zip; no build metadata (the
# code is built); SemanticVersion checked against the workspace version.
log "packaging template.yaml"
python3 - "$version" "$dist/template.yaml" "${zips[@]}" <<'PY'
import re, sys
version, out, zips = sys.argv[1], sys.argv[2], sys.argv[3:]
text = open("template.yaml").read()
semver = re.search(r"^    SemanticVersion: (\S+)$", text, re.M)
if not semver or semver.group(1) != version:
    sys.exit(f"template.yaml: AWS::ServerlessRepo::Application SemanticVersion is "
             f"{semver and semver.group(1)}, the workspace is {version}")
for entry in zips:
    package, directory, zip_name = entry.split("=")
    # `CodeUri: functions/<dir>` -> `CodeUri: <zip>`; the template must name each one.
    text, n = re.subn(rf"^(\s+CodeUri: ){re.escape(directory)}\s*$", rf"\g<1>{zip_name}", text, flags=re.M)
    if n != 1:
        sys.exit(f"template.yaml: expected one `CodeUri: {directory}` (package {package}), found {n}")
# Without LicenseUrl and ReadmeUrl, `sam deploy` needs nothing beside it but the zips.
for key, value in (("LicenseUrl", "LICENSE"), ("ReadmeUrl", "README.md")):
    text, n = re.subn(rf"^    {key}: {re.escape(value)}\n", "", text, flags=re.M)
    if n != 1:
        sys.exit(f"template.yaml: expected one `{key}: {value}` in the AWS::ServerlessRepo::Application metadata, found {n}")
# Drop each function's build metadata (BuildMethod/BuildProperties): nothing to build.
text = re.sub(r"^    Metadata:\n      BuildMethod: rust-cargolambda\n      BuildProperties:\n(?:        .*\n)+", "", text, flags=re.M)
if "BuildMethod: rust-cargolambda" in text:
    sys.exit("template.yaml: a function's build metadata was not understood")
header = (f"# tgsync {version}: packaged by scripts/release.sh. CodeUri names the arm64 zips next to\n"
          "# this file; `sam deploy --template-file <this file>` uploads them.\n"
          "# (`scripts/release.sh --sar-publish` adds the LicenseUrl and ReadmeUrl.)\n")
open(out, "w").write(header + text)
PY
cfn-lint "$dist/template.yaml"
python3 scripts/release_assets.py sums "$dist"

log "dist/ (tgsync $version), built in $((SECONDS - started)) s:"
for f in "$dist"/*; do
  printf '  %-52s %10s bytes\n' "$(basename "$f")" "$(stat -c %s "$f")"
done
if [ "${#cli_skipped[@]}" -gt 0 ]; then
  log "NOT in this release: the CLI for ${cli_skipped[*]} (see above)"
fi

# --- GitHub release -----------------------------------------------------------------------
if [ "$github_release" = 1 ]; then
  files=("$dist"/*)
  log "publishing the GitHub release $tag (${#files[@]} assets)"
  gh release create "$tag" --verify-tag --title "tgsync $version" --notes-file "$notes" "${files[@]}"
fi
rm -f "$notes"
