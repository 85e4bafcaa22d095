//! The /proc observer: which processes are ML jobs, what each of their
//! threads is for, and what each thread did since the previous pass.
//!
//! The daemon calls [`Observer::poll`] every `phase.loop_interval_ms`
//! (100 ms by default), right after refreshing its
//! [`GpuProvider`](crate::gpu::GpuProvider). A pass turns /proc and the GPU
//! data into a [`Snapshot`]; it knows nothing of phases, policies or BPF.
//!
//! # One pass
//!
//! ```text
//!  /proc/loadavg moved? ──yes──> getdents /proc (fd kept open) ──> pids
//!  (or every rescan_interval; with process events: only every
//!   RECONCILE_RESCANS rescan intervals)                              │
//!  process events: fork ─> new pid; exec ─> rescan it; ─────────────>│
//!                  exit ─> gone once /proc/PID is (reaped);          │
//!                  rename ─> re-read that name; cgroup move ─> re-read it
//!                            ┌───────────────────────────────────────┘
//!                            ├─ new pid ──────> discover: stat, status, cmdline, exe,
//!                            │                  cgroup, environ, fds, maps, threads
//!                            ├─ vanished ─────> all its threads into `gone`
//!                            └─ known pid
//!                                 │ ML process: every pass     non-ML: every rescan_interval
//!                                 v                             v
//!                       pread main-thread stat: rename? reparent? thread count?
//!                                 │   (+ exe, cmdline: exec?; cgroup; fds/maps if the
//!                                 │    vsize changed and the process is not ML yet)
//!                                 v
//!                       threads: relist task/ if the count changed; names told
//!                       and names due re-read (back-off); ML threads sampled
//!                                 │
//!  GPU provider ──> classify_processes: own evidence | GPU user | forced | ancestor ML
//!                                 │  -> ml flag, DataLoader process, roles, GPUs
//!                                 v
//!                             Snapshot
//! ```
//!
//! # Cost
//!
//! On the reference VM (2 vCPUs) a /proc syscall costs 1.5–10 µs, so the
//! observer does per-pass work only where phases are detected:
//!
//! * Listing /proc walks every task of the system in the kernel (~100 µs
//!   here, more with many threads), so it is done only when
//!   /proc/loadavg's latest pid or task count moved (a task was created or
//!   exited), and at least every `rescan_interval_ms`. When the scheduler
//!   passes on the kernel's process events (fork, exec, exit:
//!   [`Observer::note_process_events`]) a forked process is discovered at
//!   the next pass from its event, an exec'd one rescanned then, an exited
//!   one let go of once reaped, and /proc is listed only every
//!   [`RECONCILE_RESCANS`] rescan intervals, or at once when the kernel lost
//!   events.
//! * Non-ML processes cost one stat pread per `rescan_interval_ms` (and a
//!   cgroup pread, an exe readlink and a cmdline pread: with process
//!   events, which tell of an exec, a rename and a cgroup move at once,
//!   those three only every [`RECONCILE_RESCANS`] rescans), and one comm
//!   pread per thread on a back-off schedule (200 ms after it appears,
//!   doubling up to `thread_name_interval_ms`; with process events, up to
//!   [`RECONCILE_RESCANS`] times that) to catch renames.
//! * A file the kernel shows as one record (a task's stat, schedstat,
//!   status, comm...) is read with one pread; the snapshot copies only the
//!   threads whose view changed since the previous pass.
//! * No per-pass walk over every thread: the name checks due come off a
//!   per-process queue, and a process none of whose threads changed is
//!   left out of the pass's walks (reset, roles, the snapshot's copy) and
//!   out of [`Snapshot::touched`], which the phase detector and the
//!   pipeline visit instead of every thread (all of them in their periodic
//!   full passes). A walk over thousands of idle threads' entries misses
//!   the cache at every one; the daemon pays for what changed.
//! * Threads of ML processes cost one schedstat pread per pass (~1.5 µs);
//!   only threads that were runnable ≥ `active_busy_frac` of the interval
//!   also get stat, status and io (~20 µs). With the kernel's task
//!   iterator (taskiter.rs; `thread_counters = "kernel"`, where it loads;
//!   ~0.85 µs of CPU per thread per read at 100 ms, every thread every
//!   pass) all of that is one read() per ML process per pass
//!   returning a binary record per thread, which also lists the threads
//!   (no task/ readdir) and names them (no comm reads); a held-back
//!   thread is sampled as soon as its record shows it was active since
//!   the previous pass, and no process CPU-time check is needed.
//! * Pool threads (role Other) quiet for a second are held back: every
//!   `quiet_sample_interval_ms` the process's own stat (its CPU time, all
//!   threads summed by the kernel) is compared with what the samples since
//!   the previous check account for. Unaccounted time (net of a 5 % drain,
//!   the trickle of idle pools) of three clock ticks or more means a held
//!   thread woke up: all of them are sampled in that pass. Otherwise they
//!   wait, at most 90-150 intervals each. Held threads skip their name checks
//!   too: a new name is seen by the detailed read once they are active.
//!
//! ```text
//!   process CPU since last check ── Σ samples since ──> unaccounted ≥ 30 ms?
//!   (one pread, O(threads) in the kernel)                │yes         │no
//!                                                 sample every     wait (each is
//!                                                 held thread      still sampled
//!                                                                  every 90-150 checks)
//! ```
//! * An ML process whose main thread is stopped (state T: a SIGSTOP, a
//!   suspended job) costs its main-thread stat per pass: none of its
//!   threads can run, so none is sampled and its names wait. The pass after
//!   it resumes takes baselines, so no delta reads the stop as idle time.
//! * Files read repeatedly stay open and are re-read with pread at offset 0
//!   (procfile.rs); buffers are reused.
//!
//! # ML processes
//!
//! A process is ML when it has evidence of its own (evidence.rs), when the
//! GPU provider lists it as a GPU user, when an ancestor within
//! `ml_inherit_depth` generations is ML (DataLoader workers are children of
//! the trainer), when the kernel saw it open a GPU device
//! ([`Observer::note_device_open`], from the BPF side's ring buffer: at
//! once, with no fd or maps scan), or when the rules engine forces it with
//! [`Observer::set_forced_ml`] (which wins, both ways). Evidence is cached
//! per process incarnation (pid + start time) and re-evaluated after an exec
//! (exe or cmdline change) or a rename. A child of an ML process is a DataLoader process
//! when its name says so (`pt_data_worker`), when it is a
//! forked Python child (same interpreter and cmdline as its parent), or a
//! multiprocessing spawn/forkserver child.
//!
//! Vanishing pids, unreadable files and absurd values are normal input:
//! they are skipped, never a panic.
//!
//! # Using it
//!
//! ```text
//! gpu.refresh();
//! let snap = observer.poll(gpu.as_ref());      // &Snapshot, valid until the next poll
//! for p in &snap.processes { ... }             // p.changes: NEW / EXEC / RENAMED / CGROUP / ML / PARENT
//! for t in &snap.threads { ... }               // t.changes: NEW / RENAMED / ML: evaluate rules on these
//! let changes = detector.update(snap);
//! observer.set_forced_ml(pid, Some(true));      // rule verdicts: effective at the next poll
//! ```
//! Forcing must go through [`Observer::set_forced_ml`]: flipping `ml` in a
//! copy of the snapshot would not make the observer sample the threads, so
//! they would have no deltas and never leave Unknown.

