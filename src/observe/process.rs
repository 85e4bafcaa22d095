//! One process: discovery, periodic rescans, and its thread list.
//!
//! ```text
//!            ML process                      non-ML process
//! every pass  pread main-thread stat         -
//!             (comm/exec, ppid,
//!             thread count), sample threads
//!             but the quiet ones held back
//! quiet       pread /proc/<pid>/stat (CPU    -
//! interval    time of all threads): sample
//!             the held ones if some of it is
//!             unaccounted for (update_threads)
//! rescan      exe, cmdline, cgroup; fds+maps exe, cmdline, cgroup; stat;
//! (1 s)       not needed (already ML)        fds+maps if vsize changed
//!             (with process events: exe, cmdline and cgroup every 5th)
//! back-off    thread names: 200 ms after     same
//!             discovery, doubling up to thread_name_interval_ms
//!             (x5 with process events); the threads due come off
//!             name_queue, soonest first
//! told        rename: that thread's name (a thread not listed: relist);
//!             cgroup move: the cgroup; exec: exe, cmdline (next pass)
//! on change   relist /proc/<pid>/task when the thread count changed or a
//!             thread vanished (readdir of 2,000 tasks costs ~1.5 ms)
//! stopped     (main thread in state T: SIGSTOP, a suspended job) the
//!             main-thread stat only: no thread can run, none is sampled;
//!             the pass after it resumes takes fresh baselines (no delta
//!             spans the stop)
//! ```

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use procfs::process::{Stat, Status};
use procfs::{FromRead, ProcessCGroups};

use super::evidence::{EvidenceMatcher, Found};
use super::procfile::{DirFile, ProcFile, ReadError};
use super::taskiter::{self, ProcessLink};
use super::thread::{PassCtx, ThreadEntry};
use super::types::{ticks_to_ns, Changes, GoneThread, MlEnv, MlEvidence, ProcessGpu, ProcessView, NS_PER_TICK};

/// PF_KTHREAD in the stat flags.
const PF_KTHREAD: u32 = 0x0020_0000;
/// Longest cmdline kept (bytes).
const MAX_CMDLINE: usize = 4096;

/// Per-pass settings a process needs besides [`PassCtx`].
pub struct ProcSettings<'a> {
    pub matcher: &'a EvidenceMatcher,
    pub rescan_interval: Duration,
    pub evidence_interval: Duration,
    /// exe, cmdline and cgroup are read again every this many rescans (1;
    /// with the kernel's process events, which tell of an exec, a rename
    /// and a cgroup move at once, more): a rename, an exec or a cgroup-move
    /// event reads them at the next pass in any case.
    pub reconcile_every: u32,
}

struct ProcStat {
    comm: String,
    ppid: i32,
    start_ticks: u64,
    num_threads: u32,
    vsize: u64,
    kernel_thread: bool,
    /// The main thread is stopped (state T): a SIGSTOP stops every thread
    /// of the process until a SIGCONT.
    stopped: bool,
    /// utime + stime in clock ticks: the whole process's when read from
    /// /proc/<pid>/stat, the main thread's from its task/ entry.
    cpu_ticks: u64,
    /// Where the program's code, stack and environment lie: an exec
    /// builds them anew (at new addresses under ASLR; the environment's
    /// end moves with its size in any case), so a change with the same
    /// start time is an exec, even of the same program with the same
    /// arguments (a launcher re-executing itself with RANK set). The
    /// stack (and the environment) shows as 0 when there is no address
    /// space or the reader may not trace the process.
    image: [u64; 4],
}

fn parse_proc_stat(bytes: &[u8]) -> Result<ProcStat, ReadError> {
    let st = Stat::from_read(bytes).map_err(|_| ReadError::Other)?;
    Ok(ProcStat {
        comm: st.comm,
        ppid: st.ppid,
        start_ticks: st.starttime,
        num_threads: u32::try_from(st.num_threads).unwrap_or(0),
        vsize: st.vsize,
        kernel_thread: st.flags & PF_KTHREAD != 0,
        stopped: st.state == 'T',
        cpu_ticks: st.utime.saturating_add(st.stime),
        image: [st.startcode, st.startstack, st.env_start.unwrap_or(0), st.env_end.unwrap_or(0)],
    })
}

