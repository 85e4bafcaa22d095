# guest-lib.sh - helpers for the VM test cases in tests/vm/cases/.
# shellcheck shell=dash
# (busybox ash in the guest: POSIX plus `local`, as dash)
#
# Sourced inside the guest by busybox sh (ash: POSIX plus `local`, no bash
# features), as the first thing a case does:
#     . "$(dirname "$0")/../guest-lib.sh"
#
# Checks print one TAP-like line each, "ok - DESC" or "not ok - DESC (detail)";
# `finish` prints "N passed, N failed" and exits 1 if any check failed (or none
# ran). The daemon helpers start scx_zernel in the background and follow the
# kernel's sched_ext state in /sys/kernel/sched_ext.
#
#   zernel_start CONFIG [ARGS...]   start `scx_zernel --config CONFIG ARGS`,
#                                   wait <= 30 s until attached; sets ZPID
#   zernel_stop [SIGNAL]            signal it (TERM), reap it into ZRC, wait
#                                   <= 10 s for state `disabled`
#   sched_state, ops_name           the kernel's view
#   check / assert_true DESC CMD... assert_eq DESC GOT WANT
#   assert_ge DESC A B, assert_gt DESC A B (integers)
#   wait_until SECS CMD...          poll CMD every 0.2 s (1 s from 300 s) until it succeeds
#   zcounter CLASS STAT [SNAP], zcounter_sum STAT, zglobal NAME, ztask TID FIELD
#                                   values from `scx_zernel inspect`
#   zentries, zholds COMM CLASS SLICE PREEMPT
#                                   the kernel's entries by thread name
#   ztask_is TID FIELD VALUE, zcounter_gt CLASS STAT N, file_gt FILE N
#                                   conditions for wait_until
#   tids_by_comm NAME               TIDs of all threads whose comm is NAME
#   other_tid PID                   a thread of PID other than the main one
#   sleep_until T                   sleep until uptime T (fractional seconds)
#   secs_since T                    seconds (tenths) from uptime T to now
#   alive PID                       PID exists and is not a zombie
#   dmesg_new, dmesg_clean          kernel log since the case started
#   finish

ZLOG=/tmp/zernel.log    # the daemon's stdout+stderr
ZPID=""                 # the running daemon, set by zernel_start
ZRC=""                  # its exit status, set by zernel_stop
_zpass=0 _zfail=0 _zlog_shown=0 _zfailed=""

# Seconds since boot, with hundredths (the kernel log's clock).
uptime_s() { cut -d' ' -f1 /proc/uptime; }
# sleep_until T : sleeps until uptime T (seconds, fractional).
sleep_until() {
  local s
  s=$(awk -v t="$1" -v n="$(uptime_s)" 'BEGIN { d = t - n; printf "%.2f", (d > 0 ? d : 0) }')
  sleep "$s"
}
# secs_since T : seconds, to a tenth, from uptime T until now.
secs_since() { awk -v a="$1" -v b="$(uptime_s)" 'BEGIN { printf "%.1f", b - a }'; }

# Kernel log lines are judged from this mark on: boot itself logs lines such as
# "NMI watchdog: Perf NMI watchdog permanently disabled" that say nothing about
# the scheduler. The mark also shows in the kernel log where the case began.
_zmark="guest-lib: case ${0##*/} (pid $$) starts"
echo "<6>$_zmark" >/dev/kmsg

# ---- reporting -------------------------------------------------------------------
_ok() { _zpass=$((_zpass + 1)); echo "ok - $1"; }
_notok() {
  local line="not ok - $1${2:+ ($2)}"
  _zfail=$((_zfail + 1))
  echo "$line"
  _zfailed="$_zfailed
$line"
}

# check DESC CMD... : passes when CMD exits 0 (CMD's own output is shown).
check() {
  local desc=$1; shift
  if "$@"; then _ok "$desc"; else _notok "$desc" "exit $?: $*"; fi
}
assert_true() { check "$@"; }

# assert_eq DESC GOT WANT : string equality.
assert_eq() {
  if [ "$2" = "$3" ]; then _ok "$1"; else _notok "$1" "got '$2', want '$3'"; fi
}

