#!/bin/sh
# vm: --smp 4 --mem 2G --timeout 300
#
# The NVML provider, end to end, with no GPU: a stand-in libnvidia-ml.so.1
# (tests/vm/fake_nvml.c, the real library's ABI, answering from the fake-GPU
# file zernel-workload writes) is loaded by the daemon at run time.
#  1. Without it on the library path, provider "auto" finds no NVML, says so
#     and runs (no GPU data, no error).
#  2. With it and provider "nvml": GpuCompute and OptimizerStep, the two
#     phases that need GPU data, are detected on the trainer from NVML alone
#     and the kernel holds their classes; NVML is asked for the samples of
#     the configured window (gpu.nvml_sample_window_ms = 2500).
#  3. The window decides which samples count: a process sample 3 s old is
#     used with a 10 s window and ignored with a 1 s one (observe shows the
#     process's GPU utilisation).
# shellcheck disable=SC2317 source=tests/vm/guest-lib.sh
. "$(dirname "$0")/../guest-lib.sh"

NV=/opt/zernel-fake-nvml
W=/tmp/nv
mkdir -p "$W"
check "the stand-in libnvidia-ml.so.1 is in the guest" test -f "$NV/libnvidia-ml.so.1" || finish

# 1. No NVML on the library path.
printf '[gpu]\nprovider = "auto"\n' >/tmp/nv-auto.toml
zernel_start /tmp/nv-auto.toml || finish
check "provider auto, no NVML: the daemon says so" grep -q 'NVML not available' "$ZLOG"
zernel_stop TERM
assert_eq "provider auto, no NVML: exit 0" "$ZRC" 0

# 2. NVML drives the GPU phases.
cat >/tmp/nv.toml <<'TOML'
[gpu]
provider = "nvml"
nvml_sample_window_ms = 2500
TOML
export LD_LIBRARY_PATH=$NV ZERNEL_FAKE_NVML_FILE=$W/gpu.json ZERNEL_FAKE_NVML_LOG=$W/nvml.log
zernel_start /tmp/nv.toml --log-level debug || finish
check "the daemon loaded NVML" grep -q 'gpu: using NVML' "$ZLOG"
zernel-workload train --gpu-file "$W/gpu.json" --secs 40 --workers 1 --data-dir "$W/data" >"$W/train.out" 2>&1 &
train=$!
wait_until 10 sh -c "[ \$(ls /proc/$train/task 2>/dev/null | wc -l) -ge 4 ]"
# The kernel's entries, sampled for ~20 s.
: >"$W/classes"
zsample 20 "$W/classes" "$train"
grep '^pt_main_thread ' "$W/classes" | sort | uniq -c
saw() { grep -q "phase tid=$train .* -> $1\$" "$ZLOG"; }
check "GpuCompute detected on the trainer from NVML data" saw gpu_compute
check "OptimizerStep detected on the trainer from NVML data" saw optimizer_step
check "kernel holds the GpuCompute policy for the trainer (latency, 1000 us, preempt)" \
  grep -q '^pt_main_thread latency 1000 1$' "$W/classes"
check "kernel holds the OptimizerStep policy for the trainer (ml)" grep -q '^pt_main_thread ml ' "$W/classes"
# Each refresh asks for samples newer than now - window.
wmin=$(sort -n -k2 "$W/nvml.log" | head -n 1 | cut -d' ' -f2)
wmax=$(sort -n -k2 "$W/nvml.log" | tail -n 1 | cut -d' ' -f2)
echo "NVML asked for samples over $wmin..$wmax us in $(wc -l <"$W/nvml.log") calls"
assert_ge "window asked of NVML >= 2500 ms" "${wmin:-0}" 2500000
check "window asked of NVML <= 2700 ms (2500 ms plus the call's delay)" [ "${wmax:-99999999}" -le 2700000 ]
kill "$train" 2>/dev/null; wait "$train" 2>/dev/null
zernel_stop TERM
assert_eq "provider nvml: exit 0" "$ZRC" 0

# 3. The window: one process sample, stamped when the file was written.
zernel-workload hog --name zt_gpuhog --secs 60 --threads 1 &
hog=$!
printf '{"devices":[{"index":0,"uuid":"GPU-zt-0","pci_bus_id":"00000000:00:00.0","util":0}],"processes":[{"pid":%s,"device":0,"sm_util":90}]}\n' \
  "$hog" >"$W/gpu.json"
sleep 3
util_with() {   # util_with WINDOW_MS : the hog's GPU utilisation as observe shows it
  printf '[gpu]\nprovider = "nvml"\nnvml_sample_window_ms = %s\n' "$1" >"$W/w.toml"
  scx_zernel observe -c "$W/w.toml" --json --count 2 --interval-ms 300 2>/dev/null | tail -n 1 |
    grep -o "\"pid\":$hog,[^{]*\"gpu_util_pct\":[0-9a-z]*" | sed 's/.*://'
}
assert_eq "a 3 s old sample counts with a 10 s window (observe: 90 %)" "$(util_with 10000)" 90
assert_eq "a 3 s old sample is ignored with a 1 s window (observe: the device's 0 %)" "$(util_with 1000)" 0
unset LD_LIBRARY_PATH ZERNEL_FAKE_NVML_FILE ZERNEL_FAKE_NVML_LOG
kill "$hog" 2>/dev/null; wait "$hog" 2>/dev/null
check "dmesg is clean" dmesg_clean
finish