/// Observer state of one process.
#[derive(Debug)]
pub struct ProcEntry {
    pub view: ProcessView,
    /// Sorted by tid.
    pub threads: Vec<ThreadEntry>,
    /// Evidence from the environment (read at discovery and exec).
    env_found: Found,
    /// Evidence from fds and maps (read at discovery, exec, vsize change).
    scan_found: Found,
    /// Set by the rules engine: Some(true) ML, Some(false) never ML.
    pub forced: Option<bool>,
    /// The kernel saw this program open a GPU device: its description
    /// (e.g. "device open 195:0"); cleared by an exec.
    pub device_open: Option<Arc<str>>,
    stat: ProcFile,
    /// /proc/<pid>/stat, read instead of `stat` while the process is ML.
    group_stat: ProcFile,
    /// When the process's CPU time (all threads, live and exited) was last
    /// read, and its value.
    group_cpu_ns: Option<(Instant, u64)>,
    /// Set in a pass that read the process's CPU time: (wall time, CPU
    /// time) since the previous such read, None if there was none.
    group_delta_ns: Option<Option<(u64, u64)>>,
    next_group_check: Instant,
    /// CPU time of the threads sampled since the previous check.
    explained_ns: u64,
    /// CPU time of the process since its quiet threads were last all
    /// sampled that no sampled thread accounts for (see update_threads).
    quiet_debt_ns: u64,
    cmdline_file: ProcFile,
    cgroup_file: ProcFile,
    task_dir: DirFile,
    vsize: u64,
    vsize_at_scan: u64,
    /// [`ProcStat::image`] as last read.
    image: [u64; 4],
    last_scan: Instant,
    next_rescan: Instant,
    /// Rescans since exe, cmdline and cgroup were last all read.
    rescans_since_reconcile: u32,
    /// exe and cmdline are read at the next rescan (an exec was told).
    program_due: bool,
    /// The cgroup is read at the next rescan (a move was told).
    cgroup_due: bool,
    /// Threads the kernel told were renamed: their names are read in the
    /// next pass.
    names_told: Vec<i32>,
    relist: bool,
    /// The main thread was stopped when its stat was last read.
    stopped: bool,
    /// Its threads went unsampled while it was stopped: the next samples
    /// are baselines.
    stop_unsampled: bool,
    /// The kernel's task iterator attached to this process (ML, with
    /// `thread_counters = "kernel"`): its threads' counters in one read.
    link: Option<ProcessLink>,
    /// Attaching it failed once: /proc for this process.
    link_failed: bool,
    /// Threads were added or removed since the snapshot last copied them.
    pub layout_changed: bool,
    /// Some thread's view may have changed since the previous pass began
    /// (a thread dirty, or holding this pass's changes or delta). While
    /// false, the per-pass walks over the threads (begin_pass, roles, the
    /// snapshot's copy) skip the process: a large idle process costs
    /// nothing per pass.
    pub threads_dirty: bool,
    /// (next name check, tid, index in `threads` when queued) of every
    /// thread, soonest first: only the threads due are visited. Entries of
    /// gone threads, and ones a later entry replaced, are dropped when they
    /// come up.
    name_queue: BinaryHeap<Reverse<(Instant, i32, usize)>>,
    /// The thread list was rebuilt: `name_queue` is refilled before use.
    name_queue_stale: bool,
    /// Listed in /proc in the current pass.
    pub seen: bool,
}

fn proc_dir(root: &Path, pid: i32) -> PathBuf {
    root.join(pid.to_string())
}

/// The main thread's stat, not the process's: /proc/<pid>/stat sums the CPU
/// times of every thread (O(threads) in the kernel), while the main
/// thread's has the same comm, parent, start time, flags, vsize and thread
/// count. Only ML processes, whose threads are sampled, need the sum.
fn leader_stat(root: &Path, pid: i32) -> PathBuf {
    root.join(format!("{pid}/task/{pid}/stat"))
}

fn group_stat(root: &Path, pid: i32) -> PathBuf {
    proc_dir(root, pid).join("stat")
}

/// Unaccounted CPU time of a process above which its quiet threads are all
/// sampled at once: three clock ticks, above the rounding of the kernel's
/// utime and stime (under a tick each), so that rounding alone never
/// triggers it.
const QUIET_DEBT_NS: u64 = 3 * NS_PER_TICK;

