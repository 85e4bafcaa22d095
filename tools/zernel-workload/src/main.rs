#![doc = include_str!("../README.md")]

use std::collections::VecDeque;
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};

mod bpf_run;
mod entry;

const BATCH: usize = 4096;
const RANK_ENV: [(&str, &str); 3] = [("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")];

/// Processes that behave like an ML training job (or like the background
/// noise around one), for scx_zernel's tests and benchmarks.
#[derive(Parser)]
#[command(name = "zernel-workload")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

/// One line each here; `help COMMAND` prints COMMAND's section of README.md.
#[derive(Subcommand)]
enum Cmd {
    /// A training job: DataLoader worker processes, a trainer, a fake GPU, NCCL threads
    Train(TrainArgs),
    /// Units of sized work one thread does per ms here
    Calibrate(CalibrateArgs),
    /// Threads spinning on the CPU, all the time or a share of every 5 ms
    Hog(HogArgs),
    /// A process with many mostly idle threads
    Threads(ThreadsArgs),
    /// Threads creating short-lived threads, one after another
    Churn(ChurnArgs),
    /// An in-process data loader: a thread reading /dev/zero, maybe holding a device open
    Reader(ReaderArgs),
    /// Threads calling BPF_PROG_TEST_RUN (nearly all their time with migration disabled)
    BpfRun(BpfRunArgs),
    /// A thread that creates one child, a process or a thread, once a file exists
    Fork(ForkArgs),
    /// Threads of which the main one opens a device once a file exists
    Open(OpenArgs),
    /// Not a workload: writes one entry into the pinned task_class map
    Entry(EntryArgs),
}

#[derive(Args)]
struct TrainArgs {
    /// The fake GPU's file (the format of scx_zernel's file GPU provider)
    #[arg(long, value_name = "PATH")]
    gpu_file: PathBuf,
    /// Run for S seconds, every phase on a deadline (unless --steps)
    #[arg(long, value_name = "S", default_value_t = 10)]
    secs: u64,
    /// Run exactly N steps of sized work (at least 1) instead of --secs
    #[arg(long, value_name = "N")]
    steps: Option<u64>,
    /// DataLoader worker processes (1 to 64)
    #[arg(long, value_name = "N", default_value_t = 2)]
    workers: u64,
    /// The data shards' directory, kept [default: a temporary one, removed at the end]
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// --secs: a step's compute phase
    #[arg(long, value_name = "MS", default_value_t = 500)]
    compute_ms: u64,
    /// A step's all-reduce, 0 for none [default: 500, or 0 with --steps]
    #[arg(long, value_name = "MS")]
    allreduce_ms: Option<u64>,
    /// --secs: a step's optimizer phase
    #[arg(long, value_name = "MS", default_value_t = 500)]
    optim_ms: u64,
    /// --secs: a worker's decoding of a batch
    #[arg(long, value_name = "MS", default_value_t = 500)]
    decode_ms: u64,
    /// --secs: one fake-GPU kernel (at least 1)
    #[arg(long, value_name = "MS", default_value_t = 20)]
    kernel_ms: u64,
    /// The GPU's utilisation while busy (at most 100)
    #[arg(long, value_name = "PCT", default_value_t = 100)]
    gpu_util: u64,
    /// The GPU's utilisation while idle (at most 100)
    #[arg(long, value_name = "PCT", default_value_t = 0)]
    gpu_idle_util: u64,
    /// --steps: units of work a worker decodes per batch
    #[arg(long, value_name = "U", default_value_t = 400)]
    decode_units: u64,
    /// --steps: units of work of a step's optimizer phase
    #[arg(long, value_name = "U", default_value_t = 100)]
    optim_units: u64,
    /// --steps: fake-GPU kernels per step
    #[arg(long, value_name = "K", default_value_t = 20)]
    kernels: u64,
    /// --steps: units of work to launch one kernel
    #[arg(long, value_name = "U", default_value_t = 2)]
    launch_units: u64,
    /// Do not re-execute with the rank environment (RANK=0 LOCAL_RANK=0 WORLD_SIZE=1)
    #[arg(long)]
    no_env: bool,
}

#[derive(Args)]
struct CalibrateArgs {
    /// How long to measure (at least 50)
    #[arg(long, value_name = "MS", default_value_t = 500)]
    ms: u64,
}

#[derive(Args)]
struct HogArgs {
    /// The threads' name
    #[arg(long, value_name = "NAME")]
    name: String,
    /// How long to run
    #[arg(long, value_name = "S", default_value_t = 10)]
    secs: u64,
    /// Threads, the main one included (at least 1)
    #[arg(long, value_name = "N", default_value_t = 1)]
    threads: u64,
    /// Spin P % of every 5 ms, sleep the rest
    #[arg(long, value_name = "P", default_value_t = 100)]
    busy_pct: u64,
    /// Rename the threads NEW once --rename-when exists
    #[arg(long, value_name = "NEW", requires = "rename_when")]
    rename: Option<String>,
    /// The file whose existence starts --rename
    #[arg(long, value_name = "PATH", requires = "rename")]
    rename_when: Option<PathBuf>,
    /// Run as SCHED_FIFO at PRIO
    #[arg(long, value_name = "PRIO")]
    fifo: Option<i32>,
}

#[derive(Args)]
struct ThreadsArgs {
    /// Idle threads
    #[arg(long, value_name = "N")]
    count: usize,
    /// How long to run
    #[arg(long, value_name = "S", default_value_t = 10)]
    secs: u64,
    /// How often each thread wakes (±25 %)
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    wake_ms: u64,
    /// Carry the rank environment (an ML process)
    #[arg(long)]
    ml: bool,
}

