#!/usr/bin/env bash
# Runs shellcheck on every shell script of the repository: tracked files named *.sh or
# starting with a sh/bash shebang. The guest's scripts (busybox ash) are checked as dash,
# through tests/vm/cases/.shellcheckrc and a `# shellcheck shell=dash` line in the others.
# Exits non-zero on any finding (all severities).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
command -v shellcheck >/dev/null || { echo "shellcheck: not found (scripts/setup-deps.sh installs it)"; exit 1; }
scripts=()
while IFS= read -r f; do
  [ -f "$f" ] || continue
  case $f in
    *.sh) scripts+=("$f") ;;
    *) head -n 1 "$f" | grep -qE '^#!(/usr/bin/env )?(/bin/)?(ba)?sh\b' && scripts+=("$f") ;;
  esac
done < <(git ls-files)
[ ${#scripts[@]} -gt 0 ] || { echo "shellcheck: no scripts found"; exit 1; }
if shellcheck -x "${scripts[@]}"; then
  echo "shellcheck: ${#scripts[@]} scripts, no findings"
else
  echo "shellcheck: findings above (in ${#scripts[@]} scripts)"
  exit 1
fi
