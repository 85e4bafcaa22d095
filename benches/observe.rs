//! Observer benchmark: pass time and daemon CPU with large thread counts.
//!
//! For N in 1000 and 2000 it starts `zernel-workload threads --count N`
//! (threads waking every second for a few µs), as an ML process (rank
//! environment) and as a plain one, and times 50 observer passes at the
//! daemon's 100 ms period: median, p10, p90 of the whole pass, and the
//! median minus that of the same host without the workload, per 1000
//! threads. Then it runs the daemon's loop (GPU refresh, observer pass,
//! rules, phase detection, policy, decision diff: all but the BPF map
//! writes) for 30 s at 100 ms with 2000 threads (long enough to include
//! the quiet threads' fallback samples, every 15-25 s) and reports the
//! process's CPU time (getrusage) as a percentage of one core.
//!
//! `cargo bench --bench observe` (add `-- --quick` for 20 passes and 3 s,
//! `-- --cpu-only` for the CPU figures alone).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use std::path::Path;

use scx_zernel::config::Config;
use scx_zernel::daemon::{DecisionSink, Decisions, Pipeline};
use scx_zernel::gpu::NoGpu;
use scx_zernel::observe::{ObserveConfig, Observer};
use scx_zernel::policy::Decision;
use scx_zernel::sched::WriteError;
use scx_zernel::topology::Topology;

const PERIOD: Duration = Duration::from_millis(100);

struct Workload(Child);

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(n: usize, ml: bool) -> Workload {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_zernel-workload"));
    cmd.args(["threads", "--count", &n.to_string(), "--secs", "600"]);
    if ml {
        cmd.arg("--ml");
    } else {
        cmd.env_remove("RANK")
            .env_remove("LOCAL_RANK")
            .env_remove("WORLD_SIZE")
            .env_remove("CUDA_VISIBLE_DEVICES");
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting zernel-workload");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("piped"))
        .read_line(&mut line)
        .expect("reading the ready line");
    assert!(
        line.starts_with("zernel-workload threads ready"),
        "unexpected: {line}"
    );
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
    let gpu = NoGpu;
    let mut o = Observer::new(cfg);
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

/// The daemon's loop for `secs` (GPU refresh, observer pass, rules, phase
/// detection, policy, decision diff); returns CPU % of one core.
fn daemon_cpu(cfg: &ObserveConfig, secs: u64) -> f64 {
    let config = Config {
        observe: cfg.clone(),
        ..Config::default()
    };
    let topo = Topology::read(Path::new("/sys")).unwrap_or_default();
    let mut pipeline = Pipeline::new(config, topo).expect("pipeline");
    let mut decisions = Decisions::default();
    let mut pass = |pipeline: &mut Pipeline| {
        pipeline.pass();
        decisions.apply(&NoMap, pipeline.decisions());
    };
    for _ in 0..15 {
        pass(&mut pipeline);
        std::thread::sleep(PERIOD);
    }
    let (wall0, cpu0) = (Instant::now(), cpu_time());
    let mut next = Instant::now();
    while wall0.elapsed() < Duration::from_secs(secs) {
        pass(&mut pipeline);
        next += PERIOD;
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    (cpu_time() - cpu0).as_secs_f64() / wall0.elapsed().as_secs_f64() * 100.0
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let cpu_only = std::env::args().any(|a| a == "--cpu-only");
    let (passes, cpu_secs) = if quick { (20, 3) } else { (50, 30) };
    let cfg = ObserveConfig::default();
    let no_tier = ObserveConfig {
        quiet_sample_interval_ms: 0,
        ..ObserveConfig::default()
    };

    if !cpu_only {
        pass_times(&cfg, &no_tier, passes);
    }
    cpu_figures(&cfg, &no_tier, cpu_secs);
}

fn pass_times(cfg: &ObserveConfig, no_tier: &ObserveConfig, passes: usize) {
    let base = time_passes(cfg, passes);
    println!(
        "observer pass time, {passes} passes at 100 ms (host without workload: {} processes, {} threads)",
        base.processes, base.threads
    );
    println!(
        "{:<34} {:>7} {:>8} {:>8} {:>8} {:>16}",
        "case", "threads", "median", "p10", "p90", "per 1000 thr"
    );
    let row = |name: &str, n: usize, t: &Timing| {
        let per_k = if n == 0 {
            f64::NAN
        } else {
            (t.median - base.median) / n as f64 * 1000.0
        };
        println!(
            "{name:<34} {n:>7} {:>6.3}ms {:>6.3}ms {:>6.3}ms {:>14.3}ms",
            t.median, t.p10, t.p90, per_k
        );
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
                assert!(
                    t.ml_threads > n,
                    "the workload should be ML: {} ML threads",
                    t.ml_threads
                );
            }
            row(name, n, &t);
        }
    }
}

fn cpu_figures(cfg: &ObserveConfig, no_tier: &ObserveConfig, cpu_secs: u64) {
    println!("\ndaemon CPU without the BPF map writes (GPU refresh, pass, rules, phases, policy, decision diff), {cpu_secs} s at 100 ms");
    for (name, ml, c) in [
        ("(a) ML process, 2000 threads", true, cfg),
        ("(a') ML, no quiet tier, 2000 threads", true, no_tier),
        ("(b) non-ML process, 2000 threads", false, cfg),
    ] {
        let _w = spawn(2000, ml);
        std::thread::sleep(Duration::from_millis(300));
        println!("{name:<40} {:>6.2} % of one core", daemon_cpu(c, cpu_secs));
    }
    println!(
        "host baseline (no workload)               {:>6.2} % of one core",
        daemon_cpu(cfg, cpu_secs)
    );
}
