#!/usr/bin/env bash
# The house style, as the scx CI checks it: rustfmt (rustfmt.toml) and clippy
# with every warning an error, over the whole workspace (scx_zernel's
# library, binary, tests and benches, and tools/zernel-workload); the stage
# order (tests/stages.sh: no module imports a later stage); and clang-format
# on the BPF C (skipped, saying so, when no clang-format is installed). Exits
# non-zero on any finding.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
rc=0
if cargo fmt --all --check >/dev/null 2>&1; then echo "lint: cargo fmt --all --check: clean"
else
  echo "lint: cargo fmt --all --check: these files are not formatted (run cargo fmt --all):"
  cargo fmt --all --check 2>&1 | sed -n 's/^Diff in \([^:]*\).*/  \1/p' | sort -u
  rc=1
fi
if cargo clippy --release --workspace --all-targets -q -- -D warnings; then echo "lint: cargo clippy -D warnings: clean"
else echo "lint: cargo clippy -D warnings: findings above"; rc=1; fi
bash tests/stages.sh || rc=1
# The BPF C in the kernel's style (.clang-format). clang-format-19 is what
# scripts/setup-deps.sh installs; any other clang-format may format otherwise.
cf=$(command -v clang-format-19 || command -v clang-format || true)
if [ -z "$cf" ]; then
  echo "lint: clang-format: SKIPPED, no clang-format installed (scripts/setup-deps.sh installs clang-format-19)"
elif "$cf" --dry-run --Werror src/bpf/*.c src/bpf/*.h; then echo "lint: clang-format src/bpf: clean"
else echo "lint: clang-format src/bpf: findings above (run $cf -i src/bpf/*.c src/bpf/*.h)"; rc=1; fi
exit $rc
