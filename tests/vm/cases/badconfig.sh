#!/bin/sh
# vm: --smp 2 --mem 1G
#
# Bad configurations are refused before anything reaches the kernel: for each
# one scx_zernel exits 1 with a single line on stderr that names the file (and
# the line and key where there is one), and sched_ext never leaves `disabled`.
# The same rules without the fault, and the shipped configs/zernel.toml, are
# accepted, so the refusals are about the faults and nothing else.
# Helpers defined below run through check/wait_until (SC2317 cannot see that).
# shellcheck disable=SC2317 source=tests/vm/guest-lib.sh
. "$(dirname "$0")/../guest-lib.sh"

# run_daemon ARGS... : runs scx_zernel to completion while sampling the
# sched_ext state every 50 ms. Sets RC, STATES (distinct states seen, in order)
# and leaves stdout/stderr in /tmp/out and /tmp/err.
run_daemon() {
  scx_zernel "$@" >/tmp/out 2>/tmp/err &
  pid=$!
  STATES=$(sched_state)
  while alive "$pid"; do
    s=$(sched_state)
    case " $STATES " in *" $s "*) ;; *) STATES="$STATES $s" ;; esac
    sleep 0.05
  done
  wait "$pid"; RC=$?
  echo "# scx_zernel $*: exit $RC, stderr: $(cat /tmp/err)"
}

# refused NAME FILE PATTERN... : the config FILE is refused; its one stderr line
# contains every PATTERN (fixed strings).
refused() {
  name=$1 file=$2; shift 2
  run_daemon --config "$file"
  assert_eq "$name: exit status 1" "$RC" 1
  assert_eq "$name: exactly one line on stderr" "$(grep -c . /tmp/err)" 1
  for p in "$@"; do check "$name: error contains '$p'" grep -qF -- "$p" /tmp/err; done
  assert_eq "$name: sched_ext stayed disabled" "$STATES" disabled
}

# 1. Malformed TOML: an unclosed table header on line 3.
cat >/tmp/malformed.toml <<'TOML'
# scx_zernel test config
# (the next line is broken)
[[rules]
comm = "^zt_batch$"
class = "batch"
TOML
refused "malformed TOML" /tmp/malformed.toml /tmp/malformed.toml:3:

# 2. A key the schema does not have, on line 5.
cat >/tmp/unknown.toml <<'TOML'
# scx_zernel test config
[[rules]]
comm = "^zt_batch$"
class = "batch"
bogus_key = 1
TOML
refused "unknown key" /tmp/unknown.toml /tmp/unknown.toml:5: bogus_key

# 3. A class that does not exist, on line 4.
cat >/tmp/badclass.toml <<'TOML'
# scx_zernel test config
[[rules]]
comm = "^zt_batch$"
class = "nope"
TOML
refused "bad class value" /tmp/badclass.toml /tmp/badclass.toml:4: nope

# 4. A value the schema accepts but validation does not: named by its key.
cat >/tmp/badbound.toml <<'TOML'
[scheduler]
starvation_bound_ms = 0
TOML
refused "out-of-range value" /tmp/badbound.toml /tmp/badbound.toml scheduler.starvation_bound_ms

# 5. No such file.
refused "missing file" /tmp/no-such-dir/zernel.toml /tmp/no-such-dir/zernel.toml

# Controls: the same rules without the fault, and the shipped config, load.
cat >/tmp/good.toml <<'TOML'
# scx_zernel test config
[[rules]]
comm = "^zt_batch$"
class = "batch"
TOML
for f in /tmp/good.toml configs/zernel.toml; do
  run_daemon --config "$f" --dump-config
  assert_eq "$f is accepted (--dump-config exits 0)" "$RC" 0
done

no_enable_line() { ! dmesg_new | grep 'sched_ext: BPF scheduler "zernel' | grep -q enabled; }
check "the kernel never logged a zernel scheduler being enabled" no_enable_line
assert_eq "sched_ext is disabled at the end" "$(sched_state)" disabled
check "dmesg is clean" dmesg_clean
finish
