#!/bin/sh
# shellcheck shell=dash
# (runs under busybox ash in the guest: POSIX plus `local`, as dash)
# guest.sh - the guest half of the benchmark (bench/run.sh boots the VM).
#
#   sh bench/guest.sh [--short] [--reps N] [--scheds "eevdf zernel bpfland lavd"]
#                     [--cases ml,latency,cost]
#
# Runs every case (or those --cases names) under each scheduler in turn, in
# one boot. Repetitions are interleaved, odd ones in --scheds order and even
# ones in reverse (rep 1: eevdf zernel bpfland lavd, rep 2: lavd bpfland
# zernel eevdf, ...), so that neither a slow phase of the host (TCG shares its
# cores) nor the place in the sequence lands on one scheduler only. Each
# scheduler is attached before its cases and detached after them; the
# kernel's sched_ext state is checked both times.
#
# Schedulers: eevdf (no sched_ext scheduler), zernel (scx_zernel), zernel_base
# (scx_zernel_base: scx_zernel built at an earlier commit, bench/run.sh
# --baseline; same --config, its ops name starts with "zernel" too), any other
# NAME (scx_NAME, no arguments).
#
# Cases (durations: full / --short):
#   ml       zernel-workload train alone (30 s / 6 s), then again with
#            `stress-ng --cpu 8` hogs on the 4 vCPUs (2x oversubscription).
#            Steps/s, fake-GPU busy fraction and loader-wait p99 from the
#            trainer's last line; its CPU time from `time -p`; the hogs' CPU
#            time over the trainer's run from /proc, their bogo ops/s from
#            stress-ng's --metrics-brief. Under a sched_ext scheduler, the
#            run_time_ns/run_cnt (kernel.bpf_stats_enabled) of every BPF
#            program the scheduler process holds an fd of (struct_ops, and
#            tp_btf/fentry/lsm ones) are read from its fdinfo before and after
#            the contended run: ns per call of each, ns per struct_ops call,
#            and BPF ns per scheduling event = the time of all its programs /
#            the calls of its enqueue program (name contains "enqueue").
#   latency  cyclictest (SCHED_OTHER threads: an RT thread would bypass
#            sched_ext) under `stress-ng --cpu 4`: p99, max and average of
#            every sample (-v);
#            then a messaging benchmark alone: `perf bench sched messaging`
#            if perf runs here, else rt-tests' hackbench (same benchmark).
#   cost     sched_ext schedulers only: the scheduler process's CPU time
#            (utime+stime) over a 10 s window (2 s --short) while a process
#            with 2,000 mostly idle threads (300 --short) runs, ML (rank
#            environment) and not.
#
# Output: one line per measurement, for bench/report.py:
#   BENCH sched=NAME rep=N metric=NAME value=NUMBER
#   BENCHMETA key=value...          facts about the run (tool versions, ...)
#   BENCHNOTE sched=NAME text...    something a reader of the results must know
#   BENCHWIN sched=NAME rep=N case=NAME start=EPOCH end=EPOCH
#                                   a measurement window on the guest's clock
#                                   (qemu's RTC: the host's time at boot), for
#                                   the host's load over it (bench/run.sh)
# plus guest-lib's "ok - ..." / "not ok - ..." checks and its final
# "N passed, N failed" line; exit 1 if a check failed.
# shellcheck disable=SC2317 source=tests/vm/guest-lib.sh
. "$(dirname "$0")/../tests/vm/guest-lib.sh"

REPS=3 SHORT=0 SCHEDS="eevdf zernel bpfland lavd" CASES=ml,latency,cost
while [ $# -gt 0 ]; do
  case $1 in
    --short) SHORT=1 ;;
    --reps) REPS=$2; shift ;;
    --scheds) SCHEDS=$2; shift ;;
    --cases) CASES=$2; shift ;;
    *) echo "guest.sh: unknown argument '$1'"; exit 2 ;;
  esac
  shift
done
for c in $(echo "$CASES" | tr , ' '); do
  case $c in ml|latency|cost) ;; *) echo "guest.sh: unknown case '$c' (ml, latency, cost)"; exit 2 ;; esac
done
# has_case NAME : NAME is one of the cases to run.
has_case() { case ",$CASES," in *",$1,"*) return 0 ;; esac; return 1; }

