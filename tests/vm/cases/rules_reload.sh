#!/bin/sh
# vm: --smp 4 --mem 2G
#
# Declarative rules and live reload. A rule sends `^hog` to batch and another
# sends a named process to latency: the kernel-side class of each matches.
# The file is then edited (hog -> ml) and SIGHUP sent: the new class reaches
# the kernel (the time it took is printed: about a second under TCG) while
# /sys/kernel/sched_ext/state never leaves `enabled`. An invalid edit is rejected with a one-line error and the old
# rules stay in force; so does an edit that only touches the file (no signal).
# shellcheck disable=SC2317 source=tests/vm/guest-lib.sh
. "$(dirname "$0")/../guest-lib.sh"

C=/tmp/rules.toml
write_cfg() {   # write_cfg HOG_CLASS : atomically replace the config
  cat >"$C.new" <<TOML
[[rules]]
comm = "^hog"
class = "$1"

[[rules]]
name = "serving frontend"
comm = "^frontend\$"
class = "latency"
slice_us = 500
TOML
  mv "$C.new" "$C"
}
write_cfg batch
zernel_start "$C" || finish

zernel-workload hog --name hog_batch --secs 40 --threads 2 &
hog=$!
zernel-workload hog --name frontend --secs 40 --threads 1 &
fe=$!
threads_up() { [ "$(ls "/proc/$hog/task" 2>/dev/null | wc -l)" -ge 2 ] && [ -d "/proc/$fe/task" ]; }
wait_until 5 threads_up
htid=$(ls /proc/$hog/task | tail -n 1)
ftid=$(ls /proc/$fe/task | tail -n 1)
is_class() { [ "$(ztask "$1" class)" = "$2" ]; }
wait_until 5 is_class "$htid" batch
assert_eq "^hog rule: kernel holds batch for $htid" "$(ztask "$htid" class)" batch
wait_until 5 is_class "$ftid" latency
assert_eq "frontend rule: kernel holds latency for $ftid" "$(ztask "$ftid" class)" latency
assert_eq "frontend rule: slice 500 us" "$(ztask "$ftid" slice_us)" 500

# Watch the state in the background for the rest of the test.
( while :; do s=$(sched_state); [ "$s" = enabled ] || echo "state left enabled: $s"; sleep 0.05; done ) >/tmp/state.watch 2>&1 &
watch=$!

# Edit + SIGHUP: the new class reaches the kernel. How soon is a figure
# (printed), not a check: on a loaded host it is whatever the host allows.
write_cfg ml
t0=$(cut -d' ' -f1 /proc/uptime)
kill -HUP "$ZPID"
wait_until 30 is_class "$htid" ml
t1=$(cut -d' ' -f1 /proc/uptime)
ms=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%d", (b - a) * 1000 }')
assert_eq "after edit + SIGHUP: kernel holds ml for $htid" "$(ztask "$htid" class)" ml
echo "reload took effect in $ms ms"

# An invalid edit: rejected, old rules stay.
printf '[[rules]]\ncomm = "^hog"\nclass = "nope"\n' >"$C.new" && mv "$C.new" "$C"
kill -HUP "$ZPID"
sleep 1.5
check "invalid edit logged as rejected" grep -q "reload rejected" "$ZLOG"
grep "reload rejected" "$ZLOG" | head -n 2
check "the rejection is one line naming the file" sh -c "grep 'reload rejected' '$ZLOG' | grep -q '$C:3'"
assert_eq "old rules still in force: $htid still ml" "$(ztask "$htid" class)" ml
check "scx_zernel still running" alive "$ZPID"

# A valid edit without a signal: picked up from the file's change.
write_cfg batch
wait_until 4 is_class "$htid" batch
assert_eq "file change alone reloads: $htid back to batch" "$(ztask "$htid" class)" batch

kill "$watch" 2>/dev/null; wait "$watch" 2>/dev/null
assert_eq "state never left enabled during reloads" "$(cat /tmp/state.watch)" ""
kill "$hog" "$fe" 2>/dev/null; wait "$hog" 2>/dev/null; wait "$fe" 2>/dev/null
zernel_stop TERM
assert_eq "SIGTERM: exit 0" "$ZRC" 0
check "dmesg is clean" dmesg_clean
finish
