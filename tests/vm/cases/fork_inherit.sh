#!/bin/sh
# vm: --smp 2 --mem 1G --timeout 600
#
# Fork inheritance: a task created while scx_zernel runs starts with the
# decision its creator holds (class, tenant, node), from its first enqueue,
# before the daemon has seen it; the daemon's own entry replaces it later.
# Judged by the kernel's counters, one child at a time (nothing else in
# the guest gets a decision): `first_dec` counts tasks created since attach
# whose enqueue first came with a decision, `enq_before_dec` their enqueues
# with none before it.
#   A. a forked child of a process that holds a rule's class (batch): the
#      creator's decision is inherited (`inherited` +1), no enqueue without
#      a decision (`enq_before_dec` +0), then the daemon's entry (batch)
#   B. the same for a thread (clone) of that process
#   C. control: a child of a process with no decision, which the rule
#      matches once renamed, waits for the daemon (`enq_before_dec` > 0;
#      nothing inherited)
#   D. a child the daemon gives no entry (renamed to a name no rule
#      matches, as a shell a trainer spawns): the inherited decision ends
#      decision_ttl_ms (3000 here) after the fork (`inherit_end` +1; seen
#      2.5-9 s after it), and
#      no lookup is served by it afterwards (`inherit_hit` stops). Its
#      creator's rule also asks for this shell as the parent: the child
#      matches no rule from its fork on, even before it renames itself (a
#      daemon that read its name in between would give it an entry, which
#      replaces the inherited decision for good, and nothing would end)
# shellcheck disable=SC2317,SC2046 source=tests/vm/guest-lib.sh
. "$(dirname "$0")/../guest-lib.sh"

cat >/tmp/fork.toml <<'TOML'
[scheduler]
decision_ttl_ms = 3000

[[rules]]
comm = "^zt_fp$"
class = "batch"

[[rules]]
comm = "^zt_fr$"
class = "batch"

[[rules]]
comm = "^zt_fd$"
parent_comm = "^(sh|dash|bash)$"
class = "batch"
TOML
zernel_start /tmp/fork.toml || finish

# g : "inherited inherit_hit inherit_end first_dec enq_before_dec", one inspect.
g() {
  scx_zernel inspect | awk '$1 == "global" { v[$2] = $3 }
    END { print v["inherited"], v["inherit_hit"], v["inherit_end"], v["first_dec"], v["enq_before_dec"] }'
}
now_cs() { awk '{ split($1, t, "."); print t[1] * 100 + t[2] }' /proc/uptime; }
# child_of OUT : the child's TID once the workload printed it.
child_of() { awk '$2 == "fork" && $3 == "child" { print $4 }' "$1"; }
has_child() { [ -n "$(child_of "$1")" ]; }
held() { [ "$(ztask "$1" class)" = batch ]; }

# spawn TAG NAME CHILD_NAME [--thread] : a parent named NAME (running 20 %),
# which creates its child once /tmp/go.TAG exists; sets P.
spawn() {
  local tag=$1 name=$2 cname=$3
  shift 3
  rm -f "/tmp/go.$tag"
  zernel-workload fork --name "$name" --child-name "$cname" --secs 200 --when "/tmp/go.$tag" "$@" >"/tmp/fork.$tag" 2>&1 &
  P=$!
}
# go TAG : let TAG's parent create its child; sets C (its TID) and T0.
go() {
  T0=$(now_cs)
  touch "/tmp/go.$1"
  wait_until 20 has_child "/tmp/fork.$1"
  C=$(child_of "/tmp/fork.$1")
}

