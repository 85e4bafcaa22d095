#!/usr/bin/env bash
# run.sh - benchmark scx_zernel side by side with EEVDF and peer sched_ext
# schedulers, all in ONE VM boot, and render the results.
#
#   bench/run.sh [--short] [--reps N] [--no-peers] [--cases LIST] [--baseline REV]
#                [--out DIR] [--smp N] [--timeout S]
#
#   --short        1 rep, short durations: checks that the harness works end
#                  to end (numbers not meaningful); results go to
#                  target/bench/short/ (never into tracked files)
#   --reps N       repetitions of every case under every scheduler (default 3;
#                  --short: 1)
#   --no-peers     only EEVDF and scx_zernel (do not build or run the peers)
#   --cases LIST   only these cases, comma-separated: ml, torch, latency, cost
#                  (default all; see bench/guest.sh). A run of some cases
#                  only writes to target/bench/partial/ unless --out says
#                  otherwise
#   --baseline REV also scx_zernel built at git revision REV, run as
#                  scheduler zernel_base ("scx_zernel @SHORTHASH" in the
#                  tables) with the same configuration: the BPF cost per
#                  scheduling event of the work tree's build over REV's, in
#                  the same boot
#   --out DIR      results here instead (created if missing). With --short or
#                  --cases, DIR must hold no tracked file: a partial run never
#                  overwrites the published results in bench/results/
#   --smp N        the VM's vCPUs (default: the host's CPUs, at most 4). Under
#                  TCG every vCPU is a host thread: with more vCPUs than host
#                  cores, a busy vCPU runs slower the more vCPUs are busy (so
#                  an ML job alone would get more instructions per vCPU-second
#                  than beside hogs, whatever the scheduler does), and a vCPU
#                  that holds a lock can be descheduled while others spin on
#                  it, which BPF run times count
#   --timeout S    VM wall-clock limit, a backstop against a hung guest
#                  (default 2400 s with --short, else 1200 + 1200 s per rep:
#                  PyTorch's start alone took 564 s under TCG beside a host
#                  CPU hog, where 1200 s cut a short run off at its last
#                  scheduler)
#
# Steps:
#   1. `cargo build --release --workspace --bins` (scx_zernel,
#      zernel-workload). With
#      --baseline, scx_zernel at REV too: a detached `git worktree add` of
#      REV in $BENCH_CACHE/base/src-HASH, built with `cargo build --release
#      --bin scx_zernel` (BPF_CLANG=clang-19, CARGO_TARGET_DIR
#      $BENCH_CACHE/base/target), the binary kept as
#      $BENCH_CACHE/base/bin/scx_zernel-HASH (HASH: REV's full commit hash, so
#      a later run with the same commit does not rebuild) and the worktree
#      removed.
#   2. The peers scx_bpfland and scx_lavd 1.1.4 and scx_cosmos 1.1.7 (their
#      published versions),
#      `cargo install --locked`, built once and cached in
#      $BENCH_CACHE/peers (default ~/.cache/scx-zernel-bench/peers: outside
#      the work tree, so that CI's fresh clone of the repository finds them
#      too). A peer that fails to build is reported as "not built: <reason>"
#      in the results; the benchmark goes on without it.
#   3. schbench (no distribution packages it): the one on PATH, else built
#      once from its upstream source at SCHBENCH_REV (cloned from the first
#      that answers of $SCHBENCH_GIT (a clone or mirror of it, for a machine
#      that cannot reach its hosts) and SCHBENCH_URLS; `make`) and cached in
#      $BENCH_CACHE/schbench; if neither works the results say why and the
#      latency case goes on without it. One stress-ng calibration on the
#      host, and bench/observe-cpu.sh (the daemon's own work) with the cost
#      case (see bench/report.py).
#   4. One VM (tests/vm/vmrun.sh --host-root --smp N --mem 4G: the host's
#      root, read-only, so that the guest runs the PyTorch venv that
#      scripts/setup-deps.sh makes, passed as ZERNEL_PYTHON) running
#      bench/guest.sh: every case under EEVDF, scx_zernel (default
#      configuration, with GPU data, flat policy), scx_zernel @REV
#      (--baseline) and the peers in turn, and the sized pipeline under
#      EEVDF at SCHED_FIFO (the RT control: strict priority over the hogs).
#   5. Full runs of the cost case: `cargo bench --bench observe --
#      --cpu-only` on the host (the daemon's loop with 2,000 threads, the
#      daemon-CPU target as stated), into OUT/host-observe.txt.
#   6. bench/report.py turns the guest's result lines into results.json,
#      README.md (tables: median and min-max per metric and scheduler,
#      targets) and plot.png (matplotlib, installed once into
#      $BENCH_CACHE/venv).
# The guest's output is kept in OUT/guest.log, the host's facts (peer status,
# calibration, wall times) in OUT/host-meta.txt and the host's CPU use while
# the VM runs (every 5 s: time, busy and steal ticks of the whole host, ticks of
# the qemu process) in OUT/host-load.txt, so the report can be rendered again
# without a run:
#     python3 bench/report.py --out OUT OUT/host-meta.txt OUT/guest.log
# The kernel console goes to target/bench/console.log. Exit status: 0 if the
# guest's checks all passed and results were rendered, 1 otherwise.
#
# Environment: BENCH_CACHE (see above), BENCH_PEER_BUILD_TIMEOUT (seconds per
# peer build, default 1800), SCHBENCH_GIT (see step 3), and vmrun.sh's own
# (VMRUN_*).
set -uo pipefail