if [ $SHORT = 1 ]; then
  TRAIN_S=6 CT_S=3 MSG_ARGS="-g 2 -l 20" THREADS=300 SETTLE_S=2 WINDOW_S=2
else
  TRAIN_S=30 CT_S=10 MSG_ARGS="-g 4 -l 50" THREADS=2000 SETTLE_S=5 WINDOW_S=10
fi
NCPU=$(grep -c '^processor' /proc/cpuinfo)
W=/tmp/bench
mkdir -p "$W"

# ---- small helpers ------------------------------------------------------------------
# result SCHED REP METRIC VALUE : one result line (nothing if VALUE is empty).
result() {
  [ -n "$4" ] || { echo "# no value for $1 rep $2 $3"; return; }
  echo "BENCH sched=$1 rep=$2 metric=$3 value=$4"
}
# calc EXPR : floating-point arithmetic (awk), e.g. calc "1 / 3".
calc() { awk "BEGIN { printf \"%.6g\", $1 }"; }
# up_cs : time since boot in hundredths of a second (an integer).
up_cs() { tr -d . </proc/uptime | cut -d' ' -f1; }
# field KEY FILE : the value of KEY=value in the last line of FILE holding it.
field() { tr ' ' '\n' <"$2" | sed -n "s/^$1=//p" | tail -n1; }
# ticks_of PID : utime+stime of a whole process, in clock ticks (1/100 s).
ticks_of() { sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | awk '{ print $12 + $13 }'; }
# ticks_by_comm PREFIX : utime+stime summed over processes whose comm starts
# with PREFIX. cat, not awk on the glob: a process that exits in between makes
# cat skip its file, where awk would stop.
ticks_by_comm() {
  cat /proc/[0-9]*/stat 2>/dev/null | awk -v p="($1" '
    substr($2, 1, length(p)) == p { s = $0; sub(/^.*\) /, "", s); split(s, f, " "); t += f[12] + f[13] }
    END { print t + 0 }'
}
# stop_bg PID : SIGINT a background job and reap it.
stop_bg() { kill -INT "$1" 2>/dev/null; wait "$1" 2>/dev/null; }

# ---- schedulers -------------------------------------------------------------------------
SPID=""     # the running sched_ext scheduler's process

# sched_start NAME : attach scheduler NAME (eevdf: check nothing is attached).
# Waits <= 90 s for state `enabled` with an ops name starting with the
# scheduler's (zernel_base's: "zernel"; lavd's BPF program takes a while to
# verify under TCG).
sched_start() {
  local n=450 t0
  assert_eq "[$1] sched_ext is disabled before" "$(sched_state)" disabled
  [ "$1" = eevdf ] && return 0
  t0=$(up_cs)
  case $1 in
    zernel|zernel_base) "scx_$1" --config "$W/zernel.toml" >"$W/sched.log" 2>&1 & ;;
    *) "scx_$1" >"$W/sched.log" 2>&1 & ;;
  esac
  SPID=$!
  while [ $n -gt 0 ]; do
    if [ "$(sched_state)" = enabled ]; then
      case $(ops_name) in "${1%_base}"*)
        _ok "[$1] attached: state enabled, ops $(ops_name) ($(calc "($(up_cs) - $t0) / 100") s)"
        return 0 ;;
      esac
    fi
    alive "$SPID" || break
    sleep 0.2; n=$((n - 1))
  done
  _notok "[$1] attached" "state=$(sched_state) ops='$(ops_name)'"
  echo "--- scheduler log (last 30 lines)"; tail -n 30 "$W/sched.log"; echo "---"
  alive "$SPID" && kill -KILL "$SPID"
  wait "$SPID" 2>/dev/null; SPID=""
  return 1
}

