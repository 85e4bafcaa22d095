#!/bin/sh
# vm: --smp 2 --mem 1G --timeout 300
#
# An RT task takes a CPU: the tasks already in that CPU's local queue go
# back to the scheduler (cpu_release re-enqueues them) and run on another
# CPU, instead of waiting behind the RT task. An ml-class spinner runs on
# CPU 1 (free to run on 0 and 1; a batch spinner pinned to CPU 0 keeps
# CPU 0 from being idle, which would draw it over); a SCHED_FIFO spinner pinned to CPU 1
# preempts it for 4 s: the ml thread keeps running (>= 30% of a CPU over
# those seconds, measured by its own CPU time: it shares CPU 0 with this
# script; waiting behind the RT task it would get the few % RT throttling
# leaves), on CPU 0. Control: before the RT task it ran on CPU 1 (>= 10%: it runs at all, however loaded the host).
# shellcheck disable=SC2317 source=tests/vm/guest-lib.sh
. "$(dirname "$0")/../guest-lib.sh"

cat >/tmp/rt.toml <<'TOML'
[[rules]]
comm = "^zt_ml$"
class = "ml"

[[rules]]
comm = "^zt_low$"
class = "batch"
TOML
zernel_start /tmp/rt.toml || finish

# Pinned to CPU 1 until it is classified, then free: it stays where it runs.
taskset -c 1 zernel-workload hog --name zt_ml --secs 120 &
ml=$!
held() { [ "$(ztask "$ml" class)" = ml ]; }
wait_until 20 held
assert_eq "the kernel holds ml for zt_ml" "$(ztask "$ml" class)" ml
taskset -c 0 zernel-workload hog --name zt_low --secs 120 &
low=$!
held_low() { [ "$(ztask "$low" class)" = batch ]; }
wait_until 20 held_low
assert_eq "the kernel holds batch for zt_low (pinned to CPU 0)" "$(ztask "$low" class)" batch

cpu_of() { sed 's/.*) //' "/proc/$ml/stat" | cut -d' ' -f37; }
ticks() { sed 's/.*) //' "/proc/$ml/stat" | awk '{ print $12 + $13 }'; }
now_cs() { cut -d' ' -f1 /proc/uptime | tr -d .; }
# share SECS : zt_ml's CPU time over SECS s, in % of one CPU.
share() {
  _t0=$(ticks) _u0=$(now_cs)
  sleep "$1"
  echo $(( ($(ticks) - _t0) * 100 / ($(now_cs) - _u0) ))
}
# Free to run on both CPUs, but running on CPU 1: set until it stays there.
on_cpu1() {
  taskset -p -c 1 "$ml" >/dev/null; sleep 0.3
  taskset -p -c 0-1 "$ml" >/dev/null; sleep 0.5
  [ "$(cpu_of)" = 1 ]
}
before=$(share 1)
echo "before the RT task: zt_ml runs $before% of a CPU"
assert_ge "control: zt_ml runs (>= 10% of a CPU; a thread that never ran has 0)" "$before" 10
wait_until 30 on_cpu1
c=$(cpu_of)
echo "zt_ml on CPU $c, allowed CPUs $(taskset -p "$ml" | sed 's/.*: //')"
assert_eq "control: zt_ml runs on CPU 1 as the RT task starts" "$c" 1
taskset -c 1 zernel-workload hog --name zt_rt --secs 4 --fifo 50 &
rt=$!
rt_on() { [ -n "$(tids_by_comm zt_rt)" ]; }
wait_until 5 rt_on
during=$(share 2)
c=$(cpu_of)
echo "with a SCHED_FIFO spinner on CPU 1: zt_ml on CPU $c, $during% of a CPU"
assert_ge "zt_ml keeps running beside the RT task (>= 30% of a CPU)" "$during" 30
assert_eq "zt_ml runs on CPU 0" "$c" 0
wait "$rt"

kill "$ml" "$low"; wait "$ml" "$low" 2>/dev/null
zernel_stop TERM
assert_eq "SIGTERM: exit 0" "$ZRC" 0
check "dmesg is clean" dmesg_clean
finish