# ---- A. forked child of a process that holds batch -----------------------------
spawn a zt_fp zt_fp
pa=$P
wait_until 30 held "$pa"
assert_eq "A: the parent holds batch (its rule)" "$(ztask "$pa" class)" batch
set -- $(g); i0=$1 f0=$4 e0=$5
go a; ca=$C
check "A: the child exists" [ -n "$ca" ]
wait_until 30 held "$ca"
set -- $(g)
echo "A: child $ca: inherited +$(( $1 - i0 )), first_dec +$(( $4 - f0 )), enq_before_dec +$(( $5 - e0 ))"
assert_eq "A: the child inherited its creator's decision (inherited +1)" $(( $1 - i0 )) 1
assert_eq "A: its enqueue first came with a decision (first_dec +1)" $(( $4 - f0 )) 1
assert_eq "A: no enqueue without a decision before it (enq_before_dec +0)" $(( $5 - e0 )) 0
assert_eq "A: then the daemon's own entry (batch)" "$(ztask "$ca" class)" batch
# Each step's processes end before the next (under emulation, spinners left
# running slow every later step). Only these PIDs: a bare `wait` would also
# wait for the daemon.
stop() { kill "$@" 2>/dev/null; for p in "$@"; do wait "$p" 2>/dev/null; done; }
stop "$ca" "$pa"

# ---- B. a thread of that process -----------------------------------------------
spawn b zt_fp zt_fp --thread
pb=$P
wait_until 30 held "$pb"
set -- $(g); i0=$1 f0=$4 e0=$5
go b; cb=$C
check "B: the thread exists" [ -n "$cb" ]
wait_until 30 held "$cb"
set -- $(g)
echo "B: thread $cb: inherited +$(( $1 - i0 )), first_dec +$(( $4 - f0 )), enq_before_dec +$(( $5 - e0 ))"
assert_eq "B: the thread inherited its creator's decision (inherited +1)" $(( $1 - i0 )) 1
assert_eq "B: its enqueue first came with a decision (first_dec +1)" $(( $4 - f0 )) 1
assert_eq "B: no enqueue without a decision before it (enq_before_dec +0)" $(( $5 - e0 )) 0
stop "$pb"

# ---- C. control: a creator with no decision --------------------------------------
spawn c zt_fq zt_fr
pc=$P
sleep 2
assert_eq "C: the parent has no entry" "$(ztask "$pc" class)" ""
set -- $(g); i0=$1 f0=$4 e0=$5
go c; cc=$C
wait_until 30 held "$cc"
set -- $(g)
echo "C: child $cc (no decision to inherit): inherited +$(( $1 - i0 )), first_dec +$(( $4 - f0 )), enq_before_dec +$(( $5 - e0 ))"
assert_eq "C: nothing inherited" $(( $1 - i0 )) 0
assert_eq "C: its first decision is the daemon's entry (first_dec +1)" $(( $4 - f0 )) 1
assert_gt "C: it was enqueued without a decision until then (enq_before_dec > 0)" $(( $5 - e0 )) 0
stop "$cc" "$pc"

# ---- D. a child the daemon gives no entry ---------------------------------------
spawn d zt_fd zt_fn
pd=$P
wait_until 30 held "$pd"
set -- $(g); i0=$1 n0=$3
go d; cn=$C
ended() { set -- $(g); [ "$3" -gt "$n0" ]; }
wait_until 20 ended
t1=$(now_cs)
set -- $(g); h0=$2
echo "D: child $cn: inherited +$(( $1 - i0 )), inherit_end +$(( $3 - n0 )) $(( t1 - T0 )) cs after the fork was let go"
assert_eq "D: the child inherited its creator's decision" $(( $1 - i0 )) 1
assert_eq "D: the inherited decision ended (inherit_end +1)" $(( $3 - n0 )) 1
assert_ge "D: not before the bound (>= 2.5 s after the fork)" $(( t1 - T0 )) 250
# (seen by polling `scx_zernel inspect`, which takes a second or more under
# emulation: the same margin as hung_daemon's)
assert_ge "D: within the bound + 6 s" 900 $(( t1 - T0 ))
assert_eq "D: the daemon gave the child no entry" "$(ztask "$cn" class)" ""
sleep 1
set -- $(g)
assert_eq "D: no lookup served by an inherited decision since (inherit_hit +0 in 1 s)" $(( $2 - h0 )) 0
check "D: the child still runs" alive "$cn"

stop "$cn" "$pd"
zernel_stop TERM
assert_eq "SIGTERM: exit 0" "$ZRC" 0
check "dmesg is clean" dmesg_clean
finish
