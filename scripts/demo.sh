#!/usr/bin/env bash
# demo.sh - see scx_zernel work on a real PyTorch job, on any Linux machine,
# whether or not its kernel has sched_ext.
#
#   scripts/demo.sh [--short] [--steps N] [--hogs N]      (as root)
#
# Boots Debian's sched_ext kernel under qemu (tests/vm/vmrun.sh --host-root:
# virtme-ng on a read-only view of this machine's root), starts a real
# PyTorch training job there (tests/workloads/pytorch/train.py, a CNN with
# DataLoader(num_workers=2), on the CPU) beside stress-ng CPU hogs (2 per
# vCPU by default), and times the same number of training steps (--steps,
# default 10; --short: 3), counted from a step boundary, first under the
# kernel's default scheduler (EEVDF), then under scx_zernel, whose live
# `--monitor` view it shows in between, with the hogs' CPU over the same
# time. Prints both side by side. The rate is measured on the job's own
# clock (the time train.py finished each step), so a polling shell served
# late does not stretch it. The work is sized, not the time: a phase
# lasts as long as its steps take (at most --max-secs, default 900; a phase
# cut off there reports the steps it made). Under emulation, absolute speeds
# mean nothing; the ratio does.
#
# Needs what scripts/setup-deps.sh installs (it is run first; it installs
# only what is missing).
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=10 MAXS=900 HOGS=4
while [ $# -gt 0 ]; do
  case $1 in
    --short) STEPS=3 ;;
    --steps) STEPS=${2:?--steps needs a number}; shift ;;
    --max-secs) MAXS=${2:?--max-secs needs a number}; shift ;;
    --hogs) HOGS=${2:?--hogs needs a number}; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "demo: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[[ $STEPS =~ ^[1-9][0-9]*$ && $MAXS =~ ^[1-9][0-9]*$ && $HOGS =~ ^[0-9]+$ ]] ||
  { echo "demo: --steps, --max-secs and --hogs take whole numbers (--steps and --max-secs > 0)" >&2; exit 2; }

scripts/setup-deps.sh >&2 || { echo "demo: scripts/setup-deps.sh failed" >&2; exit 1; }
cargo build --release --bin scx_zernel >&2 || { echo "demo: cargo build failed" >&2; exit 1; }
VENV=${VMRUN_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/scx-zernel/venv}
exec tests/vm/vmrun.sh --host-root --smp 2 --mem 4G --timeout $((4 * MAXS + 1200)) \
  -e "ZERNEL_PYTHON=$VENV/bin/python" -e "DEMO_STEPS=$STEPS" -e "DEMO_MAXS=$MAXS" -e "DEMO_HOGS=$HOGS" \
  --add "$PWD/target/release/scx_zernel=/usr/local/bin/scx_zernel" -- sh scripts/demo-guest.sh
