#!/bin/sh
# vm: --smp 4 --numa --mem 2G
#
# GPU-aware NUMA placement on a two-node guest (node0 = CPUs 0-1, node1 =
# CPUs 2-3). GPU 0 is pinned to node 1 by [topology]; a CPU-bound thread of a
# process that uses GPU 0 (CUDA_VISIBLE_DEVICES=0) gets node=1 in the kernel's
# map and then runs >= 90% of its samples on node 1 while node 1 has an idle
# CPU. With node 1 saturated by hogs pinned there, the thread still runs
# (taken by node 0's CPUs) instead of waiting, also when node 0's CPUs are
# busy with hogs of their own (taken at their slice ends, while more GPU
# threads than node 1 has CPUs wait there). Its own affinity mask is always
# respected, and pinned to node 0 it runs >= 90% as much as a thread
# with no preferred node pinned beside it, never waiting for the starvation
# bound: it queues on a node it may run on, not on its GPU's, and keeps its
# CPU at a slice end. How much a thread runs is judged by the
# kernel's own schedstat (time on a CPU against time runnable but waiting),
# which a slow host does not change: under emulation a vCPU may get little
# host time, so a share of wall-clock time would measure the host.
# An entry naming a node the machine lacks is harmless. An ml thread woken
# beside a hog of its class takes a lower class's CPU on its own node before
# one on the other node, and one there only when its node has none.
# shellcheck disable=SC2317 source=tests/vm/guest-lib.sh
. "$(dirname "$0")/../guest-lib.sh"

assert_eq "guest has node1 with CPUs 2-3" "$(cat /sys/devices/system/node/node1/cpulist)" "2-3"

gpu_on_node1_config /tmp/numa.toml

zernel_start /tmp/numa.toml || finish
assert_eq "the kernel holds nr_nodes 2" "$(ztunable nr_nodes)" 2
assert_eq "the kernel holds numa 1" "$(ztunable numa)" 1