#[derive(Args)]
struct ChurnArgs {
    /// How long to run
    #[arg(long, value_name = "S", default_value_t = 10)]
    secs: u64,
    /// Stop after C threads were created [default: no limit]
    #[arg(long, value_name = "C")]
    count: Option<u64>,
    /// Threads creating threads
    #[arg(long, value_name = "N", default_value_t = 4)]
    threads: u64,
    /// The name of the process and of every thread created
    #[arg(long, value_name = "NAME", default_value = "zt_churn")]
    name: String,
}

#[derive(Args)]
struct ReaderArgs {
    /// The process's (and reading thread's) name
    #[arg(long, value_name = "NAME")]
    name: String,
    /// How long to run
    #[arg(long, value_name = "S", default_value_t = 10)]
    secs: u64,
    /// A file (a device) to hold open
    #[arg(long, value_name = "PATH")]
    open: Option<String>,
    /// The fd to hold --open as [default: the lowest free one]
    #[arg(long, value_name = "N")]
    fd: Option<u64>,
    /// Open --open this late
    #[arg(long, value_name = "MS", default_value_t = 0)]
    after_ms: u64,
    /// Open --open once FILE exists
    #[arg(long, value_name = "FILE")]
    open_when: Option<PathBuf>,
    /// Read P % of every 5 ms, sleep the rest
    #[arg(long, value_name = "P", default_value_t = 100)]
    busy_pct: u64,
    /// A second thread, named NAME2, does the reading
    #[arg(long, value_name = "NAME2")]
    thread: Option<String>,
    /// --thread: start reading this late
    #[arg(long, value_name = "MS", default_value_t = 0)]
    start_ms: u64,
}

#[derive(Args)]
struct BpfRunArgs {
    /// The threads' name
    #[arg(long, value_name = "NAME")]
    name: String,
    /// How long to run
    #[arg(long, value_name = "S", default_value_t = 10)]
    secs: u64,
    /// Threads
    #[arg(long, value_name = "N", default_value_t = 1)]
    threads: u64,
}

#[derive(Args)]
struct ForkArgs {
    /// The parent's name
    #[arg(long, value_name = "NAME")]
    name: String,
    /// How long to run
    #[arg(long, value_name = "S", default_value_t = 10)]
    secs: u64,
    /// The file whose existence makes the child
    #[arg(long, value_name = "PATH")]
    when: PathBuf,
    /// The child's name [default: NAME]
    #[arg(long, value_name = "NAME2")]
    child_name: Option<String>,
    /// The child is a thread, not a process
    #[arg(long)]
    thread: bool,
    /// Run P % of every 5 ms, sleep the rest
    #[arg(long, value_name = "P", default_value_t = 20)]
    busy_pct: u64,
}

#[derive(Args)]
struct OpenArgs {
    /// The threads' name
    #[arg(long, value_name = "NAME")]
    name: String,
    /// How long to run
    #[arg(long, value_name = "S", default_value_t = 10)]
    secs: u64,
    /// The device to open (read-only)
    #[arg(long, value_name = "DEV")]
    path: String,
    /// The file whose existence makes the open
    #[arg(long, value_name = "PATH")]
    when: PathBuf,
    /// Threads, the main one included (at least 1)
    #[arg(long, value_name = "N", default_value_t = 3)]
    threads: u64,
    /// Run P % of every 5 ms, sleep the rest
    #[arg(long, value_name = "P", default_value_t = 20)]
    busy_pct: u64,
}

#[derive(Args)]
struct EntryArgs {
    /// The pinned task_class map
    #[arg(long, value_name = "PATH")]
    map: String,
    /// The thread
    #[arg(long, value_name = "T", value_parser = clap::value_parser!(u32).range(1..))]
    tid: u32,
    /// The class
    #[arg(long, value_name = "N")]
    class: u32,
    /// Added to the thread's start time (USER_HZ ticks): a stale entry unless 0
    #[arg(long, value_name = "TICKS", default_value_t = 0)]
    start_offset: u64,
    /// The preferred node, -1 for none
    #[arg(long, value_name = "N", default_value_t = -1, allow_hyphen_values = true)]
    node: i32,
}

/// The README's section `# name`, without its code fences: the long help
/// of subcommand `name`.
fn section(name: &str) -> Option<String> {
    let mut lines = include_str!("../README.md").lines().skip_while(|l| *l != format!("# {name}")).skip(1);
    let mut text = String::new();
    let mut fenced = false;
    for l in lines.by_ref() {
        if l.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced && l.starts_with("# ") {
            break;
        }
        text.push_str(l);
        text.push('\n');
    }
    // Blank lines only: a diagram's first line keeps its indentation.
    let text = text.trim_matches('\n');
    (!text.is_empty()).then(|| text.to_string())
}

/// The command line: every subcommand with its README section as its long
/// help, and an option given twice taking its last value.
fn command() -> clap::Command {
    let mut cmd = Cli::command();
    let names: Vec<String> = cmd.get_subcommands().map(|c| c.get_name().to_string()).collect();
    for name in names {
        let about = section(&name);
        cmd = cmd.mut_subcommand(&name, |c| {
            let c = c.args_override_self(true);
            match about {
                Some(text) => c.long_about(text),
                None => c,
            }
        });
    }
    cmd
}

/// Whether the command line asks for the rank environment: `train` without
/// --no-env, `threads --ml`. Read from the raw arguments, so that the
/// re-execution comes before clap runs: an observer that looks at this
/// process before it (the same program with the same arguments, which is no
/// exec to it) keeps the environment it read then, without the rank.
fn wants_rank_env(args: &[std::ffi::OsString]) -> bool {
    let has = |flag: &str| args.iter().skip(2).any(|a| a == flag);
    match args.get(1).and_then(|a| a.to_str()) {
        Some("train") => !has("--no-env"),
        Some("threads") => has("--ml"),
        _ => false,
    }
}

