#!/usr/bin/env bash
# run.sh - build scx_zernel on a fresh Debian 12 machine and run it.
#
#   scripts/run.sh [scx_zernel options...]     (as root)
#
# Installs the build dependencies if missing, builds the release binary and
# runs it with configs/zernel.toml (or the options given). On a kernel
# without sched_ext, scx_zernel says so in one line and exits 1.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-deps.sh --build-only
cargo build --release --bin scx_zernel
if [ $# -eq 0 ]; then set -- --config configs/zernel.toml; fi
exec target/release/scx_zernel "$@"
