#!/bin/sh
# vm: --smp 2 --mem 1G --timeout 300
#
# Process events instead of discovery passes: with the scheduler attached the
# kernel tells the daemon of every fork, exec and exit (tp_btf
# sched_process_fork/exec/exit, ring buffer), so a new process is found at
# the next pass without listing /proc, and an exec'd one is read again at
# once. rescan_interval_ms = 30000: a known process that is not ML is
# re-read every 30 s (its first time (pid % 97) / 97 of that after it is
# found), and /proc is listed only every 5 rescan intervals (150 s).
#  fork: a process started after attach, matching a cmdline rule, holds the
#    rule's class (batch) within 3 s; the listings (zernel_proc_listings)
#    did not grow meanwhile, the events (zernel_proc_events) did.
#  exec: a shell found >= 6 s before its first rescan execs `sleep 61`
#    (a cmdline rule: latency): the kernel holds latency within 3 s.
#  exit: its entry is gone (exit_task) and the daemon lets go of the
#    process: the events grew by its exit.
#  rename (tp_btf task_rename): thread_name_interval_ms = 600000. A thread
#    other than the main one renames itself (prctl PR_SET_NAME, as
#    pthread_setname_np does, within 10 ms of a file's creation) to a
#    comm rule's name (batch) 3 s after its 12.6 j s name check, 6.5 s or
#    more before the next (see timing_keys.sh: 0.2, 0.6, ... 12.6, 25.4 s
#    times j = 0.75 + (tid % 50) / 100 after it is found): the kernel holds
#    batch within 3 s.
#  cgroup move (tp_btf cgroup_attach_task): a process is moved to a cgroup
#    rule's cgroup (latency) 3 s or more away from its first rescan (which
#    would not read the cgroup anyway: with events, every 5th does): the
#    kernel holds latency within 3 s.
# timing_keys.sh runs the same rename and move with process_events = false:
# not within 3 s with long intervals.
# shellcheck disable=SC2317 source=tests/vm/guest-lib.sh
. "$(dirname "$0")/../guest-lib.sh"

cat >/tmp/ev.toml <<'TOML'
[observe]
rescan_interval_ms = 30000
thread_name_interval_ms = 600000

[[rules]]
cmdline = "--name zt_evt"
class = "batch"

[[rules]]
cmdline = "^sleep 61$"
class = "latency"

[[rules]]
comm = "^zt_renamed$"
class = "batch"

