#!/bin/sh
# vm: --smp 2 --mem 1G --timeout 300
#
# A hung daemon's decisions expire: the daemon writes a heartbeat every
# pass, and once it is older than scheduler.decision_ttl_ms (3000 here) the
# kernel gives every thread the default class (map_expired counts the
# lookups). SIGSTOP the daemon: a thread held in batch keeps it for a while,
# then is served as normal (its entry is no longer applied, the batch
# counters stop); SIGCONT: its decision is back within a second.
# shellcheck disable=SC2317,SC2046 source=tests/vm/guest-lib.sh
. "$(dirname "$0")/../guest-lib.sh"

cat >/tmp/ttl.toml <<'TOML'
[scheduler]
decision_ttl_ms = 3000

[[rules]]
comm = "^zt_ttl$"
class = "batch"
TOML
zernel_start /tmp/ttl.toml || finish
assert_eq "the kernel holds decision_ttl_ms 3000" "$(ztunable decision_ttl_ms)" 3000

# One thread that wakes every 5 ms (busy 20%): a lookup at every wakeup.
zernel-workload hog --name zt_ttl --secs 200 --busy-pct 20 &
h=$!
held() { [ "$(ztask "$h" class)" = batch ]; }
wait_until 20 held
assert_eq "the kernel holds batch for zt_ttl" "$(ztask "$h" class)" batch

now_cs() { awk '{ split($1, t, "."); print t[1] * 100 + t[2] }' /proc/uptime; }
# probe : "applied map_expired batch_enqueued" in one inspect.
probe() {
  scx_zernel inspect | awk '$1 == "global" && $2 == "map_expired" { e = $3 }
    $1 == "counter" && $2 == "batch" && $3 == "enqueued" { b = $4 } END { printf "%s %s ", e, b }'
  ztask "$h" applied
}
# delta SECS : "d_applied d_expired d_batch" over SECS seconds.
delta() {
  set -- $(probe); e0=$1 b0=$2 a0=$3
  sleep "$_secs"
  set -- $(probe)
  echo "$(( $3 - a0 )) $(( $1 - e0 )) $(( $2 - b0 ))"
}

# Control: the daemon alive, over more than the bound: applied, never expired.
_secs=4; set -- $(delta)
echo "daemon alive, 4 s: applied +$1, map_expired +$2, batch enqueued +$3"
assert_ge "alive: zt_ttl's entry applied (>= 50 in 4 s)" "$1" 50
assert_eq "alive: no lookup expired" "$2" 0

set -- $(probe); e0=$1
kill -STOP "$ZPID"
t0=$(now_cs)
sleep 1
set -- $(probe)
echo "1 s after SIGSTOP: map_expired +$(( $1 - e0 ))"
assert_eq "stopped 1 s (< 3 s bound): decisions still hold" "$(( $1 - e0 ))" 0
expired() { set -- $(probe); [ "$1" -gt "$e0" ]; }
wait_until 15 expired
t1=$(now_cs)
echo "decisions expired $(( t1 - t0 )) cs after SIGSTOP"
assert_ge "expired no sooner than ~the bound (>= 2.5 s after SIGSTOP)" $(( t1 - t0 )) 250
assert_ge "expired within bound + 6 s" 900 $(( t1 - t0 ))
_secs=2; set -- $(delta)
echo "daemon stopped, 2 s: applied +$1, map_expired +$2, batch enqueued +$3"
assert_eq "stopped: zt_ttl's entry is not applied" "$1" 0
assert_ge "stopped: its lookups counted as map_expired (>= 50 in 2 s)" "$2" 50
assert_eq "stopped: nothing is served as batch" "$3" 0

kill -CONT "$ZPID"
back() { _secs=1; set -- $(delta); [ "$1" -gt 0 ] && [ "$2" -eq 0 ]; }
t0=$(now_cs)
wait_until 10 back
echo "decisions back $(( $(now_cs) - t0 )) cs after SIGCONT"
_secs=2; set -- $(delta)
echo "daemon resumed, 2 s: applied +$1, map_expired +$2, batch enqueued +$3"
assert_ge "resumed: zt_ttl's entry applied again (>= 25 in 2 s)" "$1" 25
assert_eq "resumed: no lookup expired" "$2" 0
assert_gt "resumed: served as batch again" "$3" 0

kill "$h"; wait "$h" 2>/dev/null
zernel_stop TERM
assert_eq "SIGTERM: exit 0" "$ZRC" 0
check "dmesg is clean" dmesg_clean
finish
