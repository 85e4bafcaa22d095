#!/usr/bin/env bash
# The house style, as the scx CI checks it: rustfmt (rustfmt.toml) and clippy
# with every warning an error, over the whole package (library, binaries,
# tests, benches); and the stage order (tests/stages.sh: no module imports a
# later stage). Exits non-zero on any finding.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
rc=0
if cargo fmt --check >/dev/null 2>&1; then echo "lint: cargo fmt --check: clean"
else
  echo "lint: cargo fmt --check: these files are not formatted (run cargo fmt):"
  cargo fmt --check 2>&1 | sed -n 's/^Diff in \([^:]*\).*/  \1/p' | sort -u
  rc=1
fi
if cargo clippy --release --all-targets -q -- -D warnings; then echo "lint: cargo clippy -D warnings: clean"
else echo "lint: cargo clippy -D warnings: findings above"; rc=1; fi
bash tests/stages.sh || rc=1
exit $rc
