//! One thread: discovery, cheap name checks, and the sampled counters of ML
//! threads.
//!
//! Sampling a thread of an ML process, per pass:
//!
//! ```text
//!   due? ──no──> delta = None (quiet thread between samples)
//!    │yes
//!   pread schedstat ──> cpu, run-queue wait, timeslices since last sample
//!    │
//!   runnable >= active_busy_frac? ──no──> quiet: no detailed read; a pool
//!    │yes                                 thread (role Other) quiet for 1 s is
//!    │                                    then held back (see process.rs)
//!   pread stat    ──> last CPU, comm (rename)
//!   pread status  ──> voluntary / involuntary switches
//!   pread io      ──> rchar
//! ```
//! Reading three files for every thread costs ~20 µs (stat ~4 µs, status
//! ~9 µs of kernel time on the reference VM): too much for thousands of
//! threads, so only threads that did something get it. Counters are
//! cumulative, so a skipped read loses nothing: the next detailed read's
//! delta covers the whole gap (with its own interval).
//!
//! With the kernel's task iterator (taskiter.rs, `thread_counters =
//! "kernel"`) the same counters, name and last CPU of every thread of the
//! process come in one read per pass, and no file is read:
//!
//! ```text
//!   record ──> name, last CPU
//!     │
//!   held back (quiet) and not active since the last pass? ──yes──> no delta
//!     │no
//!   schedstat counters ──> delta; active? ──> the detail counters' delta
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use procfs::process::{Io, Schedstat, Stat};
use procfs::FromRead;

use super::procfile::{FdBudget, ProcFile, ReadBuf, ReadError};
use super::taskiter::{TaskIter, ThreadRec};
use super::types::{Changes, DetailDelta, ThreadDelta, ThreadRole, ThreadView};

/// What a pass shares with every thread it touches.
pub struct PassCtx<'a> {
    pub root: &'a Path,
    pub budget: &'a FdBudget,
    pub buf: &'a mut ReadBuf,
    pub now: Instant,
    pub active_busy_frac: f64,
    pub quiet_interval: Duration,
    /// Longest time between two name checks of a thread.
    pub name_interval_max: Duration,
    /// The kernel's task iterator (`thread_counters = "kernel"`, loaded).
    pub iter: Option<&'a TaskIter>,
    /// Its read buffer and records, reused from process to process.
    pub iter_buf: &'a mut Vec<u8>,
    pub recs: &'a mut Vec<ThreadRec>,
}

/// First delay between name checks; it doubles up to `name_interval_max`.
/// Threads are mostly named right after they start.
const FIRST_NAME_CHECK: Duration = Duration::from_millis(200);

/// How long a thread must stay inactive before it is sampled less often.
const QUIET_AFTER: Duration = Duration::from_secs(1);

/// A quiet thread is sampled at least every this many quiet intervals
/// (jittered to 75-125 %: 45-75 s at the default 500 ms); in between, only
/// when its process's CPU time shows activity that the sampled threads do
/// not account for (process.rs), which catches a thread that starts to
/// compute within a quiet interval or two. What the fallback alone finds
/// is a thread using under 5 % of a CPU (the unaccounted time's drain):
/// its phase can wait. With 2,000 quiet threads it costs ~33 samples (a
/// schedstat and a comm read each) a second.
pub const QUIET_FALLBACK_FACTOR: u32 = 120;

#[derive(Debug, Clone, Copy)]
struct SchedSample {
    /// The pass that took the sample (`sampled_at`).
    at: Instant,
    /// When schedstat was read: deltas are taken over the time between two
    /// reads, not between two passes' starts, which differ by the time a
    /// pass takes to reach the thread (tens of ms on a loaded host).
    read_at: Instant,
    cpu_ns: u64,
    runq_ns: u64,
    slices: u64,
}

#[derive(Debug, Clone, Copy)]
struct DetailSample {
    /// When status and io were read (see `SchedSample::read_at`).
    read_at: Instant,
    voluntary: u64,
    involuntary: u64,
    rchar: u64,
}

#[derive(Debug, Default)]
struct ThreadFiles {
    comm: ProcFile,
    schedstat: ProcFile,
    stat: ProcFile,
    status: ProcFile,
    io: ProcFile,
}

