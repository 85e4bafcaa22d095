#!/usr/bin/env bash
# The order of the daemon's stages, and the check that no module refers to a
# later stage than its own (a `use crate::x`, a path, or a doc link). Data
# flows config -> observe -> phase -> policy -> decisions -> the map, with the
# stats at the side: an earlier stage never names a later one. Modules in
# one line are one stage and may refer to each other. Test modules (tests.rs,
# fixture.rs, and an inline #[cfg(test)] module) are not checked: a test may
# drive its module through a later stage. Every module of src/ must be
# listed. Exits non-zero on any finding; run by tests/lint.sh.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

# Earliest first.
stages=(
  "class bpf_intf bpf_skel threads_skel events logging" # shared with BPF, and the log set-up
  "config rules tenants"                   # the file, and the rules and tenants compiled from it
  "devices gpu topology"                   # the machine: inputs of the observer and of the map
  "observe"
  "phase"
  "policy"
  "policy_script"
  "pipeline"
  "decisions"
  "sched"                                  # the task_class map
  "stats openmetrics"                      # at the side: they read every stage
  "daemon reload inspect observe_cmd"      # the commands that run the stages
)

declare -A stage_of
for i in "${!stages[@]}"; do
  for m in ${stages[$i]}; do stage_of[$m]=$i; done
done

rc=0
for f in src/*.rs src/*/*.rs; do
  case "$f" in src/main.rs | src/lib.rs | */tests.rs | */fixture.rs) continue ;; esac
  m=${f#src/}; m=${m%%/*}; m=${m%.rs}
  if [[ -z "${stage_of[$m]+x}" ]]; then
    echo "stages: $f: module '$m' is in no stage (add it to tests/stages.sh)"
    rc=1; continue
  fi
  own=${stage_of[$m]}
  # Lines up to the inline test module, with their numbers.
  while IFS=: read -r line ref; do
    target=${ref#crate::}
    [[ "$target" == "$m" ]] && continue
    if [[ -z "${stage_of[$target]+x}" ]]; then
      echo "stages: $f:$line: $ref: module '$target' is in no stage"
      rc=1
    elif (( stage_of[$target] > own )); then
      echo "stages: $f:$line: $m (stage $own: ${stages[$own]%%#*}) refers to $ref, a later stage ($((stage_of[$target])))"
      rc=1
    fi
  done < <(awk 'prev ~ /^#\[cfg\(test\)\]/ && /^mod [a-z_]+ \{/ { exit } { print NR ":" $0; prev = $0 }' "$f" |
    grep -o '^[0-9]*:\|crate::[a-z_]*' | awk '/^[0-9]+:$/ { n = $0; next } { print n $0 }')
  if awk 'prev ~ /^#\[cfg\(test\)\]/ && /^mod [a-z_]+ \{/ { exit } { print; prev = $0 }' "$f" | grep -q 'crate::{'; then
    echo "stages: $f: 'crate::{' (a grouped import) cannot be checked: import each module on its own line"
    rc=1
  fi
done
if ((rc == 0)); then echo "stages: no module refers to a later stage"; fi
exit $rc
