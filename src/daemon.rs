//! The daemon: attach the scheduler, then every interval run the pipeline
//! and write only the decisions that changed.
//!
//! ```text
//!   loop (restart on request from the BPF side):
//!     Scheduler::init ── attach
//!     every phase_eval_interval_ms:
//!        Observer::poll ─> rules (new/renamed threads only) ─> PhaseDetector::update
//!          ─> PolicyConfig::decide ─> policy script (facts changed only)
//!          ─> Decisions::diff ─> task_class map
//!     between passes: answer stats requests; SIGHUP, or an inotify event
//!     after which the config file differs, ends the wait, and the next pass
//!     starts with the reload; GPU device opens from the kernel's ring
//!     buffer (drained every 20 ms, no wait) end it too: the opener is ML
//!     in that pass, and once a pass has judged it its GPU-open mark in the
//!     kernel no longer decides (its entries, or none, do)
//!   SIGINT/SIGTERM ─> detach ─> exit 0;  BPF-side exit ─> UEI report ─> exit 1
//! ```

use std::collections::HashSet;
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use crossbeam::channel::Receiver;
use rustc_hash::FxHashMap;
use scx_stats::prelude::StatsServer;
use tracing::{debug, info, warn};

use crate::bpf_intf;
use crate::config::{Config, ConfigError};
use crate::gpu::{self, GpuProvider};
use crate::observe::{Changes, Observer, ProcEvent, ProcessView, Snapshot};
use crate::phase::{Phase, PhaseDetector};
use crate::policy::{Decision, Facts};
use crate::policy_script::{self, Reopened, Script, ThreadFacts};
use crate::reload::{self, ReloadWatch, Stamp, Trigger};
use crate::rules::{Identity, Rules};
use crate::sched::{self, Scheduler, WriteError};
use crate::stats::{self, Metrics, TenantMetrics};
use crate::tenants::Tenants;
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
        // The script decides as much as the file: the same ownership rules.
        if !cfg.policy.script.is_empty() {
            check_owner(Path::new(&cfg.policy.script))?;
        }
        self.mode.apply(&mut cfg);
        Ok(cfg)
    }

    fn stamp(&self) -> Stamp {
        reload::stamp(self.path.as_deref()?)
    }
}

/// A root daemon must not take orders from a file others can change. As
/// root (effective uid 0), a config file is refused when
///   - it is writable by group or others, or
///   - its directory is writable by group or others without the sticky bit
///     (anyone there could rename another file over it), or
///   - it is owned by anyone but root and the user who ran `sudo`
///     (SUDO_UID): that user's own file, e.g. in a checkout, is accepted
///     with a warning.
///
/// Symlinks are followed (the file and directory judged are the target's).
fn check_owner(path: &Path) -> Result<(), ConfigError> {
    use std::os::unix::fs::MetadataExt;
    if unsafe { libc::geteuid() } != 0 {
        return Ok(());
    }
    // A missing file is reported by the loader, with its own message.
    let Ok(file) = std::fs::metadata(path) else { return Ok(()) };
    let real = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let dir = real.parent().and_then(|d| std::fs::metadata(d).ok()).map(|m| Perm { uid: m.uid(), mode: m.mode() });
    let sudo_uid = std::env::var("SUDO_UID").ok().and_then(|v| v.parse().ok());
    let verdict = judge_owner(Perm { uid: file.uid(), mode: file.mode() }, dir, sudo_uid);
    match verdict {
        Ok(None) => Ok(()),
        Ok(Some(warning)) => {
            warn!("{}: {warning}", path.display());
            Ok(())
        }
        Err(why) => Err(ConfigError(format!("{}: refusing a config file {why}", path.display()))),
    }
}

/// Owner and mode bits of a file or directory.
#[derive(Debug, Clone, Copy)]
struct Perm {
    uid: u32,
    mode: u32,
}

