#!/usr/bin/env bash
# setup-deps.sh - install what building and testing scx_zernel needs on Debian 12.
#
#   sudo scripts/setup-deps.sh [--build-only]
#
# --build-only: only what building and running the scheduler needs (no VM).
#
# Idempotent: only what is missing is installed, so a second run changes nothing
# and needs no root. Installs
#   - the BPF build: clang-19 (clang >= 18 is needed), libelf-dev, zlib1g-dev,
#     pkg-config, make, gcc (libbpf is built from source by libbpf-sys);
#   - tests/lint.sh's check of the BPF C: clang-format-19;
#   - the VM tests: busybox-static (the guest's userland), stress-ng and
#     rt-tests (cyclictest) as workloads, systemd (systemd-analyze verify of the
#     unit), and qemu-system-x86 >= 10 from
#     bookworm-backports: bookworm's qemu 7.2 crashes guests under multi-threaded
#     TCG when sched_ext patches static keys;
#   - the guest kernel: Debian's sched_ext-enabled kernel, downloaded into the
#     harness cache by tests/vm/vmrun.sh --fetch-only;
#   - the real-framework guests: a Python venv in
#     ${XDG_CACHE_HOME:-~/.cache}/scx-zernel/venv with PyTorch 2.15.0 (the CUDA
#     build from PyPI, ~5 GB; it runs on the CPU), numpy and virtme-ng 1.42, and
#     virtiofsd (cargo install; needs libseccomp-dev and libcap-ng-dev), with
#     which virtme-ng boots the guest kernel on a read-only view of this root.
# The Rust toolchain (cargo via rustup) is expected to be installed already;
# rustfmt and clippy (tests/lint.sh) are added with rustup if missing.
# /etc/apt is never modified: backports are used through a private sources list.
#
# Every failure ends with one line naming the step and the command, e.g.
#   setup-deps: step 'qemu from bookworm-backports' failed: apt-get -q ... update (exit 100, line 77)
set -eEuo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VMRUN=$ROOT/tests/vm/vmrun.sh
PKGS=(clang-19 clang-format-19 libelf-dev zlib1g-dev pkg-config make gcc busybox-static stress-ng rt-tests systemd shellcheck
      libseccomp-dev libcap-ng-dev python3-venv)
TORCH=torch==2.15.0 VIRTME=virtme-ng==1.42 VIRTIOFSD=virtiofsd@1.14.0
VENV=${VMRUN_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/scx-zernel/venv}
QEMU_MIN=10
BUILD_ONLY=0
if [ "${1:-}" = --build-only ]; then
  BUILD_ONLY=1 PKGS=(clang-19 libelf-dev zlib1g-dev pkg-config make gcc)
fi

log() { echo "setup-deps: $*" >&2; }
STEP=start
step() { STEP=$1; }
die() { log "step '$STEP' failed: $*"; trap - ERR; exit 1; }
# Any other failing command: the step, the command and its status, in one line.
# (Said once, by the script itself: not again by a command substitution that failed inside it.)
failed() {
  [ "$BASH_SUBSHELL" != 0 ] || log "step '$STEP' failed: $2 (exit $1, line $3)"
  trap - ERR
  exit "$1"
}
trap 'failed $? "$BASH_COMMAND" "$LINENO"' ERR
export DEBIAN_FRONTEND=noninteractive

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }
# The installed qemu's major version, or nothing (never fails: no qemu is a normal state here).
qemu_major() {
  command -v qemu-system-x86_64 >/dev/null 2>&1 || return 0
  qemu-system-x86_64 --version 2>/dev/null | sed -n 's/.*version \([0-9]*\).*/\1/p' | head -n1 || true
}
need_root() { [ "$(id -u)" = 0 ] || die "$1 is missing; run this script as root (sudo $0)"; }

# ---- packages from the machine's own apt sources ---------------------------------------
step "packages from the system's apt sources"
missing=()
for p in "${PKGS[@]}"; do installed "$p" || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  need_root "${missing[*]}"
  log "installing ${missing[*]}"
  apt-get -q update
  apt-get -q install -y "${missing[@]}"
else
  log "build and test packages already installed"
fi