# sched_stop NAME : SIGINT the scheduler, wait <= 20 s for its exit and <= 10 s
# for state `disabled`.
sched_stop() {
  local n=100 rc
  if [ -n "$SPID" ]; then
    alive "$SPID" || echo "# [$1] the scheduler exited before it was stopped"
    kill -INT "$SPID" 2>/dev/null
    while alive "$SPID" && [ $n -gt 0 ]; do sleep 0.2; n=$((n - 1)); done
    alive "$SPID" && kill -KILL "$SPID"
    wait "$SPID"; rc=$?
    SPID=""
    assert_eq "[$1] exits 0 on SIGINT" "$rc" 0
    [ "$rc" = 0 ] || { echo "--- scheduler log (last 30 lines)"; tail -n 30 "$W/sched.log"; echo "---"; }
  fi
  n=50
  while [ "$(sched_state)" != disabled ] && [ $n -gt 0 ]; do sleep 0.2; n=$((n - 1)); done
  assert_eq "[$1] sched_ext is disabled after" "$(sched_state)" disabled
}

# bpf_symbols : the names of the loaded BPF programs by tag, from their kallsyms
# symbols bpf_prog_<tag>_<name> (fdinfo has no name). Reading /proc/kallsyms
# takes seconds under TCG, so this runs once per attach, outside any
# measurement window.
bpf_symbols() {
  grep ' bpf_prog_' /proc/kallsyms |
    awk '$3 ~ /^bpf_prog_/ { s = substr($3, 10); print substr(s, 1, 16), substr(s, 18) }' >"$W/bpfsyms"
}

# bpf_snapshot PID : one line per BPF program the process holds an fd of, of
# any type: "prog_id type name run_time_ns run_cnt" (type struct_ops, tracing
# for tp_btf/fentry, lsm, else typeN). A program's own fd has a prog_type
# line; a link's fd names its program (prog_id) without one and is skipped.
bpf_snapshot() {
  cat "/proc/$1/fdinfo/"* 2>/dev/null | awk -v syms="$W/bpfsyms" '
    BEGIN { while ((getline l < syms) > 0) { split(l, a, " "); name[a[1]] = a[2] }
            tn[26] = "tracing"; tn[27] = "struct_ops"; tn[29] = "lsm" }
    function flush() {
      if (id != "" && type != "" && !seen[id]++)
        print id, (type in tn ? tn[type] : "type" type), (tag in name ? name[tag] : "tag_" tag), rt, rc
      id = ""; type = ""; tag = ""; rt = 0; rc = 0
    }
    /^pos:/ { flush() }
    /^prog_type:/ { type = $2 }
    /^prog_tag:/ { tag = $2 }
    /^prog_id:/ { id = $2 }
    /^run_time_ns:/ { rt = $2 }
    /^run_cnt:/ { rc = $2 }
    END { flush() }'
}

# bpf_report SCHED REP BEFORE AFTER SECS : between two snapshots SECS apart,
# per program: ns per call, calls/s, its time per scheduling event and its
# type; over the struct_ops programs: ns per call (total time / total calls);
# over all programs: BPF ns per scheduling event (total time / calls of the
# enqueue program), and the same for the struct_ops programs alone.
bpf_report() {
  awk -v s="$1" -v r="$2" -v before="$3" -v secs="$5" '
    function out(m, fmt, v) { printf "BENCH sched=%s rep=%s metric=%s value=" fmt "\n", s, r, m, v }
    FILENAME == before { t0[$1] = $4; c0[$1] = $5; next }
    { dt = $4 - t0[$1]; dc = $5 - c0[$1]; T += dt
      if ($2 == "struct_ops") { TS += dt; CS += dc }
      if ($3 ~ /enqueue/) E += dc
      if (dc > 0) { n++; name[n] = $3; type[n] = $2; pt[n] = dt; pc[n] = dc } }
    END {
      for (i = 1; i <= n; i++) {
        out("bpf_ns." name[i], "%.1f", pt[i] / pc[i])
        out("bpf_calls_per_s." name[i], "%.1f", pc[i] / secs)
        if (E > 0) out("bpf_event_ns." name[i], "%.2f", pt[i] / E)
        print "BENCHMETA bpf_type." name[i] "=" type[i]
      }
      if (CS > 0) out("bpf_ns_avg", "%.1f", TS / CS)
      if (E > 0) {
        out("bpf_ns_per_event", "%.1f", T / E)
        out("bpf_ns_per_event_struct_ops", "%.1f", TS / E)
        out("bpf_events_per_s", "%.1f", E / secs)
      }
    }
  ' "$3" "$4"
}

