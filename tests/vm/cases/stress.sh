#!/bin/sh
# vm: --smp 4 --mem 2G --timeout 420
#
# Survive the churn scx CI puts schedulers through: CPU hogs, fork storms and
# affinity changes, spread over three classes, for 30 s. Afterwards the
# scheduler is still attached, the daemon alive, the kernel log clean, and
# SIGINT detaches it with exit 0. Then the starvation bound: with every CPU
# taken by latency-class hogs, a batch-class hog still gets CPU time, served
# by the bound. Then the class order at slice ends: with an ml-class hog on
# every CPU, normal-class hogs get only what the bound serves them, and the
# daemon (latency class) does not wait for it. Then wakeup preemption:
# sleepers cut normal-class hogs short, with the normal queue crowded too
# (twice as many hogs as CPUs), and do not when
# scheduler.wakeup_preempt_us = 0; ml threads that sleep between 20 ms bursts
# (stress-ng --cpu-load) cut them short too, but not hogs of their own class;
# beside one of those they take a normal hog's CPU further afield.
# shellcheck source=tests/vm/guest-lib.sh
. "$(dirname "$0")/../guest-lib.sh"

# stress-ng names its workers stress-ng-<stressor> (cut to 15 characters).
cat >/tmp/stress.toml <<'TOML'
[[rules]]
comm = "^stress-ng-cpu$"
class = "batch"

[[rules]]
comm = "^stress-ng-affin"
class = "ml"

[[rules]]
comm = "^stress-ng-fork$"
class = "latency"

[[rules]]
comm = "^zt_top$"
class = "latency"

[[rules]]
comm = "^zt_low$"
class = "batch"

[[rules]]
comm = "^zt_mlhog$"
class = "ml"
TOML

zernel_start /tmp/stress.toml || finish

stress-ng --cpu 4 --fork 4 --affinity 4 --timeout 30s --metrics-brief
assert_eq "stress-ng exits 0" "$?" 0

assert_eq "state is still enabled" "$(sched_state)" enabled
check "scx_zernel is still running" alive "$ZPID"
# Only rules put tasks in these three classes (normal is the default, so a
# count there would prove nothing).
for c in batch ml latency; do
  n=$(zcounter "$c" enqueued)
  assert_gt "$c enqueued > 0 ($n)" "$n" 0
done
n=$(zcounter_sum dispatched)
assert_gt "tasks were dispatched ($n)" "$n" 0
check "dmesg is clean under load" dmesg_clean

# ---- starvation bound ---------------------------------------------------------
# Long enough to outlive the measurement however slow the host (killed
# after it): a process gone by then has no /proc/PID/stat to read.
zernel-workload hog --name zt_top --threads 8 --secs 120 &
top=$!
zernel-workload hog --name zt_low --secs 120 &
low=$!
# shellcheck disable=SC2317 # called by wait_until
cls() { [ "$(ztask "$1" class)" = "$2" ]; }
wait_until 10 cls "$low" batch
assert_eq "zt_low holds class batch" "$(ztask "$low" class)" batch
starved0=$(zcounter batch starved)
ticks() { sed 's/.*) //' "/proc/$1/stat" | awk '{ print $12 + $13 }'; }
l0=$(ticks "$low") t0=$(ticks "$top")
sleep 5
l1=$(ticks "$low") t1=$(ticks "$top")
starved1=$(zcounter batch starved)
check "both hogs were alive through the 5 s measured" sh -c "[ -n '$l0' ] && [ -n '$l1' ] && [ -n '$t0' ] && [ -n '$t1' ]"
echo "5 s with 8 latency-class hogs on 4 CPUs: zt_top $((t1 - t0)) ticks, zt_low (batch) $((l1 - l0)) ticks; batch starved-dispatches $starved0 -> $starved1"
assert_gt "the batch hog got CPU time under latency-class saturation" $((l1 - l0)) 10
assert_gt "the starvation bound served batch (starved counter grew)" "$starved1" "$starved0"
assert_gt "the latency hogs kept most of the CPU" $((t1 - t0)) $(( (l1 - l0) * 4 ))
kill "$top" "$low" 2>/dev/null; wait "$top" "$low" 2>/dev/null