/// [`check_owner`]'s rules, on metadata: Ok(Some(warning)) for a file the
/// sudo user owns, Err(why) for an unsafe one.
fn judge_owner(file: Perm, dir: Option<Perm>, sudo_uid: Option<u32>) -> Result<Option<String>, String> {
    if file.mode & 0o022 != 0 {
        return Err(format!("writable by group or others (mode {:o}): chmod go-w it", file.mode & 0o7777));
    }
    if let Some(d) = dir {
        if d.mode & 0o022 != 0 && d.mode & 0o1000 == 0 {
            return Err(format!(
                "in a directory writable by group or others without the sticky bit (mode {:o}): others could replace it",
                d.mode & 0o7777
            ));
        }
    }
    match file.uid {
        0 => Ok(None),
        uid if Some(uid) == sudo_uid && uid != 0 => Ok(Some(format!(
            "owned by uid {uid}, the user who ran sudo, not root: that user can change how this machine is scheduled"
        ))),
        uid => Err(format!("owned by uid {uid}, neither root nor the user who ran sudo (SUDO_UID)")),
    }
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
    /// `[policy] script`, with its verdicts cached per thread.
    script: Option<Script>,
    /// Counters of the scripts replaced by reloads (the stats are cumulative).
    script_retired: policy_script::ScriptStats,
    /// The kernel's process events reach the observer.
    process_events: bool,
    /// (process events, /proc listings) of observers replaced by reloads.
    discovery_retired: (u64, u64),
}