fn main() {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if wants_rank_env(&args) {
        ensure_rank_env();
    }
    let cli = Cli::from_arg_matches(&command().get_matches_from(args)).unwrap_or_else(|e| e.exit());
    match &cli.cmd {
        Cmd::Train(a) => train(a),
        Cmd::Calibrate(a) => calibrate(a),
        Cmd::Hog(a) => hog(a),
        Cmd::Threads(a) => threads(a),
        Cmd::Churn(a) => churn(a),
        Cmd::Reader(a) => reader(a),
        Cmd::BpfRun(a) => bpf_run_cmd(a),
        Cmd::Fork(a) => fork_cmd(a),
        Cmd::Open(a) => open_cmd(a),
        Cmd::Entry(a) => entry_cmd(a),
    }
}

/// Names the calling thread (comm, at most 15 bytes).
fn set_name(name: &str) {
    let mut bytes: Vec<u8> = name.bytes().filter(|&b| b != 0).take(15).collect();
    bytes.push(0);
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes.
    unsafe {
        libc::prctl(libc::PR_SET_NAME, bytes.as_ptr() as libc::c_ulong, 0, 0, 0);
    }
}

/// Makes the calling thread (and the threads it creates) SCHED_FIFO at `prio`.
fn set_fifo(prio: i32) {
    let param = libc::sched_param { sched_priority: prio };
    // SAFETY: sched_setscheduler reads one sched_param; 0 = this thread.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } != 0 {
        eprintln!("zernel-workload: SCHED_FIFO {prio}: {}", std::io::Error::last_os_error());
        std::process::exit(1);
    }
}

/// Re-executes this program with the rank environment unless it is set.
fn ensure_rank_env() {
    if std::env::var_os("RANK").is_some() {
        return;
    }
    let Ok(exe) = std::env::current_exe() else {
        return;
    };
    let mut cmd = std::process::Command::new(exe);
    cmd.args(std::env::args_os().skip(1));
    for (k, v) in RANK_ENV {
        cmd.env(k, v);
    }
    let err = cmd.exec();
    eprintln!("zernel-workload: re-exec with the rank environment failed: {err}");
}

/// Burns CPU until `until`.
fn spin_until(until: Instant) -> u64 {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    while Instant::now() < until {
        for _ in 0..2000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
        }
    }
    std::hint::black_box(x)
}

/// Runs `work` (a short step) for `pct` % of every 5 ms period until
/// `until`, sleeping the rest (one voluntary switch a period, ~200 a
/// second). It sleeps its share of every period even when it is late (a
/// loaded CPU): a thread that skipped its sleeps would turn into a spinner
/// with no voluntary switch at all.
fn duty_cycle(until: Instant, pct: u64, mut work: impl FnMut()) {
    const PERIOD: Duration = Duration::from_millis(5);
    let busy = PERIOD.mul_f64(pct.min(100) as f64 / 100.0);
    let idle = PERIOD - busy;
    while Instant::now() < until {
        let busy_end = Instant::now() + busy;
        while Instant::now() < busy_end.min(until) {
            work();
        }
        if !idle.is_zero() {
            std::thread::sleep(idle);
        }
    }
}

/// One unit of sized work: an FNV-1a checksum pass over 16 KiB of `data`
/// (fewer bytes if it is shorter), folded into `sum`.
fn work_unit(data: &[u8], sum: u64) -> u64 {
    let mut sum = sum;
    for &b in data.iter().take(16 << 10) {
        sum = (sum ^ b as u64).wrapping_mul(0x100_0000_01b3);
    }
    std::hint::black_box(sum)
}

/// `units` units of work over a fixed 16 KiB buffer.
fn work(units: u64) {
    static DATA: [u8; 16 << 10] = [0x5a; 16 << 10];
    let mut sum = 0xcbf2_9ce4_8422_2325;
    for _ in 0..units {
        sum = work_unit(&DATA, sum);
    }
    std::hint::black_box(sum);
}

/// `calibrate`: units of work one thread does per ms here, measured over
/// --ms (default 500) after a short warm-up. Run it on an idle machine.
fn calibrate(a: &CalibrateArgs) {
    let ms = a.ms.max(50);
    work(50);
    let t = Instant::now();
    let mut units = 0u64;
    while t.elapsed() < Duration::from_millis(ms) {
        work(10);
        units += 10;
    }
    println!("zernel-workload calibrate units_per_ms={:.2}", units as f64 / (t.elapsed().as_secs_f64() * 1e3));
}

fn entry_cmd(a: &EntryArgs) {
    if let Err(e) = entry::write(&a.map, a.tid, a.class, a.start_offset, a.node) {
        eprintln!("zernel-workload entry: {e}");
        std::process::exit(1);
    }
}

// ------------------------------------------------------------------ hog ----

fn hog(a: &HogArgs) {
    let name = a.name.clone();
    let n = a.threads.max(1);
    let pct = a.busy_pct;
    let until = Instant::now() + Duration::from_secs(a.secs);
    if let Some(prio) = a.fifo {
        set_fifo(prio);
    }
    // --rename NEW: once the file --rename-when exists, every thread but the
    // main one (the main one when it is alone) takes the name NEW.
    let rename = a.rename.clone().zip(a.rename_when.clone());
    let run = move |rename: Option<(String, PathBuf)>| {
        let burn = |end| {
            if pct >= 100 {
                spin_until(end);
            } else {
                duty_cycle(end, pct, || {
                    spin_until(Instant::now() + Duration::from_micros(100));
                });
            }
        };
        if let Some((new, when)) = rename {
            // Checked every 10 ms.
            while Instant::now() < until && !when.exists() {
                burn((Instant::now() + Duration::from_millis(10)).min(until));
            }
            set_name(&new);
        }
        burn(until);
    };
    set_name(&name);
    let handles: Vec<_> = (1..n)
        .map(|_| {
            let name = name.clone();
            let rename = rename.clone();
            std::thread::spawn(move || {
                set_name(&name);
                run(rename)
            })
        })
        .collect();
    run(if n == 1 { rename } else { None });
    for h in handles {
        let _ = h.join();
    }
}