/// The unaccounted time drains at 1/20 of wall time (5 % of a CPU): the
/// trickle of a large idle pool (each thread waking now and then for a few
/// µs) stays below the threshold, a thread that starts computing does not.
const QUIET_LEAK_DIV: u64 = 20;

impl ProcEntry {
    /// Own evidence (environment, fds, maps), without inheritance.
    pub fn own_evidence(&self) -> (MlEvidence, Option<&str>) {
        let mut ev = self.env_found.evidence | self.scan_found.evidence;
        if self.device_open.is_some() {
            ev |= MlEvidence::DEVICE_OPEN;
        }
        let detail =
            self.device_open.as_deref().or(self.env_found.detail.as_deref()).or(self.scan_found.detail.as_deref());
        (ev, detail)
    }

    /// Reads everything about a process seen for the first time.
    pub fn discover(pid: i32, ctx: &mut PassCtx, s: &ProcSettings) -> Result<ProcEntry, ReadError> {
        let root = ctx.root;
        let mut stat = ProcFile::default();
        stat.read_record(|| leader_stat(root, pid), ctx.budget, ctx.buf)?;
        let st = parse_proc_stat(ctx.buf.bytes())?;
        // Stagger rescans over the interval so they do not all fall on one pass.
        let stagger = s.rescan_interval.mul_f64((pid.unsigned_abs() % 97) as f64 / 97.0);
        let mut p = ProcEntry {
            view: ProcessView {
                pid,
                ppid: st.ppid,
                start_ticks: st.start_ticks,
                comm: Arc::from(st.comm.as_str()),
                cmdline: Arc::from(""),
                exe: Arc::from(""),
                uid: 0,
                gid: 0,
                cgroup: Arc::from(""),
                parent_comm: Arc::from(""),
                kernel_thread: st.kernel_thread,
                ml: false,
                evidence: MlEvidence::NONE,
                evidence_detail: Arc::from(""),
                env: MlEnv::default(),
                loader_process: false,
                gpu: ProcessGpu::default(),
                nr_threads: st.num_threads,
                changes: Changes::NEW,
            },
            threads: Vec::new(),
            env_found: Found::default(),
            scan_found: Found::default(),
            forced: None,
            device_open: None,
            stat,
            group_stat: ProcFile::default(),
            group_cpu_ns: None,
            group_delta_ns: None,
            next_group_check: ctx.now,
            explained_ns: 0,
            quiet_debt_ns: 0,
            cmdline_file: ProcFile::default(),
            cgroup_file: ProcFile::default(),
            task_dir: DirFile::default(),
            vsize: st.vsize,
            vsize_at_scan: st.vsize,
            image: st.image,
            last_scan: ctx.now,
            next_rescan: ctx.now + stagger.max(Duration::from_millis(1)),
            rescans_since_reconcile: 0,
            program_due: false,
            cgroup_due: false,
            names_told: Vec::new(),
            relist: true,
            stopped: st.stopped,
            stop_unsampled: false,
            link: None,
            link_failed: false,
            layout_changed: true,
            threads_dirty: true,
            name_queue: BinaryHeap::new(),
            name_queue_stale: true,
            seen: true,
        };
        p.read_identity(ctx);
        p.read_cgroup(ctx);
        if !p.view.kernel_thread {
            p.read_program(ctx);
            p.read_environ(ctx, s.matcher);
            p.scan_evidence(ctx, s.matcher, "discovery");
        }
        Ok(p)
    }

    /// Effective uid/gid (status), at discovery and exec.
    fn read_identity(&mut self, ctx: &mut PassCtx) {
        let path = proc_dir(ctx.root, self.view.pid).join("status");
        if ctx.buf.read_path(&path).is_ok() {
            if let Ok(st) = Status::from_read(ctx.buf.bytes()) {
                self.view.uid = st.euid;
                self.view.gid = st.egid;
            }
        }
    }

