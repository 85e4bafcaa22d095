#!/usr/bin/env bash
# run-all.sh - the test command: unit tests on the host, end-to-end cases in VMs.
#
#   tests/run-all.sh [--install] [--unit-only | --vm-only] [-v] [CASE...]
#
#   --install     first run scripts/setup-deps.sh (implied when CI=true)
#   --unit-only   only the unit stage (no VM)
#   --vm-only     only the VM cases
#   CASE...       only these VM cases (names from tests/vm/cases/, with or
#                 without .sh); implies --vm-only
#   -v            stream every case's guest output (and the kernel console)
#
# Stages:
#   unit  `cargo build --release --workspace --bins` (the host tests run
#         zernel-workload, a crate of the workspace), then
#         `cargo test --release --workspace`: unit and host tests. Release, so
#         the VM stage reuses the same build. Then tests/packaging.sh, tests/setup.sh
#         (scripts/setup-deps.sh with stand-ins for apt and no qemu) and
#         tests/shellcheck.sh (shellcheck on every shell script).
#   vm    `cargo build --release --workspace --bins` (scx_zernel and
#         zernel-workload), then every tests/vm/cases/*.sh in a VM
#         of its own (tests/vm/vmrun.sh). A case states its VM in a header line,
#         e.g. `# vm: --smp 4 --numa` or `# vm: --smp 2 --mem 1G --timeout 300`.
#         The guest gets scx_zernel and zernel-workload in /usr/local/bin,
#         stress-ng, cyclictest, tests/vm and configs/; the case runs from the
#         repository root as `sh tests/vm/cases/NAME.sh`.
# Each stage item prints `PASS name (Ns)` or `FAIL name (Ns)`, failures with
# their output; the last line is `N passed, N failed`. Exit status 1 if
# anything failed. Guest output and kernel console of every case are kept in
# target/vm-logs/.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 2
CASEDIR=tests/vm/cases
LOGDIR=$ROOT/target/vm-logs
CASE_TIMEOUT=300   # default per-case limit; a case's header may override it
# The venv with PyTorch and virtme-ng that scripts/setup-deps.sh installs.
VENV=${VMRUN_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/scx-zernel/venv}

INSTALL=0 UNIT=1 VM=1 VERBOSE=0 SELECTED=()
[ "${CI:-}" = true ] && INSTALL=1
usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case $1 in
    --install) INSTALL=1 ;;
    --unit-only) VM=0 ;;
    --vm-only) UNIT=0 ;;
    -v|--verbose) VERBOSE=1 ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "run-all: unknown option '$1'" >&2; usage >&2; exit 2 ;;
    *) SELECTED+=("$1") ;;
  esac
  shift
