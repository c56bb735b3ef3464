#!/usr/bin/env bash
# `terraform validate` of infra/terraform (the example and the module) against the AWS
# provider: its latest version within the module's range, or — with an argument, 5 or
# 6 — the latest of that major version (CI checks both). Works on a copy in a temporary
# directory, so .terraform/ and the lock file stay out of the repository. `init`
# installs the provider from the registry or a configured mirror; when it cannot (no
# network), exits 3 saying so. Needs `terraform`.
#
# Usage: scripts/terraform-validate.sh [5|6]
set -euo pipefail
cd "$(dirname "$0")/.."
major="${1:-}"
case "$major" in
  "" | 5 | 6) ;;
  *) echo "usage: scripts/terraform-validate.sh [5|6]" >&2; exit 2 ;;
esac
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
cp -r infra/terraform/*.tf infra/terraform/modules "$dir/"
if [ -n "$major" ]; then
  # An override file narrows the example's constraint; the module's own (>= 5.0, < 7.0)
  # still applies, so init picks the latest $major.x.
  cat >"$dir/provider_override.tf" <<TF
terraform {
  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = "~> $major.0"
    }
  }
}
TF
fi
if ! terraform -chdir="$dir" init -backend=false -input=false -no-color >"$dir/init.log" 2>&1; then
  echo "terraform validate skipped: the AWS provider could not be installed (no registry or mirror reachable):"
  grep -m1 -E 'Error|error' "$dir/init.log" || tail -n 3 "$dir/init.log"
  exit 3
fi
grep -m1 -E 'Installed hashicorp/aws|Using previously-installed hashicorp/aws' "$dir/init.log" || true
terraform -chdir="$dir" validate -no-color