_is_int() { case $1 in '' | - | *[!0-9-]* | ?*-*) return 1 ;; esac; }
_int_cmp() {   # _int_cmp ge|gt DESC A B
  if ! _is_int "$3" || ! _is_int "$4"; then _notok "$2" "not integers: '$3' -$1 '$4'"; return; fi
  if case $1 in ge) [ "$3" -ge "$4" ] ;; gt) [ "$3" -gt "$4" ] ;; esac; then _ok "$2"
  else _notok "$2" "got $3, want -$1 $4"; fi
}
# assert_ge DESC A B : A >= B ; assert_gt DESC A B : A > B (integers).
assert_ge() { _int_cmp ge "$@"; }
assert_gt() { _int_cmp gt "$@"; }

# wait_until SECS CMD... : true as soon as CMD succeeds, false once SECS
# seconds of the guest's clock have passed (however long each try takes).
# The clock is read with the shell's own `read` (no process per check), and
# long waits poll once a second: every process started here is one more the
# daemon discovers and scans, load on the guest that slows what is awaited.
wait_until() {
  local end up step=0.2
  [ "$1" -ge 300 ] && step=1
  read -r up _ </proc/uptime
  end=$(( ${up%.*} + $1 )); shift
  while read -r up _ </proc/uptime && [ "${up%.*}" -lt "$end" ]; do
    "$@" && return 0
    sleep "$step"
  done
  "$@"
}

# ---- kernel state ------------------------------------------------------------------
sched_state() { cat /sys/kernel/sched_ext/state 2>/dev/null; }
ops_name() { cat /sys/kernel/sched_ext/root/ops 2>/dev/null; }
_zernel_attached() {
  [ "$(sched_state)" = enabled ] && case $(ops_name) in zernel*) true ;; *) false ;; esac
}

