#!/usr/bin/env bash
# Benchmarks (not tests). Results are recorded in BENCHMARKS.md.
#   scripts/bench.sh core        # reconcile core, 100k pods x 1,000 groups, one core
#   scripts/bench.sh api-calls   # API calls of a zero-drift resync of 100 groups (moto + emulator)
#   scripts/bench.sh pod-events  # warm pod-events latency under cargo lambda watch (moto + emulator)
#   scripts/bench.sh all
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
what="${1:-all}"
case "$what" in
  core|all) taskset -c 1 cargo bench --locked --bench core ;;&
  api-calls|pod-events|all) ensure_venv; [ -n "${TGSYNC_TEST_AWS_ENDPOINT:-}" ] || start_moto ;;&
  api-calls|all) cargo bench --locked --bench api_calls ;;&
  pod-events|all) cargo bench --locked -p tgsync-pod-events --bench latency ;;&
  core|api-calls|pod-events|all) ;;
  *) echo "usage: $0 [core|api-calls|pod-events|all]" >&2; exit 2 ;;
esac