# A pipe nothing writes to: `read -t` on it sleeps without forking.
mkfifo /tmp/numa.never
exec 3<>/tmp/numa.never
# sample TID N : N samples 50 ms apart of the CPU the thread last ran on
# (field 39 of its stat); prints "on_node1 total". Nothing is forked per
# sample: forked processes would run on the very CPUs being watched.
sample() {
  _tid=$1 _n=$2 _on=0 _tot=0
  [ -n "$_tid" ] || { echo "0 0"; return; }
  while [ $_tot -lt "$_n" ]; do
    read -r _l <"/proc/$_tid/stat" || break
    # shellcheck disable=SC2086 # split into fields on purpose
    set -- ${_l##*") "}
    shift 36
    _c=$1
    _tot=$((_tot + 1))
    [ "$_c" -ge 2 ] && _on=$((_on + 1))
    # shellcheck disable=SC3045 # busybox ash's read takes -t (fractional)
    read -r -t 0.05 _ <&3
  done
  echo "$_on $_tot"
}

# Start the GPU thread on node 0 on purpose: it must move to node 1.
CUDA_VISIBLE_DEVICES=0 taskset -c 0 zernel-workload hog --name gpu_feeder --secs 300 --threads 1 &
feeder=$!
feeder_up() { [ -n "$(tids_by_comm gpu_feeder)" ]; }
wait_until 10 feeder_up
tid=$(tids_by_comm gpu_feeder | tail -n 1)
check "the GPU thread is running (tid '$tid')" feeder_up
taskset -p -c 0-3 "$tid" >/dev/null   # now free to move: the scheduler decides
has_node1() { [ "$(ztask "$tid" node)" = 1 ]; }
wait_until 10 has_node1
assert_eq "kernel map holds node=1 for the GPU thread $tid" "$(ztask "$tid" node)" 1

sleep 1
# shellcheck disable=SC2046 # split into numbers on purpose
set -- $(sample "$tid" 60)
echo "samples on node 1 while it has idle CPUs: $1 of $2"
assert_ge "runs >= 90% of samples on node 1 ($1/$2)" $(($1 * 100)) $(($2 * 90))

# Saturate node 1 with pinned hogs: the GPU thread must still run.
taskset -c 2-3 zernel-workload hog --name node1_hog --secs 60 --threads 4 &
hogs=$!
sleep 1
s0=$(schedstat_of "$feeder" "$tid")
# shellcheck disable=SC2046 # split into numbers on purpose
set -- $(sample "$tid" 60)
s1=$(schedstat_of "$feeder" "$tid")
# 4 pinned hogs + this thread on node 1's 2 CPUs would leave it waiting 60%
# of the time (on a CPU 40%); node 0's idle CPUs taking it lets it run.
pct=$(run_pct "$s0" "$s1")
echo "with node 1 saturated: $1 of $2 samples on node 1; on a CPU $pct% of its runnable time ($s0 -> $s1)"
assert_ge "still runs with node 1 saturated (on a CPU >= 50% of its runnable time, got $pct%)" "$pct" 50
assert_gt "it ran on node 0 CPUs (steals)" $(($2 - $1)) 0
assert_gt "samples were taken" "$2" 0

# Node 0 busy too, with one pinned hog per CPU and nothing queued there, and
# two more threads of a second process on GPU 0 (its class, node 1): three
# such threads for node 1's two CPUs, so one of them waits in node 1's queue
# (the pinned hogs, a lower class, never take a CPU from them at a slice
# end). A node 0 CPU at its hog's slice end takes the one waiting (step 4
# of dispatch) instead of giving its hog another slice at once. (Kept
# there, the hogs would hold node 0, and the threads would take turns on
# node 1.)
taskset -c 0-1 zernel-workload hog --name node0_hog --secs 60 --threads 2 &
hogs0=$!
CUDA_VISIBLE_DEVICES=0 zernel-workload hog --name gpu_feeder2 --secs 60 --threads 2 &
feeder2=$!
node0_up() { [ "$(tids_by_comm node0_hog | wc -l)" -ge 2 ]; }
wait_until 10 node0_up
feeder2_node1() { [ "$(ztask "$(tids_by_comm gpu_feeder2 | tail -n 1)" node)" = 1 ]; }
check "the second GPU process's threads hold node=1 in the kernel" wait_until 10 feeder2_node1
sleep 1
sl0=$(zglobal steal)
s0=$(schedstat_of "$feeder" "$tid")
# shellcheck disable=SC2046 # split into numbers on purpose
set -- $(sample "$tid" 60)
s1=$(schedstat_of "$feeder" "$tid")
sl1=$(zglobal steal)
pct=$(run_pct "$s0" "$s1")
echo "both nodes busy: $1 of $2 samples on node 1; on a CPU $pct% of its runnable time ($s0 -> $s1); steals $sl0 -> $sl1"
assert_gt "both nodes busy: node 0 CPUs took it at their hogs' slice ends (steals moved: $sl0 -> $sl1)" "$sl1" "$sl0"
assert_gt "both nodes busy: it ran on node 0 CPUs ($(($2 - $1)) of $2 samples)" $(($2 - $1)) 0
# Three threads of one class for two CPUs share them: it runs, not alone.
assert_ge "both nodes busy: it still runs (on a CPU >= 30% of its runnable time, got $pct%)" "$pct" 30
kill "$hogs0" "$feeder2" 2>/dev/null; wait "$hogs0" "$feeder2" 2>/dev/null

# Affinity: pinned to CPU 1 (node 0), it must never run on node 1, and it
# must run (CPU time, not sampling rounds: a thread that never ran would
# show no sample on node 1 either).
kill "$hogs" 2>/dev/null; wait "$hogs" 2>/dev/null
# The control: a thread with no preferred node, pinned to CPU 0 (a normal
# process: no GPU). The GPU thread must get >= 90% of what the control gets.
taskset -c 0 zernel-workload hog --name plain_hog --secs 60 --threads 1 &
plain=$!
taskset -p -c 1 "$tid" >/dev/null
plain_up() { [ -n "$(tids_by_comm plain_hog)" ]; }
wait_until 10 plain_up
ctid=$(tids_by_comm plain_hog | tail -n 1)
sleep 0.5
st0=$(zcounter ml starved)
s0=$(schedstat_of "$feeder" "$tid") c0=$(schedstat_of "$plain" "$ctid")
# shellcheck disable=SC2046 # split into numbers on purpose
set -- $(sample "$tid" 40)
s1=$(schedstat_of "$feeder" "$tid") c1=$(schedstat_of "$plain" "$ctid")
st1=$(zcounter ml starved)
pct=$(run_pct "$s0" "$s1") cpct=$(run_pct "$c0" "$c1")
echo "pinned to CPU 1: $1 of $2 samples on node 1; on a CPU $pct% of its runnable time ($s0 -> $s1); control on CPU 0: $cpct% ($c0 -> $c1); ml starved $st0 -> $st1"
assert_eq "affinity respected: no sample on node 1 when pinned to CPU 1 ($2 samples)" "$1" 0
assert_ge "pinned to CPU 1 it runs (on a CPU >= 80% of its runnable time, got $pct%)" "$pct" 80
assert_ge "pinned to CPU 1 it runs >= 90% of the control (got $pct% vs $cpct%)" $((pct * 100)) $((cpct * 90))
assert_ge "the control runs (>= 50% of its runnable time, got $cpct%)" "$cpct" 50
assert_ge "the kernel's ml starved counter was read ($st0)" "$st0" 0
assert_eq "pinned to CPU 1 it never waits for the starvation bound (ml starved)" "$st1" "$st0"
kill "$plain" 2>/dev/null; wait "$plain" 2>/dev/null

kill "$feeder" 2>/dev/null; wait "$feeder" 2>/dev/null

# An entry whose node the machine lacks (node 7 of 2): select_cpu must not
# ask the kernel for an idle CPU on it (an invalid node is a scheduler
# error: the kernel would eject it). The thread wakes every 5 ms.
zernel-workload hog --name zt_badnode --secs 120 --busy-pct 20 &
bad=$!
wait_until 10 alive "$bad"
check "write an entry with node 7 for zt_badnode" \
  zernel-workload entry --map /sys/fs/bpf/scx_zernel/task_class --tid "$bad" --class 1 --node 7
used() { _n=$(ztask "$bad" applied); [ "${_n:-0}" -ge 200 ]; }
wait_until 30 used
echo "zt_badnode: $(scx_zernel inspect --tid "$bad" 2>&1)"
assert_ge "node 7: the entry was applied at >= 200 wakeups" "$(ztask "$bad" applied)" 200
assert_eq "node 7: the scheduler is still attached" "$(sched_state)" enabled
kill "$bad" 2>/dev/null; wait "$bad" 2>/dev/null
zernel_stop TERM
assert_eq "SIGTERM: exit 0" "$ZRC" 0

# ---- an ML wakeup further afield stays on its node ---------------------------------
# An ml thread that sleeps between 20 ms bursts (stress-ng's cpu worker at 50 %
# load, ml by rule) last ran on CPU 1, beside an ml hog it may not cut short
# (a hog of its own class). The CPUs after its own are 2 and 3 (node 1), then
# 0 (node 0), and normal-class hogs run on 0, 2 and 3 (pinned). It takes
# CPU 0, on its own node: wake_afield moves, wake_afield_far barely (only
# when CPU 0 was busy with a higher class, the daemon, or claimed by
# another wakeup). With an ml hog on CPU 0 too, its node has nothing it may
# take: then it takes CPU 2 on node 1 (wake_afield_far moves) rather than
# wait in its queue. To wake it on CPU 1 again and again, it is pinned there
# for 0.2 s, then let go, 50 times.
cat >/tmp/numa-afield.toml <<'TOML'
[[rules]]
comm = "^stress-ng-cpu$"
class = "ml"

[[rules]]
comm = "^zt_mlhog$"
class = "ml"
TOML
# afield_round normal|ml : the hog on CPU 0 is of that class; sets AF_N and
# AF_FAR to the wake_afield and wake_afield_far deltas (in this shell: their
# checks count).
afield_round() {
  local h0 h1 h23 s w i a0 a1 f0 f1 name0=zt_hog
  AF_N="" AF_FAR=""
  [ "$1" = ml ] && name0=zt_mlhog
  zernel_start /tmp/numa-afield.toml || return 1
  taskset -c 0 zernel-workload hog --name "$name0" --threads 1 --secs 60 & h0=$!
  taskset -c 1 zernel-workload hog --name zt_mlhog --threads 1 --secs 60 & h1=$!
  taskset -c 2,3 zernel-workload hog --name zt_hog --threads 2 --secs 60 & h23=$!
  stress-ng --cpu 1 --cpu-load 50 --cpu-load-slice 20 --timeout 60s >/dev/null 2>&1 &
  s=$!
  check "the rules put stress-ng's cpu worker and the ml hogs in the ml class (CPU 0: $1)" \
    wait_until 30 eval "zholds stress-ng-cpu ml '*' '*' && zholds zt_mlhog ml '*' '*'"
  w=$(tids_by_comm stress-ng-cpu | tail -n 1)
  a0=$(zglobal wake_afield) f0=$(zglobal wake_afield_far)
  i=0
  while [ $i -lt 50 ] && [ -n "$w" ]; do
    taskset -p -c 1 "$w" >/dev/null 2>&1
    sleep 0.2
    taskset -p -c 0-3 "$w" >/dev/null 2>&1
    sleep 0.1
    i=$((i + 1))
  done
  a1=$(zglobal wake_afield) f1=$(zglobal wake_afield_far)
  kill "$h0" "$h1" "$h23" "$s" 2>/dev/null; wait "$h0" "$h1" "$h23" "$s" 2>/dev/null
  zernel_stop INT
  assert_eq "SIGINT: scx_zernel exits 0" "$ZRC" 0
  AF_N=$((${a1:-0} - ${a0:-0})) AF_FAR=$((${f1:-0} - ${f0:-0}))
}
afield_round normal
echo "woken on CPU 1 beside an ml hog, normal hogs on CPU 0 (node 0) and CPUs 2-3 (node 1): $AF_N wakeups took a CPU further afield, $AF_FAR of them off its node"
assert_ge "it took a lower class's CPU further afield (wake_afield)" "$AF_N" 10
check "it took one on its own node: at most a quarter off it (wake_afield_far $AF_FAR of $AF_N)" \
  [ $((AF_FAR * 4)) -le "$AF_N" ]
afield_round ml
echo "the same with an ml hog on CPU 0 too: $AF_N wakeups took a CPU further afield, $AF_FAR of them off its node"
assert_ge "with none on its node it took one off it (wake_afield_far)" "$AF_FAR" 10
check "dmesg is clean" dmesg_clean
finish
