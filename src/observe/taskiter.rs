//! Thread counters from the kernel: a BPF task iterator
//! (src/bpf/threads.bpf.c), one read per ML process per pass.
//!
//! ```text
//!   TaskIter::load ──> zernel_threads (iter/task), its program fd kept
//!   process turns ML ──> attach(pid): a link whose filter is that process
//!                        (BPF_TASK_ITER_TGID, kernel 6.1+; tied to the
//!                        process's struct pid, so never to a recycled pid)
//!   every pass ──> read(link): bpf_iter_create + read() until 0
//!                  ──> one ThreadRec per live thread (tid, start time,
//!                      schedstat's three counters, context switches,
//!                      rchar, last CPU, comm)
//! ```
//!
//! The same counters as /proc/<pid>/task/<tid>/{schedstat,stat,status,io},
//! for every thread of the process, in one read() of binary records: no
//! per-thread file, no text formatting in the kernel, no parsing here.
//! Records come in the kernel's thread-list order; [`read`] sorts them by
//! tid.

use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};

use anyhow::{bail, Context, Result};
use libbpf_rs::libbpf_sys;
use libbpf_rs::skel::{OpenSkel, SkelBuilder};

use crate::bpf_intf::zernel_thread_rec;
use crate::threads_skel::ThreadsSkelBuilder;

/// One thread as the iterator reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadRec {
    pub tid: i32,
    pub tgid: i32,
    pub start_ticks: u64,
    pub cpu_ns: u64,
    pub runq_ns: u64,
    pub slices: u64,
    pub voluntary: u64,
    pub involuntary: u64,
    pub rchar: u64,
    /// -1: unknown.
    pub cpu: i32,
    pub comm: [u8; 16],
}

impl ThreadRec {
    /// The name, up to its NUL.
    pub fn comm(&self) -> &[u8] {
        let n = self.comm.iter().position(|&b| b == 0).unwrap_or(self.comm.len());
        &self.comm[..n]
    }

    fn decode(b: &[u8]) -> ThreadRec {
        // SAFETY: `b` holds size_of::<zernel_thread_rec>() bytes written by
        // the BPF program from the same struct (intf.h); any bit pattern is
        // a valid value of it (integers and a char array).
        let r: zernel_thread_rec = unsafe { std::ptr::read_unaligned(b.as_ptr().cast()) };
        ThreadRec {
            tid: r.tid as i32,
            tgid: r.tgid as i32,
            start_ticks: r.start_ticks,
            cpu_ns: r.cpu_ns,
            runq_ns: r.runq_ns,
            slices: r.slices,
            voluntary: r.nvcsw,
            involuntary: r.nivcsw,
            rchar: r.rchar,
            cpu: r.cpu,
            comm: r.comm.map(|c| c as u8),
        }
    }
}

const REC: usize = std::mem::size_of::<zernel_thread_rec>();

/// The loaded iterator program.
#[derive(Debug)]
pub struct TaskIter {
    prog: OwnedFd,
}

/// The iterator attached to one process.
#[derive(Debug)]
pub struct ProcessLink {
    link: OwnedFd,
}

impl TaskIter {
    /// Loads the iterator (root, BTF; no sched_ext needed).
    pub fn load() -> Result<TaskIter> {
        let mut object = std::mem::MaybeUninit::uninit();
        let open = ThreadsSkelBuilder::default().open(&mut object).context("opening the task iterator")?;
        let skel = open.load().context("loading the task iterator")?;
        // The program outlives the skeleton through its own fd.
        let prog = skel.progs.zernel_threads.as_fd().try_clone_to_owned().context("duplicating its fd")?;
        let it = TaskIter { prog };
        // One read of this very process: the kernel takes the filter.
        let link = it.attach(std::process::id() as i32).context("attaching it to one process")?;
        let mut recs = Vec::new();
        read(&link, &mut Vec::new(), &mut recs).context("reading it")?;
        let me = std::process::id() as i32;
        if !recs.iter().any(|r| r.tid == me && r.tgid == me) {
            bail!("it did not report this process's main thread (another pid namespace?)");
        }
        Ok(it)
    }

