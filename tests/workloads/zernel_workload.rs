//! `zernel-workload`: processes that behave like an ML training job (or
//! like the background noise around one), for scx_zernel's tests and
//! benchmarks. std + libc only, but for `entry` (libbpf-rs and the shared
//! struct of intf.h) and `bpf-run` (libbpf-rs).
//!
//! ```text
//! zernel-workload train --gpu-file PATH --secs S [--workers N] [--data-dir DIR]
//!                 [--compute-ms 500] [--allreduce-ms 500] [--optim-ms 500]
//!                 [--decode-ms 500] [--kernel-ms 20] [--gpu-util 100]
//!                 [--gpu-idle-util 0] [--no-env]
//! zernel-workload train --gpu-file PATH --steps N [--workers N] [--data-dir DIR]
//!                 [--decode-units 400] [--optim-units 100] [--kernels 20]
//!                 [--launch-units 2] [--allreduce-ms 0] [--gpu-util 100] ...
//! zernel-workload calibrate [--ms 500]
//! zernel-workload hog --name NAME --secs S [--threads N] [--busy-pct P]
//!                 [--rename NEW --rename-when PATH] [--fifo PRIO]
//! zernel-workload threads --count N --secs S [--wake-ms 1000] [--ml]
//! zernel-workload churn --secs S [--count C] [--threads N] [--name NAME]
//! zernel-workload reader --name NAME --secs S [--open PATH] [--fd N] [--after-ms MS]
//!                 [--open-when FILE] [--busy-pct P]
//! zernel-workload reader --name NAME --secs S --thread NAME2 [--start-ms MS] [--busy-pct P]
//! zernel-workload bpf-run --name NAME --secs S [--threads N]
//! zernel-workload fork --name NAME --secs S --when PATH [--child-name NAME2] [--thread]
//!                 [--busy-pct P]
//! zernel-workload open --name NAME --secs S --path DEV --when PATH [--threads N] [--busy-pct P]
//! zernel-workload entry --map PATH --tid T --class N [--start-offset TICKS] [--node N]
//! ```
//!
//! # train
//!
//! ```text
//!  pt_data_worker ×N  read a data file, decode (CPU) ──4 KiB batch──┐ pipe (8 KiB:
//!  (forked workers)                                                  │  prefetch 2)
//!  pt_main_thread  <──────────────────────────────────────────────────┘
//!    per step:  wait for a batch
//!               compute:   submit 20 ms "kernels" to fake_gpu, wait on a condvar
//!               all-reduce: wake "NCCL Progress 0", wait on a condvar
//!               optimizer: spin on the CPU, GPU idle
//!  fake_gpu        runs kernels (sleeps), writes the GPU file: util 100 (or
//!                  --gpu-util) while a kernel or the all-reduce runs, 0 (or
//!                  --gpu-idle-util) after 5 ms without work
//!  NCCL Progress 0 during the all-reduce: spin 2 ms, futex-wait 1 ms, repeat
//!  pt_nccl_watchdg wakes every 100 ms
//! ```
//! The trainer re-executes itself with RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 in
//! its environment (the ML evidence a launcher would give it) unless those
//! are set already or --no-env is given. The GPU file uses the format of
//! scx_zernel's file GPU provider, with the trainer as the GPU process.
//! At the end it prints one line (cpu_secs: the CPU time of the trainer
//! and its workers, from getrusage once the workers are reaped):
//!
//! ```text
//! zernel-workload train steps=7 secs=10.02 steps_per_sec=0.699 loader_wait_p99_ms=0.8 gpu_busy_frac=0.634 workers=2 cpu_secs=14.1
//! ```
//!
//! With --secs every phase ends on a deadline (a thread that gets less CPU
//! still ends its phase on time): the VM tests use it for phases of known
//! length. With --steps N the work is *sized* instead, for benchmarks: the
//! trainer runs exactly N steps and the run takes as long as the CPU it
//! gets makes it. Work is counted in units (one checksum pass over 16 KiB;
//! `calibrate` prints how many an idle CPU does per ms):
//!
//! ```text
//!  worker, per batch: --decode-units of work, then the batch into the pipe
//!  trainer, per step: wait for a batch
//!                     --kernels fake-GPU kernels, one after another: a
//!                       launch (--launch-units of work), then a wait while
//!                       the GPU "runs" it (100 us to 1 ms, cycling)
//!                     an all-reduce only if --allreduce-ms > 0
//!                     optimizer: --optim-units of work, GPU idle
//! ```
//!
//! # hog
//! N threads (the main one included) named NAME spinning on the CPU; with
//! --busy-pct P < 100, each spins P % of every 5 ms and sleeps the rest.
//! With --rename NEW, once PATH exists every thread but the main one (the
//! main one when it is alone) renames itself NEW. With --fifo PRIO the
//! process runs as SCHED_FIFO at PRIO (an RT task: above any sched_ext one).
//!
//! # threads
//! A process with N mostly idle threads (`idle_<i>`), each waking every
//! --wake-ms (±25 %) to do a few µs of work; with --ml it carries the rank
//! environment (an ML process). Prints `zernel-workload threads ready N`
//! once all threads exist.
//!
//! # reader
//! One thread named NAME reading /dev/zero as fast as it can (an in-process
//! data loader, by its read rate; with --busy-pct P < 100, for P % of every
//! 5 ms), holding PATH (if given) open as fd N (default: the
//! lowest free fd; fds below N are filled with /dev/null) from --after-ms
//! on (default 0), or once the file --open-when names exists. Opening it
//! also maps 1 MiB, so the process's virtual size changes, as when a program
//! initialises a GPU. Prints
//! `zernel-workload reader opened PATH fd N` when it does. With --thread,
//! a second thread named NAME2 does the reading, from --start-ms on (it
//! sleeps until then); the main thread only waits.
//!
//! # bpf-run
//! N threads named NAME calling BPF_PROG_TEST_RUN, so that they spend
//! nearly all their time with migration disabled. See bpf_run.rs.
//!
//! # fork
//! One thread named NAME that runs P % (default 20) of every 5 ms until
//! PATH exists (checked every 10 ms), then creates one child: a process
//! (fork), or with --thread a thread. The child names itself NAME2 (default:
//! NAME) as the first thing it does and runs the same duty cycle; the
//! parent goes on with it. Prints `zernel-workload fork child TID` once
//! the child exists. For fork inheritance: the child's first enqueue comes
//! before the daemon has seen it.
//!
//! # open
//! N threads (default 3, the main one included) named NAME running P %
//! (default 20) of every 5 ms; once PATH exists the main thread opens DEV
//! (read-only) and prints `zernel-workload open DEV ok` or `... error
//! MESSAGE`: a device node with no driver behind it (a GPU node made with
//! mknod) fails with ENXIO, and the run goes on either way.
//!
//! # entry
//! Not a workload: writes one entry into the pinned task_class map, with the
//! thread's start time plus TICKS (a stale entry unless TICKS is 0). See
//! entry.rs.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