// ----------------------------------------------------------------- fork ----

fn fork_cmd(a: &ForkArgs) {
    let (name, when) = (a.name.as_str(), a.when.as_path());
    let child_name = a.child_name.as_deref().unwrap_or(name).to_string();
    let until = Instant::now() + Duration::from_secs(a.secs);
    let pct = a.busy_pct;
    let burn = move |end: Instant| {
        duty_cycle(end, pct, || {
            spin_until(Instant::now() + Duration::from_micros(100));
        })
    };
    set_name(name);
    while Instant::now() < until && !when.exists() {
        burn((Instant::now() + Duration::from_millis(10)).min(until));
    }
    if a.thread {
        let (tx, rx) = std::sync::mpsc::channel();
        let h = std::thread::spawn(move || {
            set_name(&child_name);
            // SAFETY: gettid has no arguments and cannot fail.
            let _ = tx.send(unsafe { libc::gettid() });
            burn(until);
        });
        if let Ok(tid) = rx.recv() {
            println!("zernel-workload fork child {tid}");
        }
        burn(until);
        let _ = h.join();
        return;
    }
    // SAFETY: this process has one thread: the child may run anything.
    match unsafe { libc::fork() } {
        -1 => {
            eprintln!("zernel-workload fork: {}", std::io::Error::last_os_error());
            std::process::exit(1);
        }
        0 => {
            set_name(&child_name);
            burn(until);
            // SAFETY: ends the child without running the parent's exit handlers.
            unsafe { libc::_exit(0) }
        }
        pid => {
            println!("zernel-workload fork child {pid}");
            let _ = std::io::stdout().flush();
            burn(until);
            let mut status = 0;
            // SAFETY: waits for the child forked above.
            unsafe { libc::waitpid(pid, &mut status, 0) };
        }
    }
}

// ----------------------------------------------------------------- open ----

fn open_cmd(a: &OpenArgs) {
    let (name, dev, when) = (a.name.as_str(), a.path.as_str(), a.when.as_path());
    let until = Instant::now() + Duration::from_secs(a.secs);
    let pct = a.busy_pct;
    let burn = move |end: Instant| {
        duty_cycle(end, pct, || {
            spin_until(Instant::now() + Duration::from_micros(100));
        })
    };
    set_name(name);
    let handles: Vec<_> = (1..a.threads.max(1))
        .map(|_| {
            let name = name.to_string();
            std::thread::spawn(move || {
                set_name(&name);
                burn(until)
            })
        })
        .collect();
    while Instant::now() < until && !when.exists() {
        burn((Instant::now() + Duration::from_millis(10)).min(until));
    }
    // Held open (if it opens) until the end.
    let _held = match File::open(dev) {
        Ok(f) => {
            println!("zernel-workload open {dev} ok");
            Some(f)
        }
        Err(e) => {
            println!("zernel-workload open {dev} error {e}");
            None
        }
    };
    burn(until);
    for h in handles {
        let _ = h.join();
    }
}

// -------------------------------------------------------------- bpf-run ----

fn bpf_run_cmd(a: &BpfRunArgs) {
    match bpf_run::bpf_run(&a.name, a.secs, a.threads) {
        Ok(calls) => println!("zernel-workload bpf-run calls {calls}"),
        Err(e) => {
            eprintln!("zernel-workload bpf-run: {e}");
            std::process::exit(1);
        }
    }
}

// --------------------------------------------------------------- reader ----

fn reader(a: &ReaderArgs) {
    let name = a.name.as_str();
    let path = a.open.as_deref();
    let until = Instant::now() + Duration::from_secs(a.secs);
    let open_at = Instant::now() + Duration::from_millis(a.after_ms);
    let open_when = a.open_when.as_deref();
    let want_fd = a.fd.map(|fd| fd as libc::c_int);
    let pct = a.busy_pct;
    if let Some(thread) = a.thread.as_deref() {
        let start = Instant::now() + Duration::from_millis(a.start_ms);
        return reader_thread(name, thread, start, until, pct);
    }
    set_name(name);
    let mut zero = File::open("/dev/zero").expect("opening /dev/zero");
    let mut buf = vec![0u8; 1 << 20];
    let mut held: Vec<File> = Vec::new();
    let mut opened = false;
    while Instant::now() < until {
        let due = Instant::now() >= open_at && open_when.is_none_or(|w| w.exists());
        if let Some(path) = path.filter(|_| !opened && due) {
            opened = true;
            // With --fd, every lower descriptor is taken first (open gives the
            // lowest free one), so that the device is opened straight at
            // `want`: it is never seen at a lower one, even for an instant.
            if let Some(want) = want_fd {
                while let Ok(f) = File::open("/dev/null") {
                    if std::os::fd::AsRawFd::as_raw_fd(&f) >= want {
                        break;
                    }
                    held.push(f);
                }
            }
            let dev = File::open(path).unwrap_or_else(|e| panic!("opening {path}: {e}"));
            let mut fd = std::os::fd::IntoRawFd::into_raw_fd(dev);
            if let Some(want) = want_fd.filter(|&w| w != fd) {
                // `want` was taken before this process began: move it there.
                // SAFETY: dup2 onto a descriptor number this process owns,
                // then the original is closed: only fd `want` is left.
                unsafe {
                    assert_eq!(libc::dup2(fd, want), want, "dup2 to fd {want}");
                    libc::close(fd);
                }
                fd = want;
            }
            // SAFETY: an anonymous private mapping, never unmapped (it only
            // has to change the virtual size).
            let map = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    1 << 20,
                    libc::PROT_READ,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(map, libc::MAP_FAILED, "mmap");
            println!("zernel-workload reader opened {path} fd {fd}");
            let _ = std::io::stdout().flush();
        }
        read_step(&mut zero, &mut buf, pct, until);
    }
}

