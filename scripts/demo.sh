#!/usr/bin/env bash
# demo.sh - see scx_zernel work on a real PyTorch job, on any Linux machine,
# whether or not its kernel has sched_ext.
#
#   scripts/demo.sh [--short] [--secs N] [--hogs N]      (as root)
#
# Boots Debian's sched_ext kernel under qemu (tests/vm/vmrun.sh --host-root:
# virtme-ng on a read-only view of this machine's root), starts a real
# PyTorch training job there (tests/workloads/pytorch/train.py, a CNN with
# DataLoader(num_workers=2), on the CPU) beside stress-ng CPU hogs (2 per
# vCPU by default), and measures the job's training steps per second and the
# hogs' CPU, first under the kernel's default scheduler (EEVDF), then under
# scx_zernel, whose live `--monitor` view it shows in between. Prints both
# side by side. Each phase lasts --secs seconds (default 60; --short: 15).
# Under emulation, absolute speeds mean nothing; the ratio does.
#
# Needs what scripts/setup-deps.sh installs (it is run first; it installs
# only what is missing).
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=60 HOGS=4
while [ $# -gt 0 ]; do
  case $1 in
    --short) SECS=15 ;;
    --secs) SECS=${2:?--secs needs a number}; shift ;;
    --hogs) HOGS=${2:?--hogs needs a number}; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "demo: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[[ $SECS =~ ^[1-9][0-9]*$ && $HOGS =~ ^[0-9]+$ ]] || { echo "demo: --secs and --hogs take whole numbers" >&2; exit 2; }

scripts/setup-deps.sh >&2 || { echo "demo: scripts/setup-deps.sh failed" >&2; exit 1; }
cargo build --release --bin scx_zernel >&2 || { echo "demo: cargo build failed" >&2; exit 1; }
VENV=${VMRUN_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/scx-zernel/venv}
exec tests/vm/vmrun.sh --host-root --smp 2 --mem 4G --timeout $((2 * SECS + 1200)) \
  -e "ZERNEL_PYTHON=$VENV/bin/python" -e "DEMO_SECS=$SECS" -e "DEMO_HOGS=$HOGS" \
  --add "$PWD/target/release/scx_zernel=/usr/local/bin/scx_zernel" -- sh scripts/demo-guest.sh
