//! `scx_zernel observe`: the daemon's pipeline with nothing attached. It
//! shows, for every ML process and thread, its role, its phase and the
//! decision the daemon would write to the task_class map. Runs on any
//! Linux, without sched_ext and without root (what it cannot read in /proc
//! it skips, as the daemon does).
//!
//! ```text
//!   every phase.loop_interval_ms:        Pipeline::pass  (observe ─> rules ─> phase ─> policy)
//!   every --interval-ms:                 collect ─> PassView ─┬─> text table (cleared on a terminal)
//!                                                             └─> one JSON object a line (--json)
//! ```
//!
//! The pipeline runs at the configured period whatever `--interval-ms` is,
//! so the phases and decisions shown are the ones the daemon would reach;
//! `--interval-ms` only sets how often they are shown.
//!
//! Listed: every ML process, with its threads that have a phase, a decision
//! or a rule match (all its threads with `--all`); and threads of other
//! processes that a rule matches or the policy script (`[policy] script`)
//! decided on or failed for. Plain threads are not listed. With a script,
//! a SCRIPT column shows its verdict per thread: `keep` (nil: the built-in
//! decision), `set` (its table), `none` (false: no decision), `error` or
//! `budget` (the call failed: the built-in decision), so that a policy can
//! be tried on any machine before it is deployed.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::io::{IsTerminal, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Result};
use serde::Serialize;
use tracing::warn;

use crate::class::Class;
use crate::config::Config;
use crate::phase::Phase;
use crate::pipeline::{until_next_pass, Pipeline};
use crate::policy::Decision;
use crate::stats::Metrics;
use crate::topology::{Topology, SYSFS_ROOT};

/// Options of `scx_zernel observe`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Options {
    /// Show the table every MS milliseconds [default: phase.loop_interval_ms].
    /// Detection itself always runs at phase.loop_interval_ms.
    #[arg(long, value_name = "MS")]
    pub interval_ms: Option<u64>,

    /// Exit after showing N passes [default: run until SIGINT].
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,

    /// Also list the threads of ML processes that are in no phase.
    #[arg(long)]
    pub all: bool,

    /// One JSON object per pass, one a line, instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// The decision a thread would get, as the kernel would apply it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DecisionView {
    pub class: Class,
    /// The effective slice (the class's default when the decision has none).
    pub slice_us: u64,
    pub cpu: Option<i32>,
    pub node: Option<i32>,
    pub preempt: bool,
}

/// The rule a thread matched.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RuleView {
    /// Position of the rule in the config file, from 0.
    pub index: usize,
    pub name: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ThreadRow {
    pub tid: i32,
    pub comm: String,
    pub role: &'static str,
    pub phase: &'static str,
    pub rule: Option<RuleView>,
    pub decision: Option<DecisionView>,
    /// The policy script's verdict (keep, set, none, error, budget); None without a script.
    pub script: Option<&'static str>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProcessRow {
    pub pid: i32,
    pub ppid: i32,
    pub comm: String,
    pub ml: bool,
    /// Why it is ML (evidence names, e.g. "env_rank", "parent").
    pub evidence: Vec<&'static str>,
    /// A DataLoader worker process.
    pub loader: bool,
    pub gpus: Vec<u32>,
    /// The process's GPU utilisation (its own samples, else its devices'), when known.
    pub gpu_util_pct: Option<u32>,
    pub threads: Vec<ThreadRow>,
}

/// One shown pass.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PassView {
    /// Shown passes, from 1.
    pub pass: u64,
    /// Pipeline passes since start (several per shown pass with a longer --interval-ms).
    pub seq: u64,
    /// Seconds since the Unix epoch.
    pub time: f64,
    pub threads: u64,
    pub ml_threads: u64,
    /// ML threads in each phase (all of them, listed or not).
    pub phases: BTreeMap<&'static str, u64>,
    pub observe_pass_us: u64,
    /// The policy script in force, if any.
    pub script: Option<ScriptView>,
    pub processes: Vec<ProcessRow>,
}

/// The policy script and its counters since start.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScriptView {
    pub path: String,
    pub calls: u64,
    pub errors: u64,
    pub budget_exceeded: u64,
}