    /// The iterator over the threads of process `pid` (this namespace's
    /// pid; the records carry the kernel's, which are the same for a
    /// daemon in the initial pid namespace).
    pub fn attach(&self, pid: i32) -> io::Result<ProcessLink> {
        let mut info = libbpf_sys::bpf_iter_link_info::default();
        info.task.pid = pid as u32;
        let opts = libbpf_sys::bpf_link_create_opts {
            sz: std::mem::size_of::<libbpf_sys::bpf_link_create_opts>() as _,
            iter_info: &mut info,
            iter_info_len: std::mem::size_of::<libbpf_sys::bpf_iter_link_info>() as u32,
            ..Default::default()
        };
        // SAFETY: valid fd and options; the kernel copies `info` before
        // the call returns.
        let fd = unsafe { libbpf_sys::bpf_link_create(self.prog.as_raw_fd(), 0, libbpf_sys::BPF_TRACE_ITER, &opts) };
        if fd < 0 {
            return Err(io::Error::from_raw_os_error(-fd));
        }
        // SAFETY: a new fd the call returned, owned by no one else.
        Ok(ProcessLink { link: unsafe { OwnedFd::from_raw_fd(fd) } })
    }
}

/// Reads the records of every live thread of the linked process into
/// `out` (cleared first), sorted by tid. `buf` is reused between calls.
pub fn read(link: &ProcessLink, buf: &mut Vec<u8>, out: &mut Vec<ThreadRec>) -> io::Result<()> {
    out.clear();
    // SAFETY: a link fd of an iterator program.
    let fd = unsafe { libbpf_sys::bpf_iter_create(link.link.as_raw_fd()) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new fd the call returned.
    let iter = unsafe { OwnedFd::from_raw_fd(fd) };
    if buf.is_empty() {
        buf.resize(64 * 1024, 0);
    }
    let mut len = 0;
    loop {
        if buf.len() - len < 16 * REC {
            buf.resize(buf.len() * 2, 0);
        }
        // SAFETY: reads into the initialised tail of `buf`.
        let n = unsafe { libc::read(iter.as_raw_fd(), buf[len..].as_mut_ptr().cast(), buf.len() - len) };
        match n {
            0 => break,
            n if n < 0 => {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            n => len += n as usize,
        }
    }
    out.extend(buf[..len - len % REC].chunks_exact(REC).map(ThreadRec::decode));
    out.sort_unstable_by_key(|r| r.tid);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proc_fields(tid: i32, file: &str) -> Vec<String> {
        let text = std::fs::read_to_string(format!("/proc/self/task/{tid}/{file}")).expect("own /proc file");
        match file {
            // The fields after the name (which may hold spaces).
            "stat" => text[text.rfind(')').expect("stat") + 2..].split_whitespace().map(String::from).collect(),
            _ => text.split_whitespace().map(String::from).collect(),
        }
    }

    /// The iterator's records say what /proc says of this process's
    /// threads: the same tids, start times and names, counters that lie
    /// between two /proc reads. Needs root (BPF); skipped, and says so,
    /// without.
    #[test]
    fn records_match_proc() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("records_match_proc: skipped (not root)");
            return;
        }
        let it = TaskIter::load().expect("the task iterator loads as root");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (s2, (tx, rx)) = (stop.clone(), std::sync::mpsc::channel());
        let spinner = std::thread::Builder::new()
            .name("zt_iter_spin".into())
            .spawn(move || {
                // SAFETY: gettid has no preconditions.
                tx.send(unsafe { libc::gettid() }).expect("sending the tid");
                let mut x = 0u64;
                while !s2.load(std::sync::atomic::Ordering::Relaxed) {
                    x = std::hint::black_box(x.wrapping_add(1));
                }
            })
            .expect("spawning");
        // Until the spinner has run 100 ms (however loaded the machine).
        let spin_tid = rx.recv().expect("the spinner's tid");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while proc_fields(spin_tid, "schedstat")[0].parse::<u64>().expect("cpu ns") < 100_000_000 {
            assert!(std::time::Instant::now() < deadline, "the spinner got no 100 ms of CPU in 60 s");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let me = std::process::id() as i32;
        let link = it.attach(me).expect("attach");
        let tids = |recs: &[ThreadRec]| recs.iter().map(|r| r.tid).collect::<Vec<_>>();
        let listed = || {
            let mut v: Vec<i32> = std::fs::read_dir("/proc/self/task")
                .expect("task dir")
                .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect();
            v.sort_unstable();
            v
        };
        let (mut buf, mut recs) = (Vec::new(), Vec::new());
        // Other tests' threads come and go: retry until a read and two
        // listings around it agree.
        let mut before = Vec::new();
        for _ in 0..20 {
            before = listed();
            read(&link, &mut buf, &mut recs).expect("read");
            if before == tids(&recs) && listed() == before {
                break;
            }
        }
        assert_eq!(tids(&recs), before, "the records' tids are the process's threads");
        let spin = *recs.iter().find(|r| r.comm() == b"zt_iter_spin").expect("the spinner's record, by its name");
        let stat = proc_fields(spin.tid, "stat");
        assert_eq!(spin.tgid, me);
        // stat field 22 (the 20th after the name) is the start time.
        assert_eq!(spin.start_ticks.to_string(), stat[19], "start time in USER_HZ ticks");
        // Counters: /proc before <= record <= /proc after.
        let sched_before = proc_fields(spin.tid, "schedstat");
        read(&link, &mut buf, &mut recs).expect("read");
        let sched_after = proc_fields(spin.tid, "schedstat");
        let spin = *recs.iter().find(|r| r.comm() == b"zt_iter_spin").expect("the spinner's record");
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        spinner.join().expect("join");
        for (i, (name, v)) in
            [("cpu_ns", spin.cpu_ns), ("runq_ns", spin.runq_ns), ("slices", spin.slices)].into_iter().enumerate()
        {
            let (lo, hi): (u64, u64) = (sched_before[i].parse().unwrap(), sched_after[i].parse().unwrap());
            assert!(lo <= v && v <= hi, "{name}: {lo} <= {v} <= {hi}");
        }
        assert!(spin.cpu_ns >= 100_000_000, "the spinner ran 100 ms: {} ns", spin.cpu_ns);
        // This thread read files and slept: both counters moved.
        // SAFETY: gettid has no preconditions.
        let this = unsafe { libc::gettid() };
        let main = recs.iter().find(|r| r.tid == this).expect("this thread's record");
        let status = std::fs::read_to_string(format!("/proc/self/task/{this}/status")).expect("status");
        let vol: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("voluntary_ctxt_switches");
        assert!(main.voluntary > 0 && main.voluntary <= vol, "voluntary switches {} <= {vol}", main.voluntary);
        let io = std::fs::read_to_string(format!("/proc/self/task/{this}/io")).expect("io");
        let rchar: u64 =
            io.lines().find_map(|l| l.strip_prefix("rchar: ")).and_then(|v| v.parse().ok()).expect("rchar");
        assert!(main.rchar > 0 && main.rchar <= rchar, "rchar {} <= {rchar}", main.rchar);
    }

    /// A record decodes field by field from the bytes the BPF side writes.
    #[test]
    fn decodes_a_record() {
        // SAFETY: a plain C struct of integers: all zeroes is a value.
        let mut r: zernel_thread_rec = unsafe { std::mem::zeroed() };
        (r.tid, r.tgid, r.cpu, r.start_ticks) = (12, 10, 3, 77);
        (r.cpu_ns, r.runq_ns, r.slices, r.nvcsw, r.nivcsw, r.rchar) = (5, 6, 7, 8, 9, 11);
        for (d, s) in r.comm.iter_mut().zip(b"pt_data_worker") {
            *d = *s as _;
        }
        // SAFETY: a plain C struct viewed as its bytes.
        let bytes = unsafe { std::slice::from_raw_parts((&r as *const zernel_thread_rec).cast::<u8>(), REC) };
        let d = ThreadRec::decode(bytes);
        assert_eq!((d.tid, d.tgid, d.cpu, d.start_ticks), (12, 10, 3, 77));
        assert_eq!((d.cpu_ns, d.runq_ns, d.slices, d.voluntary, d.involuntary, d.rchar), (5, 6, 7, 8, 9, 11));
        assert_eq!(d.comm(), b"pt_data_worker");
    }
}
