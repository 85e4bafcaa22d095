#!/bin/sh
# vm: --smp 2 --mem 1G --timeout 300
#
# A stale entry in the task_class map (written for a live TID, but with
# another start time: the entry of an earlier task with that TID) is
# ignored by the kernel, counted as map_stale and left in place: only its
# writer removes entries, so a fresh decision written for the TID is never
# lost to the kernel deleting it. Control in the same run: an entry with
# the right start time for a twin thread is applied (the kernel counts each
# use of it in its `applied` field).
# shellcheck disable=SC2317 source=tests/vm/guest-lib.sh
. "$(dirname "$0")/../guest-lib.sh"

MAP=/sys/fs/bpf/scx_zernel/task_class
: >/tmp/empty.toml
zernel_start /tmp/empty.toml || finish

# Two single-threaded processes that wake every 5 ms (busy 20%).
zernel-workload hog --name zt_stale --secs 120 --busy-pct 20 &
st=$!
zernel-workload hog --name zt_fresh --secs 120 --busy-pct 20 &
fr=$!
running() { alive "$st" && alive "$fr"; }
wait_until 10 running
sleep 2
assert_eq "no entry for zt_stale before the test writes one" "$(ztask "$st" class)" ""
assert_eq "no entry for zt_fresh before the test writes one" "$(ztask "$fr" class)" ""

stale0=$(zglobal map_stale)
check "write a stale entry (start time + 7 ticks) for zt_stale" \
  zernel-workload entry --map "$MAP" --tid "$st" --class 3 --start-offset 7
check "write a matching entry for zt_fresh" \
  zernel-workload entry --map "$MAP" --tid "$fr" --class 3 --start-offset 0

# Judged once the control's entry has been used 200 times: by then its
# twin has woken about as often.
used() { _n=$(ztask "$fr" applied); [ "${_n:-0}" -ge 200 ]; }
wait_until 60 used
stale1=$(zglobal map_stale)
echo "zt_fresh: $(scx_zernel inspect --tid "$fr")"
echo "zt_stale: $(scx_zernel inspect --tid "$st" 2>&1)"
echo "map_stale: $stale0 -> $stale1"
assert_ge "control: the matching entry was applied (>= 200 lookups)" "$(ztask "$fr" applied)" 200
assert_eq "control: the matching entry holds class batch" "$(ztask "$fr" class)" batch
assert_eq "the stale entry is still in the map (the kernel does not delete it)" "$(ztask "$st" class)" batch
assert_eq "the stale entry was never applied" "$(ztask "$st" applied)" 0
assert_ge "map_stale counted its lookups (>= 100)" $((stale1 - stale0)) 100

kill "$st" "$fr"; wait "$st" 2>/dev/null; wait "$fr" 2>/dev/null
gone() { [ -z "$(ztask "$st" class)" ]; }
wait_until 10 gone
assert_eq "exit_task removed the stale entry when its TID exited" "$(ztask "$st" class)" ""
zernel_stop TERM
assert_eq "SIGTERM: exit 0" "$ZRC" 0
check "dmesg is clean" dmesg_clean
finish
