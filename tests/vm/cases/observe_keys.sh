#!/bin/sh
# vm: --smp 2 --mem 1G --timeout 400
#
# The [observe] keys that bound the daemon's /proc work, each shown to decide
# what reaches the kernel. Three in-process loaders (zernel-workload reader:
# a thread reading fast, so an ML process's thread is in DataLoading, class
# ml) hold a fake GPU device (/dev/zt_gpu0, made a device by
# ml_device_prefixes): zt_low at low fds from its exec on, zt_high at fd 40
# from the start, zt_late at a low fd only once the daemon has looked at it
# (with a new mapping, as a program initialising a GPU does). zt_late starts
# first; the daemon finds new processes in PID order, so once zt_low or
# zt_high is ML in the kernel, zt_late has had its first scan, and it is told
# to open the device (--open-when). A fourth process has 300 idle threads.
#  run 1: the defaults (1024 fds, 32768 cached), evidence_interval_ms = 300
#         zt_high and zt_late are ML (zt_late within 45 s of opening the
#         device: 6-9 s on an idle host; T s), and the daemon keeps a /proc
#         file open per thread it samples (over 300).
#  run 2: max_fds_scanned = 8, evidence_interval_ms = 600000, max_cached_fds = 16
#         zt_low is ML (class ml in the kernel); zt_high is not (its device
#         fd is past the first 8); zt_late is not, 2T s (15..45) after it
#         opened the device (its evidence is not looked at again for 10 min,
#         longer than the processes live: the time spent waiting for zt_low
#         plus the watch can never reach it, however slow the host);
#         the daemon keeps at most 16 /proc files open.
# shellcheck disable=SC2317 source=tests/vm/guest-lib.sh
. "$(dirname "$0")/../guest-lib.sh"

: >/dev/zt_gpu0
S=150
start_all() {
  rm -f /tmp/zt_late.go
  zernel-workload reader --name zt_late --secs $S --open /dev/zt_gpu0 --open-when /tmp/zt_late.go >/tmp/zt_late.out &
  late=$!
  # The shell opens the device for zt_low before the exec (fd 3), so the
  # daemon's scan at the exec sees it however soon it comes: the reader's
  # own open may come after that scan on a slow host, and in run 2 no
  # other scan comes for 10 min.
  zernel-workload reader --name zt_low --secs $S --open /dev/zt_gpu0 >/tmp/zt_low.out 3</dev/zt_gpu0 &
  low=$!
  zernel-workload reader --name zt_high --secs $S --open /dev/zt_gpu0 --fd 40 >/tmp/zt_high.out &
  high=$!
  zernel-workload threads --count 300 --secs $S --wake-ms 200 --ml >/tmp/zt_threads.out &
  thr=$!
}
stop_all() { kill $low $high $late $thr 2>/dev/null; wait $low $high $late $thr 2>/dev/null; }
class_is() { [ "$(ztask "$1" class)" = "$2" ]; }
# /proc files the daemon holds open (one `ls`: a readlink per fd is too slow
# in the guest with 2,000 of them).
# shellcheck disable=SC2010
proc_fds() { ls -l "/proc/$ZPID/fd" 2>/dev/null | grep -c ' -> /proc/'; }
opened_late() { grep -q opened /tmp/zt_late.out; }

# ---- run 1: defaults, a short evidence interval
cat >/tmp/ok2.toml <<'TOML'
[observe]
ml_device_prefixes = ["/dev/zt_gpu"]
evidence_interval_ms = 300
TOML
zernel_start /tmp/ok2.toml || finish
start_all
wait_until 30 class_is $high ml
assert_eq "max_fds_scanned = 1024: zt_high (device at fd 40) is ML, kernel class" "$(ztask $high class)" ml
assert_eq "zt_late has no entry before it opens the device" "$(ztask $late class)" ""
touch /tmp/zt_late.go
wait_until 10 opened_late
t0=$(uptime_s)
wait_until 45 class_is $late ml
assert_eq "evidence_interval_ms = 300: zt_late is ML after it opened the device, kernel class" \
  "$(ztask $late class)" ml
took=$(awk -v a="$t0" -v b="$(uptime_s)" 'BEGIN { printf "%d", b - a + 0.999 }')
echo "zt_late classified $took s after it opened the device"
max=0 n=0
while [ $n -lt 10 ]; do
  c=$(proc_fds); [ "$c" -gt "$max" ] && max=$c
  sleep 0.5; n=$((n + 1))
done
echo "run 1: the daemon held at most $max /proc files open (max_cached_fds = 32768)"
assert_gt "max_cached_fds = 32768: over 300 /proc files open" "$max" 300
stop_all
zernel_stop TERM
assert_eq "run 1: exit 0" "$ZRC" 0
# ---- run 2: tight bounds. zt_late is watched for twice as long as run 1
# needed to classify it (at least 15 s, at most 45 s: well within the 10 min
# evidence interval), so a slow host cannot make the negative pass early.
cat >/tmp/ok1.toml <<'TOML'
[observe]
ml_device_prefixes = ["/dev/zt_gpu"]
max_fds_scanned = 8
evidence_interval_ms = 600000
max_cached_fds = 16
TOML
zernel_start /tmp/ok1.toml || finish
start_all
wait_until 30 class_is $low ml
assert_eq "max_fds_scanned = 8: zt_low (device at fd $(sed 's/.*fd //' /tmp/zt_low.out)) is ML, kernel class" \
  "$(ztask $low class)" ml
touch /tmp/zt_late.go
wait_until 10 opened_late
check "zt_late opened the device" opened_late
watch=$(( took * 2 > 15 ? took * 2 : 15 )); [ "$watch" -gt 45 ] && watch=45
max=0 n=0
while [ $n -lt $((watch * 2)) ]; do   # $watch s after zt_late opened the device
  c=$(proc_fds); [ "$c" -gt "$max" ] && max=$c
  sleep 0.5; n=$((n + 1))
done
assert_eq "max_fds_scanned = 8: zt_high (device at fd 40) has no entry" "$(ztask $high class)" ""
assert_eq "evidence_interval_ms = 600000: zt_late has no entry $watch s after it opened the device" \
  "$(ztask $late class)" ""
echo "run 2: the daemon held at most $max /proc files open (max_cached_fds = 16)"
check "max_cached_fds = 16: at most 16 /proc files open" [ "$max" -le 16 ]
stop_all
zernel_stop TERM
assert_eq "run 2: exit 0" "$ZRC" 0

check "dmesg is clean" dmesg_clean
finish
