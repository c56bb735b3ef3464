#!/usr/bin/env bash
# One command for a release: builds into dist/ (git-ignored)
#   - every Lambda function of the workspace (each package under functions/*) for arm64,
#     release profile, zipped as Lambda wants it (`bootstrap` at the root):
#     dist/<package>-<version>-arm64.zip;
#   - the operator CLI (package tgsync-cli, binary `tgsync`) for this machine, when the
#     workspace has it: dist/tgsync-<version>-<host triple>.tar.gz;
#   - the packaged template dist/template.yaml: template.yaml with each function's CodeUri
#     pointing at its zip (next to it) and the AWS::ServerlessRepo::Application metadata,
#     deployable with `sam deploy --template-file dist/template.yaml` (which uploads the
#     zips) or `sam package` + `sam publish` to the Serverless Application Repository;
#   - LICENSE, README.md and SHA256SUMS beside them.
# Needs Rust (rustup) and Python 3; installs the aarch64 target (rustup) and cargo-lambda,
# zig and SAM CLI (PyPI, into .venv) when missing. No Docker, no AWS account.
#
# Usage: scripts/release.sh [--no-cli]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"

build_cli=1
for arg in "$@"; do
  case "$arg" in
    --no-cli) build_cli=0 ;;
    *) echo "usage: scripts/release.sh [--no-cli]" >&2; exit 2 ;;
  esac
done

ensure_venv
target=aarch64-unknown-linux-gnu
if ! rustup target list --installed | grep -qx "$target"; then
  log "installing the Rust target $target"
  rustup target add "$target"
fi

# The workspace as cargo sees it: version, Lambda packages (functions/*), the CLI.
metadata="$(cargo metadata --format-version 1 --no-deps --locked)"
read_meta() { python3 -c "$1" <<<"$metadata"; }
version="$(read_meta 'import json,sys; m=json.load(sys.stdin); print(next(p["version"] for p in m["packages"] if p["name"]=="tgsync"))')"
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

dist="$ROOT/dist"
rm -rf "$dist"
mkdir -p "$dist"

packages=()
for f in "${functions[@]}"; do packages+=(-p "${f%% *}"); done
log "tgsync $version: building ${#functions[@]} function(s) for arm64 (${functions[*]%% *})"
cargo lambda build --release --arm64 --locked --output-format zip "${packages[@]}"
zips=()
for f in "${functions[@]}"; do
  name="${f%% *}"
  zip="$name-$version-arm64.zip"
  cp "target/lambda/$name/bootstrap.zip" "$dist/$zip"
  zips+=("$name=$(cut -d' ' -f2 <<<"$f")=$zip")
done

if [ -n "$cli" ] && [ "$build_cli" = 1 ]; then
  host="$(rustc -vV | sed -n 's/^host: //p')"
  log "building the CLI ($cli, binary tgsync) for $host"
  cargo build --release --locked -p "$cli" --bin tgsync
  staging="$(mktemp -d)"
  mkdir "$staging/tgsync-$version"
  cp target/release/tgsync LICENSE README.md "$staging/tgsync-$version/"
  tar -C "$staging" -czf "$dist/tgsync-$version-$host.tar.gz" "tgsync-$version"
  rm -rf "$staging"
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
# Drop each function's build metadata (BuildMethod/BuildProperties): nothing to build.
text = re.sub(r"^    Metadata:\n      BuildMethod: rust-cargolambda\n      BuildProperties:\n(?:        .*\n)+", "", text, flags=re.M)
if "BuildMethod: rust-cargolambda" in text:
    sys.exit("template.yaml: a function's build metadata was not understood")
header = (f"# tgsync {version}: packaged by scripts/release.sh. CodeUri names the arm64 zips next to\n"
          "# this file; `sam deploy --template-file <this file>` uploads them.\n")
open(out, "w").write(header + text)
PY
cp LICENSE README.md "$dist/"
cfn-lint "$dist/template.yaml"
(cd "$dist" && files=(*) && sha256sum -- "${files[@]}" > SHA256SUMS)

log "dist/ (tgsync $version):"
for f in "$dist"/*; do
  printf '  %-48s %10s bytes\n' "$(basename "$f")" "$(stat -c %s "$f")"
done
