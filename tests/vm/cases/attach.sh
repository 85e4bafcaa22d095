#!/bin/sh
# vm: --smp 4 --mem 2G
#
# Attach, classify, detach. scx_zernel attaches (state `enabled`, ops name
# `zernel...`); a rule moves a CPU hog named zt_batch into the batch class, the
# BPF side applies that entry and its batch counters move while an ordinary
# shell loop is counted in the normal class; SIGTERM detaches cleanly (exit 0,
# state `disabled`, the kernel logs the unregistration, no splats).
# Helpers defined below run through check/wait_until (SC2317 cannot see that).
# shellcheck disable=SC2317 source=tests/vm/guest-lib.sh
. "$(dirname "$0")/../guest-lib.sh"

cat >/tmp/attach.toml <<'TOML'
[[rules]]
comm = "^zt_batch$"
class = "batch"
TOML

assert_eq "sched_ext is disabled before the daemon starts" "$(sched_state)" disabled
zernel_start /tmp/attach.toml || finish
assert_eq "state is enabled" "$(sched_state)" enabled
ops_is_zernel() { case $(ops_name) in zernel*) return 0 ;; esac; return 1; }
check "ops name starts with zernel ($(ops_name))" ops_is_zernel
no_libbpf_warning() { ! grep -q 'skeleton link is uninitialized\|failed to auto-attach' "$ZLOG"; }
check "libbpf attached the skeleton without warnings" no_libbpf_warning

batch_enq0=$(zcounter batch enqueued)
normal_enq0=$(zcounter normal enqueued)
disp0=$(zcounter_sum dispatched)

# Four hog threads and a shell loop on four CPUs: enough contention that tasks
# wait in the class queues rather than all going straight to idle CPUs.
zernel-workload hog --name zt_batch --secs 20 --threads 4 &
hog=$!
( i=0; while [ $i -lt 1000000 ]; do i=$((i + 1)); done ) &
loop=$!

# All four spinners are up (the main thread may carry the name too).
hog_up() { [ "$(tids_by_comm zt_batch | wc -l)" -ge 4 ]; }
wait_until 10 hog_up
tids=$(tids_by_comm zt_batch | tr '\n' ' ')
tids=${tids% }
check "zt_batch threads are running (tids: $tids)" hog_up
# The daemon scans /proc periodically: wait for its scans to classify them
# (a condition, not a time: scans are slow on a loaded host).
all_batch() { for t in $tids; do [ "$(ztask "$t" class)" = batch ] || return 1; done; }
wait_until 30 all_batch
for t in $tids; do assert_eq "zt_batch thread $t is in class batch" "$(ztask "$t" class)" batch; done
# A spinner is enqueued at every slice end; the main thread may just sleep.
max_applied() {
  max_applied=0
  for t in $tids; do
    a=$(ztask "$t" applied)
    [ "${a:-0}" -gt "$max_applied" ] 2>/dev/null && max_applied=$a
  done
  [ "$max_applied" -ge 1 ]
}
wait_until 10 max_applied
assert_ge "BPF applied the zt_batch entries (max applied=$max_applied)" "$max_applied" 1

batch_enq1=$(zcounter batch enqueued)
normal_enq1=$(zcounter normal enqueued)
disp1=$(zcounter_sum dispatched)
assert_gt "batch enqueued grew ($batch_enq0 -> $batch_enq1)" "$batch_enq1" "$batch_enq0"
assert_eq "the shell loop has no entry: the kernel gives it the default class" "$(ztask "$loop" class)" ""
assert_gt "normal enqueued grew ($normal_enq0 -> $normal_enq1)" "$normal_enq1" "$normal_enq0"
assert_gt "dispatched counters moved ($disp0 -> $disp1)" "$disp1" "$disp0"

wait "$hog"; hog_rc=$?
assert_eq "zernel-workload hog exits 0" "$hog_rc" 0
kill "$loop" 2>/dev/null; wait "$loop" 2>/dev/null

# A second instance while one runs: refused in one line, the first unharmed.
out=$(scx_zernel --config /tmp/attach.toml 2>&1); rc=$?
echo "$out"
assert_eq "second instance: exit 1" "$rc" 1
check "second instance: names the running scheduler" sh -c "echo '$out' | grep -q 'another sched_ext scheduler (zernel'"
check "the first instance is still attached" _zernel_attached

zernel_stop TERM
assert_eq "SIGTERM: scx_zernel exits 0" "$ZRC" 0
assert_eq "state is disabled after exit" "$(sched_state)" disabled
unregistered() { dmesg_new | grep 'sched_ext: BPF scheduler "zernel' | grep -q 'unregistered from user space'; }
check "kernel logged the unregistration" unregistered
check "dmesg is clean" dmesg_clean

# Not root: refused in one line before anything is loaded.
ensure_user nobody 65534 65534 nogroup
out=$(su -s /bin/sh nobody -c "scx_zernel" 2>&1); rc=$?
echo "$out"
assert_eq "not root: exit 1" "$rc" 1
check "not root: says it must run as root" sh -c "echo '$out' | grep -q 'must run as root'"
assert_eq "not root: sched_ext stayed disabled" "$(sched_state)" disabled

finish
