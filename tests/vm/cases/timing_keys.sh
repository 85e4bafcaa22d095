#!/bin/sh
# vm: --smp 2 --mem 1G --timeout 400
#
# Three [observe] keys decide how soon a change in a thread reaches the
# kernel. Each runs at a short and a long value; the workload starts after
# the daemon attached, changes at a time chosen from the daemon's schedule
# for it, and the time from the change until the kernel holds the expected
# class is measured. Rules give class batch to the name "zt_after" and to
# the cgroup /zt_rescan. The name and cgroup runs set process_events =
# false: with the kernel's events (proc_events.sh) a rename or a move is
# read at the next pass whatever the intervals, which only reconcile.
#  thread_name_interval_ms: a thread other than the main one renames itself
#    to zt_after. Its name is re-read 0.2, 0.6, 1.4, 3.0, 6.2, 12.6,
#    25.4 s... after the daemon sees it (each interval doubling up to the
#    key, times a jitter j = 0.75 + (tid % 50) / 100); the rename comes 3 s
#    after the 12.6 j check. With 1000 it reaches the kernel within 3 s;
#    with 30000 not within 3 s (no check until 25.4 j), but at that check.
#  rescan_interval_ms: a process that is not ML is moved to /zt_rescan.
#    Its cgroup is re-read every rescan_interval_ms, the first time
#    (pid % 97) / 97 of an interval after the daemon sees it; the move comes
#    3 s after that first rescan if it falls in the first half of the
#    interval, else 3 s after start. With 1000 the class reaches the kernel
#    within 3 s; with 30000 not within 3 s.
#  quiet_sample_interval_ms: a pool thread of an ML process, asleep for 7 s
#    (held back as quiet after 1 s), starts reading fast (in-process
#    DataLoading, class ml). Its process's CPU time is checked every
#    quiet_sample_interval_ms for activity its sampled threads do not
#    account for: with 500 the thread is sampled again and its entry comes
#    within 3 s; with 60000 not within 5 s. That is with thread_counters =
#    "proc" (the default). With "kernel" (the BPF task iterator reports
#    every thread's counters each pass) the thread is sampled in the first
#    pass after it was active: within 3 s even with 60000, and the log says
#    so.
# Each run sets D (seconds, "none" past its limit, "fail" if the daemon did
# not attach) in this shell, not in a $(...) subshell, so that the checks
# of zernel_start and the daemon's exit status count.
# shellcheck disable=SC2317 source=tests/vm/guest-lib.sh
. "$(dirname "$0")/../guest-lib.sh"

W=/tmp/tk
CG=/sys/fs/cgroup/zt_rescan
mkdir -p "$W" "$CG"

# start_daemon NAME [OBSERVE KEYS...]
start_daemon() {
  name=$1
  shift
  {
    # No class for ML threads in no phase: the pool thread's class must come
    # from its phase, when the daemon samples it.
    printf '[policy]\nml_unknown = "none"\n\n'
    echo '[observe]'
    for kv in "$@"; do echo "$kv"; done
    printf '\n[[rules]]\ncomm = "^zt_after$"\nclass = "batch"\n'
    printf '\n[[rules]]\ncgroup = "^/zt_rescan$"\nclass = "batch"\n'
  } >"$W/$name.toml"
  zernel_start "$W/$name.toml"
}
# entry_after T0 LIMIT TID CLASS : seconds from uptime T0 until the kernel
# holds CLASS for TID, or "none" after LIMIT s.
entry_after() {
  while :; do
    _el=$(awk -v a="$1" -v b="$(uptime_s)" 'BEGIN { printf "%.1f", b - a }')
    if [ "$(ztask "$3" class)" = "$4" ]; then echo "$_el"; return; fi
    if awk -v e="$_el" -v l="$2" 'BEGIN { exit !(e > l) }'; then echo none; return; fi
    sleep 0.2
  done
}
# within D S, later D S : D is a number of seconds or "none" (not by the
# limit); anything else ("fail": no daemon) satisfies neither.
is_secs() { case $1 in '' | *[!0-9.]*) return 1 ;; esac; }
within() { is_secs "$1" && awk -v d="$1" -v m="$2" 'BEGIN { exit !(d <= m) }'; }
later() { [ "$1" = none ] || { is_secs "$1" && awk -v d="$1" -v m="$2" 'BEGIN { exit !(d > m) }'; }; }
# stop_daemon RUN : SIGTERM, and its exit status asserted.
stop_daemon() {
  zernel_stop TERM
  assert_eq "$1: the daemon exits 0" "$ZRC" 0
}

