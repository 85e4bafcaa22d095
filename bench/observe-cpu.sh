#!/usr/bin/env bash
# observe-cpu.sh - the daemon's own work, measured the same way on the host
# (bench/run.sh) and in the guest (bench/guest.sh): the emulation factor of
# the scheduler process's CPU figures (the cost case).
#
#   bench/observe-cpu.sh [--short] host|guest
#
# Starts a process with 2,000 mostly idle ML threads (`zernel-workload
# threads --ml`, the cost case's workload) and `scx_zernel observe` beside
# it (the daemon's pipeline with nothing attached: /proc passes, rules,
# phases, policy, at the daemon's 100 ms period), waits 10 s for the threads
# to be found and classified, and prints the CPU time observe used over the
# next 20 s (its schedstat run time) as a percentage of one CPU, and the
# thread count, as the result line bench/report.py reads (SIDE: host|guest):
#   BENCHMETA calib_SIDE_observe_cpu_pct=X calib_SIDE_observe_threads=N
# --short (the harness check): 300 threads, 3 s, 5 s.
# The work is the same on both sides (the same passes over the same
# threads), so guest ÷ host is what emulation costs this kind of work:
# mostly system calls reading /proc, which TCG slows far more than the
# integer loop of the other calibration. Both binaries come from PATH. Exit
# status 1, nothing on stdout, if either does not start.
set -uo pipefail

usage() { echo "usage: bench/observe-cpu.sh [--short] host|guest" >&2; exit 2; }
n=2000 settle=10 window=20
if [ "${1:-}" = --short ]; then n=300 settle=3 window=5; shift; fi
case ${1:-} in host | guest) side=$1 ;; *) usage ;; esac
d=$(mktemp -d) || exit 1
tp="" op=""
cleanup() {
  [ -n "$op" ] && kill "$op" 2>/dev/null
  [ -n "$tp" ] && kill "$tp" 2>/dev/null
  wait 2>/dev/null
  rm -rf "$d"
}
trap cleanup EXIT
run_ns() { local a; read -r a _ <"/proc/$1/schedstat" && echo "$a"; }

zernel-workload threads --count "$n" --secs $((settle + window + 60)) --ml >"$d/threads.out" 2>&1 &
tp=$!
i=300 # 60 s to create the threads
while ! grep -q ready "$d/threads.out" && kill -0 "$tp" 2>/dev/null && [ "$i" -gt 0 ]; do
  sleep 0.2; i=$((i - 1))
done
grep -q ready "$d/threads.out" || { echo "observe-cpu: the threads workload did not start" >&2; exit 1; }
: >"$d/empty.toml"
# Shows its table once, at the start; runs its passes until killed.
scx_zernel observe --config "$d/empty.toml" --interval-ms 3600000 >/dev/null 2>"$d/observe.err" &
op=$!
sleep "$settle"
a=$(run_ns "$op") || { echo "observe-cpu: scx_zernel observe exited: $(head -n1 "$d/observe.err")" >&2; exit 1; }
sleep "$window"
b=$(run_ns "$op") || { echo "observe-cpu: scx_zernel observe exited: $(head -n1 "$d/observe.err")" >&2; exit 1; }
awk -v a="$a" -v b="$b" -v w="$window" -v n="$n" -v s="$side" \
  'BEGIN { printf "BENCHMETA calib_%s_observe_cpu_pct=%.3f calib_%s_observe_threads=%d\n", s, (b - a) / (w * 1e7), s, n }'