mod evidence;
mod process;
mod procfile;
mod roles;
pub mod taskiter;
mod thread;
mod types;

#[cfg(test)]
pub(crate) mod fixture;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use procfs::FromRead;

pub use crate::config::{ObserveConfig, ThreadCounters};
pub use evidence::resolve_visible_devices;
pub use roles::{role_from_name, thread_role};
pub use thread::QUIET_FALLBACK_FACTOR;
pub use types::*;

use crate::events::{ProcEvent, ProcEventKind};
use crate::gpu::GpuProvider;
use evidence::{is_multiprocessing_child, is_python, EvidenceMatcher};
use process::{ProcEntry, ProcSettings};
use procfile::{DirFile, FdBudget, ProcFile, ReadBuf};
use taskiter::{TaskIter, ThreadRec};
use thread::PassCtx;

/// Reads /proc (and the GPU provider) into [`Snapshot`]s.
pub struct Observer {
    root: PathBuf,
    matcher: EvidenceMatcher,
    budget: FdBudget,
    buf: ReadBuf,
    dir_buf: ReadBuf,
    pids: Vec<i32>,
    tids: Vec<i32>,
    proc_dir: DirFile,
    loadavg: ProcFile,
    /// (latest pid, number of tasks) from /proc/loadavg at the last listing.
    last_load: Option<(u32, u32)>,
    next_listing: Instant,
    procs: BTreeMap<i32, ProcEntry>,
    snap: Snapshot,
    last_pass: Option<Instant>,
    rescan_interval: Duration,
    evidence_interval: Duration,
    quiet_interval: Duration,
    name_interval: Duration,
    active_busy_frac: f64,
    inherit_depth: u32,
    warned_root: bool,
    /// Device opens told for processes not discovered yet: pid -> (start
    /// time, description, when told); applied at discovery.
    opens_pending: HashMap<i32, (u64, Arc<str>, Instant)>,
    /// The kernel tells of new, exec'd and exited processes
    /// ([`note_process_events`](Self::note_process_events)): /proc is then
    /// listed only every [`RECONCILE_RESCANS`] rescan intervals.
    events_live: bool,
    /// Processes told of as new, discovered at the next pass.
    told_new: Vec<i32>,
    /// Processes told of as exited: (pid, start time, passes since), let go
    /// of once /proc/PID is gone (reaped), for at most 50 passes.
    told_exit: Vec<(i32, u64, u32)>,
    /// Process events taken, and listings of /proc, since start.
    events_taken: u64,
    listings: u64,
    /// The kernel's task iterator (taskiter.rs), when loaded.
    iter: Option<TaskIter>,
    iter_buf: Vec<u8>,
    recs: Vec<ThreadRec>,
}

