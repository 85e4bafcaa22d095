#!/bin/sh
# vm: --smp 2 --mem 1G --timeout 300 --append preempt=full
#
# Tasks preempted inside migrate_disable(): the kernel enqueues them while
# their cpumask still shows every CPU, and a scheduler that put one in
# another CPU's local queue would be ended by the kernel ("cannot move
# migration disabled"). Two ml threads spend nearly all their time in
# BPF_PROG_TEST_RUN (the kernel runs the program with migration disabled)
# beside two batch spinners, on a kernel booted with preempt=full so that
# they are preempted there. The kernel's migration_disabled counter shows
# such enqueues happened (positive control: without preempt=full it stays
# near 0); the scheduler stays attached with a clean kernel log.
# shellcheck disable=SC2317 source=tests/vm/guest-lib.sh
. "$(dirname "$0")/../guest-lib.sh"

cat >/tmp/md.toml <<'TOML'
[[rules]]
comm = "^zt_bpf$"
class = "ml"

[[rules]]
comm = "^zt_low$"
class = "batch"
TOML
zernel_start /tmp/md.toml || finish

zernel-workload hog --name zt_low --threads 2 --secs 300 &
low=$!
# Killed after the measurement (under load its 300 s may outlast it or not).
zernel-workload bpf-run --name zt_bpf --threads 2 --secs 300 >/tmp/bpf.out 2>&1 &
bpf=$!
bpf_tid() { tids_by_comm zt_bpf | head -n1; }
held() { t=$(bpf_tid); [ -n "$t" ] && [ "$(ztask "$t" class)" = ml ]; }
wait_until 30 held
assert_eq "the kernel holds ml for zt_bpf" "$(ztask "$(bpf_tid)" class)" ml

m0=$(zglobal migration_disabled)
grown() { [ $(( $(zglobal migration_disabled) - m0 )) -ge 200 ]; }
wait_until 60 grown
m1=$(zglobal migration_disabled)
echo "migration_disabled: $m0 -> $m1"
assert_ge "tasks preempted with migration disabled were enqueued (migration_disabled +200)" "$((m1 - m0))" 200
check "zt_bpf still calls BPF_PROG_TEST_RUN" alive "$bpf"
check "sched_ext still runs scx_zernel" _zernel_attached
check "the daemon is alive" alive "$ZPID"

kill "$bpf" "$low"; wait "$bpf" "$low" 2>/dev/null
grep -q "BPF_PROG_TEST_RUN:\|BPF_PROG_LOAD:" /tmp/bpf.out && cat /tmp/bpf.out
check "zt_bpf's BPF calls succeeded" sh -c '! grep -q "bpf-run:" /tmp/bpf.out'
zernel_stop TERM
assert_eq "SIGTERM: exit 0" "$ZRC" 0
check "dmesg is clean" dmesg_clean
finish
