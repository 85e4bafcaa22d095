#!/bin/sh
# shellcheck shell=dash
# (runs in the guest under the host's /bin/sh, dash: bench/run.sh boots it with vmrun --host-root)
# guest.sh - the guest half of the benchmark (bench/run.sh boots the VM).
#
#   sh bench/guest.sh [--short] [--reps N] [--scheds "eevdf zernel ..."]
#                     [--cases ml,torch,latency,cost]
#
# Runs every case (or those --cases names) under each scheduler in turn, in
# one boot. Repetitions are interleaved, odd ones in --scheds order and even
# ones in reverse (rep 1: eevdf zernel ... cosmos, rep 2: cosmos ... zernel
# eevdf), so that neither a slow phase of the host (TCG shares its cores) nor
# the place in the sequence lands on one scheduler only. Each scheduler is
# attached before its cases and detached after them; the kernel's sched_ext
# state is checked both times.
#
# Schedulers: eevdf (no sched_ext scheduler); rt (no sched_ext scheduler,
# the pipeline's processes and threads at SCHED_FIFO priority 10 through
# chrt: strict priority of the whole ML job over the hogs, the reference a
# CPU scheduler's ordering is measured against; the ml case only); zernel (scx_zernel, default
# configuration: no GPU data in this VM, the common case); zernel_gpu
# (scx_zernel given the sized trainer's fake GPU through its file GPU
# provider, standing in for NVML; the ml case only); zernel_flat (scx_zernel with a flat
# policy: every phase and every ML thread in the normal class, the control
# that shows what the phase policy earns); zernel_base (scx_zernel_base:
# scx_zernel built at an earlier commit, bench/run.sh --baseline, default
# configuration); any other NAME (scx_NAME, no arguments).
#
# Cases (sizes: full / --short):
#   ml       the sized pipeline: `zernel-workload train --steps N` (N = 150 /
#            30): two DataLoader worker processes decode each batch with a
#            fixed amount of CPU work, the trainer launches 20 fake-GPU
#            kernels a step (100 us-1 ms waits) and runs a fixed-work
#            optimizer step. Sizes come from `zernel-workload calibrate` on
#            the idle guest: decode 20 ms and optimizer 10 ms of an idle
#            vCPU's work. Alone, then with `stress-ng --cpu 2*vCPUs` (2x
#            oversubscription). Steps/s, fake-GPU busy fraction, loader-wait
#            p99, the job's CPU (the trainer's getrusage, workers included);
#            the hogs' CPU time over the trainer's run from /proc, their bogo
#            ops/s from stress-ng's --metrics-brief. Under a sched_ext
#            scheduler, the run_time_ns/run_cnt (kernel.bpf_stats_enabled)
#            of every BPF program the scheduler process holds an fd of
#            (struct_ops, and tp_btf/fentry/lsm ones) from its fdinfo before
#            and after the contended run: ns per call of each, ns per
#            struct_ops call, and BPF ns per scheduling event = the time of
#            all its programs / the calls of its enqueue program.
#   torch    real PyTorch on the CPU (ZERNEL_PYTHON: the venv
#            scripts/setup-deps.sh makes). tests/workloads/pytorch/train.py
#            (2 DataLoader workers) and serve.py start once per boot; between
#            measurements the trainer's process group is stopped (SIGSTOP),
#            so one `import torch` serves every scheduler. Per scheduler:
#            the trainer continued, 2 warm-up steps, K steps alone (K = 15 /
#            3), then hogs as above, 5 warm-up steps (the batches prefetched
#            alone are used up), K steps: steps/s on the
#            job's own clock (--step-times), its CPU from /proc (its process
#            group), the hogs' CPU. Then client.py sends N requests (N = 60
#            / 10) one after another to serve.py, alone and with the hogs:
#            requests/s, latency p50 and p99. Sizes are small (batches of 2,
#            a one-layer model of width 64, 8-token prompts, 2 new tokens):
#            TCG emulates floating point in software, ~200x slower than the
#            host, where integer code is ~3x.
#   latency  cyclictest (SCHED_OTHER threads: an RT thread would bypass
#            sched_ext) under `stress-ng --cpu vCPUs`: p99, max and average
#            of every sample (-v); then a messaging benchmark alone: `perf
#            bench sched messaging` if perf runs here, else rt-tests'
#            hackbench (same benchmark); then schbench (p99 wakeup latency
#            over a 30 s run, 3 s --short) if it is installed.
#   cost     sched_ext schedulers only: the scheduler process's CPU time
#            (utime+stime) over a 10 s window (2 s --short) while a process
#            with 2,000 mostly idle threads (300 --short) runs, ML (rank
#            environment) and not.
# At every attach: each BPF program's verified_insns (fdinfo: the
# instructions the verifier processed, veristat's figure).
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

REPS=3 SHORT=0 SCHEDS="eevdf zernel zernel_gpu zernel_flat bpfland lavd cosmos" CASES=ml,torch,latency,cost
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
  case $c in ml|torch|latency|cost) ;; *) echo "guest.sh: unknown case '$c' (ml, torch, latency, cost)"; exit 2 ;; esac
done
# has_case NAME : NAME is one of the cases to run.
has_case() { case ",$CASES," in *",$1,"*) return 0 ;; esac; return 1; }

if [ $SHORT = 1 ]; then
  ML_STEPS=30 TORCH_STEPS=3 INFER_REQS=10 CT_S=3 MSG_ARGS="-g 2 -l 20" SCH_S=3 THREADS=300 SETTLE_S=2 WINDOW_S=2
