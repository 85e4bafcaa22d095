//! Observer benchmark: pass time and daemon CPU with large thread counts.
//!
//! For N in 1000 and 2000 it starts `zernel-workload threads --count N`
//! (threads waking every second for a few µs), as an ML process (rank
//! environment) and as a plain one, and times 50 observer passes at the
//! daemon's 100 ms period: median, p10, p90 of the whole pass, and the
//! median minus that of the same host without the workload, per 1000
//! threads. Then it runs the daemon's loop (GPU refresh, observer pass,
//! rules, phase detection, policy, decision diff: all but the BPF map
//! writes) at 100 ms with 2000 threads and the kernel's process events on,
//! as the attached daemon runs, and reports the process's CPU time
//! (getrusage) as a percentage of one core in the steady state: measured
//! for 60 s once the quiet threads' first fallback samples are past (they
//! go quiet together, and each is then sampled every 45-75 s, its own
//! jitter apart: the 60 s hold about one fallback sample per thread). And
//! without and with a policy script (`[policy] script`, [`SCRIPT`]).
//!
//! The policy script's own cost: one call of `decide` (the facts table
//! built, the Lua function run, its table read back), the CPU time of
//! 20,000 calls with the facts varied, and one cached verdict (the fingerprint of
//! an unchanged thread's facts matched), which is what an unchanged thread
//! costs in every pass.
//!
//! `cargo bench --bench observe`, once `cargo build --release --workspace`
//! has built zernel-workload (a crate of its own: cargo does not build it
//! for this package's benches); add `-- --quick` for 20 passes and 3 s
//! (and no steady state), `-- --cpu-only` for the steady-state CPU figures
//! alone (about 9 minutes), `-- --script-only` for the
//! script's figures alone, `-- --events-only` for the process-events
//! figures alone.
//!
//! Thread counters (`-- --counters-only` alone): the pass time and the
//! loop's CPU, process events on, with no workload and with 2,000 threads
//! of an ML and of a non-ML process, with ML threads' counters from the
//! kernel's task iterator (`thread_counters = "kernel"`, needs root) and
//! from /proc, side by side in one run; with the quiet tier and without
//! (every thread sampled every pass, as a job's named threads are).
//!
//! Process events: the pass time and the loop's CPU with 2,000 threads and
//! no new processes, with /proc listed whenever /proc/loadavg moved (as
//! `scx_zernel observe` does) and with the kernel's process events on (as
//! the attached daemon does: /proc listed every 5 rescan intervals).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use std::path::Path;

// The host tests' helpers, for workload_bin (the rest is unused here).
#[path = "../tests/common/mod.rs"]
#[allow(unused_imports)]
mod common;

use scx_zernel::class::Class;
use scx_zernel::config::Config;
use scx_zernel::decisions::{DecisionSink, Decisions};
use scx_zernel::gpu::NoGpu;
use scx_zernel::observe::taskiter::{self, TaskIter};
use scx_zernel::observe::{MlEvidence, ObserveConfig, Observer, ThreadCounters, ThreadRole, QUIET_FALLBACK_FACTOR};
use scx_zernel::phase::Phase;
use scx_zernel::pipeline::Pipeline;
use scx_zernel::policy::Decision;
use scx_zernel::policy_script::{Script, ThreadFacts};
use scx_zernel::sched::WriteError;
use scx_zernel::topology::Topology;

const PERIOD: Duration = Duration::from_millis(100);

/// The policy script benchmarked: a few string matches and comparisons, as
/// an operator's policy would have.
const SCRIPT: &str = r#"
function decide(t)
  if t.cmdline:find("backup", 1, true) then return { class = "batch" } end
  if t.ml and t.rank == 0 and t.phase == "gpu_compute" then return { class = "latency", slice_us = 500 } end
  if t.cgroup:match("^/kubepods/besteffort") then return { class = "batch", preempt = false } end
  if t.role == "data_loader" or t.comm:match("^pt_data") then return { class = "ml", slice_us = 4000 } end
  if t.builtin and t.builtin.class == "latency" and #t.gpus > 1 then return { node = t.node or -1 } end
  return nil
end
"#;

struct Workload(Child);

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(n: usize, ml: bool) -> Workload {
    let mut cmd = Command::new(common::workload_bin());
    cmd.args(["threads", "--count", &n.to_string(), "--secs", "600"]);
    if ml {
        cmd.arg("--ml");
    } else {
        common::without_ml_env(&mut cmd);
    }
    let mut child = cmd.stdout(Stdio::piped()).spawn().expect("starting zernel-workload");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line).expect("reading the ready line");
    assert!(line.starts_with("zernel-workload threads ready"), "unexpected: {line}");
    Workload(child)
}

