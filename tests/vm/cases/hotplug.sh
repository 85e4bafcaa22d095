#!/bin/sh
# vm: --smp 4 --numa --mem 2G --timeout 400
#
# CPU hotplug on a two-node guest (node0 = CPUs 0-1, node1 = CPUs 2-3).
# sched_ext ends a scheduler that has no hotplug callbacks when a CPU goes
# offline or comes online, and asks it to restart. scx_zernel restarts in
# the same process, reads the topology again and loads its BPF side with the
# CPUs and nodes the machine has now. Node 1's CPUs go offline one by one and
# come back: each time scx_zernel is attached again (the time is printed),
# the kernel holds the node count of the moment (2, 1, 2, 2), an ML thread's
# decision is back in the new map, and at the end a thread pinned to a CPU
# that came back runs there.
# shellcheck disable=SC2317 source=tests/vm/guest-lib.sh
. "$(dirname "$0")/../guest-lib.sh"

gpu_on_node1_config /tmp/hotplug.toml

zernel_start /tmp/hotplug.toml || finish
assert_eq "the kernel holds nr_nodes 2" "$(ztunable nr_nodes)" 2

# An ML thread (its process uses GPU 0), to see its decision come back.
CUDA_VISIBLE_DEVICES=0 zernel-workload hog --name gpu_feeder --secs 300 --threads 1 --busy-pct 50 &
feeder=$!
feeder_up() { [ -n "$(tids_by_comm gpu_feeder)" ]; }
wait_until 10 feeder_up
tid=$(tids_by_comm gpu_feeder | tail -n 1)
wait_until 30 ztask_is "$tid" class ml
assert_eq "before any hotplug: the kernel holds class ml for the GPU thread $tid" "$(ztask "$tid" class)" ml

restarts() { grep -c "asked for a restart" "$ZLOG"; }
back() { [ "$(restarts)" -gt "$1" ] && _zernel_attached; }

# hotplug CPU 0|1 NODES : takes CPU offline (0) or online (1), then checks
# that scx_zernel is attached again with NODES nodes and the ML decision.
hotplug() {
  local before t0 what
  what="CPU $1 $( [ "$2" = 0 ] && echo offline || echo online)"
  before=$(restarts) t0=$(uptime_s)
  if ! echo "$2" >"/sys/devices/system/cpu/cpu$1/online"; then
    _notok "$what: the write to its online file worked"
    return
  fi
  if wait_until 60 back "$before"; then
    _ok "$what: scx_zernel attached again ($(awk -v a="$t0" -v b="$(uptime_s)" 'BEGIN { printf "%.1f s", b - a }') after the write)"
  else
    _notok "$what: scx_zernel attached again" "state=$(sched_state) ops='$(ops_name)' restarts=$(restarts)"
  fi
  check "$what: the same daemon process runs" alive "$ZPID"
  assert_eq "$what: the kernel holds nr_nodes $3" "$(ztunable nr_nodes)" "$3"
  wait_until 30 ztask_is "$tid" class ml
  assert_eq "$what: the new map holds class ml for the GPU thread" "$(ztask "$tid" class)" ml
}

hotplug 3 0 2
hotplug 2 0 1
hotplug 2 1 2
hotplug 3 1 2
assert_eq "four restarts, one per hotplug event" "$(restarts)" 4

# A thread pinned to CPU 3, which came back, runs there.
taskset -c 3 zernel-workload hog --name on_cpu3 --secs 60 --threads 1 &
pinned=$!
pinned_up() { [ -n "$(tids_by_comm on_cpu3)" ]; }
wait_until 10 pinned_up
ptid=$(tids_by_comm on_cpu3 | tail -n 1)
run_ns() { cut -d' ' -f1 "/proc/$pinned/task/$ptid/schedstat"; }
r0=$(run_ns)
ran() { [ $(($(run_ns) - r0)) -gt 200000000 ]; }
wait_until 30 ran
echo "on_cpu3: $r0 -> $(run_ns) ns on a CPU"
check "a thread pinned to CPU 3 (back online) ran 0.2 s there" ran
assert_eq "it ran on CPU 3" "$(sed 's/.*) //' "/proc/$pinned/task/$ptid/stat" | cut -d' ' -f37)" 3
kill "$pinned" "$feeder" 2>/dev/null; wait "$pinned" "$feeder" 2>/dev/null

check "SIGTERM: the daemon exits" zernel_stop
assert_eq "SIGTERM: exit 0" "$ZRC" 0
check "dmesg is clean" dmesg_clean
finish
