#!/bin/sh
# vm: --smp 2 --mem 1G
#
# The [scheduler] keys and --mode reach the kernel. With non-default values,
# `inspect` reads back what the loaded program holds (its read-only data,
# pinned as `tunables`): every class slice, the starvation bound, the wakeup
# preemption threshold and the default class. The kernel acts on them: an
# unclassified spinner is counted in the default class (batch here), and two
# default-class spinners sharing one CPU switch about as often as the slice
# says: 20 ms against 2 ms gives several times fewer switches. A reload that
# edits [scheduler] keeps the running values, in the kernel too, and says so.
# --mode lowlatency halves the slices and caps the starvation bound at
# 20 ms, gaming also doubles wakeup_preempt_us; --mode server doubles the
# slices, powersave also turns wakeup preemption off. task_map_size is the capacity of
# the kernel's map: with 1200 threads matched by a rule and 1024 entries, the
# map is full, the daemon says so once and map_full counts the rest. The
# maps are pinned under pin_dir (and removed at exit); pin_dir = "" pins
# nothing and inspect says so.
# shellcheck disable=SC2317 source=tests/vm/guest-lib.sh
. "$(dirname "$0")/../guest-lib.sh"

C=/tmp/tunables.toml
write_cfg() {   # write_cfg BATCH_SLICE_US
  cat >"$C.new" <<TOML
[scheduler]
default_class = "batch"
starvation_bound_ms = 80
wakeup_preempt_us = 400

[scheduler.slice_us]
latency = 700
ml = 1500
normal = 2500
batch = $1
TOML
  mv "$C.new" "$C"
}
# expect_tunables WHAT LAT ML NORMAL BATCH STARVE : the kernel holds these.
expect_tunables() {
  assert_eq "$1: slice_us.latency" "$(ztunable slice_us.latency)" "$2"
  assert_eq "$1: slice_us.ml" "$(ztunable slice_us.ml)" "$3"
  assert_eq "$1: slice_us.normal" "$(ztunable slice_us.normal)" "$4"
  assert_eq "$1: slice_us.batch" "$(ztunable slice_us.batch)" "$5"
  assert_eq "$1: starvation_bound_ms" "$(ztunable starvation_bound_ms)" "$6"
  assert_eq "$1: wakeup_preempt_us" "$(ztunable wakeup_preempt_us)" "${7:-400}"
  assert_eq "$1: default_class" "$(ztunable default_class)" batch
}
# switches SECS : involuntary context switches of two unclassified spinners
# that share CPU 1, over SECS seconds (both start first and run throughout).
nvcsw() { cat /proc/"$1"/task/*/status 2>/dev/null | awk '/^nonvoluntary_ctxt_switches/ { s += $2 } END { print s + 0 }'; }
switches() {
  taskset -c 1 zernel-workload hog --name zt_spin --secs $(($1 + 4)) --threads 2 &
  pid=$!
  sleep 2
  s0=$(nvcsw "$pid")
  sleep "$1"
  s1=$(nvcsw "$pid")
  wait "$pid"
  echo $((s1 - s0))
}

# 1. The config's values, as the kernel holds them; the kernel uses them.
write_cfg 20000
zernel_start "$C" || finish
scx_zernel inspect | grep '^tunable'
expect_tunables "config" 700 1500 2500 20000 80
assert_eq "nr_cpus" "$(ztunable nr_cpus)" 2
assert_eq "nr_nodes" "$(ztunable nr_nodes)" 1
b0=$(zcounter batch dispatched)
sw_long=$(switches 4)
b1=$(zcounter batch dispatched)
assert_gt "default_class = batch: unclassified spinners are dispatched from batch ($b0 -> $b1)" "$b1" "$b0"

# 2. A reload that edits [scheduler]: refused for the running instance.
write_cfg 2000
kill -HUP "$ZPID"
said_restart() { grep -q 'changes take effect at the next start' "$ZLOG"; }
wait_until 5 said_restart
check "a reload of [scheduler] says it takes effect at the next start" said_restart
assert_eq "after the reload the kernel still holds slice_us.batch 20000" "$(ztunable slice_us.batch)" 20000
zernel_stop INT
assert_eq "SIGINT: exit 0" "$ZRC" 0

# 3. The edited value at the next start; a 2 ms slice switches far more often.
zernel_start "$C" || finish
assert_eq "restarted: slice_us.batch" "$(ztunable slice_us.batch)" 2000
sw_short=$(switches 4)
echo "two default-class spinners on one CPU, 4 s: $sw_long switches with slice_us.batch = 20000, $sw_short with 2000"
assert_ge "20 ms slices: at least 40 switches (the spinners shared the CPU)" "$sw_long" 40
assert_ge "2 ms slices switch at least 3x as often as 20 ms slices" "$sw_short" $((3 * sw_long))
zernel_stop INT

# 4. --mode presets on top of the same file.
write_cfg 20000
expect_mode() {   # expect_mode MODE TUNABLES... (as expect_tunables)
  zernel_start "$C" --mode "$1" || finish
  m=$1
  shift
  expect_tunables "--mode $m" "$@"
  zernel_stop INT
}
expect_mode lowlatency 350 750 1250 10000 20
expect_mode gaming 350 750 1250 10000 20 800
expect_mode server 1400 3000 5000 40000 80
expect_mode powersave 1400 3000 5000 40000 80 0

# 5. task_map_size is the capacity of the kernel's map; once it is full,
# further threads keep the default class and map_full counts them.
# Pinned under a pin_dir of its own this time.
cat >/tmp/small.toml <<'TOML'
[scheduler]
task_map_size = 1024
pin_dir = "/sys/fs/bpf/zt_custom"

[[rules]]
comm = "^idle_"
class = "batch"
TOML
zernel_start /tmp/small.toml --stats 1 || finish
inspect_val() { scx_zernel inspect --config /tmp/small.toml 2>/dev/null | awk -v k="$1" '$1 == k { print $2 }'; }
check "pin_dir: the maps are pinned where it says" sh -c "[ -e /sys/fs/bpf/zt_custom/task_class ] && [ -e /sys/fs/bpf/zt_custom/tunables ] && [ ! -e /sys/fs/bpf/scx_zernel ]"
assert_eq "task_map_size reaches the kernel: map_capacity" "$(inspect_val map_capacity)" 1024
zernel-workload threads --count 1200 --secs 120 >/tmp/thr.out 2>&1 &
tp=$!
full_logged() { grep -q 'task_class map is full (1024 entries)' "$ZLOG"; }
wait_until 60 full_logged
check "the daemon says the map is full" full_logged
sleep 2   # a --stats line after the first full pass
assert_eq "the map holds its capacity" "$(inspect_val map_entries)" 1024
full=$(grep '^\[zernel\] enq' "$ZLOG" | tail -n 1 | awk '{ for (i = 1; i < NF; i++) if ($i == "full") print $(i + 1) }')
echo "1200 threads matched by a rule, map of 1024: map_full ${full:-?}"
assert_ge "map_full counts the threads left out (at least 176)" "${full:-0}" 176
kill "$tp"; wait "$tp" 2>/dev/null
zernel_stop INT
assert_eq "SIGINT: exit 0" "$ZRC" 0
check "pin_dir: removed on exit" sh -c "[ ! -e /sys/fs/bpf/zt_custom ]"

# 6. pin_dir = "": nothing pinned, and inspect says why.
printf '[scheduler]\npin_dir = ""\n' >/tmp/nopin.toml
zernel_start /tmp/nopin.toml || finish
check "pin_dir = \"\": nothing pinned" sh -c "[ ! -e /sys/fs/bpf/scx_zernel ] && [ ! -e /sys/fs/bpf/zt_custom ]"
out=$(scx_zernel inspect --config /tmp/nopin.toml 2>&1); rc=$?
echo "$out"
check "pin_dir = \"\": inspect fails in one line naming the key" sh -c "[ $rc -ne 0 ] && echo '$out' | grep -q 'scheduler.pin_dir is empty'"
zernel_stop INT
assert_eq "SIGINT: exit 0" "$ZRC" 0
check "dmesg is clean" dmesg_clean
finish