# zernel_classes BIN : what the kernel map of scx_zernel (or BIN, another build
# of it) holds right now, as counts of "comm class" over its entries (a
# diagnostic for the guest log).
zernel_classes() {
  "$1" inspect --entries 2>/dev/null | while read -r tid class _; do
    tid=${tid#tid=} class=${class#class=}
    comm=$(tr ' ' _ <"/proc/$tid/comm" 2>/dev/null) && echo "$comm $class"
  done | sort | uniq -c | sort -rn | head -n 12 | tr -s ' \n' ' '
}

# ---- case 1: the ML pipeline -------------------------------------------------------------
# train_run OUT : run the trainer for TRAIN_S seconds; its last line goes to
# OUT, `time -p` output (its CPU time, DataLoader workers included) to OUT.time.
train_run() {
  time -p zernel-workload train --gpu-file "$W/gpu.json" --secs "$TRAIN_S" --workers 2 \
    --data-dir "$W/data" >"$1.full" 2>"$1.time"
  grep '^zernel-workload train steps=' "$1.full" | tail -n1 >"$1"
  [ -s "$1" ] || { echo "# trainer output:"; cat "$1.full" "$1.time"; }
}
# cpu_secs FILE : user+sys seconds from `time -p` output.
cpu_secs() { awk '$1 == "user" || $1 == "sys" { t += $2 } END { print t + 0 }' "$1"; }
# ml_cpu_frac FILE : (user+sys) / real from `time -p` output: the CPUs the
# ML job used on average over its run.
ml_cpu_frac() {
  awk '$1 == "user" || $1 == "sys" { t += $2 } $1 == "real" { r = $2 }
    END { if (r > 0) printf "%.4f\n", t / r }' "$1"
}

case_ml() {
  local s="$1" r="$2" hp h0 h1 u0 u1 b0 b1 ml_cpu win dp e0
  # Alone.
  train_run "$W/iso"
  result "$s" "$r" ml_iso_steps_per_sec "$(field steps_per_sec "$W/iso")"
  result "$s" "$r" ml_iso_gpu_busy_frac "$(field gpu_busy_frac "$W/iso")"
  result "$s" "$r" ml_iso_loader_p99_ms "$(field loader_wait_p99_ms "$W/iso")"
  result "$s" "$r" ml_iso_cpu "$(ml_cpu_frac "$W/iso.time")"

  # With 2x oversubscription: 8 hogs on 4 vCPUs. They run from 1 s before the
  # trainer starts until it ends (SIGINT: stress-ng then prints its metrics).
  # The window of every measurement is the trainer's run: from just before it
  # starts to just after it ends.
  [ -n "$SPID" ] && bpf_symbols
  stress-ng --cpu $((2 * NCPU)) --timeout 3600s --metrics-brief >"$W/hogs.out" 2>&1 &
  hp=$!
  sleep 1
  [ -n "$SPID" ] && bpf_snapshot "$SPID" >"$W/bpf0" && b0=$(ticks_of "$SPID")
  h0=$(ticks_by_comm stress-ng) u0=$(up_cs) e0=$(date +%s)
  # Half-way through, which classes the ML threads have in scx_zernel's map.
  # Every build of scx_zernel alike: the dump forks processes, whose BPF time
  # (init_task, process events) the window counts.
  dp=""
  case $s in zernel|zernel_base)
    ( sleep $((TRAIN_S / 2)); echo "# [$s] map mid-run with hogs: $(zernel_classes "scx_$s")" ) &
    dp=$!
  esac
  train_run "$W/con"
  [ -n "$dp" ] && wait "$dp"   # only that job: the hogs are a background job too
  h1=$(ticks_by_comm stress-ng) u1=$(up_cs)
  [ -n "$SPID" ] && bpf_snapshot "$SPID" >"$W/bpf1" && b1=$(ticks_of "$SPID")
  echo "BENCHWIN sched=$s rep=$r case=ml_con start=$e0 end=$(date +%s)"
  stop_bg "$hp"
  win=$(calc "($u1 - $u0) / 100")
  ml_cpu=$(cpu_secs "$W/con.time")
  result "$s" "$r" ml_con_steps_per_sec "$(field steps_per_sec "$W/con")"
  result "$s" "$r" ml_con_gpu_busy_frac "$(field gpu_busy_frac "$W/con")"
  result "$s" "$r" ml_con_loader_p99_ms "$(field loader_wait_p99_ms "$W/con")"
  result "$s" "$r" ml_con_cpu "$(ml_cpu_frac "$W/con.time")"
  # The hogs' share of what the ML job left: their CPU time over the trainer's
  # run / (vCPUs x that time - the trainer's CPU time).
  result "$s" "$r" hogs_cpu "$(calc "($h1 - $h0) / 100 / $win")"
  result "$s" "$r" hogs_share_of_idle "$(calc "(($h1 - $h0) / 100) / ($NCPU * $win - $ml_cpu)")"
  result "$s" "$r" hogs_bogo_ops_per_s \
    "$(awk '$4 == "cpu" && $5 ~ /^[0-9]+$/ { print $9 }' "$W/hogs.out")"
  if [ -n "$SPID" ]; then
    bpf_report "$s" "$r" "$W/bpf0" "$W/bpf1" "$win"
    result "$s" "$r" sched_cpu_pct_ml_load "$(calc "($b1 - $b0) / $win")"
  fi
}