else
  ML_STEPS=150 TORCH_STEPS=15 INFER_REQS=60 CT_S=10 MSG_ARGS="-g 4 -l 50" SCH_S=30 THREADS=2000 SETTLE_S=5 WINDOW_S=10
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
# snap_ticks PGRP : "JOB HOGS UP IDLE IRQ" from one pass over /proc: the CPU
# ticks (utime+stime) of process group PGRP ("-": none) and of the stress-ng
# processes, the uptime (cs) half-way through that pass (it reads the clock
# before and after), the ticks all vCPUs spent idle (/proc/stat's cpu line:
# idle + iowait) and those in no task (irq + softirq + steal). Under TCG one
# pass takes 0.1-0.5 s: separate passes, one per figure, put up to that much
# CPU time in one figure's window and not in another's. cat, not awk on the
# glob: a process that exits in between makes cat skip its file, where awk
# would stop. cat runs SCHED_FIFO (chrt), above EEVDF and every sched_ext
# scheduler alike: where a scheduler serves the harness's class (normal) only
# at its starvation bound, a pass in that class stretched over seconds, and a
# window's clock no longer matched the CPU times it read (2.25 vCPUs of 2).
# With FILE, the same pass also writes there one line per process: "pid ppid
# ticks child_ticks comm" (its own utime+stime; its reaped children's
# cutime+cstime), for rest_of_guest.
snap_ticks() {
  chrt -f 1 cat /proc/uptime /proc/stat /proc/[0-9]*/stat /proc/uptime 2>/dev/null | awk -v g="$1" -v out="${2:-}" '
    NF == 2 && $1 ~ /^[0-9]+\.[0-9]+$/ { split($1, c, "."); up[++n] = c[1] * 100 + c[2]; next }
    $1 !~ /^[0-9]+$/ { if ($1 == "cpu") { idle = $5 + $6; irq = $7 + $8 + $9 }; next }
    { s = $0; sub(/^.*\) /, "", s); split(s, f, " ")
      if (f[3] == g) j += f[12] + f[13]
      if (substr($2, 1, 10) == "(stress-ng") h += f[12] + f[13]
      if (out != "") { cm = substr($0, index($0, "(") + 1); sub(/\) [^)]*$/, "", cm); gsub(/ /, "_", cm)
                       print $1, f[2], f[12] + f[13], f[14] + f[15], cm > out } }
    END { print j + 0, h + 0, int((up[1] + up[n]) / 2), idle + 0, irq + 0 }'
}

# rest_of_guest BEFORE AFTER SKIP_S [JOB] : the CPU (s) that processes other
# than the hogs, the scheduler's own process ($SPID) and the ML job used
# between two snap_ticks FILEs, as "KTHREADS HARNESS OTHER TOP":
# - KTHREADS: kernel threads (pid 2 and its children);
# - HARNESS: this script ($$) and its descendants: its own time and what it
#   reaped (the /proc passes, the commands it runs), less SKIP_S, the ML
#   job's and the map probe's CPU, which it reaped too;
# - OTHER: every other process (new ones in full);
# - TOP: the five largest, as comm=seconds.
# JOB: a running ML job's pid; it and its descendants are left out.
# A process of the first pass gone from the second counts only if the
# harness reaped it (the first pass's own cat and awk): another one's time
# in the window is lost (a kernel worker that exited, say).
rest_of_guest() {
  awk -v me="$$" -v sp="${SPID:-0}" -v skip="$3" -v job="${4:-}" '
    FNR == NR { t0[$1] = $3; c0[$1] = $4; next }
    { par[$1] = $2; t[$1] = $3; c[$1] = $4; cm[$1] = $5 }
    END {
      for (p in t) {
        if (cm[p] ~ /^stress-ng/ || p == sp) continue
        d = t[p] - t0[p]
        if (p == me) { ha += d + c[p] - c0[p] - skip * 100; continue }
        x = p; n = 0
        while (x in par && x != me && x != job && n++ < 16) x = par[x]
        if (job != "" && x == job) continue
        if (x == me) ha += d
        else if (p == 2 || par[p] == 2) kt += d
        else ot += d
        if (d > 0) top[cm[p]] += d
      }
      printf "%.2f %.2f %.2f ", kt / 100, ha / 100, ot / 100
      for (m = 0; m < 5; m++) {
        b = ""; for (k in top) if (b == "" || top[k] > top[b]) b = k
        if (b == "") break
        printf "%s%s=%.2f", (m ? "," : ""), b, top[b] / 100; delete top[b]
      }
      print "" }' "$1" "$2"
}

# rest_share SCHED REP PREFIX SHARE WHERE HOGS_S LEFT_S BEFORE AFTER SKIP_S [JOB] :
# rest_of_guest over a window (BEFORE AFTER SKIP_S JOB), as a guest log line
# ("over WHERE") and the results PREFIX_rest_{kthreads,harness,other}_s; then
# result SHARE, the hogs' share of the CPU the ML job left without the
# harness's: HOGS_S / (LEFT_S - the harness's CPU), HOGS_S and LEFT_S being
# calc expressions (the hogs' CPU-s; vCPUs x window less the job's CPU-s).
rest_share() {
  local rk rh ro rt
  read -r rk rh ro rt <<EOF
$(rest_of_guest "$8" "$9" "${10}" "${11:-}")
EOF
  echo "# [$1] the rest of the guest over $5: kernel threads ${rk} s, harness ${rh} s, other ${ro} s; largest: $rt"
  result "$1" "$2" "${3}_rest_kthreads_s" "$rk"
  result "$1" "$2" "${3}_rest_harness_s" "$rh"
  result "$1" "$2" "${3}_rest_other_s" "$ro"
  result "$1" "$2" "$4" "$(calc "($6) / ($7 - $rh)")"
}