/// With the kernel's process events, /proc is listed (a reconciliation:
/// whatever the events missed) every this many rescan intervals (5 s by
/// default), instead of whenever a task was created or exited.
pub(crate) const RECONCILE_RESCANS: u32 = 5;

/// Result of classifying one process.
struct ProcessVerdict {
    ml: bool,
    evidence: MlEvidence,
    /// The evidence described, when the evidence changed.
    detail: Option<Arc<str>>,
    loader: bool,
    /// The parent's name (None: no parent known).
    parent_comm: Option<Arc<str>>,
}

impl Observer {
    /// An observer reading `cfg.proc_root`. Raises RLIMIT_NOFILE to fit
    /// `max_cached_fds` when allowed.
    pub fn new(cfg: &ObserveConfig) -> Observer {
        let limit = FdBudget::fit_rlimit(cfg.max_cached_fds as usize);
        Observer {
            root: PathBuf::from(&cfg.proc_root),
            matcher: EvidenceMatcher::new(cfg),
            budget: FdBudget::new(limit),
            buf: ReadBuf::default(),
            dir_buf: ReadBuf::default(),
            pids: Vec::new(),
            tids: Vec::new(),
            proc_dir: DirFile::default(),
            loadavg: ProcFile::default(),
            last_load: None,
            next_listing: Instant::now(),
            procs: BTreeMap::new(),
            snap: Snapshot::default(),
            last_pass: None,
            rescan_interval: Duration::from_millis(cfg.rescan_interval_ms),
            evidence_interval: Duration::from_millis(cfg.evidence_interval_ms),
            quiet_interval: Duration::from_millis(cfg.quiet_sample_interval_ms),
            name_interval: Duration::from_millis(cfg.thread_name_interval_ms),
            active_busy_frac: cfg.active_busy_frac,
            inherit_depth: cfg.ml_inherit_depth,
            warned_root: false,
            opens_pending: HashMap::new(),
            events_live: false,
            told_new: Vec::new(),
            told_exit: Vec::new(),
            events_taken: 0,
            listings: 0,
            iter: load_task_iter(cfg),
            iter_buf: Vec::new(),
            recs: Vec::new(),
        }
    }

