#!/usr/bin/env bash
# Checks the packaging files without a kernel or a cluster:
#   configs/scx_zernel.service  systemd-analyze verify, no warnings (ExecStart pointed at an
#                               existing stand-in binary in a temp copy); required directives
#   configs/scx.default         read as systemd reads /etc/default/scx, scx.service's ExecStart
#                               (with and without the *_OVERRIDE pair) runs scx_zernel --config
#                               /etc/scx_zernel/zernel.toml
#   configs/scx_loader.toml     parses; only [scheds.scx_zernel] with the five mode lists,
#                               each passing the matching --mode
#   deploy/daemonset.yaml       parses; privileged, hostPID, mounts, metrics port, config
# With a built binary (target/release/scx_zernel, or $SCX_ZERNEL_BIN) the argument lists of
# the loader modes and the DaemonSet are also run with --dump-config, against the ConfigMap's
# zernel.toml. Exits non-zero if any check fails.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

pass=0
fail=0
ok() { echo "ok   $*"; pass=$((pass + 1)); }
bad() { echo "FAIL $*"; fail=$((fail + 1)); }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

unit=configs/scx_zernel.service

# --- systemd unit ------------------------------------------------------------------------
# Only lines naming the unit count: on a real host, verify may also complain about
# unrelated units it loads as dependencies.
verify_unit() { # file -> prints its warnings
    systemd-analyze verify --man=no "$1" 2>&1 | grep -F "$(basename "$1")" || true
}
if ! command -v systemd-analyze >/dev/null; then
    bad "systemd-analyze not found (apt-get install -y systemd)"
else
    stand_in=$(command -v true)
    sed "s#^ExecStart=/usr/bin/scx_zernel #ExecStart=$stand_in #" "$unit" >"$tmp/scx_zernel.service"
    if ! grep -q "^ExecStart=$stand_in --config /etc/scx_zernel/zernel.toml$" "$tmp/scx_zernel.service"; then
        bad "$unit: ExecStart is not /usr/bin/scx_zernel --config /etc/scx_zernel/zernel.toml"
    fi
    warnings=$(verify_unit "$tmp/scx_zernel.service")
    if [ -z "$warnings" ]; then ok "$unit: systemd-analyze verify"; else bad "$unit: systemd-analyze verify:"$'\n'"$warnings"; fi
    # The check itself must be able to fail: a misspelt key has to be reported.
    mkdir "$tmp/broken"
    sed 's/^Restart=on-failure$/Restart=on-failure\nRestartt=always/' "$tmp/scx_zernel.service" >"$tmp/broken/scx_zernel.service"
    if [ -n "$(verify_unit "$tmp/broken/scx_zernel.service")" ]; then ok "verify flags a misspelt key"; else bad "verify missed a misspelt key"; fi
    missing=""
    for line in ConditionPathIsDirectory=/sys/kernel/sched_ext Restart=on-failure LimitMEMLOCK=infinity \
        ReadWritePaths=/sys/fs/bpf; do
        grep -qx "$line" "$unit" || missing+=" $line"
    done
    for cap in CAP_SYS_ADMIN CAP_BPF CAP_PERFMON; do
        grep -q "^CapabilityBoundingSet=.*\b$cap\b" "$unit" || missing+=" $cap"
    done
    if [ -z "$missing" ]; then ok "$unit: required directives"; else bad "$unit: missing$missing"; fi
fi

# --- /etc/default/scx for sched-ext's scx.service ------------------------------------------
# The file is read as systemd reads an EnvironmentFile (KEY=VALUE, quotes removed, # comments),
# then the unit's ExecStart runs, in its current form (with the *_OVERRIDE pair) and its older
# one, with a stand-in scx_zernel first in PATH that records its arguments.
scx_default=${SCX_DEFAULT:-configs/scx.default}
scx_env() { # file -> KEY=VALUE lines, as systemd's EnvironmentFile parser gives them
    python3 - "$1" <<'PY'
import re, shlex, sys
for line in open(sys.argv[1]):
    line = line.strip()
    if not line or line[0] in "#;":
        continue
    m = re.match(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)$", line)
    if not m:
        sys.exit(f"{sys.argv[1]}: not KEY=VALUE: {line}")
    v = m.group(2)
    if v[:1] in "'\"":
        v = " ".join(shlex.split(v))
    print(m.group(1) + "=" + v)
PY
}
mkdir -p "$tmp/scx-bin"
# shellcheck disable=SC2016 # expanded by the stand-in
printf '#!/bin/sh\nprintf "%%s\\n" "$0" "$@" >"%s"\n' "$tmp/scx.argv" >"$tmp/scx-bin/scx_zernel"
chmod +x "$tmp/scx-bin/scx_zernel"
if ! env_lines=$(scx_env "$scx_default"); then
    bad "$scx_default: cannot be read as an EnvironmentFile"
