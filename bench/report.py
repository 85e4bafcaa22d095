#!/usr/bin/env python3
"""report.py - turn the benchmark's result lines into results.json, README.md
and plot.png.

    python3 bench/report.py --out DIR LOG...

Each LOG is read for the lines bench/guest.sh (and bench/run.sh) print:

    BENCH sched=NAME rep=N metric=NAME value=NUMBER
    BENCHMETA key=value key="value with spaces" ...
    BENCHNOTE sched=NAME text...
    BENCHWIN sched=NAME rep=N case=NAME start=EPOCH end=EPOCH
    ok - DESC / not ok - DESC (detail) / N passed, N failed

and host-load.txt beside the results (--host-load), bench/run.sh's samples of
the host's CPU use while the VM ran: the CPU other host processes took during
each measurement window (BENCHWIN) becomes a metric of its own. And
host-observe.txt beside them (--host-observe), `cargo bench --bench observe --
--cpu-only` on the host: the daemon's loop with 2,000 threads, which the
daemon-CPU targets are judged on when it is there.

Every metric is summarised per scheduler as its median and its spread
(min-max) over the repetitions. Ratios to EEVDF are paired by repetition
(rep k of a scheduler over rep k of EEVDF, both from the same boot), so a slow
phase of the host weighs on both sides of a ratio. Ratios of a workload with
hogs over itself alone pair a scheduler's own reps the same way. The targets
are judged for scx_zernel (zernel) and scx_zernel given GPU data (zernel_gpu);
a metric the run did not produce (a case, scheduler or tool left out) makes its
target "not measured", and any subset of schedulers, cases and reps renders.
The plot needs matplotlib; without it everything else is still written.
"""

import argparse
import json
import math
import re
import shlex
import statistics
import sys
from collections import defaultdict
from pathlib import Path

SCHED_LABEL = {"eevdf": "EEVDF", "rt": "EEVDF, ML job at SCHED_FIFO", "zernel": "scx_zernel", "zernel_gpu": "scx_zernel + GPU data",
               "zernel_flat": "scx_zernel, flat policy", "zernel_base": "scx_zernel @base",
               "bpfland": "scx_bpfland", "lavd": "scx_lavd", "cosmos": "scx_cosmos"}
ORDER = ["eevdf", "rt", "zernel", "zernel_gpu", "zernel_flat", "zernel_base", "bpfland", "lavd", "cosmos"]
# The schedulers scx_zernel is measured against ("ahead of every peer"); the
# other zernel_* are builds or configurations of scx_zernel itself.
PEERS = ["eevdf", "bpfland", "lavd", "cosmos"]
# The configurations of scx_zernel the targets judge.
CANDIDATES = ["zernel", "zernel_gpu"]
# BPF cost per scheduling event of scx_zernel over its build at the baseline
# commit (bench/run.sh --baseline): the bound on the ratio of their medians.
EVENT_RATIO_BOUND = 1.05


def label(s):
    return SCHED_LABEL.get(s, f"scx_{s}")


# ---- reading ----------------------------------------------------------------------------
def parse(paths):
    runs, meta, notes, checks, windows = [], {}, [], {"passed": [], "failed": []}, []
    bench = re.compile(r"^BENCH sched=(\S+) rep=(\d+) metric=(\S+) value=(\S+)\s*$")
    win = re.compile(r"^BENCHWIN sched=(\S+) rep=(\d+) case=(\S+) start=(\d+) end=(\d+)\s*$")
    for path in paths:
        for line in Path(path).read_text(errors="replace").splitlines():
            line = line.rstrip("\r")
            if m := bench.match(line):
                try:
                    value = float(m[4])
                except ValueError:
                    continue
                if not math.isfinite(value):
                    continue
                runs.append({"sched": m[1], "rep": int(m[2]), "metric": m[3], "value": value})
            elif line.startswith("BENCHMETA "):
                try:
                    words = shlex.split(line[len("BENCHMETA "):])
                except ValueError:
                    words = line.split()[1:]
                first = None
                for w in words:
                    k, _, v = w.partition("=")
                    meta[k] = v
                    # "torch=unavailable reason=...": the reason is the first key's.
                    if k == "reason" and first:
                        meta[f"{first}.reason"] = v
                    first = first or k
            elif m := win.match(line):
                windows.append({"sched": m[1], "rep": int(m[2]), "case": m[3], "start": int(m[4]),
                                "end": int(m[5])})
            elif line.startswith("BENCHNOTE "):
                notes.append(line[len("BENCHNOTE "):])
            elif line.startswith("not ok - "):
                checks["failed"].append(line[len("not ok - "):])
            elif line.startswith("ok - "):
                checks["passed"].append(line[len("ok - "):])
    return runs, meta, notes, checks, windows


def host_load(path):
    """bench/run.sh's samples: (ticks per second, CPUs, [(epoch, busy, steal, qemu)])."""
    hz, ncpu, samples = 100, None, []
    for line in Path(path).read_text(errors="replace").splitlines():
        if line.startswith("#"):
            if m := re.search(r"CLK_TCK (\d+), (\d+) CPUs", line):
                hz, ncpu = int(m[1]), int(m[2])
            continue
        f = line.split()
        if len(f) == 4 and all(x.isdigit() for x in f):
            samples.append(tuple(int(x) for x in f))
    # Up to qemu's exit: a sample after it has lost qemu's ticks.
    if samples:
        top = max(range(len(samples)), key=lambda i: (samples[i][3], i))
        samples = samples[:top + 1]
    return hz, ncpu, samples


# host-observe.txt's lines: "(a) ML process, 2000 threads   0.54 % of one core".
HOST_OBSERVE = {"(a)": "ml", "(a')": "ml_no_quiet", "(b)": "plain"}


def host_observe(path):
    """`cargo bench --bench observe -- --cpu-only`'s figures: {threads, ml, ml_no_quiet, plain, baseline}
    (% of one core), or None if it holds none."""
    got = {}
    for line in Path(path).read_text(errors="replace").splitlines():
        if m := re.match(r"^(\(\w+'?\)) .*?(\d+) threads\s+([\d.]+) % of one core$", line.strip()):
            if m[1] in HOST_OBSERVE:
                got[HOST_OBSERVE[m[1]]] = float(m[3])
                got["threads"] = int(m[2])
        elif m := re.match(r"^host baseline \(no workload\)\s+([\d.]+) % of one core$", line.strip()):
            got["baseline"] = float(m[1])
    return got if "ml" in got else None


def load_over(hz, samples, start, end):
    """Host CPUs used over [start, end] (the samples around it): {qemu, other, steal}, or None."""
    # A window that ends (starts) within one sampling period past the last
    # (before the first) sample: the samples cover most of it.
    before = [x for x in samples if x[0] <= start] or [x for x in samples[:1] if x[0] - start <= 5]
    after = [x for x in samples if x[0] >= end] or [x for x in samples[-1:] if end - x[0] <= 5]
    if not before or not after:
        return None
    (t0, b0, s0, q0), (t1, b1, s1, q1) = before[-1], after[0]
    if t1 <= t0 or q1 < q0:   # no time between, or qemu gone (its ticks with it)
        return None
    secs = (t1 - t0) * hz
    return {"qemu": (q1 - q0) / secs, "other": max(0, (b1 - b0) - (q1 - q0)) / secs, "steal": (s1 - s0) / secs}


