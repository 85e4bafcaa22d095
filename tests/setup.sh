#!/usr/bin/env bash
# Checks scripts/setup-deps.sh on a simulated fresh machine, without root or a network:
# the script runs from a copy of the tree with PATH holding only stand-ins
# (apt-get and dpkg-query record what they are asked, id says root, cargo exists)
# and the few host tools it needs, so qemu-system-x86_64 is missing.
#   - no qemu: it goes on to install qemu-system-x86 from bookworm-backports, says so,
#     and checks the version of what was installed;
#   - a package missing (shellcheck): it is installed from the system's sources;
#   - the venv (PyTorch, virtme-ng) and virtiofsd are installed where missing;
#   - qemu 10 present: nothing is installed from apt;
#   - a failing command (the backports update), or no root: the last line names the
#     step and the command or the reason.
#
#   tests/setup.sh [SCRIPT]     SCRIPT defaults to scripts/setup-deps.sh
# Exits non-zero if any check fails.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
script=${1:-scripts/setup-deps.sh}

pass=0
fail=0
ok() { echo "ok   $*"; pass=$((pass + 1)); }
bad() { echo "FAIL $*"; fail=$((fail + 1)); }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The tree: the script under test and a stand-in for the VM harness.
mkdir -p "$tmp/repo/scripts" "$tmp/repo/tests/vm" "$tmp/bin"
cp "$script" "$tmp/repo/scripts/setup-deps.sh"
cat >"$tmp/repo/tests/vm/vmrun.sh" <<'EOF'
#!/bin/sh
case $1 in
  --print-mirror) echo http://deb.example/debian ;;
  --fetch-only) echo "vmrun $*" >>"$STUB_LOG" ;;
esac
EOF
chmod +x "$tmp/repo/scripts/setup-deps.sh" "$tmp/repo/tests/vm/vmrun.sh"

# The stand-ins. STUB_MISSING: packages dpkg-query calls not installed;
# STUB_FAIL=backports-update: the update through the private sources list fails;
# STUB_UID: what `id -u` says.
cat >"$tmp/bin/apt-get" <<'EOF'
#!/bin/sh
echo "apt-get $*" >>"$STUB_LOG"
case "$*" in
  *sourcelist*update*) [ "${STUB_FAIL:-}" = backports-update ] && { echo "E: stand-in update failure" >&2; exit 100; } ;;
  *"install "*qemu-system-x86*)
    printf '#!/bin/sh\necho "QEMU emulator version 10.0.2 (Debian 1:10.0.2+ds-1~bpo12+1)"\n' >"$STUB_BIN/qemu-system-x86_64"
    chmod +x "$STUB_BIN/qemu-system-x86_64" ;;
esac
exit 0
EOF
cat >"$tmp/bin/dpkg-query" <<'EOF'
#!/bin/sh
for p in ${STUB_MISSING:-}; do [ "$p" = "$3" ] && { echo "unknown ok not-installed"; exit 1; }; done
printf 'install ok installed'
EOF
# shellcheck disable=SC2016 # expanded by the stand-in
printf '#!/bin/sh\necho "${STUB_UID:-0}"\n' >"$tmp/bin/id"
# cargo and python3 record what they install; a venv gets a python that answers
# the version check, and vng once pip has run.
# shellcheck disable=SC2016 # expanded by the stand-in
printf '#!/bin/sh\necho "cargo $*" >>"$STUB_LOG"\n' >"$tmp/bin/cargo"
# shellcheck disable=SC2016 # expanded by the stand-in
cat >"$tmp/bin/python3" <<'EOF'
#!/bin/sh
echo "python3 $*" >>"$STUB_LOG"
[ "$1 $2" = "-m venv" ] || exit 0
mkdir -p "$3/bin"
printf '#!/bin/sh\nexit 0\n' >"$3/bin/python"
printf '#!/bin/sh\necho "pip $*" >>"$STUB_LOG"\n: >"%s/bin/vng"; chmod +x "%s/bin/vng"\n' "$3" "$3" >"$3/bin/pip"
chmod +x "$3/bin/python" "$3/bin/pip"
EOF
chmod +x "$tmp/bin/"*
for t in bash env dirname sed head grep mkdir cat chmod cp printf tail rm; do
  p=$(command -v "$t") || { bad "host tool $t not found"; continue; }
  [ "$p" = "$t" ] || ln -s "$p" "$tmp/bin/$t"
done

