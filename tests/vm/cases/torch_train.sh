#!/bin/sh
# vm: --host-root --smp 2 --mem 4G --timeout 1500
#
# Real PyTorch (the venv scripts/setup-deps.sh installs, seen through the
# host's root), single-process training on the CPU with DataLoader(num_workers=2)
# (tests/workloads/pytorch/train.py), beside a plain Python process that never
# imports torch. Under scx_zernel with its default config and no GPU data:
#   - the trainer and both DataLoader worker processes are found ML, the
#     trainer by the CUDA libraries torch maps (evidence gpu_library), the
#     workers by their name (pt_data_worker);
#   - the workers' threads are DataLoading and the kernel's task_class map
#     holds the DataLoading policy (class ml, 4000 us) for them; the
#     trainer's main thread, in no phase without GPU data, holds the class of
#     policy.ml_unknown (ml); ml-class enqueues counted;
#   - the plain Python process has no entry;
#   - the job keeps training under scx_zernel (its step count moves).
# shellcheck disable=SC2317 source=tests/vm/guest-lib.sh
. "$(dirname "$0")/../guest-lib.sh"

need_torch
W=/tmp/torch
mkdir -p "$W"

zernel_start configs/zernel.toml --log-level debug || finish

# The plain Python process: busy, never imports torch.
"$PY" -c 'import time
while True: sum(range(10000)); time.sleep(0.001)' &
plain=$!
"$PY" tests/workloads/pytorch/train.py --workers 2 --ready "$W/ready" --progress "$W/progress" \
  --data-dir "$W/data" >"$W/train.out" 2>&1 &
train=$!
# import torch takes a minute or two under emulation: wait for the first step.
if ! wait_until 1200 test -s "$W/ready"; then
  _notok "train.py finished a first step" "$(tail -5 "$W/train.out")"; finish
fi
_ok "train.py finished a first step ($(cat "$W/progress") steps)"
workers=$(pgrep -P "$train" | tr '\n' ' ')
echo "trainer pid $train, worker pids: $workers"
for p in $train $workers; do
  printf 'pid %s threads:' "$p"; for t in /proc/"$p"/task/*; do printf ' %s(%s)' "${t##*/}" "$(cat "$t/comm")"; done; echo
done

# Judged by what the kernel holds, waiting for each condition (the guest's
# speed depends on the host's load).
steps0=$(cat "$W/progress")
check "kernel holds the DataLoading policy for a worker thread (pt_data_worker: ml, 4000 us, no preempt)" \
  wait_until 300 zholds pt_data_worker ml 4000 0
check "the trainer's main thread holds class ml (policy.ml_unknown: no GPU data, no phase)" \
  wait_until 60 ztask_is "$train" class ml
zentries | sort | uniq -c
for w in $workers; do
  check "DataLoader worker pid $w is an ML loader process" grep -q "ML process pid=$w .*loader=true" "$ZLOG"
done
check "the trainer (pid $train) is ML by the CUDA libraries torch maps" \
  grep -q "ML process pid=$train .*evidence=[a-z_,]*gpu_library" "$ZLOG"
saw() { grep -q "phase tid=.*comm=\"$1\".* -> $2\$" "$ZLOG"; }
check "DataLoading detected on a DataLoader worker (pt_data_worker)" saw pt_data_worker data_loading
n=$(zcounter ml enqueued)
check "ml class enqueues counted and moving (${n:-none} so far)" wait_until 30 zcounter_gt ml enqueued "${n:-0}"
# The positive controls above ran beside it: the daemon classifies, the map is written.
assert_eq "the plain Python process (never imports torch) has no entry" "$(ztask "$plain" class)" ""
check "the plain Python process is not ML" sh -c "! grep -q 'ML process pid=$plain ' $ZLOG"
check "training goes on under scx_zernel (step $steps0 and on)" \
  wait_until 300 file_gt "$W/progress" $((steps0 + 2))
echo "steps: $steps0 at the first checks, $(cat "$W/progress") now"
grep "ML process" "$ZLOG"

kill "$plain" "$train" 2>/dev/null; wait "$plain" "$train" 2>/dev/null
zernel_stop TERM
assert_eq "SIGTERM: exit 0" "$ZRC" 0
check "dmesg is clean" dmesg_clean
finish