class Data:
    """Values by (sched, metric) -> {rep: value}, derived metrics included."""

    def __init__(self, runs, vcpus=None):
        self.vcpus = vcpus
        self.v = defaultdict(dict)
        for r in runs:
            self.v[(r["sched"], r["metric"])][r["rep"]] = r["value"]
        self.scheds = [s for s in ORDER if any(k[0] == s for k in self.v)]
        self.scheds += sorted({k[0] for k in self.v} - set(self.scheds))
        self.derived = set()   # (sched, metric) keys that derive() made
        self.derive()

    def get(self, sched, metric):
        return self.v.get((sched, metric), {})

    def put(self, sched, metric, rep, value):
        self.v[(sched, metric)][rep] = value
        self.derived.add((sched, metric))

    def ratio(self, out, s, num, den_sched, den):
        """out[rep] = num(s, rep) / den(den_sched, rep), paired by rep."""
        a, b = self.get(s, num), self.get(den_sched, den)
        for rep, x in a.items():
            if rep in b and b[rep] > 0:
                self.put(s, out, rep, x / b[rep])

    def derive(self):
        for s in self.scheds:
            r = self.ratio
            # The sized ML pipeline.
            r("ml_con_over_iso", s, "ml_con_steps_per_sec", s, "ml_iso_steps_per_sec")
            r("ml_iso_over_eevdf_iso", s, "ml_iso_steps_per_sec", "eevdf", "ml_iso_steps_per_sec")
            r("ml_con_over_eevdf_iso", s, "ml_con_steps_per_sec", "eevdf", "ml_iso_steps_per_sec")
            r("ml_con_over_eevdf_con", s, "ml_con_steps_per_sec", "eevdf", "ml_con_steps_per_sec")
            r("ml_cpu_con_over_iso", s, "ml_con_cpu", s, "ml_iso_cpu")
            r("hogs_cpu_over_eevdf", s, "hogs_cpu", "eevdf", "hogs_cpu")
            r("hogs_bogo_over_eevdf", s, "hogs_bogo_ops_per_s", "eevdf", "hogs_bogo_ops_per_s")
            # Real PyTorch: training, inference.
            r("torch_train_con_over_iso", s, "torch_train_con_steps_per_sec", s, "torch_train_iso_steps_per_sec")
            r("torch_train_iso_over_eevdf_iso", s, "torch_train_iso_steps_per_sec",
              "eevdf", "torch_train_iso_steps_per_sec")
            r("torch_train_con_over_eevdf_con", s, "torch_train_con_steps_per_sec",
              "eevdf", "torch_train_con_steps_per_sec")
            r("torch_train_cpu_con_over_iso", s, "torch_train_con_cpu", s, "torch_train_iso_cpu")
            r("torch_train_hogs_cpu_over_eevdf", s, "torch_train_hogs_cpu", "eevdf", "torch_train_hogs_cpu")
            # What neither the training nor the hogs got: the guest's kernel,
            # the harness, a scheduler's own process (both figures come from
            # the same /proc passes, over the same window).
            if self.vcpus:
                job, hogs = self.get(s, "torch_train_con_cpu"), self.get(s, "torch_train_hogs_cpu")
                idle = self.get(s, "torch_train_idle_cpu")
                for rep in job.keys() & hogs.keys():
                    other = self.vcpus - job[rep] - hogs[rep]
                    self.put(s, "torch_train_other_cpu", rep, other)
                    # Split by /proc/stat's idle time over the same window.
                    if rep in idle:
                        self.put(s, "torch_train_other_busy_cpu", rep, other - idle[rep])
                # The harness's part of it (vCPUs), and what is left without
                # it: what the hogs' share of the idle CPU counts against them.
                ha, win = self.get(s, "torch_train_rest_harness_s"), self.get(s, "torch_train_con_secs")
                busy = self.get(s, "torch_train_other_busy_cpu")
                for rep in ha.keys() & win.keys():
                    if win[rep] > 0:
                        self.put(s, "torch_train_harness_cpu", rep, ha[rep] / win[rep])
                        if rep in busy:
                            self.put(s, "torch_train_other_busy_net_cpu", rep, busy[rep] - ha[rep] / win[rep])
            r("torch_infer_p99_con_over_iso", s, "torch_infer_con_p99_ms", s, "torch_infer_iso_p99_ms")
            r("torch_infer_p50_con_over_iso", s, "torch_infer_con_p50_ms", s, "torch_infer_iso_p50_ms")
            r("torch_infer_rps_con_over_iso", s, "torch_infer_con_rps", s, "torch_infer_iso_rps")
            r("torch_infer_p99_con_over_eevdf_con", s, "torch_infer_con_p99_ms", "eevdf", "torch_infer_con_p99_ms")
            r("torch_infer_rps_con_over_eevdf_con", s, "torch_infer_con_rps", "eevdf", "torch_infer_con_rps")
            r("torch_infer_hogs_cpu_over_eevdf", s, "torch_infer_hogs_cpu", "eevdf", "torch_infer_hogs_cpu")
            # General latency.
            r("cyclictest_avg_over_eevdf", s, "cyclictest_avg_us", "eevdf", "cyclictest_avg_us")
            r("cyclictest_p99_over_eevdf", s, "cyclictest_p99_us", "eevdf", "cyclictest_p99_us")
            r("cyclictest_max_over_eevdf", s, "cyclictest_max_us", "eevdf", "cyclictest_max_us")
            r("messaging_over_eevdf", s, "messaging_secs", "eevdf", "messaging_secs")
            r("schbench_p99_over_eevdf", s, "schbench_p99_us", "eevdf", "schbench_p99_us")
            r("schbench_rps_over_eevdf", s, "schbench_rps", "eevdf", "schbench_rps")
            # Cost.
            r("bpf_ns_over_bpfland", s, "bpf_ns_avg", "bpfland", "bpf_ns_avg")
            r("bpf_ns_per_event_over_bpfland", s, "bpf_ns_per_event", "bpfland", "bpf_ns_per_event")
            # The vCPUs the scheduler's BPF programs took over the run.
            ns, ev = self.get(s, "bpf_ns_per_event"), self.get(s, "bpf_events_per_s")
            for rep in ns.keys() & ev.keys():
                self.put(s, "bpf_cpu", rep, ns[rep] * ev[rep] / 1e9)
            insns = defaultdict(float)
            for (ss, m), vals in list(self.v.items()):
                if ss == s and m.startswith("bpf_verified_insns."):
                    for rep, x in vals.items():
                        insns[rep] += x
            for rep, x in insns.items():
                self.put(s, "bpf_verified_insns_total", rep, x)
        self.ratio("bpf_ns_per_event_over_base", "zernel", "bpf_ns_per_event", "zernel_base", "bpf_ns_per_event")
        # The sized pipeline's ratio over the RT control's, same rep.
        for s in self.scheds:
            self.ratio("ml_con_over_iso_over_rt", s, "ml_con_over_iso", "rt", "ml_con_over_iso")
        # The phase policy's gain: scx_zernel (and with GPU data) over its flat
        # policy, same rep, for the contended ML figures.
        for s in ("zernel", "zernel_gpu"):
            for out, m, _, _ in FLAT_GAIN:
                self.ratio(out, s, m, "zernel_flat", m)

    def native_share(self, factor):
        """The hogs' share of the CPU an ML job left, with the scheduler
        process's CPU in the window at its native estimate (÷ the daemon's
        own emulation factor): what that process would not use natively
        goes to the hogs, which are always runnable. Also that process's CPU
        as a share of what the job left."""
        for s in self.scheds:
            for share, hogs, sched, scale in (
                    ("hogs_share_of_idle_net", "hogs_cpu", "sched_cpu_pct_ml_load", 0.01),
                    ("torch_train_hogs_share_of_idle_net", "torch_train_hogs_cpu", "torch_train_sched_cpu", 1.0)):
                sh, h, sc = self.get(s, share), self.get(s, hogs), self.get(s, sched)
                for rep in sh.keys() & h.keys() & sc.keys():
                    if sh[rep] <= 0:
                        continue
                    left = h[rep] / sh[rep]   # the CPU the job left (vCPUs)
                    self.put(s, f"{share}.sched", rep, sc[rep] * scale / left)
                    if factor:
                        self.put(s, f"{share}.native", rep,
                                 (h[rep] + sc[rep] * scale * (1 - 1 / factor)) / left)

    def summary(self, sched, metric):
        vals = list(self.get(sched, metric).values())
        if not vals:
            return None
        return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}

    def median(self, sched, metric):
        summ = self.summary(sched, metric)
        return summ["median"] if summ else None


# The phase policy's gain (scx_zernel ÷ its flat policy, same rep):
# (derived metric, measured metric).
# (derived metric, measured metric, row label, how to read it)
FLAT_GAIN = [
    ("ml_con_over_flat", "ml_con_steps_per_sec", "sized ML pipeline: steps/s with hogs",
     "above 1: the phase policy earns throughput"),
    ("ml_iso_over_flat", "ml_iso_steps_per_sec", "sized ML pipeline: steps/s alone",
     "about 1 expected: idle vCPUs leave nothing to win"),
    ("hogs_cpu_over_flat", "hogs_cpu", "hogs' CPU beside the sized ML pipeline",
     "below 1: the hogs pay for the gain"),
    ("torch_train_con_over_flat", "torch_train_con_steps_per_sec", "PyTorch training: steps/s with hogs",
     "above 1: the phase policy earns throughput"),
    ("torch_train_hogs_cpu_over_flat", "torch_train_hogs_cpu", "hogs' CPU beside PyTorch training",
     "below 1: the hogs pay for the gain"),
    ("torch_infer_p99_con_over_flat", "torch_infer_con_p99_ms", "PyTorch inference: p99 latency with hogs",
     "below 1: the phase policy earns latency"),
    ("torch_infer_rps_con_over_flat", "torch_infer_con_rps", "PyTorch inference: requests/s with hogs",
     "above 1: the phase policy earns throughput"),
]


# ---- formatting ---------------------------------------------------------------------------
def fmt(x, digits=3):
    if x is None:
        return "–"
    if x == 0:
        return "0"
    mag = abs(x)
    if mag >= 1000:
        return f"{x:,.0f}"
    if mag >= 100:
        return f"{x:.0f}"
    if mag >= 10:
        return f"{x:.1f}"
    if mag >= 1:
        return f"{x:.2f}"
    return f"{x:.{digits}f}"


def cell(summ):
    if summ is None:
        return "–"
    if summ["n"] == 1 or summ["min"] == summ["max"]:
        return fmt(summ["median"])
    return f"{fmt(summ['median'])} ({fmt(summ['min'])}–{fmt(summ['max'])})"


def table(d, rows, scheds):
    """rows: (metric, label), or (None, label) for a group heading (shown if a
    row of its group is). Columns: the schedulers. Rows with no value at all
    are left out; a table left with no row is one sentence instead."""
    out = ["| metric | " + " | ".join(label(s) for s in scheds) + " |",
           "|---|" + "---|" * len(scheds)]
    heading = None
    for metric, text in rows:
        if metric is None:
            heading = f"| **{text}** |" + " |" * len(scheds)
            continue
        cells = [cell(d.summary(s, metric)) for s in scheds]
        if all(c == "–" for c in cells):
            continue
        if heading:
            out.append(heading)
            heading = None
        out.append(f"| {text} | " + " | ".join(cells) + " |")
    return "\n".join(out) if len(out) > 2 else "No values in this run."


# ---- targets ------------------------------------------------------------------------------
# (label, metric, kind, bound, unit, case, ahead): kind "ge" = measured >= bound
# passes; case: the bench case that measures it; ahead: also judged against
# every peer (its median better than each peer's median of the same metric).
TARGETS = [
    ("sized ML pipeline: steps/s with 2x oversubscription ÷ isolated", "ml_con_over_iso", "ge", 0.95, "",
     "ml", True),
    ("hogs' CPU ÷ CPU the sized ML pipeline leaves idle (the benchmark's own commands left out)",
     "hogs_share_of_idle_net", "ge", 0.90, "", "ml", False),
    ("real PyTorch training: steps/s with hogs ÷ isolated", "torch_train_con_over_iso", "ge", 0.95, "",
     "torch", True),
    ("hogs' CPU ÷ CPU the PyTorch training leaves idle (the benchmark's own commands left out)",
     "torch_train_hogs_share_of_idle_net", "ge", 0.90, "", "torch", False),
    ("real PyTorch inference: p99 latency with hogs ÷ isolated", "torch_infer_p99_con_over_iso", "le", 1.5,
     "×", "torch", True),
    ("cyclictest p99 ÷ EEVDF's (same rep)", "cyclictest_p99_over_eevdf", "le", 1.0, "×", "latency", False),
    ("messaging time ÷ EEVDF's (same rep)", "messaging_over_eevdf", "le", 1.0, "×", "latency", False),
    ("BPF ns per scheduling event ÷ scx_bpfland's (same rep)", "bpf_ns_per_event_over_bpfland", "le", 1.0, "×",
     "ml", False),
    ("scheduler process CPU, {threads} ML threads", "sched_cpu_pct_ml_threads", "le", 1.0, " %", "cost", False),
    ("scheduler process CPU, {threads} non-ML threads", "sched_cpu_pct_plain_threads", "le", 1.0, " %", "cost",
     False),
]
# Metrics whose absolute value is CPU time, to be scaled by the calibration factor.
CPU_TIME_METRICS = {"bpf_ns_avg", "sched_cpu_pct_ml_threads", "sched_cpu_pct_plain_threads"}


def judge(kind, bound, x):
    """(met, how far from the bound) of measured value x."""
    if x is None:
        return None, ""
    ok = x >= bound if kind == "ge" else x <= bound
    if ok:
        return True, ""
    gap = abs(x - bound)
    # A miss the table's three digits would round away: its own digits, and
    # the measured value with enough of them to differ from the bound.
    close = fmt(x) == fmt(bound)
    by = f"{gap:.2g}" if close else fmt(gap)
    rel = gap / bound * 100
    rel_text = f"{rel:.2g} %" if rel < 1 else f"{rel:.0f} %"
    exact = f"; {x:.{max(3, -math.floor(math.log10(gap)))}f} measured" if close and gap > 0 else ""
    if kind == "ge":
        return False, f"short by {by} ({rel_text} under{exact})"
    if x >= 2 * bound:
        times = x / bound
        return False, f"{times:.0f}× the bound" if times >= 10 else f"{times:.1f}× the bound"
    return False, f"over by {by} ({rel_text} over{exact})"


def verdict(ok, miss, short):
    if ok is None:
        return "not measured"
    if short:
        return ("yes" if ok else "no") + " (--short: not meaningful)"
    return "**yes**" if ok else f"**no**: {miss}"


def pct(x):
    """A ratio as a signed percentage change, e.g. 1.052 -> "+5.2 %"."""
    return f"{(x - 1) * 100:+.1f} %"


