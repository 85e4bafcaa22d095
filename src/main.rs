//! scx_zernel: command line, logging and the restart loop. The work is in
//! the library (src/lib.rs and its modules).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use log::error;

use scx_zernel::daemon::{self, Mode};
use scx_zernel::inspect;

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
#[derive(Debug, Parser)]
#[command(version, about, long_about)]
struct Cli {
    /// Configuration file (TOML). Every key is documented in
    /// configs/zernel.toml; unknown keys are errors.
    #[arg(short, long, global = true, value_name = "PATH")]
    config: Option<PathBuf>,

    /// Preset for scx_loader modes: adjusts slices and the starvation bound
    /// on top of the config. auto = the config as is; lowlatency and gaming =
    /// half slices and a 20 ms starvation bound; powersave and server =
    /// double slices.
    #[arg(long, value_enum, default_value_t = Mode::Auto)]
    mode: Mode,

    /// Print statistics every SECS seconds while running.
    #[arg(long, value_name = "SECS")]
    stats: Option<f64>,

    /// Log level: error, warn, info, debug, trace.
    #[arg(long, default_value = "info", value_name = "LEVEL")]
    log_level: log::LevelFilter,

    /// Print the effective configuration (defaults merged with --config and
    /// --mode) as TOML and exit.
    #[arg(long)]
    dump_config: bool,

    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Read the counters and decisions of the running scheduler (from its
    /// pinned maps; needs root).
    Inspect {
        /// Show the decision the kernel holds for this thread instead.
        #[arg(long)]
        tid: Option<u32>,
    },
}

fn init_logging(level: log::LevelFilter) {
    let cfg = simplelog::ConfigBuilder::new()
        .set_time_level(log::LevelFilter::Off)
        .set_target_level(log::LevelFilter::Off)
        .set_thread_level(log::LevelFilter::Off)
        .set_location_level(log::LevelFilter::Off)
        .build();
    let _ = simplelog::TermLogger::init(level, cfg, simplelog::TerminalMode::Stderr, simplelog::ColorChoice::Never);
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_level);

    let source = daemon::Source { path: cli.config.clone(), mode: cli.mode };
    let result = match cli.command {
        Some(Command::Inspect { tid }) => source.load().map_err(Into::into).and_then(|cfg| inspect::run(&cfg, tid)),
        None if cli.dump_config => source.load().map(|cfg| print!("{}", cfg.to_toml())).map_err(Into::into),
        None => {
            let shutdown = Arc::new(AtomicBool::new(false));
            for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
                if let Err(e) = signal_hook::flag::register(sig, shutdown.clone()) {
                    error!("cannot install the signal handler: {e}");
                    return ExitCode::FAILURE;
                }
            }
            daemon::run(&source, cli.stats, shutdown)
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("scx_zernel: {}", format!("{e:#}").replace('\n', " "));
            ExitCode::FAILURE
        }
    }
}