# name_run CAP_MS : the delay for a renamed non-main thread.
name_run() {
  start_daemon "n$1" "thread_name_interval_ms = $1" "process_events = false" || { D=fail; return; }
  rm -f "$W/go"
  zernel-workload hog --name zt_before --secs 60 --threads 2 --rename zt_after --rename-when "$W/go" &
  hog=$!
  t0=$(uptime_s)
  wait_until 5 sh -c "[ \$(ls /proc/$hog/task 2>/dev/null | wc -l) -ge 2 ]"
  tid=$(other_tid "$hog")
  at=$(awk -v t="$tid" -v t0="$t0" 'BEGIN { j = 0.75 + (t % 50) / 100; printf "%.2f", t0 + 12.6 * j + 3 }')
  sleep_until "$at"
  : >"$W/go"
  D=$(entry_after "$(uptime_s)" 18 "$tid" batch)
  kill "$hog" 2>/dev/null; wait "$hog" 2>/dev/null
  check "thread_name_interval_ms = $1: the daemon says process events are off" grep -q "process events: off" "$ZLOG"
  stop_daemon "thread_name_interval_ms = $1"
}

# rescan_run INTERVAL_MS : the delay for a process moved to /zt_rescan.
rescan_run() {
  start_daemon "r$1" "rescan_interval_ms = $1" "process_events = false" || { D=fail; return; }
  zernel-workload hog --name zt_moved --secs 60 &
  hog=$!
  t0=$(uptime_s)
  at=$(awk -v p="$hog" -v i="$1" -v t0="$t0" 'BEGIN { s = (p % 97) / 97 * i / 1000
    printf "%.2f", t0 + (s <= i / 2000 ? s + 3 : 3) }')
  sleep_until "$at"
  echo "$hog" >"$CG/cgroup.procs"
  D=$(entry_after "$(uptime_s)" 10 "$hog" batch)
  kill "$hog" 2>/dev/null; wait "$hog" 2>/dev/null
  stop_daemon "rescan_interval_ms = $1"
}

# quiet_run INTERVAL_MS COUNTERS : the delay for a quiet pool thread that
# starts loading, with thread_counters = COUNTERS.
quiet_run() {
  start_daemon "q$1$2" "quiet_sample_interval_ms = $1" "thread_counters = \"$2\"" || { D=fail; return; }
  SRC=$(grep -o "threads' counters from [a-z/]*" "$ZLOG" | head -n 1)
  RANK=0 zernel-workload reader --name zt_qmain --secs 30 --thread zt_pool --start-ms 7000 &
  pid=$!
  t0=$(uptime_s)
  wait_until 5 sh -c "[ \$(ls /proc/$pid/task 2>/dev/null | wc -l) -ge 2 ]"
  tid=$(other_tid "$pid")
  D=$(entry_after "$(awk -v t="$t0" 'BEGIN { print t + 7 }')" 10 "$tid" ml)
  kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
  stop_daemon "quiet_sample_interval_ms = $1, thread_counters = \"$2\""
}

name_run 1000; d1=$D
name_run 30000; d2=$D
echo "a renamed thread's class reached the kernel $d1 s after the rename with thread_name_interval_ms = 1000, $d2 s with 30000"
check "thread_name_interval_ms = 1000: within 3 s" within "$d1" 3
check "thread_name_interval_ms = 30000: not within 3 s" later "$d2" 3
check "thread_name_interval_ms = 30000: but at the next name check (within 18 s)" within "$d2" 18

rescan_run 1000; d3=$D
rescan_run 30000; d4=$D
echo "a process moved to a rule's cgroup got its class $d3 s later with rescan_interval_ms = 1000, $d4 s with 30000"
check "rescan_interval_ms = 1000: within 3 s" within "$d3" 3
check "rescan_interval_ms = 30000: not within 3 s" later "$d4" 3

quiet_run 500 proc; d5=$D
assert_eq "thread_counters = \"proc\": the daemon says so" "$SRC" "threads' counters from /proc"
quiet_run 60000 proc; d6=$D
quiet_run 60000 kernel; d7=$D
assert_eq "thread_counters = \"kernel\": the daemon says so" "$SRC" "threads' counters from the"
echo "a quiet pool thread that started reading got class ml $d5 s later with quiet_sample_interval_ms = 500, $d6 s with 60000 (thread_counters = \"proc\"); $d7 s with 60000 and \"kernel\""
check "quiet_sample_interval_ms = 500: within 3 s" within "$d5" 3
check "quiet_sample_interval_ms = 60000: not within 5 s" later "$d6" 5
check "thread_counters = \"kernel\", quiet_sample_interval_ms = 60000: within 3 s" within "$d7" 3
rmdir "$CG" 2>/dev/null
check "dmesg is clean" dmesg_clean
finish