# stop_bg PID : SIGINT a background job and reap it.
stop_bg() { kill -INT "$1" 2>/dev/null; wait "$1" 2>/dev/null; }

# ---- schedulers -------------------------------------------------------------------------
SPID=""     # the running sched_ext scheduler's process

# sched_bin NAME : the program of scheduler NAME (every configuration of
# scx_zernel runs scx_zernel; zernel_base runs scx_zernel_base).
sched_bin() {
  case $1 in zernel|zernel_gpu|zernel_flat) echo scx_zernel ;; *) echo "scx_$1" ;; esac
}

# The sched_ext schedulers run from the guest's tmpfs, as from a node's own
# disk, not from the run directory the host shares (virtiofs) where bench/run.sh
# puts them: run from there, scx_zernel's process took about twice the CPU
# beside the sized pipeline and its hogs (9.9-12.6 % of a vCPU against
# 4.5-4.8 %, the same guest.sh in one boot each). EEVDF and the RT control
# have no program.
mkdir -p "$W/bin"
for s in $SCHEDS; do
  b=$(sched_bin "$s")
  if [ ! -e "$W/bin/$b" ] && p=$(command -v "$b"); then cp "$p" "$W/bin/$b"; fi
done
PATH=$W/bin:$PATH

# sched_start NAME : attach scheduler NAME (eevdf, rt: check nothing is attached).
# Waits <= 90 s for state `enabled` with an ops name starting with the
# scheduler's ("zernel" for every scx_zernel configuration and zernel_base;
# lavd's BPF program takes a while to verify under TCG).
sched_start() {
  local n=450 t0 cfg
  assert_eq "[$1] sched_ext is disabled before" "$(sched_state)" disabled
  case $1 in eevdf|rt) return 0 ;; esac
  t0=$(up_cs)
  case $1 in
    zernel|zernel_base) cfg=$W/zernel.toml ;;
    zernel_gpu) cfg=$W/zernel-gpu.toml ;;
    zernel_flat) cfg=$W/zernel-flat.toml ;;
    *) cfg="" ;;
  esac
  "$(sched_bin "$1")" ${cfg:+--config "$cfg"} >"$W/sched.log" 2>&1 &
  SPID=$!
  while [ $n -gt 0 ]; do
    if [ "$(sched_state)" = enabled ]; then
      case $(ops_name) in "${1%_*}"*)
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
        print id, (type in tn ? tn[type] : "type" type), (tag in name ? name[tag] : "tag_" tag), rt, rc, vi
      id = ""; type = ""; tag = ""; rt = 0; rc = 0; vi = ""
    }
    /^pos:/ { flush() }
    /^prog_type:/ { type = $2 }
    /^prog_tag:/ { tag = $2 }
    /^prog_id:/ { id = $2 }
    /^run_time_ns:/ { rt = $2 }
    /^run_cnt:/ { rc = $2 }
    /^verified_insns:/ { vi = $2 }
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

# bpf_cpu BEFORE AFTER SECS : the vCPUs that all the scheduler's BPF programs
# ran between two bpf_snapshot files (run_time_ns) over SECS, the time from
# the first snapshot's start to the second's end (the snapshots lie outside
# the window the /proc passes bound, which a slow pass would make shorter
# than the snapshots' span). Some of that time is charged to the tasks it
# ran beside (a wakeup's select_cpu to the waker), the rest to no task.
bpf_cpu() {
  awk -v before="$1" -v secs="$3" '
    FILENAME == before { t0[$1] = $4; next }
    { t += $4 - t0[$1] }
    END { printf "%.5f\n", t / 1e9 / secs }' "$1" "$2"
}

# bpf_insns SCHED REP : each BPF program's verified_insns (the instructions
# the verifier processed, the figure veristat reports), from bpf_snapshot;
# bpf_symbols must have run.
bpf_insns() {
  bpf_snapshot "$SPID" | awk -v s="$1" -v r="$2" '
    $6 != "" { printf "BENCH sched=%s rep=%s metric=bpf_verified_insns.%s value=%s\n", s, r, $3, $6 }'
}

# probe_ticks : cutime + cstime of the calling (sub)shell: the CPU time of the
# children it has reaped, in clock ticks. The shell's builtin read opens
# /proc/self, so self is the shell itself.
probe_ticks() {
  local st
  read -r st </proc/self/stat
  # shellcheck disable=SC2086  # the fields after "pid (comm) ", as $1...
  set -- ${st##*) }
  echo $((${14} + ${15}))
}

# zernel_classes BIN : what the kernel map of scx_zernel (or BIN, another build
# of it) holds right now, as counts of "comm class" over its entries (a
# diagnostic for the guest log). It runs inside measurement windows, so it
# forks a fixed handful of processes, none per entry: each process it starts
# costs CPU that neither the ML job nor the hogs get, and is an event the
# daemon reacts to.
zernel_classes() {
  "$1" inspect --entries 2>/dev/null | while read -r tid class _; do
    tid=${tid#tid=} class=${class#class=}
    { read -r comm <"/proc/$tid/comm"; } 2>/dev/null || continue
    while :; do case $comm in *" "*) comm="${comm%% *}_${comm#* }" ;; *) break ;; esac; done
    echo "$comm $class"
  done | sort | uniq -c | sort -rn | head -n 12 | tr -s ' \n' ' '
}

