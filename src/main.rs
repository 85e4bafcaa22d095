//! scx_zernel: command line, logging and the restart loop. The work is in
//! the library (src/lib.rs and its modules).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use scx_zernel::config::{Mode, Source};
use scx_zernel::daemon;
use scx_zernel::logging::{self, LogFormat};
use scx_zernel::sched::LoadOptions;
use scx_zernel::{inspect, observe_cmd, stats};

/// scx_zernel: an ML-aware sched_ext scheduler.
///
/// It watches the threads of training and inference jobs (DataLoader workers,
/// the thread launching GPU kernels, NCCL progress threads, the optimizer
/// step), detects the phase each one is in, and tells the kernel how to
/// schedule it: a class (latency, ml, normal, batch), a slice, a preferred
/// CPU and NUMA node, and whether its wakeups may preempt lower classes.
/// Other tasks keep running in the normal class; no class is ever starved
/// for longer than scheduler.starvation_bound_ms.
///
/// Needs Linux 6.12+ with CONFIG_SCHED_CLASS_EXT=y, and root. Without
/// --config the built-in defaults apply (print them with --dump-config).
/// SIGHUP or an edit of the config file reloads rules and policy without
/// detaching; an invalid new file is rejected and the old one stays.
///
/// Policy logic beyond rules and the phase table: `[policy] script =
/// "FILE.lua"`, a Lua 5.4 function decide(t) given a thread's facts (pid,
/// comm, cmdline, cgroup, uid, ML evidence, role, phase, GPUs, node,
/// tenant) that returns a decision or nil; run only when those facts
/// change, sandboxed (no io, os, require; a memory cap and an instruction
/// budget per call), reloaded with the config or an edit of the script.
///
/// Operating it: --stats prints the statistics while running, --monitor
/// SECS prints those of a running instance (from another shell, attaching
/// nothing), --metrics-addr serves them to Prometheus, --help-stats
/// describes each one. `scx_zernel observe` shows, without root or
/// sched_ext, which threads it would treat as ML, their phases and the
/// decisions it would make.
#[derive(Debug, Parser)]
#[command(version, about, long_about)]
struct Cli {
    /// Configuration file (TOML). Every key is documented in
    /// configs/zernel.toml; unknown keys are errors. As root, a file
    /// writable by group or others, or in a directory they can write without
    /// the sticky bit, is refused; one owned by the user who ran sudo is
    /// accepted with a warning, any other non-root owner refused; the same
    /// holds for its policy.script.
    #[arg(short, long, global = true, value_name = "PATH")]
    config: Option<PathBuf>,

    /// Preset for scx_loader modes, on top of the config. auto = the config
    /// as is; lowlatency = half slices and a starvation bound of at most
    /// 20 ms; gaming = the same with wakeup_preempt_us doubled (a thread
    /// with bursts of a few ms, a frame, is cut short as a hog less often);
    /// server = double slices; powersave = double slices and no wakeup
    /// preemption (wakeup_preempt_us = 0).
    #[arg(long, value_enum, default_value_t = Mode::Auto)]
    mode: Mode,

    /// Print statistics every SECS seconds while running: counters as what
    /// they counted since the last line, gauges as they are.
    #[arg(long, value_name = "SECS")]
    stats: Option<f64>,

    /// Print the statistics of the running scheduler every SECS seconds and
    /// exit on SIGINT: counters as what they counted since the last line
    /// (the stats server's deltas), gauges as they are. A client only:
    /// attaches nothing, waits for the scheduler if it is not running yet.
    #[arg(long, value_name = "SECS")]
    monitor: Option<f64>,

    /// Describe every statistic (name, type, meaning) and exit.
    #[arg(long)]
    help_stats: bool,

    /// Serve OpenMetrics 1.0.0 at http://ADDR/metrics (e.g.
    /// 127.0.0.1:9093), or the Prometheus 0.0.4 text when the Accept header
    /// prefers text/plain; off by default. Counters are named
    /// zernel_<stat>_total, levels zernel_<stat> (see --help-stats).
    #[arg(long, value_name = "ADDR")]
    metrics_addr: Option<SocketAddr>,