mod bpf_run;
mod entry;

const BATCH: usize = 4096;
const RANK_ENV: [(&str, &str); 3] = [("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")];

fn usage() -> ! {
    eprintln!(
        "usage:\n  zernel-workload train --gpu-file PATH --secs S [--workers N] [--data-dir DIR] \
[--compute-ms MS] [--allreduce-ms MS] [--optim-ms MS] [--decode-ms MS] [--kernel-ms MS] \
[--gpu-util PCT] [--gpu-idle-util PCT] [--no-env]\n  \
zernel-workload train --gpu-file PATH --steps N [--workers N] [--data-dir DIR] [--decode-units U] \
[--optim-units U] [--kernels K] [--launch-units U] [--allreduce-ms MS] [--gpu-util PCT] [--no-env]\n  \
zernel-workload calibrate [--ms MS]\n  \
zernel-workload hog --name NAME --secs S [--threads N] [--busy-pct P] [--rename NEW --rename-when PATH] [--fifo PRIO]\n  \
zernel-workload threads --count N --secs S [--wake-ms MS] [--ml]\n  \
zernel-workload churn --secs S [--count C] [--threads N] [--name NAME]\n  \
zernel-workload reader --name NAME --secs S [--open PATH] [--fd N] [--after-ms MS | --open-when FILE] [--busy-pct P]\n  \
zernel-workload reader --name NAME --secs S --thread NAME2 [--start-ms MS] [--busy-pct P]\n  \
zernel-workload bpf-run --name NAME --secs S [--threads N]\n  \
zernel-workload fork --name NAME --secs S --when PATH [--child-name NAME2] [--thread] [--busy-pct P]\n  \
zernel-workload open --name NAME --secs S --path DEV --when PATH [--threads N] [--busy-pct P]\n  \
zernel-workload entry --map PATH --tid T --class N [--start-offset TICKS] [--node N]"
    );
    std::process::exit(2)
}

/// `--key value` options and `--flag`s.
struct Opts(HashMap<String, Option<String>>);