# ---- case 1: the sized ML pipeline ----------------------------------------------------------
# train_run OUT : the sized trainer, ML_STEPS steps; its last line goes to OUT.
# ML_CHRT: the command the trainer runs under (rt: chrt -f 10; its workers and
# threads inherit the policy). ML_WORKERS: its DataLoader worker processes.
ML_ARGS="" ML_CHRT="" ML_WORKERS=2
train_run() {
  # shellcheck disable=SC2086  # ML_ARGS and ML_CHRT are lists of words
  $ML_CHRT zernel-workload train --gpu-file "$W/gpu.json" --steps "$ML_STEPS" --workers "$ML_WORKERS" \
    --data-dir "$W/data" $ML_ARGS >"$1.full" 2>&1
  grep '^zernel-workload train steps=' "$1.full" | tail -n1 >"$1"
  [ -s "$1" ] || { echo "# trainer output:"; cat "$1.full"; }
}
# ml_cpu_frac FILE : cpu_secs / secs of the trainer's line: the CPUs the ML
# job used on average over its run.
ml_cpu_frac() {
  local c t
  c=$(field cpu_secs "$1") t=$(field secs "$1")
  [ -n "$c" ] && [ -n "$t" ] && calc "$c / $t"
}

# hogs_start : 2x oversubscription, `stress-ng --cpu 2*vCPUs` (HP = its pid);
# stopped with SIGINT (stress-ng then prints its metrics).
HP=""
hogs_start() {
  stress-ng --temp-path "$W" --cpu $((2 * NCPU)) --timeout 3600s --metrics-brief >"$W/hogs.out" 2>&1 &
  HP=$!
  sleep 1
}
hogs_stop() { stop_bg "$HP"; HP=""; }

case_ml() {
  local s="$1" r="$2" h0 h1 u0 u1 i0 i1 q0 q1 b0 b1 ml_cpu win dp e0 probe want p i bt0 bt1 bspan
  ML_CHRT=""
  [ "$s" = rt ] && ML_CHRT="chrt -f 10"
  # Alone.
  train_run "$W/iso"
  result "$s" "$r" ml_iso_steps_per_sec "$(field steps_per_sec "$W/iso")"
  result "$s" "$r" ml_iso_secs "$(field secs "$W/iso")"
  result "$s" "$r" ml_iso_gpu_busy_frac "$(field gpu_busy_frac "$W/iso")"
  result "$s" "$r" ml_iso_loader_p99_ms "$(field loader_wait_p99_ms "$W/iso")"
  result "$s" "$r" ml_iso_cpu "$(ml_cpu_frac "$W/iso")"

  # With 2x oversubscription. The hogs run from 1 s before the trainer
  # starts until it ends. The window of every measurement is the trainer's
  # run: from just before it starts to just after it ends.
  hogs_start
  # The scheduler process's ticks are read inside the window that the two
  # /proc passes bound (each pass takes a while under TCG): its CPU over
  # the window is never overstated.
  read -r bt0 _ </proc/uptime
  [ -n "$SPID" ] && bpf_snapshot "$SPID" >"$W/bpf0"
  read -r _ h0 u0 i0 q0 <<EOF
$(snap_ticks - "$W/procs0")
EOF
  [ -n "$SPID" ] && b0=$(ticks_of "$SPID")
  e0=$(date +%s)
  # Half-way through, which classes the ML threads have in scx_zernel's map.
  # Every build of scx_zernel alike: the dump forks processes, whose BPF time
  # (init_task, process events) the window counts. Their own CPU time (the
  # subshell's reaped children, cutime + cstime) goes to neither the ML job
  # nor the hogs: it is left out of the CPU the ML job leaves idle.
  dp=""
  rm -f "$W/probe_ticks"
  case $s in zernel*)
    ( sleep 2; echo "# [$s] map with hogs: $(zernel_classes "$(sched_bin "$s")")"
      probe_ticks >"$W/probe_ticks" ) &
    dp=$!
  esac
  train_run "$W/con"
  [ -n "$dp" ] && wait "$dp"   # only that job: the hogs are a background job too
  [ -n "$SPID" ] && b1=$(ticks_of "$SPID")
  read -r _ h1 u1 i1 q1 <<EOF
