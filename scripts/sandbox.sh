#!/usr/bin/env bash
# The main job end to end on a local sandbox: no Docker, no AWS account.
#
# Starts moto (AWS APIs) and the Kubernetes API emulator (HTTPS, verifying EKS tokens,
# seeded with scripts/sandbox/pods.json), creates a VPC, an internal NLB, a bound IP
# target group holding one foreign target and the DynamoDB state table, runs both
# built function binaries under `cargo lambda watch` (the Lambda Runtime API), then
# drives them through eight steps (scripts/sandbox/sandbox.py): the schedule and pod
# events with `cargo lambda invoke`, the operator's runs with the `tgsync` CLI (which
# invokes the manual function through the Lambda Invoke API that `cargo lambda watch`
# serves): `tgsync plan` (dry run), scheduled resync and `tgsync status`, pod
# termination, pod turning Ready, steady state (`tgsync plan` finds nothing to do), watch
# mode (the resync runs with TGSYNC_WATCH_SECONDS=6: a pod turning Ready while it watches
# is registered within about a second, the delay printed), and the way out (the group
# untagged is reported orphaned by `tgsync sync`; `tgsync release` shows the plan and
# refuses without a terminal, `--yes` releases).
# Each step prints the target group before and after and checks the outcome; the script
# exits non-zero on the first step that is not what it should be, so it is also a smoke
# test. Everything it starts is stopped and its temp dir removed on exit, Ctrl-C included.
#
# Usage: scripts/sandbox.sh [--verbose] [--keep-logs]
#   --verbose     also print every full JSON report
#   --keep-logs   keep the temp dir with all logs (moto, emulator, watch, functions)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"

VERBOSE=0
KEEP_LOGS=0
for arg in "$@"; do
  case "$arg" in
    -v | --verbose) VERBOSE=1 ;;
    --keep-logs) KEEP_LOGS=1 ;;
    -h | --help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "sandbox.sh: unknown argument $arg (try --help)" >&2; exit 2 ;;
  esac
done

STARTED=$SECONDS
WORK="$(mktemp -d -t tgsync-sandbox.XXXXXX)"
PIDS=() # everything started here but moto (start_moto adds it to CLEANUP_PIDS), in order

