//! The daemon: attach the scheduler, then every interval run the pipeline
//! and write only the decisions that changed.
//!
//! ```text
//!   loop (restart on request from the BPF side):
//!     Scheduler::init ── attach
//!     every phase_eval_interval_ms:
//!        Observer::poll ─> rules (new/renamed threads only) ─> PhaseDetector::update
//!          ─> PolicyConfig::decide ─> Decisions::diff ─> task_class map
//!     between passes: answer stats requests, watch SIGHUP / the config file
//!   SIGINT/SIGTERM ─> detach ─> exit 0;  BPF-side exit ─> UEI report ─> exit 1
//! ```

use std::collections::HashSet;
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};
use rustc_hash::FxHashMap;
use crossbeam::channel::RecvTimeoutError;
use log::{debug, info, warn};
use scx_stats::prelude::StatsServer;

use crate::config::{Config, ConfigError};
use crate::gpu::{self, GpuProvider};
use crate::observe::{Observer, ProcessView, Snapshot};
use crate::phase::{Phase, PhaseDetector};
use crate::policy::{Decision, Facts};
use crate::tenants::Tenants;
use crate::rules::{Identity, Rules};
use crate::sched::{self, Scheduler, WriteError};
use crate::stats::{self, Metrics, TenantMetrics};
use crate::topology::Topology;

/// Presets for scx_loader's modes, applied on top of the config file.
///
/// | mode       | slices | starvation bound | wakeup_preempt_us          |
/// |------------|--------|------------------|----------------------------|
/// | auto       | as is  | as is            | as is                      |
/// | lowlatency | half   | at most 20 ms    | as is                      |
/// | gaming     | half   | at most 20 ms    | doubled: bursts of a few ms (a frame) still preempt |
/// | server     | double | as is            | as is                      |
/// | powersave  | double | as is            | 0: no wakeup preemption, fewer switches and IPIs |
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    Auto,
    Gaming,
    Lowlatency,
    Powersave,
    Server,
}

impl Mode {
    fn apply(self, cfg: &mut Config) {
        use crate::config::SLICE_US_RANGE;
        let sched = &mut cfg.scheduler;
        let scale = |s: &mut crate::config::SliceConfig, num: u64, den: u64| {
            for v in [&mut s.latency, &mut s.ml, &mut s.normal, &mut s.batch] {
                *v = (*v * num / den).clamp(SLICE_US_RANGE.0, SLICE_US_RANGE.1);
            }
        };
        match self {
            Mode::Auto => {}
            Mode::Gaming | Mode::Lowlatency => {
                scale(&mut sched.slice_us, 1, 2);
                sched.starvation_bound_ms = sched.starvation_bound_ms.min(20);
                if self == Mode::Gaming {
                    sched.wakeup_preempt_us = (sched.wakeup_preempt_us * 2).min(SLICE_US_RANGE.1);
                }
            }
            Mode::Server => scale(&mut sched.slice_us, 2, 1),
            Mode::Powersave => {
                scale(&mut sched.slice_us, 2, 1);
                sched.wakeup_preempt_us = 0;
            }
        }
    }
}

/// Where the configuration comes from: a file (or the defaults) and a mode.
#[derive(Debug, Clone)]
pub struct Source {
    pub path: Option<PathBuf>,
    pub mode: Mode,
}

impl Source {
    pub fn load(&self) -> Result<Config, ConfigError> {
        let mut cfg = match &self.path {
            Some(p) => {
                check_owner(p)?;
                Config::load(p)?
            }
            None => Config::default(),
        };
        self.mode.apply(&mut cfg);
        Ok(cfg)
    }

    fn stamp(&self) -> Option<(SystemTime, u64)> {
        let m = std::fs::metadata(self.path.as_ref()?).ok()?;
        Some((m.modified().ok()?, m.len()))
    }
}

/// A root daemon must not take orders from a file others can write.
fn check_owner(path: &Path) -> Result<(), ConfigError> {
    use std::os::unix::fs::MetadataExt;
    if unsafe { libc::geteuid() } != 0 {
        return Ok(());
    }
    if let Ok(m) = std::fs::metadata(path) {
        if m.mode() & 0o022 != 0 || m.uid() != 0 {
            return Err(ConfigError(format!(
                "{}: refusing a config file that is not owned by root or is writable by group/others (mode {:o}, uid {})",
                path.display(),
                m.mode() & 0o7777,
                m.uid()
            )));
        }
    }
    Ok(())
}