# ---- case 2: general latency --------------------------------------------------------------
# ct_parse FILE : "p99 max avg samples" in us, all threads together, from
# cyclictest -v output (one "thread: cycle: latency" line per sample; exact,
# where its histogram would cap at a fixed range that TCG latencies overrun).
ct_parse() {
  awk -F: 'NF == 3 && $1 ~ /^ *[0-9]+$/ && $3 ~ /^ *[0-9]+$/ { print $3 + 0 }' "$1" | sort -n |
    awk '{ v[NR] = $1; s += $1 }
      END { if (NR == 0) exit; i = int(NR * 0.99 + 0.999999); if (i < 1) i = 1
            printf "%d %d %d %d\n", v[i], v[NR], s / NR, NR }'
}

MSG_TOOL=""
msg_pick() {
  if command -v perf >/dev/null && perf bench sched messaging -g 1 -l 1 >/dev/null 2>&1; then
    MSG_TOOL=perf
  elif command -v hackbench >/dev/null; then
    MSG_TOOL=hackbench
  fi
  echo "BENCHMETA messaging_tool=${MSG_TOOL:-none} messaging_args=\"$MSG_ARGS\""
}
# msg_run : seconds one messaging run takes (perf prints "Total time: S [sec]",
# hackbench "Time: S").
msg_run() {
  # shellcheck disable=SC2086  # MSG_ARGS is a list of words
  case $MSG_TOOL in
    perf) perf bench sched messaging $MSG_ARGS 2>&1 ;;
    hackbench) hackbench $MSG_ARGS 2>&1 ;;
  esac | awk '/[Tt]ime:/ { v = $NF == "[sec]" ? $(NF - 1) : $NF } END { print v }'
}

case_latency() {
  local s="$1" r="$2" hp
  stress-ng --cpu "$NCPU" --timeout 3600s >/dev/null 2>&1 &
  hp=$!
  sleep 1
  cyclictest -q -m -t "$NCPU" -i 1000 -D "${CT_S}s" -v >"$W/ct.out" 2>&1
  stop_bg "$hp"
  # shellcheck disable=SC2046  # four numbers
  set -- "$s" "$r" $(ct_parse "$W/ct.out")
  result "$1" "$2" cyclictest_p99_us "${3:-}"
  result "$1" "$2" cyclictest_max_us "${4:-}"
  result "$1" "$2" cyclictest_avg_us "${5:-}"
  result "$1" "$2" cyclictest_samples "${6:-}"
  [ -n "$MSG_TOOL" ] && result "$1" "$2" messaging_secs "$(msg_run)"
}