# alive PID : the process exists and is not a zombie. (kill -0 succeeds on a
# zombie, so it cannot tell that an unreaped child has exited.) Starts no
# process: wait loops call it every fraction of a second, inside
# measurement windows too.
alive() {
  local st
  { IFS= read -r st <"/proc/$1/stat"; } 2>/dev/null || return 1
  st=${st##*) } st=${st%% *}
  [ -n "$st" ] && [ "$st" != Z ] && [ "$st" != X ]
}

# ---- the daemon -------------------------------------------------------------------
# zernel_start CONFIG [ARGS...]
zernel_start() {
  local cfg=$1 t0 n=150   # 30 s in 0.2 s steps
  shift
  t0=$(uptime_s)
  scx_zernel --config "$cfg" "$@" >"$ZLOG" 2>&1 &
  ZPID=$!
  ZRC=""
  while [ $n -gt 0 ]; do
    if _zernel_attached; then
      _ok "scx_zernel attached ($(awk -v a="$t0" -v b="$(uptime_s)" 'BEGIN { printf "%.1f s", b - a }'))"
      return 0
    fi
    alive "$ZPID" || break
    sleep 0.2; n=$((n - 1))
  done
  if alive "$ZPID"; then kill -KILL "$ZPID" 2>/dev/null; fi
  wait "$ZPID"; ZRC=$?
  _notok "scx_zernel attached" "state=$(sched_state) ops='$(ops_name)' exit=$ZRC"
  echo "--- $ZLOG"; cat "$ZLOG"; echo "---"
  ZPID="" _zlog_shown=1
  return 1
}

# zernel_stop [SIGNAL] : SIGNAL defaults to TERM. Returns 1 if the daemon had to
# be killed or the state did not come back to `disabled`.
zernel_stop() {
  local sig=${1:-TERM} r=0 n=100   # 20 s to shut down
  if [ -z "$ZPID" ]; then echo "zernel_stop: no daemon running"; ZRC=""; return 1; fi
  kill "-$sig" "$ZPID" 2>/dev/null
  while alive "$ZPID" && [ $n -gt 0 ]; do sleep 0.2; n=$((n - 1)); done
  if alive "$ZPID"; then
    echo "zernel_stop: scx_zernel still running 20 s after SIG$sig; sending KILL"
    kill -KILL "$ZPID"; r=1
  fi
  # Only this PID: a bare `wait` would also wait for every other background job.
  wait "$ZPID"; ZRC=$?
  ZPID=""
  n=50    # 10 s for the kernel to finish disabling
  while [ "$(sched_state)" != disabled ] && [ $n -gt 0 ]; do sleep 0.2; n=$((n - 1)); done
  if [ "$(sched_state)" != disabled ]; then
    echo "zernel_stop: sched_ext state is '$(sched_state)' 10 s after scx_zernel exited"; r=1
  fi
  return $r
}

# ---- scx_zernel inspect ------------------------------------------------------------
# zcounter CLASS STAT [SNAP] : e.g. `zcounter batch enqueued`; empty if
# unavailable. With SNAP (the output of one `scx_zernel inspect`), read from it:
# counters compared with each other are then read at one instant.
zcounter() {
  if [ $# -ge 3 ]; then printf '%s\n' "$3"; else scx_zernel inspect 2>/dev/null; fi |
    awk -v c="$1" -v s="$2" '$1 == "counter" && $2 == c && $3 == s { print $4 }'
}
# zcounter_sum STAT : STAT summed over the four classes; empty if any is missing.
zcounter_sum() {
  scx_zernel inspect 2>/dev/null | awk -v s="$1" '$1 == "counter" && $3 == s { n++; sum += $4 }
    END { if (n == 4) print sum }'
}
# zglobal NAME [SNAP] : e.g. `zglobal map_hit`; with SNAP, read from it (as zcounter).
zglobal() {
  if [ $# -ge 2 ]; then printf '%s\n' "$2"; else scx_zernel inspect 2>/dev/null; fi |
    awk -v n="$1" '$1 == "global" && $2 == n { print $3 }'
}
# ztask_is TID FIELD VALUE : the kernel's entry for TID has FIELD = VALUE.
ztask_is() { [ "$(ztask "$1" "$2")" = "$3" ]; }
# zcounter_gt CLASS STAT N : that counter is above N.
zcounter_gt() { local v; v=$(zcounter "$1" "$2"); _is_int "$v" && [ "$v" -gt "$3" ]; }
# file_gt FILE N : FILE holds an integer above N (a workload's progress count).
file_gt() { local v; v=$(cat "$1" 2>/dev/null); _is_int "$v" && [ "$v" -gt "$2" ]; }
# need_torch : PY = the Python with PyTorch the harness passes in
# ZERNEL_PYTHON (--host-root cases); without one the case ends, failed.
need_torch() {
  PY=${ZERNEL_PYTHON:-}
  if [ -z "$PY" ] || ! [ -x "$PY" ]; then
    _notok "a Python with PyTorch (ZERNEL_PYTHON='$PY'; scripts/setup-deps.sh installs it)"
    finish
  fi
}
# ensure_user NAME UID GID GROUP : a passwd and a group entry, for `su NAME`.
ensure_user() {
  grep -q "^$1:" /etc/passwd || echo "$1:x:$2:$3:$1:/:/bin/sh" >>/etc/passwd
  grep -q "^$4:" /etc/group || echo "$4:x:$3:" >>/etc/group
}
# ztunable KEY : what the loaded program holds, e.g. `ztunable slice_us.batch`.
ztunable() {
  scx_zernel inspect 2>/dev/null | awk -v k="$1" '$1 == "tunable" && $2 == k { print $3 }'
}
# ztask TID FIELD : e.g. `ztask 123 class`; empty if the map has no entry.
ztask() {
  scx_zernel inspect --tid "$1" 2>/dev/null | tr ' ' '\n' | awk -F= -v f="$2" '$1 == f { print substr($0, length(f) + 2) }'
}

# zentries : the kernel's entries now, one "<comm> <class> <slice_us> <preempt>"
# line each (spaces in comm become _; entries of exited threads are left out).
# Two processes in all, however many entries: under emulation with every CPU
# busy, a fork per entry would make one round take seconds.
zentries() {
  scx_zernel inspect --entries 2>/dev/null | awk '{
    for (i = 1; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
    file = "/proc/" f["tid"] "/comm"
    if ((getline comm < file) > 0) { gsub(/ /, "_", comm); print comm, f["class"], f["slice_us"], f["preempt"] }
    close(file)
  }'
}

# zholds COMM CLASS SLICE PREEMPT : the kernel holds that entry for a thread
# named COMM now ('*' for any value of a field).
zholds() {
  zentries | awk -v c="$1" -v k="$2" -v s="$3" -v p="$4" '
    ($1 == c) && (k == "*" || $2 == k) && (s == "*" || $3 == s) && (p == "*" || $4 == p) { found = 1 }
    END { exit !found }'
}

# zsample SECS FILE [PID] : the kernel's entries (zentries), read every 0.2 s
# for SECS s (or until PID exits, or FILE.done exists), appended to FILE, one
# line per entry per round.
zsample() {
  local end
  end=$(( $(cut -d. -f1 /proc/uptime) + $1 ))
  while [ "$(cut -d. -f1 /proc/uptime)" -lt "$end" ]; do
    if [ -n "${3:-}" ] && ! alive "$3"; then break; fi
    [ -e "$2.done" ] && break
    zentries >>"$2"
    sleep 0.2
  done
}

# zernel_sampled CFG SECS OUT [CMD...] : scx_zernel with CFG, its entries
# sampled (zsample) for SECS s into OUT while CMD, if given, runs; then how
# often each thread held each class, and the daemon stopped (SIGTERM, exit 0
# asserted). Returns 1 if it did not attach.
zernel_sampled() {
  local cfg=$1 secs=$2 out=$3 zs
  shift 3
  zernel_start "$cfg" || return 1
  : >"$out"
  rm -f "$out.done"
  zsample "$secs" "$out" &
  zs=$!
  if [ $# -gt 0 ]; then "$@"; fi
  wait "$zs"
  sort "$out" | cut -d' ' -f1,2 | uniq -c
  zernel_stop TERM
  assert_eq "${cfg##*/}: exit 0" "$ZRC" 0
}

# The keys cases (ml_keys, phase_keys): one daemon run per config, each
# sampled into its own file under $W.
# keys_run NAME SECS HEADER STOP [LINE...] : $W/NAME.toml is HEADER then one
# LINE a line (printed); scx_zernel runs with it, its entries sampled into
# $W/NAME (zernel_sampled) while `STOP NAME SECS` runs (at most SECS s).
keys_run() {
  local name=$1 secs=$2 header=$3 stop=$4
  shift 4
  {
    printf '%s\n' "$header"
    for line in "$@"; do echo "$line"; done
  } >"$W/$name.toml"
  echo "--- run $name"; cat "$W/$name.toml"
  zernel_sampled "$W/$name.toml" "$secs" "$W/$name" "$stop" "$name" "$secs"
}
run_held() { grep -q "^$2 $3 " "$W/$1"; }     # run_held RUN COMM CLASS: a keys_run's samples
run_none() { ! grep -q "^$2 " "$W/$1"; }      # run_none RUN COMM

# tids_by_comm NAME : TIDs (one a line) of every thread whose comm is NAME.
# No command substitution or external command per thread: under TCG with every
# CPU busy, a fork per thread would make one call take seconds.
tids_by_comm() {
  local f comm
  for f in /proc/[0-9]*/task/[0-9]*/comm; do
    read -r comm <"$f" 2>/dev/null || continue
    [ "$comm" = "$1" ] || continue
    f=${f%/comm}; echo "${f##*/}"
  done
  return 0
}
# other_tid PID : a thread of PID other than the main one (none: empty).
other_tid() {
  local t
  for t in /proc/"$1"/task/*; do
    [ "${t##*/}" != "$1" ] && { echo "${t##*/}"; return; }
  done
}

# ---- how much a thread runs -------------------------------------------------------
# schedstat_of PID TID : "ns_on_cpu ns_waiting" of thread TID of PID (its
# schedstat, fields 1 and 2): the kernel's own account, which a slow host
# does not distort as a share of wall-clock time would.
schedstat_of() { cut -d' ' -f1,2 "/proc/$1/task/$2/schedstat"; }

# sched_sum PID... : "ns_on_cpu ns_waiting timeslices", summed over every
# thread of each PID.
sched_sum() {
  local p
  for p in "$@"; do cat /proc/"$p"/task/*/schedstat 2>/dev/null; done |
    awk '{ r += $1; w += $2; n += $3 } END { printf "%.0f %.0f %.0f\n", r, w, n }'
}
# field "A B C" N : field N (1-based) of a sched_sum (or any spaced) line.
field() { echo "$1" | cut -d' ' -f"$2"; }
# stat_of PID FIELD : field FIELD of /proc/PID/stat, numbered as in proc(5)
# (3 = state, 19 = nice, 39 = processor, 41 = policy). PID may be PID/task/TID.
stat_of() { sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f$(($2 - 2)); }
# run_pct "BEFORE" "AFTER" : the share of its runnable time the thread spent
# on a CPU between two schedstat_of readings, in %.
run_pct() {
  # shellcheck disable=SC2086 # split into numbers on purpose
  set -- $1 $2
  echo $((($3 - $1) * 100 / ($3 - $1 + $4 - $2 + 1)))
}

# ---- a fake GPU -----------------------------------------------------------------------
# gpu_on_node1_config FILE : writes FILE, a config whose GPU data comes from
# /tmp/gpu.json (one idle GPU 0, written too) and which pins GPU 0 to node 1.
gpu_on_node1_config() {
  cat >/tmp/gpu.json <<'JSON'
{ "devices": [ { "index": 0, "uuid": "GPU-fake-0", "pci_bus_id": "00000000:3B:00.0", "util": 0 } ] }
JSON
  cat >"$1" <<'TOML'
[gpu]
provider = "file"
file = "/tmp/gpu.json"

[topology]
gpu_node = [{ gpu = 0, node = 1 }]
TOML
}

# ---- kernel log --------------------------------------------------------------------
# dmesg_new : kernel log lines logged since this case started (the whole log
# if the mark has been overwritten: stricter rather than blind).
dmesg_new() {
  dmesg | awk -v m="$_zmark" '{ line[n++] = $0 } index($0, m) { from = n } END { for (i = from; i < n; i++) print line[i] }'
}

# dmesg_clean : true when the kernel logged no sign of trouble since the case
# started: BUG/WARNING splats, oopses, lockups, RCU or sched_ext stalls, watchdog
# reports, or a BPF scheduler that was disabled for an error rather than by its
# own exit. Everything logged in that window happened while the scheduler was
# under test, so a splat anywhere in the kernel counts. The offending lines are
# printed. Not counted: the clocksource watchdog giving up on the TSC (`tsc:
# Marking TSC unstable due to clocksource watchdog`, after `clocksource:
# timekeeping watchdog on CPUn: Marking clocksource 'tsc' as unstable`), which
# TCG's clock can set off at any time, whatever the scheduler.
_ZTROUBLE='BUG|WARNING|Oops|stall|watchdog|lockup|hung task|sched_ext: .*(error|disabled \((runtime|scx_bpf|runnable))'
_ZBENIGN='Marking TSC unstable due to clocksource watchdog|timekeeping watchdog on CPU[0-9]+: Marking clocksource'
# ktrouble : the lines of stdin that are signs of trouble.
ktrouble() { grep -E "$_ZTROUBLE" | grep -vE "$_ZBENIGN"; }
dmesg_clean() {
  local bad
  bad=$(dmesg_new | ktrouble)
  [ -z "$bad" ] && return 0
  echo "$bad"
  return 1
}

# ---- the end -------------------------------------------------------------------------
# finish : summary line; exit 1 if any check failed. On failure it also shows the
# daemon's log and the kernel log since the case started, then the failed
# checks again, last, where a cut log still shows them.
finish() {
  [ $((_zpass + _zfail)) -gt 0 ] || _notok "the case ran at least one check"
  if [ $_zfail -gt 0 ]; then
    if [ -s "$ZLOG" ] && [ $_zlog_shown = 0 ]; then echo "--- $ZLOG (last 40 lines)"; tail -n 40 "$ZLOG"; fi
    local klog
    klog=$(dmesg_new)
    echo "--- kernel log since the case started (last 40 lines)"; printf '%s\n' "$klog" | tail -n 40
    echo "--- kernel log lines that are signs of trouble (first 20)"; printf '%s\n' "$klog" | ktrouble | head -n 20
    echo "--- the failed checks$_zfailed"
  fi
  echo "$_zpass passed, $_zfail failed"
  [ $_zfail -eq 0 ] || exit 1
  exit 0
}
