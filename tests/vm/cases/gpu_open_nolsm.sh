#!/bin/sh
# vm: --smp 2 --mem 1G --append lsm=lockdown,yama,integrity,apparmor
#
# GPU device opens on a kernel without BPF LSM (booted with an lsm= list
# that leaves bpf out): with scheduler.gpu_open_hook = "lsm" the scheduler
# still attaches, one log line says there is no hook and why, and an open
# of /dev/nvidia0 is not marked: GPU processes are left to the /proc scan.
# Positive control in the same boot: "auto" takes fentry on chrdev_open,
# which this kernel has, and the same open is marked.
# shellcheck disable=SC2317,SC2046 source=tests/vm/guest-lib.sh
. "$(dirname "$0")/../guest-lib.sh"

lsms=$(cat /sys/kernel/security/lsm)
echo "active LSMs: $lsms"
check "the active LSMs are listed ('$lsms')" [ -n "$lsms" ]
check "bpf is not among them" sh -c "! echo '$lsms' | tr ',' '\n' | grep -qx bpf"
[ -e /dev/nvidia0 ] || mknod /dev/nvidia0 c 195 0

opened() { grep -q "open /dev/nvidia0" /tmp/open.out; }
# run HOOK : starts the daemon with gpu_open_hook = HOOK, opens
# /dev/nvidia0 from a new process, waits 2 s; prints gpu_open's change.
run() {
  printf '[scheduler]\ngpu_open_hook = "%s"\n' "$1" >/tmp/nolsm.toml
  zernel_start /tmp/nolsm.toml || finish
  said() { grep -q 'GPU device opens' "$ZLOG"; }
  wait_until 5 said
  o0=$(zglobal gpu_open)
  rm -f /tmp/go
  zernel-workload open --name zt_gpu --threads 1 --path /dev/nvidia0 --when /tmp/go --secs 60 >/tmp/open.out 2>&1 &
  p=$!
  sleep 1
  touch /tmp/go
  wait_until 10 opened
  sleep 2
  o1=$(zglobal gpu_open)
  kill "$p"; wait "$p" 2>/dev/null
}

run lsm
line=$(grep -o 'GPU device opens.*' "$ZLOG" | head -1)
echo "lsm: $line; gpu_open $o0 -> $o1"
assert_eq "lsm: the scheduler is attached" "$(sched_state)" enabled
check "lsm: one line says there is none, and why ($line)" \
  grep -q 'GPU device opens: none (BPF is not an active LSM on this kernel); GPU processes are found by the /proc scan' "$ZLOG"
assert_eq "lsm: just one such line" "$(grep -c 'GPU device opens' "$ZLOG")" 1
assert_eq "lsm: the open is not marked (gpu_open $o0 -> $o1)" "$o1" "$o0"
zernel_stop TERM
assert_eq "lsm: SIGTERM: exit 0" "$ZRC" 0

run auto
line=$(grep -o 'GPU device opens.*' "$ZLOG" | head -1)
echo "auto: $line; gpu_open $o0 -> $o1"
check "auto: fentry on chrdev_open ($line)" grep -q 'GPU device opens seen by fentry on chrdev_open' "$ZLOG"
assert_eq "auto: the same open is marked (gpu_open +1)" $((o1 - o0)) 1
zernel_stop TERM
assert_eq "auto: SIGTERM: exit 0" "$ZRC" 0
check "dmesg is clean" dmesg_clean
finish