$(snap_ticks - "$W/procs1")
EOF
  [ -n "$SPID" ] && bpf_snapshot "$SPID" >"$W/bpf1"
  read -r bt1 _ </proc/uptime
  echo "BENCHWIN sched=$s rep=$r case=ml_con start=$e0 end=$(date +%s)"
  hogs_stop
  # The policy the trainer and each of its workers ran at (its own report,
  # read before they stop): SCHED_FIFO for the RT control, else the default.
  p=other
  [ "$s" = rt ] && p=fifo
  want=$p
  i=0
  while [ "$i" -lt "$ML_WORKERS" ]; do want="$want,$p"; i=$((i + 1)); done
  assert_eq "[$s] the pipeline ran at policy ${want%%,*}, alone and with hogs" \
    "$(field policies "$W/iso") $(field policies "$W/con")" "$want $want"
  win=$(calc "($u1 - $u0) / 100")
  ml_cpu=$(field cpu_secs "$W/con")
  result "$s" "$r" ml_con_steps_per_sec "$(field steps_per_sec "$W/con")"
  result "$s" "$r" ml_con_secs "$(field secs "$W/con")"
  result "$s" "$r" ml_con_gpu_busy_frac "$(field gpu_busy_frac "$W/con")"
  result "$s" "$r" ml_con_loader_p99_ms "$(field loader_wait_p99_ms "$W/con")"
  result "$s" "$r" ml_con_cpu "$(ml_cpu_frac "$W/con")"
  # The hogs' share of what the ML job left: their CPU time over the trainer's
  # run / (vCPUs x that time - the trainer's CPU time - the map probe's).
  probe=$(cat "$W/probe_ticks" 2>/dev/null || echo 0)
  [ -n "$dp" ] && result "$s" "$r" ml_con_probe_cpu_s "$(calc "$probe / 100")"
  result "$s" "$r" hogs_cpu "$(calc "($h1 - $h0) / 100 / $win")"
  result "$s" "$r" ml_con_idle_cpu "$(calc "($i1 - $i0) / 100 / $win")"
  result "$s" "$r" ml_con_irq_cpu "$(calc "($q1 - $q0) / 100 / $win")"
  [ -n "$ml_cpu" ] && result "$s" "$r" hogs_share_of_idle \
    "$(calc "(($h1 - $h0) / 100) / ($NCPU * $win - $ml_cpu - $probe / 100)")"
  if [ -n "$ml_cpu" ]; then
    # The rest of the guest over the same window. This harness's own work
    # (its /proc passes and the commands it runs) is the benchmark's, like
    # the map probe: hogs_share_of_idle_net leaves it out of the CPU the ML
    # job leaves. Kernel threads and other processes stay counted against
    # the scheduler (it may cause some of their work), as does its process.
    rest_share "$s" "$r" ml_con hogs_share_of_idle_net "the window" "($h1 - $h0) / 100" \
      "$NCPU * $win - $ml_cpu - $probe / 100" "$W/procs0" "$W/procs1" "$(calc "$ml_cpu + $probe / 100")"
  fi
  result "$s" "$r" hogs_bogo_ops_per_s \
    "$(awk '$4 == "cpu" && $5 ~ /^[0-9]+$/ { print $9 }' "$W/hogs.out")"
  if [ -n "$SPID" ]; then
    bspan=$(calc "$bt1 - $bt0")
    bpf_report "$s" "$r" "$W/bpf0" "$W/bpf1" "$bspan"
    result "$s" "$r" ml_con_bpf_cpu "$(bpf_cpu "$W/bpf0" "$W/bpf1" "$bspan")"
    result "$s" "$r" sched_cpu_pct_ml_load "$(calc "($b1 - $b0) / $win")"
  fi
}

# ---- case 2: real PyTorch ----------------------------------------------------------------
TPY="" TPG="" SPG="" TSTEPS=0
# torch_steps : the trainer's finished steps (0 before the first), in TSTEPS,
# from its progress file; the shell reads it itself, starting no process.
torch_steps() {
  TSTEPS=0
  { read -r TSTEPS <"$W/tprog"; } 2>/dev/null
  TSTEPS=${TSTEPS:-0}
}
# torch_wait_steps N SECS : wait until the trainer finished N steps, at most
# SECS. The shell writes N to $W/twant and blocks in `read` on fd 4, the named
# pipe the trainer writes a step's number to once it has passed the step
# twant names (train.py --notify, --notify-at): no polling inside a
# measurement window, and one line to read per wait, whatever the number of
# steps. The trainer is the pipe's only writer, so its death ends the read
# (end of file). A watchdog, one process group per wait, writes "timeout ID"
# to the pipe after SECS; lines of an earlier wait (its watchdog's, a step it
# asked for) are skipped.
torch_wait_steps() {
  local wd line rc=1
  [ "$TSTEPS" -ge "$1" ] && return 0
  echo "$1" >"$W/twant"
  # shellcheck disable=SC2016  # the watchdog's shell expands these, not this one
  setsid sh -c 'sleep "$1" && echo "timeout $$" >"$2"' wd "$2" "$W/tnote" &
  wd=$!
  while read -r line <&4; do
    case $line in
      "timeout $wd") break ;;
      timeout*) ;;
      *) [ "$line" -ge "$1" ] 2>/dev/null && { TSTEPS=$line; rc=0; break; } ;;
    esac
  done
  # Its pid too: a watchdog that has not run yet (a fork waits for a CPU) has
  # no process group of its own, and `wait` would wait out its sleep.
  kill -TERM "$wd" "-$wd" 2>/dev/null; wait "$wd" 2>/dev/null
  return "$rc"
}
# step_time N : the trainer's clock when step N finished.
step_time() { awk -v n="$1" '$1 == n { print $2 }' "$W/tsteps"; }

