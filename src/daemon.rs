//! The daemon: attach the scheduler, then every interval run the pipeline
//! and write only the decisions that changed.
//!
//! ```text
//!   loop (restart on request from the BPF side):
//!     Scheduler::init ── attach
//!     every loop_interval_ms:
//!        Observer::poll ─> rules (new/renamed threads only) ─> PhaseDetector::update
//!          ─> PolicyConfig::decide ─> policy script (facts changed only)
//!          ─> Decisions::apply (what changed) ─> task_class map
//!     between passes: answer stats requests; SIGHUP, or an inotify event
//!     after which the config file differs, ends the wait, and the next pass
//!     starts with the reload; a GPU device open in the kernel's ring
//!     buffer (it wakes the wait; process events are drained at the pass)
//!     ends it too: the opener is ML in that pass, and once a pass has
//!     judged it its GPU-open mark in the kernel no longer decides (its
//!     entries, or none, do)
//!   SIGINT/SIGTERM ─> detach ─> exit 0;  BPF-side exit ─> UEI report ─> exit 1
//! ```

use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use scx_stats::prelude::StatsServer;
use tracing::{info, warn};

use crate::bpf_intf;
use crate::config::{Config, Source};
use crate::decisions::Decisions;
use crate::events::{GpuOpen, ProcEvent};
use crate::observe::RECONCILE_RESCANS;
use crate::pipeline::{until_next_pass, Pipeline};
use crate::reload::Reloader;
use crate::sched::{self, LoadOptions, Scheduler};
use crate::stats::{self, Metrics, TenantMetrics};
use crate::topology::{Topology, SYSFS_ROOT};

/// The longest the daemon's wait goes without writing the heartbeat (the
/// kernel's decision_ttl_ms is at least five of these).
const HEARTBEAT_EVERY: Duration = Duration::from_millis(100);

/// Loads the source again and gives it to the pipeline; an invalid file is
/// rejected and the running configuration stays. Returns whether it took.
pub fn apply_reload(pipeline: &mut Pipeline, source: &Source) -> bool {
    let _stage = tracing::debug_span!("reload").entered();
    match source.load().map_err(anyhow::Error::from).and_then(|c| pipeline.reconfigure(c)) {
        Ok(()) => {
            info!("configuration reloaded");
            true
        }
        Err(e) => {
            warn!("reload rejected, keeping the running configuration: {}", format!("{e:#}").replace('\n', " "));
            false
        }
    }
}

/// The version with the build id, as the scx schedulers print it:
/// `0.1.0-g<commit> <target triple>` (`/debug` for a debug build).
pub fn version() -> &'static str {
    static VERSION: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    VERSION.get_or_init(|| {
        let sha = env!("ZERNEL_GIT_SHA");
        let semver = if sha.is_empty() {
            env!("CARGO_PKG_VERSION").to_string()
        } else {
            format!("{}-g{sha}", env!("CARGO_PKG_VERSION"))
        };
        scx_utils::build_id::full_version(&semver)
    })
}

/// The CPU topology from /sys, with the config's GPU -> node pins. At
/// start a pin to a node with no online CPU is a config error; read again
/// after CPU hotplug it means the node's CPUs went offline: the pins wait
/// (with a warning) for a later restart that finds the node online again.
fn read_topology(cfg: &Config, after_hotplug: bool) -> Result<Topology> {
    let mut topo = Topology::read(Path::new(SYSFS_ROOT)).context("reading the CPU topology from /sys")?;
    if let Err(e) = topo.apply_config(&cfg.topology) {
        if !after_hotplug {
            bail!(e);
        }
        warn!("{e}: the [topology] pins are left out until the node is back online");
    }
    Ok(topo)
}