    /// Where the counters of ML threads come from: "kernel" (the task
    /// iterator) or "proc".
    pub fn thread_counters(&self) -> ThreadCounters {
        if self.iter.is_some() {
            ThreadCounters::Kernel
        } else {
            ThreadCounters::Proc
        }
    }

    /// The kernel's process events are (`true`) or are no longer coming:
    /// with them, new processes are discovered from the events and /proc is
    /// listed only as a reconciliation; without, whenever /proc/loadavg
    /// shows a task was created or exited.
    pub fn set_process_events(&mut self, live: bool) {
        self.events_live = live;
        self.next_listing = Instant::now();
    }

    /// Processes the kernel told of since the last pass: a new one is
    /// discovered in the next pass (a recycled pid's old process is gone
    /// first), an exec'd one is rescanned then, an exited one let go of
    /// once its /proc directory is gone; a renamed thread's name and a
    /// moved process's cgroup are read again then. Ignored unless
    /// [`set_process_events`](Self::set_process_events) turned them on.
    pub(crate) fn note_process_events(&mut self, events: &[ProcEvent]) {
        if !self.events_live {
            return;
        }
        let now = Instant::now();
        self.events_taken += events.len() as u64;
        for e in events {
            let known = self.procs.get_mut(&e.pid);
            match (e.kind, known) {
                (ProcEventKind::New, Some(p)) if p.view.start_ticks == e.start_ticks => {}
                // A recycled pid: the rescan finds another start time, and
                // the pass lets the old process go and discovers the new one.
                (ProcEventKind::New | ProcEventKind::Exec, Some(p)) => p.rescan_now(now),
                (ProcEventKind::New | ProcEventKind::Exec, None) => self.told_new.push(e.pid),
                (ProcEventKind::Exit, Some(_)) => self.told_exit.push((e.pid, e.start_ticks, 0)),
                (ProcEventKind::Rename, Some(p)) if p.view.start_ticks == e.start_ticks => p.rename_told(e.tid, now),
                (ProcEventKind::CgroupMove, Some(p)) if p.view.start_ticks == e.start_ticks => p.cgroup_told(now),
                // Not known yet (or another incarnation): its discovery
                // reads names and cgroup anyway.
                (ProcEventKind::Exit | ProcEventKind::Rename | ProcEventKind::CgroupMove, _) => {}
            }
        }
    }

    /// The kernel lost process events (its ring buffer was full): /proc is
    /// listed in the next pass.
    pub(crate) fn note_events_lost(&mut self) {
        self.next_listing = Instant::now();
    }

    /// (process events taken, /proc listings) since start.
    pub(crate) fn discovery_counts(&self) -> (u64, u64) {
        (self.events_taken, self.listings)
    }

    /// Forces a process to be ML (`Some(true)`), never ML (`Some(false)`),
    /// or back to automatic detection (`None`). For the rules engine: call it
    /// for processes whose `changes` are not empty; it takes effect at
    /// the next [`poll`](Self::poll) and lasts until the process exits or
    /// execs another program (an exec shows up as [`Changes::EXEC`], when
    /// rules are evaluated again). Children inherit a forced ML flag like
    /// any other. Returns false when the pid is unknown.
    pub(crate) fn set_forced_ml(&mut self, pid: i32, force: Option<bool>) -> bool {
        match self.procs.get_mut(&pid) {
            Some(p) => {
                p.forced = force;
                true
            }
            None => false,
        }
    }

    /// The kernel saw process `pid` (started at `start_ticks`) open a GPU
    /// device: it is ML from the next [`poll`](Self::poll) on (evidence
    /// `device_open`, described by `what`), until it exits or execs. A pid
    /// not discovered yet gets it at discovery, if that comes within a
    /// rescan interval and its start time matches.
    pub(crate) fn note_device_open(&mut self, pid: i32, start_ticks: u64, what: &str) {
        match self.procs.get_mut(&pid) {
            Some(p) if p.view.start_ticks == start_ticks => p.device_open = Some(Arc::from(what)),
            Some(_) => {}
            None => {
                self.opens_pending.insert(pid, (start_ticks, Arc::from(what), Instant::now()));
            }
        }
    }

