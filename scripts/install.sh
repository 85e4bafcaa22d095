#!/usr/bin/env bash
# install.sh - install scx_zernel as a systemd service (as root).
#
#   scripts/install.sh [PREFIX]       PREFIX defaults to /usr
#
# Builds the release binary, installs it to PREFIX/bin, the default config to
# /etc/scx_zernel/zernel.toml (kept if it exists; root-owned, mode 0644: the
# daemon refuses a config others can write) and the unit to
# /etc/systemd/system/scx_zernel.service, then enables and starts it.
set -euo pipefail
cd "$(dirname "$0")/.."
PREFIX=${1:-/usr}
[ "$(id -u)" = 0 ] || { echo "install.sh: run as root" >&2; exit 1; }
scripts/setup-deps.sh --build-only
cargo build --release --bin scx_zernel
install -D -m 0755 target/release/scx_zernel "$PREFIX/bin/scx_zernel"
if [ ! -e /etc/scx_zernel/zernel.toml ]; then
  install -D -m 0644 -o root -g root configs/zernel.toml /etc/scx_zernel/zernel.toml
fi
sed "s#/usr/bin/scx_zernel#$PREFIX/bin/scx_zernel#" configs/scx_zernel.service \
  >/etc/systemd/system/scx_zernel.service
systemctl daemon-reload
systemctl enable --now scx_zernel.service
systemctl --no-pager status scx_zernel.service || true
