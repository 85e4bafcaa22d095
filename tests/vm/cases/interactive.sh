#!/bin/sh
# vm: --smp 2 --mem 1G --timeout 600
#
# Interactive work beside an ml job that keeps every CPU busy (4 ml CPU
# hogs, matched by a rule, on 2 vCPUs), in one boot: under EEVDF first,
# then scx_zernel with wakeup_preempt_us = 0 (the control: the class order
# alone, which serves normal-class work beside the ml job only at the
# starvation bound), then with the default.
#
# 1. A 2 ms sleeper (cyclictest, SCHED_OTHER, little CPU per wakeup)
#    waits per timeslice (its schedstat) under a quarter of what it waits
#    in the control (>= 10 ms there).
# 2. A shell runs 40 `cat` processes one after another (forks, execs and
#    wakeups of the normal class). They take an ml hog's CPU (the
#    `interactive` counter moves, once per cat at least) and wait less
#    for a CPU per ms of CPU they use (the cgroup's PSI and cpu.stat) than
#    in the control (>= 3 ms per ms there). Under emulation a cat costs
#    10-45 ms of CPU, so the budget, not the wakeups, bounds that chain.
# 3. The interactive budget bounds what this costs the ml job: 4 such
#    shells at once get at most its 10 points (+ 3) of the CPU more than
#    the control gives them (the cgroups' cpu.stat). Under EEVDF the 4
#    shells take more than that: the positive control of this check.
# shellcheck disable=SC2317 source=tests/vm/guest-lib.sh
. "$(dirname "$0")/../guest-lib.sh"

CG=/sys/fs/cgroup
mkdir -p $CG/zml $CG/zsh
printf '[[rules]]\ncomm = "^stress-ng-cpu$"\nclass = "ml"\n' >/tmp/ia.toml
printf '[scheduler]\nwakeup_preempt_us = 0\n\n[[rules]]\ncomm = "^stress-ng-cpu$"\nclass = "ml"\n' >/tmp/ia0.toml

usage() { awk '$1 == "usage_usec" { print $2 }' "$CG/$1/cpu.stat"; }
# chain N : N shells in cgroup zsh, each running 40 cats in a row; waits
# for them.
chain() {
  local k=1 pids=""
  while [ $k -le "$1" ]; do
    # shellcheck disable=SC2016 # expanded by the shell started here
    sh -c 'echo $$ >'"$CG"'/zsh/cgroup.procs; i=0
      while [ $i -lt 40 ]; do cat /proc/uptime >/dev/null; i=$((i + 1)); done
      ' &
    pids="$pids $!"; k=$((k + 1))
  done
  # shellcheck disable=SC2086 # one PID per word
  wait $pids
}
# one_chain LABEL : one shell; prints how long its tasks waited for a CPU
# (the cgroup's own PSI: cpu.pressure "some" total) per ms of CPU they used
# (its cpu.stat), times 100.
psi() { awk -F'total=' '/^some/ { print $2 }' "$CG/$1/cpu.pressure"; }
one_chain() {
  local w0 u0 w1 u1
  w0=$(psi zsh) u0=$(usage zsh)
  chain 1
  w1=$(psi zsh) u1=$(usage zsh)
  awk -v l="$1" -v w=$((w1 - w0)) -v u=$((u1 - u0)) 'BEGIN {
    printf "%d\n", 100 * w / (u ? u : 1)
    printf "%s: one shell waited %.2f s for a CPU, used %.2f s\n", l, w / 1e6, u / 1e6 > "/dev/stderr" }'
}
# four_chains LABEL : 4 shells at once; prints the shells' share of the
# CPU the shells and the ml job used meanwhile, and the ml job's share of
# all CPU time, both in %.
four_chains() {
  local s0 m0 a0 s1 m1 a1
  s0=$(usage zsh) m0=$(usage zml); read -r a0 _ </proc/uptime
  chain 4
  s1=$(usage zsh) m1=$(usage zml); read -r a1 _ </proc/uptime
  awk -v l="$1" -v s=$((s1 - s0)) -v m=$((m1 - m0)) -v a0="$a0" -v a1="$a1" 'BEGIN {
    printf "%d %d\n", 100 * s / (s + m), 100 * m / ((a1 - a0) * 2e6)
    printf "%s: 4 shells used %.2f s of CPU, the ml job %.2f s, in %.2f s\n", l, s / 1e6, m / 1e6, a1 - a0 > "/dev/stderr" }'
}