    /// The snapshot of the last pass.
    pub fn snapshot(&self) -> &Snapshot {
        &self.snap
    }

    /// Whether /proc must be listed in this pass: when a task was created
    /// or exited since the last listing (the latest pid or the task count
    /// of /proc/loadavg moved), and at least every `rescan_interval_ms`.
    /// Listing /proc costs the kernel a walk over every task of the system.
    fn listing_due(&mut self, now: Instant) -> bool {
        if self.events_live {
            let due = now >= self.next_listing;
            if due {
                self.next_listing = now + self.rescan_interval * RECONCILE_RESCANS;
            }
            return due;
        }
        let (root, budget, buf) = (&self.root, &self.budget, &mut self.dir_buf);
        let load = self
            .loadavg
            .read(|| root.join("loadavg"), budget, buf)
            .ok()
            .and_then(|()| procfs::LoadAverage::from_read(buf.bytes()).ok())
            .map(|l| (l.latest_pid, l.max));
        let due = load.is_none() || load != self.last_load || now >= self.next_listing;
        if due {
            self.last_load = load;
            self.next_listing = now + self.rescan_interval;
        }
        due
    }

    /// One pass over /proc. `gpu` should have been refreshed just before.
    /// See the module doc.
    pub fn poll(&mut self, gpu: &dyn GpuProvider) -> &Snapshot {
        let start = Instant::now();
        let elapsed = self.last_pass.map(|t| start.saturating_duration_since(t)).unwrap_or_default();
        self.last_pass = Some(start);
        let mut gone = Vec::new();
        for p in self.procs.values_mut() {
            p.begin_pass();
        }
        let mut new_pids = Vec::new();
        if self.listing_due(start) {
            self.listings += 1;
            let listed =
                self.proc_dir.list_numeric(|| self.root.clone(), &self.budget, &mut self.dir_buf, &mut self.pids);
            if let Err(e) = listed {
                if !self.warned_root {
                    tracing::warn!("observe: cannot list {}: {e:?}; keeping the previous view", self.root.display());
                    self.warned_root = true;
                }
                self.last_load = None;
                return self.finish(start, elapsed, gone, gpu);
            }
            for p in self.procs.values_mut() {
                p.seen = false;
            }
            for &pid in self.pids.iter() {
                match self.procs.get_mut(&pid) {
                    Some(p) => p.seen = true,
                    None => new_pids.push(pid),
                }
            }
            self.procs.retain(|_, p| {
                if !p.seen {
                    p.all_gone(&mut gone);
                }
                p.seen
            });
        }
        // Processes the kernel told of and not listed yet.
        for pid in std::mem::take(&mut self.told_new) {
            if !self.procs.contains_key(&pid) {
                new_pids.push(pid);
            }
        }
        new_pids.sort_unstable();
        new_pids.dedup();
        let (root, procs) = (&self.root, &mut self.procs);
        self.told_exit.retain_mut(|(pid, start_ticks, passes)| match procs.get(pid) {
            Some(p) if p.view.start_ticks == *start_ticks => {
                if std::fs::symlink_metadata(root.join(pid.to_string())).is_err() {
                    p.all_gone(&mut gone);
                    procs.remove(pid);
                    return false;
                }
                *passes += 1;
                *passes < 50
            }
            _ => false,
        });

        let settings = ProcSettings {
            matcher: &self.matcher,
            rescan_interval: self.rescan_interval,
            evidence_interval: self.evidence_interval,
            reconcile_every: if self.events_live { RECONCILE_RESCANS } else { 1 },
        };
        let mut ctx = PassCtx {
            root: &self.root,
            budget: &self.budget,
            buf: &mut self.buf,
            now: start,
            active_busy_frac: self.active_busy_frac,
            quiet_interval: self.quiet_interval,
            // Renames told by the kernel: the checks only reconcile.
            name_interval_max: if self.events_live {
                self.name_interval * RECONCILE_RESCANS
            } else {
                self.name_interval
            },
            iter: self.iter.as_ref(),
            iter_buf: &mut self.iter_buf,
            recs: &mut self.recs,
        };
        let (procs, tids) = (&mut self.procs, &mut self.tids);

        let mut recycled = Vec::new();
        for (&pid, p) in procs.iter_mut() {
            if p.view.ml || p.rescan_due(ctx.now) {
                match p.refresh(&mut ctx, &settings) {
                    Ok(()) => {}
                    Err(procfile::ReadError::Gone) => {
                        // Exited since the listing, or the pid was recycled.
                        p.all_gone(&mut gone);
                        recycled.push(pid);
                        continue;
                    }
                    Err(_) => {}
                }
            }
            p.update_threads(&mut ctx, tids, &mut gone);
        }
        for pid in recycled {
            procs.remove(&pid);
            new_pids.push(pid);
        }
        for pid in new_pids {
            if let Ok(mut p) = ProcEntry::discover(pid, &mut ctx, &settings) {
                p.update_threads(&mut ctx, tids, &mut gone);
                procs.insert(pid, p);
            }
        }
        let rescan = self.rescan_interval;
        self.opens_pending.retain(|pid, (start, what, told)| match procs.get_mut(pid) {
            Some(p) => {
                if p.view.start_ticks == *start {
                    p.device_open = Some(what.clone());
                }
                false
            }
            None => start_time_young(*told, rescan),
        });

        let newly_ml = classify_processes(procs, gpu, self.inherit_depth);
        // Baseline samples for threads of processes that just became ML, so
        // that the next pass has deltas.
        for pid in newly_ml {
            if let Some(p) = procs.get_mut(&pid) {
                p.sample_baseline(&mut ctx, &mut gone);
            }
        }
        self.finish(start, elapsed, gone, gpu)
    }