# torch_start : start the trainer and the server (both import torch at once),
# wait for the trainer's first step and the server's socket, stop the
# trainer. Returns 1 (and says why) if PyTorch cannot run here.
torch_start() {
  TPY=${ZERNEL_PYTHON:-}
  if [ -z "$TPY" ] || ! "$TPY" -c 'import importlib.util as u; exit(u.find_spec("torch") is None)' 2>/dev/null; then
    echo "BENCHMETA torch=unavailable reason=\"no Python with PyTorch (ZERNEL_PYTHON='$TPY'; scripts/setup-deps.sh installs it)\""
    return 1
  fi
  local t0 n=4500
  t0=$(up_cs)
  # Own process groups (setsid): SIGSTOP/SIGCONT reach the DataLoader workers too.
  # The step pipe: held open for reading and writing (an open that does not
  # block) until the trainer has opened it, then for reading only (fd 4).
  rm -f "$W/tnote"; mkfifo "$W/tnote"; exec 3<>"$W/tnote"
  setsid "$TPY" tests/workloads/pytorch/train.py --workers 2 --batch 2 --steps 0 --data-dir "$W/tdata" \
    --progress "$W/tprog" --step-times "$W/tsteps" --ready "$W/tready" \
    --notify "$W/tnote" --notify-at "$W/twant" >"$W/train.out" 2>&1 3>&- &
  TPG=$!
  setsid "$TPY" tests/workloads/pytorch/serve.py --socket "$W/lm.sock" --dim 64 --layers 1 \
    --ready "$W/lm.ready" >"$W/serve.out" 2>&1 3>&- &
  SPG=$!
  while { ! [ -s "$W/tready" ] || ! [ -s "$W/lm.ready" ]; } && alive "$TPG" && alive "$SPG" && [ $n -gt 0 ]; do
    sleep 0.2; n=$((n - 1))
  done
  if ! [ -s "$W/tready" ] || ! [ -s "$W/lm.ready" ]; then
    echo "BENCHMETA torch=unavailable reason=\"train.py or serve.py did not start: $(tail -n1 "$W/train.out" "$W/serve.out" | tr '\n"' " '")\""
    torch_kill; return 1
  fi
  kill -STOP "-$TPG"
  exec 4<"$W/tnote" 3>&-
  echo "BENCHMETA torch_version=$("$TPY" -c 'import importlib.metadata as m; print(m.version("torch"))') torch_train_steps=$TORCH_STEPS torch_train_con_steps=$((TORCH_STEPS * 2)) torch_infer_requests=$INFER_REQS torch_start_s=$(calc "($(up_cs) - $t0) / 100")"
}
torch_kill() {
  [ -n "$TPG" ] && { kill -CONT "-$TPG"; kill -KILL "-$TPG"; wait "$TPG"; } 2>/dev/null
  [ -n "$SPG" ] && { kill -KILL "-$SPG"; wait "$SPG"; } 2>/dev/null
  TPG="" SPG=""
  exec 3>&- 4<&-
}

# torch_train_window SCHED REP KIND WARM STEPS : WARM steps, then STEPS
# steps; KIND iso or con. Steps/s on the job's clock, its CPU and the hogs'
# from /proc (one pass at each end: snap_ticks), and with hogs the rest of
# the guest over the same window (rest_of_guest, as in case_ml).
torch_train_window() {
  local s=$1 r=$2 k=$3 n=$5 n0 t0 t1 j0 j1 h0 h1 u0 u1 i0 i1 q0 q1 win e0 b0="" b1="" bt0 bt1
  torch_steps
  torch_wait_steps $((TSTEPS + $4)) 900 || { echo "# [$s] torch: $4 warm-up steps not done in 900 s"; return 1; }
  torch_steps
  n0=$TSTEPS
  # The BPF programs' run times are read outside the window, as in case_ml:
  # the harness runs in the normal class, which scx_zernel serves after the
  # training's, and with these passes over the scheduler's fds inside it
  # scx_zernel's training windows ran 76-83 s for 30 steps; outside, 11 s.
  read -r bt0 _ </proc/uptime
  [ -n "$SPID" ] && bpf_snapshot "$SPID" >"$W/tbpf0"
  e0=$(date +%s)
  read -r j0 h0 u0 i0 q0 <<EOF
$(snap_ticks "$TPG" "$W/tprocs0")
EOF
  [ -n "$SPID" ] && b0=$(ticks_of "$SPID")   # inside the window (see case_ml)
  torch_wait_steps $((n0 + n)) 1800 || { echo "# [$s] torch: $n steps not done in 1800 s"; return 1; }
  [ -n "$SPID" ] && b1=$(ticks_of "$SPID")
  read -r j1 h1 u1 i1 q1 <<EOF
$(snap_ticks "$TPG" "$W/tprocs1")
EOF
  [ -n "$SPID" ] && bpf_snapshot "$SPID" >"$W/tbpf1"
  read -r bt1 _ </proc/uptime
  echo "BENCHWIN sched=$s rep=$r case=torch_train_$k start=$e0 end=$(date +%s)"
  t0=$(step_time "$n0") t1=$(step_time $((n0 + n)))
  win=$(calc "($u1 - $u0) / 100")
  [ -n "$t0" ] && [ -n "$t1" ] && result "$s" "$r" "torch_train_${k}_steps_per_sec" "$(calc "$n / ($t1 - $t0)")"
  result "$s" "$r" "torch_train_${k}_cpu" "$(calc "($j1 - $j0) / 100 / $win")"
  if [ "$k" = con ]; then
    result "$s" "$r" torch_train_hogs_cpu "$(calc "($h1 - $h0) / 100 / $win")"
    result "$s" "$r" torch_train_idle_cpu "$(calc "($i1 - $i0) / 100 / $win")"
    result "$s" "$r" torch_train_irq_cpu "$(calc "($q1 - $q0) / 100 / $win")"
    result "$s" "$r" torch_train_hogs_share_of_idle "$(calc "(($h1 - $h0) / 100) / ($NCPU * $win - ($j1 - $j0) / 100)")"
    result "$s" "$r" torch_train_con_secs "$win"
    # The trainer (this script's child, TPG) and its workers are the job.
    rest_share "$s" "$r" torch_train torch_train_hogs_share_of_idle_net "the training window" \
      "($h1 - $h0) / 100" "$NCPU * $win - ($j1 - $j0) / 100" "$W/tprocs0" "$W/tprocs1" 0 "$TPG"
    # The scheduler's own process over the same window (vCPUs).
    [ -n "$b1" ] && result "$s" "$r" torch_train_sched_cpu "$(calc "($b1 - $b0) / 100 / $win")"
    [ -n "$b1" ] && result "$s" "$r" torch_train_bpf_cpu "$(bpf_cpu "$W/tbpf0" "$W/tbpf1" "$(calc "$bt1 - $bt0")")"
  fi
}