    /// cgroup v2 path. Returns true when it changed.
    fn read_cgroup(&mut self, ctx: &mut PassCtx) -> bool {
        let (root, pid) = (ctx.root, self.view.pid);
        if self.cgroup_file.read_record(|| proc_dir(root, pid).join("cgroup"), ctx.budget, ctx.buf).is_err() {
            return false;
        }
        let Ok(groups) = ProcessCGroups::from_read(ctx.buf.bytes()) else {
            return false;
        };
        let v2 = groups.0.iter().find(|g| g.hierarchy == 0 && g.controllers.is_empty());
        let path = v2.map(|g| g.pathname.as_str()).unwrap_or("");
        if *self.view.cgroup != *path {
            self.view.cgroup = Arc::from(path);
            return true;
        }
        false
    }

    /// exe and cmdline. Returns (exe changed, cmdline changed).
    fn read_program(&mut self, ctx: &mut PassCtx) -> (bool, bool) {
        let (root, pid) = (ctx.root, self.view.pid);
        let exe = std::fs::read_link(proc_dir(root, pid).join("exe"))
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        // NUL-separated arguments, joined by spaces (what procfs's
        // Process::cmdline does, on a file kept open).
        let cmdline = match self.cmdline_file.read(|| proc_dir(root, pid).join("cmdline"), ctx.budget, ctx.buf) {
            Ok(()) => {
                let bytes = ctx.buf.bytes();
                let bytes = &bytes[..bytes.len().min(MAX_CMDLINE)];
                let args: Vec<_> =
                    bytes.split(|&b| b == 0).filter(|a| !a.is_empty()).map(String::from_utf8_lossy).collect();
                args.join(" ")
            }
            Err(_) => String::new(),
        };
        let exe_changed = !exe.is_empty() && *self.view.exe != *exe;
        let cmd_changed = *self.view.cmdline != *cmdline;
        if exe_changed {
            self.view.exe = Arc::from(exe.as_str());
        }
        if cmd_changed {
            self.view.cmdline = Arc::from(cmdline.as_str());
        }
        (exe_changed, cmd_changed)
    }

    fn read_environ(&mut self, ctx: &mut PassCtx, matcher: &EvidenceMatcher) {
        let dir = proc_dir(ctx.root, self.view.pid);
        let env = procfs::process::Process::new_with_root(dir).and_then(|p| p.environ());
        let (found, ml_env) = match env {
            Ok(env) => matcher.scan_environ(&env),
            Err(_) => (Found::default(), MlEnv::default()),
        };
        self.env_found = found;
        self.view.env = ml_env;
    }

    /// fds and maps.
    fn scan_evidence(&mut self, ctx: &mut PassCtx, matcher: &EvidenceMatcher, why: &str) {
        tracing::debug!(pid = self.view.pid, comm = %self.view.comm, why, "observe: evidence scan");
        let dir = proc_dir(ctx.root, self.view.pid);
        let mut found = matcher.scan_fds(&dir, ctx.buf);
        if ctx.buf.read_path(&dir.join("maps")).is_ok() {
            found.merge(matcher.scan_maps(ctx.buf.bytes()));
        }
        self.scan_found = found;
        self.vsize_at_scan = self.vsize;
        self.last_scan = ctx.now;
    }

