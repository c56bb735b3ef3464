#!/usr/bin/env bash
# The whole test suite: unit, property and integration tests (against moto's server and
# the Kubernetes API emulator over real HTTP). Installs what it needs; starts and stops
# its own emulators. Extra arguments go to `cargo test`.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
ensure_venv
start_moto
# Test threads get 8 MiB of stack, as a process's main thread has by default (libtest
# gives 2 MiB): a test's run is polled on the thread that blocks on it, and a debug
# build's poll frames are many times a release build's. (rustc reads the same variable;
# 8 MiB is its own default.)
export RUST_MIN_STACK="${RUST_MIN_STACK:-8388608}"
cargo test --workspace --locked "$@"
