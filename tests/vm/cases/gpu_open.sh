#!/bin/sh
# vm: --smp 2 --mem 1G --timeout 300
#
# GPU device opens as events, with no GPU: a character node with NVIDIA's
# major (mknod /dev/nvidia0 c 195 0; no driver, so the open itself fails
# with ENXIO) is opened by a process with three threads. The kernel sees
# the open on the generic path (fentry on chrdev_open, or BPF LSM
# file_open), marks the process ML (gpu_open +1) and its threads' next
# lookups with no entry give class ml (gpu_hit), and tells the daemon
# through the ring buffer, which logs the process as ML by `device_open`
# and writes its threads' entries (class ml) at once: the evidence scan
# (evidence_interval_ms = 60000) could not have found it, and there is no
# fd to find. Control: a process that opens /dev/null the same way stays
# in the default class, with no entry and no event.
# shellcheck disable=SC2317,SC2046 source=tests/vm/guest-lib.sh
. "$(dirname "$0")/../guest-lib.sh"

[ -e /dev/nvidia0 ] || mknod /dev/nvidia0 c 195 0
ls -l /dev/nvidia0
check "/dev/nvidia0 is a character node" [ -c /dev/nvidia0 ]
cat >/tmp/gpu_open.toml <<'TOML'
[observe]
evidence_interval_ms = 60000
TOML
zernel_start /tmp/gpu_open.toml || finish
hooked() { grep -q 'GPU device opens seen by' "$ZLOG"; }
wait_until 5 hooked
check "the daemon attached a GPU-open hook ($(grep -o 'GPU device opens.*' "$ZLOG" | head -1))" hooked

now_cs() { awk '{ split($1, t, "."); print t[1] * 100 + t[2] }' /proc/uptime; }
# g : "gpu_open gpu_hit event_lost ml_enqueued", one inspect.
g() {
  scx_zernel inspect | awk '$1 == "global" { v[$2] = $3 } $1 == "counter" && $2 == "ml" && $3 == "enqueued" { m = $4 }
    END { print v["gpu_open"], v["gpu_hit"], v["event_lost"], m }'
}
# all_hold COMM CLASS : every thread named COMM holds CLASS.
all_hold() {
  local t n=0
  for t in $(tids_by_comm "$1"); do
    [ "$(ztask "$t" class)" = "$2" ] || return 1
    n=$((n + 1))
  done
  [ "$n" -eq 3 ]
}
no_entry() {
  local t
  for t in $(tids_by_comm "$1"); do [ -z "$(ztask "$t" class)" ] || return 1; done
}

rm -f /tmp/go.gpu /tmp/go.ctl
zernel-workload open --name zt_gpu --threads 3 --path /dev/nvidia0 --when /tmp/go.gpu --secs 200 >/tmp/open.gpu 2>&1 &
pg=$!
zernel-workload open --name zt_ctl --threads 3 --path /dev/null --when /tmp/go.ctl --secs 200 >/tmp/open.ctl 2>&1 &
pc=$!
sleep 3
check "before the open: zt_gpu's threads have no entry" no_entry zt_gpu
check "before the open: zt_ctl's threads have no entry" no_entry zt_ctl

set -- $(g); o0=$1 h0=$2
touch /tmp/go.ctl
opened() { grep -q "open $2" "$1"; }
wait_until 10 opened /tmp/open.ctl /dev/null
sleep 1
set -- $(g)
assert_eq "control: opening /dev/null is no GPU open (gpu_open +0)" $(( $1 - o0 )) 0

t0=$(now_cs)
touch /tmp/go.gpu
wait_until 10 opened /tmp/open.gpu /dev/nvidia0
echo "zt_gpu: $(cat /tmp/open.gpu)"
wait_until 30 all_hold zt_gpu ml
t1=$(now_cs)
set -- $(g)
echo "open -> all 3 threads hold the daemon's class ml: $(( t1 - t0 )) cs; gpu_open +$(( $1 - o0 )), gpu_hit +$(( $2 - h0 )), event_lost $3"
check "zt_gpu's 3 threads hold class ml" all_hold zt_gpu ml
assert_ge "within 5 s of the open (the evidence scan is every 60 s)" 500 $(( t1 - t0 ))
assert_eq "the kernel marked the process at its open (gpu_open +1)" $(( $1 - o0 )) 1
assert_gt "its threads' lookups with no entry were served class ml by the mark (gpu_hit > 0)" $(( $2 - h0 )) 0
assert_eq "no event lost" "$3" 0
check "the daemon logged zt_gpu as ML by the device open" grep -q "ML process pid=$pg comm=\"zt_gpu\" evidence=device_open" "$ZLOG"
grep 'ML process' "$ZLOG"

set -- $(g); h1=$2
sleep 2
set -- $(g)
assert_eq "once the daemon judged it, its mark no longer decides (gpu_hit +0 in 2 s)" $(( $2 - h1 )) 0
check "control: zt_ctl's threads still have no entry" no_entry zt_ctl
check "control: zt_ctl was never logged as ML" sh -c "! grep -q 'comm=\"zt_ctl\"' $ZLOG"

kill "$pg" "$pc"; wait "$pg" 2>/dev/null; wait "$pc" 2>/dev/null
zernel_stop TERM
assert_eq "SIGTERM: exit 0" "$ZRC" 0
check "dmesg is clean" dmesg_clean
finish