/// Where decisions go: the task_class map (a [`Scheduler`]), or nowhere
/// (benchmarks, observe mode).
pub trait DecisionSink {
    fn write(&self, tid: u32, start_ticks: u64, d: &Decision) -> Result<(), WriteError>;
    fn remove(&self, tid: u32);
}

impl DecisionSink for Scheduler<'_> {
    fn write(&self, tid: u32, start_ticks: u64, d: &Decision) -> Result<(), WriteError> {
        Scheduler::write(self, tid, start_ticks, d)
    }
    fn remove(&self, tid: u32) {
        Scheduler::remove(self, tid)
    }
}

/// The decisions currently in the map, to write only what changes.
#[derive(Default)]
pub struct Decisions {
    /// tid -> (start time, decision, pass that last decided it)
    held: FxHashMap<u32, (u64, Decision, u64)>,
    pass: u64,
}

/// Everything from /proc to decisions: no BPF in here, so it can also run
/// where nothing is attached.
pub struct Pipeline {
    pub cfg: Config,
    rules: Rules,
    tenants: Tenants,
    /// The tenants changed (reload): their weights must reach the kernel.
    pub tenants_changed: bool,
    topo: Topology,
    observer: Observer,
    gpu: Box<dyn GpuProvider>,
    detector: PhaseDetector,
    /// The rule each thread matched, evaluated when it appears or is renamed:
    /// its index + 1, 0 for none (small entries: this map is read for every
    /// thread in every pass).
    matched: FxHashMap<u32, u32>,
    decided: Vec<(u32, u64, Decision)>,
}

impl Pipeline {
    pub fn new(cfg: Config, topo: Topology) -> Result<Pipeline> {
        let rules = Rules::compile(&cfg.rules, &cfg.tenant_names()).map_err(anyhow::Error::msg)?;
        let tenants =
            Tenants::compile(&cfg.tenants).map_err(anyhow::Error::msg)?.with_default_weight(cfg.tenancy.default_weight);
        Ok(Pipeline {
            tenants,
            tenants_changed: false,
            observer: Observer::new(&cfg.observe),
            gpu: gpu::open(&cfg.gpu),
            detector: PhaseDetector::new(cfg.phase.clone()),
            rules,
            topo,
            cfg,
            matched: FxHashMap::default(),
            decided: Vec::new(),
        })
    }

    /// Takes a new configuration (rules, policy, phase thresholds, GPU
    /// source); the scheduler section needs a restart and is kept.
    pub fn reconfigure(&mut self, mut cfg: Config) -> Result<()> {
        let rules = Rules::compile(&cfg.rules, &cfg.tenant_names()).map_err(anyhow::Error::msg)?;
        let tenants =
            Tenants::compile(&cfg.tenants).map_err(anyhow::Error::msg)?.with_default_weight(cfg.tenancy.default_weight);
        if tenants.len() != self.tenants.len() {
            bail!("the number of [[tenants]] changed ({} -> {}): restart scx_zernel to apply", self.tenants.len(), tenants.len());
        }
        let mut topo = self.topo.clone();
        topo.apply_config(&cfg.topology).map_err(anyhow::Error::msg)?;
        if cfg.scheduler != self.cfg.scheduler {
            warn!("[scheduler] changes take effect at the next start; keeping the running values");
            cfg.scheduler = self.cfg.scheduler.clone();
        }
        if cfg.gpu != self.cfg.gpu {
            self.gpu = gpu::open(&cfg.gpu);
        }
        if cfg.observe != self.cfg.observe {
            self.observer = Observer::new(&cfg.observe);
        }
        if cfg.phase != self.cfg.phase {
            self.detector = PhaseDetector::new(cfg.phase.clone());
        }
        self.tenants_changed |= cfg.tenants != self.cfg.tenants || cfg.tenancy != self.cfg.tenancy;
        self.rules = rules;
        self.tenants = tenants;
        self.topo = topo;
        self.matched.clear();
        self.cfg = cfg;
        Ok(())
    }