/// What to list from one pipeline pass.
pub fn collect(pipeline: &Pipeline, all: bool) -> PassView {
    let (snap, decided) = (pipeline.snapshot(), pipeline.decisions());
    let decisions: HashMap<u32, &Decision> = decided.map(|(tid, _, d)| (tid, d)).collect();
    let slices = &pipeline.cfg.scheduler.slice_us;
    let mut m = Metrics::default();
    pipeline.fill_metrics(&mut m);
    let mut processes: Vec<ProcessRow> = Vec::new();
    let mut index_of: HashMap<usize, usize> = HashMap::new();
    for (i, p) in snap.processes.iter().enumerate() {
        if p.ml {
            index_of.insert(i, processes.len());
            processes.push(process_row(p));
        }
    }
    for t in &snap.threads {
        let tid = t.tid as u32;
        let phase = pipeline.phase(t.tid);
        let rule = pipeline.rule_match(tid);
        let decision = decisions.get(&tid);
        let verdict = pipeline.script_verdict(tid);
        let shown = rule.is_some()
            || verdict.is_some_and(|v| v != crate::policy_script::Verdict::Keep)
            || (t.ml && (all || phase != Phase::Unknown || decision.is_some()));
        if !shown {
            continue;
        }
        let row = ThreadRow {
            tid: t.tid,
            comm: t.comm.to_string(),
            role: t.role.as_str(),
            phase: phase.as_str(),
            rule: rule.map(|r| RuleView {
                index: r.index,
                name: pipeline.cfg.rules.get(r.index).and_then(|c| c.name.clone()),
            }),
            decision: decision.map(|d| DecisionView {
                class: d.class,
                slice_us: if d.slice_ns == 0 { slices.get(d.class) } else { d.slice_ns / 1000 },
                cpu: (d.cpu >= 0).then_some(d.cpu),
                node: (d.node >= 0).then_some(d.node),
                preempt: d.preempt,
            }),
            script: verdict.map(crate::policy_script::Verdict::as_str),
        };
        let at = *index_of.entry(t.proc_index).or_insert_with(|| {
            processes.push(process_row(snap.process_of(t)));
            processes.len() - 1
        });
        processes[at].threads.push(row);
    }
    processes.sort_by_key(|p| p.pid);
    PassView {
        pass: 0,
        seq: snap.seq,
        time: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64()),
        threads: m.threads,
        ml_threads: m.ml_threads,
        phases: BTreeMap::from([
            (Phase::DataLoading.as_str(), m.phase_data_loading),
            (Phase::GpuCompute.as_str(), m.phase_gpu_compute),
            (Phase::NcclCollective.as_str(), m.phase_nccl_collective),
            (Phase::OptimizerStep.as_str(), m.phase_optimizer_step),
        ]),
        observe_pass_us: m.observe_pass_us,
        script: pipeline.script().map(|s| ScriptView {
            path: s.path().display().to_string(),
            calls: m.script_calls,
            errors: m.script_errors,
            budget_exceeded: m.script_budget_exceeded,
        }),
        processes,
    }
}

fn process_row(p: &crate::observe::ProcessView) -> ProcessRow {
    ProcessRow {
        pid: p.pid,
        ppid: p.ppid,
        comm: p.comm.to_string(),
        ml: p.ml,
        evidence: p.evidence.names(),
        loader: p.loader_process,
        gpus: p.gpu.devices.to_vec(),
        gpu_util_pct: p.gpu.util_pct,
        threads: Vec::new(),
    }
}

/// Local wall-clock time as HH:MM:SS.
fn clock(unix_secs: f64) -> String {
    let t = unix_secs as libc::time_t;
    // SAFETY: localtime_r writes only into `tm`.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    if unsafe { libc::localtime_r(&t, &mut tm) }.is_null() {
        return format!("{unix_secs:.0}");
    }
    format!("{:02}:{:02}:{:02}", tm.tm_hour, tm.tm_min, tm.tm_sec)
}

fn dash<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_string(), |v| v.to_string())
}

