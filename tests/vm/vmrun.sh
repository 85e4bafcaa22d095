#!/usr/bin/env bash
# vmrun.sh - run one command as root in a throwaway VM whose kernel has sched_ext.
#
#   tests/vm/vmrun.sh [OPTIONS] -- CMD [ARGS...]
#   tests/vm/vmrun.sh --fetch-only        download the kernel into the cache, exit
#   tests/vm/vmrun.sh --print-mirror      print the Debian mirror used, exit
#
# Boots Debian's trixie-backports cloud kernel (CONFIG_SCHED_CLASS_EXT=y, BTF)
# in qemu, runs CMD as root (no shell unless you pass `sh -c '...'`; cwd = your
# cwd; stdin = /dev/null), streams its stdout+stderr to our stdout and exits
# with CMD's exit status.
# Harness errors: 125 = boot failure / guest died / bad usage, 124 = timeout.
#
# Two kinds of guest:
#   default      a busybox initramfs built on the fly: fast to boot, holds only
#                busybox and what --add copies in.
#   --host-root  virtme-ng (vng) boots the kernel on a read-only virtiofs view
#                of this host's root, so the guest runs the host's programs as
#                they are: a Python venv with PyTorch, perf, the peer
#                schedulers. The guest gets tmpfs on /tmp and /boot (with the
#                kernel's config), bpffs, HOME=/tmp/home; --add SRC=/X/bin/NAME
#                puts NAME first on PATH, --add of a host path is a no-op (it
#                is there already). Needs vng (scripts/setup-deps.sh installs
#                it with PyTorch into VMRUN_VENV) and virtiofsd.
#
# Options:
#   --smp N           vCPUs (default 4)
#   --mem M           guest RAM, e.g. 2G or 1536M (default 2G)
#   --numa            2 NUMA nodes; --nodes K for K nodes (vCPUs and RAM split evenly)
#   --add PATH...     copy files/dirs into the guest at the same absolute path;
#                     SRC=/ABS/DEST copies SRC to DEST. ELF files get their shared
#                     libraries. Every argument up to the next option is a path.
#   -e NAME=VALUE     environment variable for CMD (repeatable)
#   --timeout S       wall-clock limit in seconds (default 600). The guest dumps
#                     ps/dmesg and reports 124 shortly before; the host kills
#                     qemu at S as a backstop.
#   --console FILE    keep the kernel console log (ttyS0) in FILE
#   --kernel IMG      boot IMG instead of the pinned Debian kernel
#   --append ARGS     extra kernel command line
#   --accel kvm|tcg   default: kvm only if /dev/kvm is usable AND the CPU shows
#                     vmx/svm; else tcg (a paravirtual /dev/kvm without vmx
#                     cannot boot a stock kernel)
#   -v                kernel console to stderr as it happens
#   --host-root       the guest's root is the host's, read-only (virtme-ng)
#
# Environment: VMRUN_CACHE (default ${XDG_CACHE_HOME:-$HOME/.cache}/scx-zernel-vm),
#   VMRUN_KPKG / VMRUN_KVER (pinned kernel package/version), VMRUN_MIRROR,
#   VMRUN_QEMU (qemu binary), VMRUN_ACCEL, VMRUN_TCG_THREAD=single|multi,
#   VMRUN_QEMU_OPTS (extra qemu arguments, word-split), VMRUN_INT3_RETRIES
#   (default 2: reruns of a run that hit the qemu TCG "Oops: int3" race,
#   and with --host-root of a boot that hung), VMRUN_BOOT_TIMEOUT
#   (--host-root: seconds before a boot that has not reached the command
#   counts as hung; default 240), VMRUN_VENV (--host-root: the venv holding
#   vng; default ${XDG_CACHE_HOME:-$HOME/.cache}/scx-zernel/venv).
# Host needs qemu-system-x86 (>= 10 for multi-threaded TCG), busybox-static,
# apt-get and dpkg-deb; scripts/setup-deps.sh installs them. Works as non-root.
set -uo pipefail

