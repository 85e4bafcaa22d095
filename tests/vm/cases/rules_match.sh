#!/bin/sh
# vm: --smp 2 --mem 1G
#
# Every rule matcher, on real processes, to the kernel: a rule on the
# command line, one on the parent's name, one on the uid, one on the gid
# and one on the cgroup each give their own class (or slice), read back from
# the task_class map; the hogs' thread names match no rule, so only the
# field under test can have matched. A hog that matches nothing has no
# entry. `observe` names the rule (its `name` label) for a matched thread.
# The two other actions: `cpu = 1` puts the preferred CPU in the entry and
# a waking thread runs there (select_cpu's pref_cpu counter moves); `ml =
# true` makes a process that has no ML evidence an ML one, so its phase is
# detected inside the rule's class (an in-process loader: class normal, the
# DataLoading slice of 4000 us), where the same rule without it gives the
# class alone.
# shellcheck disable=SC2317 source=tests/vm/guest-lib.sh
. "$(dirname "$0")/../guest-lib.sh"

ensure_user nobody 65534 65534 nogroup
ensure_user ztgid 4243 4242 ztgrp
mkdir -p /sys/fs/cgroup/zt_rules
cat >/tmp/rm.toml <<'TOML'
# The rule-made ML reader must read into DataLoading however slow this guest
# runs (its reads slow down with a loaded host): the phase thresholds are
# phase_keys' subject, not this case's.
[phase]
inproc_load_min_read_bytes_per_sec = 1048576

[[rules]]
name = "by command line"
cmdline = "--name zt_cmd "
class = "batch"

[[rules]]
name = "by parent"
parent_comm = "^zt_parent$"
class = "latency"

[[rules]]
name = "by uid"
uid = 65534
class = "ml"

[[rules]]
name = "by gid"
gid = 4242
class = "batch"
slice_us = 900

[[rules]]
name = "by cgroup"
cgroup = "^/zt_rules$"
class = "latency"
slice_us = 600

[[rules]]
name = "preferred cpu"
comm = "^zt_pin$"
class = "latency"
cpu = 1

[[rules]]
name = "ml by rule"
comm = "^zt_mlrule$"
class = "normal"
ml = true

[[rules]]
name = "class only"
comm = "^zt_plain$"
class = "normal"
TOML
zernel_start /tmp/rm.toml || finish

S=300
zernel-workload hog --name zt_cmd --secs $S --threads 1 &
pids=$!
printf '#!/bin/sh\nzernel-workload hog --name zt_child --secs %s --threads 1\n' $S >/tmp/zt_parent
chmod +x /tmp/zt_parent
/tmp/zt_parent &
pids="$pids $!"
su -s /bin/sh nobody -c "exec zernel-workload hog --name zt_uid --secs $S --threads 1" &
pids="$pids $!"
su -s /bin/sh ztgid -c "exec zernel-workload hog --name zt_gid --secs $S --threads 1" &
pids="$pids $!"
sh -c "echo \$\$ >/sys/fs/cgroup/zt_rules/cgroup.procs && exec zernel-workload hog --name zt_cg --secs $S --threads 1" &
pids="$pids $!"
zernel-workload hog --name zt_none --secs $S --threads 1 &
pids="$pids $!"

# The spinning thread of each (named NAME; the main thread may be too).
tid_of() { tids_by_comm "$1" | tail -n 1; }
all_up() { for n in zt_cmd zt_child zt_uid zt_gid zt_cg zt_none; do [ -n "$(tid_of "$n")" ] || return 1; done; }
wait_until 20 all_up
check "all six hogs are running" all_up
has_class() { [ "$(ztask "$(tid_of "$1")" class)" = "$2" ]; }
expect() {   # expect NAME CLASS SLICE_US WHAT
  wait_until 10 has_class "$1" "$2"
  t=$(tid_of "$1")
  assert_eq "$4: kernel holds class $2 for $1 ($t)" "$(ztask "$t" class)" "$2"
  [ -n "$3" ] && assert_eq "$4: slice $3 us for $1" "$(ztask "$t" slice_us)" "$3"
  return 0
}
expect zt_cmd batch "" "cmdline"
expect zt_child latency "" "parent_comm"
expect zt_uid ml "" "uid"
expect zt_gid batch 900 "gid"
expect zt_cg latency 600 "cgroup"
t=$(tid_of zt_none)
assert_eq "a hog that matches no rule has no entry ($t)" "$(ztask "$t" class)" ""

scx_zernel observe --config /tmp/rm.toml --count 4 --interval-ms 1500 --json >/tmp/obs.json 2>/tmp/obs.err
named() { grep -q "\"name\":\"$1\"" /tmp/obs.json; }
check "observe names the rule that matched (by parent)" named "by parent"
check "observe names the rule that matched (by gid)" named "by gid"

for d in /proc/[0-9]*; do
  case "$(tr '\0' ' ' <"$d/cmdline" 2>/dev/null)" in "zernel-workload hog "*) kill "${d#/proc/}" 2>/dev/null ;; esac
done
for p in $pids; do wait "$p" 2>/dev/null; done

# The cpu action on an otherwise idle guest (a preferred CPU is taken when
# idle), then the ml action.
zernel-workload hog --name zt_pin --secs 30 --busy-pct 20 &
pin=$!
wait_until 10 has_class zt_pin latency
assert_eq "cpu = 1: the kernel's entry for zt_pin holds CPU 1" "$(ztask "$pin" cpu)" 1
# Its wakeups (voluntary switches, ~200 a second) against the wakeups
# select_cpu placed on a preferred CPU (pref_cpu; zt_pin is the only thread
# with one) over 5 s: a preferred CPU is taken when it is idle, and the
# daemon and this script keep CPU 1 busy now and then.
vol() { awk '/^voluntary_ctxt_switches/ { print $2 }' "/proc/$pin/status"; }
pref0=$(zglobal pref_cpu) vol0=$(vol)
sleep 5
pref=$(($(zglobal pref_cpu) - pref0)) wakes=$(($(vol) - vol0))
echo "zt_pin woke $wakes times in 5 s; select_cpu put it on its preferred CPU $pref times"
assert_gt "cpu = 1: zt_pin woke (its duty cycle sleeps)" "$wakes" 100
assert_ge "cpu = 1: at least half its wakeups went to the preferred CPU" "$((pref * 2))" "$wakes"
zernel-workload reader --name zt_mlrule --secs 120 --busy-pct 60 &
mlr=$!
zernel-workload reader --name zt_plain --secs 120 --busy-pct 60 &
plain=$!
slice_is() { [ "$(ztask "$1" slice_us)" = "$2" ]; }
wait_until 120 slice_is "$mlr" 4000
assert_eq "ml = true: zt_mlrule keeps the rule's class" "$(ztask "$mlr" class)" normal
assert_eq "ml = true: zt_mlrule is DataLoading inside it (slice 4000 us)" "$(ztask "$mlr" slice_us)" 4000
assert_eq "no ml: zt_plain has the rule's class" "$(ztask "$plain" class)" normal
plain_slice=$(ztask "$plain" slice_us)
check "no ml: zt_plain has no phase slice ($plain_slice)" [ "$plain_slice" != 4000 ]
kill $pin $mlr $plain 2>/dev/null; wait $pin $mlr $plain 2>/dev/null
zernel_stop INT
assert_eq "SIGINT: exit 0" "$ZRC" 0
check "dmesg is clean" dmesg_clean
finish