    /// The per-pass (ML) or per-rescan (non-ML) update. Err(Gone) when the
    /// process is gone or its pid was recycled (the caller rediscovers it).
    pub fn refresh(&mut self, ctx: &mut PassCtx, s: &ProcSettings) -> Result<(), ReadError> {
        let root = ctx.root;
        let pid = self.view.pid;
        // The process's CPU time (quiet threads' activity) is checked every
        // quiet_interval; the main thread's stat is cheaper the rest of the time.
        // (Not needed with the task iterator: it tells which threads ran.)
        let check =
            self.view.ml && self.link.is_none() && !ctx.quiet_interval.is_zero() && ctx.now >= self.next_group_check;
        if check {
            self.group_stat.read_record(|| group_stat(root, pid), ctx.budget, ctx.buf)?;
            self.next_group_check = ctx.now + ctx.quiet_interval;
        } else {
            if !self.view.ml {
                self.group_stat.close();
                self.group_cpu_ns = None;
            }
            self.stat.read_record(|| leader_stat(root, pid), ctx.budget, ctx.buf)?;
        }
        let st = parse_proc_stat(ctx.buf.bytes())?;
        if st.start_ticks != self.view.start_ticks {
            return Err(ReadError::Gone);
        }
        self.group_delta_ns = None;
        if check {
            let cur = (ctx.now, ticks_to_ns(st.cpu_ticks));
            self.group_delta_ns = Some(match self.group_cpu_ns {
                Some((t0, a)) if cur.1 >= a => Some((cur.0.saturating_duration_since(t0).as_nanos() as u64, cur.1 - a)),
                _ => None,
            });
            self.group_cpu_ns = Some(cur);
        }
        if st.ppid != self.view.ppid {
            self.view.ppid = st.ppid;
            self.view.changes |= Changes::PARENT;
        }
        if st.num_threads != self.view.nr_threads || st.num_threads as usize != self.threads.len() {
            self.relist = true;
        }
        self.view.nr_threads = st.num_threads;
        self.vsize = st.vsize;
        self.stopped = st.stopped;
        // No stack shown: no address space (a leader that exited while its
        // threads run on, a process exiting), or one we may not see. No
        // exec; what was read before stays.
        let shown = st.image[1] != 0;
        let new_image = shown && st.image != self.image;
        if shown {
            self.image = st.image;
        }
        let renamed = *self.view.comm != *st.comm;
        if renamed {
            self.view.comm = Arc::from(st.comm.as_str());
            self.view.changes |= Changes::RENAMED;
            // The process's name is its main thread's: that thread's rules
            // see the rename now, not at its next name check.
            if let Some(main) = self.threads.iter_mut().find(|t| t.view.tid == pid) {
                main.set_comm(&st.comm);
                self.threads_dirty = true;
            }
        }
        let rescan_due = ctx.now >= self.next_rescan;
        if rescan_due {
            self.next_rescan = ctx.now + s.rescan_interval;
        }
        if rescan_due {
            self.rescans_since_reconcile += 1;
            if self.rescans_since_reconcile >= s.reconcile_every {
                self.rescans_since_reconcile = 0;
                self.program_due = true;
                self.cgroup_due = true;
            }
        }
        let program_due = renamed || new_image || (rescan_due && self.program_due);
        if self.view.kernel_thread || !(program_due || rescan_due) {
            return Ok(());
        }
        let (exe_changed, cmd_changed) = if program_due {
            self.program_due = false;
            self.read_program(ctx)
        } else {
            (false, false)
        };
        if cmd_changed {
            self.view.changes |= Changes::RENAMED;
        }
        let exec = exe_changed || new_image;
        if exec || cmd_changed {
            // A new program (or the same binary with new arguments or a new
            // environment): its environment, identity and evidence are new.
            if exec {
                self.view.changes |= Changes::EXEC;
                self.forced = None;
                self.device_open = None;
                self.relist = true;
            }
            self.read_identity(ctx);
            self.read_environ(ctx, s.matcher);
            self.scan_evidence(ctx, s.matcher, if exec { "exec" } else { "new arguments" });
        } else if renamed && ctx.now.saturating_duration_since(self.last_scan) >= s.evidence_interval {
            // A renamed program (e.g. Python naming itself after importing
            // torch) may have mapped GPU libraries meanwhile.
            self.scan_evidence(ctx, s.matcher, "renamed");
        }
        if rescan_due {
            if std::mem::take(&mut self.cgroup_due) && self.read_cgroup(ctx) {
                self.view.changes |= Changes::CGROUP;
            }
            let vsize_changed = self.vsize != self.vsize_at_scan;
            let scan_due = ctx.now.saturating_duration_since(self.last_scan) >= s.evidence_interval;
            if !self.view.ml && vsize_changed && scan_due {
                self.scan_evidence(ctx, s.matcher, "mappings changed");
            }
        }
        Ok(())
    }

    /// Makes the rescan (program, identity, cgroup; or the discovery that
    /// the process is gone) due at the next pass: the kernel told of an
    /// exec or an exit.
    pub fn rescan_now(&mut self, now: Instant) {
        self.next_rescan = now;
        self.program_due = true;
        self.cgroup_due = true;
    }