/// Reads /dev/zero for a while: one 1 MiB read at 100 %, else up to a
/// second at the duty cycle.
fn read_step(zero: &mut File, buf: &mut [u8], pct: u64, until: Instant) {
    if pct >= 100 {
        let _ = zero.read(buf);
    } else {
        let step = (Instant::now() + Duration::from_secs(1)).min(until);
        duty_cycle(step, pct, || {
            let _ = zero.read(&mut buf[..64 << 10]);
        });
    }
}

/// `reader --thread NAME`: the reading is done by a second thread named
/// NAME, idle (asleep) until `start`; the main thread only waits for it.
fn reader_thread(name: &str, thread: &str, start: Instant, until: Instant, pct: u64) {
    set_name(name);
    let thread = thread.to_string();
    let h = std::thread::spawn(move || {
        set_name(&thread);
        std::thread::sleep(start.saturating_duration_since(Instant::now()));
        let mut zero = File::open("/dev/zero").expect("opening /dev/zero");
        let mut buf = vec![0u8; 1 << 20];
        while Instant::now() < until {
            read_step(&mut zero, &mut buf, pct, until);
        }
    });
    let _ = h.join();
}

// ---------------------------------------------------------------- churn ----

/// N threads (default 4) that each create short-lived threads, one at a
/// time, for S seconds or until C were created: every child names itself
/// NAME (default zt_churn), so that a rule can give it a class, and exits.
/// Prints how many were created.
fn churn(a: &ChurnArgs) {
    let secs = a.secs;
    let target = a.count.unwrap_or(u64::MAX);
    let n = a.threads.max(1);
    let total = Arc::new(AtomicU64::new(0));
    let name = a.name.clone();
    let until = Instant::now() + Duration::from_secs(secs);
    set_name(&name);
    let spawners: Vec<_> = (0..n)
        .map(|_| {
            let name = name.clone();
            let total = total.clone();
            std::thread::spawn(move || {
                let mut created = 0u64;
                while Instant::now() < until && total.load(Ordering::Relaxed) < target {
                    let name = name.clone();
                    let child = std::thread::Builder::new().stack_size(16 << 10).spawn(move || set_name(&name));
                    match child {
                        Ok(h) => {
                            let _ = h.join();
                            created += 1;
                            total.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(1)),
                    }
                }
                created
            })
        })
        .collect();
    let total: u64 = spawners.into_iter().map(|h| h.join().unwrap_or(0)).sum();
    println!("zernel-workload churn created {total} threads");
}

// -------------------------------------------------------------- threads ----

/// `threads`; with --ml, main has re-executed it with the rank environment.
fn threads(a: &ThreadsArgs) {
    let count = a.count;
    let secs = a.secs;
    let wake = Duration::from_millis(a.wake_ms.max(1));
    let until = Instant::now() + Duration::from_secs(secs);
    let mut handles = Vec::with_capacity(count);
    for i in 0..count {
        let h = std::thread::Builder::new().stack_size(64 << 10).spawn(move || {
            set_name(&format!("idle_{i}"));
            let mut x = i as u64;
            // ±25 % jitter so the pool does not wake in lockstep.
            let period = wake.mul_f64(0.75 + (i % 50) as f64 / 100.0);
            while Instant::now() < until {
                std::thread::sleep(period.min(until.saturating_duration_since(Instant::now())));
                for _ in 0..100 {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                }
            }
            std::hint::black_box(x);
        });
        match h {
            Ok(h) => handles.push(h),
            Err(e) => {
                eprintln!("zernel-workload: thread {i}: {e}");
                break;
            }
        }
    }
    println!("zernel-workload threads ready {}", handles.len());
    let _ = std::io::stdout().flush();
    for h in handles {
        let _ = h.join();
    }
}

// ---------------------------------------------------------------- train ----

/// The fake GPU: a kernel queue served by one thread, and the GPU file.
struct Gpu {
    state: Mutex<GpuState>,
    cv: Condvar,
    file: PathBuf,
    pid: u32,
    /// Utilisation published while busy and while idle (100 and 0 unless set).
    busy_util: u64,
    idle_util: u64,
}

#[derive(Default)]
struct GpuState {
    queue: VecDeque<Duration>,
    submitted: u64,
    done: u64,
    /// An all-reduce keeps the GPU busy (NCCL kernels).
    held: bool,
    busy_since: Option<Instant>,
    busy_total: Duration,
    stop: bool,
}

impl Gpu {
    fn publish(&self, util: u64) {
        let text = format!(
            "{{\"devices\":[{{\"index\":0,\"uuid\":\"GPU-zernel-fake-0\",\"pci_bus_id\":\"00000000:00:00.0\",\"util\":{util}}}],\
\"processes\":[{{\"pid\":{},\"device\":0,\"sm_util\":{util}}}]}}\n",
            self.pid
        );
        let tmp = self.file.with_extension(format!("tmp.{}", self.pid));
        if std::fs::write(&tmp, text).is_ok() {
            let _ = std::fs::rename(&tmp, &self.file);
        }
    }

    fn set_busy(&self, st: &mut GpuState, busy: bool) {
        match (busy, st.busy_since) {
            (true, None) => {
                st.busy_since = Some(Instant::now());
                self.publish(self.busy_util);
            }
            (false, Some(since)) => {
                st.busy_total += since.elapsed();
                st.busy_since = None;
                self.publish(self.idle_util);
            }
            _ => {}
        }
    }