# ---- qemu >= 10 from bookworm-backports, through a private sources list ---------------------
# `apt-get install qemu-system-x86/bookworm-backports` alone fails: its
# dependencies (qemu-system-common, qemu-system-data, seabios) must come from
# backports too, which `-t bookworm-backports` allows.
step "qemu from bookworm-backports"
qv=$(qemu_major)
if [ "$BUILD_ONLY" = 1 ]; then
  :
elif [ "${qv:-0}" -ge "$QEMU_MIN" ]; then
  log "qemu $qv already installed"
else
  need_root "qemu-system-x86 >= $QEMU_MIN (found: ${qv:-none})"
  mirror=$("$VMRUN" --print-mirror)
  L=${TMPDIR:-/tmp}/scx-zernel-apt
  mkdir -p "$L/lists/partial"
  printf 'deb %s %s main\n' "$mirror" bookworm "$mirror" bookworm-updates \
    "$mirror" bookworm-backports >"$L/sources.list"
  o=(-o "Dir::Etc::sourcelist=$L/sources.list" -o Dir::Etc::sourceparts=- -o "Dir::State::Lists=$L/lists")
  log "installing qemu-system-x86 from bookworm-backports ($mirror)"
  apt-get -q "${o[@]}" update
  apt-get -q "${o[@]}" install -y --no-install-recommends -t bookworm-backports qemu-system-x86
  qv=$(qemu_major)
  [ "${qv:-0}" -ge "$QEMU_MIN" ] || die "qemu ${qv:-none} installed, but >= $QEMU_MIN is needed"
fi

step "the Rust toolchain"
# ---- the Rust toolchain --------------------------------------------------------------------
if ! command -v cargo >/dev/null && [ ! -x "${CARGO_HOME:-$HOME/.cargo}/bin/cargo" ]; then
  die "cargo not found: install Rust >= 1.91 with rustup (https://rustup.rs) and run this again"
fi
# tests/lint.sh runs rustfmt and clippy (rustup's default profile has them).
if [ "$BUILD_ONLY" = 0 ] && ! { cargo fmt --version && cargo clippy --version; } >/dev/null 2>&1; then
  step "rustfmt and clippy (rustup component add)"
  command -v rustup >/dev/null || die "cargo fmt or cargo clippy missing, and no rustup to add them"
  rustup component add rustfmt clippy
fi

# ---- PyTorch and virtme-ng in a venv, virtiofsd ---------------------------------------------------
# The venv is reused while it holds the pinned versions; a half-made one is made again.
venv_ok() {
  "$VENV/bin/python" -c 'import importlib.metadata as m, sys
want = {"torch": "2.15.0", "virtme-ng": "1.42"}
sys.exit(any(m.version(k) != v for k, v in want.items()))' 2>/dev/null && [ -x "$VENV/bin/vng" ]
}
if [ "$BUILD_ONLY" = 0 ]; then
  step "PyTorch and virtme-ng in $VENV"
  if venv_ok; then
    log "PyTorch and virtme-ng already in $VENV"
  else
    py=$(command -v python3) || die "python3 not found (apt-get install python3 python3-venv)"
    log "installing $TORCH, numpy and $VIRTME into $VENV (about 5 GB, once)"
    rm -rf "$VENV"
    "$py" -m venv "$VENV" || die "python3 -m venv $VENV failed"
    "$VENV/bin/pip" install -q --progress-bar off "$TORCH" numpy "$VIRTME" \
      || die "pip install $TORCH numpy $VIRTME into $VENV failed"
    venv_ok || die "$VENV does not hold $TORCH and $VIRTME after pip install"
  fi
  step "virtiofsd"
  cargo_bin=${CARGO_HOME:-$HOME/.cargo}/bin
  if PATH=/usr/libexec:/usr/lib/qemu:$cargo_bin:$PATH command -v virtiofsd >/dev/null; then
    log "virtiofsd already installed"
  else
    log "building $VIRTIOFSD (cargo install)"
    PATH=$cargo_bin:$PATH cargo install -q --locked "$VIRTIOFSD" || die "cargo install --locked $VIRTIOFSD failed"
  fi
fi

# ---- the guest kernel --------------------------------------------------------------------------
step "the guest kernel"
[ "$BUILD_ONLY" = 1 ] || "$VMRUN" --fetch-only >/dev/null
log "done"