    /// The kernel told that thread `tid` was renamed: its name is read in
    /// the next pass (the main thread's by the process's rescan, which
    /// reads its stat, renames it and reads the program); a thread not
    /// listed yet is listed then, with its name.
    pub fn rename_told(&mut self, tid: i32, now: Instant) {
        if tid == self.view.pid {
            self.next_rescan = now;
        } else if self.threads.binary_search_by_key(&tid, |t| t.view.tid).is_ok() {
            self.names_told.push(tid);
        } else {
            self.relist = true;
        }
    }

    /// The kernel told that the process (or one of its threads) moved to
    /// another cgroup: it is read in the next pass.
    pub fn cgroup_told(&mut self, now: Instant) {
        self.next_rescan = now;
        self.cgroup_due = true;
    }

    /// Whether the non-ML rescan is due.
    pub fn rescan_due(&self, now: Instant) -> bool {
        now >= self.next_rescan
    }

    /// Relists threads if needed, checks a slice of thread names, samples
    /// ML threads. Gone threads are appended to `gone`.
    ///
    /// An ML process that is stopped (a SIGSTOP: a suspended job) has no
    /// thread that can run: none is sampled, its names wait, and it costs
    /// the pass one stat read. In the pass after it resumes every thread
    /// sampled is a baseline (no delta): a delta across the stop would read
    /// as an idle interval as long as the stop.
    pub fn update_threads(&mut self, ctx: &mut PassCtx, ids: &mut Vec<i32>, gone: &mut Vec<GoneThread>) {
        if self.view.ml && self.stopped {
            self.stop_unsampled = true;
            return;
        }
        let resumed = std::mem::take(&mut self.stop_unsampled);
        self.update_running(ctx, ids, gone);
        if resumed && self.view.ml {
            for t in &mut self.threads {
                t.view.delta = None;
            }
        }
    }

    fn update_running(&mut self, ctx: &mut PassCtx, ids: &mut Vec<i32>, gone: &mut Vec<GoneThread>) {
        if !self.view.ml {
            self.link = None;
        } else if self.sample_from_kernel(ctx, gone) {
            // (Its records name every thread.)
            self.names_told.clear();
            return;
        }
        if self.relist {
            self.relist_threads(ctx, ids, gone);
        }
        // Names: those the kernel told changed, and the others on each
        // thread's own back-off schedule.
        self.check_told_names(ctx, gone);
        self.check_names(ctx, gone);
        if !self.view.ml {
            return;
        }
        // Threads due (every pass, or quiet ones on their own schedule),
        // and the CPU time their samples account for.
        let mut held_back = false;
        let explained = self.sample_threads(ctx, gone, |t, now| {
            let due = t.due(now);
            held_back |= !due;
            due
        });
        self.explained_ns = self.explained_ns.saturating_add(explained);
        // In a pass that read the process's CPU time: the quiet threads held
        // back are all sampled at once when the process used CPU time that
        // the samples since the previous check do not account for.
        let Some(group) = self.group_delta_ns.take() else {
            return;
        };
        let explained = std::mem::take(&mut self.explained_ns);
        if !held_back {
            self.quiet_debt_ns = 0;
            return;
        }
        let debt = match group {
            Some((wall, cpu)) => {
                self.quiet_debt_ns.saturating_add(cpu.saturating_sub(explained)).saturating_sub(wall / QUIET_LEAK_DIV)
            }
            None => u64::MAX,
        };
        if debt < QUIET_DEBT_NS {
            self.quiet_debt_ns = debt;
            return;
        }
        // (These samples cover time the debt already counted.)
        self.sample_threads(ctx, gone, |t, now| !t.sampled_at(now));
        self.quiet_debt_ns = 0;
    }

    /// Re-reads the names of the threads the kernel told were renamed,
    /// held back or not.
    fn check_told_names(&mut self, ctx: &mut PassCtx, gone: &mut Vec<GoneThread>) {
        if self.names_told.is_empty() {
            return;
        }
        let mut told = std::mem::take(&mut self.names_told);
        told.sort_unstable();
        told.dedup();
        for &tid in &told {
            let Ok(i) = self.threads.binary_search_by_key(&tid, |t| t.view.tid) else {
                continue;
            };
            self.check_name_of(i, ctx, gone);
        }
        told.clear();
        self.names_told = told;
    }

