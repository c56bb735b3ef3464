#!/usr/bin/env bash
# The whole test suite: unit, property and integration tests (against moto's server and
# the Kubernetes API emulator over real HTTP). Installs what it needs; starts and stops
# its own emulators. Extra arguments go to `cargo test`.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
ensure_venv
start_moto
cargo test --workspace --locked "$@"
