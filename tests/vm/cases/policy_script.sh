#!/bin/sh
# vm: --smp 2 --mem 1G
#
# The Lua policy hook ([policy] script), on real processes, to the kernel.
# A script puts every thread of one process (matched on its command line)
# in batch and every thread of another in latency with a slice of its own:
# each thread's class is read back from the task_class map, and a third
# process the script says nothing about has no entry. `observe` shows the
# script's verdict. The script is then edited (the two swapped, no signal:
# its own file's change reloads) and the classes change live, with the
# sched_ext state never leaving `enabled`; an edit with a syntax error is
# rejected with a one-line error naming the script and line, and the old
# verdicts stay. Finally a script that loops forever for one process keeps
# the built-in decision for it (no entry), is counted in the OpenMetrics
# endpoint's zernel_script_errors and zernel_script_budget_exceeded, and
# the daemon goes on.
# shellcheck disable=SC2317 source=tests/vm/guest-lib.sh
. "$(dirname "$0")/../guest-lib.sh"

P=/tmp/policy.lua
write_script() {   # write_script A_CLASS B_CLASS : atomically replace the script
  cat >"$P.new" <<LUA
function decide(t)
  if t.cmdline:find("--name zt_sa ", 1, true) then return { class = "$1", slice_us = 700 } end
  if t.cmdline:find("--name zt_sb ", 1, true) then return { class = "$2", slice_us = 900 } end
  return nil
end
LUA
  mv "$P.new" "$P"
}
write_script batch latency
printf '[policy]\nscript = "%s"\n' "$P" >/tmp/ps.toml
zernel_start /tmp/ps.toml --metrics-addr 127.0.0.1:9094 || finish

S=200
zernel-workload hog --name zt_sa --secs $S --threads 2 &
a=$!
zernel-workload hog --name zt_sb --secs $S --threads 2 &
b=$!
zernel-workload hog --name zt_sc --secs $S --threads 1 &
c=$!
ntasks() { ls "/proc/$1/task" 2>/dev/null | wc -l; }
up() { [ "$(ntasks "$a")" -ge 2 ] && [ "$(ntasks "$b")" -ge 2 ] && [ "$(ntasks "$c")" -ge 1 ]; }
wait_until 20 up
check "the three workloads are running with their threads" up

# Every thread of PID has CLASS in the kernel.
all_class() {   # all_class PID CLASS
  local d
  for d in "/proc/$1/task/"*; do [ "$(ztask "${d##*/}" class)" = "$2" ] || return 1; done
}
expect() {   # expect PID CLASS SLICE WHAT
  local d n=0
  wait_until 10 all_class "$1" "$2"
  for d in "/proc/$1/task/"*; do
    assert_eq "$4: kernel holds $2 for tid ${d##*/}" "$(ztask "${d##*/}" class)" "$2"
    n=$((n + 1))
  done
  assert_eq "$4: slice $3 us" "$(ztask "$1" slice_us)" "$3"
  echo "$4: $n threads checked"
}
expect "$a" batch 700 "script: zt_sa"
expect "$b" latency 900 "script: zt_sb"
assert_eq "the script said nothing for zt_sc: no entry" "$(ztask "$(ls "/proc/$c/task" | tail -n 1)" class)" ""

scx_zernel observe --config /tmp/ps.toml --count 2 --interval-ms 1000 --json >/tmp/obs.json 2>/tmp/obs.err
check "observe shows the script's verdicts" grep -q '"script":"set"' /tmp/obs.json
check "observe names the script" grep -q "\"path\":\"$P\"" /tmp/obs.json

( while :; do s=$(sched_state); [ "$s" = enabled ] || echo "state left enabled: $s"; sleep 0.05; done ) >/tmp/state.watch 2>&1 &
watch=$!

# Edited (no signal): the classes swap live.
write_script latency batch
wait_until 5 all_class "$a" latency
expect "$a" latency 700 "edited script: zt_sa"
expect "$b" batch 900 "edited script: zt_sb"
check "the reload was logged (start and edit: two lines)" sh -c "[ \$(grep -c 'policy script $P loaded' '$ZLOG') -ge 2 ]"

# A syntax error: rejected, with the file and line; the old verdicts stay.
printf 'function decide(t)\n  return { class = \nend\n' >"$P.new" && mv "$P.new" "$P"
sleep 2
grep "reload rejected" "$ZLOG" | head -n 2
check "the broken script is rejected naming $P:3" sh -c "grep 'reload rejected' '$ZLOG' | grep -q '$P:3:'"
check "the rejection is one line" sh -c "[ \$(grep -c 'reload rejected' '$ZLOG') -ge 1 ] && ! grep -A1 'reload rejected' '$ZLOG' | grep -q '^stack traceback'"
assert_eq "old script still in force: zt_sa latency" "$(ztask "$a" class)" latency
assert_eq "old script still in force: zt_sb batch" "$(ztask "$b" class)" batch
check "scx_zernel still running" alive "$ZPID"

# A script that never returns for zt_sb: the budget stops it, the built-in
# decision (none for a plain hog) is kept, the stats count it.
cat >"$P.new" <<'LUA'
function decide(t)
  if t.cmdline:find("--name zt_sb ", 1, true) then while true do end end
  if t.cmdline:find("--name zt_sa ", 1, true) then return { class = "ml" } end
end
LUA
mv "$P.new" "$P"
wait_until 10 all_class "$a" ml
assert_eq "budget script: zt_sa ml" "$(ztask "$a" class)" ml
gone() { [ -z "$(ztask "$1" class)" ]; }
wait_until 10 gone "$b"
assert_eq "budget script: zt_sb keeps the built-in decision (no entry)" "$(ztask "$b" class)" ""
metric() { wget -q -O - http://127.0.0.1:9094/metrics | awk -v m="$1" '$1 == m { print $2 }'; }
sleep 1
errs=$(metric zernel_script_errors_total) budget=$(metric zernel_script_budget_exceeded_total)
echo "script_errors $errs, script_budget_exceeded $budget"
assert_ge "zernel_script_budget_exceeded counts zt_sb's threads" "${budget:-0}" 2
assert_ge "zernel_script_errors includes them" "${errs:-0}" "${budget:-0}"
check "the failure is logged once for this version" sh -c "[ \$(grep -c 'policy script failed' '$ZLOG') -eq 1 ]"
check "scx_zernel still running after the runaway script" alive "$ZPID"

kill "$watch" 2>/dev/null; wait "$watch" 2>/dev/null
assert_eq "state never left enabled during reloads" "$(cat /tmp/state.watch)" ""
kill "$a" "$b" "$c" 2>/dev/null; wait "$a" 2>/dev/null; wait "$b" 2>/dev/null; wait "$c" 2>/dev/null
zernel_stop TERM
assert_eq "SIGTERM: exit 0" "$ZRC" 0
check "dmesg is clean" dmesg_clean
finish
