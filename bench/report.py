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
each measurement window (BENCHWIN) becomes a metric of its own.

Every metric is summarised per scheduler as its median and its spread
(min-max) over the repetitions. Ratios to EEVDF are paired by repetition
(rep k of a scheduler over rep k of EEVDF, both from the same boot), so a slow
phase of the host weighs on both sides of a ratio. The plot needs matplotlib;
without it everything else is still written.
"""

import argparse
import json
import re
import shlex
import statistics
import sys
from collections import defaultdict
from pathlib import Path

SCHED_LABEL = {"eevdf": "EEVDF", "zernel": "scx_zernel", "zernel_base": "scx_zernel @base",
               "bpfland": "scx_bpfland", "lavd": "scx_lavd"}
ORDER = ["eevdf", "zernel", "zernel_base", "bpfland", "lavd"]
# BPF cost per scheduling event of scx_zernel over its build at the baseline
# commit (bench/run.sh --baseline): the bound on the ratio of their medians.
EVENT_RATIO_BOUND = 1.05


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
                runs.append({"sched": m[1], "rep": int(m[2]), "metric": m[3], "value": value})
            elif line.startswith("BENCHMETA "):
                try:
                    words = shlex.split(line[len("BENCHMETA "):])
                except ValueError:
                    words = line.split()[1:]
                for w in words:
                    k, _, v = w.partition("=")
                    meta[k] = v
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

    def __init__(self, runs):
        self.v = defaultdict(dict)
        for r in runs:
            self.v[(r["sched"], r["metric"])][r["rep"]] = r["value"]
        self.scheds = [s for s in ORDER if any(k[0] == s for k in self.v)]
        self.scheds += sorted({k[0] for k in self.v} - set(self.scheds))
        self.derive()

    def get(self, sched, metric):
        return self.v.get((sched, metric), {})

    def put(self, sched, metric, rep, value):
        self.v[(sched, metric)][rep] = value

    def ratio(self, out, s, num, den_sched, den):
        """out[rep] = num(s, rep) / den(den_sched, rep), paired by rep."""
        a, b = self.get(s, num), self.get(den_sched, den)
        for rep, x in a.items():
            if rep in b and b[rep] > 0:
                self.put(s, out, rep, x / b[rep])

    def derive(self):
        for s in self.scheds:
            self.ratio("ml_con_over_iso", s, "ml_con_steps_per_sec", s, "ml_iso_steps_per_sec")
            self.ratio("ml_iso_over_eevdf_iso", s, "ml_iso_steps_per_sec", "eevdf", "ml_iso_steps_per_sec")
            self.ratio("ml_con_over_eevdf_iso", s, "ml_con_steps_per_sec", "eevdf", "ml_iso_steps_per_sec")
            self.ratio("ml_cpu_con_over_iso", s, "ml_con_cpu", s, "ml_iso_cpu")
            self.ratio("cyclictest_avg_over_eevdf", s, "cyclictest_avg_us", "eevdf", "cyclictest_avg_us")
            self.ratio("hogs_bogo_over_eevdf", s, "hogs_bogo_ops_per_s", "eevdf", "hogs_bogo_ops_per_s")
            self.ratio("cyclictest_p99_over_eevdf", s, "cyclictest_p99_us", "eevdf", "cyclictest_p99_us")
            self.ratio("cyclictest_max_over_eevdf", s, "cyclictest_max_us", "eevdf", "cyclictest_max_us")
            self.ratio("messaging_over_eevdf", s, "messaging_secs", "eevdf", "messaging_secs")
            self.ratio("bpf_ns_over_bpfland", s, "bpf_ns_avg", "bpfland", "bpf_ns_avg")
        self.ratio("bpf_ns_per_event_over_base", "zernel", "bpf_ns_per_event", "zernel_base", "bpf_ns_per_event")

    def summary(self, sched, metric):
        vals = list(self.get(sched, metric).values())
        if not vals:
            return None
        return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


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
    """rows: (metric, label). Columns: the schedulers."""
    out = ["| metric | " + " | ".join(SCHED_LABEL.get(s, s) for s in scheds) + " |",
           "|---|" + "---|" * len(scheds)]
    for metric, label in rows:
        cells = [cell(d.summary(s, metric)) for s in scheds]
        if all(c == "–" for c in cells):
            continue
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(out)


# ---- targets ------------------------------------------------------------------------------
# (label, metric, kind, bound, unit): kind "ge" = measured >= bound passes.
TARGETS = [
    ("ML throughput with 2x oversubscription ÷ isolated", "ml_con_over_iso", "ge", 0.95, ""),
    ("hogs' CPU ÷ CPU the ML job leaves idle", "hogs_share_of_idle", "ge", 0.90, ""),
    ("cyclictest p99 ÷ EEVDF's (same rep)", "cyclictest_p99_over_eevdf", "le", 1.2, "×"),
    ("average ns per BPF call (all struct_ops programs, ML + hogs run)", "bpf_ns_avg", "le", 200, " ns"),
    ("scheduler process CPU, {threads} ML threads", "sched_cpu_pct_ml_threads", "le", 1.0, " %"),
    ("scheduler process CPU, {threads} non-ML threads", "sched_cpu_pct_plain_threads", "le", 1.0, " %"),
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
    if kind == "ge":
        return False, f"short by {fmt(bound - x)} ({(bound - x) / bound * 100:.0f} % under)"
    if x >= 2 * bound:
        times = x / bound
        return False, f"{times:.0f}× the bound" if times >= 10 else f"{times:.1f}× the bound"
    return False, f"over by {fmt(x - bound)} ({(x - bound) / bound * 100:.0f} % over)"


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


def targets(d, factor, short, threads):
    rows, records = [], []
    x = event_ratio(d)
    if x is not None:
        base = SCHED_LABEL["zernel_base"]
        label = f"BPF ns per scheduling event ÷ {base}'s (ratio of medians, same boot)"
        ok, _ = judge("le", EVENT_RATIO_BOUND, x)
        miss = f"{pct(x)}, bound {pct(EVENT_RATIO_BOUND)}"
        paired = d.summary("zernel", "bpf_ns_per_event_over_base")
        rows.append(f"| {label} | ≤ {EVENT_RATIO_BOUND:.2f}× | {x:.3f}× ({pct(x)}) | {verdict(ok, miss, short)} | "
                    f"paired by rep: {cell(paired)}× |")
        records.append({"target": label, "metric": "bpf_ns_per_event_over_base", "bound": EVENT_RATIO_BOUND,
                        "kind": "le", "measured": x, "met": ok, "miss": miss})
    for label, metric, kind, bound, unit in TARGETS:
        label = label.format(threads=threads)
        summ = d.summary("zernel", metric)
        x = summ["median"] if summ else None
        if x is None and metric not in {m for (_, m) in d.v}:
            continue   # a case this run left out
        ok, miss = judge(kind, bound, x)
        rec = {"target": label, "metric": metric, "bound": bound, "kind": kind,
               "measured": x, "met": ok, "miss": miss}
        text = verdict(ok, miss, short)
        if metric in CPU_TIME_METRICS and x is not None:
            # An absolute CPU time measured under TCG: judged as measured, and
            # again scaled by the emulation factor (a rough native estimate).
            text = "as measured under TCG: " + text
            if factor:
                est = x / factor
                eok, emiss = judge(kind, bound, est)
                rec.update({"native_estimate": est, "native_estimate_met": eok})
                text += f"; rough native estimate ≈ {fmt(est)}{unit}: {verdict(eok, emiss, short)}"
        peers = ", ".join(
            f"{SCHED_LABEL[s]} {fmt(d.summary(s, metric)['median'])}"
            for s in d.scheds if s != "zernel" and d.summary(s, metric))
        rows.append(f"| {label} | {'≥' if kind == 'ge' else '≤'} {fmt(bound)}{unit} | "
                    f"{cell(summ)}{unit if summ else ''} | {text} | {peers or '–'} |")
        records.append(rec)
    head = ["| target (scx_zernel) | bound | measured: median (min–max) | met? | others, median |",
            "|---|---|---|---|---|"]
    return "\n".join(head + rows), records


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
    colors = {"eevdf": "#7f7f7f", "zernel": "#d62728", "zernel_base": "#ff9896", "bpfland": "#1f77b4",
              "lavd": "#2ca02c"}
    hatches = ["", "///", "..."]
    n_thr = meta.get("threads", "?")
    vcpus = meta.get("vcpus", "?")
    hogs = 2 * int(vcpus) if vcpus.isdigit() else "?"
    # (title, [(metric, series label)], target (kind, bound) or None, log scale)
    panels = [
        (f"Training steps/s with {hogs} CPU hogs\n÷ alone, same scheduler (higher is better)",
         [("ml_con_over_iso", None)], ("ge", 0.95), False),
        ("Training steps/s ÷ EEVDF alone\n(higher is better)",
         [("ml_iso_over_eevdf_iso", "alone"), ("ml_con_over_eevdf_iso", "with hogs")], None, False),
        ("CPU the ML job got with hogs ÷ alone\n(higher = ML job kept its CPU)",
         [("ml_cpu_con_over_iso", None)], None, False),
        ("Hogs' CPU ÷ CPU left idle by the ML job\n(higher is better)",
         [("hogs_share_of_idle", None)], ("ge", 0.90), False),
        (f"cyclictest under {vcpus} hogs ÷ EEVDF\n(lower is better)",
         [("cyclictest_p99_over_eevdf", "p99"), ("cyclictest_max_over_eevdf", "max"),
          ("cyclictest_avg_over_eevdf", "average")], ("le", 1.2), False),
        (f"{meta.get('messaging_tool', 'messaging')} messaging time ÷ EEVDF\n(lower is better)",
         [("messaging_over_eevdf", None)], None, False),
        ("BPF ns, ML + hogs run\n(lower is better; TCG-inflated, log scale)",
         [("bpf_ns_avg", "per struct_ops call"), ("bpf_ns_per_event", "per scheduling event")],
         ("le", 200), True),
        ("Scheduler process CPU, % of one vCPU\n(lower is better; TCG-inflated)",
         [("sched_cpu_pct_ml_threads", f"{n_thr} ML threads"),
          ("sched_cpu_pct_plain_threads", f"{n_thr} threads"),
          ("sched_cpu_pct_ml_load", "ML + hogs run")], ("le", 1.0), False),
    ]
    fig, axes = plt.subplots(2, 4, figsize=(18, 8.5), layout="constrained")
    for ax, (title, series, target, logy) in zip(axes.flat, panels):
        scheds = [s for s in d.scheds if any(d.summary(s, m) for m, _ in series)]
        width = 0.8 / max(1, len(series))
        handles = []
        for i, (metric, label) in enumerate(series):
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
            bars = ax.bar(xs, ys, width * 0.9, yerr=[lo, hi], capsize=3, color=cs,
                          hatch=hatches[i % len(hatches)], edgecolor="black", linewidth=0.5)
            # The median's value, above the whisker.
            for b, y, h in zip(bars, ys, hi):
                ax.annotate(fmt(y), (b.get_x() + b.get_width() / 2, y + h), ha="center", va="bottom",
                            fontsize=7 if len(series) < 3 else 6, xytext=(0, 2), textcoords="offset points")
            if label:
                handles.append(matplotlib.patches.Patch(facecolor="white", edgecolor="black",
                                                        hatch=hatches[i % len(hatches)], label=label))
        if target:
            handles.append(ax.axhline(target[1], color="black", linestyle="--", linewidth=1,
                                      label=f"target {'≥' if target[0] == 'ge' else '≤'} {fmt(target[1])}"))
        if "÷" in title:
            ax.axhline(1.0, color="grey", linewidth=0.8)
        # Room above the bars for the legend, in a row of its own.
        top = max([ax.get_ylim()[1]] + [target[1] if target else 0])
        if logy:
            ax.set_yscale("log")
            ax.set_ylim(top=top * 8)
        else:
            ax.set_ylim(0, top * 1.3)
        if handles:
            ax.legend(handles=handles, fontsize=7, loc="upper center", ncol=len(handles),
                      handlelength=1.6, columnspacing=1.0, frameon=False)
        ax.set_xticks(range(len(scheds)))
        ax.set_xticklabels([SCHED_LABEL.get(s, s) for s in scheds], fontsize=8)
        ax.set_title(title, fontsize=9.5)
        ax.tick_params(axis="y", labelsize=8)
    reps = meta.get("reps", "?")
    fig.suptitle(
        f"scx_zernel vs EEVDF and peers, one VM boot ({meta.get('vcpus', '?')} vCPUs, "
        f"{meta.get('accel', 'tcg').upper()}, kernel {meta.get('kernel', '?')}), {reps} rep(s): "
        "bars = median, whiskers = min–max.\nUnder TCG emulation absolute times mean nothing; "
        "ratios to EEVDF in the same boot do.", fontsize=10.5)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# ---- the report -------------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory for results.json, README.md, plot.png")
    ap.add_argument("--host-load", help="bench/run.sh's host samples (default: OUT/host-load.txt if there)")
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
    d = Data(runs)
    short = meta.get("short") == "1"

    try:
        factor = float(meta["calib_host_ops_per_cpu_s"]) / float(meta["calib_guest_ops_per_cpu_s"])
    except (KeyError, ValueError, ZeroDivisionError):
        factor = None
    threads = meta.get("threads", "?")
    if threads.isdigit():
        threads = f"{int(threads):,}"
    target_md, target_recs = targets(d, factor, short, threads)
    scheds = d.scheds
    peers = {p: meta.get(f"peer.{p}", "?") for p in ("bpfland", "lavd")}
    for p, status in peers.items():
        if status.startswith("not built") or status.startswith("not run"):
            notes.append(f"sched={p}: {status}")

    summary = {f"{s}.{m}": d.summary(s, m) for (s, m) in sorted(d.v) if d.summary(s, m)}
    per_event = None
    if d.summary("zernel_base", "bpf_ns_per_event"):
        per_event = {
            "definition": "sum of delta run_time_ns over every BPF program the scheduler process holds / "
                          "delta run_cnt of its enqueue program, over the ML + hogs run",
            "baseline_commit": meta.get("base_commit"), "bound": EVENT_RATIO_BOUND,
            "ratio_of_medians": event_ratio(d),
            "paired_ratio": d.summary("zernel", "bpf_ns_per_event_over_base"),
            "per_rep": {s: d.get(s, "bpf_ns_per_event") for s in ("zernel", "zernel_base")}}
    doc = {"meta": meta, "emulation_factor": factor, "host_load": host, "targets": target_recs,
           "summary": summary,
           "bpf_per_event": per_event,
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

    def med(s, metric):
        summ = d.summary(s, metric)
        return summ["median"] if summ else None

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
            prog_rows.append(f"| {SCHED_LABEL.get(s, s)} | `{p}` | {meta.get('bpf_type.' + p, default_type)} | "
                             f"{cell(d.summary(s, 'bpf_ns.' + p))} | "
                             f"{cell(d.summary(s, 'bpf_calls_per_s.' + p))} | "
                             f"{cell(d.summary(s, 'bpf_event_ns.' + p))} | {load[p] / total * 100:.0f} % |")
    # scx_zernel against its baseline build, program by program: the median
    # ns per scheduling event of each and the difference, largest first.
    diff_rows = []
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

    cases = meta.get("cases", "ml,latency,cost")
    scope = ("every case" if set(cases.split(",")) >= {"ml", "latency", "cost"}
             else "case(s) " + ", ".join(cases.split(",")))
    base_text = ""
    if meta.get("base_commit"):
        base_text = (f" {SCHED_LABEL['zernel_base']}: scx_zernel built at that commit "
                     f"(`--baseline {meta.get('base_rev', meta['base_commit'])}`), same configuration.")
    md = []
    md.append("# Benchmarks: scx_zernel side by side with EEVDF and peer schedulers\n")
    if short:
        md.append("> **--short run**: one repetition of short cases. It checks that the harness works end "
                  "to end; its numbers are not meaningful.\n")
    md.append(
        f"Made by `bench/run.sh{' --short' if short else ''}` "
        f"({meta.get('reps', '?')} repetition(s) of {scope} under every scheduler, all in one VM boot). "
        f"Guest: {meta.get('vcpus', '?')} vCPUs, {int(meta.get('mem_kib', 0)) // 1024} MiB, kernel "
        f"`{meta.get('kernel', '?')}`, **{meta.get('accel', 'tcg').upper()}**; host: {meta.get('host_cpus', '?')} "
        f"cores. scx_zernel at `{meta.get('commit', '?')}`.{base_text} Wall time: "
        f"{wall or '?'} s in all ({meta.get('wall_vm_s', '?')} s in the VM).\n")
    md.append(
        "**Read ratios, not absolute numbers.** Under TCG (qemu's CPU emulator; this machine has no KVM) "
        "the guest runs many times slower than hardware and its clock-driven workloads (spins, sleeps) do "
        "not slow down with it, so absolute latencies, ns per BPF call and CPU percentages say little "
        "about a real machine. Ratios to EEVDF measured in the same boot, with the same emulation, do. "
        "Repetitions are interleaved (rep 1 of every scheduler, then rep 2 of every scheduler in reverse "
        "order, ...) and every ratio to EEVDF pairs rep *k* with EEVDF's rep *k*.\n")
    if factor:
        md.append(
            f"Emulation factor, for the CPU-time targets only: stress-ng's int64 CPU method does "
            f"{fmt(float(meta['calib_host_ops_per_cpu_s']))} bogo ops per CPU-second on one host core and "
            f"{fmt(float(meta['calib_guest_ops_per_cpu_s']))} per guest CPU-second with every vCPU busy: "
            f"a guest CPU-second is worth about 1/{factor:.1f} of a native one. Kernel BPF code and "
            f"a daemon reading /proc do not slow down exactly like an integer loop, and the factor "
            f"moves with the host's load, so estimates divided by it are rough. The thread-pool "
            f"windows of the cost case run in a mostly idle guest, whose vCPUs get more of the host "
            f"than in the calibration: their native estimates lean optimistic. The peers, measured "
            f"in the same boot, are the firmer yardstick.\n")
    if host:
        md.append(
            f"Host CPU use while the VM ran (bench/run.sh samples it every 5 s; `host-load.txt`): qemu "
            f"{fmt(host['qemu'])} of the host's {host.get('cpus') or '?'} CPUs on average, other host processes "
            f"{fmt(host['other'])}, steal {fmt(host['steal'])}. Whatever other processes take from qemu's "
            "threads shows up inside the guest as slower time, BPF run times included; the tables give it "
            "per measurement window where it matters.\n")
    md.append("Table cells: median (min–max) over the repetitions.\n")

    md.append("## Targets\n")
    md.append(target_md + "\n")

    if have("ml_"):
        md.append("## 1. ML pipeline\n")
        md.append(
            f"`zernel-workload train --workers 2` ({meta.get('train_s', '?')} s; steps of 0.5 s fake-GPU compute, "
            "0.5 s all-reduce, 0.5 s CPU optimizer; two DataLoader worker processes decoding 0.5 s per batch) "
            f"alone, then with `stress-ng --cpu {hogs}` on the {vcpus} vCPUs (2x oversubscription), started 1 s before "
            "the trainer and stopped when it ends. scx_zernel gets the trainer's fake GPU through its file "
            "GPU provider and otherwise its default configuration (no rule for the hogs). "
            "\"CPU left idle by the ML job\" = vCPUs × the trainer's run time − the ML job's CPU time "
            "(trainer and workers, from `time -p`); the hogs' CPU time over the same window comes from "
            "/proc. Hogs' bogo ops/s (stress-ng --metrics-brief) cover their whole run.\n")
        md.append(
            "How to read steps/s: the workload's CPU phases are timed, not sized (a thread spins *until a "
            "deadline*: optimizer, all-reduce, decode), so a thread that gets less CPU still ends its phase on "
            "time. Steps/s therefore measure the pipeline's wake-up and hand-off delays (20 ms fake-GPU "
            "kernel launches, condvar hand-offs, batch reads), not its share of the CPU; the row \"ML job CPU "
            "with hogs ÷ alone\" shows that share. With about 20 steps a run, the loader-wait p99 is the "
            "slowest wait, usually the first batch (0.5 s of decoding before anything is queued).\n")
        md.append(table(d, [
            ("ml_iso_steps_per_sec", "training steps/s, alone"),
            ("ml_con_steps_per_sec", f"training steps/s, with {hogs} hogs"),
            ("ml_con_over_iso", "with hogs ÷ alone (same scheduler)"),
            ("ml_iso_over_eevdf_iso", "alone ÷ EEVDF alone"),
            ("ml_con_over_eevdf_iso", "with hogs ÷ EEVDF alone"),
            ("ml_iso_gpu_busy_frac", "fake-GPU busy fraction, alone"),
            ("ml_con_gpu_busy_frac", "fake-GPU busy fraction, with hogs"),
            ("ml_iso_loader_p99_ms", "loader wait p99 (ms), alone"),
            ("ml_con_loader_p99_ms", "loader wait p99 (ms), with hogs"),
            ("ml_iso_cpu", "ML job CPU (vCPUs), alone"),
            ("ml_con_cpu", "ML job CPU (vCPUs), with hogs"),
            ("ml_cpu_con_over_iso", "ML job CPU with hogs ÷ alone"),
            ("hogs_cpu", "hogs' CPU (vCPUs)"),
            ("hogs_share_of_idle", "hogs' CPU ÷ CPU left idle by the ML job"),
            ("hogs_bogo_ops_per_s", "hogs' bogo ops/s"),
            ("hogs_bogo_over_eevdf", "hogs' bogo ops/s ÷ EEVDF's"),
            ("host_qemu_cpus.ml_con", "host CPUs qemu got, run with hogs"),
            ("host_other_cpus.ml_con", "host CPUs other host processes took, run with hogs"),
        ], scheds) + "\n")

    tool = meta.get("messaging_tool", "none")
    if have("cyclictest_", "messaging_"):
        md.append("## 2. General latency\n")
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
        ], scheds) + "\n")

    cost_scheds = [s for s in scheds if s != "eevdf"]
    if have("bpf_", "sched_cpu_"):
        md.append("## 3. Cost\n")
        md.append(
            "With `kernel.bpf_stats_enabled=1`, `run_time_ns`/`run_cnt` of every BPF program the scheduler "
            "process holds an fd of (struct_ops programs, and tp_btf/fentry/lsm ones; from /proc/PID/fdinfo; "
            "names from the programs' kallsyms symbols), read before and after the ML + hogs run: ns per "
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
            ("bpf_ns_per_event_struct_ops", "BPF ns per scheduling event, struct_ops programs only"),
            ("bpf_events_per_s", "scheduling events (enqueues) per second"),
            ("bpf_ns_avg", "ns per BPF call, all struct_ops programs"),
            ("bpf_ns_over_bpfland", "ns per BPF call ÷ scx_bpfland's (same rep)"),
            ("sched_cpu_pct_ml_threads", "scheduler process CPU, % of a vCPU: ML threads"),
            ("sched_cpu_pct_plain_threads", "scheduler process CPU, % of a vCPU: non-ML threads"),
            ("sched_cpu_pct_ml_load", "scheduler process CPU, % of a vCPU: ML + hogs run"),
        ], cost_scheds) + "\n")
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
            md.append(f"| {SCHED_LABEL[s]} | {fmt(summ['median'])} | {fmt(summ['min'])}–{fmt(summ['max'])} | "
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

    if have_plot:
        md.append("## Plot\n")
        md.append("![benchmark plot](plot.png)\n")

    md.append("## Schedulers and tools\n")
    for s in ORDER:
        v = meta.get(f"version.{s}")
        status = peers.get(s)
        if v:
            md.append(f"- {SCHED_LABEL[s]}: `{v}`")
        elif status:
            md.append(f"- {SCHED_LABEL[s]}: {status}")
    md.append(f"- messaging: {tool}; {meta.get('stress_ng', 'stress-ng ?')}; "
              f"{meta.get('cyclictest', 'cyclictest ?')}")
    builds = [f"scx_{p} {meta[f'peer_build_s.{p}']} s" for p in ("bpfland", "lavd") if f"peer_build_s.{p}" in meta]
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


if __name__ == "__main__":
    sys.exit(main())