/// Runs the scheduler until SIGINT/SIGTERM (Ok) or a BPF-side exit (Err).
pub fn run(
    source: &Source,
    load: &LoadOptions,
    stats_every: Option<f64>,
    metrics_addr: Option<SocketAddr>,
    shutdown: Arc<AtomicBool>,
) -> Result<()> {
    let cfg = source.load()?;
    sched::check_kernel()?;
    info!("scx_zernel {}", version());
    let mut topo = read_topology(&cfg, false)?;

    let mut reloader = Reloader::new(source)?;

    // OpenMetrics: started once, survives restarts; `serve` publishes each pass.
    let published = match metrics_addr {
        Some(addr) => {
            let current = Arc::new(Mutex::new(Metrics::default()));
            crate::openmetrics::serve(addr, current.clone())?;
            Some(current)
        }
        None => None,
    };

    let mut open_object = MaybeUninit::uninit();
    let mut pipeline = Pipeline::new(cfg, topo.clone())?;
    reloader.watch_script(&pipeline.cfg.policy.script);
    loop {
        let mut sched = Scheduler::init(&pipeline.cfg.scheduler, load, &topo, &pipeline.tenants, &mut open_object)?;
        let bpf_exited =
            serve(&mut sched, &mut pipeline, source, stats_every, published.as_ref(), &shutdown, &mut reloader)?;
        let uei = sched.shutdown()?;
        if uei.should_restart() {
            // A CPU went offline or came online (the kernel ends a scheduler
            // without hotplug callbacks this way): the CPUs and nodes the
            // BPF side was loaded with are no longer the machine's.
            topo = read_topology(&pipeline.cfg, true)?;
            info!("the BPF scheduler asked for a restart: {} online CPUs, {} node(s)", topo.nr_cpus(), topo.nr_nodes());
            pipeline.set_topology(topo.clone());
            continue;
        }
        if bpf_exited {
            bail!("the BPF scheduler exited on its own; see the report above");
        }
        info!("scx_zernel detached");
        return Ok(());
    }
}

