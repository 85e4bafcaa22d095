#!/bin/sh
# vm: --smp 4 --mem 2G --timeout 1300
#
# Under emulation 60 s of churn create some 0.5-5 x 10^4 tasks, depending on
# the host's load (the count is printed); thread churn then goes on until
# 10^5 are reached, sized by count (some 80 s on an idle 2-CPU host; the
# bound, 15 minutes more, is for a host several times slower).
#
# Hardening: fork/exec churn with decisions for the churning tasks (no
# watchdog ejection, the task_class map's fill level stays bounded, no entry
# outlives its thread), PID reuse (a recycled PID starts in the default
# class), a config writable by others is refused as root, and SIGKILL of the
# daemon returns the kernel to its default scheduler with every task still
# running.
# shellcheck disable=SC2317 source=tests/vm/guest-lib.sh
. "$(dirname "$0")/../guest-lib.sh"

C=/tmp/hard.toml
cat >$C <<'TOML'
[[rules]]
comm = "^stress-ng"
class = "batch"

[[rules]]
comm = "^zt_churn$"
class = "batch"

[[rules]]
comm = "^zt_old$"
class = "batch"
TOML

# ---- a config others can write is refused (we are root) ----------------------------
cp $C /tmp/open.toml && chmod 666 /tmp/open.toml
out=$(scx_zernel --config /tmp/open.toml 2>&1); rc=$?
echo "$out"
assert_eq "group/world-writable config: exit 1" "$rc" 1
check "the error names the file and says why" sh -c "echo '$out' | grep -q '/tmp/open.toml: refusing'"
assert_eq "state never left disabled" "$(sched_state)" disabled

zernel_start $C || finish