    fn finish(&mut self, start: Instant, elapsed: Duration, gone: Vec<GoneThread>, gpu: &dyn GpuProvider) -> &Snapshot {
        join_gpus(&mut self.procs, gpu);
        // The snapshot's vectors are reused from pass to pass.
        let snap = &mut self.snap;
        snap.seq += 1;
        snap.interval_ns = elapsed.as_nanos() as u64;
        snap.gone = gone;
        snap.gpus.clear();
        snap.gpus.extend_from_slice(gpu.devices());
        // Threads are updated in place: the same threads, pass after pass,
        // keep their names and GPU lists (no reference counting). Unless a
        // process or thread came or went, only the threads whose view
        // changed are copied.
        let same_layout = snap.processes.len() == self.procs.len()
            && self.procs.iter().zip(&snap.processes).all(|((pid, p), v)| *pid == v.pid && !p.layout_changed);
        snap.processes.clear();
        snap.spans.clear();
        let mut touched = Vec::new();
        let mut k = 0;
        for (i, p) in self.procs.values_mut().enumerate() {
            snap.processes.push(p.view.clone());
            p.layout_changed = false;
            let gpus = &p.view.gpu.devices;
            // The process's GPUs reach all its threads' views.
            let gpus_moved = !same_layout || snap.threads.get(k).is_some_and(|v| !Arc::ptr_eq(&v.gpus, gpus));
            let first = k;
            if !(p.threads_dirty || gpus_moved) {
                // No thread's view changed: the snapshot's copies stand
                // (and hold no changes and no delta).
                debug_assert!(p
                    .threads
                    .iter()
                    .all(|t| !t.dirty && t.view.changes.is_empty() && t.view.delta.is_none()));
                k += p.threads.len();
                snap.spans.push(first..k);
                if !p.view.changes.is_empty() {
                    touched.push(i);
                }
                continue;
            }
            touched.push(i);
            for t in &mut p.threads {
                if !(t.dirty || gpus_moved) {
                    k += 1;
                    continue;
                }
                t.dirty = false;
                match snap.threads.get_mut(k) {
                    Some(v) if v.tid == t.view.tid => v.update_from(&t.view),
                    Some(v) => *v = t.view.clone(),
                    None => snap.threads.push(t.view.clone()),
                }
                let v = &mut snap.threads[k];
                v.proc_index = i;
                v.ml = p.view.ml;
                if !Arc::ptr_eq(&v.gpus, gpus) {
                    v.gpus = gpus.clone();
                }
                k += 1;
            }
            snap.spans.push(first..k);
        }
        snap.threads.truncate(k);
        snap.touched = Some(touched);
        snap.pass_ns = start.elapsed().as_nanos() as u64;
        &self.snap
    }
}