else
    mapfile -t env_kv <<<"$env_lines"
    # shellcheck disable=SC2016 # expanded by the unit's bash
    for exec_start in 'exec ${SCX_SCHEDULER_OVERRIDE:-$SCX_SCHEDULER} ${SCX_FLAGS_OVERRIDE:-$SCX_FLAGS}' \
        'exec $SCX_SCHEDULER $SCX_FLAGS'; do
        rm -f "$tmp/scx.argv"
        env -i PATH="$tmp/scx-bin:/usr/bin:/bin" "${env_kv[@]}" /bin/bash -c "$exec_start"
        got=$(tr '\n' ' ' <"$tmp/scx.argv" 2>/dev/null)
        want="$tmp/scx-bin/scx_zernel --config /etc/scx_zernel/zernel.toml "
        if [ "$got" = "$want" ]; then ok "$scx_default: scx.service's '$exec_start' runs scx_zernel --config /etc/scx_zernel/zernel.toml"
        else bad "$scx_default: scx.service's '$exec_start' runs '$got', want '$want'"; fi
    done
    missing=""
    for key in SCX_SCHEDULER_OVERRIDE=scx_zernel SCX_FLAGS_OVERRIDE= SCX_SCHEDULER=scx_zernel SCX_FLAGS=; do
        printf '%s\n' "${env_kv[@]}" | grep -q "^$key" || missing+=" $key"
    done
    if [ -z "$missing" ]; then ok "$scx_default: sets SCX_SCHEDULER{,_OVERRIDE}=scx_zernel and SCX_FLAGS{,_OVERRIDE}"
    else bad "$scx_default: no$missing"; fi
fi

# --- scx_loader snippet and DaemonSet: structure (python3) -------------------------------
# Prints "ok ..."/"FAIL ..." lines, writes the ConfigMap's zernel.toml and the argument lists
# to run into $tmp.
if ! python3 -c 'import tomllib' 2>/dev/null; then
    bad "python3 with tomllib (3.11+) not found"
else
    python3 - "$tmp" <<'PY' >"$tmp/py.out" 2>&1
import sys, tomllib, pathlib
tmp = pathlib.Path(sys.argv[1])
def ok(m): print("ok  ", m)
def bad(m): print("FAIL", m)

# scx_loader.toml
path = "configs/scx_loader.toml"
try:
    loader = tomllib.load(open(path, "rb"))
    modes = {"auto_mode": "auto", "gaming_mode": "gaming", "lowlatency_mode": "lowlatency",
             "powersave_mode": "powersave", "server_mode": "server"}
    errs = []
    if set(loader) != {"scheds"}:
        errs.append(f"top-level keys {sorted(loader)}, want only [scheds] "
                    "(scx_loader rejects an unknown default_sched)")
    sched = loader.get("scheds", {}).get("scx_zernel", {})
    if set(sched) != set(modes):
        errs.append(f"[scheds.scx_zernel] keys {sorted(sched)}, want {sorted(modes)}")
    with open(tmp / "loader.args", "w") as f:
        for key, mode in modes.items():
            args = sched.get(key, [])
            if not all(isinstance(a, str) for a in args):
                errs.append(f"{key}: not a list of strings")
            elif "--mode" not in args or args[args.index("--mode") + 1:][:1] != [mode]:
                errs.append(f"{key}: does not pass --mode {mode}")
            else:
                f.write("\t".join(args) + "\n")
    ok(path + ": scx_loader format") if not errs else bad(path + ": " + "; ".join(errs))
except Exception as e:
    bad(f"{path}: {e}")

# daemonset.yaml
path = "deploy/daemonset.yaml"
try:
    import yaml
except ImportError:
    bad("python3 yaml module not found (pip install pyyaml) to check " + path)
    sys.exit()
