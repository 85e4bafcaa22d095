#!/bin/sh
# vm: --smp 2 --mem 1G
#
# Operability against a running instance: the metrics endpoint serves
# OpenMetrics (HELP/TYPE lines, `# EOF`) by default and the Prometheus 0.0.4
# text when asked, and a counter moves between two scrapes; `--monitor`
# (client only) prints the stats of the running daemon as deltas (what
# each counter counted since its previous line); `--stats` prints
# them from the daemon itself; `inspect` reads the pinned maps.
# shellcheck disable=SC2317 source=tests/vm/guest-lib.sh
. "$(dirname "$0")/../guest-lib.sh"

printf '[[rules]]\ncomm = "^zt_batch$"\nclass = "batch"\n' >/tmp/ops.toml
zernel_start /tmp/ops.toml --metrics-addr 127.0.0.1:9093 --stats 1 || finish
zernel-workload hog --name zt_batch --secs 20 --threads 2 &
hog=$!
scrape() { wget -q -O - http://127.0.0.1:9093/metrics; }
sleep 2
scrape >/tmp/m1
sleep 2
scrape >/tmp/m2
head -n 6 /tmp/m1
check "OpenMetrics by default: HELP and TYPE lines" sh -c "grep -q '^# HELP zernel_batch_enqueued ' /tmp/m1 && grep -q '^# TYPE zernel_batch_enqueued counter' /tmp/m1"
check "OpenMetrics ends with # EOF" sh -c "[ \"\$(tail -n 1 /tmp/m1)\" = '# EOF' ]"
wget -q -S --header 'Accept: text/plain;version=0.0.4' -O /tmp/m0 http://127.0.0.1:9093/metrics 2>/tmp/m0.head
check "Prometheus 0.0.4 text on request" sh -c "grep -qi 'Content-Type: text/plain; version=0.0.4' /tmp/m0.head && grep -q '^# TYPE zernel_batch_enqueued_total counter' /tmp/m0 && ! grep -q '^# EOF' /tmp/m0"
v1=$(awk '$1 == "zernel_batch_enqueued_total" { print $2 }' /tmp/m1)
v2=$(awk '$1 == "zernel_batch_enqueued_total" { print $2 }' /tmp/m2)
echo "zernel_batch_enqueued_total: $v1 -> $v2"
assert_gt "a counter moved between two scrapes" "${v2:-0}" "${v1:-0}"
check "gauges are typed as gauges" grep -q '^# TYPE zernel_map_entries gauge' /tmp/m2

timeout 4 scx_zernel --monitor 1 >/tmp/mon 2>&1
scrape >/tmp/m3
head -n 4 /tmp/mon
check "--monitor prints the running daemon's stats" grep -q '^\[zernel\] enq' /tmp/mon
# Served as deltas: the batch counts of the monitor's lines add up to no
# more than the counter grew while it ran (cumulative values, one per line,
# would add up to several times that), and one of them is not 0.
v3=$(awk '$1 == "zernel_batch_enqueued_total" { print $2 }' /tmp/m3)
# shellcheck disable=SC2046 # split into numbers on purpose
set -- $(awk '$1 == "[zernel]" && $2 == "enq" { split($4, a, "/"); n++; sum += a[4]; if (a[4] > max) max = a[4] }
  END { print n + 0, sum + 0, max + 0 }' /tmp/mon)
echo "--monitor: $1 lines, batch enqueued $2 in all (at most $3 in one line); the counter grew $v2 -> $v3"
assert_ge "--monitor serves deltas: its lines add up to <= the counter's growth ($2 vs $((${v3:-0} - ${v2:-0})))" $((${v3:-0} - ${v2:-0})) "$2"
assert_gt "--monitor: some line counted batch enqueues" "$3" 0
check "--stats prints from the daemon" grep -q '^\[zernel\] threads' "$ZLOG"
check "inspect reads the pinned maps" sh -c "scx_zernel inspect | grep -q '^map_capacity 65536'"

kill "$hog"; wait "$hog" 2>/dev/null
zernel_stop INT
assert_eq "SIGINT: exit 0" "$ZRC" 0
check "pinned maps removed on exit" sh -c "[ ! -e /sys/fs/bpf/scx_zernel/task_class ]"
check "dmesg is clean" dmesg_clean
finish
