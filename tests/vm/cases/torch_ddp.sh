#!/bin/sh
# vm: --host-root --smp 2 --mem 4G --timeout 3000
#
# Real PyTorch DDP: `torchrun --nproc-per-node 2` runs
# tests/workloads/pytorch/train.py on two ranks over the gloo backend (one
# DataLoader worker each), under scx_zernel with its default config:
#   - both ranks are ML, by the RANK/LOCAL_RANK torchrun sets (read back:
#     rank 0 and 1, local_rank 0 and 1; a process ML by its environment is
#     not scanned again, so the libraries it maps later need not show);
#   - their collective threads (gloo: pt_gloo_runloop, gloo_tcp_loop) are
#     found with the role gloo (scx_zernel observe, the daemon's pipeline);
#   - each rank's DataLoader worker is DataLoading, and the kernel holds the
#     DataLoading policy for it; each rank's main thread holds class ml
#     (policy.ml_unknown, no GPU data);
#   - both ranks keep training under scx_zernel.
# shellcheck disable=SC2317 source=tests/vm/guest-lib.sh
. "$(dirname "$0")/../guest-lib.sh"

need_torch
W=/tmp/ddp
mkdir -p "$W"

zernel_start configs/zernel.toml --log-level debug || finish

"$(dirname "$PY")/torchrun" --nproc-per-node 2 tests/workloads/pytorch/train.py --workers 1 \
  --ready "$W/ready" --progress "$W/progress" --data-dir "$W/data" >"$W/ddp.out" 2>&1 &
agent=$!
# Two ranks import torch on two vCPUs under TCG: most of the case's time.
# The bound is a backstop for a loaded host, not an expectation.
both_ready() { test -s "$W/ready.0" && test -s "$W/ready.1"; }
if ! wait_until 2400 both_ready; then
  _notok "both ranks finished a first step" "$(tail -8 "$W/ddp.out")"; finish
fi
r0=$(cat "$W/ready.0") r1=$(cat "$W/ready.1")
_ok "both ranks finished a first step (rank 0 pid $r0, rank 1 pid $r1)"
for p in $r0 $r1; do
  printf 'pid %s threads:' "$p"; for t in /proc/"$p"/task/*; do printf ' %s(%s)' "${t##*/}" "$(cat "$t/comm")"; done; echo
done

s0=$(cat "$W/progress.0")
check "kernel holds the DataLoading policy for a rank's DataLoader worker (pt_data_worker: ml, 4000 us)" \
  wait_until 300 zholds pt_data_worker ml 4000 0
for r in 0 1; do
  pid=$r0; [ "$r" = 1 ] && pid=$r1
  check "rank $r's main thread holds class ml (policy.ml_unknown: no GPU data)" wait_until 60 ztask_is "$pid" class ml
done
zentries | sort | uniq -c
grep "ML process" "$ZLOG"

for r in 0 1; do
  pid=$r0; [ "$r" = 1 ] && pid=$r1
  check "rank $r (pid $pid) is ML with RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 read from its environment" \
    grep -q "ML process pid=$pid .*evidence=[a-z_,]*env_rank.* rank=$r local_rank=$r world_size=2" "$ZLOG"
  check "rank $r's DataLoader worker is an ML loader process" \
    grep -q "ML process pid=$(pgrep -P "$pid" | head -n1) .*loader=true" "$ZLOG"
done
# The collective threads: the role comes from the thread's real name.
scx_zernel observe --count 3 --all --json --interval-ms 300 --config configs/zernel.toml \
  >"$W/observe.json" 2>"$W/observe.err"
roles() {   # roles PID NAME|main: the roles observe gave threads NAME (or the main thread) of PID
  "$PY" -c 'import json, sys
pid, name = int(sys.argv[1]), sys.argv[2]
roles = set()
for line in open(sys.argv[3]):
    for p in json.loads(line)["processes"]:
        if p["pid"] == pid:
            roles |= {t["role"] for t in p["threads"] if t["comm"] == name or (name == "main" and t["tid"] == pid)}
print(" ".join(sorted(roles)))' "$1" "$2" "$W/observe.json"
}
for r in 0 1; do
  pid=$r0; [ "$r" = 1 ] && pid=$r1
  for name in pt_gloo_runloop gloo_tcp_loop; do
    assert_eq "rank $r's $name threads have the role gloo" "$(roles "$pid" "$name")" gloo
  done
  assert_eq "rank $r's main thread is its trainer" "$(roles "$pid" main)" trainer
done
saw() { grep -q "phase tid=.*comm=\"$1\".* -> $2\$" "$ZLOG"; }
check "DataLoading detected on the ranks' DataLoader workers" saw pt_data_worker data_loading
both_train() { file_gt "$W/progress.0" $((s0 + 2)) && file_gt "$W/progress.1" $((s0 + 1)); }
check "both ranks go on training under scx_zernel (past step $s0)" wait_until 300 both_train
echo "steps: rank 0 $(cat "$W/progress.0"), rank 1 $(cat "$W/progress.1")"
kill "$agent" 2>/dev/null; wait "$agent" 2>/dev/null
zernel_stop TERM
assert_eq "SIGTERM: exit 0" "$ZRC" 0
check "dmesg is clean" dmesg_clean
finish
