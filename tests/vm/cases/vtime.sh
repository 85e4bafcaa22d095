#!/bin/sh
# vm: --smp 2 --mem 1G --timeout 400
#
# Order inside a class queue: task vtime (CPU time weighted by nice), with a
# sleeper's credit bounded by one class slice, not the order of arrival.
# Wakeup preemption is off (scheduler.wakeup_preempt_us = 0), so only the
# queue order is measured. The figures are the kernel's schedstat (time on a
# CPU, time waiting, timeslices), per thread.
#
# 1. Sleeper credit. cyclictest (SCHED_OTHER, one thread waking every 2 ms)
#    beside 6 stress-ng CPU hogs on 2 vCPUs, all in the normal class. A FIFO
#    queues each wakeup behind every hog's slice, so the sleeper waits as
#    long per timeslice as a hog does; in vtime order it passes them. Check:
#    its wait per timeslice is under half the hogs'. Control: the hogs do
#    wait (>= 2 ms per timeslice), and the sleeper ran >= 400 timeslices.
# 2. Nice. Two stress-ng hogs at nice 0 and two at nice 10 on 2 vCPUs, one
#    queue. Weighted vtime gives the nice-0 hogs ~9x the CPU (the kernel's
#    weights 1024 and 110); a FIFO gives each the same. With two hogs
#    running and two queued, a CPU whose hog's slice ends must compare that
#    hog with the queue before it is queued again (keep_prev): serving the
#    queue's head unconditionally hands the CPU to a nice-10 hog whenever
#    both nice-0 ones run, about 2x instead of 9x. Check: nice 0 gets > 5x
#    the CPU of nice 10, and the normal class's kept counter moved.
#    Control: the kernel holds the nice values (0 for two workers, 10 for
#    the two reniced).
# shellcheck disable=SC2317 source=tests/vm/guest-lib.sh
. "$(dirname "$0")/../guest-lib.sh"

printf '[scheduler]\nwakeup_preempt_us = 0\n' >/tmp/vtime.toml
zernel_start /tmp/vtime.toml || finish

# children PID : the PIDs of PID's child processes (stress-ng's workers).
children() {
  awk -v p="$1" 'FNR == 1 { sub(/.*\) /, ""); split($0, f, " "); if (f[2] == p) { n = split(FILENAME, d, "/"); print d[3] } }' \
    /proc/[0-9]*/stat 2>/dev/null
}
nchildren() { [ "$(children "$1" | wc -l)" -ge "$2" ]; }

# ---- 1. sleeper credit -------------------------------------------------------
stress-ng --cpu 6 --timeout 300s --quiet --temp-path /tmp &
hogs=$!
cyclictest -q -t 1 -i 2000 -D 300 >/dev/null 2>&1 &
ct=$!
wait_until 30 nchildren "$hogs" 6
hp=$(children "$hogs" | tr '\n' ' ')
# shellcheck disable=SC2086 # PIDs, one word each
assert_eq "6 stress-ng workers run" "$(echo $hp | wc -w)" 6
ct_threads() { [ "$(ls /proc/"$ct"/task 2>/dev/null | wc -l)" -ge 2 ]; }
wait_until 30 ct_threads
pol=$(for t in /proc/"$ct"/task/*; do stat_of "$ct/task/${t##*/}" 41; done | sort -u | tr '\n' ' ')
assert_eq "control: cyclictest's threads are SCHED_OTHER (an RT thread would bypass the scheduler)" "$pol" "0 "
n0=$(zcounter normal enqueued)
# shellcheck disable=SC2086
h0=$(sched_sum $hp) s0=$(sched_sum "$ct")
# Sized by count: 400 of the sleeper's timeslices, however slow the host.
slices_done() { [ $(($(field "$(sched_sum "$ct")" 3) - $(field "$s0" 3))) -ge 400 ]; }
wait_until 240 slices_done
# shellcheck disable=SC2086
h1=$(sched_sum $hp) s1=$(sched_sum "$ct")
sn=$(($(field "$s1" 3) - $(field "$s0" 3))) hn=$(($(field "$h1" 3) - $(field "$h0" 3)))
sw=$(( ($(field "$s1" 2) - $(field "$s0" 2)) / 1000 / (sn > 0 ? sn : 1) ))
hw=$(( ($(field "$h1" 2) - $(field "$h0" 2)) / 1000 / (hn > 0 ? hn : 1) ))
echo "cyclictest beside 6 hogs on 2 vCPUs: $sn timeslices, ${sw} us waited per timeslice; hogs: $hn timeslices, ${hw} us per timeslice"
assert_gt "the normal class queued tasks (enqueued counter moved)" "$(zcounter normal enqueued)" "$n0"
assert_ge "control: the sleeper ran 400 timeslices" "$sn" 400
assert_ge "control: the hogs waited >= 2 ms per timeslice (${hw} us)" "$hw" 2000
assert_gt "a waking sleeper waits under half as long per timeslice as a hog (${sw} us vs ${hw} us)" "$hw" $((sw * 2))
kill "$hogs" "$ct" 2>/dev/null
wait "$hogs" "$ct" 2>/dev/null

# ---- 2. nice -------------------------------------------------------------------
stress-ng --cpu 2 --timeout 300s --quiet --temp-path /tmp &
a=$!
stress-ng --cpu 2 --timeout 300s --quiet --temp-path /tmp &
b=$!
wait_until 30 nchildren "$a" 2
wait_until 30 nchildren "$b" 2
ap=$(children "$a" | tr '\n' ' ') bp=$(children "$b" | tr '\n' ' ')
# shellcheck disable=SC2086 # PIDs, one word each
renice -n 10 -p $bp >/dev/null
an=$(for p in $ap; do stat_of "$p" 19; done | sort -u | tr '\n' ' ')
bn=$(for p in $bp; do stat_of "$p" 19; done | sort -u | tr '\n' ' ')
assert_eq "control: the first two workers run at nice 0" "$an" "0 "
assert_eq "control: the other two at nice 10" "$bn" "10 "
k0=$(zcounter normal kept)
# shellcheck disable=SC2086
a0=$(sched_sum $ap) b0=$(sched_sum $bp)
# Sized by count: 8 s of CPU time between them.
cpu_done() {
  # shellcheck disable=SC2086
  [ $(( $(field "$(sched_sum $ap)" 1) - $(field "$a0" 1) + $(field "$(sched_sum $bp)" 1) - $(field "$b0" 1) )) -ge 8000000000 ]
}
wait_until 240 cpu_done
# shellcheck disable=SC2086
a1=$(sched_sum $ap) b1=$(sched_sum $bp)
ams=$(( ($(field "$a1" 1) - $(field "$a0" 1)) / 1000000 )) bms=$(( ($(field "$b1" 1) - $(field "$b0" 1)) / 1000000 ))
echo "two hogs at nice 0 and two at nice 10 on 2 vCPUs: nice 0 ran ${ams} ms, nice 10 ${bms} ms"
assert_ge "control: 8 s of CPU time measured" $((ams + bms)) 7900
assert_gt "nice 0 gets over 5x the CPU of nice 10 (${ams} ms vs ${bms} ms)" "$ams" $((bms * 5))
assert_gt "the normal class kept hogs on their CPUs at slice ends (kept counter moved)" "$(zcounter normal kept)" "${k0:-0}"
kill "$a" "$b" 2>/dev/null
wait "$a" "$b" 2>/dev/null

check "dmesg is clean" dmesg_clean
check "scx_zernel is still running" alive "$ZPID"
zernel_stop INT
assert_eq "SIGINT: scx_zernel exits 0" "$ZRC" 0
finish