done
if [ ${#SELECTED[@]} -gt 0 ]; then UNIT=0 VM=1; fi

# The cases to run, checked before anything slow happens.
CASES=()
if (( VM )); then
  if [ ${#SELECTED[@]} -eq 0 ]; then
    CASES=("$CASEDIR"/*.sh)
    [ -e "${CASES[0]}" ] || { echo "run-all: no cases in $CASEDIR" >&2; exit 2; }
  fi
  for c in "${SELECTED[@]}"; do
    c=$(basename "$c" .sh)
    [ -f "$CASEDIR/$c.sh" ] || { echo "run-all: no case '$c' in $CASEDIR" >&2; exit 2; }
    CASES+=("$CASEDIR/$c.sh")
  done
fi

# rustup puts cargo in ~/.cargo/bin, which a non-login shell (CI) may lack.
if ! command -v cargo >/dev/null && [ -x "${CARGO_HOME:-$HOME/.cargo}/bin/cargo" ]; then
  PATH=${CARGO_HOME:-$HOME/.cargo}/bin:$PATH
fi

# A failed setup ends with its last line repeated: the step and the command that failed.
if (( INSTALL )); then
  mkdir -p "$ROOT/target"
  setup_log=$ROOT/target/setup-deps.log
  if [ "$(id -u)" = 0 ]; then scripts/setup-deps.sh 2>&1 | tee "$setup_log"
  else sudo -n scripts/setup-deps.sh 2>&1 | tee "$setup_log"; fi
  rc=${PIPESTATUS[0]}
  if [ "$rc" != 0 ]; then
    echo "run-all: scripts/setup-deps.sh failed (exit $rc): $(tail -n 1 "$setup_log")" >&2
    exit 1
  fi
fi

PASSED=0 FAILED=0 SUMMARY=()
# result PASS|FAIL NAME SECONDS [LOGFILE]
result() {
  local line="$1 $2 ($3s)"
  if [ "$1" = PASS ]; then PASSED=$((PASSED + 1)); else FAILED=$((FAILED + 1)); fi
  SUMMARY+=("$line")
  echo "$line"
  if [ "$1" = FAIL ] && [ -n "${4:-}" ] && (( ! VERBOSE )); then sed 's/^/    | /' "$4"; fi
}

# ---- unit stage ---------------------------------------------------------------------
if (( UNIT )); then
  echo "=== unit: cargo test --release --workspace"
  t0=$SECONDS
  # The host tests against real PyTorch (tests/observe_pytorch.rs) must run here.
  if cargo build --release --workspace --bins \
     && ZERNEL_PYTHON=$VENV/bin/python ZERNEL_REQUIRE_TORCH=1 cargo test --release --workspace; then
    result PASS unit $((SECONDS - t0))
  else result FAIL unit $((SECONDS - t0)); fi
  echo "=== unit: tests/packaging.sh (systemd unit, scx_loader snippet, DaemonSet)"
  t1=$SECONDS
  if cargo build --release --bin scx_zernel -q && bash tests/packaging.sh; then result PASS packaging $((SECONDS - t1))
  else result FAIL packaging $((SECONDS - t1)); fi
  echo "=== unit: tests/setup.sh (scripts/setup-deps.sh on a simulated fresh machine)"
  t1=$SECONDS
  if bash tests/setup.sh; then result PASS setup $((SECONDS - t1))
  else result FAIL setup $((SECONDS - t1)); fi
  echo "=== unit: tests/lint.sh (cargo fmt --check, clippy -D warnings)"
  t1=$SECONDS
  if bash tests/lint.sh; then result PASS lint $((SECONDS - t1))
  else result FAIL lint $((SECONDS - t1)); fi
  echo "=== unit: tests/shellcheck.sh (every shell script)"
  t1=$SECONDS
  if bash tests/shellcheck.sh; then result PASS shellcheck $((SECONDS - t1))
  else result FAIL shellcheck $((SECONDS - t1)); fi
  UNIT_TIME=$((SECONDS - t0))
fi

# ---- VM stage ---------------------------------------------------------------------------
run_case() {
  local f=$1 name opts log rc t0
  name=$(basename "$f" .sh)
  log=$LOGDIR/$name.log
  # The first `# vm:` line holds the case's VM options.
  opts=$(sed -n 's/^# vm:[[:space:]]*//p' "$f" | head -n1)
  local vmopts=()
  read -r -a vmopts <<<"$opts"
  echo "=== vm: $name (${opts:-default VM})"
  t0=$SECONDS
  local cmd=(tests/vm/vmrun.sh --timeout "$CASE_TIMEOUT" "${vmopts[@]}"
             --console "$LOGDIR/$name.console" -e RUST_BACKTRACE=1)
  (( VERBOSE )) && cmd+=(-v)
  # A --host-root guest sees this host's files as they are: it needs only the
  # binaries on its PATH, and the PyTorch venv's Python.
  if [[ " ${vmopts[*]} " == *" --host-root "* ]]; then
    cmd+=(-e "ZERNEL_PYTHON=$VENV/bin/python" --add "${BIN_ADDS[@]}" -- sh "$f")
  else
    cmd+=(--add "${ADDS[@]}" -- sh "$f")
  fi
  if (( VERBOSE )); then "${cmd[@]}" 2>&1 | tee "$log"; rc=${PIPESTATUS[0]}
  else "${cmd[@]}" >"$log" 2>&1; rc=$?; fi
  if [ "$rc" -eq 0 ]; then result PASS "$name" $((SECONDS - t0))
  else
    case $rc in 124) echo "    (timed out)" >>"$log" ;; 125) echo "    (VM failed to boot or died)" >>"$log" ;; esac
    result FAIL "$name" $((SECONDS - t0)) "$log"
  fi
}

if (( VM )) && [ ${#CASES[@]} -gt 0 ]; then
  echo "=== vm: cargo build --release --workspace --bins"
  t_vm=$SECONDS
  mkdir -p "$LOGDIR"
  if ! cargo build --release --workspace --bins; then
    result FAIL build $((SECONDS - t_vm))
  else
    BUILD_TIME=$((SECONDS - t_vm))
    # Everything a case may run, at the paths it expects in the guest.
    BIN_ADDS=("$ROOT/target/release/scx_zernel=/usr/local/bin/scx_zernel"
              "$ROOT/target/release/zernel-workload=/usr/local/bin/zernel-workload")
    ADDS=("${BIN_ADDS[@]}" "$ROOT/tests/vm")
    [ -d "$ROOT/configs" ] && ADDS+=("$ROOT/configs")
    # The stand-in NVML library (no GPU here): the nvml case loads it.
    mkdir -p "$ROOT/target/fake-nvml"
    if cc -shared -fPIC -O2 -Wall -o "$ROOT/target/fake-nvml/libnvidia-ml.so.1" "$ROOT/tests/vm/fake_nvml.c"; then
      ADDS+=("$ROOT/target/fake-nvml/libnvidia-ml.so.1=/opt/zernel-fake-nvml/libnvidia-ml.so.1")
    else echo "run-all: cannot build tests/vm/fake_nvml.c with cc" >&2; fi
    tools_ok=1
    for t in stress-ng cyclictest; do
      if p=$(command -v $t); then ADDS+=("$p")
      else echo "run-all: $t not found (scripts/setup-deps.sh installs it)" >&2; tools_ok=0; fi
    done
    if (( tools_ok )); then
      for f in "${CASES[@]}"; do run_case "$f"; done
    else
      result FAIL vm-tools 0
    fi
  fi
  VM_TIME=$((SECONDS - t_vm))
fi

# ---- benchmark harness, short mode ---------------------------------------------------------
# Checks that bench/run.sh works end to end (one VM boot, EEVDF and
# scx_zernel, one short repetition); its numbers are not meaningful. Only in a
# full run (no case selection): the peers are left out to bound CI time
# (`bench/run.sh` builds and runs them).
if (( VM )) && (( UNIT )) && [ ${#SELECTED[@]} -eq 0 ]; then
  echo "=== bench: bench/run.sh --short --no-peers"
  t0=$SECONDS
  if bench/run.sh --short --no-peers >"$LOGDIR/bench-short.log" 2>&1; then result PASS bench-short $((SECONDS - t0))
  else result FAIL bench-short $((SECONDS - t0)) "$LOGDIR/bench-short.log"; fi
fi

# ---- the demo, short mode ---------------------------------------------------------------------
# scripts/demo.sh end to end (one VM boot, real PyTorch, EEVDF then
# scx_zernel, 3 training steps each): both rows of its table printed, exit 0. Its numbers
# are not judged here.
if (( VM )) && (( UNIT )) && [ ${#SELECTED[@]} -eq 0 ]; then
  echo "=== demo: scripts/demo.sh --short"
  t0=$SECONDS
  if scripts/demo.sh --short >"$LOGDIR/demo-short.log" 2>&1 \
     && grep -Eq '^EEVDF +[0-9.]+ +1\.00 ' "$LOGDIR/demo-short.log" \
     && grep -Eq '^scx_zernel +[0-9.]+ +[0-9.]+ ' "$LOGDIR/demo-short.log"; then
    result PASS demo-short $((SECONDS - t0))
  else result FAIL demo-short $((SECONDS - t0)) "$LOGDIR/demo-short.log"; fi
fi

# ---- summary ------------------------------------------------------------------------------
echo
echo "=== summary"
[ -n "${UNIT_TIME:-}" ] && echo "unit stage: ${UNIT_TIME}s"
[ -n "${VM_TIME:-}" ] && echo "vm stage: ${VM_TIME}s (build ${BUILD_TIME:-?}s); logs in ${LOGDIR#"$ROOT"/}/"
for s in "${SUMMARY[@]}"; do echo "$s"; done
echo "$PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ] && [ "$PASSED" -gt 0 ]