KPKG=${VMRUN_KPKG:-linux-binary-7.3.4+deb13-cloud-amd64}
KVER=${VMRUN_KVER:-7.3.4-1~bpo13+1}
CACHE=${VMRUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/scx-zernel-vm}
QEMU_BIN=${VMRUN_QEMU:-qemu-system-x86_64}
SMP=4 MEM=2G NODES=1 TIMEOUT=600 VERBOSE=0 APPEND="" CONSOLE_KEEP="" MODE=run
ACCEL=${VMRUN_ACCEL:-} KIMG="" ADDS=() ENVS=() HOST_ROOT=0
VENV=${VMRUN_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/scx-zernel/venv}

die() { echo "vmrun: $*" >&2; exit 125; }
log() { echo "vmrun: $*" >&2; }

# The Debian archive this machine's apt already uses, so a local or snapshot
# mirror is honoured; deb.debian.org if none is found.
debian_mirror() {
  local m
  m=$(grep -hsE '^(URIs:|deb )' /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
        /etc/apt/sources.list.d/*.sources \
      | grep -oE 'https?://[^ ]+/debian/?( |$)' | head -n1 | tr -d ' ')
  echo "${VMRUN_MIRROR:-${m:-http://deb.debian.org/debian}}"
}

# ---- arguments ----------------------------------------------------------------
while [ $# -gt 0 ]; do
  case $1 in
    --smp) SMP=${2:-}; shift 2 ;;
    --mem) MEM=${2:-}; shift 2 ;;
    --numa) NODES=2; shift ;;
    --nodes) NODES=${2:-}; shift 2 ;;
    --timeout) TIMEOUT=${2:-}; shift 2 ;;
    --console) CONSOLE_KEEP=${2:-}; shift 2 ;;
    --kernel) KIMG=${2:-}; shift 2 ;;
    --append) APPEND="$APPEND ${2:-}"; shift 2 ;;
    --accel) ACCEL=${2:-}; shift 2 ;;
    -e|--env) [[ ${2:-} == [A-Za-z_]*=* ]] || die "-e needs NAME=VALUE"; ENVS+=("$2"); shift 2 ;;
    -v|--verbose) VERBOSE=1; shift ;;
    --add) shift; if [ $# -eq 0 ] || [[ $1 == -* ]]; then die "--add needs a path"; fi
           while [ $# -gt 0 ] && [[ $1 != -* ]]; do ADDS+=("$1"); shift; done ;;
    --fetch-only) MODE=fetch; shift ;;
    --host-root) HOST_ROOT=1; shift ;;
    --print-mirror) debian_mirror; exit 0 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (the command goes after --)" ;;
  esac
done
[[ $SMP =~ ^[1-9][0-9]*$ && $NODES =~ ^[1-9][0-9]*$ && $TIMEOUT =~ ^[1-9][0-9]*$ ]] \
  || die "--smp, --nodes and --timeout take positive integers"
(( SMP % NODES == 0 )) || die "--smp ($SMP) must be a multiple of the node count ($NODES)"

# ---- kernel: the pinned Debian package, downloaded once into the cache ----------
# linux-binary-* holds only vmlinuz; linux-base-* of the same release holds the
# config, which the guest needs at /boot/config-<release> (libbpf resolves
# CONFIG_* externs from it).
fetch_kernel() {
  local kdir=$CACHE/kernels/${KPKG}_$KVER apt=$CACHE/apt mirror
  KIMG=$kdir/vmlinuz
  [ -s "$KIMG" ] && return 0
  mirror=$(debian_mirror)
  mkdir -p "$kdir" "$apt"/{lists/partial,archives/partial,cache,parts} || die "cannot create $CACHE"
  local kr=""
  [ -r /usr/share/keyrings/debian-archive-keyring.gpg ] \
    && kr=" signed-by=/usr/share/keyrings/debian-archive-keyring.gpg"
  echo "deb [arch=amd64$kr] $mirror trixie-backports main" >"$apt/sources.list"
  # Private apt state: never touches /etc/apt or /var/lib/apt, works as non-root.
  local o=(-o "Dir::Etc::sourcelist=$apt/sources.list" -o "Dir::Etc::sourceparts=$apt/parts"
           -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache"
           -o "Dir::Cache::Archives=$apt/archives" -o Acquire::Languages=none
           -o "APT::Sandbox::User=$(id -un)" -o Debug::NoLocking=1)
  log "downloading kernel $KPKG=$KVER from $mirror (once; cached in $CACHE)"
  (
    flock 9   # concurrent runs download once
    [ -s "$KIMG" ] && exit 0
    apt-get -q "${o[@]}" update >&2 || exit 1
    tmp=$(mktemp -d "$kdir/dl.XXXXXX") || exit 1
    trap 'rm -rf "$tmp"' EXIT
    if ! (cd "$tmp" && apt-get -q "${o[@]}" download "$KPKG=$KVER" \
            "${KPKG/linux-binary-/linux-base-}=$KVER" >&2); then
      log "the pinned kernel is not downloadable; cloud kernels available:"
      apt-cache "${o[@]}" search --names-only '^linux-binary-.*-cloud-amd64$' >&2
      log "set VMRUN_KPKG / VMRUN_KVER to one of them"
      exit 1
    fi
    for deb in "$tmp"/*.deb; do dpkg-deb -x "$deb" "$tmp/x" || exit 1; done
    img=$(find "$tmp/x" -name 'vmlinuz*' -type f | head -n1)
    [ -n "$img" ] && [ -f "$(dirname "$img")/config" ] || { log "no vmlinuz/config in the packages"; exit 1; }
    basename "$(dirname "$img")" >"$kdir/release" \
      && mv "$(dirname "$img")/config" "$kdir/config" \
      && mv "$img" "$KIMG.part" && mv "$KIMG.part" "$KIMG"
  ) 9>"$CACHE/.lock" || die "kernel download failed"
}
if [ -z "$KIMG" ]; then
  mkdir -p "$CACHE" || die "cannot create $CACHE"
  fetch_kernel
fi
[ -r "$KIMG" ] || die "kernel image '$KIMG' not readable"
if [ "$MODE" = fetch ]; then echo "$KIMG"; exit 0; fi
[ $# -gt 0 ] || die "no command given; usage: vmrun.sh [OPTIONS] -- CMD [ARGS...]"

# ---- --host-root: virtme-ng on a read-only view of this host's root -----------------
q() { local s=${1//\'/\'\\\'\'}; printf "'%s'" "$s"; }
run_host_root() {
  local vng virtiofsd out bin spec src dst release rc attempt=0 pid t0 waited hung
  vng=$(PATH=$VENV/bin:$PATH command -v vng) || die "vng not found (in $VENV/bin or PATH): run scripts/setup-deps.sh"
  virtiofsd=$(PATH=/usr/libexec:/usr/lib/qemu:${CARGO_HOME:-$HOME/.cargo}/bin:$PATH command -v virtiofsd) \
    || die "virtiofsd not found: run scripts/setup-deps.sh (cargo install virtiofsd)"
  (( NODES == 1 )) || die "--numa is not supported with --host-root"
  # The output directory is shared read-write; it must not be under /tmp, which
  # the guest covers with a tmpfs.
  mkdir -p "$CACHE/runs" || die "cannot create $CACHE/runs"
  out=$(mktemp -d "$CACHE/runs/run.XXXXXX") || die "mktemp failed"
  # shellcheck disable=SC2064  # expand now: $out is local
  trap "rm -rf '$out'" EXIT
  bin=$out/bin; mkdir -p "$bin"
  for spec in "${ADDS[@]}"; do
    src=$spec dst=$spec
    if [ ! -e "$spec" ] && [[ $spec == *=/* ]]; then src=${spec%%=/*} dst=/${spec#*=/}; fi
    [ -e "$src" ] || die "--add: '$src' does not exist"
    if [ "$(realpath -m "$src")" = "$(realpath -m "$dst")" ]; then continue; fi
    [[ $(dirname "$dst") == */bin ]] || die "--add $spec: with --host-root only SRC=/.../bin/NAME or a host path"
    cp -L -p "$src" "$bin/$(basename "$dst")" || die "--add: copying '$src' failed"
  done
  release=""
  if [ -s "$(dirname "$KIMG")/config" ] && [ -s "$(dirname "$KIMG")/release" ]; then
    release=$(cat "$(dirname "$KIMG")/release"); cp "$(dirname "$KIMG")/config" "$out/config"
  fi
  # The guest's own deadline leaves room for a slow boot on a loaded host, so
  # a hung case still reports its processes and kernel log.
  local deadline=$(( TIMEOUT > 300 ? TIMEOUT - 90 : TIMEOUT * 2 / 3 ))
  # shellcheck disable=SC2016  # the guest script's own expansions, written as they are
  {
    echo '#!/bin/sh'
    echo '# Run by virtme-ng-init as root; the root filesystem is the host'"'"'s, read-only.'
    echo "OUT=$(q "$out")"
    echo ': >"$OUT/booted"'
    echo "CWD=$(q "$PWD")"
    # A cwd under /tmp (a clone made with mktemp -d) would be hidden by the
    # guest's tmpfs: it is bound aside first and back on top afterwards.
    echo 'case $CWD in /tmp/?*) mkdir -p "$OUT/cwd" && mount --bind "$CWD" "$OUT/cwd" ;; esac'
    echo 'mount -t tmpfs tmpfs /tmp && chmod 1777 /tmp'
    echo 'case $CWD in /tmp/?*) mkdir -p "$CWD" && mount --bind "$OUT/cwd" "$CWD" ;; esac'
    echo 'mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf'
    if [ -n "$release" ]; then
      echo "mount -t tmpfs tmpfs /boot && cp \"\$OUT/config\" /boot/config-$(q "$release")"
    fi
    echo 'mkdir -p /tmp/home; export HOME=/tmp/home TERM=dumb'
    echo "export PATH=\"\$OUT/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\""
    for e in "${ENVS[@]}"; do echo "export ${e%%=*}=$(q "${e#*=}")"; done
    echo 'cd "$CWD" || { echo "vmrun: cannot enter $CWD in the guest" >"$OUT/log"; echo 125 >"$OUT/rc"; exit 125; }'
    echo 'echo "<5>vmrun: booted in $(cut -d" " -f1 /proc/uptime) s" >/dev/kmsg'
    printf '%s' '"$@" </dev/null >"$OUT/log" 2>&1 &'; echo
    echo 'cmd=$!'
    echo "( sleep $deadline"
    echo "  { echo \"vmrun: TIMEOUT after ${deadline}s in the guest; processes and kernel log follow\""
    echo '    ps -eo pid,stat,args | grep -v " \[.*\]$"; echo "--- dmesg (last 60 lines)"; dmesg | tail -n 60'
    echo '    echo "--- sched_ext state: $(cat /sys/kernel/sched_ext/state 2>/dev/null)"; } >>"$OUT/log" 2>&1'
    echo '  echo 124 >"$OUT/rc"; sync; echo o >/proc/sysrq-trigger ) </dev/null >/dev/null 2>&1 &'
    echo 'wait $cmd; echo $? >"$OUT/rc.tmp"; mv "$OUT/rc.tmp" "$OUT/rc"; sync'
  } >"$out/guest.sh"
  local args=()
  for a in "$@"; do args+=("$(q "$a")"); done
  if [ -n "$CONSOLE_KEEP" ]; then : >"$CONSOLE_KEEP" || log "cannot write $CONSOLE_KEEP"; fi
  while :; do
    : >"$out/log"; rm -f "$out/rc" "$out/booted"; : >"$out/console"
    (( VERBOSE )) && log "host root: vng, cpus=$SMP mem=$MEM timeout=${TIMEOUT}s kernel=$KIMG"
    t0=$SECONDS
    # vng's own status is 255 even when the guest command succeeded: the
    # command's status comes back in $out/rc. Its own process group, so that a
    # timeout takes qemu and virtiofsd down with it.
    PATH=$(dirname "$vng"):$(dirname "$virtiofsd"):$PATH setsid "$vng" --run "$KIMG" --disable-kvm --verbose \
      --cpus "$SMP" --memory "$MEM" --rwdir "$out" ${APPEND:+--append "$APPEND"} \
      --exec "sh $(q "$out/guest.sh") ${args[*]}" </dev/null >"$out/console" 2>&1 &
    pid=$!
    tail -n +1 -f "$out/log" --pid "$pid" &
    TAILPID=$!
    if (( VERBOSE )); then tail -n +1 -f "$out/console" --pid "$pid" >&2 & fi
    waited=0 hung=0
    while kill -0 "$pid" 2>/dev/null && (( SECONDS - t0 < TIMEOUT )); do
      # The guest script's first act marks the boot done.
      if [ ! -e "$out/booted" ] && (( SECONDS - t0 >= BOOT_TIMEOUT )); then hung=1; break; fi
      sleep 1
    done
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM -- "-$pid" 2>/dev/null; sleep 5; kill -KILL -- "-$pid" 2>/dev/null; waited=1
    fi
    wait "$pid" 2>/dev/null
    sleep 0.3; kill "$TAILPID" 2>/dev/null; wait "$TAILPID" 2>/dev/null; TAILPID=""
    if [ -n "$CONSOLE_KEEP" ]; then cat "$out/console" >>"$CONSOLE_KEEP" 2>/dev/null; fi
    rc=$(cat "$out/rc" 2>/dev/null)
    if (( hung )) && [ "$attempt" -lt "$INT3_RETRIES" ]; then
      attempt=$((attempt + 1))
      log "the guest kernel did not reach the command in ${BOOT_TIMEOUT}s (its console stops at: $(tail -n 1 "$out/console" | tr -cd '[:print:]' | cut -c1-100)); running again in a fresh VM, retry $attempt of $INT3_RETRIES"
      continue
    fi
    if [ "${rc:-125}" = 0 ] || [ "$attempt" -ge "$INT3_RETRIES" ] || ! grep -q 'Oops: int3' "$out/console"; then
      break
    fi
    attempt=$((attempt + 1))
    log "the guest kernel hit 'Oops: int3' (qemu TCG race, see below); running again in a fresh VM, retry $attempt of $INT3_RETRIES"
  done
  [ -n "$rc" ] && exit "$rc"
  (( hung )) && { log "the guest kernel did not reach the command in ${BOOT_TIMEOUT}s, $((attempt + 1)) boots (vng)"; tail -n 40 "$out/console" >&2; exit 125; }
  (( waited )) && { log "TIMEOUT: guest still running after ${TIMEOUT}s (vng)"; tail -n 40 "$out/console" >&2; exit 124; }
  log "guest did not report an exit status (boot failure or panic; vng)"; tail -n 40 "$out/console" >&2
  exit 125
}
INT3_RETRIES=${VMRUN_INT3_RETRIES:-2}
# --host-root: a guest whose kernel has not run the command after this many
# seconds is hung in its boot (seen under TCG on a loaded host: the console
# stopped 1.3 s into the boot, at the HPET, and qemu spun until the case's
# timeout); it is booted again, as for the int3 race. A normal boot takes
# 7 s, and under a minute beside a CPU hog.
BOOT_TIMEOUT=${VMRUN_BOOT_TIMEOUT:-240}
TAILPID=""
if (( HOST_ROOT )); then run_host_root "$@"; fi