    /// One pass: observe, match rules, detect phases, decide. Afterwards
    /// [`snapshot`](Self::snapshot) and [`decisions`](Self::decisions) hold
    /// what was seen and decided.
    pub fn pass(&mut self) {
        self.gpu.refresh();
        // GPU index -> PCI address (-> NUMA node) from the provider's own list.
        let devices: Vec<(u32, &str)> = self.gpu.devices().iter().map(|d| (d.index, d.pci_bus_id.as_str())).collect();
        self.topo.set_gpu_devices(&devices);
        let snap = self.observer.poll(self.gpu.as_ref());
        for g in &snap.gone {
            self.matched.remove(&(g.tid as u32));
        }
        // Phases first: the decisions below read them.
        for c in self.detector.update(snap) {
            if log::log_enabled!(log::Level::Debug) {
                let comm = snap.threads.iter().find(|t| t.tid == c.tid).map_or("?", |t| &t.comm);
                debug!("phase tid={} pid={} comm={comm:?} {} -> {}", c.tid, c.tgid, c.from, c.to);
            }
        }
        // Rules: evaluated only for threads that are new, renamed, or whose
        // process exec'd or moved (and for all after a reload, which clears
        // the cache). Then the policy decides for every thread.
        let mut forced = Vec::new();
        self.decided.clear();
        for t in &snap.threads {
            let p = snap.process_of(t);
            let tid = t.tid as u32;
            let changed = !t.changes.is_empty() || !p.changes.is_empty();
            let slot = match self.matched.get(&tid) {
                Some(&slot) if !changed => slot,
                _ => {
                    let m = self.rules.first_match(&identity(p, &t.comm));
                    if t.tid == p.pid {
                        forced.push((p.pid, m.is_some_and(|m| m.ml).then_some(true)));
                    }
                    let slot = m.map_or(0, |m| m.index as u32 + 1);
                    self.matched.insert(tid, slot);
                    slot
                }
            };
            let matched = match_of(&self.rules, slot);
            let matched = matched.as_ref();
            let phase = if t.ml { self.detector.phase(t.tid) } else { Phase::Unknown };
            let facts = Facts {
                rule: matched.map(|m| m.verdict),
                phase,
                node: if t.ml { self.topo.preferred_node_for_gpus(&p.gpu.devices) } else { None },
                tenant: match matched.and_then(|m| m.tenant) {
                    Some(t) => Some(t),
                    None if self.tenants.is_empty() => None,
                    None => self.tenants.of_cgroup(&p.cgroup),
                },
            };
            if let Some(d) = self.cfg.policy.decide(&facts, self.cfg.scheduler.default_class) {
                self.decided.push((tid, t.start_ticks, d));
            }
        }
        // Tenants weighted by the GPUs they use: one sample per pass.
        if self.tenants.measured() {
            let mut used: Vec<HashSet<u32>> = vec![HashSet::new(); self.tenants.len()];
            for p in snap.processes.iter().filter(|p| !p.gpu.devices.is_empty()) {
                if let Some(i) = self.tenants.of_cgroup(&p.cgroup) {
                    used[i].extend(p.gpu.devices.iter().copied());
                }
            }
            let counts: Vec<usize> = used.iter().map(HashSet::len).collect();
            if self.tenants.rebalance(&counts, &self.cfg.tenancy, Instant::now()) {
                info!("tenant weights rebalanced: GPUs in use {counts:?}, weights {:?}", self.tenants.weights());
                self.tenants_changed = true;
            }
        }
        // `ml = true` rules make the process ML (effective next pass).
        for (pid, force) in forced {
            self.observer.set_forced_ml(pid, force);
        }
    }

    /// What the last pass saw.
    pub fn snapshot(&self) -> &Snapshot {
        self.observer.snapshot()
    }

    /// (tid, start time, decision) of every thread the last pass decided on.
    pub fn decisions(&self) -> &[(u32, u64, Decision)] {
        &self.decided
    }

    pub fn phase(&self, tid: i32) -> Phase {
        self.detector.phase(tid)
    }

    /// The rule that matched a thread when it was last evaluated, if any.
    pub fn rule_match(&self, tid: u32) -> Option<crate::rules::Match> {
        match_of(&self.rules, *self.matched.get(&tid)?)
    }

