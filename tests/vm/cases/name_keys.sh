#!/bin/sh
# vm: --smp 2 --mem 1G --timeout 300
#
# How soon a renamed thread gets its rule's class depends on two [observe]
# keys, and the kernel shows it. A rule gives class batch to "zt_after"; a
# hog renames itself to that 7 s after it starts (the daemon is running).
#  thread_name_interval_ms: a thread other than the main one is renamed.
#    Names are re-read 200 ms after a thread appears, then at doubling
#    intervals up to this key: with 1000 the rename reaches the kernel
#    within 3 s; with 30000 it does not (the next check is ~12.6 s after
#    start) but does later.
#  rescan_interval_ms: the main thread of a process is renamed; a process
#    that is not ML is looked at again (its main thread's stat) every
#    rescan_interval_ms. Name checks capped at an hour leave that as the
#    only quick way: with 1000 the rename reaches the kernel within 3 s,
#    with 30000 it does not.
# shellcheck disable=SC2317 source=tests/vm/guest-lib.sh
. "$(dirname "$0")/../guest-lib.sh"

W=/tmp/nk
mkdir -p "$W"
AFTER=7
# delay NAME THREADS [OBSERVE KEYS...] : runs the daemon with those keys,
# starts a hog with THREADS threads that renames after $AFTER s, and prints
# how long after the rename the renamed thread's entry (class batch)
# appeared, or "none" if not within 10 s.
delay() {
  name=$1 threads=$2
  shift 2
  {
    echo '[observe]'
    for kv in "$@"; do echo "$kv"; done
    printf '\n[[rules]]\ncomm = "^zt_after$"\nclass = "batch"\n'
  } >"$W/$name.toml"
  zernel_start "$W/$name.toml" >&2 || { echo fail; return; }
  zernel-workload hog --name zt_before --secs $((AFTER + 12)) --threads "$threads" \
    --rename zt_after --rename-after-ms $((AFTER * 1000)) &
  hog=$!
  t0=$(uptime_s)
  d=none
  while alive "$hog"; do
    now=$(uptime_s)
    el=$(awk -v a="$t0" -v b="$now" 'BEGIN { printf "%.1f", b - a - '"$AFTER"' }')
    for t in $(tids_by_comm zt_after); do
      if [ "$(ztask "$t" class)" = batch ]; then d=$el; break 2; fi
    done
    awk -v e="$el" 'BEGIN { exit !(e > 10) }' && break
    sleep 0.2
  done
  kill "$hog" 2>/dev/null; wait "$hog" 2>/dev/null
  zernel_stop TERM >&2
  echo "$d"
}
within() { [ "$1" != none ] && awk -v d="$1" -v m="$2" 'BEGIN { exit !(d <= m) }'; }
later() { [ "$1" = none ] || awk -v d="$1" -v m="$2" 'BEGIN { exit !(d > m) }'; }

d1=$(delay t1 2 "thread_name_interval_ms = 1000")
d2=$(delay t2 2 "thread_name_interval_ms = 30000")
echo "a renamed thread's class reached the kernel $d1 s after the rename with thread_name_interval_ms = 1000, $d2 s with 30000"
check "thread_name_interval_ms = 1000: within 3 s" within "$d1" 3
check "thread_name_interval_ms = 30000: not within 3 s" later "$d2" 3
check "thread_name_interval_ms = 30000: but at the next name check (within 10 s)" within "$d2" 10

d3=$(delay r1 1 "rescan_interval_ms = 1000" "thread_name_interval_ms = 3600000")
d4=$(delay r2 1 "rescan_interval_ms = 30000" "thread_name_interval_ms = 3600000")
echo "a renamed main thread's class reached the kernel $d3 s after the rename with rescan_interval_ms = 1000, $d4 s with 30000"
check "rescan_interval_ms = 1000: within 3 s" within "$d3" 3
check "rescan_interval_ms = 30000: not within 3 s" later "$d4" 3
check "dmesg is clean" dmesg_clean
finish