# ---- host tools -------------------------------------------------------------------
command -v "$QEMU_BIN" >/dev/null || die "$QEMU_BIN not found (run scripts/setup-deps.sh as root)"
BUSYBOX=$(command -v busybox) || die "busybox not found (apt-get install busybox-static)"
QEMU_MAJOR=$("$QEMU_BIN" --version | sed -n 's/.*version \([0-9]*\).*/\1/p' | head -n1)

# ---- initramfs ----------------------------------------------------------------------
W=$(mktemp -d "${TMPDIR:-/tmp}/vmrun.XXXXXX") || die "mktemp failed"
TAILPID=""
# shellcheck disable=SC2317  # called from the trap
cleanup() { if [ -n "$TAILPID" ]; then kill "$TAILPID" 2>/dev/null; fi; rm -rf "$W"; }
trap cleanup EXIT
trap 'exit 130' INT TERM
R=$W/root
mkdir -p "$R"/{dev,proc,sys,tmp,run,root,etc,vmrun,usr/bin,usr/sbin,usr/lib,usr/lib64,usr/local/bin}
for d in bin sbin lib lib64; do   # mirror the host's merged-/usr layout so library paths match
  if [ -L "/$d" ]; then ln -s "$(readlink "/$d")" "$R/$d"; else mkdir -p "$R/$d"; fi
