# Shared helpers for scripts/test.sh, scripts/sandbox.sh and .ci/run. Source, don't run.
# They install what is missing (a venv with pinned tools) and start local emulators;
# nothing here needs Docker or an AWS account.

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${TGSYNC_VENV:-$ROOT/.venv}"

log() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

# ensure_venv: a Python venv with scripts/requirements.txt installed (re-run when it changes).
ensure_venv() {
  local req="$ROOT/scripts/requirements.txt" stamp="$VENV/.requirements.sha"
  local want; want="$(sha256sum "$req" | cut -d' ' -f1)"
  if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    log "installing pinned tools into $VENV (moto, cargo-lambda, cfn-lint, aws-sam-cli)"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check -r "$req"
    echo "$want" > "$stamp"
  fi
  export PATH="$VENV/bin:$PATH"
}

# free_port: an unused TCP port on loopback.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# wait_http URL: wait up to 30 s for URL to answer.
wait_http() {
  for _ in $(seq 1 300); do
    if python3 -c "import urllib.request,sys; urllib.request.urlopen(sys.argv[1], timeout=1)" "$1" 2>/dev/null; then
      return 0
    fi
    sleep 0.1
  done
  echo "timed out waiting for $1" >&2
  return 1
}

# start_moto: moto's server on a free loopback port; exports TGSYNC_TEST_AWS_ENDPOINT and
# registers cleanup. Logs go to $1 (default: a temp file). MOTO_SERVER overrides the
# command (the scale benchmark's scripts/bench/moto_server.py).
start_moto() {
  local port log_file="${1:-$(mktemp -t moto.XXXXXX.log)}"
  port="$(free_port)"
  ${MOTO_SERVER:-"$VENV/bin/moto_server"} -H 127.0.0.1 -p "$port" >"$log_file" 2>&1 &
  MOTO_PID=$!
  CLEANUP_PIDS="${CLEANUP_PIDS:-} $MOTO_PID"
  trap 'cleanup' EXIT
  export TGSYNC_TEST_AWS_ENDPOINT="http://127.0.0.1:$port"
  wait_http "$TGSYNC_TEST_AWS_ENDPOINT/moto-api/" || { cat "$log_file" >&2; return 1; }
  log "moto server on $TGSYNC_TEST_AWS_ENDPOINT (pid $MOTO_PID, log $log_file)"
}

cleanup() {
  for pid in ${CLEANUP_PIDS:-}; do
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
}