/// The attached loop. Returns whether the BPF side exited by itself.
fn serve(
    sched: &mut Scheduler,
    pipeline: &mut Pipeline,
    source: &Source,
    stats_every: Option<f64>,
    published: Option<&Arc<Mutex<Metrics>>>,
    shutdown: &AtomicBool,
    reloader: &mut Reloader,
) -> Result<bool> {
    let server = StatsServer::new(stats::server_data()).launch()?;
    let (res_ch, req_ch) = server.channels();
    // A new map: every decision is written again.
    let mut decisions = Decisions::default();
    pipeline.resync();
    let mut metrics = Metrics::default();
    // What the last --stats line covered: each line shows what came since.
    let mut printed = Metrics::default();
    let mut last_print = Instant::now();
    let mut last_tenant_sample = Instant::now();
    let mut prev_tenant_ns = sched.counters()?.tenant_ns[..pipeline.tenants.len()].to_vec();
    let mut n: u64 = 0;
    // GPU opens told by the kernel, with the passes since: the mark is set
    // judged once a pass saw the process (or after 50 passes: gone).
    let mut opens: Vec<(GpuOpen, u32)> = Vec::new();
    // Process events since the last pass (drained while waiting too, so the
    // ring buffer does not fill), and the kernel's count of lost events.
    let mut procs: Vec<ProcEvent> = Vec::new();
    let mut lost = sched.counters()?.global[bpf_intf::zernel_global_stat_ZGSTAT_EVENT_LOST as usize];
    pipeline.set_process_events(true);
    if pipeline.cfg.observe.process_events {
        info!("process events: forks, execs, exits, thread renames and cgroup moves come from the kernel; /proc is listed every {} ms", pipeline.cfg.observe.rescan_interval_ms * u64::from(RECONCILE_RESCANS));
    } else {
        info!("process events: off (observe.process_events = false): /proc alone finds new processes, renames and cgroup moves");
    }
    loop {
        let started = Instant::now();
        if shutdown.load(Ordering::Relaxed) {
            return Ok(false);
        }
        if sched.exited() {
            return Ok(true);
        }
        n += 1;
        let _pass = tracing::debug_span!("pass", n).entered();

        // Live reload: SIGHUP or a changed file (both wake the sleep below).
        if reloader.due(source) {
            if apply_reload(pipeline, source) {
                metrics.reloads += 1;
                reloader.watch_script(&pipeline.cfg.policy.script);
            } else {
                metrics.reloads_rejected += 1;
            }
        }

        sched.heartbeat();
        if std::mem::take(&mut pipeline.tenants_changed) {
            sched.set_tenant_weights(&pipeline.tenants)?;
        }
        let (told, events) = sched.events();
        sched.rearm();
        opens.extend(told.into_iter().map(|o| (o, 0)));
        procs.extend(events);
        pipeline.note_process_events(&procs);
        procs.clear();
        for (o, passes) in &opens {
            if *passes == 0 {
                pipeline.note_gpu_open(o);
            }
        }
        tracing::debug_span!("observe").in_scope(|| pipeline.pass());
        let (written, full) = tracing::debug_span!("write").in_scope(|| decisions.apply(sched, pipeline.changed()));
        opens.retain_mut(|(o, passes)| {
            *passes += 1;
            let judged =
                pipeline.snapshot().processes.iter().any(|p| p.pid == o.pid as i32 && p.start_ticks == o.start_ticks);
            if judged || *passes >= 50 {
                sched.unmark_gpu(o.pid);
            }
            !(judged || *passes >= 50)
        });
        metrics.decisions_written += written;
        metrics.map_full += full;
        if full > 0 && metrics.map_full == full {
            warn!("task_class map is full ({} entries): some threads keep the default class", sched.map_capacity());
        }
        pipeline.fill_metrics(&mut metrics);
        let counters = sched.counters()?;
        metrics.set_counters(&counters);
        let now_lost = counters.global[bpf_intf::zernel_global_stat_ZGSTAT_EVENT_LOST as usize];
        if now_lost != lost {
            lost = now_lost;
            pipeline.note_events_lost();
        }
        // Tenants' shares over the last second (borrowed / lent).
        if !pipeline.tenants.is_empty() && last_tenant_sample.elapsed() >= Duration::from_secs(1) {
            last_tenant_sample = Instant::now();
            let n = pipeline.tenants.len();
            let used: Vec<u64> =
                counters.tenant_ns[..n].iter().zip(&prev_tenant_ns).map(|(c, p)| c.saturating_sub(*p)).collect();
            prev_tenant_ns = counters.tenant_ns[..n].to_vec();
            let shares = TenantMetrics::compute(&used, pipeline.tenants.weights());
            metrics.tenants =
                shares.into_iter().enumerate().map(|(i, t)| (pipeline.tenants.name(i).to_string(), t)).collect();
        }
        metrics.map_entries = decisions.len() as u64;
        metrics.map_capacity = sched.map_capacity() as u64;
        if let Some(p) = published {
            *p.lock().unwrap_or_else(|e| e.into_inner()) = metrics.clone();
        }

        if let Some(secs) = stats_every {
            if last_print.elapsed().as_secs_f64() >= secs {
                last_print = Instant::now();
                metrics.delta(&printed).format(&mut std::io::stdout())?;
                printed = metrics.clone();
            }
        }

        // Sleep until the next pass, answering stats requests meanwhile; a
        // reload trigger or a GPU open ends the sleep at once. No timer
        // beyond the pass's own: the heartbeat is written at least every
        // HEARTBEAT_EVERY even with a long loop_interval_ms.
        let period = Duration::from_millis(pipeline.cfg.phase.loop_interval_ms);
        let triggers = reloader.receiver().clone();
        let ring = sched.ring_woken();
        until_next_pass(started, period, shutdown, |left| -> Result<bool> {
            sched.heartbeat();
            let mut woken = None;
            crossbeam::select! {
                recv(req_ch) -> r => match r {
                    Ok(()) => res_ch.send(metrics.clone())?,
                    Err(e) => return Err(e.into()),
                },
                recv(triggers) -> t => woken = t.ok(),
                recv(ring) -> _ => {
                    sched.take_wakeup();
                    let (told, events) = sched.events();
                    procs.extend(events);
                    if !told.is_empty() {
                        opens.extend(told.into_iter().map(|o| (o, 0)));
                        return Ok(false);
                    }
                }
                default(left.min(HEARTBEAT_EVERY)) => {}
            }
            Ok(!woken.is_some_and(|t| reloader.note(source, t)))
        })?;
    }
}