def event_ratio(d):
    """scx_zernel's median BPF ns per scheduling event over its baseline build's, or None."""
    a, b = d.summary("zernel", "bpf_ns_per_event"), d.summary("zernel_base", "bpf_ns_per_event")
    if not a or not b or b["median"] <= 0:
        return None
    return a["median"] / b["median"]


def why_missing(d, meta, metric, case):
    """Why a target's metric has no value: a short reason."""
    cases = meta.get("cases")
    if cases and case not in cases.split(","):
        return f"case {case} not run"
    if case == "torch" and meta.get("torch") == "unavailable":
        return "PyTorch unavailable" + (f": {meta['torch.reason']}" if meta.get("torch.reason") else "")
    for other in ("eevdf", "bpfland"):
        if metric.endswith(f"_over_{other}") and other not in d.scheds:
            status = meta.get(f"peer.{other}", "")
            return f"{label(other)} not measured" + (f" ({status})" if status.startswith("not ") else "")
    return "no value in this run"


def ahead(d, cand, metric, kind):
    """Is cand's median of metric better than every peer's? (met, text, others),
    met None if no peer has a value."""
    x = d.median(cand, metric)
    have = [(p, d.median(p, metric)) for p in PEERS if d.median(p, metric) is not None]
    absent = [label(p) for p in PEERS if d.median(p, metric) is None]
    others = ", ".join(f"{label(p)} {fmt(v)}" for p, v in have)
    if absent and have:
        others += "; not measured: " + ", ".join(absent)
    if x is None or not have:
        return None, "", others or "–"
    names = [label(p) for p, _ in have]
    only = (f"; against {', '.join(names[:-1]) + ' and ' if len(names) > 1 else ''}{names[-1]} only"
            if absent else "")
    better = (lambda a, b: a > b) if kind == "ge" else (lambda a, b: a < b)
    behind = [(p, v) for p, v in have if not better(x, v)]
    if behind:
        text = "; ".join(f"{label(p)} ahead: {fmt(v)}, {rel(v, x)} {label(cand)}'s"
                         for p, v in sorted(behind, key=lambda pv: -pv[1] if kind == "ge" else pv[1]))
        return False, text + only, others
    near_p, near_v = max(have, key=lambda pv: pv[1]) if kind == "ge" else min(have, key=lambda pv: pv[1])
    return True, f"{rel(x, near_v)} the nearest peer's, {label(near_p)} ({fmt(near_v)}){only}", others


def rel(a, b):
    """a against b in words: "2.2 % above", "1.0 % below", "equal to"."""
    if not b or a == b:
        return "equal to" if a == b else "against"
    return f"{abs(a / b - 1) * 100:.1f} % {'above' if a > b else 'below'}"


# The daemon-CPU targets: the metric measured in the guest and the host's figure that judges it.
HOST_CPU_TARGET = {"sched_cpu_pct_ml_threads": "ml", "sched_cpu_pct_plain_threads": "plain"}


# The hogs' shares the targets judge (the benchmark's own commands left out of
# the CPU the job leaves idle), and the same counting those commands.
GROSS_SHARE = {"hogs_share_of_idle_net": "hogs_share_of_idle",
               "torch_train_hogs_share_of_idle_net": "torch_train_hogs_share_of_idle"}

# The training target's bound: the share of its isolated steps/s it keeps with hogs.
TRAIN_KEEP = next(t[3] for t in TARGETS if t[1] == "torch_train_con_over_iso")


def both_training_targets(d, meta, cand, share_bound):
    """What the two training targets ask of the rest of the guest together:
    at TRAIN_KEEP of its isolated steps/s (its CPU use taken to scale with
    its steps) the training leaves `left` vCPUs; less the harness's CPU
    under cand, the hogs must get share_bound of that, so everything else
    (kernel threads, the scheduler's process, other processes) may use at
    most `allowed`. Returns (the training's CPU alone, left, allowed, the
    rest's CPU under cand, the least and most under a peer), or None."""
    metric = "torch_train_other_busy_net_cpu"
    iso, own = d.median(cand, "torch_train_iso_cpu"), d.median(cand, metric)
    harness = d.median(cand, "torch_train_harness_cpu")
    peers = [d.median(p, metric) for p in PEERS if d.summary(p, metric)]
    ncpu = meta.get("vcpus", "")
    if iso is None or own is None or harness is None or not peers or not ncpu.isdigit():
        return None
    left = max(0.0, int(ncpu) - TRAIN_KEEP * iso)
    return iso, left, (1 - share_bound) * max(0.0, left - harness), own, min(peers), max(peers)


def targets(d, meta, cand, factors, short, threads, hobs):
    """The targets table of scheduler cand: (markdown, records)."""
    rows, records = [], []
    x = event_ratio(d) if cand == "zernel" else None
    if x is not None:
        base = SCHED_LABEL["zernel_base"]
        text = f"BPF ns per scheduling event ÷ {base}'s (ratio of medians, same boot)"
        ok, _ = judge("le", EVENT_RATIO_BOUND, x)
        miss = f"{pct(x)}, bound {pct(EVENT_RATIO_BOUND)}"
        paired = d.summary("zernel", "bpf_ns_per_event_over_base")
        rows.append(f"| {text} | ≤ {EVENT_RATIO_BOUND:.2f}× | {x:.3f}× ({pct(x)}) | {verdict(ok, miss, short)} | "
                    f"paired by rep: {cell(paired)}× |")
        records.append({"target": text, "metric": "bpf_ns_per_event_over_base", "bound": EVENT_RATIO_BOUND,
                        "kind": "le", "measured": x, "met": ok, "miss": miss})
    for text, metric, kind, bound, unit, case, vs_peers in TARGETS:
        # GPU data changes nothing but for the sized pipeline, whose fake GPU
        # it reports: scx_zernel + GPU data runs the ml case only.
        if cand == "zernel_gpu" and case != "ml":
            continue
        text = text.format(threads=threads)
        summ = d.summary(cand, metric)
        x = summ["median"] if summ else None
        ok, miss = judge(kind, bound, x)
        rec = {"target": text, "metric": metric, "bound": bound, "kind": kind,
               "measured": x, "met": ok, "miss": miss}
        if x is None:
            rec["not_measured"] = why_missing(d, meta, metric, case)
            verdict_text = f"not measured: {rec['not_measured']}"
        else:
            verdict_text = verdict(ok, miss, short)
        # An absolute CPU time measured under TCG, scaled by an emulation
        # factor (a rough native estimate): the daemon's own for its CPU
        # figures where both sides measured it, else the integer loop's.
        est_text = ""
        if metric in CPU_TIME_METRICS and x is not None:
            fac, how = factors.get("int64"), "÷ the integer loop's emulation factor"
            if metric.startswith("sched_cpu_pct") and factors.get("observe"):
                fac, how = factors["observe"], "÷ the daemon's own emulation factor"
            if fac:
                est = x / fac
                eok, emiss = judge(kind, bound, est)
                rec.update({"native_estimate": est, "native_estimate_met": eok})
                est_text = f"rough native estimate {fmt(est)}{unit} ({how} {fac:.1f}): {verdict(eok, emiss, short)}"
        host_x = hobs.get(HOST_CPU_TARGET.get(metric, ""), None) if hobs and cand == "zernel" else None
        if host_x is not None:
            # The target as stated: the daemon's loop on the host (cargo
            # bench), 2,000 threads. The guest's figure and its estimate beside it.
            text += " (on the host: `cargo bench --bench observe`)"
            ok, miss = judge(kind, bound, host_x)
            rec.update({"target": text, "measured": host_x, "met": ok, "miss": miss,
                        "measured_on": "host, cargo bench --bench observe -- --cpu-only", "guest_measured": x})
            guest = f"in the guest under TCG: {cell(summ)}{unit}" if summ else "not measured in the guest"
            if est_text:
                guest += f"; {est_text}"
            rows.append(f"| {text} | ≤ {fmt(bound)}{unit} | {fmt(host_x)}{unit} | {verdict(ok, miss, short)}; "
                        f"{guest} | – |")
            records.append(rec)
            continue
        if metric in CPU_TIME_METRICS and x is not None:
            verdict_text = "as measured under TCG: " + verdict_text + (f"; {est_text}" if est_text else "")
        nat, sch = d.summary(cand, f"{metric}.native"), d.summary(cand, f"{metric}.sched")
        if x is not None and nat and sch and factors.get("observe"):
            # Judged as measured; beside it, the share with the scheduler
            # process's CPU (TCG-inflated like its other CPU figures) at its
            # native estimate.
            eok, emiss = judge(kind, bound, nat["median"])
            rec.update({"native_estimate": nat["median"], "native_estimate_met": eok,
                        "sched_share_of_left": sch["median"]})
            verdict_text += (f"; the scheduler's own process took {fmt(sch['median'])} of the CPU the job left; "
                             f"with its CPU at the rough native estimate (÷ the daemon's own emulation factor "
                             f"{factors['observe']:.1f}, the rest to the hogs): {fmt(nat['median'])}, "
                             f"{verdict(eok, emiss, short)}")
        gross_metric = GROSS_SHARE.get(metric)
        gross = d.summary(cand, gross_metric) if gross_metric else None
        if x is not None and gross:
            rec["with_harness_cpu"] = gross["median"]
            verdict_text += (f"; counting the benchmark's own commands against it too: {cell(gross)} "
                             f"(EEVDF {fmt(d.median('eevdf', gross_metric))}, left out "
                             f"{fmt(d.median('eevdf', metric))})")
        both = (both_training_targets(d, meta, cand, bound)
                if metric == "torch_train_hogs_share_of_idle_net" and x is not None else None)
        if both:
            iso, left, allowed, own, lo, hi = both
            rec["rest_allowed_beside_training_target"] = allowed
            verdict_text += (f"; with the training target met too, the rest of the guest but the harness could "
                             f"use at most {fmt(allowed)} vCPUs here (the training used {fmt(iso)} alone; at "
                             f"{fmt(TRAIN_KEEP)} of its steps/s, its CPU in proportion, it leaves {fmt(left)}, "
                             f"the harness's part of it left out); it used {fmt(own)} under {label(cand)} and "
                             f"{fmt(lo)}–{fmt(hi)} under the peers")
        others = ", ".join(f"{label(s)} {fmt(d.median(s, metric))}"
                           for s in d.scheds if s != cand and d.summary(s, metric))
        rows.append(f"| {text} | {'≥' if kind == 'ge' else '≤'} {fmt(bound)}{unit} | "
                    f"{cell(summ)}{unit if summ else ''} | {verdict_text} | {others or '–'} |")
        records.append(rec)
        if vs_peers:
            aok, atext, others = ahead(d, cand, metric, kind)
            word = "higher" if kind == "ge" else "lower"
            arec = {"target": f"{text}: ahead of every peer", "metric": metric, "kind": f"ahead_{kind}",
                    "bound": "every peer's median", "measured": x, "met": aok, "miss": "" if aok else atext,
                    "peers": {p: d.median(p, metric) for p in PEERS}}
            if aok is None:
                arec["not_measured"] = (why_missing(d, meta, metric, case) if x is None
                                        else "no peer measured")
                atext = f"not measured: {arec['not_measured']}"
            elif short:
                atext = ("yes" if aok else "no") + f" ({atext}; --short: not meaningful)"
            else:
                atext = f"**yes**: {atext}" if aok else f"**no**: {atext}"
            rows.append(f"| … and ahead of every peer (same ratio, median) | {word} than every peer's median | "
                        f"{fmt(x) if x is not None else '–'}{unit if x is not None else ''} | {atext} | {others} |")
            records.append(arec)
    head = [f"| target ({label(cand)}) | bound | measured: median (min–max) | met? | others, median |",
            "|---|---|---|---|---|"]
    measured = [r for r in records if r["met"] is not None]
    tally = (f"{label(cand)}: {sum(1 for r in measured if r['met'])} of {len(measured)} measured targets met"
             + (f"; {len(records) - len(measured)} not measured" if len(records) > len(measured) else "") + ".")
    return "\n".join(head + rows) + "\n\n" + tally, records