CALLER_PWD=$PWD
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 2
PEERS=(bpfland lavd cosmos)
declare -A PEER_VERSION=([bpfland]=1.1.4 [lavd]=1.1.4 [cosmos]=1.1.7)
SCHBENCH_URLS=(${SCHBENCH_GIT:+"$SCHBENCH_GIT"}
               https://git.kernel.org/pub/scm/linux/kernel/git/mason/schbench.git
               https://github.com/masoncl/schbench.git)
SCHBENCH_REV=24e32b8ef67cbafb0761aed68747d90a291767ae
VENV=${VMRUN_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/scx-zernel/venv}
CACHE=${BENCH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/scx-zernel-bench}
PEER_TIMEOUT=${BENCH_PEER_BUILD_TIMEOUT:-1800}

SHORT=0 REPS="" USE_PEERS=1 TIMEOUT="" CASES="" BASELINE="" OUT="" SMP=$(nproc)
(( SMP > 4 )) && SMP=4
ALL_CASES=ml,torch,latency,cost
usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
die() { echo "bench: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case $1 in
    --short) SHORT=1 ;;
    --reps) REPS=${2:-}; shift ;;
    --no-peers) USE_PEERS=0 ;;
    --cases) CASES=${2:-}; shift ;;
    --baseline) BASELINE=${2:-}; [ -n "$BASELINE" ] || die "--baseline takes a git revision"; shift ;;
    --out) OUT=${2:-}; [ -n "$OUT" ] || die "--out takes a directory"; shift ;;
    --smp) SMP=${2:-}; shift ;;
    --timeout) TIMEOUT=${2:-}; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "bench: unknown option '$1'" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