struct Timing {
    median: f64,
    p10: f64,
    p90: f64,
    threads: usize,
    processes: usize,
    ml_threads: usize,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Times `passes` observer passes at the daemon period (after a warm-up
/// long enough for quiet threads to settle into their sampling tier).
fn time_passes(cfg: &ObserveConfig, passes: usize) -> Timing {
    time_passes_with(cfg, passes, false)
}

/// [`time_passes`], with the kernel's process events on (as when the
/// scheduler is attached: none come here, so /proc is listed only at the
/// first pass and every 5 rescan intervals) or off.
fn time_passes_with(cfg: &ObserveConfig, passes: usize, events: bool) -> Timing {
    let gpu = NoGpu;
    let mut o = Observer::new(cfg);
    o.set_process_events(events);
    let warmup = Instant::now();
    while warmup.elapsed() < Duration::from_millis(1500) {
        o.poll(&gpu);
        std::thread::sleep(PERIOD);
    }
    let mut ms = Vec::with_capacity(passes);
    for _ in 0..passes {
        let t = Instant::now();
        o.poll(&gpu);
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        std::thread::sleep(PERIOD.saturating_sub(t.elapsed()));
    }
    ms.sort_by(f64::total_cmp);
    let snap = o.snapshot();
    Timing {
        median: percentile(&ms, 0.5),
        p10: percentile(&ms, 0.1),
        p90: percentile(&ms, 0.9),
        threads: snap.threads.len(),
        processes: snap.processes.len(),
        ml_threads: snap.ml_threads().count(),
    }
}

fn cpu_time() -> Duration {
    // SAFETY: getrusage fills the struct we pass.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Decisions go nowhere: what is measured is everything the daemon does
/// per pass but the BPF map syscalls (one per changed decision).
struct NoMap;

impl DecisionSink for NoMap {
    fn write(&self, _: u32, _: u64, _: &Decision) -> Result<(), WriteError> {
        Ok(())
    }
    fn remove(&self, _: u32) {}
}

/// The daemon's loop (GPU refresh, observer pass, rules, phase detection,
/// policy, decision diff), process events on, in the steady state: `warm`
/// unmeasured, then `secs`; returns CPU % of one core.
fn daemon_cpu(cfg: &ObserveConfig, warm: Duration, secs: u64) -> f64 {
    daemon_cpu_warm(cfg, "", warm, secs, true).0
}

/// The daemon's loop for `secs` after 15 passes, with `[policy] script =
/// script` (`""`: none) and the kernel's process events on or off (see
/// [`time_passes_with`]); also returns the script's calls during the
/// measured time.
fn daemon_cpu_events(cfg: &ObserveConfig, script: &str, secs: u64, events: bool) -> (f64, u64) {
    daemon_cpu_warm(cfg, script, PERIOD * 15, secs, events)
}

fn daemon_cpu_warm(cfg: &ObserveConfig, script: &str, warm: Duration, secs: u64, events: bool) -> (f64, u64) {
    let mut config = Config { observe: cfg.clone(), ..Config::default() };
    config.policy.script = script.to_string();
    let calls = |p: &Pipeline| {
        let mut m = scx_zernel::stats::Metrics::default();
        p.fill_metrics(&mut m);
        m.script_calls
    };
    let topo = Topology::read(Path::new("/sys")).unwrap_or_default();
    let mut pipeline = Pipeline::new(config, topo).expect("pipeline");
    pipeline.set_process_events(events);
    let mut decisions = Decisions::default();
    let mut pass = |pipeline: &mut Pipeline| {
        pipeline.pass();
        decisions.apply(&NoMap, pipeline.changed());
    };
    let warm0 = Instant::now();
    while warm0.elapsed() < warm {
        pass(&mut pipeline);
        std::thread::sleep(PERIOD);
    }
    let (wall0, cpu0, calls0) = (Instant::now(), cpu_time(), calls(&pipeline));
    let mut next = Instant::now();
    while wall0.elapsed() < Duration::from_secs(secs) {
        pass(&mut pipeline);
        next += PERIOD;
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    let pct = (cpu_time() - cpu0).as_secs_f64() / wall0.elapsed().as_secs_f64() * 100.0;
    (pct, calls(&pipeline) - calls0)
}

/// The facts of a trainer-like thread, varied by `i`.
fn bench_facts(i: usize, comm: &str) -> ThreadFacts<'_> {
    const ROLES: [ThreadRole; 3] = [ThreadRole::Trainer, ThreadRole::DataLoader, ThreadRole::NonMl];
    const PHASES: [Phase; 3] = [Phase::GpuCompute, Phase::DataLoading, Phase::Unknown];
    ThreadFacts {
        pid: 1000,
        tid: 1000 + i as i32,
        start_ticks: 5,
        comm,
        cmdline: "python -m torch.distributed.run --nproc-per-node 8 train.py --config resnet50.yaml",
        cgroup: "/kubepods/burstable/pod1234/abcd",
        parent_comm: "torchrun",
        uid: 1000,
        gid: 1000,
        ml: true,
        evidence: MlEvidence::ENV_RANK,
        rank: Some((i % 4) as u32),
        local_rank: Some((i % 4) as u32),
        world_size: Some(8),
        role: ROLES[i % 3],
        phase: PHASES[i % 3],
        gpus: &[0, 1],
        node: Some(0),
        tenant: None,
    }
}

/// The cost of one script call and of one cached verdict.
fn script_figures() {
    let builtin =
        Some(Decision { class: Class::Latency, slice_ns: 1_000_000, cpu: -1, node: 0, tenant: -1, preempt: true });
    let mut s = Script::load(Path::new("bench.lua"), SCRIPT, &[], Class::Normal).expect("the bench script loads");
    let n = 20_000;
    for i in 0..1000 {
        s.call(&bench_facts(i, "pt_main_thread"), builtin);
    }
    // CPU time, not wall time: the host may be shared.
    let t0 = cpu_time();
    for i in 0..n {
        std::hint::black_box(s.call(&bench_facts(i, "pt_main_thread"), builtin));
    }
    let per_call = (cpu_time() - t0).as_secs_f64() / n as f64 * 1e6;
    assert_eq!(s.stats().errors, 0, "the bench script failed");
    // Cached: the same 2,000 threads pass after pass.
    let passes = 50;
    for i in 0..2000 {
        s.decide(&bench_facts(i, "pt_main_thread"), builtin);
    }
    let calls0 = s.stats().calls;
    let t0 = cpu_time();
    for _ in 0..passes {
        s.begin_pass();
        for i in 0..2000 {
            std::hint::black_box(s.decide(&bench_facts(i, "pt_main_thread"), builtin));
        }
        s.end_pass();
    }
    let per_cached = (cpu_time() - t0).as_secs_f64() / (passes * 2000) as f64 * 1e6;
    assert_eq!(s.stats().calls, calls0, "unchanged threads called the script");
    println!(
        "policy script: {per_call:.2} us of CPU per call of decide ({n} calls), {per_cached:.3} us per unchanged thread (cached verdict)"
    );
    println!(
        "  at 100 ms passes: 2,000 threads all changing every pass would cost {:.1} % of one core; unchanged, {:.2} %",
        per_call * 2000.0 / 1e5 * 100.0,
        per_cached * 2000.0 / 1e5 * 100.0
    );
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let cpu_only = std::env::args().any(|a| a == "--cpu-only");
    let script_only = std::env::args().any(|a| a == "--script-only");
    let events_only = std::env::args().any(|a| a == "--events-only");
    let counters_only = std::env::args().any(|a| a == "--counters-only");
    let (passes, cpu_secs) = if quick { (20, 3) } else { (50, 30) };
    // The steady state: past the first fallback samples of threads that
    // went quiet together (a second of activity, then at most 125 % of the
    // fallback), then one mean fallback period.
    let fallback = Duration::from_millis(ObserveConfig::default().quiet_sample_interval_ms) * QUIET_FALLBACK_FACTOR;
    let (warm, steady_secs) =
        if quick { (PERIOD * 15, 3) } else { (Duration::from_secs(2) + fallback * 5 / 4, fallback.as_secs()) };
    let cfg = ObserveConfig::default();
    let no_tier = ObserveConfig { quiet_sample_interval_ms: 0, ..ObserveConfig::default() };

    if events_only {
        events_figures(&cfg, passes, cpu_secs);
        return;
    }
    if counters_only {
        counters_figures(&cfg, passes, cpu_secs);
        counters_figures(&no_tier, passes, cpu_secs);
        return;
    }
    if cpu_only {
        cpu_figures(&cfg, &no_tier, warm, steady_secs);
        return;
    }
    script_figures();
    if script_only {
        script_cpu(&cfg, cpu_secs);
        return;
    }
    pass_times(&cfg, &no_tier, passes);
    cpu_figures(&cfg, &no_tier, warm, steady_secs);
    script_cpu(&cfg, cpu_secs);
    events_figures(&cfg, passes, cpu_secs);
    counters_figures(&cfg, passes, cpu_secs);
    counters_figures(&no_tier, passes, cpu_secs);
}

/// Pass time and the daemon loop's CPU (process events on, as attached)
/// with ML threads' counters from the kernel's task iterator and from
/// /proc, alternating, for no workload and 2,000 threads.
fn counters_figures(cfg: &ObserveConfig, passes: usize, cpu_secs: u64) {
    let kernel = ObserveConfig { thread_counters: ThreadCounters::Kernel, ..cfg.clone() };
    let proc = ObserveConfig { thread_counters: ThreadCounters::Proc, ..cfg.clone() };
    let have_iter = Observer::new(&kernel).thread_counters() == ThreadCounters::Kernel;
    println!(
        "\nthread counters: kernel task iterator vs /proc (process events on{}), {passes} passes, {cpu_secs} s at 100 ms{}",
        if cfg.quiet_sample_interval_ms == 0 { ", no quiet tier: every thread sampled every pass" } else { "" },
        if have_iter { "" } else { " -- NO TASK ITERATOR HERE (not root?): both rows are /proc" }
    );
    println!(
        "{:<34} {:>12} {:>12} {:>10} {:>10} {:>8}",
        "case", "pass kernel", "pass /proc", "CPU kernel", "CPU /proc", "ratio"
    );
    if have_iter {
        // The read alone: every thread's record, as a pass gets it (one
        // read per 100 ms: the threads' task structs are out of the cache
        // by then, which is most of the cost; back to back as well).
        let w = spawn(2000, true);
        let it = TaskIter::load().expect("loaded above");
        let link = it.attach(w.0.id() as i32).expect("attaching to the workload");
        let (mut buf, mut recs) = (Vec::new(), Vec::new());
        taskiter::read(&link, &mut buf, &mut recs).expect("reading");
        let reads = 30;
        for spaced in [true, false] {
            let mut cpu = Duration::ZERO;
            for _ in 0..reads {
                if spaced {
                    std::thread::sleep(PERIOD);
                }
                let c0 = cpu_time();
                taskiter::read(&link, &mut buf, &mut recs).expect("reading");
                cpu += cpu_time() - c0;
            }
            let cpu = cpu.as_secs_f64() / reads as f64;
            println!(
                "task iterator read of {} threads, {}: {:.0} us of CPU per read ({:.0} ns per thread)",
                recs.len(),
                if spaced { "one per 100 ms (as the daemon reads)" } else { "back to back" },
                cpu * 1e6,
                cpu * 1e9 / recs.len() as f64
            );
        }
    }
    for (name, n, ml) in [
        ("host baseline (no workload)", 0, false),
        ("(g) ML process, 2000 threads", 2000, true),
        ("(h) non-ML process, 2000 threads", 2000, false),
    ] {
        let _w = (n > 0).then(|| spawn(n, ml));
        std::thread::sleep(Duration::from_millis(300));
        let (pk, pp) = (time_passes_with(&kernel, passes, true), time_passes_with(&proc, passes, true));
        if ml {
            assert!(
                pk.ml_threads > n && pp.ml_threads > n,
                "the workload should be ML: {} / {}",
                pk.ml_threads,
                pp.ml_threads
            );
        }
        // Alternated, twice each: the host's load moves.
        let mut ck = Vec::new();
        let mut cp = Vec::new();
        for _ in 0..2 {
            ck.push(daemon_cpu_events(&kernel, "", cpu_secs / 2, true).0);
            cp.push(daemon_cpu_events(&proc, "", cpu_secs / 2, true).0);
        }
        let (ck, cp) = (ck.iter().sum::<f64>() / 2.0, cp.iter().sum::<f64>() / 2.0);
        println!("{name:<34} {:>10.3}ms {:>10.3}ms {ck:>8.2} % {cp:>8.2} % {:>8.2}", pk.median, pp.median, ck / cp);
    }
}

fn pass_times(cfg: &ObserveConfig, no_tier: &ObserveConfig, passes: usize) {
    let base = time_passes(cfg, passes);
    println!(
        "observer pass time, {passes} passes at 100 ms (host without workload: {} processes, {} threads)",
        base.processes, base.threads
    );
    println!("{:<34} {:>7} {:>8} {:>8} {:>8} {:>16}", "case", "threads", "median", "p10", "p90", "per 1000 thr");
    let row = |name: &str, n: usize, t: &Timing| {
        let per_k = if n == 0 { f64::NAN } else { (t.median - base.median) / n as f64 * 1000.0 };
        println!("{name:<34} {n:>7} {:>6.3}ms {:>6.3}ms {:>6.3}ms {:>14.3}ms", t.median, t.p10, t.p90, per_k);
    };
    row("host baseline", 0, &base);
    for n in [1000, 2000] {
        for (name, ml, c) in [
            ("(a) ML process", true, cfg),
            ("(a') ML process, no quiet tier", true, no_tier),
            ("(b) non-ML process", false, cfg),
        ] {
            let _w = spawn(n, ml);
            std::thread::sleep(Duration::from_millis(300));
            let t = time_passes(c, passes);
            if ml {
                assert!(t.ml_threads > n, "the workload should be ML: {} ML threads", t.ml_threads);
            }
            row(name, n, &t);
        }
    }
}

fn cpu_figures(cfg: &ObserveConfig, no_tier: &ObserveConfig, warm: Duration, secs: u64) {
    println!(
        "\ndaemon CPU without the BPF map writes (GPU refresh, pass, rules, phases, policy, decision diff), process events on, {secs} s at 100 ms after {} s",
        warm.as_secs()
    );
    for (name, ml, c) in [
        ("(a) ML process, 2000 threads", true, cfg),
        ("(a') ML, no quiet tier, 2000 threads", true, no_tier),
        ("(b) non-ML process, 2000 threads", false, cfg),
    ] {
        let _w = spawn(2000, ml);
        std::thread::sleep(Duration::from_millis(300));
        println!("{name:<40} {:>6.2} % of one core", daemon_cpu(c, warm, secs));
    }
    println!("host baseline (no workload)               {:>6.2} % of one core", daemon_cpu(cfg, warm, secs));
}

/// Pass time and the daemon loop's CPU with 2,000 threads and no new
/// processes, with /proc listed whenever /proc/loadavg moved (as `observe`
/// does) and with the kernel's process events (as the attached daemon does).
fn events_figures(cfg: &ObserveConfig, passes: usize, cpu_secs: u64) {
    println!(
        "
process events: /proc listed when loadavg moved (off) vs every 5 rescan intervals (on), {passes} passes, {cpu_secs} s"
    );
    for (name, ml) in [("(e) ML process, 2000 threads", true), ("(f) non-ML process, 2000 threads", false)] {
        let _w = spawn(2000, ml);
        std::thread::sleep(Duration::from_millis(300));
        let (off, on) = (time_passes_with(cfg, passes, false), time_passes_with(cfg, passes, true));
        let (cpu_off, _) = daemon_cpu_events(cfg, "", cpu_secs, false);
        let (cpu_on, _) = daemon_cpu_events(cfg, "", cpu_secs, true);
        println!(
            "{name:<34} pass median {:.3} ms off, {:.3} ms on; CPU {cpu_off:.2} % off, {cpu_on:.2} % on",
            off.median, on.median
        );
    }
}

/// The daemon loop's CPU with the policy script and 2,000 threads, with the
/// kernel's process events on (as the attached daemon runs).
fn script_cpu(cfg: &ObserveConfig, cpu_secs: u64) {
    let path = std::env::temp_dir().join(format!("zernel-bench-policy-{}.lua", std::process::id()));
    std::fs::write(&path, SCRIPT).expect("writing the bench script");
    let script = path.display().to_string();
    println!("\ndaemon CPU with [policy] script (the same loop, process events on), {cpu_secs} s at 100 ms");
    for (name, ml) in [("(c) ML process, 2000 threads", true), ("(d) non-ML process, 2000 threads", false)] {
        let _w = spawn(2000, ml);
        std::thread::sleep(Duration::from_millis(300));
        let (without, _) = daemon_cpu_events(cfg, "", cpu_secs, true);
        let (pct, calls) = daemon_cpu_events(cfg, &script, cpu_secs, true);
        println!(
            "{name:<40} {pct:>6.2} % of one core with the script, {without:>6.2} % without ({calls} script calls while measured)"
        );
    }
    let _ = std::fs::remove_file(&path);
}
