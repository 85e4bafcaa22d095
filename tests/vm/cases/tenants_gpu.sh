#!/bin/sh
# vm: --smp 4 --mem 2G --timeout 150
#
# GPU-proportional tenants, measured live: two tenants with no fixed share
# get weights from the GPUs their processes use (file GPU provider). With
# 3 GPUs against 1 the CPU splits 75/25 +- 10; when the second tenant takes
# 3 GPUs too, the smoothed counts cross the rebalance threshold, the weights
# change after the cooldown and the split becomes 50/50 +- 10.
# shellcheck disable=SC2317 source=tests/vm/guest-lib.sh
. "$(dirname "$0")/../guest-lib.sh"

CG=/sys/fs/cgroup
mkdir -p $CG/ga $CG/gb
cat >/tmp/tg.toml <<'TOML'
[gpu]
provider = "file"
file = "/tmp/gpus.json"

# The hogs use GPUs, so they are ML threads: keep every phase in the normal
# class here so that only the tenant weights decide the split.
[policy.data_loading]
class = "normal"
preempt = false
latency_target_us = 8000
[policy.gpu_compute]
class = "normal"
preempt = false
latency_target_us = 8000
[policy.nccl_collective]
class = "normal"
preempt = false
latency_target_us = 8000
[policy.optimizer_step]
class = "normal"
preempt = false
latency_target_us = 8000

[tenancy]
demand_smoothing = 0.5
rebalance_threshold = 0.2
rebalance_cooldown_ms = 1000

[[tenants]]
name = "a"
cgroup = "/ga"

[[tenants]]
name = "b"
cgroup = "/gb"
TOML
hog_in() {
  sh -c "echo \$\$ >$CG/$1/cgroup.procs && exec zernel-workload hog --name $2 --secs 90 --threads 8" &
}
echo '{}' >/tmp/gpus.json
zernel_start /tmp/tg.toml || finish
hog_in ga ga_hog; a=$!
hog_in gb gb_hog; b=$!
# gpus A_DEVICES B_DEVICES : the file provider's view (indices per tenant).
gpus() {
  { echo '{ "devices": ['
    for i in 0 1 2 3 4 5; do echo "{ \"index\": $i, \"util\": 0 }$([ $i -lt 5 ] && echo ,)"; done
    echo '], "processes": ['
    sep=""
    for d in $1; do echo "$sep{ \"pid\": $a, \"device\": $d, \"sm_util\": 0 }"; sep=,; done
    for d in $2; do echo "$sep{ \"pid\": $b, \"device\": $d, \"sm_util\": 0 }"; done
    echo '] }'; } >/tmp/gpus.json.new && mv /tmp/gpus.json.new /tmp/gpus.json
}
gpus "0 1 2" "3"

snap() {
  awk 'FILENAME ~ /\/ga\/cpu.stat$/ && $1 == "usage_usec" { a = $2 }
       FILENAME ~ /\/gb\/cpu.stat$/ && $1 == "usage_usec" { b = $2 }
       END { print a, b }' "$CG/ga/cpu.stat" "$CG/gb/cpu.stat"
}
share_a() {   # share_a SECS : a's % of the two tenants' CPU over SECS
  _secs=$1
  # shellcheck disable=SC2046 # split into numbers on purpose
  set -- $(snap); a0=$1 b0=$2
  sleep "$_secs"
  # shellcheck disable=SC2046 # split into numbers on purpose
  set -- $(snap)
  echo $(( ($1 - a0) * 100 / ($1 - a0 + $2 - b0) ))
}
rebalanced() { [ "$(grep -c 'tenant weights rebalanced' "$ZLOG")" -ge "$1" ]; }
wait_until 15 rebalanced 1
grep 'tenant weights rebalanced' "$ZLOG"
sleep 2
pa=$(share_a 10)
echo "3 GPUs vs 1: a has $pa% of the tenants' CPU"
assert_ge "3:1 GPUs -> a >= 65%" "$pa" 65
assert_ge "3:1 GPUs -> a <= 85%" 85 "$pa"

gpus "0 1 2" "3 4 5"
wait_until 15 rebalanced 2
grep 'tenant weights rebalanced' "$ZLOG" | tail -n 2
sleep 4   # the EWMA settles past the threshold, then the cooldown allows a final step
pa=$(share_a 10)
echo "3 GPUs vs 3: a has $pa% of the tenants' CPU"
assert_ge "3:3 GPUs -> a >= 40%" "$pa" 40
assert_ge "3:3 GPUs -> a <= 60%" 60 "$pa"
assert_eq "state stayed enabled through re-weighting" "$(sched_state)" enabled

kill "$a" "$b" 2>/dev/null; wait "$a" 2>/dev/null; wait "$b" 2>/dev/null
zernel_stop TERM
assert_eq "SIGTERM: exit 0" "$ZRC" 0
check "dmesg is clean" dmesg_clean
finish