# ---- case 3: the scheduler's own cost ------------------------------------------------------
case_cost() {
  local s="$1" r="$2" v tp d0 d1 u0 u1 n
  for v in ml plain; do
    if [ $v = ml ]; then set -- --ml; else set --; fi
    zernel-workload threads --count "$THREADS" --secs $((SETTLE_S + WINDOW_S + 30)) "$@" >"$W/thr.out" 2>&1 &
    tp=$!
    n=300   # 60 s to create the threads
    while ! grep -q ready "$W/thr.out" && alive "$tp" && [ $n -gt 0 ]; do sleep 0.2; n=$((n - 1)); done
    sleep "$SETTLE_S"   # the daemon discovers and classifies them
    d0=$(ticks_of "$SPID") u0=$(up_cs)
    sleep "$WINDOW_S"
    d1=$(ticks_of "$SPID") u1=$(up_cs)
    kill "$tp" 2>/dev/null; wait "$tp" 2>/dev/null
    # ticks are 1/100 s, as is up_cs: their ratio x 100 is % of one CPU.
    result "$s" "$r" "sched_cpu_pct_${v}_threads" "$(calc "($d1 - $d0) * 100 / ($u1 - $u0)")"
  done
}

# ---- main ---------------------------------------------------------------------------------
cat >"$W/zernel.toml" <<TOML
# The trainer's fake GPU, through the file GPU provider; everything else default.
[gpu]
provider = "file"
file = "$W/gpu.json"
TOML
sysctl -qw kernel.bpf_stats_enabled=1 2>/dev/null || echo 1 >/proc/sys/kernel/bpf_stats_enabled
assert_eq "kernel.bpf_stats_enabled is 1" "$(cat /proc/sys/kernel/bpf_stats_enabled)" 1
has_case latency && msg_pick
echo "BENCHMETA kernel=$(uname -r) vcpus=$NCPU mem_kib=$(awk '/MemTotal/ { print $2 }' /proc/meminfo) reps=$REPS short=$SHORT cases=$CASES train_s=$TRAIN_S cyclictest_s=$CT_S threads=$THREADS window_s=$WINDOW_S"
echo "BENCHMETA stress_ng=\"$(stress-ng --version 2>&1 | head -n1)\" cyclictest=\"$(cyclictest --help 2>&1 | head -n1)\""
for s in $SCHEDS; do
  case $s in
    zernel|zernel_base) v=$("scx_$s" --version 2>&1 | head -n1) ;;
    eevdf) v="kernel $(uname -r)" ;;
    *) v=$("scx_$s" --version 2>&1 | head -n1) ;;
  esac
  echo "BENCHMETA version.$s=\"$v\""
done
# Calibration: bogo ops per CPU-second of stress-ng's int64 method with every
# vCPU busy; bench/run.sh measures the same on one host core. The ratio is a
# rough factor of how much slower a guest CPU-second is than a native one.
stress-ng --cpu "$NCPU" --cpu-method int64 --timeout "$((SHORT ? 2 : 5))s" --metrics-brief 2>&1 |
  awk '$4 == "cpu" && $5 ~ /^[0-9]+$/ { print "BENCHMETA calib_guest_ops_per_cpu_s=" $10 }'
# Warm-up: the trainer's data files are made once, outside any measurement.
has_case ml && zernel-workload train --gpu-file "$W/gpu.json" --secs 1 --workers 1 --data-dir "$W/data" >/dev/null 2>&1

REVERSED=""
for s in $SCHEDS; do REVERSED="$s $REVERSED"; done
r=1
while [ "$r" -le "$REPS" ]; do
  order=$SCHEDS
  [ $((r % 2)) = 0 ] && order=$REVERSED
  for s in $order; do
    echo "# rep $r/$REPS: $s ($(uptime_s) s since boot)"
    if sched_start "$s"; then
      if has_case ml; then
        t=$(up_cs); case_ml "$s" "$r"
        echo "# [$s] ml: $(( ($(up_cs) - t) / 100 )) s"
      fi
      if has_case latency; then
        t=$(up_cs); case_latency "$s" "$r"
        echo "# [$s] latency: $(( ($(up_cs) - t) / 100 )) s"
      fi
      if [ "$s" != eevdf ] && has_case cost; then
        t=$(up_cs); case_cost "$s" "$r"
        echo "# [$s] cost: $(( ($(up_cs) - t) / 100 )) s"
      fi
      [ "$s" = eevdf ] || alive "$SPID" || _notok "[$s] still running after its cases"
    else
      echo "BENCHNOTE sched=$s rep $r: failed to attach, no results"
    fi
    sched_stop "$s"
  done
  r=$((r + 1))
done
check "dmesg is clean" dmesg_clean
finish