# torch_infer_window SCHED REP KIND : INFER_REQS requests, one after another.
torch_infer_window() {
  local s=$1 r=$2 k=$3 h0 h1 u0 u1 e0 v
  read -r _ h0 u0 _ _ <<EOF
$(snap_ticks -)
EOF
  e0=$(date +%s)
  rm -f "$W/infer.json"
  "$TPY" tests/workloads/pytorch/client.py --socket "$W/lm.sock" --requests "$INFER_REQS" --tokens 8 --new 2 \
    --out "$W/infer.json" >"$W/client.out" 2>&1 || { echo "# [$s] client failed: $(tail -n1 "$W/client.out")"; return 1; }
  read -r _ h1 u1 _ _ <<EOF
$(snap_ticks -)
EOF
  echo "BENCHWIN sched=$s rep=$r case=torch_infer_$k start=$e0 end=$(date +%s)"
  for v in rps p50_ms p99_ms; do
    result "$s" "$r" "torch_infer_${k}_$v" "$(sed -n "s/.*\"$v\": \([0-9.e+-]*\).*/\1/p" "$W/infer.json")"
  done
  [ "$k" = con ] && result "$s" "$r" torch_infer_hogs_cpu "$(calc "($h1 - $h0) / 100 / (($u1 - $u0) / 100)")"
}

case_torch() {
  local s="$1" r="$2"
  [ -n "$TPG" ] || return 0
  kill -CONT "-$TPG"
  # Warm-up: the scheduler sees the job run again (phases, decisions).
  torch_train_window "$s" "$r" iso 2 "$TORCH_STEPS"
  hogs_start
  # 5 warm-up steps: the batches the workers prefetched alone (2 workers x
  # prefetch factor 2) are used up first. Twice the steps: the hogs' share
  # of what the job leaves idle is a small difference of large CPU times.
  torch_train_window "$s" "$r" con 5 $((TORCH_STEPS * 2))
  hogs_stop
  kill -STOP "-$TPG"
  torch_infer_window "$s" "$r" iso
  hogs_start
  torch_infer_window "$s" "$r" con
  hogs_stop
}

# ---- case 3: general latency --------------------------------------------------------------
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

# sch_pct TABLE PCT : the PCT percentile of schbench's table TABLE ("Wakeup
# Latencies", "RPS") in $W/sch.out. schbench prints its tables so far every 10 s
# and over the whole run at the end: the last one counts.
sch_pct() {
  awk -v t="$1" -v p="$2th:" '/ percentiles / { b = index($0, t " percentiles") == 1 }
    b && index($0, p) { sub(/.*th: */, ""); v = $1 + 0 } END { if (v != "") print v }' "$W/sch.out"
}

case_latency() {
  local s="$1" r="$2" hp
  stress-ng --temp-path "$W" --cpu "$NCPU" --timeout 3600s >/dev/null 2>&1 &
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
  if command -v schbench >/dev/null; then
    # One message thread, vCPUs workers, SCH_S seconds: its wakeup latency
    # p99 and its median requests/s (the figures scx developers quote). Under
    # TCG a 10 s run's p99 spread widely over 15 runs in one boot (EEVDF
    # 312-611 us, scx_zernel 381-1,438 us): the full run takes 30 s.
    schbench -m 1 -t "$NCPU" -r "$SCH_S" >"$W/sch.out" 2>&1
    result "$1" "$2" schbench_p99_us "$(sch_pct 'Wakeup Latencies' 99.0)"
    result "$1" "$2" schbench_rps "$(sch_pct RPS 50.0)"
  fi
}

