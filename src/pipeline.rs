//! The pipeline from /proc to decisions, with no BPF in it:
//!
//! ```text
//!   GpuProvider::refresh ─> Observer::poll ─> Snapshot
//!     ─> PhaseDetector::update (threads with a new sample or change)
//!     ─> rules (new, renamed, exec'd or moved threads only)
//!     ─> PolicyConfig::decide ─> policy script (facts changed only)
//!     ─> (tid, start time, decision) of every decided thread
//! ```
//! The daemon (attached) and `scx_zernel observe` (not) both run it.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use rustc_hash::FxHashMap;
use tracing::{debug, info, warn};

use crate::config::Config;
use crate::events::{GpuOpen, ProcEvent};
use crate::gpu::{self, GpuProvider};
use crate::observe::{Changes, Observer, ProcessView, Snapshot};
use crate::phase::{Phase, PhaseDetector};
use crate::policy::{Decision, Facts};
use crate::policy_script::{self, Reopened, Script, ScriptStats, ThreadFacts};
use crate::rules::{Identity, Rules};
use crate::tenants::Tenants;
use crate::topology::Topology;

/// Everything from /proc to decisions: no BPF in here, so it can also run
/// where nothing is attached.
pub struct Pipeline {
    pub cfg: Config,
    rules: Rules,
    pub tenants: Tenants,
    /// The tenants changed (reload): their weights must reach the kernel.
    pub tenants_changed: bool,
    topo: Topology,
    observer: Observer,
    gpu: Box<dyn GpuProvider>,
    detector: PhaseDetector,
    /// Per thread: the rule it matched and the decision in force.
    threads: FxHashMap<u32, Held>,
    /// What changed in the last pass.
    changed: Vec<Change>,
    /// GPUs of each process at its last decision: a change re-decides its
    /// threads (their node, the script's `gpus`).
    proc_gpus: FxHashMap<i32, Arc<[u32]>>,
    /// The GPU provider's devices at the last pass (index, PCI address).
    gpu_devices: Vec<(u32, String)>,
    /// Passes run; a pass whose number is 1 modulo [`FULL_PASS_EVERY`]
    /// decides every thread.
    passes: u64,
    /// The next pass decides every thread (reload, topology).
    full_due: bool,
    /// The next pass reports every decision as changed (a new map).
    resync: bool,
    /// `[policy] script`, with its verdicts cached per thread.
    script: Option<Script>,
    /// Counters of the scripts replaced by reloads (the stats are cumulative).
    script_retired: ScriptStats,
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
            threads: FxHashMap::default(),
            changed: Vec::new(),
            proc_gpus: FxHashMap::default(),
            gpu_devices: Vec::new(),
            passes: 0,
            full_due: true,
            resync: false,
        })
    }

    /// The kernel saw process `pid` open a GPU device: ML in the next pass.
    pub(crate) fn note_gpu_open(&mut self, o: &GpuOpen) {
        let what = format!("device open {}:{} by tid {}", o.major, o.minor, o.tid);
        self.observer.note_device_open(o.pid as i32, o.start_ticks, &what);
    }

    /// Whether the kernel's process events come (see
    /// [`Observer::set_process_events`]); the observer takes them unless
    /// `observe.process_events` is false.
    pub fn set_process_events(&mut self, live: bool) {
        self.process_events = live;
        self.observer.set_process_events(live && self.cfg.observe.process_events);
    }

    /// What the kernel told of (fork, exec, exit, rename, cgroup move) since
    /// the last pass.
    pub(crate) fn note_process_events(&mut self, events: &[ProcEvent]) {
        self.observer.note_process_events(events);
    }

    /// The kernel lost events: /proc is listed in the next pass.
    pub(crate) fn note_events_lost(&mut self) {
        self.observer.note_events_lost();
    }

    /// The decisions go to a new, empty map (the scheduler was attached
    /// again): the next pass reports all of them in [`changed`](Self::changed).
    pub(crate) fn resync(&mut self) {
        self.resync = true;
    }

    /// Takes a topology read again after CPU hotplug.
    pub(crate) fn set_topology(&mut self, topo: Topology) {
        self.topo = topo;
        self.full_due = true;
    }

    /// Takes a new configuration (rules, policy, phase thresholds, GPU
    /// source); the scheduler section needs a restart and is kept.
    pub(crate) fn reconfigure(&mut self, mut cfg: Config) -> Result<()> {
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
            self.observer.set_process_events(self.process_events && cfg.observe.process_events);
        }
        if cfg.phase != self.cfg.phase {
            self.detector = PhaseDetector::new(cfg.phase.clone());
        }
        self.tenants_changed |= cfg.tenants != self.cfg.tenants || cfg.tenancy != self.cfg.tenancy;
        self.rules = rules;
        self.tenants = tenants;
        self.topo = topo;
        // Rules are matched again, and every thread decided again.
        for h in self.threads.values_mut() {
            h.slot = None;
        }
        self.full_due = true;
        self.cfg = cfg;
        Ok(())
    }

    /// One pass: observe, match rules, detect phases, decide. Afterwards
    /// [`snapshot`](Self::snapshot) holds what was seen,
    /// [`changed`](Self::changed) the decisions that changed and
    /// [`decisions`](Self::decisions) all those in force.
    ///
    /// Only threads whose facts may have changed are decided again: a
    /// change the observer flags on the thread or its process (new, renamed,
    /// exec, cgroup, ML, role, parent), a phase change, or a change of the
    /// process's GPUs. Every [`FULL_PASS_EVERY`] passes, and after a reload
    /// or a topology change, every thread is, which bounds how long anything
    /// else (a parent's new name, say) can go unseen.
    pub fn pass(&mut self) {
        self.passes += 1;
        let resync = std::mem::take(&mut self.resync);
        let mut full = std::mem::take(&mut self.full_due) || resync || self.passes % FULL_PASS_EVERY == 1;
        self.changed.clear();
        self.gpu.refresh();
        // GPU index -> PCI address (-> NUMA node) from the provider's own list.
        let devices = self.gpu.devices();
        if devices.len() != self.gpu_devices.len()
            || devices.iter().zip(&self.gpu_devices).any(|(d, (i, a))| d.index != *i || d.pci_bus_id != *a)
        {
            self.gpu_devices = devices.iter().map(|d| (d.index, d.pci_bus_id.clone())).collect();
            let list: Vec<(u32, &str)> = self.gpu_devices.iter().map(|(i, a)| (*i, a.as_str())).collect();
            self.topo.set_gpu_devices(&list);
            full = true;
        }
        let snap = self.observer.poll(self.gpu.as_ref());
        for g in &snap.gone {
            let tid = g.tid as u32;
            if self.threads.get(&tid).is_some_and(|h| h.start_ticks == g.start_ticks) {
                let h = self.threads.remove(&tid).expect("looked up");
                if h.decision.is_some() {
                    self.changed.push(Change { tid, start_ticks: h.start_ticks, decision: None });
                }
                if let Some(s) = &mut self.script {
                    s.forget(tid);
                }
            }
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
        let mut phase_changed: Vec<u32> = Vec::new();
        let mut also_visit: Vec<i32> = Vec::new();
        for c in self.detector.update(snap) {
            also_visit.push(c.tgid);
            if tracing::enabled!(tracing::Level::DEBUG) {
                let comm = snap.threads.iter().find(|t| t.tid == c.tid).map_or("?", |t| &t.comm);
                debug!("phase tid={} pid={} comm={comm:?} {} -> {}", c.tid, c.tgid, c.from, c.to);
            }
            phase_changed.push(c.tid as u32);
        }
        phase_changed.sort_unstable();
        // Processes whose GPUs changed (few processes have any).
        let mut gpus_changed: Vec<i32> = Vec::new();
        for p in &snap.processes {
            let before = self.proc_gpus.get(&p.pid);
            if before.map_or(!p.gpu.devices.is_empty(), |b| **b != *p.gpu.devices) {
                gpus_changed.push(p.pid);
                if p.gpu.devices.is_empty() {
                    self.proc_gpus.remove(&p.pid);
                } else {
                    self.proc_gpus.insert(p.pid, p.gpu.devices.clone());
                }
            }
        }
        if full {
            self.proc_gpus.retain(|pid, _| snap.process(*pid).is_some());
        }
        // Rules: matched only for threads that are new, renamed, or whose
        // process exec'd or moved (and for all after a reload). Then the
        // policy (and the script) decides.
        let mut forced = Vec::new();
        if full {
            if let Some(s) = &mut self.script {
                s.begin_pass();
            }
        }
        // Only the threads of processes that changed, or whose threads
        // changed phase or GPUs, can pass the test below (all of them in a
        // full pass).
        also_visit.extend_from_slice(&gpus_changed);
        let visit = snap.threads_to_visit(full, &also_visit);
        for t in visit.into_iter().flat_map(|r| &snap.threads[r]) {
            let p = snap.process_of(t);
            let tid = t.tid as u32;
            let changed = !t.changes.is_empty() || !p.changes.is_empty();
            if !(full
                || changed
                || phase_changed.binary_search(&tid).is_ok()
                || (!gpus_changed.is_empty() && gpus_changed.contains(&p.pid)))
            {
                continue;
            }
            let held = self.threads.entry(tid).or_insert(Held {
                start_ticks: t.start_ticks,
                slot: None,
                decision: None,
                seen: 0,
            });
            let recycled = held.start_ticks != t.start_ticks;
            if recycled {
                // A recycled tid: another thread.
                if let Some(s) = &mut self.script {
                    s.forget(tid);
                }
                *held = Held { start_ticks: t.start_ticks, slot: None, decision: held.decision, seen: 0 };
            }
            held.seen = self.passes;
            let slot = match held.slot {
                Some(slot) if !changed => slot,
                _ => {
                    let m = self.rules.first_match(&identity(p, &t.comm));
                    if t.tid == p.pid {
                        forced.push((p.pid, m.is_some_and(|m| m.ml).then_some(true)));
                    }
                    let slot = m.map_or(0, |m| m.index as u32 + 1);
                    held.slot = Some(slot);
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
            if held.decision != d || ((recycled || resync) && d.is_some()) {
                held.decision = d;
                self.changed.push(Change { tid, start_ticks: t.start_ticks, decision: d });
            }
        }
        if full {
            if let Some(s) = &mut self.script {
                s.end_pass();
            }
            // Threads no longer in the snapshot that no `gone` told of.
            let (passes, changed) = (self.passes, &mut self.changed);
            self.threads.retain(|&tid, h| {
                let keep = h.seen == passes;
                if !keep && h.decision.is_some() {
                    changed.push(Change { tid, start_ticks: h.start_ticks, decision: None });
                }
                keep
            });
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

    /// The decisions that changed in the last pass. What
    /// `Decisions::apply` (decisions.rs) writes.
    pub fn changed(&self) -> &[Change] {
        &self.changed
    }

    /// (tid, start time, decision) of every thread that has a decision.
    pub fn decisions(&self) -> impl Iterator<Item = (u32, u64, &Decision)> + '_ {
        self.threads.iter().filter_map(|(tid, h)| Some((*tid, h.start_ticks, h.decision.as_ref()?)))
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
    pub(crate) fn rule_match(&self, tid: u32) -> Option<crate::rules::Match> {
        match_of(&self.rules, self.threads.get(&tid)?.slot?)
    }

    /// What the pipeline counts (the stats copy it into their metrics).
    pub fn counts(&self) -> PipelineCounts {
        let snap = self.snapshot();
        let s = self.detector.stats();
        let mut script = self.script_retired;
        if let Some(s) = &self.script {
            script.add(&s.stats());
        }
        let (e, l) = self.observer.discovery_counts();
        PipelineCounts {
            threads: snap.threads.len() as u64,
            ml_threads: snap.threads.iter().filter(|t| t.ml).count() as u64,
            phase_data_loading: s.threads_in(Phase::DataLoading),
            phase_gpu_compute: s.threads_in(Phase::GpuCompute),
            phase_nccl_collective: s.threads_in(Phase::NcclCollective),
            phase_optimizer_step: s.threads_in(Phase::OptimizerStep),
            phase_transitions: s.transitions,
            observe_pass_us: snap.pass_ns / 1000,
            script,
            proc_events: self.discovery_retired.0 + e,
            proc_listings: self.discovery_retired.1 + l,
        }
    }
}

/// A thread's decision that changed in a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Change {
    pub tid: u32,
    /// The thread's start time (USER_HZ ticks), for the map entry.
    pub start_ticks: u64,
    /// The new decision, or None for one withdrawn: the thread is gone or
    /// has none now.
    pub decision: Option<Decision>,
}

/// The pipeline's counters: threads seen, threads in each phase, the last
/// pass's time, the policy script's calls, the observer's discoveries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PipelineCounts {
    /// Threads in the last snapshot.
    pub threads: u64,
    /// Of which threads of ML processes.
    pub ml_threads: u64,
    /// Tracked threads in each phase.
    pub phase_data_loading: u64,
    pub phase_gpu_compute: u64,
    pub phase_nccl_collective: u64,
    pub phase_optimizer_step: u64,
    /// Phase transitions since start.
    pub phase_transitions: u64,
    /// How long the last observer pass took.
    pub observe_pass_us: u64,
    /// The policy scripts' counters since start (replaced scripts included).
    pub script: ScriptStats,
    /// Processes discovered from the kernel's process events, and /proc
    /// listings, since start.
    pub proc_events: u64,
    pub proc_listings: u64,
}

/// Waits out the rest of the pass period that began at `started`: calls
/// `wait(left)`, which should block for at most `left`, until the period is
/// over, `shutdown` is set, or `wait` returns false (woken for a reason
/// that ends the wait).
pub(crate) fn until_next_pass<E>(
    started: Instant,
    period: Duration,
    shutdown: &AtomicBool,
    mut wait: impl FnMut(Duration) -> Result<bool, E>,
) -> Result<(), E> {
    while let Some(left) = period.checked_sub(started.elapsed()) {
        if shutdown.load(Ordering::Relaxed) || !wait(left)? {
            break;
        }
    }
    Ok(())
}

/// Every this many passes every thread is decided again, not only those
/// whose facts changed (1 s at the default 100 ms period).
pub(crate) const FULL_PASS_EVERY: u64 = 10;

/// What the pipeline holds for a thread.
struct Held {
    /// Start time of the thread the entry is for (a recycled tid is another).
    start_ticks: u64,
    /// The rule matched when the thread appeared, was renamed or its process
    /// exec'd or moved (index + 1, 0 for none); None: to be matched.
    slot: Option<u32>,
    /// The decision in force.
    decision: Option<Decision>,
    /// The last pass that decided it.
    seen: u64,
}

/// The Match a [`Held::slot`] stands for.
fn match_of(rules: &Rules, slot: u32) -> Option<crate::rules::Match> {
    slot.checked_sub(1).and_then(|i| rules.at(i as usize))
}

fn identity<'a>(p: &'a ProcessView, comm: &'a str) -> Identity<'a> {
    Identity { comm, cmdline: &p.cmdline, cgroup: &p.cgroup, parent_comm: &p.parent_comm, uid: p.uid, gid: p.gid }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::class::Class;
    use crate::observe::fixture::{hog_and_web, write_proc, FakeProc, FakeThread, TempDir};
    use crate::rules::RuleConfig;

    fn rule(comm: &str, class: Class) -> RuleConfig {
        RuleConfig { comm: Some(comm.into()), class: Some(class), ..Default::default() }
    }

    /// (tid, class or None for withdrawn) of the last pass's changes, sorted.
    fn changes(p: &Pipeline) -> Vec<(u32, Option<Class>)> {
        let mut v: Vec<_> = p.changed().iter().map(|c| (c.tid, c.decision.map(|d| d.class))).collect();
        v.sort();
        v
    }

    #[test]
    fn a_pass_reports_only_the_decisions_that_changed() {
        let dir = TempDir::new("pipeline-changed");
        let root = dir.path().join("proc");
        std::fs::create_dir(&root).unwrap();
        hog_and_web(&root);
        let mut cfg = Config::default();
        cfg.observe.proc_root = root.display().to_string();
        cfg.rules = vec![rule("^hog", Class::Batch)];
        let mut p = Pipeline::new(cfg.clone(), Topology::default()).unwrap();

        p.pass();
        assert_eq!(changes(&p), vec![(100, Some(Class::Batch)), (101, Some(Class::Batch))]);
        // Nothing changed: nothing to write, through a whole cycle of
        // passes, full ones included; the decisions stay in force.
        for _ in 0..FULL_PASS_EVERY + 1 {
            p.pass();
            assert_eq!(changes(&p), vec![]);
        }
        assert_eq!(p.decisions().count(), 2);
        // A new map (the scheduler attached again): everything again.
        p.resync();
        p.pass();
        assert_eq!(changes(&p), vec![(100, Some(Class::Batch)), (101, Some(Class::Batch))]);
        // A reload that changes the rules: the new decisions, and the one
        // withdrawn from a thread no rule names any more.
        cfg.rules = vec![rule("^hog$", Class::Latency), rule("^web", Class::Batch)];
        p.reconfigure(cfg).unwrap();
        p.pass();
        assert_eq!(changes(&p), vec![(100, Some(Class::Latency)), (101, None), (200, Some(Class::Batch))]);
        // A process that exits: its decision is withdrawn.
        std::fs::remove_dir_all(root.join("200")).unwrap();
        let mut gone = false;
        for _ in 0..3 * FULL_PASS_EVERY {
            p.pass();
            if changes(&p) == vec![(200, None)] {
                gone = true;
                break;
            }
        }
        assert!(gone, "the exited process's decision was not withdrawn");
        assert_eq!(p.decisions().map(|(tid, _, _)| tid).collect::<Vec<_>>(), vec![100]);
    }

    #[test]
    fn a_rename_in_a_settled_process_is_decided_in_the_next_pass_not_the_next_full_one() {
        let dir = TempDir::new("pipeline-settled");
        let root = dir.path().join("proc");
        std::fs::create_dir(&root).unwrap();
        let mut big = FakeProc::new(300, 1, "server");
        for tid in 301..=500 {
            big.threads.push(FakeThread::new(tid, "worker"));
        }
        write_proc(&root, &big);
        let mut cfg = Config::default();
        cfg.observe.proc_root = root.display().to_string();
        cfg.observe.thread_name_interval_ms = 10;
        cfg.rules = vec![rule("^backup", Class::Batch)];
        let mut p = Pipeline::new(cfg, Topology::default()).unwrap();
        // Settled: the process's threads are no longer walked in the
        // passes between full ones.
        for _ in 0..FULL_PASS_EVERY + 2 {
            p.pass();
            std::thread::sleep(std::time::Duration::from_millis(15));
        }
        while p.passes % FULL_PASS_EVERY != 1 {
            p.pass();
            std::thread::sleep(std::time::Duration::from_millis(15));
        }
        assert_eq!(p.snapshot().touched.as_deref(), Some(&[][..]), "nothing changed in a settled pass");
        // A thread renames itself: its name check (due every pass here) sees
        // it, and the rule decides it in that pass.
        big.thread(420).comm = "backup-7".into();
        write_proc(&root, &big);
        p.pass();
        assert_ne!(p.passes % FULL_PASS_EVERY, 1, "not a full pass");
        assert_eq!(changes(&p), vec![(420, Some(Class::Batch))]);
    }
}
