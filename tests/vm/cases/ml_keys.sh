#!/bin/sh
# vm: --smp 4 --mem 2G --timeout 900
#
# The [observe] keys that decide which processes are ML, and the [phase]
# thresholds of the loader and optimizer phases, each shown to switch a
# kernel entry on or off. Workers run throughout (zernel-workload; "reader"
# reads /dev/zero, an in-process loader by its read rate; --busy-pct P keeps
# each on the CPU P % of every 5 ms, ~200 voluntary switches a second):
#   zt_rank         reader 100 % (always runnable), RANK=0 (ML by a default
#                   variable): control
#   zt_env          reader 20 %, ZT_JOB=1 only
#   zt_lib          reader 20 %, maps libzt_ml.so.1 (LD_PRELOAD)
#   zt_coll         reader 20 %, maps libzt_coll.so.1
#   zt_child        reader 20 %, empty environment, child of an ML shell
#   pt_data_worker  reader 30 %, RANK=0: a DataLoader by its name
#   zt_duty         hog 70 %, a GPU process (GPU file) whose GPU is idle
# Runs, one daemon each. The keys that decide which processes are ML run
# with policy.ml_unknown = "ml" (an ML process's threads hold class ml
# whatever their phase, so ML-ness alone shows in the kernel, however slow
# the host); the phase thresholds with "none" (every entry is a phase's):
#  1  ml_env_vars = [RANK, ZT_JOB], ml_libraries = [libzt_ml],
#     collective_libraries = [libzt_coll]: zt_env, zt_lib, zt_coll and
#     zt_child (inherited) are ML (class ml).
#  2  the default lists, ml_inherit_depth = 0: none of those four has an
#     entry (zt_rank, ML by RANK, does: the control).
# Each threshold is set far on either side of what the worker does in two
# runs (a load on the host raises a thread's measured busy fraction, since
# waiting for a CPU counts, and lowers its switch rate), so an ignored key
# fails one of the two:
#  3  loader_min_busy_frac = 0.2, loader reads 1 TiB/s: pt_data_worker is
#     DataLoading by its busy fraction (0.3 >= 0.2); zt_duty is not
#     OptimizerStep (its voluntary switches/s > 1).
#  4  loader_min_busy_frac = 0.9, optimizer_max_voluntary_per_sec = 1000:
#     pt_data_worker has no entry; zt_duty is OptimizerStep (class ml).
#  5  loader_min_busy_frac = 0.9 (reads at the default 1 MiB/s),
#     optimizer_min_busy_frac = 0.999: pt_data_worker is DataLoading by its
#     reads; zt_duty (0.7; 0.6 by default, run 4) is not OptimizerStep.
#  6  as 5 with active_busy_frac = 0.8: pt_data_worker (0.3) is not
#     sampled in detail, so its reads are unknown: no entry; zt_rank (1.0)
#     still is.
#  7  proc_root = an empty directory: the daemon sees no process, no entry.
# shellcheck disable=SC2317 source=tests/vm/guest-lib.sh
. "$(dirname "$0")/../guest-lib.sh"

W=/tmp/mk
mkdir -p "$W" "$W/emptyproc"
S=900
# Two libraries to map: any loadable .so under the names the rules look for.
lib=$(ls /opt/zernel-fake-nvml/libnvidia-ml.so.1 2>/dev/null || ls /lib/x86_64-linux-gnu/libm.so.6)
cp "$lib" "$W/libzt_ml.so.1" && cp "$lib" "$W/libzt_coll.so.1"
R="zernel-workload reader --secs $S"
RANK=0 $R --name zt_rank &
p1=$!
ZT_JOB=1 $R --name zt_env --busy-pct 20 &
p2=$!
LD_PRELOAD=$W/libzt_ml.so.1 $R --name zt_lib --busy-pct 20 &
p3=$!
LD_PRELOAD=$W/libzt_coll.so.1 $R --name zt_coll --busy-pct 20 &
p4=$!
RANK=0 sh -c "env -i /usr/local/bin/zernel-workload reader --secs $S --name zt_child --busy-pct 20; true" &
p5=$!
RANK=0 $R --name pt_data_worker --busy-pct 30 &
p6=$!
zernel-workload hog --name zt_duty --secs $S --busy-pct 70 &
p7=$!
printf '{"devices":[{"index":0,"util":0}],"processes":[{"pid":%s,"device":0,"sm_util":0}]}\n' $p7 >"$W/gpu.json"
sleep 1

