#!/usr/bin/env bash
# Checks the input validation of the Terraform module infra/terraform/modules/tgsync
# offline: its variables.tf and checks.tf (the checks that involve several variables)
# alone, no provider needed, are planned with good and bad inputs, and each bad input
# must fail on the variable it names. Needs `terraform`.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
cp infra/terraform/modules/tgsync/variables.tf infra/terraform/modules/tgsync/checks.tf "$dir/"
export TF_CLI_CONFIG_FILE=/dev/null TF_IN_AUTOMATION=1
terraform -chdir="$dir" init -input=false -no-color >/dev/null

base=(-var cluster_name=prod -var namespace=shop -var selector=app=web -var name=web
      -var vpc_id=vpc-0123 -var target_port=8080)
failed=0
# check WANT VARIABLE [-var k=v ...]: WANT is ok or the variable that must be refused.
check() {
  local want="$1"; shift
  local out rc=0
  out="$(terraform -chdir="$dir" plan -input=false -no-color -lock=false "${base[@]}" "$@" 2>&1)" || rc=$?
  if [ "$want" = ok ] && [ "$rc" -eq 0 ]; then return; fi
  if [ "$want" != ok ] && [ "$rc" -ne 0 ] && grep -q "var.$want" <<<"$out"; then return; fi
  echo "FAIL: $* (want $want, exit $rc)"; sed -n '/Error/,$p' <<<"$out" | head -8
  failed=$((failed + 1))
}
check ok
check ok -var 'selector=app.kubernetes.io/name=kafka tier=broker' -var port=http -var mode=exclusive
check ok -var selector=canary -var port=9092 -var 'stack={application_id="arn:aws:serverlessrepo:us-east-1:123456789012:applications/tgsync",semantic_version="0.2.0"}'
check ok -var 'stack={template_url="https://bucket.s3.amazonaws.com/tgsync/template.yaml",parameters={AllowedNamespaces="shop"}}'
check cluster_name -var cluster_name=-prod
check cluster_name -var 'cluster_name=prod cluster'
check namespace -var namespace=Shop
check namespace -var namespace=shop-
check selector -var 'selector=app==web'
check selector -var 'selector=app!=web'
check selector -var 'selector=app=web,tier=front'
check selector -var 'selector=app in (web)'
check selector -var 'selector=app=web  tier=front'
check port -var port=70000
check port -var port=0
check port -var port=HTTP
check mode -var mode=owned
check name -var name=-web
check target_port -var target_port=0
check tags -var 'tags={"tgsync/cluster"="other"}'
check stack -var 'stack={application_id="a",template_url="b"}'
check stack -var 'stack={template_url="b",parameters={ClusterName="other"}}'
check deregistration_delay -var deregistration_delay=3601
check deregistration_delay -var deregistration_delay=-1
check deregistration_delay -var deregistration_delay=1.5
check ok -var deregistration_delay=0
check ok -var deregistration_delay=3600
# A rule for the pods needs a source: the load balancer's security group or CIDR blocks.
check pods_security_group_id -var pods_security_group_id=sg-0123
check ok -var pods_security_group_id=sg-0123 -var load_balancer_security_group_id=sg-0456
check ok -var pods_security_group_id=sg-0123 -var 'source_cidr_blocks=["10.0.0.0/16"]'
if [ "$failed" -ne 0 ]; then
  echo "terraform module inputs: $failed check(s) failed"
  exit 1
fi
echo "terraform module inputs: all checks passed"
