#!/bin/sh
# demo-guest.sh - the guest side of scripts/demo.sh (run as root in the VM).
# shellcheck shell=sh
set -u
PY=$ZERNEL_PYTHON STEPS=$DEMO_STEPS MAXS=$DEMO_MAXS HOGS=$DEMO_HOGS
W=/tmp/demo HOGCG=/sys/fs/cgroup/demo-hogs
mkdir -p "$W" "$HOGCG"
say() { printf '\n== %s\n' "$*"; }
now() { cut -d' ' -f1 /proc/uptime; }
hog_usec() { awk '$1 == "usage_usec" { print $2 }' "$HOGCG/cpu.stat"; }

say "kernel $(uname -r), $(nproc) vCPUs, sched_ext state: $(cat /sys/kernel/sched_ext/state)"
say "starting a real PyTorch training job (train.py: a CNN, DataLoader(num_workers=2)); import torch takes a minute or more under emulation"
"$PY" tests/workloads/pytorch/train.py --workers 2 --ready "$W/ready" --progress "$W/progress" \
  --step-times "$W/times" --data-dir "$W/data" >"$W/train.out" 2>&1 &
train=$!
n=0
until [ -s "$W/ready" ]; do
  kill -0 "$train" 2>/dev/null || { echo "demo: train.py exited:"; tail -5 "$W/train.out"; exit 1; }
  n=$((n + 1)); [ $n -lt 3000 ] || { echo "demo: train.py made no step in 10 minutes"; exit 1; }
  sleep 0.2
done
echo "training (pid $train)"
say "starting $HOGS CPU hogs (stress-ng --cpu $HOGS) in cgroup ${HOGCG#/sys/fs/cgroup/}"
sh -c "echo \$\$ >$HOGCG/cgroup.procs && exec stress-ng --cpu $HOGS --quiet --temp-path /tmp" &
hogs=$!

# measure NAME : the rate of training steps, in steps per second (RATE), on
# the job's own clock (train.py --step-times: the time each step finished),
# from a step boundary to at least STEPS steps later (at most MAXS s), and the
# hogs' CPUs over the same time (CORES). This shell is served late under a
# scheduler that favours the job, so it may see more steps than it waited
# for; the job's own times make the rate exact whatever it counted.
steps() { cat "$W/progress"; }
# time_of N : the job's clock when step N finished.
time_of() { awk -v n="$1" '$1 == n { print $2; exit }' "$W/times"; }
# wait_steps T0 N : until the step counter reaches N, or MAXS s after T0.
wait_steps() {
  while [ "$(steps)" -lt "$2" ] && awk -v a="$1" -v b="$(now)" -v m="$MAXS" 'BEGIN { exit !(b - a < m) }'; do
    sleep 0.5
  done
}
measure() {
  wait_steps "$(now)" $(($(steps) + 1))
  s0=$(steps) u0=$(hog_usec) t0=$(now)
  wait_steps "$t0" $((s0 + STEPS))
  s1=$(steps) u1=$(hog_usec) t1=$(now)
  j0=$(time_of "$s0") j1=$(time_of "$s1")
  secs=$(awk -v a="$j0" -v b="$j1" 'BEGIN { printf "%.1f", b - a }')
  rate=$(awk -v a="$s0" -v b="$s1" -v t="$j0" -v u="$j1" 'BEGIN { if (u > t) printf "%.3f", (b - a) / (u - t); else print "0.000" }')
  cores=$(awk -v a="$u0" -v b="$u1" -v t="$t0" -v u="$t1" 'BEGIN { printf "%.2f", (b - a) / 1e6 / (u - t) }')
  cut=""; [ $((s1 - s0)) -lt "$STEPS" ] && cut=" (cut off at $MAXS s)"
  echo "$1: steps $s0 to $s1 in $secs s on the job's clock = $rate steps/s$cut; hogs used $cores CPUs"
  RATE=$rate CORES=$cores
}

say "$STEPS steps under the kernel's default scheduler (EEVDF)"
measure "EEVDF"
rate_eevdf=$RATE cores_eevdf=$CORES

say "starting scx_zernel (configs/zernel.toml)"
scx_zernel --config configs/zernel.toml >"$W/zernel.log" 2>&1 &
zpid=$!
n=0
until [ "$(cat /sys/kernel/sched_ext/state)" = enabled ]; do
  kill -0 "$zpid" 2>/dev/null || { echo "demo: scx_zernel exited:"; cat "$W/zernel.log"; exit 1; }
  n=$((n + 1)); [ $n -lt 300 ] || { echo "demo: scx_zernel did not attach in 60 s"; exit 1; }
  sleep 0.2
done
echo "attached: $(cat /sys/kernel/sched_ext/root/ops)"
grep "ML process" "$W/zernel.log" || true
say "its live view (scx_zernel --monitor 1), the first 12 lines:"
timeout 120 scx_zernel --monitor 1 2>/dev/null | head -n 12
say "$STEPS steps under scx_zernel"
measure "scx_zernel"
rate_zernel=$RATE cores_zernel=$CORES
grep "ML process" "$W/zernel.log" | sed 's/^/  /'
echo "what the kernel holds for the job's threads now (scx_zernel inspect --entries):"
scx_zernel inspect --entries 2>/dev/null | head -n 12 | sed 's/^/  /'
kill -INT "$zpid"; wait "$zpid"; zrc=$?
kill "$hogs" "$train" 2>/dev/null; wait "$hogs" "$train" 2>/dev/null

say "the same job beside $HOGS CPU hogs on $(nproc) vCPUs, $STEPS steps each"
printf '%-12s %14s %10s %12s\n' scheduler "train steps/s" "vs EEVDF" "hogs' CPUs"
printf '%-12s %14s %10s %12s\n' EEVDF "$rate_eevdf" 1.00 "$cores_eevdf"
printf '%-12s %14s %10s %12s\n' scx_zernel "$rate_zernel" \
  "$(awk -v a="$rate_eevdf" -v b="$rate_zernel" 'BEGIN { if (a > 0) printf "%.2f", b / a; else print "-" }')" "$cores_zernel"
echo "scx_zernel exit status on SIGINT: $zrc"
[ "$zrc" = 0 ]
