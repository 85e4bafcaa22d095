#!/bin/sh
# vm: --smp 4 --mem 2G --timeout 300
#
# Survive the churn scx CI puts schedulers through: CPU hogs, fork storms and
# affinity changes, spread over three classes, for 30 s. Afterwards the
# scheduler is still attached, the daemon alive, the kernel log clean, and
# SIGINT detaches it with exit 0.
# shellcheck source=tests/vm/guest-lib.sh
. "$(dirname "$0")/../guest-lib.sh"

# stress-ng names its workers stress-ng-<stressor> (cut to 15 characters).
cat >/tmp/stress.toml <<'TOML'
[[rules]]
comm = "^stress-ng-cpu$"
class = "batch"

[[rules]]
comm = "^stress-ng-affin"
class = "ml"

[[rules]]
comm = "^stress-ng-fork$"
class = "latency"
TOML

zernel_start /tmp/stress.toml || finish

stress-ng --cpu 4 --fork 4 --affinity 4 --timeout 30s --metrics-brief
assert_eq "stress-ng exits 0" "$?" 0

assert_eq "state is still enabled" "$(sched_state)" enabled
check "scx_zernel is still running" alive "$ZPID"
for c in batch ml latency normal; do
  n=$(zcounter "$c" enqueued)
  assert_gt "$c enqueued > 0 ($n)" "$n" 0
done
n=$(zcounter_sum dispatched)
assert_gt "tasks were dispatched ($n)" "$n" 0
check "dmesg is clean under load" dmesg_clean

zernel_stop INT
assert_eq "SIGINT: scx_zernel exits 0" "$ZRC" 0
assert_eq "state is disabled after exit" "$(sched_state)" disabled
check "dmesg is clean after detach" dmesg_clean
finish