# run NAME [VAR=VALUE...] : runs the script in a clean environment; output in $tmp/NAME.out,
# the stand-ins' record in $tmp/NAME.log, exit status in $rc.
run() {
  local name=$1
  shift
  rm -f "$tmp/bin/qemu-system-x86_64"
  : >"$tmp/$name.log"
  env -i PATH="$tmp/bin" HOME="$tmp" TMPDIR="$tmp" STUB_LOG="$tmp/$name.log" STUB_BIN="$tmp/bin" "$@" \
    bash "$tmp/repo/scripts/setup-deps.sh" >"$tmp/$name.out" 2>&1
  rc=$?
}
show() { sed 's/^/    | /' "$tmp/$1.out"; }

if PATH="$tmp/bin" command -v qemu-system-x86_64 >/dev/null; then bad "the test PATH has a qemu"; fi

# --- no qemu: install it from backports ---------------------------------------------------
run noqemu
if [ "$rc" = 0 ] && grep -q -- "install -y --no-install-recommends -t bookworm-backports qemu-system-x86" "$tmp/noqemu.log"; then
  ok "no qemu: installs qemu-system-x86 from bookworm-backports"
else
  bad "no qemu: exit $rc, no backports install of qemu-system-x86:"; show noqemu; sed 's/^/    log| /' "$tmp/noqemu.log"
fi
if grep -q "^setup-deps: installing qemu-system-x86 from bookworm-backports (http://deb.example/debian)" "$tmp/noqemu.out"; then
  ok "no qemu: says it installs qemu from backports"
else
  bad "no qemu: does not say it installs qemu from backports:"; show noqemu
fi
if grep -q "^vmrun --fetch-only" "$tmp/noqemu.log" && [ "$(tail -n 1 "$tmp/noqemu.out")" = "setup-deps: done" ]; then
  ok "no qemu: goes on to fetch the guest kernel and finishes"
else
  bad "no qemu: did not finish:"; show noqemu
fi

# --- the real-framework guests: a venv with PyTorch and virtme-ng, virtiofsd ------------------
if grep -q -- "^pip install -q --progress-bar off torch==2.15.0 numpy virtme-ng==1.42$" "$tmp/noqemu.log" \
   && grep -q -- "^cargo install -q --locked virtiofsd@1.14.0$" "$tmp/noqemu.log"; then
  ok "fresh machine: PyTorch 2.15.0, numpy and virtme-ng 1.42 into the venv, virtiofsd through cargo install"
else
  bad "fresh machine: no venv or no virtiofsd install:"; show noqemu; sed 's/^/    log| /' "$tmp/noqemu.log"
fi

# --- a package missing: installed from the system's sources ---------------------------------
run missing STUB_MISSING="shellcheck stress-ng"
if [ "$rc" = 0 ] && grep -q -- "^apt-get -q install -y stress-ng shellcheck$" "$tmp/missing.log"; then
  ok "missing shellcheck and stress-ng: installed"
else
  bad "missing shellcheck and stress-ng: exit $rc:"; show missing; sed 's/^/    log| /' "$tmp/missing.log"
fi

# --- qemu 10 present: nothing to do ----------------------------------------------------------
printf '#!/bin/sh\necho "QEMU emulator version 10.0.2"\n' >"$tmp/qemu10"
chmod +x "$tmp/qemu10"
# shellcheck disable=SC2016 # expanded by the inner bash
env -i PATH="$tmp/bin" HOME="$tmp" TMPDIR="$tmp" STUB_LOG="$tmp/present.log" STUB_BIN="$tmp/bin" \
  bash -c 'cp "$1" "$STUB_BIN/qemu-system-x86_64"; exec bash "$2"' _ "$tmp/qemu10" "$tmp/repo/scripts/setup-deps.sh" \
  >"$tmp/present.out" 2>&1
rc=$?
if [ "$rc" = 0 ] && grep -q "qemu 10 already installed" "$tmp/present.out" && ! grep -q apt-get "$tmp/present.log" 2>/dev/null; then
  ok "qemu 10 present: nothing installed"
else
  bad "qemu 10 present: exit $rc:"; show present
fi

# --- failures name their step and command -----------------------------------------------------
run failing STUB_FAIL=backports-update
last=$(tail -n 1 "$tmp/failing.out")
if [ "$rc" != 0 ] && [[ $last == "setup-deps: step 'qemu from bookworm-backports' failed: apt-get -q "*update*"(exit 100, line "* ]]; then
  ok "a failing command: one line names the step and the command ($last)"
else
  bad "a failing command: exit $rc, last line: $last"; show failing
fi
run noroot STUB_UID=1000
last=$(tail -n 1 "$tmp/noroot.out")
if [ "$rc" != 0 ] && [[ $last == "setup-deps: step 'qemu from bookworm-backports' failed: qemu-system-x86 >= 10 (found: none) is missing; run this script as root"* ]]; then
  ok "not root: one line names the step and the reason ($last)"
else
  bad "not root: exit $rc, last line: $last"; show noroot
fi

echo "setup: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