# ---- the plot -------------------------------------------------------------------------------
def plot(d, path, meta):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.patches  # noqa: F401  (used as matplotlib.patches)
        import matplotlib.pyplot as plt
    except ImportError:
        print("report: matplotlib not available: no plot", file=sys.stderr)
        return False
    colors = {"eevdf": "#7f7f7f", "rt": "#17becf", "zernel": "#d62728", "zernel_gpu": "#8c1c13", "zernel_flat": "#f7b6d2",
              "zernel_base": "#ff9896", "bpfland": "#1f77b4", "lavd": "#2ca02c", "cosmos": "#ff7f0e"}
    short_label = {"eevdf": "EEVDF", "rt": "EEVDF\nML at FIFO", "zernel": "zernel", "zernel_gpu": "zernel\n+GPU data",
                   "zernel_flat": "zernel\nflat", "zernel_base": "zernel\n@base", "bpfland": "bpfland",
                   "lavd": "lavd", "cosmos": "cosmos"}
    hatches = ["", "///", "..."]
    n_thr = meta.get("threads", "?")
    vcpus = meta.get("vcpus", "?")
    hogs = 2 * int(vcpus) if vcpus.isdigit() else "?"
    # (title, [(metric, series label)], target (kind, bound) or None, log scale)
    panels = [
        (f"Sized ML pipeline: steps/s with {hogs} CPU hogs\n÷ alone, same scheduler (higher is better)",
         [("ml_con_over_iso", None)], ("ge", 0.95), False),
        ("PyTorch training: steps/s with hogs\n÷ alone, same scheduler (higher is better)",
         [("torch_train_con_over_iso", None)], ("ge", 0.95), False),
        ("PyTorch inference: p99 latency with hogs\n÷ alone, same scheduler (lower is better)",
         [("torch_infer_p99_con_over_iso", None)], ("le", 1.5), False),
        ("Steps/s with hogs ÷ EEVDF's with hogs\n(higher is better)",
         [("ml_con_over_eevdf_con", "sized ML pipeline"), ("torch_train_con_over_eevdf_con", "PyTorch training")],
         None, False),
        ("CPU the ML job got with hogs ÷ alone\n(higher = ML job kept its CPU)",
         [("ml_cpu_con_over_iso", "sized ML pipeline"), ("torch_train_cpu_con_over_iso", "PyTorch training")],
         None, False),
        ("Hogs' CPU ÷ CPU left idle by the ML job\n(higher is better)",
         [("hogs_share_of_idle_net", "sized ML pipeline"), ("torch_train_hogs_share_of_idle_net", "PyTorch training")],
         ("ge", 0.90), False),
        (f"cyclictest under {vcpus} hogs ÷ EEVDF\n(lower is better)",
         [("cyclictest_p99_over_eevdf", "p99"), ("cyclictest_max_over_eevdf", "max"),
          ("cyclictest_avg_over_eevdf", "average")], ("le", 1.0), False),
        ("Messaging time, schbench p99 ÷ EEVDF's\n(lower is better)",
         [("messaging_over_eevdf", f"{meta.get('messaging_tool', 'messaging')} messaging"),
          ("schbench_p99_over_eevdf", "schbench p99")], ("le", 1.0), False),
        ("BPF ns, ML + hogs run\n(lower is better; TCG-inflated, log scale)",
         [("bpf_ns_avg", "per struct_ops call"), ("bpf_ns_per_event", "per scheduling event")],
         None, True),
        ("Scheduler process CPU, % of one vCPU\n(lower is better; TCG-inflated)",
         [("sched_cpu_pct_ml_threads", f"{n_thr} ML threads"),
          ("sched_cpu_pct_plain_threads", f"{n_thr} threads"),
          ("sched_cpu_pct_ml_load", "ML + hogs run")], ("le", 1.0), False),
        ("BPF instructions processed by the verifier\n(all programs; lower = simpler)",
         [("bpf_verified_insns_total", None)], None, False),
    ]
    panels = [pn for pn in panels if any(d.summary(s, m) for s in d.scheds for m, _ in pn[1])]
    if not panels:
        return False
    ncols = min(4, len(panels))
    nrows = (len(panels) + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols, 4.4 * nrows), layout="constrained",
                             squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, (title, series, target, logy) in zip(axes.flat, panels):
        scheds = [s for s in d.scheds if any(d.summary(s, m) for m, _ in series)]
        series = [(m, lbl) for m, lbl in series if any(d.summary(s, m) for s in scheds)]
        width = 0.8 / max(1, len(series))
        handles, low = [], []
        for i, (metric, lbl) in enumerate(series):
            xs, ys, lo, hi, cs = [], [], [], [], []
            for j, s in enumerate(scheds):
                summ = d.summary(s, metric)
                if not summ:
                    continue
                xs.append(j + (i - (len(series) - 1) / 2) * width)
                ys.append(summ["median"])
                lo.append(summ["median"] - summ["min"])
                hi.append(summ["max"] - summ["median"])
                cs.append(colors.get(s, "#9467bd"))
                if summ["min"] > 0:
                    low.append(summ["min"])
            bars = ax.bar(xs, ys, width * 0.9, yerr=[lo, hi], capsize=3, color=cs,
                          hatch=hatches[i % len(hatches)], edgecolor="black", linewidth=0.5)
            # The median's value, above the whisker.
            n_bars = len(series) * len(scheds)
            for b, y, h in zip(bars, ys, hi):
                ax.annotate(fmt(y), (b.get_x() + b.get_width() / 2, y + h), ha="center", va="bottom",
                            fontsize=7 if n_bars <= 10 else 6 if n_bars <= 16 else 5,
                            xytext=(0, 2), textcoords="offset points")
            if lbl:
                handles.append(matplotlib.patches.Patch(facecolor="white", edgecolor="black",
                                                        hatch=hatches[i % len(hatches)], label=lbl))
        if target:
            handles.append(ax.axhline(target[1], color="black", linestyle="--", linewidth=1,
                                      label=f"target {'≥' if target[0] == 'ge' else '≤'} {fmt(target[1])}"))
        if "÷" in title:
            ax.axhline(1.0, color="grey", linewidth=0.8)
        # Room above the bars for the legend, in a row of its own.
        top = max([ax.get_ylim()[1]] + [target[1] if target else 0])
        if logy:
            ax.set_yscale("log")
            ax.set_ylim(bottom=min(low) / 4 if low else None, top=top * 8)
        else:
            ax.set_ylim(0, top * 1.3)
            ax.ticklabel_format(axis="y", style="plain", useOffset=False)
        if handles:
            ax.legend(handles=handles, fontsize=7, loc="upper center", ncol=min(3, len(handles)),
                      handlelength=1.6, columnspacing=1.0, frameon=False)
        ax.set_xticks(range(len(scheds)))
        ax.set_xticklabels([short_label.get(s, s) for s in scheds], fontsize=7.5)
        ax.set_title(title, fontsize=9.5)
        ax.tick_params(axis="y", labelsize=8)
    reps = meta.get("reps", "?")
    fig.suptitle(
        f"scx_zernel vs EEVDF and peers, one VM boot ({meta.get('vcpus', '?')} vCPUs, "
        f"{meta.get('accel', 'tcg').upper()}, kernel {meta.get('kernel', '?')}), {reps} rep(s): "
        "bars = median, whiskers = min–max.\nUnder TCG emulation absolute times mean nothing; "
        "ratios in the same boot do.", fontsize=10.5)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