    pub fn fill_metrics(&self, m: &mut Metrics) {
        let snap = self.snapshot();
        let s = self.detector.stats();
        m.threads = snap.threads.len() as u64;
        m.ml_threads = snap.threads.iter().filter(|t| t.ml).count() as u64;
        m.phase_data_loading = s.threads_in(Phase::DataLoading);
        m.phase_gpu_compute = s.threads_in(Phase::GpuCompute);
        m.phase_nccl_collective = s.threads_in(Phase::NcclCollective);
        m.phase_optimizer_step = s.threads_in(Phase::OptimizerStep);
        m.phase_transitions = s.transitions;
        m.observe_pass_us = snap.pass_ns / 1000;
    }
}

/// The Match a `Pipeline::matched` slot stands for.
fn match_of(rules: &Rules, slot: u32) -> Option<crate::rules::Match> {
    slot.checked_sub(1).and_then(|i| rules.at(i as usize))
}

fn identity<'a>(p: &'a ProcessView, comm: &'a str) -> Identity<'a> {
    Identity { comm, cmdline: &p.cmdline, cgroup: &p.cgroup, parent_comm: &p.parent_comm, uid: p.uid, gid: p.gid }
}

impl Decisions {
    /// Writes what changed; forgets what is gone. Returns (written, full).
    pub fn apply(&mut self, sink: &impl DecisionSink, decided: &[(u32, u64, Decision)]) -> (u64, u64) {
        let (mut written, mut full) = (0, 0);
        self.pass += 1;
        let pass = self.pass;
        for (tid, start, d) in decided {
            if let Some(h) = self.held.get_mut(tid) {
                if (h.0, h.1) == (*start, *d) {
                    h.2 = pass;
                    continue;
                }
            }
            match sink.write(*tid, *start, d) {
                Ok(()) => {
                    self.held.insert(*tid, (*start, *d, pass));
                    written += 1;
                }
                Err(WriteError::Full) => full += 1,
                Err(e) => sched::warn_write(*tid, &e),
            }
        }
        // Threads that lost their decision (phase back to Unknown) or
        // vanished. exit_task deletes the entry of an exiting thread, but a
        // thread that exited between the observer's pass and our write got
        // its entry after exit_task ran: delete in both cases.
        self.held.retain(|tid, h| {
            let keep = h.2 == pass;
            if !keep {
                sink.remove(*tid);
            }
            keep
        });
        (written, full)
    }

    /// Entries held in the map.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}

/// Runs the scheduler until SIGINT/SIGTERM (Ok) or a BPF-side exit (Err).
pub fn run(
    source: &Source,
    stats_every: Option<f64>,
    metrics_addr: Option<SocketAddr>,
    shutdown: Arc<AtomicBool>,
) -> Result<()> {
    let cfg = source.load()?;
    sched::check_kernel()?;
    let mut topo = Topology::read(Path::new("/sys")).context("reading the CPU topology from /sys")?;
    topo.apply_config(&cfg.topology).map_err(anyhow::Error::msg)?;

    let reload = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGHUP, reload.clone()).context("installing SIGHUP")?;

    // OpenMetrics: started once, survives restarts; `serve` publishes each pass.
    let published = match metrics_addr {
        Some(addr) => {
            let current = Arc::new(Mutex::new(Metrics::default()));
            crate::metrics::serve(addr, current.clone())?;
            Some(current)
        }
        None => None,
    };