impl Opts {
    fn parse(args: &[String], flags: &[&str]) -> Opts {
        let mut map = HashMap::new();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let Some(key) = a.strip_prefix("--") else { usage() };
            if flags.contains(&key) {
                map.insert(key.to_string(), None);
            } else {
                let Some(v) = it.next() else { usage() };
                map.insert(key.to_string(), Some(v.clone()));
            }
        }
        Opts(map)
    }

    fn str(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.as_deref())
    }

    fn num(&self, key: &str, default: u64) -> u64 {
        match self.str(key) {
            None => default,
            Some(v) => v.parse().unwrap_or_else(|_| {
                eprintln!("--{key}: not a number: {v}");
                usage()
            }),
        }
    }

    fn flag(&self, key: &str) -> bool {
        self.0.contains_key(key)
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
fn calibrate(o: &Opts) {
    let ms = o.num("ms", 500).max(50);
    work(50);
    let t = Instant::now();
    let mut units = 0u64;
    while t.elapsed() < Duration::from_millis(ms) {
        work(10);
        units += 10;
    }
    println!(
        "zernel-workload calibrate units_per_ms={:.2}",
        units as f64 / (t.elapsed().as_secs_f64() * 1e3)
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(mode) = args.get(1) else { usage() };
    let rest = &args[2..];
    match mode.as_str() {
        "train" => train(&Opts::parse(rest, &["no-env"])),
        "hog" => hog(&Opts::parse(rest, &[])),
        "threads" => threads(&Opts::parse(rest, &["ml"])),
        "churn" => churn(&Opts::parse(rest, &[])),
        "reader" => reader(&Opts::parse(rest, &[])),
        "entry" => entry_cmd(&Opts::parse(rest, &[])),
        "bpf-run" => bpf_run_cmd(&Opts::parse(rest, &[])),
        "fork" => fork_cmd(&Opts::parse(rest, &["thread"])),
        "open" => open_cmd(&Opts::parse(rest, &[])),
        "calibrate" => calibrate(&Opts::parse(rest, &[])),
        _ => usage(),
    }
}

fn entry_cmd(o: &Opts) {
    let Some(map) = o.str("map") else { usage() };
    let (tid, class, offset) = (o.num("tid", 0) as u32, o.num("class", u64::MAX) as u32, o.num("start-offset", 0));
    if tid == 0 || class == u32::MAX {
        usage()
    }
    let node = match o.str("node") {
        None => -1,
        Some(v) => v.parse().unwrap_or_else(|_| usage()),
    };
    if let Err(e) = entry::write(map, tid, class, offset, node) {
        eprintln!("zernel-workload entry: {e}");
        std::process::exit(1);
    }
}

// ------------------------------------------------------------------ hog ----

fn hog(o: &Opts) {
    let Some(name) = o.str("name").map(str::to_string) else { usage() };
    let secs = o.num("secs", 10);
    let n = o.num("threads", 1).max(1);
    let pct = o.num("busy-pct", 100);
    let until = Instant::now() + Duration::from_secs(secs);
    if let Some(prio) = o.str("fifo") {
        set_fifo(prio.parse().unwrap_or_else(|_| usage()));
    }
    // --rename NEW: once the file --rename-when exists, every thread but the
    // main one (the main one when it is alone) takes the name NEW.
    let rename = match (o.str("rename"), o.str("rename-when")) {
        (Some(new), Some(when)) => Some((new.to_string(), PathBuf::from(when))),
        (None, None) => None,
        _ => usage(),
    };
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

fn fork_cmd(o: &Opts) {
    let (Some(name), Some(when)) = (o.str("name"), o.str("when")) else { usage() };
    let child_name = o.str("child-name").unwrap_or(name).to_string();
    let until = Instant::now() + Duration::from_secs(o.num("secs", 10));
    let pct = o.num("busy-pct", 20);
    let burn = move |end: Instant| {
        duty_cycle(end, pct, || {
            spin_until(Instant::now() + Duration::from_micros(100));
        })
    };
    set_name(name);
    let when = Path::new(when);
    while Instant::now() < until && !when.exists() {
        burn((Instant::now() + Duration::from_millis(10)).min(until));
    }
    if o.flag("thread") {
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

fn open_cmd(o: &Opts) {
    let (Some(name), Some(dev), Some(when)) = (o.str("name"), o.str("path"), o.str("when")) else { usage() };
    let until = Instant::now() + Duration::from_secs(o.num("secs", 10));
    let pct = o.num("busy-pct", 20);
    let burn = move |end: Instant| {
        duty_cycle(end, pct, || {
            spin_until(Instant::now() + Duration::from_micros(100));
        })
    };
    set_name(name);
    let handles: Vec<_> = (1..o.num("threads", 3).max(1))
        .map(|_| {
            let name = name.to_string();
            std::thread::spawn(move || {
                set_name(&name);
                burn(until)
            })
        })
        .collect();
    let when = Path::new(when);
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

fn bpf_run_cmd(o: &Opts) {
    let Some(name) = o.str("name") else { usage() };
    match bpf_run::bpf_run(name, o.num("secs", 10), o.num("threads", 1)) {
        Ok(calls) => println!("zernel-workload bpf-run calls {calls}"),
        Err(e) => {
            eprintln!("zernel-workload bpf-run: {e}");
            std::process::exit(1);
        }
    }
}

// --------------------------------------------------------------- reader ----

fn reader(o: &Opts) {
    let Some(name) = o.str("name") else { usage() };
    let path = o.str("open");
    let until = Instant::now() + Duration::from_secs(o.num("secs", 10));
    let open_at = Instant::now() + Duration::from_millis(o.num("after-ms", 0));
    let open_when = o.str("open-when").map(std::path::Path::new);
    let want_fd = o.str("fd").map(|_| o.num("fd", 0) as libc::c_int);
    let pct = o.num("busy-pct", 100);
    if let Some(thread) = o.str("thread") {
        let start = Instant::now() + Duration::from_millis(o.num("start-ms", 0));
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
            let dev = File::open(path).unwrap_or_else(|e| panic!("opening {path}: {e}"));
            let mut fd = std::os::fd::IntoRawFd::into_raw_fd(dev);
            if let Some(want) = want_fd.filter(|&w| w != fd) {
                while let Ok(f) = File::open("/dev/null") {
                    if std::os::fd::AsRawFd::as_raw_fd(&f) >= want {
                        break;
                    }
                    held.push(f);
                }
                // SAFETY: dup2 onto a descriptor number this process owns or
                // frees, then the original is closed: only fd `want` is left.
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
fn churn(o: &Opts) {
    let secs = o.num("secs", 10);
    let target = o.num("count", u64::MAX);
    let n = o.num("threads", 4).max(1);
    let total = Arc::new(AtomicU64::new(0));
    let name = o.str("name").unwrap_or("zt_churn").to_string();
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

fn threads(o: &Opts) {
    if o.flag("ml") {
        ensure_rank_env();
    }
    let Some(count) = o.str("count").and_then(|c| c.parse::<usize>().ok()) else { usage() };
    let secs = o.num("secs", 10);
    let wake = Duration::from_millis(o.num("wake-ms", 1000).max(1));
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

fn train(o: &Opts) {
    if !o.flag("no-env") {
        ensure_rank_env();
    }
    let Some(gpu_file) = o.str("gpu-file").map(PathBuf::from) else { usage() };
    let secs = o.num("secs", 10);
    // --steps N: sized work (see the module doc).
    let sized = o.str("steps").map(|_| o.num("steps", 0).max(1));
    let workers = o.num("workers", 2).clamp(1, 64) as usize;
    let ms = |k, d| Duration::from_millis(o.num(k, d));
    let allreduce_default = if sized.is_some() { 0 } else { 500 };
    let (compute, allreduce, optim) =
        (ms("compute-ms", 500), ms("allreduce-ms", allreduce_default), ms("optim-ms", 500));
    let kernel = ms("kernel-ms", 20).max(Duration::from_millis(1));
    let decode = match sized {
        Some(_) => Decode::Sized(o.num("decode-units", 400)),
        None => Decode::Timed(ms("decode-ms", 500)),
    };
    let (optim_units, kernels, launch_units) =
        (o.num("optim-units", 100), o.num("kernels", 20), o.num("launch-units", 2));
    let pid = std::process::id();
    let data_dir = o
        .str("data-dir")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join(format!("zernel-workload-{pid}")));
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
        busy_util: o.num("gpu-util", 100).min(100),
        idle_util: o.num("gpu-idle-util", 0).min(100),
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
    // SAFETY: closing our read end and reaping our children.
    unsafe {
        libc::close(fds[0]);
        for &c in &children {
            libc::kill(c, libc::SIGTERM);
            libc::waitpid(c, std::ptr::null_mut(), 0);
        }
    }
    if o.str("data-dir").is_none() {
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
        "zernel-workload train steps={steps} secs={secs_f:.2} steps_per_sec={:.3} loader_wait_p99_ms={:.1} gpu_busy_frac={:.3} workers={workers} cpu_secs={:.2}",
        steps as f64 / secs_f.max(1e-9),
        p99.as_secs_f64() * 1e3,
        busy.as_secs_f64() / secs_f.max(1e-9),
        cpu_secs(libc::RUSAGE_SELF) + cpu_secs(libc::RUSAGE_CHILDREN),
    );
}