/// The table of one pass.
pub(crate) fn render_text(v: &PassView, every_ms: u64) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "scx_zernel observe: pass {} at {} (every {every_ms} ms; nothing attached, decisions are what the daemon would write)",
        v.pass,
        clock(v.time)
    );
    let phases: Vec<String> = v.phases.iter().map(|(k, n)| format!("{k} {n}")).collect();
    let _ = writeln!(
        s,
        "threads {}  ML threads {}  phases: {}  observe pass {} us",
        v.threads,
        v.ml_threads,
        phases.join("  "),
        v.observe_pass_us
    );
    if let Some(sv) = &v.script {
        let _ = writeln!(
            s,
            "policy script {}: {} calls, {} failed ({} over the instruction budget)",
            sv.path, sv.calls, sv.errors, sv.budget_exceeded
        );
    }
    s.push('\n');
    if v.processes.is_empty() {
        s.push_str("no ML processes and no rule matches\n");
        return s;
    }
    // The SCRIPT column, with a script only.
    let script_col = |verdict: &str| if v.script.is_some() { format!("{verdict:<6} ") } else { String::new() };
    let _ = writeln!(
        s,
        "{:>7} {:>7}  {:<16} {:<14} {:<16} {:<8} {:>8} {:>4} {:>4} {:<7} {}RULE",
        "PID",
        "TID",
        "COMM",
        "ROLE",
        "PHASE",
        "CLASS",
        "SLICE_US",
        "CPU",
        "NODE",
        "PREEMPT",
        script_col("SCRIPT")
    );
    for p in &v.processes {
        let mut what = if p.ml { format!("ML ({})", p.evidence.join(",")) } else { "not ML".to_string() };
        if p.loader {
            what.push_str(", DataLoader worker");
        }
        if !p.gpus.is_empty() {
            let gpus: Vec<String> = p.gpus.iter().map(u32::to_string).collect();
            let _ = write!(what, ", GPU {}", gpus.join(","));
        }
        if let Some(u) = p.gpu_util_pct {
            let _ = write!(what, " at {u}%");
        }
        let _ = writeln!(s, "{:>7} {:>7}  {:<16} {what}", p.pid, "", p.comm);
        for t in &p.threads {
            let (class, slice, cpu, node, preempt) = match &t.decision {
                Some(d) => (
                    d.class.name().to_string(),
                    d.slice_us.to_string(),
                    dash(d.cpu),
                    dash(d.node),
                    if d.preempt { "yes" } else { "no" },
                ),
                None => ("-".into(), "-".into(), "-".into(), "-".into(), "-"),
            };
            let rule = match &t.rule {
                Some(r) => r.name.clone().unwrap_or_else(|| format!("#{}", r.index)),
                None => "-".into(),
            };
            let _ = writeln!(
                s,
                "{:>7} {:>7}  {:<16} {:<14} {:<16} {:<8} {:>8} {:>4} {:>4} {:<7} {}{rule}",
                "",
                t.tid,
                t.comm,
                t.role,
                t.phase,
                class,
                slice,
                cpu,
                node,
                preempt,
                script_col(t.script.unwrap_or("-"))
            );
        }
    }
    s
}