    let mut open_object = MaybeUninit::uninit();
    let mut pipeline = Pipeline::new(cfg, topo.clone())?;
    loop {
        let mut sched = Scheduler::init(&pipeline.cfg.scheduler, &topo, &pipeline.tenants, &mut open_object)?;
        let bpf_exited = serve(&mut sched, &mut pipeline, source, stats_every, published.as_ref(), &shutdown, &reload)?;
        let uei = sched.shutdown()?;
        if uei.should_restart() {
            info!("the BPF scheduler asked for a restart");
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
    reload: &AtomicBool,
) -> Result<bool> {
    let server = StatsServer::new(stats::server_data()).launch()?;
    let (res_ch, req_ch) = server.channels();
    let mut decisions = Decisions::default();
    let mut metrics = Metrics::default();
    let mut stamp = source.stamp();
    let mut last_print = Instant::now();
    let mut last_stamp_check = Instant::now();
    let mut last_tenant_sample = Instant::now();
    let mut prev_tenant_ns = sched.counters()?.tenant_ns[..pipeline.tenants.len()].to_vec();
    loop {
        let started = Instant::now();
        if shutdown.load(Ordering::Relaxed) {
            return Ok(false);
        }
        if sched.exited() {
            return Ok(true);
        }

        // Live reload: SIGHUP or a changed file (checked once a second).
        let mut want = reload.swap(false, Ordering::Relaxed);
        if last_stamp_check.elapsed() >= Duration::from_secs(1) {
            last_stamp_check = Instant::now();
            let now = source.stamp();
            want |= now != stamp;
            stamp = now;
        }
        if want {
            match source.load().map_err(anyhow::Error::from).and_then(|c| pipeline.reconfigure(c)) {
                Ok(()) => {
                    metrics.reloads += 1;
                    info!("configuration reloaded");
                }
                Err(e) => {
                    metrics.reloads_rejected += 1;
                    warn!("reload rejected, keeping the running configuration: {}", format!("{e:#}").replace('\n', " "));
                }
            }
        }

        sched.heartbeat();
        if std::mem::take(&mut pipeline.tenants_changed) {
            sched.set_tenant_weights(&pipeline.tenants)?;
        }
        pipeline.pass();
        let (written, full) = decisions.apply(sched, pipeline.decisions());
        metrics.decisions_written += written;
        metrics.map_full += full;
        if full > 0 && metrics.map_full == full {
            warn!("task_class map is full ({} entries): some threads keep the default class", sched.map_capacity());
        }
        pipeline.fill_metrics(&mut metrics);
        let counters = sched.counters()?;
        metrics.set_counters(&counters);
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
                metrics.format(&mut std::io::stdout())?;
            }
        }

        // Sleep until the next pass, answering stats requests meanwhile.
        let period = Duration::from_millis(pipeline.cfg.phase.phase_eval_interval_ms);
        while let Some(left) = period.checked_sub(started.elapsed()) {
            if shutdown.load(Ordering::Relaxed) {
                break;
            }
            sched.heartbeat();
            match req_ch.recv_timeout(left.min(Duration::from_millis(100))) {
                Ok(()) => res_ch.send(metrics.clone())?,
                Err(RecvTimeoutError::Timeout) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SLICE_US_RANGE;

    /// (slice_us.latency, .batch, starvation_bound_ms, wakeup_preempt_us)
    fn preset(mode: Mode, cfg: &Config) -> (u64, u64, u64, u64) {
        let mut c = cfg.clone();
        mode.apply(&mut c);
        c.validate().unwrap();
        let s = &c.scheduler;
        (s.slice_us.latency, s.slice_us.batch, s.starvation_bound_ms, s.wakeup_preempt_us)
    }

    #[test]
    fn mode_presets_are_distinct_and_stay_valid() {
        let d = Config::default();
        let (l, b, bound, w) = preset(Mode::Auto, &d);
        assert_eq!(preset(Mode::Lowlatency, &d), (l / 2, b / 2, bound.min(20), w));
        assert_eq!(preset(Mode::Gaming, &d), (l / 2, b / 2, bound.min(20), w * 2));
        assert_eq!(preset(Mode::Server, &d), (l * 2, b * 2, bound, w));
        assert_eq!(preset(Mode::Powersave, &d), (l * 2, b * 2, bound, 0));

        // At the ends of the ranges the presets clamp; off stays off.
        let mut edge = Config::default();
        edge.scheduler.slice_us.latency = SLICE_US_RANGE.0;
        edge.scheduler.slice_us.batch = SLICE_US_RANGE.1;
        edge.scheduler.wakeup_preempt_us = SLICE_US_RANGE.1;
        assert_eq!(preset(Mode::Gaming, &edge).0, SLICE_US_RANGE.0);
        assert_eq!(preset(Mode::Gaming, &edge).3, SLICE_US_RANGE.1);
        assert_eq!(preset(Mode::Server, &edge).1, SLICE_US_RANGE.1);
        edge.scheduler.wakeup_preempt_us = 0;
        assert_eq!(preset(Mode::Gaming, &edge).3, 0);
    }
}
