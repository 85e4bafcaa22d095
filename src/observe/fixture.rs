//! Fake /proc trees for unit tests: the files the observer reads, in the
//! kernel's formats, written into a temporary directory.

use std::path::{Path, PathBuf};

pub use crate::tempdir::TempDir;

/// Counters and state of one fake thread.
#[derive(Debug, Clone)]
pub struct FakeThread {
    pub tid: i32,
    pub comm: String,
    pub start: u64,
    pub state: char,
    pub cpu: u32,
    pub cpu_ns: u64,
    pub runq_ns: u64,
    pub slices: u64,
    pub voluntary: u64,
    pub involuntary: u64,
    pub rchar: u64,
}

impl FakeThread {
    pub fn new(tid: i32, comm: &str) -> FakeThread {
        FakeThread {
            tid,
            comm: comm.into(),
            start: 1000 + tid as u64,
            state: 'S',
            cpu: 1,
            cpu_ns: 0,
            runq_ns: 0,
            slices: 0,
            voluntary: 0,
            involuntary: 0,
            rchar: 0,
        }
    }
}

/// One fake process.
#[derive(Debug, Clone)]
pub struct FakeProc {
    pub pid: i32,
    pub ppid: i32,
    pub comm: String,
    pub start: u64,
    pub uid: u32,
    pub gid: u32,
    pub vsize: u64,
    /// Where the program's stack lies (stat's startstack and the
    /// environment's start; its end follows `env`): an exec moves it.
    pub stack: u64,
    pub kernel_thread: bool,
    pub exe: String,
    pub cmdline: Vec<String>,
    pub env: Vec<(String, String)>,
    /// fd targets.
    pub fds: Vec<String>,
    /// Mapped file paths.
    pub maps: Vec<String>,
    pub cgroup: String,
    /// Threads; the first one must have tid == pid.
    pub threads: Vec<FakeThread>,
}

impl FakeProc {
    pub fn new(pid: i32, ppid: i32, comm: &str) -> FakeProc {
        FakeProc {
            pid,
            ppid,
            comm: comm.into(),
            start: 1000 + pid as u64,
            uid: 1000,
            gid: 1000,
            vsize: 100 << 20,
            stack: 0x7ffd_0000_0000,
            kernel_thread: false,
            exe: format!("/usr/bin/{comm}"),
            cmdline: vec![comm.to_string()],
            env: vec![("PATH".into(), "/usr/bin".into())],
            fds: vec!["/dev/null".into(), "pipe:[1234]".into()],
            maps: vec![format!("/usr/bin/{comm}"), "/usr/lib/x86_64-linux-gnu/libc.so.6".into()],
            cgroup: "/user.slice/session-1.scope".into(),
            threads: vec![FakeThread::new(pid, comm)],
        }
    }

    pub fn thread(&mut self, tid: i32) -> &mut FakeThread {
        self.threads.iter_mut().find(|t| t.tid == tid).expect("no such fake thread")
    }
}

#[allow(clippy::too_many_arguments)]
fn stat_line(
    id: i32,
    comm: &str,
    state: char,
    ppid: i32,
    flags: u32,
    nthreads: usize,
    start: u64,
    vsize: u64,
    (stack, env_end): (u64, u64),
    cpu: u32,
    cpu_ns: u64,
) -> String {
    // utime: CPU time in clock ticks (10 ms), truncated like the kernel's.
    let utime = cpu_ns / 10_000_000;
    format!(
        "{id} ({comm}) {state} {ppid} {id} {id} 0 -1 {flags} 0 0 0 0 {utime} 0 0 0 20 0 {nthreads} 0 {start} {vsize} 100 \
18446744073709551615 1 1 {stack} 0 0 0 0 0 0 0 0 0 17 {cpu} 0 0 0 0 0 0 0 0 0 0 {stack} {env_end} 0\n"
    )
}

/// stat's (startstack, env_end) for `p`; zeros for a `stack` of 0 (no
/// address space: an exited leader).
fn stack_fields(p: &FakeProc) -> (u64, u64) {
    if p.stack == 0 {
        return (0, 0);
    }
    let env_len: usize = p.env.iter().map(|(k, v)| k.len() + v.len() + 2).sum();
    (p.stack, p.stack + env_len as u64)
}