/// Runs passes until `opts.count` passes were shown or `shutdown` is set.
pub fn run(cfg: Config, opts: &Options, shutdown: &AtomicBool) -> Result<()> {
    let period = Duration::from_millis(cfg.phase.loop_interval_ms);
    let every = match opts.interval_ms {
        Some(0) => bail!("--interval-ms must be at least 1"),
        Some(ms) => Duration::from_millis(ms),
        None => period,
    };
    let mut topo = Topology::read(Path::new(SYSFS_ROOT)).unwrap_or_else(|e| {
        warn!("cannot read the CPU topology from /sys ({e:#}); NUMA nodes will not be shown");
        Topology::default()
    });
    topo.apply_config(&cfg.topology).map_err(anyhow::Error::msg)?;
    let mut pipeline = Pipeline::new(cfg, topo)?;
    let clear = !opts.json && std::io::stdout().is_terminal();

    let mut shown = 0u64;
    let mut next_show = Instant::now();
    while !shutdown.load(Ordering::Relaxed) {
        let started = Instant::now();
        pipeline.pass();
        if started >= next_show {
            next_show = (next_show + every).max(started);
            shown += 1;
            let mut view = collect(&pipeline, opts.all);
            view.pass = shown;
            let mut text = if opts.json {
                serde_json::to_string(&view)? + "\n"
            } else {
                render_text(&view, every.as_millis() as u64)
            };
            if clear {
                text.insert_str(0, "\x1b[H\x1b[2J");
            } else if !opts.json && shown > 1 {
                text.insert(0, '\n');
            }
            let mut out = std::io::stdout().lock();
            match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
                Ok(()) => {}
                // The reader went away (`| head`): done.
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
                Err(e) => return Err(e.into()),
            }
            if opts.count.is_some_and(|n| shown >= n) {
                return Ok(());
            }
        }
        // Sleep to the next pass, waking for SIGINT.
        until_next_pass(started, period, shutdown, |left| {
            if left.is_zero() {
                return Ok::<_, std::convert::Infallible>(false);
            }
            std::thread::sleep(left.min(Duration::from_millis(50)));
            Ok(true)
        })
        .unwrap_or_else(|e| match e {});
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view() -> PassView {
        PassView {
            pass: 3,
            seq: 3,
            time: 0.0,
            threads: 100,
            ml_threads: 4,
            phases: BTreeMap::from([("data_loading", 1), ("gpu_compute", 1)]),
            observe_pass_us: 250,
            script: None,
            processes: vec![
                ProcessRow {
                    pid: 10,
                    ppid: 1,
                    comm: "python".into(),
                    ml: true,
                    evidence: vec!["env_rank"],
                    loader: false,
                    gpus: vec![0],
                    gpu_util_pct: Some(87),
                    threads: vec![ThreadRow {
                        tid: 10,
                        comm: "pt_main_thread".into(),
                        role: "trainer",
                        phase: "gpu_compute",
                        rule: None,
                        decision: Some(DecisionView {
                            class: Class::Latency,
                            slice_us: 1000,
                            cpu: None,
                            node: Some(0),
                            preempt: true,
                        }),
                        script: None,
                    }],
                },
                ProcessRow {
                    pid: 20,
                    ppid: 1,
                    comm: "backup".into(),
                    ml: false,
                    evidence: vec![],
                    loader: false,
                    gpus: vec![],
                    gpu_util_pct: None,
                    threads: vec![ThreadRow {
                        tid: 21,
                        comm: "backup".into(),
                        role: "non_ml",
                        phase: "unknown",
                        rule: Some(RuleView { index: 0, name: Some("backups".into()) }),
                        decision: Some(DecisionView {
                            class: Class::Batch,
                            slice_us: 8000,
                            cpu: Some(3),
                            node: None,
                            preempt: false,
                        }),
                        script: None,
                    }],
                },
            ],
        }
    }

    #[test]
    fn table_has_header_and_aligned_rows() {
        let text = render_text(&view(), 100);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("scx_zernel observe: pass 3 at "), "{text}");
        assert!(lines[1].contains("ML threads 4") && lines[1].contains("gpu_compute 1"), "{text}");
        let header = lines.iter().position(|l| l.trim_start().starts_with("PID")).unwrap();
        let col = |name: &str| lines[header].find(name).unwrap();
        let trainer = lines.iter().find(|l| l.contains("pt_main_thread")).unwrap();
        assert_eq!(trainer.find("trainer"), Some(col("ROLE")), "{text}");
        assert_eq!(trainer.find("gpu_compute"), Some(col("PHASE")), "{text}");
        assert_eq!(trainer.find("latency"), Some(col("CLASS")), "{text}");
        assert!(trainer.ends_with("yes     -"), "{trainer:?}");
        assert!(text.contains("ML (env_rank), GPU 0 at 87%"), "{text}");
        let backup = lines.iter().find(|l| l.contains("non_ml")).unwrap();
        assert!(backup.contains("batch") && backup.ends_with("backups"), "{backup:?}");
        assert!(text.contains("not ML"), "{text}");
        assert!(!text.contains('\x1b'));
    }

    #[test]
    fn json_is_one_line_with_null_for_none() {
        let json = serde_json::to_string(&view()).unwrap();
        assert!(!json.contains('\n'));
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        let t = &v["processes"][0]["threads"][0];
        assert_eq!(t["role"], "trainer");
        assert_eq!(t["phase"], "gpu_compute");
        assert_eq!(t["decision"]["class"], "latency");
        assert_eq!(t["decision"]["cpu"], serde_json::Value::Null);
        assert_eq!(v["processes"][0]["gpu_util_pct"], 87);
        assert_eq!(v["processes"][1]["gpu_util_pct"], serde_json::Value::Null);
        assert_eq!(v["processes"][1]["threads"][0]["rule"]["name"], "backups");
    }

    #[test]
    fn a_script_adds_its_counters_and_a_verdict_column() {
        let mut v = view();
        assert!(!render_text(&v, 100).contains("SCRIPT"));
        v.script = Some(ScriptView { path: "/etc/p.lua".into(), calls: 5, errors: 1, budget_exceeded: 1 });
        v.processes[1].threads[0].script = Some("set");
        let text = render_text(&v, 100);
        assert!(text.contains("policy script /etc/p.lua: 5 calls, 1 failed (1 over the instruction budget)"), "{text}");
        let lines: Vec<&str> = text.lines().collect();
        let header = lines.iter().find(|l| l.trim_start().starts_with("PID")).unwrap();
        let backup = lines.iter().find(|l| l.contains("non_ml")).unwrap();
        assert_eq!(backup.find("set"), header.find("SCRIPT"), "{text}");
        let trainer = lines.iter().find(|l| l.contains("pt_main_thread")).unwrap();
        assert!(trainer.ends_with("yes     -      -"), "{trainer:?}");
        let json: serde_json::Value = serde_json::to_value(&v).unwrap();
        assert_eq!(json["processes"][1]["threads"][0]["script"], "set");
        assert_eq!(json["script"]["calls"], 5);
    }

    #[test]
    fn empty_pass_says_so() {
        let mut v = view();
        v.processes.clear();
        assert!(render_text(&v, 100).contains("no ML processes"));
    }
}