/// Observer state of one thread.
#[derive(Debug)]
pub struct ThreadEntry {
    pub view: ThreadView,
    files: ThreadFiles,
    sched: Option<SchedSample>,
    detail: Option<DetailSample>,
    quiet_since: Option<Instant>,
    next_sample: Option<Instant>,
    /// The task iterator's previous record of the thread: when, and its
    /// run + run-queue time then (whether a held-back thread was active
    /// since the previous pass).
    last_rec: Option<(Instant, u64)>,
    name_interval: Duration,
    next_name_check: Instant,
    /// `view` changed since the snapshot last copied it.
    pub(super) dirty: bool,
}

/// `d` scaled by 75..125 % depending on the tid, so that threads created
/// together are not checked together.
fn jittered(d: Duration, tid: i32) -> Duration {
    d * (75 + tid.unsigned_abs() % 50) / 100
}

fn task_path(root: &Path, tgid: i32, tid: i32, file: &str) -> PathBuf {
    root.join(format!("{tgid}/task/{tid}/{file}"))
}

/// Stat fields of a thread used here.
struct StatInfo {
    comm: String,
    start_ticks: u64,
    cpu: Option<u32>,
}

fn parse_stat(buf: &ReadBuf) -> Result<StatInfo, ReadError> {
    let st = Stat::from_read(buf.bytes()).map_err(|_| ReadError::Other)?;
    Ok(StatInfo { comm: st.comm, start_ticks: st.starttime, cpu: st.processor.and_then(|c| u32::try_from(c).ok()) })
}

/// The two context-switch counters of /proc/.../status.
///
/// procfs's `Status` parser builds a map of all ~57 lines (~25 µs per
/// thread, measured); the hot path needs two counters, which are
/// `key:\tvalue` lines near the end of the file.
fn status_switches(text: &[u8]) -> Option<(u64, u64)> {
    let mut vol = None;
    let mut invol = None;
    for line in text.split(|&b| b == b'\n').rev() {
        let value = |prefix: &[u8]| -> Option<u64> {
            let rest = line.strip_prefix(prefix)?;
            std::str::from_utf8(rest).ok()?.trim().parse().ok()
        };
        if let Some(v) = value(b"voluntary_ctxt_switches:") {
            vol = Some(v);
        } else if let Some(v) = value(b"nonvoluntary_ctxt_switches:") {
            invol = Some(v);
        }
        if vol.is_some() && invol.is_some() {
            break;
        }
    }
    Some((vol?, invol?))
}

impl ThreadEntry {
    /// Reads a new thread's stat (start time, name, last CPU).
    pub fn discover(tgid: i32, tid: i32, ctx: &mut PassCtx) -> Result<ThreadEntry, ReadError> {
        ctx.buf.read_path(&task_path(ctx.root, tgid, tid, "stat"))?;
        let st = parse_stat(ctx.buf)?;
        Ok(ThreadEntry::new(tgid, tid, st, ctx))
    }

    /// A new thread the kernel's task iterator reported.
    pub fn from_rec(rec: &ThreadRec, ctx: &PassCtx) -> ThreadEntry {
        let st = StatInfo {
            comm: String::from_utf8_lossy(rec.comm()).into_owned(),
            start_ticks: rec.start_ticks,
            cpu: u32::try_from(rec.cpu).ok(),
        };
        ThreadEntry::new(rec.tgid, rec.tid, st, ctx)
    }

    fn new(tgid: i32, tid: i32, st: StatInfo, ctx: &PassCtx) -> ThreadEntry {
        ThreadEntry {
            view: ThreadView {
                tid,
                tgid,
                proc_index: 0,
                comm: Arc::from(st.comm.as_str()),
                start_ticks: st.start_ticks,
                role: ThreadRole::NonMl,
                ml: false,
                gpus: Arc::from([]),
                last_cpu: st.cpu,
                delta: None,
                changes: Changes::NEW,
            },
            files: ThreadFiles::default(),
            sched: None,
            detail: None,
            quiet_since: None,
            next_sample: None,
            last_rec: None,
            name_interval: FIRST_NAME_CHECK.min(ctx.name_interval_max),
            next_name_check: ctx.now + jittered(FIRST_NAME_CHECK.min(ctx.name_interval_max), tid),
            dirty: true,
        }
    }