# ---- case 4: the scheduler's own cost ------------------------------------------------------
case_cost() {
  local s="$1" r="$2" v tp d0 d1 u0 u1 n
  for v in ml plain; do
    if [ "$v" = ml ]; then set -- --ml; else set --; fi
    zernel-workload threads --count "$THREADS" --secs $((SETTLE_S + WINDOW_S + 30)) "$@" >"$W/thr.out" 2>&1 &
    tp=$!
    n=300   # 60 s to create the threads
    while ! grep -q ready "$W/thr.out" && alive "$tp" && [ "$n" -gt 0 ]; do sleep 0.2; n=$((n - 1)); done
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
# The configurations: the default one (no GPU data: nothing provides it in this
# VM), the sized trainer's fake GPU through the file provider, and the flat
# policy (every phase and every ML thread in the normal class).
cat >"$W/zernel.toml" <<TOML
# The default configuration.
TOML
cat >"$W/zernel-gpu.toml" <<TOML
# The sized trainer's fake GPU, through the file GPU provider.
[gpu]
provider = "file"
file = "$W/gpu.json"
TOML
cat >"$W/zernel-flat.toml" <<TOML
# The control: no phase policy. Every phase and every ML thread in the normal class.
[policy]
ml_unknown = "normal"
data_loading = { class = "normal", preempt = false, latency_target_us = 8000 }
gpu_compute = { class = "normal", preempt = false, latency_target_us = 8000 }
nccl_collective = { class = "normal", preempt = false, latency_target_us = 8000 }
optimizer_step = { class = "normal", preempt = false, latency_target_us = 8000 }
TOML
sysctl -qw kernel.bpf_stats_enabled=1 2>/dev/null || echo 1 >/proc/sys/kernel/bpf_stats_enabled
assert_eq "kernel.bpf_stats_enabled is 1" "$(cat /proc/sys/kernel/bpf_stats_enabled)" 1
has_case latency && msg_pick
# Whether schbench is here, and why not, the host tells (bench/run.sh).
has_case latency && command -v schbench >/dev/null && echo "BENCHMETA schbench_args=\"-m 1 -t $NCPU -r $SCH_S\""
echo "BENCHMETA kernel=$(uname -r) vcpus=$NCPU mem_kib=$(awk '/MemTotal/ { print $2 }' /proc/meminfo) reps=$REPS short=$SHORT cases=$CASES ml_steps=$ML_STEPS cyclictest_s=$CT_S threads=$THREADS window_s=$WINDOW_S"
echo "BENCHMETA stress_ng=\"$(stress-ng --version 2>&1 | head -n1)\" cyclictest=\"$(cyclictest --help 2>&1 | head -n1)\""
for s in $SCHEDS; do
  case $s in
    eevdf) v="kernel $(uname -r)" ;;
    rt) v="kernel $(uname -r), $(chrt --version 2>&1 | head -n1)" ;;
    *) v=$("$(sched_bin "$s")" --version 2>&1 | head -n1) ;;
  esac
  echo "BENCHMETA version.$s=\"$v\""
done
# calib_ops N KEY : "BENCHMETA KEY=" the bogo ops per CPU-second of
# stress-ng's int64 method on N busy vCPUs.
calib_ops() {
  stress-ng --temp-path "$W" --cpu "$1" --cpu-method int64 --timeout "$((SHORT ? 2 : 5))s" --metrics-brief 2>&1 |
    awk -v k="$2" '$4 == "cpu" && $5 ~ /^[0-9]+$/ { print "BENCHMETA " k "=" $10 }'
}
# Calibration: with every vCPU busy; bench/run.sh measures the same on one
# host core. The ratio is a rough factor of how much slower a guest
# CPU-second is than a native one.
calib_ops "$NCPU" calib_guest_ops_per_cpu_s
# The same with one vCPU busy, the others idle: under TCG every vCPU is a
# host thread, and one computes less per second while the others are busy
# too, whatever the guest's scheduler does (the emulator's own ceiling for a
# job's "with hogs ÷ alone").
calib_ops 1 calib_guest_ops_per_cpu_s_one_busy
# The daemon's own work (the cost case's), for its emulation factor: see
# bench/observe-cpu.sh; bench/run.sh measures the same on the host.
if has_case cost; then
  if [ "$SHORT" = 1 ]; then bash "$(dirname "$0")/observe-cpu.sh" --short guest
  else bash "$(dirname "$0")/observe-cpu.sh" guest; fi
fi
if has_case ml; then
  # The pipeline's sizes, in units of work an idle vCPU does per ms here:
  # decode 20 ms a batch, optimizer 10 ms, a kernel launch 0.1 ms.
  upm=$(zernel-workload calibrate --ms 1000 | sed -n 's/.*units_per_ms=//p')
  upm=${upm:-50}
  ML_ARGS="--decode-units $(calc "int($upm * 20)") --optim-units $(calc "int($upm * 10)") --launch-units $(calc "int($upm * 0.1) + 1") --kernels 20"
  echo "BENCHMETA ml_workers=$ML_WORKERS ml_kernels=20 ml_decode_ms=20 ml_optim_ms=10 ml_launch_ms=0.1 units_per_ms=$upm"
  # Warm-up: the data files are made once, outside any measurement.
  zernel-workload train --gpu-file "$W/gpu.json" --steps 2 --workers 1 --data-dir "$W/data" >/dev/null 2>&1
fi
has_case torch && { torch_start || TPG=""; }

REVERSED=""
for s in $SCHEDS; do REVERSED="$s $REVERSED"; done
r=1
while [ "$r" -le "$REPS" ]; do
  order=$SCHEDS
  [ $((r % 2)) = 0 ] && order=$REVERSED
  for s in $order; do
    echo "# rep $r/$REPS: $s ($(uptime_s) s since boot)"
    if sched_start "$s"; then
      [ -n "$SPID" ] && { bpf_symbols; bpf_insns "$s" "$r"; }
      for c in ml torch latency cost; do
        has_case $c || continue
        [ $c = cost ] && [ "$s" = eevdf ] && continue
        # The pipeline's case only: GPU data changes nothing but for the
        # pipeline, whose fake GPU it reports; the RT control is its reference.
        case $s in zernel_gpu | rt) [ $c = ml ] || continue ;; esac
        t=$(up_cs); "case_$c" "$s" "$r"
        echo "# [$s] $c: $(( ($(up_cs) - t) / 100 )) s"
      done
      [ -z "$SPID" ] || alive "$SPID" || _notok "[$s] still running after its cases"
    else
      echo "BENCHNOTE sched=$s rep $r: failed to attach, no results"
    fi
    sched_stop "$s"
  done
  r=$((r + 1))
done
torch_kill
check "dmesg is clean" dmesg_clean
finish
