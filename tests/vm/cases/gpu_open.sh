#!/bin/sh
# vm: --smp 2 --mem 1G --timeout 400
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
# fd to find; and the open ends the daemon's wait between passes
# (loop_interval_ms = 10000: the next timed pass could be 10 s away).
# Control: a process that opens /dev/null the same way stays
# in the default class, with no entry and no event.
# Three daemon runs: scheduler.gpu_open_hook = "auto" (fentry on this
# kernel), "lsm" (BPF LSM file_open: the verifier takes it here too, and it
# works the same), and "off" (one log line; the open is not seen, and the
# threads get no entry while the evidence scan waits).
# shellcheck disable=SC2317,SC2046 source=tests/vm/guest-lib.sh
. "$(dirname "$0")/../guest-lib.sh"

[ -e /dev/nvidia0 ] || mknod /dev/nvidia0 c 195 0
ls -l /dev/nvidia0
check "/dev/nvidia0 is a character node" [ -c /dev/nvidia0 ]
check "bpf is an active LSM ($(cat /sys/kernel/security/lsm))" sh -c "tr ',' '\n' </sys/kernel/security/lsm | grep -qx bpf"
# config HOOK : a config with scheduler.gpu_open_hook = HOOK.
config() {
  cat >/tmp/gpu_open.toml <<TOML
[scheduler]
gpu_open_hook = "$1"
[observe]
evidence_interval_ms = 60000
[phase]
loop_interval_ms = 10000
TOML
}

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
opened() { grep -q "open $2" "$1"; }
# start_openers : zt_gpu (opens /dev/nvidia0 once /tmp/go.gpu exists) and
# zt_ctl (/dev/null, /tmp/go.ctl), 3 threads each; sets $pg and $pc.
start_openers() {
  rm -f /tmp/go.gpu /tmp/go.ctl
  zernel-workload open --name zt_gpu --threads 3 --path /dev/nvidia0 --when /tmp/go.gpu --secs 200 >/tmp/open.gpu 2>&1 &
  pg=$!
  zernel-workload open --name zt_ctl --threads 3 --path /dev/null --when /tmp/go.ctl --secs 200 >/tmp/open.ctl 2>&1 &
  pc=$!
  sleep 3
  check "$hook: before the open: zt_gpu's threads have no entry" no_entry zt_gpu
  check "$hook: before the open: zt_ctl's threads have no entry" no_entry zt_ctl
}
stop_run() {
  kill "$pg" "$pc"; wait "$pg" 2>/dev/null; wait "$pc" 2>/dev/null
  zernel_stop TERM
  assert_eq "$hook: SIGTERM: exit 0" "$ZRC" 0
}

# seen_by HOOK WHAT : a daemon run with gpu_open_hook = HOOK, whose log
# says the opens are seen by WHAT; the open is marked and acted on.
seen_by() {
  hook=$1
  config "$1"
  zernel_start /tmp/gpu_open.toml || finish
  hooked() { grep -q 'GPU device opens seen by' "$ZLOG"; }
  wait_until 5 hooked
  check "$hook: the daemon attached a GPU-open hook ($(grep -o 'GPU device opens.*' "$ZLOG" | head -1))" hooked
  check "$hook: the log names $2" grep -q "GPU device opens seen by $2" "$ZLOG"
  start_openers

  set -- $(g); o0=$1 h0=$2
  touch /tmp/go.ctl
  wait_until 10 opened /tmp/open.ctl /dev/null
  sleep 1
  set -- $(g)
  assert_eq "$hook: control: opening /dev/null is no GPU open (gpu_open +0)" $(( $1 - o0 )) 0

  t0=$(now_cs)
  touch /tmp/go.gpu
  wait_until 10 opened /tmp/open.gpu /dev/nvidia0
  echo "zt_gpu: $(cat /tmp/open.gpu)"
  wait_until 30 all_hold zt_gpu ml
  t1=$(now_cs)
  set -- $(g)
  echo "$hook: open -> all 3 threads hold the daemon's class ml: $(( t1 - t0 )) cs; gpu_open +$(( $1 - o0 )), gpu_hit +$(( $2 - h0 )), event_lost $3"
  check "$hook: zt_gpu's 3 threads hold class ml" all_hold zt_gpu ml
  assert_ge "$hook: within 5 s of the open (the evidence scan is every 60 s, a pass every 10 s)" 500 $(( t1 - t0 ))
  assert_eq "$hook: the kernel marked the process at its open (gpu_open +1)" $(( $1 - o0 )) 1
  assert_gt "$hook: its threads' lookups with no entry were served class ml by the mark (gpu_hit > 0)" $(( $2 - h0 )) 0
  assert_eq "$hook: no event lost" "$3" 0
  check "$hook: the daemon logged zt_gpu as ML by the device open" grep -q "ML process pid=$pg comm=\"zt_gpu\" evidence=device_open" "$ZLOG"
  grep 'ML process' "$ZLOG"

  set -- $(g); h1=$2
  sleep 2
  set -- $(g)
  assert_eq "$hook: once the daemon judged it, its mark no longer decides (gpu_hit +0 in 2 s)" $(( $2 - h1 )) 0
  check "$hook: control: zt_ctl's threads still have no entry" no_entry zt_ctl
  check "$hook: control: zt_ctl was never logged as ML" sh -c "! grep -q 'comm=\"zt_ctl\"' $ZLOG"
  stop_run
}

seen_by auto "fentry on chrdev_open"
seen_by lsm "BPF LSM file_open"

# "off": one line says so; the open is not seen. (The runs above, on the
# same kernel and device node, are its positive controls.)
hook=off
config off
zernel_start /tmp/gpu_open.toml || finish
said() { grep -q 'GPU device opens: none' "$ZLOG"; }
wait_until 5 said
check "off: one log line says so ($(grep -o 'GPU device opens.*' "$ZLOG" | head -1))" \
  grep -q 'GPU device opens: none (scheduler.gpu_open_hook is "off"); GPU processes are found by the /proc scan' "$ZLOG"
assert_eq "off: no hook attached (no 'seen by' line)" "$(grep -c 'GPU device opens seen by' "$ZLOG")" 0
start_openers
set -- $(g); o0=$1
touch /tmp/go.gpu
wait_until 10 opened /tmp/open.gpu /dev/nvidia0
sleep 3
set -- $(g)
assert_eq "off: the open is not marked (gpu_open +0)" $(( $1 - o0 )) 0
check "off: 3 s after the open zt_gpu's threads have no entry (the evidence scan waits 60 s)" no_entry zt_gpu
check "off: zt_gpu was not logged as ML" sh -c "! grep -q 'comm=\"zt_gpu\"' $ZLOG"
stop_run
check "dmesg is clean" dmesg_clean
finish