# ---- fork/exec churn ------------------------------------------------------------------
# stress-ng's fork, vfork, clone and pthread workers create short-lived
# tasks (processes and threads) that the rule gives a decision when the
# daemon sees them.
# The fill level is bounded when the map holds entries only for live threads:
# each sample compares it with the number of tasks in the system (the
# kernel's count in /proc/loadavg, read before and after the map, the larger
# of the two).
max=0 max_tasks=0 excess=0
nr_tasks() { awk '{ split($4, a, "/"); print a[2] }' /proc/loadavg; }
sample_fill() {
  local t1 t2 n
  t1=$(nr_tasks)
  n=$(scx_zernel inspect 2>/dev/null | awk '$1 == "map_entries" { print $2 }')
  t2=$(nr_tasks)
  [ "$t2" -gt "$t1" ] && t1=$t2
  n=${n:-0}
  [ "$n" -gt "$max" ] && max=$n
  [ "$t1" -gt "$max_tasks" ] && max_tasks=$t1
  [ $((n - t1)) -gt "$excess" ] && excess=$((n - t1))
}
( stress-ng --fork 2 --vfork 2 --clone 2 --pthread 2 --timeout 60s --metrics-brief >/tmp/churn.out 2>&1 ) &
churn=$!
# Thread churn beside it: the cheapest task creation there is.
zernel-workload churn --secs 60 --threads 4 >/tmp/tchurn.out 2>&1 &
tchurn=$!
while alive "$churn"; do sample_fill; sleep 1; done
wait "$churn"; crc=$?
wait "$tchurn"; trc=$?
cat /tmp/churn.out /tmp/tchurn.out
assert_eq "stress-ng fork/exec churn exits 0" "$crc" 0
assert_eq "thread churn exits 0" "$trc" 0
tasks=$(awk '/miscellaneous/ { exit } $4 ~ /^(fork|vfork|clone|pthread)$/ && $5 ~ /^[0-9]+$/ { s += $5 }
  END { printf "%d\n", s }' /tmp/churn.out)
threads=$(awk '/churn created/ { print $4 }' /tmp/tchurn.out)
tasks=$((tasks + ${threads:-0}))
echo "short-lived tasks created in 60 s: $tasks (bogo ops of fork + vfork + clone + pthread, and ${threads:-0} churn threads)"
# Emulation runs every task creation tens of times slower than hardware:
# more thread churn until the 100,000 are reached (at most 900 s more).
if [ "$tasks" -lt 100000 ]; then
  zernel-workload churn --secs 900 --count $((100000 - tasks + 100)) --threads 4 >/tmp/tchurn2.out 2>&1 &
  tchurn=$!
  while alive "$tchurn"; do sample_fill; sleep 1; done
  wait "$tchurn"
  more=$(awk '/churn created/ { print $4 }' /tmp/tchurn2.out)
  tasks=$((tasks + ${more:-0}))
  echo "short-lived tasks created in all: $tasks (${more:-0} more churn threads)"
fi
assert_gt "the churn created over 100,000 short-lived tasks" "$tasks" 100000
cap=$(scx_zernel inspect | awk '$1 == "map_capacity" { print $2 }')
echo "task_class fill level: max $max of $cap during the churn; tasks in the system: max $max_tasks"
assert_gt "the map never filled (max $max < $cap)" "$cap" "$max"
# Entries of exited threads last until the daemon's next pass sees them gone
# (one pass can take seconds under emulation while thousands of threads
# exit): the fill level follows the live tasks, never the tasks created.
echo "largest excess of entries over live tasks in one sample: $excess"
assert_ge "entries of exited threads never outnumbered the live tasks (excess $excess <= $max_tasks)" "$max_tasks" "$excess"
assert_ge "the fill level stayed within 1.5 x the peak of live tasks (max $max, $max_tasks tasks)" $((max_tasks * 3 / 2)) "$max"
assert_gt "decisions were written for churning tasks (batch enqueues)" "$(zcounter batch enqueued)" 0
assert_eq "still attached after the churn" "$(sched_state)" enabled
# leaked_entries : how many entries the kernel holds for threads that no
# longer exist (into LEAKED; the daemon's next pass removes what exit_task
# could not).
leaked_entries() {
  LEAKED=0
  for e in $(scx_zernel inspect --entries | sed 's/^tid=\([0-9]*\).*/\1/'); do
    [ -d "/proc/$e" ] || [ -n "$(ls -d /proc/[0-9]*/task/"$e" 2>/dev/null)" ] || LEAKED=$((LEAKED + 1))
  done
  [ "$LEAKED" -eq 0 ]
}
wait_until 30 leaked_entries
leaked=$LEAKED
echo "entries after the load: $(scx_zernel inspect --entries | wc -l), for threads that no longer exist: $leaked"
assert_eq "no leaked entries after the load ends" "$leaked" 0
assert_gt "exit_task deleted entries" "$(zglobal exit_del)" 0

# ---- PID reuse ----------------------------------------------------------------------------
echo 1000 >/proc/sys/kernel/pid_max
zernel-workload hog --name zt_old --secs 30 &
old=$!
is_batch() { [ "$(ztask "$old" class)" = batch ]; }
wait_until 10 is_batch
assert_eq "the old task $old holds class batch" "$(ztask "$old" class)" batch
kill "$old"; wait "$old" 2>/dev/null
# Spawn until the PID comes round again (pid_max is small).
new="" i=0
while [ $i -lt 3000 ]; do
  sleep 5 &
  p=$!
  if [ "$p" = "$old" ]; then new=$p; break; fi
  kill "$p" 2>/dev/null; wait "$p" 2>/dev/null
  i=$((i + 1))
done
assert_eq "PID $old was recycled by a new task" "$new" "$old"
sleep 1
assert_eq "the recycled PID starts in the default class (no entry)" "$(ztask "$old" class)" ""
kill "$new" 2>/dev/null; wait "$new" 2>/dev/null

# ---- SIGKILL of the daemon ------------------------------------------------------------------
zernel-workload hog --name survivor --secs 30 --threads 2 &
surv=$!
sleep 1
kill -KILL "$ZPID"; wait "$ZPID" 2>/dev/null; ZPID=""
back() { [ "$(sched_state)" = disabled ]; }
wait_until 10 back
assert_eq "SIGKILL: the kernel is back on its default scheduler" "$(sched_state)" disabled
t0=$(sed 's/.*) //' /proc/$surv/stat | awk '{ print $12 + $13 }')
sleep 2
t1=$(sed 's/.*) //' /proc/$surv/stat | awk '{ print $12 + $13 }')
check "tasks keep running after SIGKILL" alive "$surv"
assert_gt "the survivor kept using CPU ($((t1 - t0)) ticks in 2 s)" $((t1 - t0)) 50
kill "$surv"; wait "$surv" 2>/dev/null
check "dmesg is clean" dmesg_clean
finish