# ---- class order at slice ends ------------------------------------------------
# One ml-class hog per CPU (a rule), and 4 normal-class hogs. When an ml hog's
# slice ends, the other ml hogs run and the ml queue is empty: the task at its
# slice end ranks as if it were queued, so it keeps its CPU, and the normal
# hogs run only when the starvation bound serves them: their dispatches are
# the bound's (normal dispatched - normal starved stays small; were slice ends
# to hand the CPU down, most would come from the class order). The tick ratio
# is printed, not judged: what the bound serves depends on how the host runs
# the vCPUs. The daemon's own threads run in the latency class: beside them
# its passes do not wait for the bound either (its run-queue wait per run,
# from /proc/PID/schedstat).
zernel-workload hog --name zt_mlhog --threads 4 --secs 120 &
mlh=$!
zernel-workload hog --name zt_nhog --threads 4 --secs 120 &
nh=$!
wait_until 10 cls "$mlh" ml
assert_eq "zt_mlhog holds class ml" "$(ztask "$mlh" class)" ml
m0=$(ticks "$mlh") n0=$(ticks "$nh") snap=$(scx_zernel inspect)
k0=$(zcounter ml kept "$snap") s0=$(zcounter normal starved "$snap") nd0=$(zcounter normal dispatched "$snap")
read -r dr0 dw0 dn0 <<STAT
$(sched_sum "$ZPID")
STAT
sleep 5
m1=$(ticks "$mlh") n1=$(ticks "$nh") snap=$(scx_zernel inspect)
k1=$(zcounter ml kept "$snap") s1=$(zcounter normal starved "$snap") nd1=$(zcounter normal dispatched "$snap")
read -r dr1 dw1 dn1 <<STAT
$(sched_sum "$ZPID")
STAT
druns=$((dn1 - dn0))
dwait=$(( (dw1 - dw0) / (druns > 0 ? druns : 1) / 1000 ))
echo "5 s, 4 ml-class and 4 normal-class hogs on 4 CPUs: ml $((m1 - m0)) ticks, normal $((n1 - n0)) ticks; ml kept $k0 -> $k1; normal starved $s0 -> $s1, dispatched $nd0 -> $nd1; the daemon: $druns runs, $(( (dr1 - dr0) / 1000000 )) ms on a CPU, $dwait us waited per run"
assert_gt "ml slice ends kept the CPU (ml kept counter grew)" "$k1" "$k0"
nstarved=$((s1 - s0)) norder=$((nd1 - nd0 - (s1 - s0)))
echo "normal-class dispatches in those 5 s: $nstarved by the starvation bound, $norder by the class order; ticks ml : normal = $(( (m1 - m0) / ((n1 - n0) > 0 ? n1 - n0 : 1) )) : 1"
assert_gt "the starvation bound served the normal hogs (> 5 ticks)" $((n1 - n0)) 5
assert_gt "the starvation bound served them (starved counter grew)" "$nstarved" 0
check "the normal hogs ran by the bound, not at ml slice ends (class-order dispatches $norder <= bound's $nstarved / 4)" [ $((norder * 4)) -le "$nstarved" ]
assert_gt "the daemon ran in those 5 s" "$druns" 0
check "the daemon waited under 4 ms per run ($dwait us)" [ "$dwait" -lt 4000 ]
kill "$mlh" "$nh" 2>/dev/null; wait "$mlh" "$nh" 2>/dev/null

# ---- wakeup preemption --------------------------------------------------------
# Normal-class hogs on every CPU and threads that wake every 2 ms and sleep
# again at once (the default class for both: no rule). With
# scheduler.wakeup_preempt_us at its default, the sleepers' wakeups cut the
# hogs short; with 0, no wakeup does, and the sleepers wait for slices to end.
# wake_round [HOGS] : 5 s of that load (HOGS hogs, default 4); prints the
# normal class's wake_preempt delta, then wake_afield's (wakeups that took a
# CPU other than their waker's and their own).
wake_round() {
  local h s w0 a0
  zernel-workload hog --name zt_hog --threads "${1:-4}" --secs 30 &
  h=$!
  zernel-workload threads --count 4 --wake-ms 2 --secs 30 >/dev/null &
  s=$!
  sleep 1
  w0=$(zcounter normal wake_preempt) a0=$(zglobal wake_afield)
  sleep 5
  echo $(($(zcounter normal wake_preempt) - w0)) $(($(zglobal wake_afield) - a0))
  kill "$h" "$s" 2>/dev/null; wait "$h" "$s" 2>/dev/null
}
read -r w_on a_on <<EOF
$(wake_round)
EOF
echo "5 s of 2 ms sleepers beside 4 normal-class hogs: $w_on wakeups preempted a hog (wakeup_preempt_us = 1000)"
assert_gt "wakeups of short-burst sleepers preempted hogs of their class" "${w_on:-0}" 100
# 8 hogs on 4 CPUs: 4 or more always wait in the normal queue (as many as
# there are CPUs: crowded). A sleeper's wakeup, which would head that queue
# (a sleeper's vtime credit), still cuts a hog short: more than a fifth as
# often as beside 4 hogs (where a crowded queue turned preemption off, about
# a fortieth as often: only in the moments the queue held fewer).
# With the queue crowded, a sleeper whose waker's and own CPUs run no
# hog looks further afield for one (a wait in that queue lasts a slice):
# wake_afield moves by more than beside 4 hogs, where a normal wakeup never
# looks further (only the daemon's own, in the latency class, may).
read -r w_crowd a_crowd <<EOF
$(wake_round 8)
EOF
echo "the same beside 8 normal-class hogs (the queue crowded): $w_crowd wakeups preempted a hog, $a_crowd further afield than the waker's and their own CPU (beside 4 hogs: $a_on)"
assert_gt "with the queue crowded, short-burst sleepers still preempted hogs (> $w_on / 5)" \
  "$((${w_crowd:-0} * 5))" "${w_on:-0}"
assert_gt "with the queue crowded, sleepers took a hog's CPU further afield (> 10 + $a_on beside 4 hogs)" \
  "${a_crowd:-0}" "$((${a_on:-0} + 10))"