    /// Whether the thread's name should be re-read in this pass. Not while
    /// a quiet thread is held back: its name matters once it does something,
    /// and then its detailed read (stat) sees a new name.
    pub fn name_due(&self, now: Instant) -> bool {
        now >= self.next_name_check && self.name_held_until(now).is_none()
    }

    /// When the thread's name is next due for a check.
    pub fn next_name_check(&self) -> Instant {
        self.next_name_check
    }

    /// Until when a name check is held back (a quiet thread between its
    /// samples; see [`Self::name_due`]), if it is at `now`.
    pub fn name_held_until(&self, now: Instant) -> Option<Instant> {
        self.next_sample.filter(|&t| now < t)
    }

    /// Moves the next name check to `at` (a held-back thread's next sample).
    pub fn defer_name_check(&mut self, at: Instant) {
        self.next_name_check = self.next_name_check.max(at);
    }

    fn name_checked(&mut self, ctx: &PassCtx) {
        self.next_name_check = ctx.now + jittered(self.name_interval, self.view.tid);
        self.name_interval = (self.name_interval * 2).min(ctx.name_interval_max);
    }

    /// A new name for the thread (noted in `view.changes` if it differs).
    pub(super) fn set_comm(&mut self, comm: &str) {
        if *self.view.comm != *comm {
            self.view.comm = Arc::from(comm);
            self.view.changes |= Changes::RENAMED;
            self.dirty = true;
        }
    }

    /// Re-reads the thread's name from its comm file (the cheapest file:
    /// ~1.7 µs against ~4 µs for stat). Notes a rename in `view.changes`.
    /// Checks back off from 200 ms after discovery to
    /// `thread_name_interval_ms`.
    pub fn check_name(&mut self, ctx: &mut PassCtx) -> Result<(), ReadError> {
        self.name_checked(ctx);
        let (tgid, tid, root) = (self.view.tgid, self.view.tid, ctx.root);
        self.files.comm.read_record(|| task_path(root, tgid, tid, "comm"), ctx.budget, ctx.buf)?;
        let text = ctx.buf.text();
        let comm = text.trim_end_matches('\n').to_string();
        self.set_comm(&comm);
        Ok(())
    }

    /// Whether an ML thread is due for a sample in this pass.
    pub fn due(&self, now: Instant) -> bool {
        self.next_sample.is_none_or(|t| now >= t)
    }

    /// Whether the thread was sampled in the pass that started at `now`.
    pub fn sampled_at(&self, now: Instant) -> bool {
        self.sched.is_some_and(|s| s.at == now)
    }

    /// Releases the per-thread files used for ML sampling (the process is no
    /// longer ML) and forgets the baselines.
    pub fn stop_sampling(&mut self) {
        let f = &mut self.files;
        for file in [&mut f.schedstat, &mut f.stat, &mut f.status, &mut f.io] {
            file.close();
        }
        self.sched = None;
        self.detail = None;
        self.last_rec = None;
        self.quiet_since = None;
        self.next_sample = None;
        self.view.delta = None;
        self.dirty = true;
    }

    /// Samples an ML thread from its /proc files (see the module doc).
    /// Sets `view.delta`.
    pub fn sample(&mut self, ctx: &mut PassCtx) -> Result<(), ReadError> {
        let (tgid, tid, root, now) = (self.view.tgid, self.view.tid, ctx.root, ctx.now);
        self.files.schedstat.read_record(|| task_path(root, tgid, tid, "schedstat"), ctx.budget, ctx.buf)?;
        let read_at = Instant::now();
        let ss = Schedstat::from_read(ctx.buf.bytes()).map_err(|_| ReadError::Other)?;
        let cur =
            SchedSample { at: now, read_at, cpu_ns: ss.sum_exec_runtime, runq_ns: ss.run_delay, slices: ss.pcount };
        let (delta, active) = self.delta_with_detail(cur, ctx.active_busy_frac, |t| t.read_detail(ctx))?;
        self.finish_sample(delta, active, ctx);
        Ok(())
    }