# stop_pid PID: SIGTERM, then SIGKILL if it is still there after 5 s.
stop_pid() {
  local pid=$1
  kill "$pid" 2>/dev/null || return 0
  for _ in $(seq 1 50); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -9 "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

# Replaces lib.sh's cleanup (start_moto traps EXIT to it): stops what this script started,
# newest first, then moto, and removes the temp dir.
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  local i pid
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do stop_pid "${PIDS[i]}"; done
  for pid in ${CLEANUP_PIDS:-}; do stop_pid "$pid"; done
  if [ "$KEEP_LOGS" = 1 ]; then
    echo "sandbox: logs kept in $WORK" >&2
  else
    rm -rf "$WORK"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# fail MESSAGE [LOG]: the message and the tail of the log, then exit 1.
fail() {
  echo "sandbox: $1" >&2
  if [ -n "${2:-}" ] && [ -s "$2" ]; then
    echo "--- last lines of $2 ---" >&2
    tail -n 40 "$2" | sed 's/\x1b\[[0-9;]*m//g' >&2
  fi
  exit 1
}

# wait_port PORT PID LOG: until something listens on 127.0.0.1:PORT (30 s), while PID lives.
wait_port() {
  for _ in $(seq 1 300); do
    kill -0 "$2" 2>/dev/null || fail "process $2 exited before listening on port $1" "$3"
    if python3 -c 'import socket,sys; socket.create_connection(("127.0.0.1", int(sys.argv[1])), 1).close()' "$1" 2>/dev/null; then
      return 0
    fi
    sleep 0.1
  done
  fail "nothing listens on port $1 after 30 s" "$3"
}

# --- 1. tools and binaries ---------------------------------------------------------------
ensure_venv
unset AWS_PROFILE AWS_DEFAULT_PROFILE # the sandbox never touches a real account
export AWS_CONFIG_FILE=/dev/null AWS_SHARED_CREDENTIALS_FILE=/dev/null

log "building tgsync-resync, tgsync-pod-events, tgsync-manual, the tgsync CLI and kube-emulator (debug profile; the first build takes a few minutes)"
build_started=$SECONDS
cargo build --locked -p tgsync-resync -p tgsync-pod-events -p tgsync-manual -p tgsync-cli -p kube-emulator >"$WORK/build.log" 2>&1 ||
  fail "cargo build failed" "$WORK/build.log"
TARGET_DIR="$(cargo metadata --format-version 1 --no-deps --locked |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')"
BIN="$TARGET_DIR/debug"
log "built in $((SECONDS - build_started)) s: $BIN/{tgsync-resync,tgsync-pod-events,tgsync-manual,tgsync,kube-emulator}"

# --- 2. moto and the Kubernetes API emulator ---------------------------------------------
start_moto "$WORK/moto.log" # traps EXIT to cleanup, which is ours (above)
MOTO="$TGSYNC_TEST_AWS_ENDPOINT"

CA_FILE="$WORK/cluster-ca.pem"
"$BIN/kube-emulator" \
  --cluster-name demo \
  --tls \
  --credentials testing:testing \
  --allowed-sts-host "${MOTO#http://}" \
  --region us-east-1 \
  --ca-out "$CA_FILE" \
  --seed "$ROOT/scripts/sandbox/pods.json" \
  >"$WORK/emulator.url" 2>"$WORK/emulator.log" &
EMULATOR_PID=$!
PIDS+=("$EMULATOR_PID")
for _ in $(seq 1 300); do
  [ -s "$WORK/emulator.url" ] && break
  kill -0 "$EMULATOR_PID" 2>/dev/null || fail "kube-emulator exited" "$WORK/emulator.log"
  sleep 0.1
done
KUBE_URL="$(head -n 1 "$WORK/emulator.url")"
[ -n "$KUBE_URL" ] || fail "kube-emulator printed no URL in 30 s" "$WORK/emulator.log"
log "kube-emulator on $KUBE_URL (cluster demo, EKS tokens signed by testing:testing via STS at ${MOTO#http://})"

# --- 3. AWS resources --------------------------------------------------------------------
export SANDBOX_MOTO="$MOTO" SANDBOX_KUBE_URL="$KUBE_URL" SANDBOX_CA_FILE="$CA_FILE"
export SANDBOX_TABLE="tgsync-state" SANDBOX_WORK="$WORK" SANDBOX_VERBOSE="$VERBOSE"
export SANDBOX_CARGO_LAMBDA="$VENV/bin/cargo-lambda"
export SANDBOX_EMULATOR_LOG="$WORK/emulator.log"
log "creating the AWS side in moto"
"$VENV/bin/python" "$ROOT/scripts/sandbox/sandbox.py" setup ||
  fail "creating the AWS resources in moto failed" "$WORK/moto.log"

# --- 4. the functions, the way Lambda runs them -------------------------------------------
# start_function NAME DIR: `cargo lambda watch --only-lambda-apis` on a free port, and the
# built binary polling its Runtime API. Sets PORT_<NAME>.
start_function() {
  local name=$1 dir=$2 port watch_pid fn_pid
  port="$(free_port)"
  (cd "$dir" && exec "$VENV/bin/cargo-lambda" lambda watch --only-lambda-apis \
    --invoke-address 127.0.0.1 --invoke-port "$port") >"$WORK/watch-$name.log" 2>&1 &
  watch_pid=$!
  PIDS+=("$watch_pid")
  wait_port "$port" "$watch_pid" "$WORK/watch-$name.log"
  env -i \
    PATH="$PATH" \
    AWS_LAMBDA_RUNTIME_API="http://127.0.0.1:$port/.rt" \
    AWS_LAMBDA_FUNCTION_NAME=_ \
    AWS_LAMBDA_FUNCTION_VERSION=1 \
    AWS_LAMBDA_FUNCTION_MEMORY_SIZE=256 \
    AWS_REGION=us-east-1 \
    AWS_ENDPOINT_URL="$MOTO" \
    AWS_ACCESS_KEY_ID=testing \
    AWS_SECRET_ACCESS_KEY=testing \
    AWS_SESSION_TOKEN=testing \
    AWS_EC2_METADATA_DISABLED=true \
    TGSYNC_CLUSTER_NAME=demo \
    TGSYNC_TABLE_NAME="$SANDBOX_TABLE" \
    TGSYNC_CLUSTER_ENDPOINT="$KUBE_URL" \
    TGSYNC_CLUSTER_CA_FILE="$CA_FILE" \
    TGSYNC_READY_WAIT_SECONDS=2 \
    TGSYNC_WATCH_SECONDS="${WATCH_SECONDS:-0}" \
    RUST_LOG=info \
    NO_COLOR=1 \
    "$BIN/tgsync-$name" >"$WORK/$name.log" 2>&1 &
  fn_pid=$!
  PIDS+=("$fn_pid")
  sleep 0.2
  kill -0 "$fn_pid" 2>/dev/null || fail "tgsync-$name exited at start" "$WORK/$name.log"
  printf -v "PORT_${name//-/_}" '%s' "$port"
  log "tgsync-$name: $BIN/tgsync-$name (pid $fn_pid) on cargo lambda watch 127.0.0.1:$port"
}
WATCH_SECONDS=6 start_function resync "$ROOT/functions/resync"
start_function pod-events "$ROOT/functions/pod-events"
start_function manual "$ROOT/functions/manual"
export SANDBOX_RESYNC_PORT="$PORT_resync" SANDBOX_POD_EVENTS_PORT="$PORT_pod_events"
export SANDBOX_MANUAL_PORT="$PORT_manual" SANDBOX_TGSYNC="$BIN/tgsync"
export SANDBOX_RESYNC_LOG="$WORK/resync.log" SANDBOX_POD_EVENTS_LOG="$WORK/pod-events.log"
export SANDBOX_MANUAL_LOG="$WORK/manual.log"

# --- 5. the steps ------------------------------------------------------------------------
"$VENV/bin/python" "$ROOT/scripts/sandbox/sandbox.py" steps
echo
log "sandbox: all 8 steps as expected in $((SECONDS - STARTED)) s; stopping everything"