zernel_stop INT
assert_eq "SIGINT: scx_zernel exits 0" "$ZRC" 0
assert_eq "state is disabled after exit" "$(sched_state)" disabled
check "dmesg is clean after detach" dmesg_clean

printf '[scheduler]\nwakeup_preempt_us = 0\n' >/tmp/nowake.toml
zernel_start /tmp/nowake.toml || finish
read -r w_off _ <<EOF
$(wake_round)
EOF
echo "the same with wakeup_preempt_us = 0: $w_off wakeups preempted a hog"
assert_eq "wakeup_preempt_us = 0 reaches the kernel: no wakeup preempts" "$w_off" 0
zernel_stop INT
assert_eq "SIGINT: scx_zernel exits 0" "$ZRC" 0

# ---- wakeup preemption by threads that run in long bursts -------------------------
# stress-ng's cpu stressor at 50 % load in 20 ms slices runs 20 ms, then
# sleeps about as long: bursts far above wakeup_preempt_us (1000), like
# schbench's workers under emulation or a DataLoader worker between batches.
# A rule puts its workers in the ml class (no preempt flag: a rule sets none),
# so the ml class's wake_preempt counts their wakeups alone; 4 hogs fill every
# CPU. With normal-class hogs, their wakeups take a hog's CPU like any other.
# With the hogs in the ml class too (a second rule), they do not: in the
# latency and ml classes a wakee that is a hog itself cuts short only a lower
# class (a DataLoader worker does not cut its own trainer short).
# split: CPUs 0-1 run 2 ml-class hogs, CPUs 2-3 2 normal-class ones (taskset).
# A worker that last ran on CPU 0 or 1 (where its class's queue order put it)
# wakes there beside an ml hog it may not cut short: it takes a normal hog's
# CPU further afield (wake_afield) instead of waiting in its queue.
# long_round HOGCLASS|split : 10 s of that load; sets W_DELTA to the ml
# class's wake_preempt delta and A_DELTA to wake_afield's (in this shell:
# their checks count).
long_round() {
  local h h2="" s w0 w1 a0 a1 held="zholds stress-ng-cpu ml '*' '*'"
  W_DELTA="" A_DELTA=""
  printf '[[rules]]\nname = "long-burst sleepers"\ncomm = "^stress-ng-cpu$"\nclass = "ml"\n' >/tmp/longwake.toml
  if [ "$1" != normal ]; then
    printf '[[rules]]\nname = "ml hogs"\ncomm = "^zt_mlhog$"\nclass = "ml"\n' >>/tmp/longwake.toml
    held="$held && zholds zt_mlhog ml '*' '*'"
  fi
  zernel_start /tmp/longwake.toml || return 1
  case $1 in
    normal) zernel-workload hog --name zt_hog --threads 4 --secs 60 & h=$! ;;
    ml) zernel-workload hog --name zt_mlhog --threads 4 --secs 60 & h=$! ;;
    split)
      taskset -c 0,1 zernel-workload hog --name zt_mlhog --threads 2 --secs 60 & h=$!
      taskset -c 2,3 zernel-workload hog --name zt_hog --threads 2 --secs 60 & h2=$! ;;
  esac
  stress-ng --cpu 2 --cpu-load 50 --cpu-load-slice 20 --timeout 60s >/dev/null 2>&1 &
  s=$!
  check "the rules put stress-ng's cpu workers in the ml class ($1 hogs)" wait_until 30 eval "$held"
  w0=$(zcounter ml wake_preempt) a0=$(zglobal wake_afield)
  sleep 10
  w1=$(zcounter ml wake_preempt) a1=$(zglobal wake_afield)
  kill "$h" $h2 "$s" 2>/dev/null; wait "$h" $h2 "$s" 2>/dev/null
  zernel_stop INT
  assert_eq "SIGINT: scx_zernel exits 0" "$ZRC" 0
  W_DELTA=$((${w1:-0} - ${w0:-0})) A_DELTA=$((${a1:-0} - ${a0:-0}))
}
long_round normal
w_long=$W_DELTA
echo "10 s of stress-ng --cpu 2 --cpu-load 50 --cpu-load-slice 20 beside 4 normal-class hogs: $w_long of its wakeups preempted a hog"
assert_gt "wakeups of threads with 20 ms bursts preempted hogs of a lower class" "$w_long" 30
long_round ml
w_same=$W_DELTA
echo "the same beside 4 ml-class hogs: $w_same of its wakeups preempted a hog"
check "an ml thread with 20 ms bursts did not cut short ml hogs (<= 10 of its wakeups)" [ "${w_same:-99}" -le 10 ]
long_round split
echo "the same beside 2 ml hogs on CPUs 0-1 and 2 normal ones on CPUs 2-3: $W_DELTA of its wakeups preempted a hog, $A_DELTA of them further afield than their own CPU"
assert_gt "ml wakeups beside an ml hog took a normal hog's CPU further afield" "$A_DELTA" 10
check "dmesg is clean at the end (five more attaches and detaches under load)" dmesg_clean
finish