    /// Samples an ML thread from the kernel's task iterator record (its
    /// name and last CPU come with it). A thread held back (quiet) is
    /// sampled as soon as it was active (runnable >= `active_busy_frac`)
    /// since the previous pass: the record tells at no cost. Returns false
    /// when the record is another thread's (the tid was recycled).
    pub fn sample_rec(&mut self, rec: &ThreadRec, read_at: Instant, ctx: &PassCtx) -> bool {
        if rec.start_ticks != self.view.start_ticks {
            return false;
        }
        if rec.comm() != self.view.comm.as_bytes() {
            self.set_comm(&String::from_utf8_lossy(rec.comm()));
        }
        self.view.last_cpu = u32::try_from(rec.cpu).ok();
        let runnable = rec.cpu_ns.saturating_add(rec.runq_ns);
        let active_since = match self.last_rec.replace((read_at, runnable)) {
            Some((t, v)) => {
                let ns = read_at.saturating_duration_since(t).as_nanos().max(1) as f64;
                runnable.saturating_sub(v) as f64 / ns >= ctx.active_busy_frac && runnable > v
            }
            None => true,
        };
        if !active_since && !self.due(ctx.now) {
            return true;
        }
        let cur = SchedSample { at: ctx.now, read_at, cpu_ns: rec.cpu_ns, runq_ns: rec.runq_ns, slices: rec.slices };
        let detail = DetailSample { read_at, voluntary: rec.voluntary, involuntary: rec.involuntary, rchar: rec.rchar };
        if let Ok((delta, active)) = self.delta_with_detail(cur, ctx.active_busy_frac, |t| Ok(t.detail_delta(detail))) {
            self.finish_sample(delta, active, ctx);
        }
        true
    }

    /// The delta since the previous sample from the schedstat counters
    /// `cur`, with the detail counters' delta (`detail`) when the thread
    /// was runnable >= `busy_frac` of the interval or has no detail
    /// baseline yet; and whether it was (active).
    fn delta_with_detail(
        &mut self,
        cur: SchedSample,
        busy_frac: f64,
        detail: impl FnOnce(&mut Self) -> Result<Option<DetailDelta>, ReadError>,
    ) -> Result<(Option<ThreadDelta>, bool), ReadError> {
        let mut delta = self.sched_delta(cur);
        let active = delta.is_some_and(|d| d.busy_frac() >= busy_frac);
        if active || self.detail.is_none() {
            let detail = detail(self)?;
            if let Some(d) = delta.as_mut() {
                d.detail = detail;
            }
        }
        Ok((delta, active))
    }

    /// The schedstat delta since the previous sample (None: the first, or
    /// counters that went backwards: a new baseline); `cur` becomes the
    /// baseline.
    fn sched_delta(&mut self, cur: SchedSample) -> Option<ThreadDelta> {
        self.dirty = true;
        match self.sched.replace(cur) {
            Some(p) if cur.cpu_ns >= p.cpu_ns && cur.runq_ns >= p.runq_ns && cur.slices >= p.slices => {
                let interval_ns = cur.read_at.saturating_duration_since(p.read_at).as_nanos() as u64;
                Some(ThreadDelta {
                    interval_ns,
                    // The kernel's clocks and ours drift by a tick at most:
                    // never report more than the interval.
                    cpu_ns: (cur.cpu_ns - p.cpu_ns).min(interval_ns),
                    runq_wait_ns: (cur.runq_ns - p.runq_ns).min(interval_ns),
                    timeslices: cur.slices - p.slices,
                    detail: None,
                })
            }
            _ => None,
        }
    }

    /// The detailed counters' delta since the previous detailed sample.
    fn detail_delta(&mut self, cur: DetailSample) -> Option<DetailDelta> {
        let prev = self.detail.replace(cur);
        prev.map(|p| DetailDelta {
            interval_ns: cur.read_at.saturating_duration_since(p.read_at).as_nanos() as u64,
            voluntary_switches: cur.voluntary.saturating_sub(p.voluntary),
            involuntary_switches: cur.involuntary.saturating_sub(p.involuntary),
            read_bytes: cur.rchar.saturating_sub(p.rchar),
        })
    }