impl Pipeline {
    pub fn new(cfg: Config, topo: Topology) -> Result<Pipeline> {
        let rules = Rules::compile(&cfg.rules, &cfg.tenant_names()).map_err(anyhow::Error::msg)?;
        let tenants =
            Tenants::compile(&cfg.tenants).map_err(anyhow::Error::msg)?.with_default_weight(cfg.tenancy.default_weight);
        let script =
            match policy_script::reopen(None, &cfg.policy.script, &cfg.tenant_names(), cfg.scheduler.default_class)
                .map_err(anyhow::Error::msg)?
            {
                Reopened::New(s) => s.map(|s| *s),
                Reopened::Same => None,
            };
        if let Some(s) = &script {
            info!("policy script {} loaded", s.path().display());
        }
        Ok(Pipeline {
            script,
            script_retired: Default::default(),
            process_events: false,
            discovery_retired: (0, 0),
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

    /// The kernel saw process `pid` open a GPU device: ML in the next pass.
    pub fn note_gpu_open(&mut self, o: &sched::GpuOpen) {
        let what = format!("device open {}:{} by tid {}", o.major, o.minor, o.tid);
        self.observer.note_device_open(o.pid as i32, o.start_ticks, &what);
    }

    /// Whether the kernel's process events come (see
    /// [`Observer::set_process_events`]).
    pub fn set_process_events(&mut self, live: bool) {
        self.process_events = live;
        self.observer.set_process_events(live);
    }

    /// Processes the kernel told of (fork, exec, exit) since the last pass.
    pub fn note_process_events(&mut self, events: &[ProcEvent]) {
        self.observer.note_process_events(events);
    }

    /// The kernel lost events: /proc is listed in the next pass.
    pub fn note_events_lost(&mut self) {
        self.observer.note_events_lost();
    }

    /// Takes a topology read again after CPU hotplug.
    pub fn set_topology(&mut self, topo: Topology) {
        self.topo = topo;
    }

    /// Takes a new configuration (rules, policy, phase thresholds, GPU
    /// source); the scheduler section needs a restart and is kept.
    pub fn reconfigure(&mut self, mut cfg: Config) -> Result<()> {
        let rules = Rules::compile(&cfg.rules, &cfg.tenant_names()).map_err(anyhow::Error::msg)?;
        let tenants =
            Tenants::compile(&cfg.tenants).map_err(anyhow::Error::msg)?.with_default_weight(cfg.tenancy.default_weight);
        if tenants.len() != self.tenants.len() {
            bail!(
                "the number of [[tenants]] changed ({} -> {}): restart scx_zernel to apply",
                self.tenants.len(),
                tenants.len()
            );
        }
        let mut topo = self.topo.clone();
        topo.apply_config(&cfg.topology).map_err(anyhow::Error::msg)?;
        if cfg.scheduler != self.cfg.scheduler {
            warn!("[scheduler] changes take effect at the next start; keeping the running values");
            cfg.scheduler = self.cfg.scheduler.clone();
        }
        let names = cfg.tenant_names();
        let script =
            policy_script::reopen(self.script.as_ref(), &cfg.policy.script, &names, cfg.scheduler.default_class)
                .map_err(anyhow::Error::msg)?;
        if let Reopened::New(s) = script {
            if let Some(s) = &s {
                info!("policy script {} loaded", s.path().display());
            }
            if let Some(old) = &self.script {
                self.script_retired.add(&old.stats());
            }
            self.script = s.map(|s| *s);
        }
        if cfg.gpu != self.cfg.gpu {
            self.gpu = gpu::open(&cfg.gpu);
        }
        if cfg.observe != self.cfg.observe {
            let (e, l) = self.observer.discovery_counts();
            self.discovery_retired.0 += e;
            self.discovery_retired.1 += l;
            self.observer = Observer::new(&cfg.observe);
            self.observer.set_process_events(self.process_events);
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
        // Operators see each job found (or lost), with the evidence for it.
        let ml_news = |p: &&ProcessView| p.changes.contains(Changes::ML) || (p.ml && p.changes.contains(Changes::NEW));
        for p in snap.processes.iter().filter(ml_news) {
            if p.ml {
                let num = |v: Option<u32>| v.map_or("-".to_string(), |v| v.to_string());
                info!(
                    "ML process pid={} comm={:?} evidence={} ({}) rank={} local_rank={} world_size={} loader={}",
                    p.pid,
                    p.comm,
                    p.evidence,
                    if p.evidence_detail.is_empty() { "inherited" } else { &p.evidence_detail },
                    num(p.env.rank),
                    num(p.env.local_rank),
                    num(p.env.world_size),
                    p.loader_process
                );
            } else {
                info!("pid={} comm={:?} is no longer ML", p.pid, p.comm);
            }
        }
        // Phases first: the decisions below read them.
        for c in self.detector.update(snap) {
            if tracing::enabled!(tracing::Level::DEBUG) {
                let comm = snap.threads.iter().find(|t| t.tid == c.tid).map_or("?", |t| &t.comm);
                debug!("phase tid={} pid={} comm={comm:?} {} -> {}", c.tid, c.tgid, c.from, c.to);
            }
        }
        // Rules: evaluated only for threads that are new, renamed, or whose
        // process exec'd or moved (and for all after a reload, which clears
        // the cache). Then the policy decides for every thread.
        let mut forced = Vec::new();
        self.decided.clear();
        if let Some(s) = &mut self.script {
            s.begin_pass();
        }
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
                ml: t.ml,
                rule: matched.map(|m| m.verdict),
                phase,
                node: if t.ml { self.topo.preferred_node_for_gpus(&p.gpu.devices) } else { None },
                tenant: match matched.and_then(|m| m.tenant) {
                    Some(t) => Some(t),
                    None if self.tenants.is_empty() => None,
                    None => self.tenants.of_cgroup(&p.cgroup),
                },
            };
            let mut d = self.cfg.policy.decide(&facts, self.cfg.scheduler.default_class);
            if let Some(s) = &mut self.script {
                let facts = ThreadFacts {
                    pid: p.pid,
                    tid: t.tid,
                    start_ticks: t.start_ticks,
                    comm: &t.comm,
                    cmdline: &p.cmdline,
                    cgroup: &p.cgroup,
                    parent_comm: &p.parent_comm,
                    uid: p.uid,
                    gid: p.gid,
                    ml: t.ml,
                    evidence: p.evidence,
                    rank: p.env.rank,
                    local_rank: p.env.local_rank,
                    world_size: p.env.world_size,
                    role: t.role,
                    phase,
                    gpus: &p.gpu.devices,
                    node: facts.node,
                    tenant: facts.tenant.map(|i| self.tenants.name(i)),
                };
                d = s.decide(&facts, d);
            }
            if let Some(d) = d {
                self.decided.push((tid, t.start_ticks, d));
            }
        }
        if let Some(s) = &mut self.script {
            s.end_pass();
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

    /// What the policy script said about a thread in the last pass (None
    /// without a script).
    pub fn script_verdict(&self, tid: u32) -> Option<policy_script::Verdict> {
        self.script.as_ref()?.verdict(tid)
    }

    /// The running policy script, if any.
    pub fn script(&self) -> Option<&Script> {
        self.script.as_ref()
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
        let mut st = self.script_retired;
        if let Some(s) = &self.script {
            st.add(&s.stats());
        }
        m.script_calls = st.calls;
        m.script_errors = st.errors;
        m.script_budget_exceeded = st.budget_exceeded;
        let (e, l) = self.observer.discovery_counts();
        m.proc_events = self.discovery_retired.0 + e;
        m.proc_listings = self.discovery_retired.1 + l;
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

/// The loop's side of a reload: what woke it (SIGHUP, an inotify event in
/// the config's directory) and the stamp of the file last loaded. An event
/// that left the file as it was (another file of a busy directory such as
/// /tmp) neither wakes the loop nor reloads. Without inotify the stamp is
/// compared once a second instead.
pub struct Reloader {
    watch: ReloadWatch,
    stamp: Stamp,
    last_poll: Instant,
    changed: bool,
    sighup: bool,
    /// The policy script and the stamp it had at the last reload; the
    /// flag says it is compared once a second (its directory is not watched).
    script: Option<(PathBuf, Stamp, bool)>,
}

/// How often the stamp is compared when inotify is not available.
const POLL_WITHOUT_INOTIFY: Duration = Duration::from_secs(1);

impl Reloader {
    /// Wakes on SIGHUP, and on changes of the source's file if it has one.
    pub fn new(source: &Source) -> Result<Reloader> {
        let mut watch = ReloadWatch::new();
        watch.on_sighup()?;
        if let Some(path) = &source.path {
            if let Err(e) = watch.on_file(path) {
                warn!("{}: {e:#}; changes of the file are looked for once a second", path.display());
            }
        }
        Ok(Reloader {
            watch,
            stamp: source.stamp(),
            last_poll: Instant::now(),
            changed: false,
            sighup: false,
            script: None,
        })
    }

    /// Also reloads when the policy script changes (`""`: none); called
    /// with the script of the configuration in force.
    pub fn watch_script(&mut self, path: &str) {
        if path.is_empty() {
            self.script = None;
            return;
        }
        let p = PathBuf::from(path);
        if self.script.as_ref().is_some_and(|s| s.0 == p) {
            return;
        }
        let polled = match self.watch.on_file_too(&p) {
            Ok(()) => false,
            Err(e) => {
                warn!("{path}: {e:#}; changes of the policy script are looked for once a second");
                true
            }
        };
        self.script = Some((p.clone(), reload::stamp(&p), polled));
    }

    /// Whether the policy script differs from the one last loaded.
    fn script_changed(&self) -> bool {
        self.script.as_ref().is_some_and(|(p, st, _)| reload::stamp(p) != *st)
    }

    /// Where the triggers arrive; hand each to [`note`](Self::note).
    pub fn receiver(&self) -> &Receiver<Trigger> {
        self.watch.receiver()
    }

    /// Takes a trigger; returns whether a reload is now due (the loop
    /// should wake): always after SIGHUP, after a file event only if the
    /// file's stamp differs from the one last loaded (a stat, no read).
    pub fn note(&mut self, source: &Source, t: Trigger) -> bool {
        match t {
            Trigger::Signal => self.sighup = true,
            Trigger::File => self.changed |= source.stamp() != self.stamp || self.script_changed(),
        }
        self.sighup || self.changed
    }

    /// Whether to reload now (see [`note`](Self::note)); the triggers
    /// still queued are taken first. Without inotify, compares the stamp
    /// once a second.
    pub fn due(&mut self, source: &Source) -> bool {
        for t in self.watch.receiver().try_iter().collect::<Vec<_>>() {
            self.note(source, t);
        }
        let polled = !self.watch.watches_file() || self.script.as_ref().is_some_and(|s| s.2);
        if polled && self.last_poll.elapsed() >= POLL_WITHOUT_INOTIFY {
            self.last_poll = Instant::now();
            self.changed |= source.stamp() != self.stamp || self.script_changed();
        }
        let due = std::mem::take(&mut self.sighup) | std::mem::take(&mut self.changed);
        if due {
            self.stamp = source.stamp();
            if let Some(s) = &mut self.script {
                s.1 = reload::stamp(&s.0);
            }
        }
        due
    }
}

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

/// How the BPF program is opened and loaded: command-line options, not
/// config keys (they do not change on reload).
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// ops.exit_dump_len: bytes of the kernel's debug dump on an error exit (0 = default).
    pub exit_dump_len: u32,
    /// libbpf's bpf_object_open_opts (--relaxed-maps, --pin-root-path, ...).
    pub libbpf: scx_utils::libbpf_clap_opts::LibbpfOpts,
}

impl LoadOptions {
    /// Checks what libbpf would otherwise ignore: an unreadable --kconfig
    /// file drops all the open options silently.
    pub fn new(exit_dump_len: u32, libbpf: scx_utils::libbpf_clap_opts::LibbpfOpts) -> Result<LoadOptions> {
        if let Some(k) = &libbpf.kconfig {
            std::fs::read_to_string(k).with_context(|| format!("--kconfig {k}: cannot read"))?;
        }
        for (flag, v) in [
            ("--pin-root-path", &libbpf.pin_root_path),
            ("--btf-custom-path", &libbpf.btf_custom_path),
            ("--bpf-token-path", &libbpf.bpf_token_path),
        ] {
            if v.as_deref().is_some_and(|v| v.contains('\0')) {
                bail!("{flag}: a path with a NUL byte");
            }
        }
        Ok(LoadOptions { exit_dump_len, libbpf })
    }
}

/// The CPU topology from /sys, with the config's GPU -> node pins. At
/// start a pin to a node with no online CPU is a config error; read again
/// after CPU hotplug it means the node's CPUs went offline: the pins wait
/// (with a warning) for a later restart that finds the node online again.
fn read_topology(cfg: &Config, after_hotplug: bool) -> Result<Topology> {
    let mut topo = Topology::read(Path::new("/sys")).context("reading the CPU topology from /sys")?;
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
            crate::metrics::serve(addr, current.clone())?;
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
    let mut decisions = Decisions::default();
    let mut metrics = Metrics::default();
    // What the last --stats line covered: each line shows what came since.
    let mut printed = Metrics::default();
    let mut last_print = Instant::now();
    let mut last_tenant_sample = Instant::now();
    let mut prev_tenant_ns = sched.counters()?.tenant_ns[..pipeline.tenants.len()].to_vec();
    let mut n: u64 = 0;
    // GPU opens told by the kernel, with the passes since: the mark is set
    // judged once a pass saw the process (or after 50 passes: gone).
    let mut opens: Vec<(sched::GpuOpen, u32)> = Vec::new();
    // Process events since the last pass (drained while waiting too, so the
    // ring buffer does not fill), and the kernel's count of lost events.
    let mut procs: Vec<ProcEvent> = Vec::new();
    let mut lost = sched.counters()?.global[bpf_intf::zernel_global_stat_ZGSTAT_EVENT_LOST as usize];
    pipeline.set_process_events(true);
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
        let (written, full) = tracing::debug_span!("write").in_scope(|| decisions.apply(sched, pipeline.decisions()));
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
        // reload trigger ends the sleep at once.
        let period = Duration::from_millis(pipeline.cfg.phase.phase_eval_interval_ms);
        let triggers = reloader.receiver().clone();
        while let Some(left) = period.checked_sub(started.elapsed()) {
            if shutdown.load(Ordering::Relaxed) {
                break;
            }
            sched.heartbeat();
            let (told, events) = sched.events();
            procs.extend(events);
            if !told.is_empty() {
                opens.extend(told.into_iter().map(|o| (o, 0)));
                break;
            }
            let mut woken = None;
            crossbeam::select! {
                recv(req_ch) -> r => match r {
                    Ok(()) => res_ch.send(metrics.clone())?,
                    Err(e) => return Err(e.into()),
                },
                recv(triggers) -> t => woken = t.ok(),
                default(left.min(Duration::from_millis(20))) => {}
            }
            if woken.is_some_and(|t| reloader.note(source, t)) {
                break;
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
    fn only_a_changed_file_makes_a_reload_due() {
        use std::time::Duration;
        let dir = std::env::temp_dir().join(format!("zernel-reload-due-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        let cfg = dir.join("zernel.toml");
        let rule = |c: &str| format!("[[rules]]\ncomm = \"{c}\"\nclass = \"batch\"\n");
        std::fs::write(&cfg, rule("^a$")).unwrap();
        let source = Source { path: Some(cfg.clone()), mode: Mode::Auto };
        let mut r = Reloader::new(&source).unwrap();
        // The next file event.
        let next_file_event = |r: &Reloader| loop {
            match r.receiver().recv_timeout(Duration::from_secs(5)).expect("no event within 5 s") {
                Trigger::File => break Trigger::File,
                Trigger::Signal => continue,
            }
        };

        std::fs::write(dir.join("other.log"), "x").unwrap();
        let t = next_file_event(&r);
        assert!(!r.note(&source, t), "another file's change made a reload due");

        std::fs::write(&cfg, rule("^b$")).unwrap();
        let t = next_file_event(&r);
        assert!(r.note(&source, t));
        assert!(r.due(&source));
        // Taken: not due again until the file changes again.
        std::thread::sleep(Duration::from_millis(100));
        while let Ok(Trigger::File) = r.receiver().try_recv() {}
        assert!(!r.due(&source));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn config_ownership_as_root() {
        let p = |uid, mode| Perm { uid, mode };
        let dir = Some(p(0, 0o40755));
        // Root's file in a root directory.
        assert_eq!(judge_owner(p(0, 0o100644), dir, None), Ok(None));
        assert_eq!(judge_owner(p(0, 0o100600), dir, Some(1000)), Ok(None));
        // The sudo user's own file (a checkout): accepted, with a warning.
        let w = judge_owner(p(1000, 0o100644), Some(p(1000, 0o40755)), Some(1000)).unwrap().unwrap();
        assert!(w.contains("uid 1000, the user who ran sudo"), "{w}");
        // Another user's file, or one with no sudo in the picture.
        let e = judge_owner(p(1001, 0o100644), dir, Some(1000)).unwrap_err();
        assert!(e.contains("owned by uid 1001, neither root nor the user who ran sudo"), "{e}");
        assert!(judge_owner(p(1000, 0o100644), dir, None).is_err());
        // Writable by group or others, whoever owns it.
        for mode in [0o100664, 0o100646, 0o100666] {
            let e = judge_owner(p(0, mode), dir, None).unwrap_err();
            assert!(e.starts_with("writable by group or others"), "{mode:o}: {e}");
            assert!(judge_owner(p(1000, mode), dir, Some(1000)).is_err(), "{mode:o}");
        }
        // A directory others can write: refused, unless it has the sticky bit (/tmp).
        let e = judge_owner(p(1000, 0o100644), Some(p(1000, 0o40777)), Some(1000)).unwrap_err();
        assert!(e.contains("directory writable by group or others without the sticky bit (mode 777)"), "{e}");
        assert!(judge_owner(p(0, 0o100644), Some(p(0, 0o40775)), None).is_err());
        assert_eq!(judge_owner(p(0, 0o100644), Some(p(0, 0o41777)), None), Ok(None));
        assert!(judge_owner(p(1000, 0o100644), Some(p(0, 0o41777)), Some(1000)).unwrap().is_some());
        // SUDO_UID=0 makes no one else root.
        assert!(judge_owner(p(1000, 0o100644), dir, Some(0)).is_err());
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