try:
    docs = {d["kind"]: d for d in yaml.safe_load_all(open(path))}
    errs = []
    ds, cm = docs["DaemonSet"], docs["ConfigMap"]
    pod = ds["spec"]["template"]["spec"]
    c = pod["containers"][0]
    if pod.get("hostPID") is not True: errs.append("hostPID is not true")
    if c.get("securityContext", {}).get("privileged") is not True: errs.append("not privileged")
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    vols = {v["name"]: v for v in pod["volumes"]}
    for mp, host in [("/sys", "/sys"), ("/sys/fs/bpf", "/sys/fs/bpf")]:
        m = mounts.get(mp)
        if not m or vols[m["name"]].get("hostPath", {}).get("path") != host:
            errs.append(f"no hostPath {host} at {mp}")
    if mounts.get("/sys/fs/bpf", {}).get("readOnly"): errs.append("/sys/fs/bpf is read-only")
    cfg = mounts.get("/etc/scx_zernel")
    if not cfg or vols[cfg["name"]].get("configMap", {}).get("name") != cm["metadata"]["name"]:
        errs.append("ConfigMap not mounted at /etc/scx_zernel")
    cmd = c["command"] + c.get("args", [])
    if cmd[0] != "/usr/bin/scx_zernel": errs.append(f"runs {cmd[0]}")
    if cmd[1:3] != ["--config", "/etc/scx_zernel/zernel.toml"]: errs.append("no --config /etc/scx_zernel/zernel.toml")
    if "--metrics-addr" not in cmd or cmd[cmd.index("--metrics-addr") + 1] != "0.0.0.0:9093":
        errs.append("no --metrics-addr 0.0.0.0:9093")
    if 9093 not in [p["containerPort"] for p in c.get("ports", [])]: errs.append("port 9093 not declared")
    if not c.get("resources", {}).get("requests"): errs.append("no resource requests")
    if not pod.get("nodeSelector") or not pod.get("tolerations"): errs.append("no nodeSelector/tolerations")
    tomllib.loads(cm["data"]["zernel.toml"])
    (tmp / "zernel.toml").write_text(cm["data"]["zernel.toml"])
    (tmp / "daemonset.args").write_text("\t".join(cmd[1:]) + "\n")
    ok(path + ": DaemonSet") if not errs else bad(path + ": " + "; ".join(errs))
except Exception as e:
    bad(f"{path}: {e!r}")
PY
    while IFS= read -r line; do
        case "$line" in
        "ok   "*) ok "${line#ok   }" ;;
        *) bad "${line#FAIL }" ;;
        esac
    done <"$tmp/py.out"
fi

# --- the argument lists against the real binary -----------------------------------------
bin=${SCX_ZERNEL_BIN:-target/release/scx_zernel}
if [ ! -x "$bin" ] || [ ! -f "$tmp/zernel.toml" ]; then
    echo "skip argument lists: no $bin (cargo build --release) or no ConfigMap config"
else
    # The flags of /etc/default/scx, against the shipped default config.
    if [ -f "$tmp/scx.argv" ]; then
        mapfile -t scx_args < <(tail -n +2 "$tmp/scx.argv")
        scx_args=("${scx_args[@]/#\/etc\/scx_zernel\/zernel.toml/configs/zernel.toml}")
        if out=$("$bin" "${scx_args[@]}" --dump-config 2>&1 >/dev/null); then ok "$scx_default: scx_zernel ${scx_args[*]} --dump-config"
        else bad "$scx_default: scx_zernel ${scx_args[*]} --dump-config: ${out//$'\n'/ }"; fi
    fi
    for list in loader daemonset; do
        [ -f "$tmp/$list.args" ] || continue
        while IFS=$'\t' read -r -a args; do
            args=("${args[@]/#\/etc\/scx_zernel\/zernel.toml/$tmp/zernel.toml}")
            if out=$("$bin" "${args[@]}" --dump-config 2>&1 >/dev/null); then
                ok "$list: scx_zernel ${args[*]} --dump-config"
            else
                out=${out//$'\n'/ }
                bad "$list: scx_zernel ${args[*]} --dump-config: ${out%% For more information*}"
            fi
        done <"$tmp/$list.args"
    done
fi

echo "packaging: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
