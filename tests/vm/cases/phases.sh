#!/bin/sh
# vm: --smp 4 --mem 2G --timeout 300
#
# Live phase detection driving the kernel. A training-like job
# (zernel-workload train: DataLoader worker processes, a trainer that waits
# on a fake GPU, optimizer bursts, an NCCL progress thread) runs under
# scx_zernel with the file GPU provider. Each of the four ML phases must be
# detected on the right thread, and the class the kernel holds for that
# thread (read back from the task_class map) must be the policy's class for
# the phase. A non-default policy row (DataLoading: preempt, 6000 us target)
# reaches the kernel as its slice (half the target) and preempt flag. A
# plain shell loop must stay Unknown and get no entry.
# shellcheck disable=SC2317 source=tests/vm/guest-lib.sh
. "$(dirname "$0")/../guest-lib.sh"

W=/tmp/train
mkdir -p "$W"
# The DataLoading policy is not the default one (ml, no preempt, 8000 us):
# the kernel must hold what the table says.
cat >/tmp/phases.toml <<TOML
[gpu]
provider = "file"
file = "$W/gpu.json"

[policy.data_loading]
class = "ml"
preempt = true
latency_target_us = 6000
TOML

zernel_start /tmp/phases.toml --log-level debug || finish

( while :; do :; done ) &
loop=$!
zernel-workload train --gpu-file "$W/gpu.json" --secs 40 --workers 2 --data-dir "$W/data" >"$W/train.out" 2>&1 &
train=$!
wait_until 10 sh -c "[ \$(ls /proc/$train/task 2>/dev/null | wc -l) -ge 4 ]"

# The kernel's class of every thread, sampled for ~20 s: "<comm> <class>
# <slice_us> <preempt>" lines.
: >"$W/classes"
zsample 20 "$W/classes" "$train"
sort "$W/classes" | uniq -c

# The detector's transitions, from the daemon's debug log.
grep 'phase tid=' "$ZLOG" | sed 's/.*phase tid=/tid=/' | sort -k3 | uniq -c -f2 | head -40
saw() { grep -q "phase tid=.*comm=\"$1\".* -> $2\$" "$ZLOG"; }
check "GpuCompute detected on the trainer (pt_main_thread)" saw pt_main_thread gpu_compute
check "OptimizerStep detected on the trainer (pt_main_thread)" saw pt_main_thread optimizer_step
check "NcclCollective detected on NCCL Progress 0" saw "NCCL Progress 0" nccl_collective
check "DataLoading detected on a DataLoader worker (pt_data_worker)" saw pt_data_worker data_loading
held() { grep -q "^$1 $2 " "$W/classes"; }
check "kernel holds class latency for the trainer (GpuCompute policy)" held pt_main_thread latency
check "kernel holds class ml for the trainer (OptimizerStep policy)" held pt_main_thread ml
check "kernel holds class latency for NCCL Progress 0 (NcclCollective policy)" held NCCL_Progress_0 latency
check "kernel holds class ml for a DataLoader worker (DataLoading policy)" held pt_data_worker ml
check "kernel holds the configured DataLoading policy: slice 3000 us (target 6000), preempt" \
  grep -q "^pt_data_worker ml 3000 1\$" "$W/classes"
no_loop_phase() { ! grep -q "phase tid=$loop " "$ZLOG"; }
check "the shell loop never left Unknown" no_loop_phase
assert_eq "the shell loop has no map entry" "$(ztask "$loop" class)" ""
assert_gt "ml class enqueues counted" "$(zcounter ml enqueued)" 0

kill "$loop" 2>/dev/null; wait "$loop" 2>/dev/null
kill "$train" 2>/dev/null; wait "$train" 2>/dev/null
zernel_stop TERM
assert_eq "SIGTERM: exit 0" "$ZRC" 0
check "dmesg is clean" dmesg_clean
finish
