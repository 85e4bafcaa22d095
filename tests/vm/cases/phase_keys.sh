#!/bin/sh
# vm: --smp 4 --mem 2G --timeout 400
#
# The [phase] thresholds decide what reaches the kernel. One training-like
# job (zernel-workload train, its fake GPU at 60 % while busy and 20 % while
# idle) and one in-process loader (zernel-workload reader, reading
# /dev/zero; ML by a fake device fd) run throughout; the daemon is restarted
# with one set of [phase] keys at a time, and the classes the kernel holds
# for each thread are sampled (trainer pt_main_thread, NCCL Progress 0, the
# DataLoader worker pt_data_worker, the reader zt_read).
#  A  gpu_idle_util_pct = 25: GpuCompute (60 >= 30) and OptimizerStep
#     (20 <= 25) on the trainer, NcclCollective, DataLoading on the worker
#     and on the reader (well over 32 MiB/s) all reach the kernel. (The
#     reader's device fd names no GPU, so the busy GPU counts as its own
#     too: it is also GpuCompute while the GPU is busy.)
#  B  gpu_busy_util_pct = 70, gpu_idle_util_pct = 10 (default),
#     nccl_min_switches_per_sec = 1e7, inproc_load_min_read_bytes_per_sec =
#     1 TiB/s: the trainer, the NCCL thread and the reader get no entry; the
#     worker still does (the keys are not all-or-nothing).
#  C  nccl_min_busy_frac = 1.0 (the NCCL thread spins 2 ms in 3): no entry
#     for it; the trainer still gets both its phases.
#  D  phase_stability_count = 1000 (100 s at 100 ms): nothing is adopted.
#  E  loop_interval_ms = 5000: the reader's first entry comes two
#     intervals or more (10-15 s) after the daemon's first pass (a sample
#     pair, then stability). The first pass can precede the moment the attach is seen
#     here by the time one poll takes on a loaded host, so: >= 7 s after
#     attach is seen, and >= 5 s later than with the default 100 ms
#     (measured in A, about 1 s).
# shellcheck disable=SC2317 source=tests/vm/guest-lib.sh
. "$(dirname "$0")/../guest-lib.sh"

W=/tmp/pk
mkdir -p "$W"
: >/dev/zt_gpu0
zernel-workload train --gpu-file "$W/gpu.json" --secs 400 --workers 1 --data-dir "$W/data" \
  --gpu-util 60 --gpu-idle-util 20 >"$W/train.out" 2>&1 &
train=$!
zernel-workload reader --name zt_read --secs 400 --open /dev/zt_gpu0 >"$W/reader.out" &
reader=$!
wait_until 10 sh -c "[ \$(ls /proc/$train/task 2>/dev/null | wc -l) -ge 4 ]"

# first_entry NAME SECS : seconds until the reader has an entry, into
# $W/NAME.first ("none" if not within SECS s).
first_entry() {
  t0=$(uptime_s)
  echo none >"$W/$1.first"
  wait_until "$2" sh -c "[ -n \"\$(scx_zernel inspect --tid $reader 2>/dev/null)\" ]" &&
    awk -v a="$t0" -v b="$(uptime_s)" 'BEGIN { printf "%.1f\n", b - a }' >"$W/$1.first"
}
# run NAME SECS [PHASE KEYS...] : the daemon with those [phase] keys; the
# kernel's entries sampled for SECS s into $W/NAME (zsample lines);
# $W/NAME.first holds how long after attach the reader got its first entry.
run() {
  name=$1 secs=$2
  shift 2
  # No class for ML threads in no phase: every entry here is a phase's.
  keys_run "$name" "$secs" "$(printf '[policy]\nml_unknown = "none"\n\n[gpu]\nprovider = "file"\nfile = "%s"\n\n[observe]\nml_device_prefixes = ["/dev/zt_gpu"]\n\n[phase]' "$W/gpu.json")" \
    first_entry "$@"
}

run A 15 "gpu_idle_util_pct = 25" || finish
check "A: GpuCompute on the trainer (60 % >= 30): kernel class latency" run_held A pt_main_thread latency
check "A: OptimizerStep on the trainer (20 % <= 25): kernel class ml" run_held A pt_main_thread ml
check "A: NcclCollective: kernel class latency" run_held A NCCL_Progress_0 latency
check "A: DataLoading on the worker: kernel class ml" run_held A pt_data_worker ml
check "A: DataLoading in-process on the reader: kernel class ml" run_held A zt_read ml

run B 15 "gpu_busy_util_pct = 70" "nccl_min_switches_per_sec = 10000000.0" \
  "inproc_load_min_read_bytes_per_sec = 1099511627776" || finish
check "B: gpu_busy_util_pct = 70, gpu_idle_util_pct = 10: no entry for the trainer" run_none B pt_main_thread
check "B: nccl_min_switches_per_sec = 1e7: no entry for NCCL Progress 0" run_none B NCCL_Progress_0
check "B: inproc_load_min_read_bytes_per_sec = 1 TiB/s: no entry for the reader" run_none B zt_read
check "B: the worker is still DataLoading (class ml)" run_held B pt_data_worker ml

run C 15 "gpu_idle_util_pct = 25" "nccl_min_busy_frac = 1.0" || finish
check "C: nccl_min_busy_frac = 1.0: no entry for NCCL Progress 0" run_none C NCCL_Progress_0
check "C: the trainer still gets GpuCompute (latency)" run_held C pt_main_thread latency
check "C: the trainer still gets OptimizerStep (ml)" run_held C pt_main_thread ml

# The rule is the run's positive control: the daemon writes entries and the
# sampler sees them, only no phase is adopted.
run D 10 "phase_stability_count = 1000" "[[rules]]" 'comm = "^zt_read$"' 'class = "batch"' || finish
check "D: control: the rule's entry for the reader (class batch)" run_held D zt_read batch
check "D: phase_stability_count = 1000: no entry for the trainer" run_none D pt_main_thread
check "D: phase_stability_count = 1000: no entry for NCCL Progress 0" run_none D NCCL_Progress_0
check "D: phase_stability_count = 1000: no entry for the worker" run_none D pt_multiprocess
check "D: the reader holds only the rule's class (no DataLoading phase)" run_none D "zt_read ml"

run E 30 "loop_interval_ms = 5000" || finish
echo "reader's first entry after attach: $(cat "$W/A.first") s with loop_interval_ms = 100, $(cat "$W/E.first") s with 5000"
first_ok() { awk -v a="$(cat "$W/A.first")" -v e="$(cat "$W/E.first")" 'BEGIN { exit !(a != "none" && e != "none" && e >= 7 && e >= a + 5) }'; }
check "E: loop_interval_ms = 5000: the first entry >= 7 s after attach, >= 5 s later than at 100 ms" first_ok

kill "$train" "$reader" 2>/dev/null; wait "$train" "$reader" 2>/dev/null
check "dmesg is clean" dmesg_clean
finish