    /// Re-reads the names of the threads due (name_queue), in due order.
    fn check_names(&mut self, ctx: &mut PassCtx, gone: &mut Vec<GoneThread>) {
        if std::mem::take(&mut self.name_queue_stale) {
            self.name_queue.clear();
            let queued = self.threads.iter().enumerate().map(|(i, t)| Reverse((t.next_name_check(), t.view.tid, i)));
            self.name_queue.extend(queued);
        }
        while let Some(&Reverse((due, tid, at))) = self.name_queue.peek() {
            if due > ctx.now {
                break;
            }
            self.name_queue.pop();
            // (The index holds unless a thread was dropped since: a search
            // of the whole list, a cold one, costs more than the check.)
            let i = match self.threads.get(at) {
                Some(t) if t.view.tid == tid => at,
                _ => match self.threads.binary_search_by_key(&tid, |t| t.view.tid) {
                    Ok(i) => i,
                    Err(_) => continue, // gone
                },
            };
            let t = &mut self.threads[i];
            if t.next_name_check() != due {
                continue; // replaced
            }
            if let Some(held) = t.name_held_until(ctx.now) {
                // A quiet thread held back: checked once it is sampled again.
                t.defer_name_check(held);
                self.name_queue.push(Reverse((held, tid, i)));
                continue;
            }
            debug_assert!(t.name_due(ctx.now));
            self.check_name_of(i, ctx, gone);
        }
    }

    /// Re-reads thread `i`'s name and queues its next check (or drops it:
    /// gone).
    fn check_name_of(&mut self, i: usize, ctx: &mut PassCtx, gone: &mut Vec<GoneThread>) {
        match self.threads[i].check_name(ctx) {
            Err(ReadError::Gone) => self.drop_thread(i, gone),
            _ => {
                let t = &self.threads[i];
                self.threads_dirty |= t.dirty;
                self.name_queue.push(Reverse((t.next_name_check(), t.view.tid, i)));
            }
        }
    }

    /// Baseline samples of every thread (the process just became ML), so
    /// that the next pass has deltas.
    pub fn sample_baseline(&mut self, ctx: &mut PassCtx, gone: &mut Vec<GoneThread>) {
        self.threads_dirty = true;
        if !self.sample_from_kernel(ctx, gone) {
            for t in &mut self.threads {
                let _ = t.sample(ctx);
            }
        }
        for t in &mut self.threads {
            t.view.delta = None;
        }
    }

    /// The thread list and every thread's sample from one read of the
    /// kernel's task iterator (taskiter.rs). False when there is none for
    /// this process (not loaded, or attaching failed): /proc then.
    fn sample_from_kernel(&mut self, ctx: &mut PassCtx, gone: &mut Vec<GoneThread>) -> bool {
        let Some(iter) = ctx.iter else {
            return false;
        };
        if self.link.is_none() {
            if self.link_failed {
                return false;
            }
            match iter.attach(self.view.pid) {
                Ok(l) => self.link = Some(l),
                Err(e) => {
                    tracing::debug!("observe: pid {}: no task iterator ({e}); its threads from /proc", self.view.pid);
                    self.link_failed = true;
                    return false;
                }
            }
        }
        let link = self.link.as_ref().expect("attached above");
        if let Err(e) = taskiter::read(link, ctx.iter_buf, ctx.recs) {
            tracing::debug!("observe: pid {}: task iterator read failed ({e}); its threads from /proc", self.view.pid);
            self.link = None;
            self.link_failed = true;
            return false;
        }
        let read_at = Instant::now();
        self.relist = false;
        self.threads_dirty = true;
        let ctx: &PassCtx = ctx;
        let recs = &ctx.recs[..];
        // The same threads as last pass (the common case): in place.
        if recs.len() == self.threads.len() && recs.iter().zip(&self.threads).all(|(r, t)| r.tid == t.view.tid) {
            let mut i = 0;
            for r in recs {
                if self.threads[i].sample_rec(r, read_at, ctx) {
                    i += 1;
                } else {
                    // A recycled tid: the old thread is gone, the new one
                    // is discovered in the next pass.
                    self.drop_thread(i, gone);
                }
            }
            return true;
        }
        self.layout_changed = true;
        self.name_queue_stale = true;
        let mut old = std::mem::take(&mut self.threads).into_iter().peekable();
        let pid = self.view.pid;
        let went = |t: ThreadEntry, gone: &mut Vec<GoneThread>| {
            gone.push(GoneThread { tid: t.view.tid, tgid: pid, start_ticks: t.view.start_ticks });
        };
        for r in recs {
            while let Some(t) = old.next_if(|t| t.view.tid < r.tid) {
                went(t, gone);
            }
            if let Some(mut t) = old.next_if(|t| t.view.tid == r.tid) {
                if t.sample_rec(r, read_at, ctx) {
                    self.threads.push(t);
                    continue;
                }
                went(t, gone);
            }
            let mut t = ThreadEntry::from_rec(r, ctx);
            t.view.ml = self.view.ml;
            t.sample_rec(r, read_at, ctx);
            t.view.delta = None;
            self.threads.push(t);
        }
        for t in old {
            went(t, gone);
        }
        true
    }