#[allow(clippy::too_many_arguments)]
fn status_text(name: &str, pid: i32, ppid: i32, uid: u32, gid: u32, threads: usize, vol: u64, invol: u64) -> String {
    format!(
        "Name:\t{name}\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t{pid}\nNgid:\t0\nPid:\t{pid}\nPPid:\t{ppid}\n\
TracerPid:\t0\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nGid:\t{gid}\t{gid}\t{gid}\t{gid}\nFDSize:\t64\nGroups:\t\n\
VmPeak:\t    3060 kB\nVmSize:\t    3060 kB\nVmRSS:\t    1760 kB\nThreads:\t{threads}\nSigQ:\t0/96365\n\
SigPnd:\t0000000000000000\nShdPnd:\t0000000000000000\nSigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\n\
SigCgt:\t0000000000000000\nCapInh:\t0000000000000000\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\n\
CapBnd:\t000001ffffffffff\nCapAmb:\t0000000000000000\nNoNewPrivs:\t0\nSeccomp:\t0\nCpus_allowed:\t3\n\
Cpus_allowed_list:\t0-1\nMems_allowed:\t1\nMems_allowed_list:\t0\n\
voluntary_ctxt_switches:\t{vol}\nnonvoluntary_ctxt_switches:\t{invol}\n"
    )
}

fn write(path: PathBuf, content: impl AsRef<[u8]>) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, content).unwrap();
}

/// Writes (or rewrites) a process and all its threads under `root`.
pub fn write_proc(root: &Path, p: &FakeProc) {
    let dir = root.join(p.pid.to_string());
    let flags = proc_flags(p);
    let main = &p.threads[0];
    write(
        dir.join("stat"),
        stat_line(
            p.pid,
            &p.comm,
            main.state,
            p.ppid,
            flags,
            p.threads.len(),
            p.start,
            p.vsize,
            stack_fields(p),
            main.cpu,
            // The process's line sums its threads.
            p.threads.iter().map(|t| t.cpu_ns).sum(),
        ),
    );
    write(dir.join("status"), status_text(&p.comm, p.pid, p.ppid, p.uid, p.gid, p.threads.len(), 0, 0));
    write(dir.join("cgroup"), format!("1:cpu:/\n0::{}\n", p.cgroup));
    let mut cmd = p.cmdline.join("\0");
    cmd.push('\0');
    write(dir.join("cmdline"), cmd);
    let env: String = p.env.iter().map(|(k, v)| format!("{k}={v}\0")).collect();
    write(dir.join("environ"), env);
    let maps: String = p
        .maps
        .iter()
        .enumerate()
        .map(|(i, m)| format!("7f00{i:08x}000-7f00{i:08x}fff r-xp 00000000 08:01 {} {m}\n", 100 + i))
        .collect();
    write(dir.join("maps"), maps);
    let fd_dir = dir.join("fd");
    let _ = std::fs::remove_dir_all(&fd_dir);
    std::fs::create_dir_all(&fd_dir).unwrap();
    for (i, target) in p.fds.iter().enumerate() {
        std::os::unix::fs::symlink(target, fd_dir.join(i.to_string())).unwrap();
    }
    let exe = dir.join("exe");
    let _ = std::fs::remove_file(&exe);
    if !p.kernel_thread {
        std::os::unix::fs::symlink(&p.exe, &exe).unwrap();
    }
    for t in &p.threads {
        write_thread(root, p, t);
    }
}

fn proc_flags(p: &FakeProc) -> u32 {
    if p.kernel_thread {
        0x0020_0000
    } else {
        0x0040_0000
    }
}

/// Writes one thread's files.
pub fn write_thread(root: &Path, p: &FakeProc, t: &FakeThread) {
    let dir = root.join(format!("{}/task/{}", p.pid, t.tid));
    write(
        dir.join("stat"),
        stat_line(
            t.tid,
            &t.comm,
            t.state,
            p.ppid,
            proc_flags(p),
            p.threads.len(),
            t.start,
            p.vsize,
            stack_fields(p),
            t.cpu,
            t.cpu_ns,
        ),
    );
    write(dir.join("comm"), format!("{}\n", t.comm));
    write(dir.join("schedstat"), format!("{} {} {}\n", t.cpu_ns, t.runq_ns, t.slices));
    write(
        dir.join("status"),
        status_text(&t.comm, p.pid, p.ppid, p.uid, p.gid, p.threads.len(), t.voluntary, t.involuntary),
    );
    write(
        dir.join("io"),
        format!(
            "rchar: {}\nwchar: 0\nsyscr: 1\nsyscw: 1\nread_bytes: 0\nwrite_bytes: 0\ncancelled_write_bytes: 0\n",
            t.rchar
        ),
    );
}

/// Removes a process directory (the process exited).
pub fn remove_proc(root: &Path, pid: i32) {
    std::fs::remove_dir_all(root.join(pid.to_string())).unwrap();
}

/// Removes one thread directory.
pub fn remove_thread(root: &Path, pid: i32, tid: i32) {
    std::fs::remove_dir_all(root.join(format!("{pid}/task/{tid}"))).unwrap();
}

/// A fake /proc with one process (pid 100, threads 100 "hog" and 101
/// "hog-w") and another (pid 200) "web".
pub fn hog_and_web(root: &Path) {
    let mut hog = FakeProc::new(100, 1, "hog");
    hog.threads.push(FakeThread::new(101, "hog-w"));
    write_proc(root, &hog);
    write_proc(root, &FakeProc::new(200, 1, "web"));
}