[ -n "$REPS" ] || REPS=$(( SHORT ? 1 : 3 ))
[[ $REPS =~ ^[1-9][0-9]*$ ]] || die "--reps takes a positive integer"
[ -n "$TIMEOUT" ] || TIMEOUT=$(( SHORT ? 2400 : 1200 + 1200 * REPS ))
[[ $TIMEOUT =~ ^[1-9][0-9]*$ ]] || die "--timeout takes a positive integer"
[[ $SMP =~ ^[1-9][0-9]*$ ]] || die "--smp takes a positive integer"
PARTIAL=0
if [ -n "$CASES" ]; then
  [[ $CASES =~ ^(ml|torch|latency|cost)(,(ml|torch|latency|cost))*$ ]] || die "--cases takes a comma-separated list of ml, torch, latency, cost"
  for c in ${ALL_CASES//,/ }; do [[ ,$CASES, == *,$c,* ]] || PARTIAL=1; done
else
  CASES=$ALL_CASES
fi

# Where the results go: bench/results/ (tracked, published) only for a full run.
if [ -n "$OUT" ]; then
  [[ $OUT == /* ]] || OUT=$CALLER_PWD/$OUT
  mkdir -p "$OUT" || die "cannot create $OUT"
  OUT=$(cd "$OUT" && pwd) || die "cannot enter $OUT"
  if (( SHORT || PARTIAL )) && [ -n "$(git ls-files -- "$OUT" 2>/dev/null | head -n1)" ]; then
    die "--out $OUT holds tracked files: a --short or --cases run does not write there"
  fi
elif (( SHORT )); then
  OUT=$ROOT/target/bench/short   # a test run leaves the checkout clean
elif (( PARTIAL )); then
  OUT=$ROOT/target/bench/partial
else
  OUT=$ROOT/bench/results
fi
LOGDIR=$ROOT/target/bench
mkdir -p "$OUT" "$LOGDIR" "$CACHE" || die "cannot create $OUT, $LOGDIR or $CACHE"
T_START=$SECONDS
log() { echo "bench: [$((SECONDS - T_START)) s] $*"; }

# rustup puts cargo in ~/.cargo/bin, which a non-login shell (CI) may lack.
if ! command -v cargo >/dev/null && [ -x "${CARGO_HOME:-$HOME/.cargo}/bin/cargo" ]; then
  PATH=${CARGO_HOME:-$HOME/.cargo}/bin:$PATH
fi

# ---- 1. scx_zernel --------------------------------------------------------------------
log "cargo build --release --workspace --bins"
cargo build --release --workspace --bins || die "cargo build failed"

# build_base REV : make $CACHE/base/bin/scx_zernel-HASH exist for REV's commit
# HASH and print its path; dies if it cannot.
build_base() {
  local hash root=$CACHE/base src bin blog rc
  hash=$(git rev-parse --verify -q "$1^{commit}") || die "--baseline: '$1' is not a commit here"
  src=$root/src-$hash bin=$root/bin/scx_zernel-$hash blog=$root/build-$hash.log
  if [ -x "$bin" ]; then
    log "scx_zernel @${hash:0:7}: cached $bin" >&2
    echo "$bin"; return 0
  fi
  mkdir -p "$root/bin" || die "cannot create $root/bin"
  # A worktree left by an interrupted build: start again.
  if [ -e "$src" ]; then git worktree remove --force "$src" 2>/dev/null || rm -rf "$src"; fi
  git worktree prune
  log "building scx_zernel @${hash:0:7} (once; cached in $root; log $blog)" >&2
  git worktree add -q --detach "$src" "$hash" >"$blog" 2>&1 || { cat "$blog" >&2; die "git worktree add of $1 failed"; }
  (cd "$src" && BPF_CLANG=clang-19 LIBBPF_SYS_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu \
     CARGO_TARGET_DIR=$root/target cargo build --release --bin scx_zernel) >>"$blog" 2>&1
  rc=$?
  if [ "$rc" -eq 0 ] && cp "$root/target/release/scx_zernel" "$bin.tmp" && mv "$bin.tmp" "$bin"; then
    git worktree remove --force "$src"
    echo "$bin"; return 0
  fi
  grep -m1 -E '^error' "$blog" | cut -c1-200 >&2
  die "the build of scx_zernel @${hash:0:7} failed (log $blog; worktree kept in $src)"
}
BASE_BIN=""
if [ -n "$BASELINE" ]; then
  BASE_BIN=$(build_base "$BASELINE") || exit 2
fi
T_BUILD=$((SECONDS - T_START))

# ---- 2. the peers ------------------------------------------------------------------------
# Meta lines for report.py, in the guest's format.
META=$OUT/host-meta.txt
: >"$META"
SCHEDS="eevdf zernel zernel_gpu zernel_flat"
# The RT control (the pipeline at SCHED_FIFO under EEVDF) runs the ml case only.
case ",$CASES," in *,ml,*) SCHEDS="eevdf rt zernel zernel_gpu zernel_flat" ;; esac
ADDS=("$ROOT/target/release/scx_zernel=/usr/local/bin/scx_zernel"
      "$ROOT/target/release/zernel-workload=/usr/local/bin/zernel-workload"
      "$ROOT/tests/vm" "$ROOT/bench/guest.sh" "$ROOT/bench/observe-cpu.sh")
if [ -n "$BASE_BIN" ]; then
  SCHEDS="$SCHEDS zernel_base"
  ADDS+=("$BASE_BIN=/usr/local/bin/scx_zernel_base")
  h=${BASE_BIN##*-}
  echo "BENCHMETA base_rev=\"${BASELINE//\"/\'}\" base_commit=${h:0:7}" >>"$META"
fi

# build_peer NAME : make $CACHE/peers/bin/scx_NAME at PEER_VERSION exist;
# prints the reason and returns 1 if it cannot.
build_peer() {
  local name=scx_$1 root=$CACHE/peers plog rc version=${PEER_VERSION[$1]}
  plog=$root/$name.log
  mkdir -p "$root"
  # cargo install records what it installed in .crates.toml.
  if [ -x "$root/bin/$name" ] && grep -q "^\"$name $version " "$root/.crates.toml" 2>/dev/null; then
    return 0
  fi
  log "building $name@$version (once; cached in $root; log $plog)" >&2
  # One target dir for both peers: they share most dependencies (scx_utils, libbpf-sys).
  BPF_CLANG=clang-19 LIBBPF_SYS_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu \
    CARGO_TARGET_DIR=$root/target \
    timeout "$PEER_TIMEOUT" cargo install --locked --root "$root" "$name@$version" >"$plog" 2>&1
  rc=$?
  [ "$rc" -eq 0 ] && [ -x "$root/bin/$name" ] && return 0
  if [ "$rc" -eq 124 ]; then echo "build timed out after $PEER_TIMEOUT s"
  else
    # The first error cargo reports, on one line.
    grep -m1 -E '^error' "$plog" | cut -c1-200 | grep . || echo "cargo install exited $rc"
  fi
  return 1
}

if (( USE_PEERS )); then
  command -v clang-19 >/dev/null || log "clang-19 not found: the peers will not build (scripts/setup-deps.sh)"
  for p in "${PEERS[@]}"; do
    t0=$SECONDS
    if reason=$(build_peer "$p"); then
      SCHEDS="$SCHEDS $p"
      ADDS+=("$CACHE/peers/bin/scx_$p=/usr/local/bin/scx_$p")
      echo "BENCHMETA peer.$p=\"scx_$p ${PEER_VERSION[$p]}\"" >>"$META"
    else
      log "scx_$p not built: $reason"
      echo "BENCHMETA peer.$p=\"not built: ${reason//\"/\'}\"" >>"$META"
    fi
    (( SECONDS - t0 > 5 )) && echo "BENCHMETA peer_build_s.$p=$((SECONDS - t0))" >>"$META"
  done
else
  for p in "${PEERS[@]}"; do echo "BENCHMETA peer.$p=\"not run (--no-peers)\"" >>"$META"; done
fi

# ---- 3. guest tools and the host calibration ---------------------------------------------
# build_schbench : make $CACHE/schbench/bin/schbench at SCHBENCH_REV exist;
# prints the reason and returns 1 if it cannot.
build_schbench() {
  local root=$CACHE/schbench u slog
  slog=$root/build.log
  [ -x "$root/bin/schbench" ] && [ "$(cat "$root/bin/REV" 2>/dev/null)" = "$SCHBENCH_REV" ] && return 0
  mkdir -p "$root/bin" && rm -rf "$root/src" && : >"$slog"
  log "building schbench @${SCHBENCH_REV:0:7} (once; cached in $root; log $slog)" >&2
  for u in "${SCHBENCH_URLS[@]}"; do
    timeout 300 git clone -q "$u" "$root/src" >>"$slog" 2>&1 && break
    rm -rf "$root/src"
  done
  if [ ! -d "$root/src" ]; then
    echo "its source could not be cloned from ${SCHBENCH_URLS[*]} (SCHBENCH_GIT=a local clone builds it): $(grep -m1 -E 'fatal|error' "$slog" | cut -c1-160)"
    return 1
  fi
  if ! git -C "$root/src" checkout -q "$SCHBENCH_REV" >>"$slog" 2>&1; then
    echo "commit ${SCHBENCH_REV:0:7} not in its source"; return 1
  fi
  if ! make -C "$root/src" schbench >>"$slog" 2>&1; then
    echo "make failed: $(grep -m1 -iE 'error|not found' "$slog" | cut -c1-160)"; return 1
  fi
  cp "$root/src/schbench" "$root/bin/schbench" && echo "$SCHBENCH_REV" >"$root/bin/REV"
}
case ",$CASES," in
  *,latency,*)
    if p=$(command -v schbench); then
      ADDS+=("$p")
      echo "BENCHMETA schbench=\"$p (on the host's PATH)\"" >>"$META"
    elif reason=$(build_schbench); then
      ADDS+=("$CACHE/schbench/bin/schbench=/usr/local/bin/schbench")
      echo "BENCHMETA schbench=\"schbench @${SCHBENCH_REV:0:7} (upstream source, built on the host)\"" >>"$META"
    else
      log "schbench not built: $reason"
      echo "BENCHMETA schbench=\"not available: ${reason//\"/\'}\"" >>"$META"
    fi ;;
esac
for t in stress-ng cyclictest; do
  p=$(command -v $t) || die "$t not found (scripts/setup-deps.sh installs it)"
  ADDS+=("$p")
done
# The messaging benchmark: perf's if perf is a real binary that runs here
# (Debian's may be a wrapper script around a kernel-version-specific one),
# else rt-tests' hackbench; the guest picks whichever runs.
if p=$(command -v perf) && [ "$(head -c4 "$p" | od -An -c | tr -d ' ')" = '177ELF' ] \
   && perf bench sched messaging -g 1 -l 1 >/dev/null 2>&1; then
  ADDS+=("$p")
fi
if p=$(command -v hackbench); then ADDS+=("$p"); fi
calib=$(stress-ng --cpu 1 --cpu-method int64 --timeout 5s --metrics-brief 2>&1 |
        awk '$4 == "cpu" && $5 ~ /^[0-9]+$/ { print $10 }')
echo "BENCHMETA calib_host_ops_per_cpu_s=${calib:-}" >>"$META"
# The daemon's own work (the cost case's): bench/observe-cpu.sh;
# bench/guest.sh runs the same in the VM.
case ",$CASES," in
  *,cost,*)
    obs_flag=()
    (( SHORT )) && obs_flag=(--short)
    PATH="$ROOT/target/release:$PATH" bash bench/observe-cpu.sh "${obs_flag[@]}" host >>"$META" ;;
esac
echo "BENCHMETA host_cpus=$(nproc) host_kernel=$(uname -r) commit=$(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet HEAD -- src 2>/dev/null || echo +dirty)" >>"$META"

# ---- 4. the VM -----------------------------------------------------------------------------
GARGS=(--reps "$REPS" --scheds "$SCHEDS" --cases "$CASES")
(( SHORT )) && GARGS+=(--short)
log "booting the VM: schedulers '$SCHEDS', cases $CASES, $REPS rep(s)$( (( SHORT )) && echo ', short')"
# What else the host ran meanwhile: TCG's vCPUs share the host's cores with
# every other process, and what those take shows up as time inside the guest
# (BPF run times included). One line every 5 s: epoch, busy ticks of all CPUs
# (user nice system irq softirq), steal ticks, ticks of this run's qemu (a
# qemu-system process descending from this script: another VM on the host is
# other load).
# The guest stamps its measurement windows with its clock (qemu's RTC starts at
# the host's time), and report.py puts the two together.
sample_host() {
  while :; do
    printf '%s %s %s\n' "$(date +%s)" \
      "$(awk '$1 == "cpu" { print $2 + $3 + $4 + $7 + $8, $9 }' /proc/stat)" \
      "$(cat /proc/[0-9]*/stat 2>/dev/null | awk -v root=$$ '
          { s = $0; sub(/^.*\) /, "", s); split(s, f, " "); ppid[$1] = f[2]; t[$1] = f[12] + f[13]
            if ($2 ~ /^\(qemu-system/) q[$1] = 1 }
          END { for (p in q) { x = p; while (x > 1 && x != root) x = ppid[x]; if (x == root) T += t[p] }
                print T + 0 }')"
    sleep 5
  done
}
echo "# epoch busy_ticks steal_ticks qemu_ticks (CLK_TCK $(getconf CLK_TCK), $(nproc) CPUs)" >"$OUT/host-load.txt"
sample_host >>"$OUT/host-load.txt" 2>/dev/null &
SAMPLER=$!
t0=$SECONDS
tests/vm/vmrun.sh --host-root --smp "$SMP" --mem 4G --timeout "$TIMEOUT" --console "$LOGDIR/console.log" \
  -e "ZERNEL_PYTHON=$VENV/bin/python" --add "${ADDS[@]}" -- sh bench/guest.sh "${GARGS[@]}" 2>&1 | tee "$OUT/guest.log"
VM_RC=${PIPESTATUS[0]}
T_VM=$((SECONDS - t0))
kill "$SAMPLER" 2>/dev/null; wait "$SAMPLER" 2>/dev/null
log "VM finished: exit $VM_RC after $T_VM s"

# ---- 5. the daemon's loop on the host ---------------------------------------------------------
# The daemon-CPU target as the issue states it: `cargo bench --bench observe
# -- --cpu-only` (bench/observe.rs: the daemon's loop but the BPF map writes,
# 2,000 threads, steady state; about 10 minutes), full runs of the cost case
# only, into OUT/host-observe.txt for report.py.
case ",$CASES," in
  *,cost,*)
    if (( ! SHORT )); then
      log "the daemon's loop on the host: cargo bench --bench observe -- --cpu-only (about 10 minutes)"
      cargo bench --bench observe -- --cpu-only >"$OUT/host-observe.txt" 2>"$LOGDIR/host-observe.log" ||
        log "cargo bench failed (see $LOGDIR/host-observe.log): no host figures"
    fi ;;
esac

# ---- 6. the report ---------------------------------------------------------------------------
# matplotlib in a venv of our own, made once; without it the report has no plot.
PY=python3
VENV=$CACHE/venv
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import matplotlib' 2>/dev/null; then
  PY=$VENV/bin/python
else
  log "installing matplotlib into $VENV (once)"
  if python3 -m venv "$VENV" >"$LOGDIR/venv.log" 2>&1 \
     && "$VENV/bin/pip" install -q matplotlib >>"$LOGDIR/venv.log" 2>&1; then
    PY=$VENV/bin/python
  else
    log "matplotlib unavailable (see $LOGDIR/venv.log): no plot"
  fi
fi
{
  echo "BENCHMETA wall_build_s=$T_BUILD wall_vm_s=$T_VM wall_total_s=$((SECONDS - T_START)) vm_exit=$VM_RC"
  # vmrun.sh's own choice: KVM only with a usable /dev/kvm and vmx/svm.
  accel=tcg
  [ -r /dev/kvm ] && [ -w /dev/kvm ] && grep -qwE 'vmx|svm' /proc/cpuinfo && accel=kvm
  echo "BENCHMETA accel=${VMRUN_ACCEL:-$accel}"
} >>"$META"
"$PY" bench/report.py --out "$OUT" "$META" "$OUT/guest.log"
REPORT_RC=$?
log "results in ${OUT#"$ROOT"/}/ (README.md, results.json, plot.png); total $((SECONDS - T_START)) s"
[ "$VM_RC" -eq 0 ] && [ "$REPORT_RC" -eq 0 ]