    /// Samples the threads `pick` selects; returns the CPU time their
    /// samples account for.
    fn sample_threads(
        &mut self,
        ctx: &mut PassCtx,
        gone: &mut Vec<GoneThread>,
        mut pick: impl FnMut(&ThreadEntry, Instant) -> bool,
    ) -> u64 {
        let mut explained = 0;
        let mut i = 0;
        while i < self.threads.len() {
            let t = &mut self.threads[i];
            if !pick(t, ctx.now) {
                i += 1;
                continue;
            }
            let sampled = t.sample(ctx);
            self.threads_dirty |= t.dirty;
            match sampled {
                Ok(()) => {
                    explained += t.view.delta.map_or(0, |d| d.cpu_ns);
                    i += 1;
                }
                Err(ReadError::Gone) => self.drop_thread(i, gone),
                // Unreadable this time: no delta, try again next pass.
                Err(_) => i += 1,
            }
        }
        explained
    }

    fn drop_thread(&mut self, i: usize, gone: &mut Vec<GoneThread>) {
        let t = self.threads.remove(i);
        gone.push(GoneThread { tid: t.view.tid, tgid: t.view.tgid, start_ticks: t.view.start_ticks });
        self.relist = true;
        self.layout_changed = true;
    }

    fn relist_threads(&mut self, ctx: &mut PassCtx, ids: &mut Vec<i32>, gone: &mut Vec<GoneThread>) {
        let root = ctx.root;
        let pid = self.view.pid;
        if self.task_dir.list_numeric(|| proc_dir(root, pid).join("task"), ctx.budget, ctx.buf, ids).is_err() {
            return;
        }
        self.relist = false;
        self.layout_changed = true;
        self.threads_dirty = true;
        self.name_queue_stale = true;
        let old = std::mem::take(&mut self.threads);
        let mut old = old.into_iter().peekable();
        for &tid in ids.iter() {
            while old.peek().is_some_and(|t| t.view.tid < tid) {
                let t = old.next().expect("peeked");
                gone.push(GoneThread { tid: t.view.tid, tgid: pid, start_ticks: t.view.start_ticks });
            }
            if old.peek().is_some_and(|t| t.view.tid == tid) {
                self.threads.push(old.next().expect("peeked"));
                continue;
            }
            if let Ok(mut t) = ThreadEntry::discover(pid, tid, ctx) {
                t.view.ml = self.view.ml;
                t.dirty = true;
                self.threads.push(t);
            }
        }
        for t in old {
            gone.push(GoneThread { tid: t.view.tid, tgid: pid, start_ticks: t.view.start_ticks });
        }
    }

    /// Forgets the per-pass flags of the previous pass.
    pub fn begin_pass(&mut self) {
        self.view.changes = Changes::NONE;
        if !self.threads_dirty {
            return;
        }
        let mut reset = false;
        for t in &mut self.threads {
            if !t.view.changes.is_empty() || t.view.delta.is_some() {
                t.view.changes = Changes::NONE;
                t.view.delta = None;
                t.dirty = true;
                reset = true;
            }
        }
        // True again while the snapshot has views to clear.
        self.threads_dirty = reset;
    }

    /// All threads as gone (the process exited).
    pub fn all_gone(&self, gone: &mut Vec<GoneThread>) {
        gone.extend(self.threads.iter().map(|t| GoneThread {
            tid: t.view.tid,
            tgid: t.view.tgid,
            start_ticks: t.view.start_ticks,
        }));
    }
}