/// The task iterator, with `thread_counters = "kernel"` on the real /proc;
/// one log line either way.
fn load_task_iter(cfg: &ObserveConfig) -> Option<TaskIter> {
    if cfg.thread_counters != ThreadCounters::Kernel || cfg.proc_root != "/proc" {
        tracing::info!("observe: ML threads' counters from /proc");
        return None;
    }
    match TaskIter::load() {
        Ok(it) => {
            tracing::info!("observe: ML threads' counters from the kernel (BPF task iterator, one read per process)");
            Some(it)
        }
        Err(e) => {
            tracing::info!("observe: ML threads' counters from /proc: no BPF task iterator ({e:#})");
            None
        }
    }
}

/// Whether a pending note told at `told` may still wait for its process.
fn start_time_young(told: Instant, rescan: Duration) -> bool {
    told.elapsed() < rescan.max(Duration::from_secs(1))
}

/// Decides ML, evidence, DataLoader status and roles for every process.
/// Returns the pids that became ML in this pass.
fn classify_processes(procs: &mut BTreeMap<i32, ProcEntry>, gpu: &dyn GpuProvider, depth: u32) -> Vec<i32> {
    let gpu_pids: std::collections::HashSet<i32> =
        gpu.processes().iter().filter_map(|p| i32::try_from(p.pid).ok()).collect();
    let own = |p: &ProcEntry| {
        let (mut ev, _) = p.own_evidence();
        if gpu_pids.contains(&p.view.pid) {
            ev |= MlEvidence::GPU_PROCESS;
        }
        ev
    };
    let base_ml = |p: &ProcEntry| p.forced.unwrap_or_else(|| !own(p).is_empty());
    // Nearest ML ancestor within `depth` generations (a forced non-ML
    // process stops the inheritance).
    let inherited = |p: &ProcEntry| -> bool {
        let mut ppid = p.view.ppid;
        for _ in 0..depth {
            let Some(a) = procs.get(&ppid) else {
                return false;
            };
            if a.forced == Some(false) {
                return false;
            }
            if base_ml(a) {
                return true;
            }
            ppid = a.view.ppid;
        }
        false
    };

    // In the map's order, which the loop below walks again.
    let mut verdicts: Vec<ProcessVerdict> = Vec::with_capacity(procs.len());
    for (&pid, p) in procs.iter() {
        let own_ev = own(p);
        let from_parent = p.forced.is_none() && own_ev.is_empty() && inherited(p);
        let parent = procs.get(&p.view.ppid);
        let parent_ml = parent.is_some_and(|a| base_ml(a) || inherited(a));
        let ml = p.forced.unwrap_or(!own_ev.is_empty() || from_parent);
        let mut evidence = own_ev;
        if parent_ml && ml {
            evidence |= MlEvidence::PARENT;
        }
        if p.forced == Some(true) {
            evidence |= MlEvidence::FORCED;
        }
        let loader = ml
            && (roles::is_loader_name(&p.view.comm)
                || (parent_ml && {
                    let forked_python = parent.is_some_and(|a| {
                        is_python(&p.view.exe) && a.view.exe == p.view.exe && a.view.cmdline == p.view.cmdline
                    });
                    forked_python || is_multiprocessing_child(&p.view.cmdline)
                }));
        // The description of the evidence, made again only when the
        // evidence changed (most passes change nothing).
        let detail = if evidence == p.view.evidence && ml == p.view.ml {
            None
        } else {
            Some(
                p.own_evidence()
                    .1
                    .map(Arc::from)
                    .or_else(|| gpu_pids.contains(&pid).then(|| Arc::from("gpu process list")))
                    .or_else(|| {
                        (evidence.contains(MlEvidence::PARENT))
                            .then(|| Arc::from(format!("parent {}", p.view.ppid).as_str()))
                    })
                    .or_else(|| (p.forced == Some(true)).then(|| Arc::from("forced by rule")))
                    .unwrap_or_else(|| Arc::from("")),
            )
        };
        let parent_comm = parent.map(|a| a.view.comm.clone());
        verdicts.push(ProcessVerdict { ml, evidence, detail, loader, parent_comm });
    }

    let mut newly_ml = Vec::new();
    for ((&pid, p), c) in procs.iter_mut().zip(verdicts) {
        let v = &mut p.view;
        let was_ml = v.ml;
        if (c.ml != v.ml || c.evidence != v.evidence) && !v.changes.contains(Changes::NEW) {
            v.changes |= Changes::ML;
        }
        let roles_stale = !v.changes.is_empty() || c.loader != v.loader_process;
        v.ml = c.ml;
        v.evidence = c.evidence;
        if let Some(detail) = c.detail {
            v.evidence_detail = detail;
        }
        v.loader_process = c.loader;
        match c.parent_comm {
            Some(comm) if !Arc::ptr_eq(&comm, &v.parent_comm) => v.parent_comm = comm,
            Some(_) => {}
            None if v.parent_comm.is_empty() => {}
            None => v.parent_comm = Arc::from(""),
        }
        if c.ml && !was_ml {
            newly_ml.push(pid);
        }
        let (ml, loader, pid_main) = (v.ml, v.loader_process, v.pid);
        // (A thread's ML flag or role can only change with the process's,
        // or when the thread itself changed this pass.)
        if !(p.threads_dirty || roles_stale || was_ml != ml) {
            continue;
        }
        for t in &mut p.threads {
            if was_ml && !ml {
                t.stop_sampling();
            }
            if t.view.ml != ml {
                t.view.ml = ml;
                t.view.changes |= Changes::ML;
                t.dirty = true;
            }
            if roles_stale || !t.view.changes.is_empty() {
                let role = thread_role(&t.view.comm, ml, t.view.tid == pid_main, loader);
                if role != t.view.role {
                    t.view.role = role;
                    t.view.changes |= Changes::ROLE;
                    t.dirty = true;
                }
            }
            p.threads_dirty |= t.dirty;
        }
    }
    newly_ml
}