[[rules]]
cgroup = "^/zt_ev_moved$"
class = "latency"
TOML
# metric NAME : the counter zernel_NAME_total, from the daemon's endpoint.
metric() { wget -q -O - http://127.0.0.1:9094/metrics | awk -v n="zernel_$1_total" '$1 == n { print $2 }'; }
metric_gt() { v=$(metric "$1"); _is_int "$v" && [ "$v" -gt "$2" ]; }
zernel_start /tmp/ev.toml --metrics-addr 127.0.0.1:9094 || finish
wait_until 10 metric_gt proc_listings 0
l0=$(metric proc_listings) e0=$(metric proc_events)
echo "after attach: $l0 listings of /proc, $e0 process events"
assert_ge "the daemon listed /proc at start" "$l0" 1

# ---- fork
zernel-workload hog --name zt_evt --secs 60 --busy-pct 10 >/dev/null &
evt=$!
t0=$(uptime_s)
wait_until 3 ztask_is "$evt" class batch
took=$(awk -v a="$t0" -v b="$(uptime_s)" 'BEGIN { printf "%.1f", b - a }')
l1=$(metric proc_listings) e1=$(metric proc_events)
echo "fork: class $(ztask "$evt" class) after $took s; listings $l0 -> $l1, events $e0 -> $e1"
assert_eq "fork: a new process holds its rule's class within 3 s" "$(ztask "$evt" class)" batch
assert_eq "fork: found without listing /proc" "$l1" "$l0"
assert_gt "fork: the kernel told of it (events grew)" "$e1" "$e0"

# ---- exec: a shell whose first rescan is >= 6 s away once it is found
# (the daemon finds it within a pass or two of its fork).
sh_pid="" tries=0
while [ -z "$sh_pid" ] && [ $tries -lt 40 ]; do
  sh -c 'while [ ! -e /tmp/ev.go ]; do sleep 0.1; done; exec sleep 61' &
  p=$!
  if [ $((p % 97)) -ge 20 ]; then sh_pid=$p; else kill "$p"; wait "$p" 2>/dev/null; fi
  tries=$((tries + 1))
done
check "exec: a shell with a late first rescan ($sh_pid, $(( (sh_pid % 97) * 30 / 97 )) s)" [ -n "$sh_pid" ]
sleep 1   # found meanwhile, by its fork's event
assert_eq "exec: the shell has no entry" "$(ztask "$sh_pid" class)" ""
touch /tmp/ev.go
t0=$(uptime_s)
wait_until 3 ztask_is "$sh_pid" class latency
took=$(awk -v a="$t0" -v b="$(uptime_s)" 'BEGIN { printf "%.1f", b - a }')
echo "exec: $(tr '\0' ' ' </proc/"$sh_pid"/cmdline)holds class '$(ztask "$sh_pid" class)' $took s after the exec"
assert_eq "exec: the exec'd program's rule is in the kernel within 3 s" "$(ztask "$sh_pid" class)" latency

# ---- exit
e2=$(metric proc_events)
kill "$sh_pid"; wait "$sh_pid" 2>/dev/null
wait_until 5 metric_gt proc_events "$e2"
e3=$(metric proc_events)
assert_gt "exit: the kernel told of it (events grew)" "$e3" "$e2"
assert_eq "exit: the kernel removed its entry" "$(ztask "$sh_pid" class)" ""
# ---- rename of a thread other than the main one
rm -f /tmp/ev.rename
zernel-workload hog --name zt_rn --secs 120 --threads 2 --busy-pct 5 --rename zt_renamed --rename-when /tmp/ev.rename >/dev/null &
rn=$!
t0=$(uptime_s)
wait_until 5 sh -c "[ \$(ls /proc/$rn/task 2>/dev/null | wc -l) -ge 2 ]"
tid=$(other_tid "$rn")
sleep_until "$(awk -v t="$tid" -v t0="$t0" 'BEGIN { printf "%.2f", t0 + 12.6 * (0.75 + (t % 50) / 100) + 3 }')"
assert_eq "rename: the thread has no entry before" "$(ztask "$tid" class)" ""
touch /tmp/ev.rename
t1=$(uptime_s)
wait_until 3 ztask_is "$tid" class batch
echo "rename: $tid is $(cat "/proc/$rn/task/$tid/comm"), class '$(ztask "$tid" class)' $(secs_since "$t1") s after the rename"
assert_eq "rename: the renamed thread's rule is in the kernel within 3 s" "$(ztask "$tid" class)" batch
assert_eq "rename: the main thread keeps no entry" "$(ztask "$rn" class)" ""
kill "$rn" 2>/dev/null; wait "$rn" 2>/dev/null

# ---- cgroup move
CG=/sys/fs/cgroup/zt_ev_moved
mkdir -p "$CG"
zernel-workload hog --name zt_mv --secs 120 --busy-pct 5 >/dev/null &
mv=$!
t0=$(uptime_s)
sleep_until "$(awk -v p="$mv" -v t0="$t0" 'BEGIN { s = (p % 97) / 97 * 30; printf "%.2f", t0 + (s > 6 ? 3 : s + 3) }')"
assert_eq "cgroup move: the process has no entry before" "$(ztask "$mv" class)" ""
echo "$mv" >"$CG/cgroup.procs"
t1=$(uptime_s)
wait_until 3 ztask_is "$mv" class latency
echo "cgroup move: $mv is in $(cut -d: -f3 "/proc/$mv/cgroup"), class '$(ztask "$mv" class)' $(secs_since "$t1") s after the move"
assert_eq "cgroup move: the cgroup's rule is in the kernel within 3 s" "$(ztask "$mv" class)" latency
kill "$mv" 2>/dev/null; wait "$mv" 2>/dev/null
rmdir "$CG" 2>/dev/null

l3=$(metric proc_listings)
echo "listings over the case: $l0 -> $l3 (one every 150 s)"
assert_eq "no listing of /proc since start" "$l3" "$l0"

kill "$evt" 2>/dev/null; wait "$evt" 2>/dev/null
check "dmesg is clean" dmesg_clean
zernel_stop TERM
assert_eq "exit 0" "$ZRC" 0
finish