# ---- the report -------------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory for results.json, README.md, plot.png")
    ap.add_argument("--host-load", help="bench/run.sh's host samples (default: OUT/host-load.txt if there)")
    ap.add_argument("--host-observe",
                    help="cargo bench --bench observe -- --cpu-only's output (default: OUT/host-observe.txt if there)")
    ap.add_argument("logs", nargs="+")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs, meta, notes, checks, windows = parse(args.logs)
    # The host's CPU use: over each measurement window, and over the whole VM run.
    hl_path = Path(args.host_load) if args.host_load else out / "host-load.txt"
    host = None
    if hl_path.is_file():
        hz, host_cpus, samples = host_load(hl_path)
        for w in windows:
            if ld := load_over(hz, samples, w["start"], w["end"]):
                for k, v in ld.items():
                    runs.append({"sched": w["sched"], "rep": w["rep"], "metric": f"host_{k}_cpus.{w['case']}",
                                 "value": v})
        if len(samples) >= 2:
            host = load_over(hz, samples, samples[0][0], samples[-1][0])
            if host:
                host["cpus"] = host_cpus
    if meta.get("base_commit"):
        SCHED_LABEL["zernel_base"] = f"scx_zernel @{meta['base_commit']}"
    if not runs:
        print("report: no BENCH lines in " + ", ".join(args.logs), file=sys.stderr)
    d = Data(runs, int(meta["vcpus"]) if meta.get("vcpus", "").isdigit() else None)
    short = meta.get("short") == "1"

    try:
        factor = float(meta["calib_host_ops_per_cpu_s"]) / float(meta["calib_guest_ops_per_cpu_s"])
    except (KeyError, ValueError, ZeroDivisionError):
        factor = None
    # The daemon's own factor: the same observer work (bench/observe-cpu.sh)
    # in the guest over on the host, with the same thread count.
    try:
        obs_factor = (float(meta["calib_guest_observe_cpu_pct"]) / float(meta["calib_host_observe_cpu_pct"])
                      if meta.get("calib_guest_observe_threads") == meta.get("calib_host_observe_threads")
                      else None)
    except (KeyError, ValueError, ZeroDivisionError):
        obs_factor = None
    factors = {"int64": factor, "observe": obs_factor}
    d.native_share(obs_factor)
    ho_path = Path(args.host_observe) if args.host_observe else out / "host-observe.txt"
    hobs = host_observe(ho_path) if ho_path.is_file() else None
    threads = meta.get("threads", "?")
    if threads.isdigit():
        threads = f"{int(threads):,}"
    target_mds, target_recs = {}, {}
    for c in CANDIDATES:
        if c in d.scheds:
            target_mds[c], target_recs[c] = targets(d, meta, c, factors, short, threads, hobs)
    scheds = d.scheds
    peers = {k.split(".", 1)[1]: v for k, v in meta.items() if k.startswith("peer.")}
    for p, status in peers.items():
        if status.startswith("not built") or status.startswith("not run"):
            notes.append(f"sched={p}: {status}")

    # Verifier complexity: instructions processed per program (max over reps).
    ver = {}
    for (s, m), vals in d.v.items():
        if m.startswith("bpf_verified_insns.") and vals:
            ver.setdefault(s, {})[m.split(".", 1)[1]] = max(vals.values())
    ver_scheds = [s for s in scheds if s in ver]
    ver_varies = sorted({f"{label(s)} `{m.split('.', 1)[1]}`" for (s, m), vals in d.v.items()
                         if m.startswith("bpf_verified_insns.") and len(set(vals.values())) > 1})

    summary = {f"{s}.{m}": d.summary(s, m) for (s, m) in sorted(d.v) if d.summary(s, m)}
    derived = {f"{s}.{m}": {str(r): x for r, x in sorted(d.get(s, m).items())}
               for (s, m) in sorted(d.derived) if d.get(s, m)}
    per_event = None
    if d.summary("zernel_base", "bpf_ns_per_event") and d.summary("zernel", "bpf_ns_per_event"):
        per_event = {
            "definition": "sum of delta run_time_ns over every BPF program the scheduler process holds / "
                          "delta run_cnt of its enqueue program, over the ML + hogs run",
            "baseline_commit": meta.get("base_commit"), "bound": EVENT_RATIO_BOUND,
            "ratio_of_medians": event_ratio(d),
            "paired_ratio": d.summary("zernel", "bpf_ns_per_event_over_base"),
            "per_rep": {s: d.get(s, "bpf_ns_per_event") for s in ("zernel", "zernel_base")}}
    torch_state = ({"available": False, "reason": meta.get("torch.reason")} if meta.get("torch") == "unavailable"
                   else {"available": True, "version": meta.get("torch_version")} if "torch_version" in meta
                   else None)
    schbench_state = meta.get("schbench")
    doc = {"meta": meta, "emulation_factor": factor, "emulation_factor_observe": obs_factor,
           "host_observe": hobs, "host_load": host,
           "targets": {label(c): recs for c, recs in target_recs.items()},
           "summary": summary,
           "derived": derived,
           "phase_policy_gain": {f"{s}.{out}": d.summary(s, out) for s in ("zernel", "zernel_gpu")
                                 for out, _, _, _ in FLAT_GAIN if d.summary(s, out)},
           "bpf_verified_insns": {s: {"programs": ver[s], "total": sum(ver[s].values())} for s in ver_scheds},
           "bpf_per_event": per_event,
           "torch": torch_state, "schbench": schbench_state,
           "notes": notes, "checks": {"passed": len(checks["passed"]), "failed": checks["failed"]},
           "runs": sorted(runs, key=lambda r: (r["metric"], ORDER.index(r["sched"])
                                               if r["sched"] in ORDER else 9, r["rep"]))}
    (out / "results.json").write_text(json.dumps(doc, indent=1) + "\n")
    have_plot = plot(d, out / "plot.png", meta) if runs else False

    # Per-program BPF cost: rows (scheduler, program), the programs that take
    # the most BPF time (median ns per scheduling event, or else median ns per
    # call x median calls/s) first.
    def progs_of(s):
        return {m.split(".", 1)[1] for (ss, m) in d.v if ss == s and m.startswith("bpf_ns.")}

    med = d.median

    # Logs from before the type was printed held struct_ops programs only.
    default_type = "?" if any(k.startswith("bpf_type.") for k in meta) else "struct_ops"
    prog_rows = []
    for s in scheds:
        progs, load = progs_of(s), {}
        for p in progs:
            ns, calls = med(s, "bpf_ns." + p), med(s, "bpf_calls_per_s." + p)
            load[p] = med(s, "bpf_event_ns." + p) or (ns * calls if ns and calls else 0)
        total = sum(load.values()) or 1
        for p in sorted(progs, key=lambda p: -load[p]):
            prog_rows.append(f"| {label(s)} | `{p}` | {meta.get('bpf_type.' + p, default_type)} | "
                             f"{cell(d.summary(s, 'bpf_ns.' + p))} | "
                             f"{cell(d.summary(s, 'bpf_calls_per_s.' + p))} | "
                             f"{cell(d.summary(s, 'bpf_event_ns.' + p))} | {load[p] / total * 100:.0f} % |")
    # scx_zernel against its baseline build, program by program: the median
    # ns per scheduling event of each and the difference, largest first.
    diff_rows, diff_head = [], []
    if per_event:
        base = SCHED_LABEL["zernel_base"]
        progs = progs_of("zernel") | progs_of("zernel_base")
        ev = {p: (med("zernel", "bpf_event_ns." + p) or 0, med("zernel_base", "bpf_event_ns." + p) or 0)
              for p in progs}
        for p in sorted(progs, key=lambda p: -abs(ev[p][0] - ev[p][1])):
            a, b = ev[p]
            diff_rows.append(f"| `{p}` | {meta.get('bpf_type.' + p, default_type)} | {fmt(a)} | {fmt(b)} | "
                             f"{'+' if a - b > 0 else ''}{fmt(a - b)} |")
        total_a, total_b = med("zernel", "bpf_ns_per_event"), med("zernel_base", "bpf_ns_per_event")
        diff_rows.append(f"| **all programs** (median of the per-rep totals) | | {fmt(total_a)} | {fmt(total_b)} | "
                         f"{'+' if total_a - total_b > 0 else ''}{fmt(total_a - total_b)} |")
        diff_head = [f"| program | type | scx_zernel: ns per event | {base}: ns per event | difference |",
                     "|---|---|---|---|---|"]

    wall = meta.get("wall_total_s")
    vcpus = meta.get("vcpus", "?")
    hogs = 2 * int(vcpus) if vcpus.isdigit() else "?"
    metrics = {m for (_, m) in d.v}

    def have(*prefixes):
        return any(m.startswith(prefixes) for m in metrics)

    all_cases = ["ml", "torch", "latency", "cost"]
    cases = [c for c in meta.get("cases", ",".join(all_cases)).split(",") if c]
    scope = ("every case" if set(cases) >= set(all_cases) else "case(s) " + ", ".join(cases))
    base_text = ""
    if meta.get("base_commit"):
        base_text = (f" {SCHED_LABEL['zernel_base']}: scx_zernel built at that commit "
                     f"(`--baseline {meta.get('base_rev', meta['base_commit'])}`), same configuration.")
    md = []
    md.append("# Benchmarks: scx_zernel side by side with EEVDF and peer schedulers\n")
    if short:
        md.append("> **--short run**: one repetition of short cases. It checks that the harness works end "
                  "to end; its numbers are not meaningful.\n")
    mem = meta.get("mem_kib", "")
    mem = int(mem) // 1024 if mem.isdigit() else "?"
    md.append(
        f"Made by `bench/run.sh{' --short' if short else ''}` "
        f"({meta.get('reps', '?')} repetition(s) of {scope} under every scheduler, all in one VM boot). "
        f"Guest: {vcpus} vCPUs, {mem} MiB, kernel "
        f"`{meta.get('kernel', '?')}`, **{meta.get('accel', 'tcg').upper()}**; host: {meta.get('host_cpus', '?')} "
        f"cores. scx_zernel at `{meta.get('commit', '?')}`.{base_text} Wall time: "
        f"{wall or '?'} s in all ({meta.get('wall_vm_s', '?')} s in the VM).\n")
    sched_text = {
        "eevdf": "the kernel's own scheduler (no sched_ext scheduler attached): the baseline of every "
                 "\"÷ EEVDF's\" ratio",
        "rt": "no sched_ext scheduler, and the sized ML pipeline's processes and threads at SCHED_FIFO "
              "priority 10 (`chrt -f 10`; its threads inherit it): strict priority of the whole job over "
              "the hogs, which run only where it leaves a vCPU (and in the 5 % the kernel's RT throttling "
              "keeps for them). The reference for the pipeline (its case only): what the job still loses to "
              "the hogs here is what ordering alone does not win back in this emulator",
        "zernel": "scx_zernel in its default configuration. In this VM there is no GPU data: the common "
                  "case, and the one the targets are first of all about",
        "zernel_gpu": "scx_zernel given GPU data through its file GPU provider, which stands in for NVML "
                      "(the fake GPU's busy state, written by the workload)",
        "zernel_flat": "scx_zernel with a flat policy: every phase and every ML thread in the normal class. "
                       "The control: scx_zernel ÷ this is what the phase policy itself earns",
        "zernel_base": "scx_zernel built at an earlier commit, same configuration as scx_zernel",
        "bpfland": "peer", "lavd": "peer", "cosmos": "peer",
    }
    md.append("Schedulers in this run:\n")
    for s in scheds:
        text = sched_text.get(s, "other")
        if text == "peer":
            v = peers.get(s) or meta.get(f"version.{s}", "")
            text = f"peer scheduler{f' (`{v}`)' if v else ''}, default options"
        md.append(f"- **{label(s)}**: {text}.")
    missing = [s for s in ORDER if s not in scheds]
    if missing:
        md.append(f"- not in this run: {'; '.join(label(s) for s in missing)}.")
    md.append("")
    md.append("\"Peers\" below are EEVDF, scx_bpfland, scx_lavd and scx_cosmos (not the builds and "
              "configurations of scx_zernel, nor the RT control).\n")
    md.append(
        "**Read ratios, not absolute numbers.** Under TCG (qemu's CPU emulator; this machine has no KVM) "
        "the guest runs many times slower than hardware and its clock-driven parts (sleeps, timers) do "
        "not slow down with it, so absolute latencies, ns per BPF call and CPU percentages say little "
        "about a real machine. Ratios measured in the same boot, with the same emulation, do: a workload "
        "with hogs over itself alone under the same scheduler, or a scheduler's figure over EEVDF's. "
        "Repetitions are interleaved (rep 1 of every scheduler, then rep 2 of every scheduler in reverse "
        "order, ...) and every ratio pairs rep *k* with rep *k* of the same or the other scheduler.\n")
    if factor:
        md.append(
            f"Emulation factor, for the CPU-time figures the daemon's own factor does not cover "
            f"(the BPF ns per event; all of them when it was not measured): stress-ng's int64 CPU method does "
            f"{fmt(float(meta['calib_host_ops_per_cpu_s']))} bogo ops per CPU-second on one host core and "
            f"{fmt(float(meta['calib_guest_ops_per_cpu_s']))} per guest CPU-second with every vCPU busy: "
            f"a guest CPU-second is worth about 1/{factor:.1f} of a native one. Kernel BPF code and "
            f"a daemon reading /proc do not slow down exactly like an integer loop, and the factor "
            f"moves with the host's load, so estimates divided by it are rough. The thread-pool "
            f"windows of the cost case run in a mostly idle guest, whose vCPUs get more of the host "
            f"than in the calibration: their native estimates lean optimistic. The peers, measured "
            f"in the same boot, are the firmer yardstick.\n")
    one = meta.get("calib_guest_ops_per_cpu_s_one_busy")
    if _num(one) and _num(meta.get("calib_guest_ops_per_cpu_s")) and float(one) > 0:
        busy = float(meta["calib_guest_ops_per_cpu_s"]) / float(one)
        md.append(
            f"One vCPU busy, the other{'s' if vcpus != '2' else ''} idle, the same loop did {fmt(float(one))} "
            f"bogo ops per guest CPU-second: with every vCPU busy, a vCPU here computes {fmt(busy)} of what "
            f"it does alone."
            + (" Under TCG each vCPU is a host thread, and here they slow each other down: a job that ran "
               "alone beside idle vCPUs gets less done per CPU-second beside hogs under any scheduler, "
               "which caps its \"with hogs ÷ alone\" (the RT control shows how much)." if busy < 0.97 else "")
            + "\n")
    if obs_factor:
        md.append(
            f"The daemon's own emulation factor, for its CPU figures: the daemon's pipeline with nothing "
            f"attached (`scx_zernel observe`, its /proc passes, rules, phases and policy at its 100 ms period) "
            f"beside a process with {int(meta['calib_host_observe_threads']):,} mostly idle ML threads "
            f"(bench/observe-cpu.sh, the same on both sides) used "
            f"{fmt(float(meta['calib_guest_observe_cpu_pct']))} % of a vCPU in the guest and "
            f"{fmt(float(meta['calib_host_observe_cpu_pct']))} % of a host core: {obs_factor:.1f}× (its work is "
            f"mostly system calls reading /proc, which TCG slows far more than an integer loop).\n")
    if host:
        md.append(
            f"Host CPU use while the VM ran (bench/run.sh samples it every 5 s; `host-load.txt`): qemu "
            f"{fmt(host['qemu'])} of the host's {host.get('cpus') or '?'} CPUs on average, other host processes "
            f"{fmt(host['other'])}, steal {fmt(host['steal'])}. Whatever other processes take from qemu's "
            "threads shows up inside the guest as slower time, BPF run times included; the tables give it "
            "per measurement window where it matters.\n")
    md.append("Table cells: median (min–max) over the repetitions.\n")

    # ---- targets
    md.append("## Targets\n")
    md.append(
        "Each target is judged on the median over the repetitions. \"Ahead of every peer\" compares the "
        "same ratio's median with each peer's median (higher for throughput, lower for latency); the "
        "contended figures over EEVDF's, in absolute terms, are in the next table. A target whose metric "
        "this run did not produce (a case left out, PyTorch missing, a peer not built) is \"not measured\", "
        "not failed.\n")
    for c in CANDIDATES:
        md.append(f"### {label(c)}\n")
        if c in target_mds:
            md.append(target_mds[c] + "\n")
        else:
            md.append("Not measured: not in this run.\n")

    # ---- at a glance
    glance = table(d, [
        (None, "sized ML pipeline"),
        ("ml_con_over_iso", "steps/s with hogs ÷ alone (same scheduler)"),
        ("ml_con_over_eevdf_con", "steps/s with hogs ÷ EEVDF's with hogs"),
        ("hogs_share_of_idle_net", "hogs' CPU ÷ CPU the ML job left idle"),
        ("hogs_cpu_over_eevdf", "hogs' CPU ÷ EEVDF's"),
        (None, "real PyTorch training"),
        ("torch_train_con_over_iso", "steps/s with hogs ÷ alone (same scheduler)"),
        ("torch_train_con_over_eevdf_con", "steps/s with hogs ÷ EEVDF's with hogs"),
        ("torch_train_hogs_share_of_idle_net", "hogs' CPU ÷ CPU the training left idle"),
        ("torch_train_hogs_cpu_over_eevdf", "hogs' CPU ÷ EEVDF's"),
        (None, "real PyTorch inference"),
        ("torch_infer_p99_con_over_iso", "p99 latency with hogs ÷ alone (lower is better)"),
        ("torch_infer_p99_con_over_eevdf_con", "p99 latency with hogs ÷ EEVDF's with hogs (lower is better)"),
        ("torch_infer_rps_con_over_iso", "requests/s with hogs ÷ alone"),
        ("torch_infer_rps_con_over_eevdf_con", "requests/s with hogs ÷ EEVDF's with hogs"),
        ("torch_infer_hogs_cpu_over_eevdf", "hogs' CPU ÷ EEVDF's"),
    ], scheds)
    if glance.count("\n") > 1:
        md.append("## At a glance: the ML workloads with hogs\n")
        md.append(
            "Per scheduler: each ML workload with hogs over itself alone (same scheduler, same rep), and "
            "over EEVDF's with hogs (same rep); beside each, the hogs' figures, so that a gain the ML job "
            "makes by starving the other work is visible: the hogs' CPU ÷ the CPU the ML job left idle "
            "should stay near 1 (no vCPU left idle while hogs wait), and the hogs' CPU ÷ EEVDF's falls as "
            "much as the ML job takes from them.\n")
        md.append(glance + "\n")

    # ---- the flat-policy control
    if any(d.summary(s, out) for s in ("zernel", "zernel_gpu") for out, _, _, _ in FLAT_GAIN):
        md.append("## The phase policy's gain (the flat-policy control)\n")
        md.append(
            "scx_zernel ÷ scx_zernel with a flat policy (every phase and every ML thread in the normal "
            "class), same rep: what the phase policy earns over the rest of scx_zernel (its queues, "
            "slices, CPU selection), which both share. A gain that scx_zernel shows over EEVDF but not "
            "over its flat policy comes from the rest, not from knowing the ML phases. The flat policy has "
            "no GPU data (like scx_zernel), so the second column also counts what the GPU data adds.\n")
        cols = [s for s in ("zernel", "zernel_gpu") if s in scheds]
        rows = [f"| figure (÷ flat policy's, same rep) | " + " | ".join(f"{label(s)} ÷ flat" for s in cols)
                + " | how to read |", "|---|" + "---|" * len(cols) + "---|"]
        for out_m, _, text, how in FLAT_GAIN:
            cells = [cell(d.summary(s, out_m)) for s in cols]
            if any(c != "–" for c in cells):
                rows.append(f"| {text} | " + " | ".join(cells) + f" | {how} |")
        md.append("\n".join(rows) + "\n")

    # ---- 1. the sized ML pipeline
    if have("ml_", "hogs_"):
        steps, workers = meta.get("ml_steps", "?"), meta.get("ml_workers", "2")
        kernels, decode = meta.get("ml_kernels", "?"), meta.get("ml_decode_ms", "?")
        optim = meta.get("ml_optim_ms", "?")
        units = meta.get("units_per_ms")
        md.append("## 1. Sized ML pipeline\n")
        md.append(
            f"`zernel-workload train --steps {steps} --workers {workers}`: the trainer runs exactly {steps} "
            f"steps. Each step takes one batch from {workers} DataLoader worker processes, which decode it "
            f"with a fixed amount of CPU work (what an idle vCPU does in {decode} ms), launches {kernels} short "
            "fake-GPU kernels (sleeps of 100 µs–1 ms, with a small fixed CPU launch cost between them"
            + (f", {meta['ml_launch_ms']} ms of an idle vCPU" if meta.get("ml_launch_ms") else "")
            + f"; the trainer waits on each), then runs an optimizer step of fixed CPU work ({optim} ms of an "
            "idle vCPU). "
            + (f"The sizes are calibrated once per boot ({fmt(float(units)) if _num(units) else units} work "
               "units per ms of an idle vCPU), so every scheduler runs the same work. " if units else "")
            + f"It runs alone, then with `stress-ng --cpu {hogs}` on the {vcpus} vCPUs (2x oversubscription), "
            "started 1 s before the trainer and stopped when it ends. \"CPU left idle by the ML job\" = vCPUs × "
            "the trainer's run time − the ML job's CPU time (trainer and workers: the trainer's getrusage of itself and of its reaped children) − the CPU "
            "time of the map probe that scx_zernel's runs start 2 s in (a diagnostic: `scx_zernel inspect` "
            "and the few processes that count its entries; \"map probe's CPU\" below) − the CPU time of "
            "the benchmark's own commands in the window (its /proc passes at each end and the commands it "
            "runs: \"the harness's CPU\" below); the hogs' CPU time over the same window comes from /proc. "
            "The scheduler's own process is not left out: its CPU time in the window counts against it, "
            "and so does the time of the guest's kernel threads (a scheduler and its process may cause "
            "some of their work). The harness's commands cost about the same CPU-seconds in every "
            "window, however long: counted against the hogs, they weighed about three times as much "
            "beside a job that ran twice as fast, and kept even the RT control (strict priority: it leaves "
            "the hogs every CPU the job does not use) under 1 (\"counting the harness's CPU\" below). Hogs' bogo ops/s (stress-ng --metrics-brief) "
            "cover their whole run.\n")
        md.append(
            "How to read it: the work is sized, not timed. A thread that gets less CPU takes longer to "
            "finish its decode or its optimizer step, so with hogs the wall time of the "
            f"{steps} steps (and steps/s) measures the CPU share the scheduler gives the pipeline, and how "
            "soon it runs the trainer again after each fake-GPU kernel. Alone, the job leaves vCPUs idle and "
            "every scheduler should reach about the same steps/s (\"alone ÷ EEVDF alone\" near 1); with "
            f"{hogs} hogs, \"with hogs ÷ alone\" near 1 means the pipeline lost almost nothing to them. What "
            "the hogs pay for it shows in their rows: their CPU ÷ the CPU the ML job left idle should stay "
            "near 1 (the ML job's gain comes out of the hogs' share, not out of idle vCPUs). scx_zernel's own "
            "process counts against that share; under TCG its /proc reading costs about the daemon's own "
            "emulation factor more than natively, so the rows after the share give its part and the share "
            "with that part at its rough native estimate. The RT control's ratio over itself alone is what "
            "strict priority of the job keeps here; \"over the RT control's\" divides each scheduler's by it. "
            "The loader-wait "
            "p99 is the trainer's wait for a batch; with few steps it is close to the slowest wait, often "
            "the first batch (decoded before anything is queued).\n")
        md.append(table(d, [
            ("ml_iso_steps_per_sec", "training steps/s, alone"),
            ("ml_con_steps_per_sec", f"training steps/s, with {hogs} hogs"),
            ("ml_iso_secs", f"wall time of the {steps} steps (s), alone"),
            ("ml_con_secs", f"wall time of the {steps} steps (s), with {hogs} hogs"),
            ("ml_con_over_iso", "with hogs ÷ alone (same scheduler)"),
            ("ml_con_over_iso_over_rt", "with hogs ÷ alone, over the RT control's (same rep)"),
            ("ml_iso_over_eevdf_iso", "alone ÷ EEVDF alone"),
            ("ml_con_over_eevdf_con", "with hogs ÷ EEVDF with hogs"),
            ("ml_iso_gpu_busy_frac", "fake-GPU busy fraction, alone"),
            ("ml_con_gpu_busy_frac", "fake-GPU busy fraction, with hogs"),
            ("ml_iso_loader_p99_ms", "loader wait p99 (ms), alone"),
            ("ml_con_loader_p99_ms", "loader wait p99 (ms), with hogs"),
            ("ml_iso_cpu", "ML job CPU (vCPUs), alone"),
            ("ml_con_cpu", "ML job CPU (vCPUs), with hogs"),
            ("ml_cpu_con_over_iso", "ML job CPU with hogs ÷ alone"),
            ("hogs_cpu", "hogs' CPU (vCPUs)"),
            ("hogs_cpu_over_eevdf", "hogs' CPU ÷ EEVDF's"),
            ("hogs_share_of_idle_net", "hogs' CPU ÷ CPU left idle by the ML job"),
            ("hogs_share_of_idle_net.sched", "of that CPU, the scheduler's own process took"),
            ("hogs_share_of_idle_net.native",
             "hogs' share, the scheduler process's CPU at its rough native estimate"),
            ("hogs_share_of_idle", "hogs' CPU ÷ CPU left idle by the ML job, counting the harness's CPU"),
            ("ml_con_rest_harness_s", "the harness's CPU (s), left out of the idle CPU"),
            ("ml_con_rest_kthreads_s", "kernel threads' CPU (s), counted in it"),
            ("ml_con_rest_other_s", "other processes' CPU (s), counted in it"),
            ("ml_con_idle_cpu", "vCPUs idle, with hogs (/proc/stat: idle + iowait)"),
            ("ml_con_irq_cpu", "vCPUs in no task, with hogs (/proc/stat: irq + softirq + steal)"),
            ("ml_con_bpf_cpu", "vCPUs in the scheduler's BPF programs, with hogs (bpf_stats)"),
            ("ml_con_probe_cpu_s", "map probe's CPU (s), left out of the idle CPU"),
            ("hogs_bogo_ops_per_s", "hogs' bogo ops/s"),
            ("hogs_bogo_over_eevdf", "hogs' bogo ops/s ÷ EEVDF's"),
            ("host_qemu_cpus.ml_con", "host CPUs qemu got, run with hogs"),
            ("host_other_cpus.ml_con", "host CPUs other host processes took, run with hogs"),
        ], scheds) + "\n")

    # ---- 2. real PyTorch
    if meta.get("torch") == "unavailable":
        md.append("## 2. Real PyTorch\n")
        reason = meta.get("torch.reason")
        md.append(f"Not measured: PyTorch was unavailable in the guest{f' ({reason})' if reason else ''}.\n")
    elif have("torch_"):
        tsteps, treq = meta.get("torch_train_steps", "?"), meta.get("torch_infer_requests", "?")
        csteps = meta.get("torch_train_con_steps", tsteps)
        md.append("## 2. Real PyTorch\n")
        md.append(
            f"PyTorch {meta.get('torch_version', '?')} on the CPU. Its processes start once per boot and are "
            "paused (SIGSTOP) between measurements, so one `import torch` and one model build serve every "
            "scheduler"
            + (f" (starting them took {fmt(float(meta['torch_start_s']))} s, once)" if _num(meta.get("torch_start_s"))
               else "")
            + ", and each scheduler meets the same warm processes.\n")
        md.append(
            f"Training: `train.py`, a small CNN fed by a DataLoader with 2 worker processes that decode raw "
            f"samples: {tsteps} steps alone, then {csteps} steps with `stress-ng --cpu {hogs}` (2x "
            "oversubscription). Steps/s, the vCPUs the trainer and its workers used, and the hogs' CPU ÷ the "
            "CPU the training left idle, read as in the sized pipeline above (the harness's CPU left out of "
            "the idle CPU, kernel threads, other processes and the scheduler's own process counted in it); "
            "the job's and the hogs' CPU times, each process's CPU time for the rest of the guest, and the "
            "clock at each end of a window come from one pass over /proc. The vCPUs neither the "
            "training nor the hogs used are the rest of the guest (its kernel threads, the harness's waits and "
            "/proc passes, a scheduler's own process) and vCPUs left idle, told apart by /proc/stat's idle "
            "and iowait time over the same window; they weigh in the hogs' share of the idle CPU in "
            "proportion to how little the training leaves idle.\n")
        md.append(
            f"Inference: `serve.py`, a small transformer language model with random weights serving on a "
            f"Unix socket, and `client.py` sending {treq} requests one after another (each waits for the "
            "previous answer): requests/s and latency p50/p99, alone and with the hogs. p99 with hogs ÷ alone "
            "is how much the tail of a served model suffers from batch work sharing its CPUs (lower is "
            "better).\n")
        md.append(table(d, [
            (None, "training"),
            ("torch_train_iso_steps_per_sec", "steps/s, alone"),
            ("torch_train_con_steps_per_sec", "steps/s, with hogs"),
            ("torch_train_con_over_iso", "with hogs ÷ alone (same scheduler)"),
            ("torch_train_iso_over_eevdf_iso", "alone ÷ EEVDF alone"),
            ("torch_train_con_over_eevdf_con", "with hogs ÷ EEVDF with hogs"),
            ("torch_train_iso_cpu", "trainer + workers CPU (vCPUs), alone"),
            ("torch_train_con_cpu", "trainer + workers CPU (vCPUs), with hogs"),
            ("torch_train_cpu_con_over_iso", "trainer + workers CPU with hogs ÷ alone"),
            ("torch_train_hogs_cpu", "hogs' CPU (vCPUs)"),
            ("torch_train_hogs_cpu_over_eevdf", "hogs' CPU ÷ EEVDF's"),
            ("torch_train_hogs_share_of_idle_net", "hogs' CPU ÷ CPU left idle by the training"),
            ("torch_train_hogs_share_of_idle_net.sched", "of that CPU, the scheduler's own process took"),
            ("torch_train_hogs_share_of_idle_net.native",
             "hogs' share, the scheduler process's CPU at its rough native estimate"),
            ("torch_train_hogs_share_of_idle", "hogs' CPU ÷ CPU left idle by the training, counting the "
             "harness's CPU"),
            ("torch_train_other_cpu", "vCPUs neither the training nor the hogs used (guest kernel, harness, "
             "scheduler process)"),
            ("torch_train_idle_cpu", "of those, vCPUs idle (/proc/stat: idle + iowait)"),
            ("torch_train_other_busy_cpu", "of those, vCPUs busy (the rest)"),
            ("torch_train_irq_cpu", "of those, in no task (/proc/stat: irq + softirq + steal)"),
            ("torch_train_harness_cpu", "of the busy ones, the harness's (vCPUs), left out of the idle CPU"),
            ("torch_train_bpf_cpu", "vCPUs in the scheduler's BPF programs (bpf_stats)"),
            ("torch_train_rest_harness_s", "the harness's CPU (s)"),
            ("torch_train_rest_kthreads_s", "kernel threads' CPU (s), counted in it"),
            ("torch_train_rest_other_s", "other processes' CPU (s), counted in it"),
            ("torch_train_con_secs", "the window with hogs (s)"),
            (None, "inference"),
            ("torch_infer_iso_rps", "requests/s, alone"),
            ("torch_infer_con_rps", "requests/s, with hogs"),
            ("torch_infer_rps_con_over_iso", "requests/s with hogs ÷ alone"),
            ("torch_infer_rps_con_over_eevdf_con", "requests/s with hogs ÷ EEVDF's with hogs"),
            ("torch_infer_iso_p50_ms", "latency p50 (ms), alone"),
            ("torch_infer_con_p50_ms", "latency p50 (ms), with hogs"),
            ("torch_infer_p50_con_over_iso", "p50 with hogs ÷ alone"),
            ("torch_infer_iso_p99_ms", "latency p99 (ms), alone"),
            ("torch_infer_con_p99_ms", "latency p99 (ms), with hogs"),
            ("torch_infer_p99_con_over_iso", "p99 with hogs ÷ alone (lower is better)"),
            ("torch_infer_p99_con_over_eevdf_con", "p99 with hogs ÷ EEVDF's with hogs (lower is better)"),
            ("torch_infer_hogs_cpu", "hogs' CPU (vCPUs)"),
            ("torch_infer_hogs_cpu_over_eevdf", "hogs' CPU ÷ EEVDF's"),
            (None, "the host, runs with hogs"),
            ("host_qemu_cpus.torch_train_con", "host CPUs qemu got, training"),
            ("host_other_cpus.torch_train_con", "host CPUs other host processes took, training"),
            ("host_qemu_cpus.torch_infer_con", "host CPUs qemu got, inference"),
            ("host_other_cpus.torch_infer_con", "host CPUs other host processes took, inference"),
        ], scheds) + "\n")

    # ---- 3. general latency
    tool = meta.get("messaging_tool", "none")
    if have("cyclictest_", "messaging_", "schbench_") or schbench_state:
        md.append("## 3. General latency\n")
        tool_text = {
            "perf": f"`perf bench sched messaging {meta.get('messaging_args', '')}` (the host's perf binary, "
                    "which runs in the guest)",
            "hackbench": f"rt-tests' `hackbench {meta.get('messaging_args', '')}` (perf does not run in the "
                         "guest; hackbench is the same benchmark: groups of senders and receivers on sockets)",
        }.get(tool, "no messaging benchmark (neither perf nor hackbench runs in the guest)")
        md.append(
            f"`cyclictest -q -m -t {vcpus} -i 1000 -D {meta.get('cyclictest_s', '?')}s -v` under `stress-ng --cpu "
            f"{vcpus}` (threads at 1000 µs and every 500 µs more: cyclictest's default distance). "
            "Its threads are SCHED_OTHER: a SCHED_FIFO thread would run in the RT class, above any "
            "sched_ext scheduler, and measure none of them. p99, max and average over every sample of all "
            "threads (-v prints each one; its histogram would cap at a fixed range that TCG latencies "
            "overrun). Messaging: "
            f"{tool_text}, run alone, time in seconds (lower is better).\n")
        if schbench_state and schbench_state.startswith("not available"):
            why = schbench_state[len("not available"):].lstrip(":").strip()
            md.append(f"schbench: not measured, not available in the guest{f': {why}' if why else ''}.\n")
        elif have("schbench_"):
            args = meta.get("schbench_args")
            md.append(
                f"schbench{f' (`schbench {args}`)' if args else ''}, run alone: message threads hand "
                "requests to worker threads, which do a fixed piece of work for each; the p99 of the workers' "
                "wakeup latency (µs, lower is better) and the median requests/s.\n")
        md.append(table(d, [
            ("cyclictest_p99_us", "cyclictest p99 (µs)"),
            ("cyclictest_p99_over_eevdf", "cyclictest p99 ÷ EEVDF's"),
            ("cyclictest_max_us", "cyclictest max (µs)"),
            ("cyclictest_max_over_eevdf", "cyclictest max ÷ EEVDF's"),
            ("cyclictest_avg_us", "cyclictest average (µs)"),
            ("cyclictest_avg_over_eevdf", "cyclictest average ÷ EEVDF's"),
            ("cyclictest_samples", "cyclictest samples"),
            ("messaging_secs", "messaging time (s)"),
            ("messaging_over_eevdf", "messaging time ÷ EEVDF's"),
            ("schbench_p99_us", "schbench wakeup latency p99 (µs)"),
            ("schbench_p99_over_eevdf", "schbench p99 ÷ EEVDF's"),
            ("schbench_rps", "schbench requests/s"),
            ("schbench_rps_over_eevdf", "schbench requests/s ÷ EEVDF's"),
        ], scheds) + "\n")

    # ---- 4. cost
    cost_scheds = [s for s in scheds if s != "eevdf"]
    if have("bpf_", "sched_cpu_"):
        md.append("## 4. Cost\n")
        md.append(
            "With `kernel.bpf_stats_enabled=1`, `run_time_ns`/`run_cnt` of every BPF program the scheduler "
            "process holds an fd of (struct_ops programs, and tp_btf/fentry/lsm ones; from /proc/PID/fdinfo; "
            "names from the programs' kallsyms symbols), read before and after the sized ML pipeline's run "
            "with hogs: ns per "
            "call = Δrun_time_ns / Δrun_cnt, and **BPF ns per scheduling event** = Σ Δrun_time_ns over all "
            "those programs / Δrun_cnt of the enqueue program (the programs run for other reasons too, "
            "forks, exits, device opens, context switches; an enqueue is the one event every scheduler "
            "sees for every task it runs). The scheduler "
            "process's CPU time (utime+stime from /proc/PID/stat) over a "
            f"{meta.get('window_s', '?')} s window while a process with {meta.get('threads', '?')} mostly idle "
            "threads runs (`zernel-workload threads`, with and without the rank environment that makes it an ML "
            "process), and over the ML + hogs run. The peers' user-space halves do much less than "
            "scx_zernel's daemon (no /proc scanning), so their CPU is a floor, not a like-for-like rival. "
            "All of it is TCG-inflated (see the emulation factor above).\n")
        md.append(table(d, [
            ("bpf_ns_per_event", "BPF ns per scheduling event, all programs"),
            ("bpf_ns_per_event_over_bpfland", "BPF ns per scheduling event ÷ scx_bpfland's (same rep)"),
            ("bpf_ns_per_event_struct_ops", "BPF ns per scheduling event, struct_ops programs only"),
            ("bpf_events_per_s", "scheduling events (enqueues) per second"),
            ("bpf_cpu", "BPF time over the run (vCPUs: ns per event × events per second)"),
            ("bpf_ns_avg", "ns per BPF call, all struct_ops programs"),
            ("bpf_ns_over_bpfland", "ns per BPF call ÷ scx_bpfland's (same rep)"),
            ("sched_cpu_pct_ml_threads", "scheduler process CPU, % of a vCPU: ML threads"),
            ("sched_cpu_pct_plain_threads", "scheduler process CPU, % of a vCPU: non-ML threads"),
            ("sched_cpu_pct_ml_load", "scheduler process CPU, % of a vCPU: ML + hogs run"),
        ], cost_scheds) + "\n")
    if hobs:
        md.append("### The daemon on the host\n")
        md.append(
            "`cargo bench --bench observe -- --cpu-only` on the host (`host-observe.txt`; bench/observe.rs): "
            "the daemon's loop (GPU refresh, /proc pass, rules, phases, policy, decision diff: all but the BPF "
            "map writes, which need sched_ext), at its 100 ms period with the kernel's process events on, beside "
            f"a process with {hobs['threads']:,} threads that wake every second for a few µs; the process's CPU "
            "time (getrusage) over 60 s of its steady state, as a share of one host core. The daemon-CPU "
            "targets are judged on it, as the target states. Without the quiet tier every thread is read "
            "every pass, as a job's named threads are.\n")
        md.append("| workload | daemon CPU, % of one host core |\n|---|---|")
        for key, text in (("ml", f"ML process, {hobs['threads']:,} threads"),
                          ("ml_no_quiet", f"ML process, {hobs['threads']:,} threads, no quiet tier"),
                          ("plain", f"non-ML process, {hobs['threads']:,} threads"),
                          ("baseline", "no workload (the host's own processes)")):
            if key in hobs:
                md.append(f"| {text} | {fmt(hobs[key])} |")
        md.append("")
    if per_event:
        x, paired = per_event["ratio_of_medians"], per_event["paired_ratio"]
        ok, _ = judge("le", EVENT_RATIO_BOUND, x)
        miss = f"{pct(x)}, bound {pct(EVENT_RATIO_BOUND)}"
        base = SCHED_LABEL["zernel_base"]
        md.append(f"### BPF cost per scheduling event: scx_zernel and {base}\n")
        md.append(f"| scheduler | BPF ns per scheduling event: median | min–max | reps | per rep |\n"
                  "|---|---|---|---|---|")
        for s in ("zernel", "zernel_base"):
            summ, vals = d.summary(s, "bpf_ns_per_event"), d.get(s, "bpf_ns_per_event")
            md.append(f"| {label(s)} | {fmt(summ['median'])} | {fmt(summ['min'])}–{fmt(summ['max'])} | "
                      f"{summ['n']} | " + ", ".join(fmt(vals[r]) for r in sorted(vals)) + " |")
        pvals = d.get("zernel", "bpf_ns_per_event_over_base")
        md.append("")
        md.append(f"scx_zernel ÷ {base}, ratio of the medians: **{x:.3f}** ({pct(x)}; bound ≤ "
                  f"{EVENT_RATIO_BOUND:.2f}: {verdict(ok, miss, short)}); paired by rep (rep *k* of one over rep "
                  f"*k* of the other): {cell(paired)}"
                  + (" (" + ", ".join(f"{pvals[r]:.3f}" for r in sorted(pvals)) + ")" if pvals else "") + ".\n")
        other = {s: d.get(s, "host_other_cpus.ml_con") for s in ("zernel", "zernel_base")}
        ev = {s: d.get(s, "bpf_ns_per_event") for s in ("zernel", "zernel_base")}
        rows = ["| rep | scx_zernel: ns per event | " + base + ": ns per event | ratio | "
                "other host processes' CPUs: scx_zernel's run | " + base + "'s run |", "|---|---|---|---|---|---|"]
        for r in sorted(set(ev["zernel"]) | set(ev["zernel_base"])):
            a, b = ev["zernel"].get(r), ev["zernel_base"].get(r)
            rows.append(f"| {r} | {fmt(a)} | {fmt(b)} | {pvals[r]:.3f} | " if r in pvals else
                        f"| {r} | {fmt(a)} | {fmt(b)} | – | ")
            rows[-1] += f"{fmt(other['zernel'].get(r))} | {fmt(other['zernel_base'].get(r))} |"
        md.append("By repetition (the run with hogs; the other host processes' CPUs over the same window, "
                  "from the host's samples):\n")
        md.append("\n".join(rows) + "\n")
        if paired and paired["n"] > 1 and paired["max"] - paired["min"] > 2 * (EVENT_RATIO_BOUND - 1):
            md.append(f"**Resolution:** the paired ratios spread over {paired['min']:.3f}–{paired['max']:.3f}, "
                      f"wider than the ±{(EVENT_RATIO_BOUND - 1) * 100:.0f} % the bound allows: this run "
                      f"cannot tell a {(EVENT_RATIO_BOUND - 1) * 100:.0f} % change from its noise, whichever "
                      "side of the bound the ratio of medians lands.\n")
        md.append("Per program, median ns per scheduling event (its Δrun_time_ns / Δrun_cnt of the enqueue "
                  "program; medians of different programs come from different reps, so they need not add up "
                  "to the total's median):\n")
        md.append("\n".join(diff_head + diff_rows) + "\n")
    if prog_rows:
        md.append("Per BPF program, during the ML + hogs run:\n")
        md.append("| scheduler | program | type | ns per call | calls/s | ns per scheduling event "
                  "| share of its BPF time |\n|---|---|---|---|---|---|---|")
        md.append("\n".join(prog_rows) + "\n")
    if ver_scheds:
        md.append("### Verifier complexity\n")
        md.append(
            "Instructions processed by the kernel's verifier to load each BPF program (`verified_insns` in "
            "its fdinfo, read once per attach: the figure veristat reports). It measures how much work the "
            "verifier does over every path through the program (the kernel refuses a program past "
            "1,000,000), a gauge of the program's complexity, not of its run time. One value per program "
            "(the largest over the attaches; the same program verifies the same way each time), and the "
            "total per scheduler.\n")
        progs = []
        for s in ver_scheds:
            for p in sorted(ver[s], key=lambda p: -ver[s][p]):
                if p not in progs:
                    progs.append(p)
        rows = ["| program | " + " | ".join(label(s) for s in ver_scheds) + " |",
                "|---|" + "---|" * len(ver_scheds)]
        for p in progs:
            rows.append(f"| `{p}` | " + " | ".join(fmt(ver[s].get(p)) for s in ver_scheds) + " |")
        rows.append("| **total** | " + " | ".join(f"**{fmt(sum(ver[s].values()))}**" for s in ver_scheds) + " |")
        md.append("\n".join(rows) + "\n")
        if ver_varies:
            md.append("Differed between attaches (the largest is shown): " + ", ".join(ver_varies) + ".\n")

    if have_plot:
        md.append("## Plot\n")
        md.append("![benchmark plot](plot.png)\n")

    md.append("## Schedulers and tools\n")
    for s in ORDER:
        v = meta.get(f"version.{s}")
        status = peers.get(s)
        if v:
            md.append(f"- {label(s)}: `{v}`")
        elif status:
            md.append(f"- {label(s)}: {status}")
    md.append(f"- messaging: {tool}; {meta.get('stress_ng', 'stress-ng ?')}; "
              f"{meta.get('cyclictest', 'cyclictest ?')}")
    if schbench_state:
        md.append(f"- schbench: {schbench_state}")
    if torch_state:
        md.append("- PyTorch: " + (torch_state.get("version") or "?" if torch_state["available"] else
                                   "unavailable" + (f" ({torch_state['reason']})" if torch_state["reason"] else "")))
    builds = [f"scx_{p} {meta[f'peer_build_s.{p}']} s" for p in ("bpfland", "lavd", "cosmos")
              if f"peer_build_s.{p}" in meta]
    if builds:
        md.append(f"- peer builds this run: {', '.join(builds)} (cached afterwards)")
    md.append("")
    md.append(f"Harness checks (attach/detach, sched_ext state): {len(checks['passed'])} passed, "
              f"{len(checks['failed'])} failed.\n")
    if checks["failed"]:
        md.append("Failed checks:\n")
        md.extend(f"- {c}" for c in checks["failed"])
        md.append("")
    if notes:
        md.append("Notes:\n")
        md.extend(f"- {n}" for n in notes)
        md.append("")
    md.append("Raw guest output: [guest.log](guest.log); every value: [results.json](results.json).\n")
    (out / "README.md").write_text("\n".join(md))
    print(f"report: {len(runs)} values from {len(scheds)} scheduler(s) -> {out}/README.md, results.json"
          + (", plot.png" if have_plot else ""))
    return 0 if runs else 1


def _num(x):
    try:
        float(x)
        return True
    except (TypeError, ValueError):
        return False


if __name__ == "__main__":
    sys.exit(main())
