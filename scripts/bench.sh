#!/usr/bin/env bash
# Benchmarks (not tests). Results are recorded in BENCHMARKS.md.
#   scripts/bench.sh core        # reconcile core, 100k pods x 1,000 groups, one core
#   scripts/bench.sh decode      # LIST decoding, 100k realistic pods: k8s-openapi vs the lean decoder, one core
#   scripts/bench.sh api-calls   # API calls of a zero-drift resync of 100 groups (moto + emulator)
#   scripts/bench.sh pod-events  # warm pod-events latency under cargo lambda watch (moto + emulator)
#   scripts/bench.sh pod-events-sizes  # the same at groups of 10/100/1,000 targets, full core and 256 MB's CPU share (root; not in all)
#                                #   TGSYNC_POD_EVENTS_BEFORE=<binary>: also runs that build, for a before/after in one sitting
#   scripts/bench.sh floor       # CPU of a zero-drift full verification, 1,000 groups / 100k pods: physical floor, SDK floor, tgsync (canned HTTPS server; ~5 min; not in all)
#   scripts/bench.sh scale       # full resync of 1,000 groups / 100,000 pods, moto + emulator process (~30 min; not in all)
#   scripts/bench.sh watch       # watch mode of the release resync binary: reaction, gated rolling update (~13 min; not in all)
#                                #   TGSYNC_CPU_SHARE_MB=256: the binary inside that memory size's CPU share (root)
#   scripts/bench.sh throttling  # 20 trials at 40 % throttling + 10 % 500s on ELBv2 and DynamoDB (not in all)
#   scripts/bench.sh cpu-share   # the resync binary at Lambda's CPU share for 128/256/512 MB: reaction, CPU, cold start (root; ~10 min; not in all)
#                                #   TGSYNC_CPU_SHARE_GROUPS=1000 TGSYNC_CPU_SHARE_PODS=100: at 100,000 pods (~10–15 min per size and run)
#                                #   TGSYNC_CPU_SHARE_TRACE=1: every change's requests and their answer times
#                                #   TGSYNC_MEMORY_LIMIT=1: memory capped at the size too, as Lambda caps it (the sizing table of BENCHMARKS.md)
#   scripts/bench.sh cold-start  # release binaries: sizes, spawn -> first Runtime API request
#   scripts/bench.sh cold-start-arm64  # the arm64 bootstraps under qemu-user (not in all; see BENCHMARKS.md)
#   scripts/bench.sh all
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
what="${1:-all}"
# Where `cargo lambda build --release --arm64` output is looked for (and built by cold-start-arm64).
arm64="${TGSYNC_ARM64_DIR:-/tmp/tgsync-arm64}"
case "$what" in
  core|all) taskset -c 1 cargo bench --locked --bench core ;;&
  decode|all) taskset -c 1 cargo bench --locked --bench decode ;;&
  api-calls|pod-events|pod-events-sizes|all) ensure_venv; [ -n "${TGSYNC_TEST_AWS_ENDPOINT:-}" ] || start_moto ;;&
  api-calls|all) cargo bench --locked --bench api_calls ;;&
  pod-events|all) cargo bench --locked -p tgsync-pod-events --bench latency ;;&
  pod-events-sizes)
    # The bench executable itself: `cargo bench` would rebuild it if a source changed meanwhile.
    bench="$(cargo bench --locked --no-run -p tgsync-pod-events --bench latency 2>&1 | grep -o '(\S*/latency-[0-9a-f]*)' | tr -d '()')"
    cargo build --release --locked -p tgsync-pod-events
    after="$(mktemp -d)/tgsync-pod-events"; cp "${CARGO_TARGET_DIR:-target}/release/tgsync-pod-events" "$after"
    for share in $(echo "${TGSYNC_CPU_SHARE_SIZES:-full,256}" | tr , ' '); do
      for targets in ${TGSYNC_GROUP_SIZES:-0 90 990}; do
        for bin in ${TGSYNC_POD_EVENTS_BEFORE:-} "$after"; do
          log "pod-events: $bin, group of $targets + 10 targets, CPU share $share"
          TGSYNC_POD_EVENTS_BIN="$bin" TGSYNC_GROUP_TARGETS="$targets" TGSYNC_CPU_SHARE_MB="$share" \
            "$bench" "${TGSYNC_EVENTS:-60}"
        done
      done
    done ;;&
  floor) cargo bench --locked --bench floor ;;&
  scale)
    # A fresh moto of its own (discovery counts every group in the account), with
    # partition-local Query: stock moto sorts the whole table per Query (see the script).
    ensure_venv; MOTO_SERVER="$VENV/bin/python $ROOT/scripts/bench/moto_server.py" start_moto
    cargo build --release --locked -p kube-emulator --bin kube-emulator
    cargo bench --locked --bench scale ;;&
  watch|throttling) ensure_venv; [ -n "${TGSYNC_TEST_AWS_ENDPOINT:-}" ] || start_moto ;;&
  cpu-share)
    # moto with its per-request costs that grow with the stored items cut (see the
    # script): stock moto's queue, not the function, set the reaction at 1,000 groups.
    ensure_venv
    [ -n "${TGSYNC_TEST_AWS_ENDPOINT:-}" ] || MOTO_SERVER="$VENV/bin/python $ROOT/scripts/bench/moto_server.py" start_moto ;;&
  watch) cargo bench --locked -p tgsync-resync --bench watch ;;&
  throttling) cargo bench --locked --bench throttling ;;&
  cpu-share)
    cargo bench --locked -p tgsync-resync --bench cpu_share
    # Cold start (spawn -> first Runtime API request) of both functions under each quota.
    cargo build --release --locked -p tgsync-resync -p tgsync-pod-events
    bins="$(mktemp -d)"
    cp "${CARGO_TARGET_DIR:-target}/release/tgsync-resync" "${CARGO_TARGET_DIR:-target}/release/tgsync-pod-events" "$bins/"
    for mb in $(echo "${TGSYNC_CPU_SHARE_SIZES:-full,512,256,128}" | tr , ' '); do
      [ "$mb" = full ] && continue
      log "cold start at the CPU share of ${mb} MB:"
      TGSYNC_COLD_START_RUNNER="sh $ROOT/scripts/bench/cpu-share.sh $mb" \
        TGSYNC_RESYNC_BIN="$bins/tgsync-resync" TGSYNC_POD_EVENTS_BIN="$bins/tgsync-pod-events" \
        cargo bench --locked -p tgsync-resync --bench cold_start -- 10
    done ;;&
  cold-start|all)
    cargo build --release --locked -p tgsync-resync -p tgsync-pod-events
    bins="$(mktemp -d)"  # copies: a later `cargo bench` may rebuild target/release/*
    cp "${CARGO_TARGET_DIR:-target}/release/tgsync-resync" "${CARGO_TARGET_DIR:-target}/release/tgsync-pod-events" "$bins/"
    log "release binaries (x86_64):"; stat -c '%s bytes  %n' "$bins"/tgsync-*
    if compgen -G "$arm64/lambda/*/bootstrap" >/dev/null; then
      log "arm64 bootstraps (cargo lambda build --release --arm64):"; stat -c '%s bytes  %n' "$arm64"/lambda/*/bootstrap
    fi
    TGSYNC_RESYNC_BIN="$bins/tgsync-resync" TGSYNC_POD_EVENTS_BIN="$bins/tgsync-pod-events" \
      cargo bench --locked -p tgsync-resync --bench cold_start ;;&
  cold-start-arm64)
    # The deployed arm64 bootstraps, started under qemu-user on this x86_64 machine:
    # emulation adds its own start-up and translation, so the figure is pessimistic.
    sysroot=/usr/aarch64-linux-gnu
    if ! command -v qemu-aarch64 >/dev/null || [ ! -e "$sysroot/lib/ld-linux-aarch64.so.1" ]; then
      echo "needs qemu-user and the arm64 C library: apt-get install qemu-user libc6-arm64-cross" >&2; exit 2
    fi
    if ! compgen -G "$arm64/lambda/*/bootstrap" >/dev/null; then
      log "building the arm64 bootstraps into $arm64 (about 30 min on 2 cores)"
      ensure_venv
      CARGO_TARGET_DIR="$arm64" cargo lambda build --release --arm64 --locked -p tgsync-resync -p tgsync-pod-events
    fi
    log "arm64 bootstraps:"; stat -c '%s bytes  %n' "$arm64"/lambda/*/bootstrap
    TGSYNC_COLD_START_RUNNER="qemu-aarch64 -L $sysroot" \
      TGSYNC_RESYNC_BIN="$arm64/lambda/tgsync-resync/bootstrap" \
      TGSYNC_POD_EVENTS_BIN="$arm64/lambda/tgsync-pod-events/bootstrap" \
      cargo bench --locked -p tgsync-resync --bench cold_start ;;
  core|decode|api-calls|pod-events|pod-events-sizes|floor|scale|watch|throttling|cpu-share|cold-start|all) ;;
  *) echo "usage: $0 [core|decode|api-calls|pod-events|pod-events-sizes|floor|scale|watch|throttling|cpu-share|cold-start|cold-start-arm64|all]" >&2; exit 2 ;;
esac