# run NAME SECS [TOML LINES...] : the daemon with that config; the kernel's
# entries sampled into $W/NAME (zsample lines) until every "COMM CLASS" of
# WANT (the run's positive controls) has been seen, then for as long again
# (at least 3 s), so that an entry the run must not have had the same
# chance to appear; at most SECS s.
WANT=""
until_seen() {   # until_seen NAME SECS: sampling into $W/NAME
  _t0=$(cut -d. -f1 /proc/uptime)
  while [ $(( $(cut -d. -f1 /proc/uptime) - _t0 )) -lt "$2" ]; do
    _all=1
    for _p in $WANT; do
      grep -q "^${_p%:*} ${_p#*:} " "$W/$1" || { _all=0; break; }
    done
    [ "$_all" = 1 ] && break
    alive "$ZPID" || break
    sleep 0.5
  done
  _took=$(( $(cut -d. -f1 /proc/uptime) - _t0 ))
  sleep $(( _took > 3 ? _took : 3 ))
  : >"$W/$1.done"
}
# run NAME SECS ML_UNKNOWN [TOML LINES...] : see above; ML_UNKNOWN is
# policy.ml_unknown: "ml" where a key decides whether a process is ML (an
# ML process's threads then hold class ml whatever their phase), "none" where
# a threshold decides a phase (every entry then comes from a phase).
run() {
  name=$1 secs=$2 mlu=$3
  shift 3
  keys_run "$name" "$secs" "$(printf '[policy]\nml_unknown = "%s"\n\n[gpu]\nprovider = "file"\nfile = "%s"' "$mlu" "$W/gpu.json")" \
    until_seen "$@"
}

# Which processes are ML: the evidence keys, judged by ML-ness alone.
WANT="zt_rank:ml zt_env:ml zt_lib:ml zt_coll:ml zt_child:ml"
run 1 90 ml '[observe]' 'ml_env_vars = ["RANK", "ZT_JOB"]' 'ml_libraries = ["libzt_ml"]' \
  'collective_libraries = ["libzt_coll"]' || finish
check "1: zt_rank (RANK) is ML: class ml" run_held 1 zt_rank ml
check "1: ml_env_vars has ZT_JOB: zt_env is ML, class ml" run_held 1 zt_env ml
check "1: ml_libraries has libzt_ml: zt_lib is ML, class ml" run_held 1 zt_lib ml
check "1: collective_libraries has libzt_coll: zt_coll is ML, class ml" run_held 1 zt_coll ml
check "1: ml_inherit_depth = 4: zt_child (no environment, ML parent) is ML, class ml" run_held 1 zt_child ml

WANT="zt_rank:ml"
run 2 90 ml '[observe]' 'ml_inherit_depth = 0' || finish
check "2: zt_rank is still ML: class ml" run_held 2 zt_rank ml
check "2: default ml_env_vars: zt_env has no entry" run_none 2 zt_env
check "2: default ml_libraries: zt_lib has no entry" run_none 2 zt_lib
check "2: default collective_libraries: zt_coll has no entry" run_none 2 zt_coll
check "2: ml_inherit_depth = 0: zt_child has no entry" run_none 2 zt_child

# The loader and optimizer thresholds, judged by the phases they allow.
WANT="pt_data_worker:ml"
run 3 90 none '[phase]' 'loader_min_busy_frac = 0.2' 'loader_min_read_bytes_per_sec = 1099511627776' \
  'optimizer_max_voluntary_per_sec = 1.0' || finish
check "3: loader_min_busy_frac = 0.2: pt_data_worker (0.3) is DataLoading, class ml" run_held 3 pt_data_worker ml
check "3: optimizer_max_voluntary_per_sec = 1: zt_duty (~200 voluntary switches/s) has no entry" run_none 3 zt_duty

WANT="zt_duty:ml"
run 4 90 none '[phase]' 'loader_min_busy_frac = 0.9' 'loader_min_read_bytes_per_sec = 1099511627776' \
  'optimizer_max_voluntary_per_sec = 1000.0' || finish
check "4: loader_min_busy_frac = 0.9: pt_data_worker (0.3) has no entry" run_none 4 pt_data_worker
check "4: optimizer_max_voluntary_per_sec = 1000: zt_duty is OptimizerStep, class ml" run_held 4 zt_duty ml

WANT="pt_data_worker:ml"
run 5 90 none '[phase]' 'loader_min_busy_frac = 0.9' 'optimizer_max_voluntary_per_sec = 1000.0' \
  'optimizer_min_busy_frac = 0.999' || finish
check "5: loader_min_read_bytes_per_sec = 1 MiB/s: pt_data_worker is DataLoading by its reads, class ml" \
  run_held 5 pt_data_worker ml
check "5: optimizer_min_busy_frac = 0.999: zt_duty (0.7) has no entry" run_none 5 zt_duty

WANT="zt_rank:ml"
run 6 90 none '[observe]' 'active_busy_frac = 0.8' '[phase]' 'loader_min_busy_frac = 0.9' || finish
check "6: active_busy_frac = 0.8: pt_data_worker (0.3, reads unknown) has no entry" run_none 6 pt_data_worker
check "6: zt_rank (1.0) is still sampled in detail: class ml" run_held 6 zt_rank ml

WANT=""
run 7 6 ml '[observe]' "proc_root = \"$W/emptyproc\"" || finish
check "7: proc_root = an empty directory: no entry at all (not even for ML processes)" [ ! -s "$W/7" ]

kill $p1 $p2 $p3 $p4 $p5 $p6 $p7 2>/dev/null; wait $p1 $p2 $p3 $p4 $p5 $p6 $p7 2>/dev/null
check "dmesg is clean" dmesg_clean
finish