    /// The GPU thread: runs kernels; idles 5 ms after the last one.
    fn run(&self) {
        set_name("fake_gpu");
        let mut st = self.state.lock().unwrap();
        loop {
            if st.stop {
                return;
            }
            if let Some(k) = st.queue.pop_front() {
                self.set_busy(&mut st, true);
                drop(st);
                std::thread::sleep(k);
                st = self.state.lock().unwrap();
                st.done += 1;
                self.cv.notify_all();
                continue;
            }
            if st.busy_since.is_some() && !st.held {
                let (g, timeout) = self.cv.wait_timeout(st, Duration::from_millis(5)).unwrap();
                st = g;
                if timeout.timed_out() && st.queue.is_empty() && !st.held {
                    self.set_busy(&mut st, false);
                }
            } else {
                st = self.cv.wait(st).unwrap();
            }
        }
    }

    /// Launches one kernel (a short CPU burst: `launch_units` of work, or
    /// 200 us of spinning if None) and waits for it.
    fn launch_and_wait(&self, k: Duration, launch_units: Option<u64>) {
        match launch_units {
            Some(u) => work(u),
            None => {
                spin_until(Instant::now() + Duration::from_micros(200));
            }
        }
        let mut st = self.state.lock().unwrap();
        st.queue.push_back(k);
        st.submitted += 1;
        let mine = st.submitted;
        self.cv.notify_all();
        while st.done < mine {
            st = self.cv.wait(st).unwrap();
        }
    }

    fn hold(&self, held: bool) {
        let mut st = self.state.lock().unwrap();
        st.held = held;
        if held {
            self.set_busy(&mut st, true);
        }
        self.cv.notify_all();
    }
}

/// The collective thread's work order.
#[derive(Default)]
struct Collective {
    state: Mutex<(Option<Duration>, bool, bool)>, // (request, done, stop)
    cv: Condvar,
    /// Never signalled: waiting on it is a plain futex wait with a timeout.
    idle_cv: Condvar,
}

impl Collective {
    fn run(&self) {
        let lock = Mutex::new(());
        let mut st = self.state.lock().unwrap();
        loop {
            if st.2 {
                return;
            }
            let Some(dur) = st.0.take() else {
                st = self.cv.wait(st).unwrap();
                continue;
            };
            drop(st);
            let until = Instant::now() + dur;
            while Instant::now() < until {
                spin_until((Instant::now() + Duration::from_millis(2)).min(until));
                let g = lock.lock().unwrap();
                let _ = self.idle_cv.wait_timeout(g, Duration::from_millis(1)).unwrap();
            }
            st = self.state.lock().unwrap();
            st.1 = true;
            self.cv.notify_all();
        }
    }

    fn all_reduce(&self, dur: Duration) {
        let mut st = self.state.lock().unwrap();
        *st = (Some(dur), false, false);
        self.cv.notify_all();
        while !st.1 {
            st = self.cv.wait(st).unwrap();
        }
    }

    fn stop(&self) {
        self.state.lock().unwrap().2 = true;
        self.cv.notify_all();
    }
}

fn make_data(dir: &Path) -> Vec<PathBuf> {
    std::fs::create_dir_all(dir).unwrap_or_else(|e| {
        eprintln!("zernel-workload: {}: {e}", dir.display());
        std::process::exit(1)
    });
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    (0..8)
        .map(|i| {
            let p = dir.join(format!("shard-{i}.bin"));
            if std::fs::metadata(&p).map(|m| m.len()).unwrap_or(0) != 256 << 10 {
                let data: Vec<u8> = (0..256 << 10)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x as u8
                    })
                    .collect();
                std::fs::write(&p, data).expect("writing a data shard");
            }
            p
        })
        .collect()
}

/// How much a DataLoader worker decodes per batch.
#[derive(Clone, Copy)]
enum Decode {
    /// For this long (a deadline).
    Timed(Duration),
    /// This many units of work.
    Sized(u64),
}

/// A DataLoader worker: read a shard, decode it, send a batch.
fn worker(fd: libc::c_int, files: &[PathBuf], decode: Decode, id: usize) -> ! {
    set_name("pt_data_worker");
    // SAFETY: plain libc calls on values we own.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0);
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    let mut data = Vec::new();
    let mut n = id;
    loop {
        data.clear();
        if let Ok(mut f) = File::open(&files[n % files.len()]) {
            let _ = f.read_to_end(&mut data);
        }
        n += 1;
        // "Decode": checksum passes over the shard, until the deadline or
        // for the number of units.
        let mut sum: u64 = 0xcbf2_9ce4_8422_2325;
        match decode {
            Decode::Timed(d) => {
                let until = Instant::now() + d;
                while Instant::now() < until {
                    sum = work_unit(&data, sum);
                }
            }
            Decode::Sized(units) => {
                for _ in 0..units {
                    sum = work_unit(&data, sum);
                }
            }
        }
        let mut batch = [0u8; BATCH];
        batch[..8].copy_from_slice(&sum.to_le_bytes());
        // SAFETY: writing our own buffer to our own pipe.
        let w = unsafe { libc::write(fd, batch.as_ptr() as *const libc::c_void, BATCH) };
        if w != BATCH as isize {
            // SAFETY: leaving the forked child without running the parent's destructors.
            unsafe { libc::_exit(0) };
        }
    }
}

/// The scheduling policy of `pid` (0: this thread), as chrt names it.
fn policy_of(pid: libc::pid_t) -> &'static str {
    // SAFETY: sched_getscheduler reads a task's policy.
    match unsafe { libc::sched_getscheduler(pid) } {
        libc::SCHED_OTHER => "other",
        libc::SCHED_FIFO => "fifo",
        libc::SCHED_RR => "rr",
        libc::SCHED_BATCH => "batch",
        libc::SCHED_IDLE => "idle",
        libc::SCHED_DEADLINE => "deadline",
        7 => "ext", // SCHED_EXT (include/uapi/linux/sched.h); libc has no name for it
        _ => "unknown",
    }
}

