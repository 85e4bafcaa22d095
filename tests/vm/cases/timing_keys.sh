#!/bin/sh
# vm: --smp 2 --mem 1G --timeout 300
#
# Three [observe] keys decide how soon a change in a thread reaches the
# kernel. Each is run at a short and a long value; a workload started after
# the daemon attached changes AFTER s in (the daemon has been watching it),
# and the time until the kernel holds the expected class is measured.
#  thread_name_interval_ms: a thread other than the main one renames itself
#    to "zt_after" (a rule: class batch) at 15 s. Names are re-read 200 ms
#    after the daemon sees a thread (within a second or two of its start),
#    then at doubling intervals up to this key: 0.2, 0.6, 1.4, 3.0, 6.2,
#    12.6, 25.4 s... With 1000 the rename reaches the kernel within 3 s;
#    with 30000 it does not (no check between 12.6 and 25.4 s) but does at
#    the next check.
#  rescan_interval_ms: the main thread of a process renames itself at 15 s; a
#    process that is not ML is looked at again (its main thread's stat)
#    every rescan_interval_ms. With name checks capped at an hour that is
#    the only quick way: with 1000 the rename reaches the kernel within
#    3 s, with 30000 it does not.
#  quiet_sample_interval_ms: a pool thread of an ML process, asleep for 7 s
#    (held back as quiet after 1 s), starts reading fast (in-process
#    DataLoading, class ml). Its process's CPU time is checked every
#    quiet_sample_interval_ms for activity its sampled threads do not
#    account for: with 500 the thread is sampled again and its entry comes
#    within 3 s; with 60000 not within 5 s.
# shellcheck disable=SC2317 source=tests/vm/guest-lib.sh
. "$(dirname "$0")/../guest-lib.sh"

W=/tmp/tk
mkdir -p "$W"
# delay NAME COMM CLASS CMD [OBSERVE KEYS...] : runs the daemon with those
# keys and a rule giving class batch to "zt_after", starts CMD (which
# changes after $AFTER s), and prints how long after the change a thread
# named COMM got class CLASS in the kernel, or "none" if not within 15 s.
delay() {
  name=$1 comm=$2 class=$3 cmd=$4
  shift 4
  {
    echo '[observe]'
    for kv in "$@"; do echo "$kv"; done
    printf '\n[[rules]]\ncomm = "^zt_after$"\nclass = "batch"\n'
  } >"$W/$name.toml"
  zernel_start "$W/$name.toml" >&2 || { echo fail; return; }
  # shellcheck disable=SC2086
  $cmd &
  pid=$!
  t0=$(uptime_s)
  d=none
  while alive "$pid"; do
    el=$(awk -v a="$t0" -v b="$(uptime_s)" 'BEGIN { printf "%.1f", b - a - '"$AFTER"' }')
    for t in $(tids_by_comm "$comm"); do
      if [ "$(ztask "$t" class)" = "$class" ]; then d=$el; break 2; fi
    done
    awk -v e="$el" 'BEGIN { exit !(e > 15) }' && break
    sleep 0.2
  done
  kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
  zernel_stop TERM >&2
  echo "$d"
}
within() { [ "$1" != none ] && awk -v d="$1" -v m="$2" 'BEGIN { exit !(d <= m) }'; }
later() { [ "$1" = none ] || awk -v d="$1" -v m="$2" 'BEGIN { exit !(d > m) }'; }

AFTER=15 SECS=32
RENAME="zernel-workload hog --name zt_before --secs $SECS --rename zt_after --rename-after-ms $((AFTER * 1000))"
d1=$(delay t1 zt_after batch "$RENAME --threads 2" "thread_name_interval_ms = 1000")
d2=$(delay t2 zt_after batch "$RENAME --threads 2" "thread_name_interval_ms = 30000")
echo "a renamed thread's class reached the kernel $d1 s after the rename with thread_name_interval_ms = 1000, $d2 s with 30000"
check "thread_name_interval_ms = 1000: within 3 s" within "$d1" 3
check "thread_name_interval_ms = 30000: not within 3 s" later "$d2" 3
check "thread_name_interval_ms = 30000: but at the next name check (within 15 s)" within "$d2" 15

d3=$(delay r1 zt_after batch "$RENAME --threads 1" "rescan_interval_ms = 1000" "thread_name_interval_ms = 3600000")
d4=$(delay r2 zt_after batch "$RENAME --threads 1" "rescan_interval_ms = 30000" "thread_name_interval_ms = 3600000")
echo "a renamed main thread's class reached the kernel $d3 s after the rename with rescan_interval_ms = 1000, $d4 s with 30000"
check "rescan_interval_ms = 1000: within 3 s" within "$d3" 3
check "rescan_interval_ms = 30000: not within 3 s" later "$d4" 3

AFTER=7 SECS=20
POOL="env RANK=0 zernel-workload reader --name zt_qmain --secs $SECS --thread zt_pool --start-ms $((AFTER * 1000))"
d5=$(delay q1 zt_pool ml "$POOL" "quiet_sample_interval_ms = 500")
d6=$(delay q2 zt_pool ml "$POOL" "quiet_sample_interval_ms = 60000")
echo "a quiet pool thread that started reading got class ml $d5 s later with quiet_sample_interval_ms = 500, $d6 s with 60000"
check "quiet_sample_interval_ms = 500: within 3 s" within "$d5" 3
check "quiet_sample_interval_ms = 60000: not within 5 s" later "$d6" 5
check "dmesg is clean" dmesg_clean
finish