    /// What to log: a level (error, warn, info, debug, trace, off) or
    /// RUST_LOG-style directives, e.g. `scx_zernel::daemon=debug,info`.
    /// Without it RUST_LOG is used, and without that `info`. At debug, lines
    /// from the loop carry their span: pass{n=..}, and the stage (reload,
    /// observe, write).
    #[arg(long, value_name = "FILTER")]
    log_level: Option<String>,

    /// Log lines as text (`LEVEL span: message`) or as JSON objects, one a
    /// line (timestamp, level, target, fields, spans), for log collectors.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, value_name = "FORMAT")]
    log_format: LogFormat,

    /// Print the effective configuration (defaults merged with --config and
    /// --mode) as TOML and exit.
    #[arg(long)]
    dump_config: bool,

    /// Bytes of the kernel's debug dump (the tasks and queues at the moment
    /// the BPF scheduler exits on an error) to print; 0 = the kernel's
    /// default.
    #[arg(long, default_value_t = 0, value_name = "BYTES")]
    exit_dump_len: u32,

    /// libbpf open options (as the scx schedulers take them).
    #[command(flatten, next_help_heading = "libbpf options")]
    libbpf: scx_utils::libbpf_clap_opts::LibbpfOpts,

    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Read the counters and decisions of the running scheduler (from its
    /// pinned maps; needs root).
    Inspect {
        /// Show the decision the kernel holds for this thread instead.
        #[arg(long, conflicts_with = "entries")]
        tid: Option<u32>,
        /// List every decision the kernel holds, one thread a line.
        #[arg(long)]
        entries: bool,
    },
    /// Show what the scheduler would do, attaching nothing (no root needed).
    ///
    /// Lists every ML process and thread with its role, its phase and the
    /// decision it would get (class, slice, CPU, node, preempt), plus the
    /// threads of other processes that rules match. Runs on any Linux, with
    /// or without sched_ext; what it cannot read in /proc it skips.
    Observe(observe_cmd::Options),
}

/// A flag set on SIGINT and SIGTERM.
fn shutdown_flag() -> anyhow::Result<Arc<AtomicBool>> {
    let shutdown = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, shutdown.clone())
            .map_err(|e| anyhow::anyhow!("cannot install the signal handler: {e}"))?;
    }
    Ok(shutdown)
}

fn main() -> ExitCode {
    let cli = match Cli::from_arg_matches(&Cli::command().version(daemon::version()).get_matches()) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let rust_log = std::env::var("RUST_LOG").ok();
    if let Err(e) =
        logging::filter(cli.log_level.as_deref(), rust_log.as_deref()).and_then(|f| logging::init(f, cli.log_format))
    {
        eprintln!("scx_zernel: {e:#}");
        return ExitCode::FAILURE;
    }

    let source = Source { path: cli.config.clone(), mode: cli.mode };
    let result = match cli.command {
        Some(Command::Inspect { tid, entries }) => {
            source.load().map_err(Into::into).and_then(|cfg| inspect::run(&cfg, tid, entries))
        }
        Some(Command::Observe(opts)) => source
            .load()
            .map_err(Into::into)
            .and_then(|cfg| Ok((cfg, shutdown_flag()?)))
            .and_then(|(cfg, shutdown)| observe_cmd::run(cfg, &opts, &shutdown)),
        None if cli.help_stats => stats::server_data().describe_meta(&mut std::io::stdout(), None),
        None if cli.dump_config => source.load().map(|cfg| print!("{}", cfg.to_toml())).map_err(Into::into),
        None if cli.monitor.is_some() => match cli.monitor.map(Duration::try_from_secs_f64) {
            Some(Ok(intv)) if !intv.is_zero() => shutdown_flag().and_then(|shutdown| stats::monitor(intv, shutdown)),
            _ => Err(anyhow::anyhow!("--monitor: SECS must be a positive number of seconds")),
        },
        None => LoadOptions::new(cli.exit_dump_len, cli.libbpf).and_then(|load| {
            shutdown_flag().and_then(|shutdown| daemon::run(&source, &load, cli.stats, cli.metrics_addr, shutdown))
        }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("scx_zernel: {}", format!("{e:#}").replace('\n', " "));
            ExitCode::FAILURE
        }
    }
}