done
cp -L "$BUSYBOX" "$R/bin/busybox" || die "copying busybox failed"
for a in $("$BUSYBOX" --list-full); do [ -e "$R/$a" ] || ln -s /bin/busybox "$R/$a"; done
kd=$(dirname "$KIMG")
if [ -s "$kd/config" ] && [ -s "$kd/release" ]; then
  mkdir -p "$R/boot" && cp "$kd/config" "$R/boot/config-$(cat "$kd/release")"
fi
printf 'root:x:0:0:root:/root:/bin/sh\n' >"$R/etc/passwd"
printf 'root:x:0:\n' >"$R/etc/group"
echo "127.0.0.1 localhost vm" >"$R/etc/hosts"

is_elf() { [ -f "$1" ] && [ "$(head -c4 "$1" | od -An -c | tr -d ' ')" = '177ELF' ]; }
copy_libs() {   # the shared libraries (and loader) an ELF file needs, at the same paths
  local line lib
  while IFS= read -r line; do
    [[ $line == *"not found"* ]] && die "$1: missing library: $line"
    lib=$(grep -o '/[^ ]*' <<<"$line" | head -n1)
    if [ -z "$lib" ] || [ ! -e "$lib" ] || [ -e "$R$lib" ]; then continue; fi
    mkdir -p "$R$(dirname "$lib")" || die "cannot create $R$(dirname "$lib")"
    cp -L "$lib" "$R$lib" || die "copying $lib failed"
  done < <(ldd "$1" 2>/dev/null)
}
copy_libs "$R/bin/busybox"   # nothing for busybox-static
for spec in "${ADDS[@]}"; do
  src=$spec dst=$spec
  if [ ! -e "$spec" ] && [[ $spec == *=/* ]]; then src=${spec%%=/*} dst=/${spec#*=/}; fi
  [ -e "$src" ] || die "--add: '$src' does not exist"
  [[ $dst == /* ]] || dst=$PWD/$dst
  mkdir -p "$R$(dirname "$dst")" || die "--add: cannot create $(dirname "$dst")"
  if [ -d "$src" ]; then mkdir -p "$R$dst" && cp -a "$src/." "$R$dst/"
  else rm -f "$R$dst"; cp -L -p "$src" "$R$dst"; fi || die "--add: copying '$src' failed"
  while IFS= read -r -d '' f; do is_elf "$f" && copy_libs "$f"; done < <(find "$R$dst" -type f -print0)
done
[ -e "$R/etc/ld.so.cache" ] || cp /etc/ld.so.cache "$R/etc/" 2>/dev/null || true

# The command, quoted for the guest shell, run from the same cwd as here.
{
  for e in "${ENVS[@]}"; do echo "export ${e%%=*}=$(q "${e#*=}")"; done
  echo "mkdir -p $(q "$PWD") 2>/dev/null; cd $(q "$PWD") 2>/dev/null || cd /root"
  printf 'exec'; for a in "$@"; do printf ' %s' "$(q "$a")"; done; echo
} >"$R/vmrun/cmd"

# The guest reports the command's status on the kernel console with a random
# token (CMD's own output cannot fake it). It also enforces the deadline itself,
# a little before the host does, so a hung case still leaves a process list and
# the kernel log in its output rather than just being killed.
TOKEN=VMRUN_RC_$RANDOM$RANDOM
GUEST_DEADLINE=$(( TIMEOUT > 60 ? TIMEOUT - 20 : TIMEOUT * 2 / 3 ))
cat >"$R/init" <<EOF
#!/bin/sh
# PID 1: mount the usual filesystems, run the command with its output on ttyS1,
# report its status on the kernel console (ttyS0), power off.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TERM=dumb
mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm; mount -t devpts devpts /dev/pts; mount -t tmpfs tmpfs /dev/shm
ln -sf /proc/self/fd /dev/fd; ln -sf fd/0 /dev/stdin; ln -sf fd/1 /dev/stdout; ln -sf fd/2 /dev/stderr
# / is already a writable tmpfs (the initramfs); a tmpfs on /tmp would hide --add files.
ln -sf /proc/mounts /etc/mtab; chmod 1777 /tmp
mount -t cgroup2 cgroup2 /sys/fs/cgroup; mount -t bpf bpf /sys/fs/bpf
mount -t debugfs debugfs /sys/kernel/debug; mount -t tracefs tracefs /sys/kernel/tracing
mount -t securityfs securityfs /sys/kernel/security
hostname vm; ip link set lo up 2>/dev/null
stty -F /dev/ttyS1 raw -echo
echo "<5>vmrun: booted in \$(cut -d' ' -f1 /proc/uptime) s" >/dev/kmsg
sh /vmrun/cmd </dev/null >/dev/ttyS1 2>&1 &
cmd=\$!
(
  sleep $GUEST_DEADLINE
  echo "vmrun: TIMEOUT after ${GUEST_DEADLINE}s in the guest; processes and kernel log follow"
  ps -o pid,stat,args | grep -v ' \\[.*\\]\$'   # user processes only; not kernel threads
  echo "--- dmesg (last 60 lines)"; dmesg | tail -n 60
  echo "--- sched_ext state: \$(cat /sys/kernel/sched_ext/state 2>/dev/null)"
  stty -F /dev/ttyS1 raw
  echo "<2>$TOKEN=124" >/dev/kmsg
  poweroff -f
) </dev/null >/dev/ttyS1 2>&1 &
wait \$cmd
rc=\$?
stty -F /dev/ttyS1 raw     # tcsetattr(TCSADRAIN): wait until all output left the UART
echo "<2>$TOKEN=\$rc" >/dev/kmsg
poweroff -f
EOF
chmod 755 "$R/init" "$R/vmrun/cmd"
# Uncompressed: the kernel unpacks it faster than it would decompress it under TCG.
(cd "$R" && find . | "$BUSYBOX" cpio -o -H newc 2>/dev/null) >"$W/initrd" || die "cpio failed"

# ---- qemu -------------------------------------------------------------------------------
if [ -z "$ACCEL" ]; then
  ACCEL=tcg
  [ -r /dev/kvm ] && [ -w /dev/kvm ] && grep -qwE 'vmx|svm' /proc/cpuinfo && ACCEL=kvm
fi
case $ACCEL in
  kvm) AOPT=(-accel kvm -cpu host) ;;
  tcg) # qemu 7.2 (bookworm) crashes guests under multi-threaded TCG ("Oops: int3")
       # when the kernel live-patches static keys, which sched_ext does on every
       # enable/disable; 10.0 (bookworm-backports) is fine. Older qemu: single-
       # threaded TCG (correct, but only one host core).
       th=${VMRUN_TCG_THREAD:-multi}
       if [ -z "${VMRUN_TCG_THREAD:-}" ] && [ "${QEMU_MAJOR:-0}" -lt 10 ]; then
         th=single
         log "qemu ${QEMU_MAJOR:-?} < 10: single-threaded TCG (slow); scripts/setup-deps.sh installs qemu 10"
       fi
       AOPT=(-accel "tcg,thread=$th" -cpu max) ;;
  *) die "--accel must be kvm or tcg" ;;
esac
memb=$(numfmt --from=iec "${MEM%[bB]}" 2>/dev/null) || die "bad --mem '$MEM'"
memmb=$(( memb >= 1048576 ? memb / 1048576 : memb ))   # a plain number means MiB, as in qemu
NUMA=()
if (( NODES > 1 )); then
  per=$(( memmb / NODES )) cpn=$(( SMP / NODES )); memmb=$(( per * NODES ))
  for ((i = 0; i < NODES; i++)); do
    NUMA+=(-object "memory-backend-ram,id=m$i,size=${per}M"
           -numa "node,nodeid=$i,memdev=m$i,cpus=$((i * cpn))-$((i * cpn + cpn - 1))")
  done
fi
CONSOLE=$W/console.log; : >"$CONSOLE"
CMDLINE="console=ttyS0 panic=-1 quiet loglevel=4 mitigations=off tsc=reliable$APPEND"
# SC2206: VMRUN_QEMU_OPTS is meant to be word-split; SC2054: commas are qemu's.
# shellcheck disable=SC2206,SC2054
QEMU=("$QEMU_BIN" -nodefaults -no-user-config -display none -no-reboot
  -machine pc "${AOPT[@]}" -smp "$SMP" -m "${memmb}M" "${NUMA[@]}"
  -kernel "$KIMG" -initrd "$W/initrd" -append "$CMDLINE"
  -chardev "file,id=con,path=${CONSOLE//,/,,}" -serial chardev:con
  -chardev stdio,id=out,signal=off -serial chardev:out ${VMRUN_QEMU_OPTS:-})

(( VERBOSE )) && log "accel=$ACCEL smp=$SMP mem=${memmb}M nodes=$NODES timeout=${TIMEOUT}s kernel=$KIMG"
# Multi-threaded TCG, even in qemu 10, now and then lets a vCPU execute a stale
# int3 that the kernel's live text patching (static keys, alternatives) has
# already removed: "Oops: int3", at boot or when sched_ext flips its static
# keys; about one boot in 25 on a busy 2-core host. That is qemu's race, not the
# code under test, so such a failed run is repeated in a fresh VM (at most
# VMRUN_INT3_RETRIES times, default 2), and says so on stderr. Single-threaded
# TCG (VMRUN_TCG_THREAD=single) does not have the race but uses one host core.
if [ -n "$CONSOLE_KEEP" ]; then : >"$CONSOLE_KEEP" || log "cannot write $CONSOLE_KEEP"; fi
attempt=0
while :; do
  : >"$CONSOLE"
  if (( VERBOSE )); then tail -n +1 -f "$CONSOLE" >&2 & TAILPID=$!; fi
  # --foreground: Ctrl-C still reaches qemu; its stdin is /dev/null (CI has none).
  timeout --foreground -k 10 "$TIMEOUT" "${QEMU[@]}" </dev/null 2>"$W/qemu.err"
  qrc=$?
  if [ -n "$TAILPID" ]; then sleep 0.3; kill "$TAILPID" 2>/dev/null; wait "$TAILPID" 2>/dev/null; TAILPID=""; fi
  if [ -n "$CONSOLE_KEEP" ]; then cat "$CONSOLE" >>"$CONSOLE_KEEP" 2>/dev/null; fi
  rc=$(grep -ao "$TOKEN=[0-9]*" "$CONSOLE" | tail -n1 | cut -d= -f2)
  if [ "$ACCEL" != tcg ] || [ "${rc:-125}" = 0 ] || [ "$attempt" -ge "$INT3_RETRIES" ] \
     || ! grep -q 'Oops: int3' "$CONSOLE"; then
    break
  fi
  attempt=$((attempt + 1))
  log "the guest kernel hit 'Oops: int3' (qemu TCG race with kernel text patching, see vmrun.sh); running again in a fresh VM, retry $attempt of $INT3_RETRIES"
  if [ -n "$CONSOLE_KEEP" ]; then echo "=== vmrun: retry $attempt" >>"$CONSOLE_KEEP"; fi
done

[ -n "$rc" ] && exit "$rc"
fail() {
  log "$1"; cat "$W/qemu.err" >&2
  (( VERBOSE )) || { log "kernel console (last 40 lines):"; tail -n 40 "$CONSOLE" >&2; }
  exit "$2"
}
[ "$qrc" -eq 124 ] && fail "TIMEOUT: guest still running after ${TIMEOUT}s (accel=$ACCEL)" 124
fail "guest did not report an exit status (boot failure or panic; qemu rc=$qrc, accel=$ACCEL)" 125
