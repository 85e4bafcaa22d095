#!/bin/sh
# vm: --host-root --smp 2 --mem 4G --timeout 1500
#
# Real PyTorch inference serving: tests/workloads/pytorch/serve.py (a small
# TransformerEncoder language model with random weights, on the CPU) answers
# the requests of tests/workloads/pytorch/client.py, a plain Python process
# that never imports torch, over a Unix socket. Under scx_zernel with its
# default config:
#   - the server is ML (by the CUDA libraries torch maps), and the kernel's
#     task_class map holds a decision for its threads;
#   - the client, plain Python, is not ML and has no entry;
#   - requests keep being answered under scx_zernel.
# shellcheck disable=SC2317 source=tests/vm/guest-lib.sh
. "$(dirname "$0")/../guest-lib.sh"

need_torch
W=/tmp/infer
mkdir -p "$W"

zernel_start configs/zernel.toml --log-level debug || finish

"$PY" tests/workloads/pytorch/serve.py --socket "$W/sock" --ready "$W/ready" >"$W/serve.out" 2>&1 &
server=$!
if ! wait_until 1200 test -s "$W/ready"; then
  _notok "serve.py listens" "$(tail -5 "$W/serve.out")"; finish
fi
"$PY" tests/workloads/pytorch/client.py --socket "$W/sock" --progress "$W/progress" >"$W/client.out" 2>&1 &
client=$!
# Under emulation one request takes 10 s or more (longer on a loaded host):
# the waits are bounds on answers counted, not a rate.
if ! wait_until 600 test -s "$W/progress"; then
  _notok "the client got a first answer" "$(tail -5 "$W/client.out" "$W/serve.out")"; finish
fi
_ok "serve.py answers the client's requests"
printf 'server pid %s threads:' "$server"
for t in /proc/"$server"/task/*; do printf ' %s(%s)' "${t##*/}" "$(cat "$t/comm")"; done; echo

n0=$(cat "$W/progress")
check "the server's main thread holds class ml in the kernel (policy.ml_unknown: no GPU data)" \
  wait_until 300 ztask_is "$server" class ml
zentries | sort | uniq -c
grep "ML process" "$ZLOG"
check "the server (pid $server) is ML by the CUDA libraries torch maps" \
  grep -q "ML process pid=$server .*evidence=[a-z_,]*gpu_library" "$ZLOG"
check "the client (plain Python) is not ML" sh -c "! grep -q 'ML process pid=$client ' $ZLOG"
assert_eq "the client has no entry in the kernel" "$(ztask "$client" class)" ""
check "requests go on being answered under scx_zernel (3 more past $n0)" wait_until 600 file_gt "$W/progress" $((n0 + 2))
echo "requests answered: $(cat "$W/progress")"

kill "$client" "$server" 2>/dev/null; wait "$client" "$server" 2>/dev/null
zernel_stop TERM
assert_eq "SIGTERM: exit 0" "$ZRC" 0
check "dmesg is clean" dmesg_clean
finish