# sleeper : cyclictest (SCHED_OTHER, a thread waking every 2 ms, a few
# us of CPU each time) for 100 of its measuring thread's timeslices, sized
# by count; prints how long that thread waited per timeslice, us (the
# kernel's schedstat). The shell's own reads poll it, once a second: every
# process started here is normal-class work that shares the interactive
# budget with the sleeper.
sleeper() {
  local ct tid d0 n0 d1 n1 k=0
  cyclictest -q -t 1 -i 2000 -D 300 >/dev/null 2>&1 &
  ct=$!
  ct_thread() { tid=$(other_tid "$ct"); [ -n "$tid" ]; }
  wait_until 30 ct_thread
  read -r _ d0 n0 <"/proc/$ct/task/$tid/schedstat"
  ct_done() { read -r _ d1 n1 <"/proc/$ct/task/$tid/schedstat" && [ $((n1 - n0)) -ge 100 ]; }
  while ! ct_done && [ $k -lt 120 ]; do sleep 1; k=$((k + 1)); done
  kill "$ct" 2>/dev/null; wait "$ct" 2>/dev/null
  [ $((n1 - n0)) -ge 100 ] && echo $(( (d1 - d0) / 1000 / (n1 - n0) ))
}

sh -c "echo \$\$ >$CG/zml/cgroup.procs && exec stress-ng --cpu 4 --timeout 900s" >/dev/null 2>&1 &
S=$!
ml_started() { [ "$(wc -l <"$CG"/zml/cgroup.procs)" -ge 5 ]; }   # stress-ng and its 4 workers
assert_true "the ml job's 4 workers started" wait_until 20 ml_started

EEVDF_SLEEP=$(sleeper)
EEVDF_WAIT=$(one_chain eevdf)
# shellcheck disable=SC2046 # two numbers
set -- $(four_chains eevdf); EEVDF_SH=$1 EEVDF_ML=$2

zernel_start /tmp/ia0.toml || finish
wait_until 20 zholds stress-ng-cpu ml '*' '*'
OFF_SLEEP=$(sleeper)
OFF_WAIT=$(one_chain "wakeup_preempt_us = 0")
# shellcheck disable=SC2046
set -- $(four_chains "wakeup_preempt_us = 0"); OFF_SH=$1 OFF_ML=$2
zernel_stop INT

zernel_start /tmp/ia.toml || finish
wait_until 20 zholds stress-ng-cpu ml '*' '*'
c0=$(scx_zernel inspect)
ON_SLEEP=$(sleeper)
c1=$(scx_zernel inspect)
# delta NAME KIND : how far counter NAME (KIND global, or a class) moved
# between the snapshots c0 and c1; empty if either lacks it.
delta() {
  local a b
  if [ "$2" = global ]; then a=$(zglobal "$1" "$c0") b=$(zglobal "$1" "$c1")
  else a=$(zcounter "$2" "$1" "$c0") b=$(zcounter "$2" "$1" "$c1"); fi
  [ -n "$a" ] && [ -n "$b" ] && echo $((b - a))
}
echo "during the sleeper: interactive +$(delta interactive global), normal starved +$(delta starved normal), interactive_us +$(delta interactive_ns global | awk '{ print int($1 / 1000) }')"
c0=$(scx_zernel inspect)
ON_WAIT=$(one_chain default)
c1=$(scx_zernel inspect)
# shellcheck disable=SC2046
set -- $(four_chains default); ON_SH=$1 ON_ML=$2
echo "waits per ms of CPU (x100): EEVDF $EEVDF_WAIT, wakeup_preempt_us = 0 $OFF_WAIT, default $ON_WAIT"
echo "4 shells' share of the shells' and ml job's CPU (%): EEVDF $EEVDF_SH, off $OFF_SH, default $ON_SH; the ml job's share of all CPU (%): EEVDF $EEVDF_ML, off $OFF_ML, default $ON_ML"
echo "cyclictest's wait per timeslice (us): EEVDF $EEVDF_SLEEP, wakeup_preempt_us = 0 $OFF_SLEEP, default $ON_SLEEP"
assert_ge "control: with wakeup_preempt_us = 0 a 2 ms sleeper waits >= 10 ms per timeslice" "$OFF_SLEEP" 10000
check "a 2 ms sleeper waits under a quarter as long per timeslice as in the control ($ON_SLEEP vs $OFF_SLEEP us)" \
  [ "$((ON_SLEEP * 4))" -lt "$OFF_SLEEP" ]
assert_ge "control: with wakeup_preempt_us = 0 the shell waits over 3 ms per ms of CPU" "$OFF_WAIT" 300
assert_ge "interactive wakeups took an ml hog's CPU, once per cat at least" "$(delta interactive global)" 40
check "the shell waits less per ms of CPU than in the control ($ON_WAIT vs $OFF_WAIT)" \
  [ "$ON_WAIT" -lt "$OFF_WAIT" ]
check "control: under EEVDF 4 shells take over the budget's 10 points more than the bound gives ($EEVDF_SH% vs $OFF_SH%)" \
  [ "$EEVDF_SH" -gt "$((OFF_SH + 13))" ]
check "4 interactive shells get at most the budget's 10 points (+3) more than the bound gives them ($ON_SH% vs $OFF_SH%)" \
  [ "$ON_SH" -le "$((OFF_SH + 13))" ]
zernel_stop INT
kill $S 2>/dev/null
finish