    /// Quiet pool threads (role Other) are sampled less often, with a
    /// per-thread jitter so that a pool going quiet together does not come
    /// back together. Named threads (trainer, loaders, NCCL) are few and
    /// have phases shorter than the quiet delay: never tiered.
    fn finish_sample(&mut self, delta: Option<ThreadDelta>, active: bool, ctx: &PassCtx) {
        let (tid, now) = (self.view.tid, ctx.now);
        if active || self.view.role != ThreadRole::Other {
            self.quiet_since = None;
            self.next_sample = None;
        } else if delta.is_some() {
            let since = *self.quiet_since.get_or_insert(now);
            if !ctx.quiet_interval.is_zero() && now.saturating_duration_since(since) >= QUIET_AFTER {
                let jitter_pct = 75 + (tid.unsigned_abs() % 50);
                self.next_sample = Some(now + ctx.quiet_interval * QUIET_FALLBACK_FACTOR * jitter_pct / 100);
            }
        }
        self.view.delta = delta;
    }

    /// Reads stat, status and io; returns the delta
    /// of their counters since the previous detailed read.
    fn read_detail(&mut self, ctx: &mut PassCtx) -> Result<Option<DetailDelta>, ReadError> {
        let (tgid, tid, root, budget) = (self.view.tgid, self.view.tid, ctx.root, ctx.budget);
        self.files.stat.read_record(|| task_path(root, tgid, tid, "stat"), budget, ctx.buf)?;
        let st = parse_stat(ctx.buf)?;
        if st.start_ticks != self.view.start_ticks {
            return Err(ReadError::Gone);
        }
        self.set_comm(&st.comm);
        self.name_checked(ctx);
        self.view.last_cpu = st.cpu;

        self.files.status.read_record(|| task_path(root, tgid, tid, "status"), budget, ctx.buf)?;
        let read_at = Instant::now();
        let (voluntary, involuntary) = status_switches(ctx.buf.bytes()).ok_or(ReadError::Other)?;

        // io needs ptrace access; a denied read leaves the I/O counters at 0.
        let rchar = match self.files.io.read_record(|| task_path(root, tgid, tid, "io"), budget, ctx.buf) {
            Ok(()) => Io::from_read(ctx.buf.bytes()).map_or(0, |io| io.rchar),
            Err(ReadError::Gone) => return Err(ReadError::Gone),
            Err(_) => 0,
        };

        Ok(self.detail_delta(DetailSample { read_at, voluntary, involuntary, rchar }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pass can reach a thread long after it started (thousands of threads,
    /// a loaded host): the busy fraction is taken over the time between the
    /// thread's two reads, not between the two passes' starts.
    #[test]
    fn a_delta_spans_the_time_between_two_reads() {
        use crate::observe::fixture::{write_proc, write_thread, FakeProc, TempDir};
        let dir = TempDir::new("read-at");
        let mut p = FakeProc::new(300, 1, "python");
        write_proc(dir.path(), &p);
        let budget = FdBudget::new(0);
        let mut buf = ReadBuf::default();
        let (mut iter_buf, mut recs) = (Vec::new(), Vec::new());
        let t0 = Instant::now();
        // The first pass started 10 s before it got to this thread; the
        // second gets to it at once.
        let mut ctx = PassCtx {
            root: dir.path(),
            budget: &budget,
            buf: &mut buf,
            now: t0.checked_sub(Duration::from_secs(10)).unwrap_or(t0),
            active_busy_frac: 0.0,
            quiet_interval: Duration::ZERO,
            name_interval_max: Duration::from_secs(1),
            iter: None,
            iter_buf: &mut iter_buf,
            recs: &mut recs,
        };
        let mut t = ThreadEntry::discover(300, 300, &mut ctx).unwrap();
        t.sample(&mut ctx).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        p.threads[0].cpu_ns = 50_000_000;
        write_thread(dir.path(), &p, &p.threads[0]);
        ctx.now = Instant::now();
        t.sample(&mut ctx).unwrap();
        let elapsed = t0.elapsed().as_nanos() as u64;
        let d = t.view.delta.expect("a delta after two samples");
        assert!(d.interval_ns >= 50_000_000, "{} ns", d.interval_ns);
        assert!(d.interval_ns <= elapsed, "{} ns > {elapsed} ns between the reads", d.interval_ns);
        // Busy all along: 50 ms on a CPU in at most the time measured here.
        assert!(d.busy_frac() >= 50e6 / elapsed as f64 - 1e-9);
    }

    /// The task iterator's records: deltas like /proc's; a held-back pool
    /// thread gets none while it only wakes briefly, and one (covering the
    /// whole gap) in the pass after it was active; a record with another
    /// start time is another thread.
    #[test]
    fn samples_from_task_iterator_records() {
        let budget = FdBudget::new(0);
        let mut buf = ReadBuf::default();
        let (mut iter_buf, mut recs) = (Vec::new(), Vec::new());
        let t0 = Instant::now();
        let mut ctx = PassCtx {
            root: Path::new("/nonexistent"),
            budget: &budget,
            buf: &mut buf,
            now: t0,
            active_busy_frac: 0.01,
            quiet_interval: Duration::from_millis(500),
            name_interval_max: Duration::from_secs(1),
            iter: None,
            iter_buf: &mut iter_buf,
            recs: &mut recs,
        };
        let mut r = ThreadRec {
            tid: 11,
            tgid: 10,
            start_ticks: 5,
            cpu_ns: 1_000_000,
            runq_ns: 0,
            slices: 3,
            voluntary: 1,
            involuntary: 0,
            rchar: 0,
            cpu: 1,
            comm: *b"pool\0\0\0\0\0\0\0\0\0\0\0\0",
        };
        let mut t = ThreadEntry::from_rec(&r, &ctx);
        t.view.role = ThreadRole::Other;
        assert_eq!((&*t.view.comm, t.view.start_ticks, t.view.last_cpu), ("pool", 5, Some(1)));
        // One pass every 100 ms; `pass` returns the pass's delta.
        let mut at = t0;
        let mut pass = |t: &mut ThreadEntry, r: &ThreadRec, ctx: &mut PassCtx| {
            at += Duration::from_millis(100);
            ctx.now = at;
            t.view.delta = None;
            assert!(t.sample_rec(r, at, ctx));
            t.view.delta
        };
        assert!(pass(&mut t, &r, &mut ctx).is_none(), "the first record is the baseline");
        r.cpu_ns += 50_000_000;
        r.slices += 1;
        r.rchar += 4096;
        r.voluntary += 2;
        let d = pass(&mut t, &r, &mut ctx).expect("a delta");
        assert_eq!((d.interval_ns, d.cpu_ns, d.timeslices), (100_000_000, 50_000_000, 1));
        let detail = d.detail.expect("active: the detail counters too");
        assert_eq!((detail.read_bytes, detail.voluntary_switches), (4096, 2));
        // Idle for over a second: held back, no delta.
        let mut idle = 0;
        while pass(&mut t, &r, &mut ctx).is_some() {
            idle += 1;
            assert!(idle < 20, "an idle pool thread is held back after a second");
        }
        // Brief wakeups (10 us a pass, under active_busy_frac): still held.
        for _ in 0..5 {
            r.cpu_ns += 10_000;
            r.slices += 1;
            assert!(pass(&mut t, &r, &mut ctx).is_none(), "a brief wakeup is no reason to sample");
        }
        // Active: sampled in that pass, over the whole gap since its last sample.
        r.cpu_ns += 60_000_000;
        r.slices += 1;
        let d = pass(&mut t, &r, &mut ctx).expect("sampled once it was active");
        assert!(d.interval_ns >= 700_000_000, "the delta spans the gap: {} ns", d.interval_ns);
        assert_eq!(d.cpu_ns, 60_050_000);
        assert_eq!(d.timeslices, 6);
        // Renamed: seen from the record.
        r.comm[..4].copy_from_slice(b"load");
        pass(&mut t, &r, &mut ctx);
        assert_eq!(&*t.view.comm, "load");
        // A recycled tid.
        r.start_ticks = 6;
        assert!(!t.sample_rec(&r, at, &ctx), "another start time is another thread");
    }

    #[test]
    fn status_switch_counters() {
        let status = b"Name:\tpython3\nState:\tS (sleeping)\nTgid:\t10\n\
voluntary_ctxt_switches:\t1234\nnonvoluntary_ctxt_switches:\t56\n";
        assert_eq!(status_switches(status), Some((1234, 56)));
        assert_eq!(status_switches(b"Name:\tx\n"), None);
        assert_eq!(status_switches(b"voluntary_ctxt_switches:\tlots\nnonvoluntary_ctxt_switches:\t1\n"), None);
    }
}