/// User + system CPU seconds of getrusage(`who`).
fn cpu_secs(who: libc::c_int) -> f64 {
    // SAFETY: getrusage fills the struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(who, &mut ru) } != 0 {
        return 0.0;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn read_batch(fd: libc::c_int) -> bool {
    let mut buf = [0u8; BATCH];
    let mut got = 0;
    while got < BATCH {
        // SAFETY: reading into our own buffer.
        let n = unsafe { libc::read(fd, buf[got..].as_mut_ptr() as *mut libc::c_void, BATCH - got) };
        if n <= 0 {
            if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return false;
        }
        got += n as usize;
    }
    true
}

/// `train`; unless --no-env, main has re-executed it with the rank
/// environment.
fn train(a: &TrainArgs) {
    let gpu_file = a.gpu_file.clone();
    let secs = a.secs;
    // --steps N: sized work (see README.md).
    let sized = a.steps.map(|n| n.max(1));
    let workers = a.workers.clamp(1, 64) as usize;
    let ms = Duration::from_millis;
    let allreduce_default = if sized.is_some() { 0 } else { 500 };
    let (compute, allreduce, optim) =
        (ms(a.compute_ms), ms(a.allreduce_ms.unwrap_or(allreduce_default)), ms(a.optim_ms));
    let kernel = ms(a.kernel_ms).max(Duration::from_millis(1));
    let decode = match sized {
        Some(_) => Decode::Sized(a.decode_units),
        None => Decode::Timed(ms(a.decode_ms)),
    };
    let (optim_units, kernels, launch_units) = (a.optim_units, a.kernels, a.launch_units);
    let pid = std::process::id();
    let data_dir = a.data_dir.clone().unwrap_or_else(|| std::env::temp_dir().join(format!("zernel-workload-{pid}")));
    let files = make_data(&data_dir);
    set_name("pt_main_thread");

    // Workers are forked before any thread exists.
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe writes two fds into the array.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        eprintln!("zernel-workload: pipe: {}", std::io::Error::last_os_error());
        std::process::exit(1);
    }
    // Room for two batches: a prefetch factor of 2.
    // SAFETY: fcntl on our pipe.
    unsafe { libc::fcntl(fds[1], libc::F_SETPIPE_SZ, 2 * BATCH as libc::c_int) };
    let mut children = Vec::new();
    for id in 0..workers {
        // SAFETY: single-threaded here; the child only runs `worker`.
        match unsafe { libc::fork() } {
            0 => {
                // SAFETY: closing the child's copy of the read end.
                unsafe { libc::close(fds[0]) };
                worker(fds[1], &files, decode, id)
            }
            -1 => eprintln!("zernel-workload: fork: {}", std::io::Error::last_os_error()),
            child => children.push(child),
        }
    }
    // SAFETY: the parent only reads.
    unsafe { libc::close(fds[1]) };

    let gpu = Arc::new(Gpu {
        state: Mutex::new(GpuState::default()),
        cv: Condvar::new(),
        file: gpu_file,
        pid,
        busy_util: a.gpu_util.min(100),
        idle_util: a.gpu_idle_util.min(100),
    });
    gpu.publish(gpu.idle_util);
    let nccl = Arc::new(Collective::default());
    let stop = Arc::new(AtomicBool::new(false));
    let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
        std::thread::Builder::new().name(name.to_string()).spawn(f).expect("spawning a thread")
    };
    let g = gpu.clone();
    let gpu_thread = spawn("fake_gpu", Box::new(move || g.run()));
    let n = nccl.clone();
    let nccl_thread = spawn("NCCL Progress 0", Box::new(move || n.run()));
    let s = stop.clone();
    let watchdog = spawn(
        "pt_nccl_watchdg",
        Box::new(move || {
            while !s.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(100));
            }
        }),
    );
    println!("zernel-workload train ready pid={pid} workers={workers}");
    let _ = std::io::stdout().flush();

    let start = Instant::now();
    let until = start + Duration::from_secs(secs);
    let mut loader_waits = Vec::new();
    let mut steps = 0u64;
    let more = |steps: u64| match sized {
        Some(n) => steps < n,
        None => Instant::now() < until,
    };
    while more(steps) {
        let t = Instant::now();
        if !read_batch(fds[0]) {
            break;
        }
        loader_waits.push(t.elapsed());
        if sized.is_some() {
            // Kernels of 100 us to 1 ms, in a fixed cycle.
            for i in 0..kernels {
                let k = Duration::from_micros(100 + (i * 7 % 10) * 100);
                gpu.launch_and_wait(k, Some(launch_units));
            }
        } else {
            let end = Instant::now() + compute;
            while Instant::now() < end {
                gpu.launch_and_wait(kernel, None);
            }
        }
        if !allreduce.is_zero() {
            gpu.hold(true);
            nccl.all_reduce(allreduce);
            gpu.hold(false);
        }
        // Optimizer: CPU-bound, the GPU goes idle 5 ms in.
        match sized {
            Some(_) => work(optim_units),
            None => {
                spin_until(Instant::now() + optim);
            }
        }
        steps += 1;
    }
    let elapsed = start.elapsed();

    stop.store(true, Ordering::Relaxed);
    nccl.stop();
    {
        let mut st = gpu.state.lock().unwrap();
        st.stop = true;
        gpu.set_busy(&mut st, false);
        gpu.cv.notify_all();
    }
    for h in [gpu_thread, nccl_thread, watchdog] {
        let _ = h.join();
    }
    // The trainer's policy, then each worker's (alive until reaped below).
    let policies: Vec<&str> = std::iter::once(policy_of(0)).chain(children.iter().map(|&c| policy_of(c))).collect();
    // SAFETY: closing our read end and reaping our children.
    unsafe {
        libc::close(fds[0]);
        for &c in &children {
            libc::kill(c, libc::SIGTERM);
            libc::waitpid(c, std::ptr::null_mut(), 0);
        }
    }
    if a.data_dir.is_none() {
        let _ = std::fs::remove_dir_all(&data_dir);
    }

    loader_waits.sort();
    let p99 = loader_waits
        .get(((loader_waits.len() as f64 * 0.99).ceil() as usize).saturating_sub(1))
        .copied()
        .unwrap_or_default();
    let busy = gpu.state.lock().unwrap().busy_total;
    let secs_f = elapsed.as_secs_f64();
    println!(
        "zernel-workload train steps={steps} secs={secs_f:.2} steps_per_sec={:.3} loader_wait_p99_ms={:.1} gpu_busy_frac={:.3} workers={workers} cpu_secs={:.2} policies={}",
        steps as f64 / secs_f.max(1e-9),
        p99.as_secs_f64() * 1e3,
        busy.as_secs_f64() / secs_f.max(1e-9),
        cpu_secs(libc::RUSAGE_SELF) + cpu_secs(libc::RUSAGE_CHILDREN),
        policies.join(","),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Result<Cmd, clap::Error> {
        let args = std::iter::once("zernel-workload").chain(line.split_whitespace());
        Ok(Cli::from_arg_matches(&command().try_get_matches_from(args)?)?.cmd)
    }

    #[test]
    fn the_command_line_is_consistent_and_every_command_has_its_section() {
        command().debug_assert();
        for c in command().get_subcommands() {
            assert!(section(c.get_name()).is_some(), "README.md has no `# {}`", c.get_name());
        }
        assert!(section("train").unwrap().starts_with(" pt_data_worker"));
    }

    /// The invocations of the VM cases, the benchmark and the host tests.
    #[test]
    fn the_callers_command_lines_parse() {
        for line in [
            "train --gpu-file /w/gpu.json --secs 40 --workers 2 --data-dir /w/data",
            "train --gpu-file /w/gpu.json --secs 400 --workers 1 --data-dir /w/data --gpu-util 60 --gpu-idle-util 20",
            "train --gpu-file /w/gpu.json --steps 150 --workers 2 --data-dir /w/data --decode-units 80 \
             --optim-units 40 --launch-units 1 --kernels 20",
            "train --gpu-file /w/gpu.json --steps 2 --workers 1 --data-dir /w/data",
            "calibrate --ms 1000",
            "hog --name zt_before --secs 60 --threads 2 --rename zt_after --rename-when /w/go",
            "hog --name zt_rt --secs 300 --fifo 50",
            "hog --name zt_duty --secs 90 --busy-pct 70",
            "threads --count 300 --secs 90 --wake-ms 200 --ml",
            "threads --count 1000 --secs 600",
            "churn --secs 900 --count 99000 --threads 4",
            "reader --name zt_high --secs 90 --open /dev/zt_gpu0 --fd 40",
            "reader --name zt_late --secs 90 --open /dev/zt_gpu0 --open-when /tmp/zt_late.go",
            "reader --secs 90 --name zt_env --busy-pct 20",
            "reader --name zt_qmain --secs 30 --thread zt_pool --start-ms 7000",
            "bpf-run --name zt_bpf --threads 2 --secs 300",
            "fork --name zt_fp --child-name zt_fp --secs 200 --when /tmp/go.b --thread",
            "open --name zt_gpu --threads 3 --path /dev/nvidia0 --when /tmp/go.gpu --secs 200",
            "entry --map /sys/fs/bpf/scx_zernel/task_class --tid 42 --class 1 --node 7",
            "entry --map /sys/fs/bpf/scx_zernel/task_class --tid 42 --class 3 --start-offset 7",
        ] {
            if let Err(e) = parse(line) {
                panic!("{line}: {e}");
            }
        }
    }

    #[test]
    fn the_rank_environment_is_for_train_without_no_env_and_threads_with_ml() {
        let wants = |line: &str| {
            let args: Vec<std::ffi::OsString> = line.split_whitespace().map(Into::into).collect();
            wants_rank_env(&args)
        };
        assert!(wants("zw train --gpu-file g --secs 1"));
        assert!(!wants("zw train --gpu-file g --no-env"));
        assert!(wants("zw threads --count 3 --ml"));
        assert!(!wants("zw threads --count 3"));
        assert!(!wants("zw hog --name train --ml"));
        assert!(!wants("zw"));
    }

    #[test]
    fn defaults_flags_and_the_last_of_a_repeated_option() {
        let Ok(Cmd::Train(t)) = parse("train --gpu-file g") else { panic!("train") };
        assert_eq!((t.secs, t.steps, t.workers, t.allreduce_ms, t.kernel_ms, t.no_env), (10, None, 2, None, 20, false));
        assert_eq!((t.decode_units, t.optim_units, t.kernels, t.launch_units), (400, 100, 20, 2));
        let Ok(Cmd::Hog(h)) = parse("hog --name a --secs 1 --secs 5") else { panic!("hog") };
        assert_eq!((h.name.as_str(), h.secs, h.threads, h.busy_pct, h.fifo), ("a", 5, 1, 100, None));
        let Ok(Cmd::Entry(e)) = parse("entry --map m --tid 1 --class 2 --node -1") else { panic!("entry") };
        assert_eq!((e.tid, e.class, e.start_offset, e.node), (1, 2, 0, -1));
        let Ok(Cmd::Fork(f)) = parse("fork --name a --when w") else { panic!("fork") };
        assert_eq!((f.busy_pct, f.thread, f.child_name), (20, false, None));
        let Ok(Cmd::Churn(c)) = parse("churn") else { panic!("churn") };
        assert_eq!((c.secs, c.count, c.threads, c.name.as_str()), (10, None, 4, "zt_churn"));
        for bad in ["hog --secs 1", "hog --name a --rename b", "threads --secs 1", "entry --map m --tid 0 --class 1"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