/// Fills each process's [`ProcessGpu`]: the provider's per-process list
/// first, else the visible devices, else (one GPU, device evidence) the GPU.
fn join_gpus(procs: &mut BTreeMap<i32, ProcEntry>, gpu: &dyn GpuProvider) {
    let devices = gpu.devices();
    let ids: Vec<(u32, &str)> = devices.iter().map(|d| (d.index, d.uuid.as_str())).collect();
    let device_util = |i: u32| devices.iter().find(|d| d.index == i).map(|d| d.util_pct);
    // pid -> (devices, max SM %)
    let mut per_pid: HashMap<i32, (Vec<u32>, u32)> = HashMap::new();
    for gp in gpu.processes() {
        let Ok(pid) = i32::try_from(gp.pid) else {
            continue;
        };
        let e = per_pid.entry(pid).or_default();
        if !e.0.contains(&gp.device) {
            e.0.push(gp.device);
        }
        e.1 = e.1.max(gp.sm_util_pct);
    }
    for p in procs.values_mut() {
        let v = &mut p.view;
        let gpu = if let Some((devs, util)) = per_pid.remove(&v.pid) {
            ProcessGpu { devices: devs.into(), util_pct: Some(util), per_process: true }
        } else if let Some(list) = v.env.visible_devices.as_deref().filter(|_| !devices.is_empty()) {
            let devs = resolve_visible_devices(list, &ids);
            let util = devs.iter().filter_map(|&i| device_util(i)).max();
            ProcessGpu { devices: devs.into(), util_pct: util, per_process: false }
        } else if v.ml && devices.len() == 1 && v.evidence.intersects(MlEvidence::DEVICE_FD | MlEvidence::DEVICE_MAP) {
            ProcessGpu {
                devices: Arc::from([devices[0].index]),
                util_pct: Some(devices[0].util_pct),
                per_process: false,
            }
        } else {
            ProcessGpu::default()
        };
        // The same devices keep the same list (threads' views share it).
        if gpu.devices == v.gpu.devices {
            v.gpu.util_pct = gpu.util_pct;
            v.gpu.per_process = gpu.per_process;
        } else {
            v.gpu = gpu;
        }
    }
}
