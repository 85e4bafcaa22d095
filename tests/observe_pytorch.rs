//! `scx_zernel observe` on this host (no root, no sched_ext) against real
//! PyTorch: the scripts the VM cases run (tests/workloads/pytorch/), with
//! the Python of the venv scripts/setup-deps.sh makes. The verdicts must be
//! the ones the VM cases read back from the kernel:
//!
//! * training with `DataLoader(num_workers=2)`: the trainer is ML by the CUDA
//!   libraries torch maps, both workers are ML loader processes whose threads
//!   are DataLoading (class ml), the trainer's main thread gets the class of
//!   ML threads in no phase (ml);
//! * `torchrun --nproc-per-node 2` over gloo: both ranks are ML by RANK, their
//!   gloo threads have the role gloo;
//! * an inference server is ML, its client (plain Python, no torch) and a
//!   busy plain Python process are not listed at all.
//!
//! The Python is `$ZERNEL_PYTHON`, else the venv's. Without one the tests
//! say so and pass, unless `ZERNEL_REQUIRE_TORCH=1` (tests/run-all.sh sets
//! it), where a missing PyTorch fails them.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::TempDir;
use serde_json::Value;

/// A child in a process group of its own: the whole group is stopped on drop
/// (torchrun's ranks, DataLoader workers).
struct Group(Child);

impl Group {
    fn spawn(cmd: &mut Command) -> Group {
        Group(cmd.process_group(0).spawn().unwrap_or_else(|e| panic!("starting {cmd:?}: {e}")))
    }

    fn pid(&self) -> i64 {
        self.0.id() as i64
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        let pg = self.0.id() as i32;
        // SAFETY: signals to a process group we created.
        unsafe { libc::kill(-pg, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline && matches!(self.0.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(50));
        }
        unsafe { libc::kill(-pg, libc::SIGKILL) };
        let _ = self.0.wait();
    }
}

/// The Python with PyTorch, or None (and the reason) when there is none.
fn python() -> Option<PathBuf> {
    let py = std::env::var_os("ZERNEL_PYTHON").map(PathBuf::from).or_else(|| {
        let cache = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
        Some(cache.join("scx-zernel/venv/bin/python"))
    });
    let ok = py.as_ref().is_some_and(|p| {
        Command::new(p).args(["-c", "import torch"]).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
    });
    if ok {
        return py;
    }
    let why = format!("no Python with PyTorch at {py:?} (scripts/setup-deps.sh installs one)");
    assert!(std::env::var("ZERNEL_REQUIRE_TORCH").as_deref() != Ok("1"), "{why}");
    eprintln!("skipped: {why}");
    None
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workloads/pytorch").join(name)
}

/// Waits until `path` holds something (the scripts' --ready files).
fn wait_file(path: &Path, secs: u64, what: &str, log: &Path) -> String {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Ok(s) = std::fs::read_to_string(path) {
            if !s.trim().is_empty() {
                return s.trim().to_string();
            }
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {} still empty after {secs} s; output:\n{}",
            path.display(),
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// What observe said of one process over all passes.
#[derive(Debug, Default)]
struct Seen {
    comm: String,
    ppid: i64,
    ml: bool,
    loader: bool,
    evidence: BTreeSet<String>,
    /// (comm, role, phase, class) of its threads; class "-" for no decision.
    threads: BTreeSet<(String, String, String, String)>,
    /// The main thread's (role, class).
    main: BTreeSet<(String, String)>,
}

impl Seen {
    fn has_thread(&self, comm: &str, role: &str, phase: Option<&str>, class: Option<&str>) -> bool {
        self.threads
            .iter()
            .any(|(c, r, p, k)| c == comm && r == role && phase.is_none_or(|x| x == p) && class.is_none_or(|x| x == k))
    }
}

/// Runs `observe --json --all` until `done` holds for what was seen (at least
/// `min_passes` passes) or `secs` pass; returns everything seen, by pid.
fn observe(secs: u64, min_passes: u64, done: impl Fn(&BTreeMap<i64, Seen>) -> bool) -> BTreeMap<i64, Seen> {
    let dir = TempDir::new("observe-pytorch");
    let config = dir.0.join("zernel.toml");
    std::fs::write(&config, "").unwrap();
    let mut obs = Group::spawn(
        Command::new(env!("CARGO_BIN_EXE_scx_zernel"))
            .args(["observe", "--json", "--all", "--count", "100000", "--config"])
            .arg(&config)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit()),
    );
    let lines = BufReader::new(obs.0.stdout.take().unwrap()).lines();
    let mut seen: BTreeMap<i64, Seen> = BTreeMap::new();
    let start = Instant::now();
    let mut passes = 0;
    for line in lines {
        let line = line.expect("reading observe's output");
        let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        passes += 1;
        for p in v["processes"].as_array().expect("processes") {
            let pid = p["pid"].as_i64().unwrap();
            let s = seen.entry(pid).or_default();
            s.comm = p["comm"].as_str().unwrap_or_default().to_string();
            s.ppid = p["ppid"].as_i64().unwrap_or(0);
            s.ml |= p["ml"] == Value::Bool(true);
            s.loader |= p["loader"] == Value::Bool(true);
            for e in p["evidence"].as_array().into_iter().flatten() {
                s.evidence.insert(e.as_str().unwrap_or_default().to_string());
            }
            for t in p["threads"].as_array().expect("threads") {
                let str_of = |k: &str| t[k].as_str().unwrap_or_default().to_string();
                let class = t["decision"]["class"].as_str().unwrap_or("-").to_string();
                if t["tid"].as_i64() == Some(pid) {
                    s.main.insert((str_of("role"), class.clone()));
                }
                s.threads.insert((str_of("comm"), str_of("role"), str_of("phase"), class));
            }
        }
        if (passes >= min_passes && done(&seen)) || start.elapsed() > Duration::from_secs(secs) {
            break;
        }
    }
    seen
}

fn report(seen: &BTreeMap<i64, Seen>, pids: &[i64]) -> String {
    let mut out = String::new();
    for pid in pids {
        if let Some(s) = seen.get(pid) {
            out += &format!("pid {pid} {:?} ml={} loader={} evidence={:?}\n", s.comm, s.ml, s.loader, s.evidence);
            for t in &s.threads {
                out += &format!("    {t:?}\n");
            }
        } else {
            out += &format!("pid {pid}: never listed\n");
        }
    }
    out
}

#[test]
fn training_inference_and_plain_python() {
    let Some(py) = python() else { return };
    let dir = TempDir::new("torch-train");
    let d = &dir.0;
    let train_log = d.join("train.out");
    let train = Group::spawn(
        Command::new(&py)
            .arg(script("train.py"))
            .args(["--workers", "2", "--data-dir"])
            .arg(d.join("data"))
            .arg("--ready")
            .arg(d.join("ready"))
            .env_remove("RANK")
            .env_remove("WORLD_SIZE")
            .stdout(std::fs::File::create(&train_log).unwrap())
            .stderr(std::fs::File::create(d.join("train.err")).unwrap()),
    );
    let serve_log = d.join("serve.out");
    let server = Group::spawn(
        Command::new(&py)
            .arg(script("serve.py"))
            .arg("--socket")
            .arg(d.join("sock"))
            .arg("--ready")
            .arg(d.join("serve.ready"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&serve_log).unwrap()),
    );
    let plain =
        Group::spawn(Command::new(&py).args(["-c", "import time\nwhile True: sum(range(10000)); time.sleep(0.001)"]));
    wait_file(&d.join("ready"), 300, "train.py's first step", &d.join("train.err"));
    wait_file(&d.join("serve.ready"), 300, "serve.py listening", &serve_log);
    let client = Group::spawn(
        Command::new(&py).arg(script("client.py")).arg("--socket").arg(d.join("sock")).stdout(Stdio::null()),
    );
    let (t, s, c, pl) = (train.pid(), server.pid(), client.pid(), plain.pid());
    let workers = |seen: &BTreeMap<i64, Seen>| -> Vec<i64> {
        seen.iter().filter(|(_, x)| x.ppid == t && x.comm == "pt_data_worker").map(|(p, _)| *p).collect()
    };
    let done = |seen: &BTreeMap<i64, Seen>| {
        let w = workers(seen);
        w.len() == 2
            && w.iter().all(|p| seen[p].has_thread("pt_data_worker", "data_loader", Some("data_loading"), Some("ml")))
            && seen.get(&t).is_some_and(|x| x.main.contains(&("trainer".into(), "ml".into())))
            && seen.get(&s).is_some_and(|x| x.ml && x.main.contains(&("trainer".into(), "ml".into())))
    };
    let seen = observe(120, 20, done);
    let mut pids = vec![t, s, c, pl];
    pids.extend(workers(&seen));
    let rep = report(&seen, &pids);

    let trainer = seen.get(&t).unwrap_or_else(|| panic!("the trainer was never listed:\n{rep}"));
    assert!(trainer.ml && trainer.evidence.contains("gpu_library"), "trainer not ML by its libraries:\n{rep}");
    assert!(
        trainer.main.contains(&("trainer".into(), "ml".into())),
        "the trainer's main thread is not a trainer in class ml:\n{rep}"
    );
    let w = workers(&seen);
    assert_eq!(w.len(), 2, "two DataLoader workers listed:\n{rep}");
    for p in &w {
        let x = &seen[p];
        assert!(x.ml && x.loader, "worker {p} is not an ML loader process:\n{rep}");
        assert!(
            x.has_thread("pt_data_worker", "data_loader", Some("data_loading"), Some("ml")),
            "worker {p} never DataLoading in class ml:\n{rep}"
        );
    }
    let server_seen = seen.get(&s).unwrap_or_else(|| panic!("the server was never listed:\n{rep}"));
    assert!(server_seen.ml && server_seen.evidence.contains("gpu_library"), "server not ML:\n{rep}");
    assert!(
        server_seen.main.contains(&("trainer".into(), "ml".into())),
        "server's main thread not in class ml:\n{rep}"
    );
    assert!(!seen.contains_key(&c), "the client (plain Python) is listed:\n{rep}");
    assert!(!seen.contains_key(&pl), "the plain Python process is listed:\n{rep}");
    // Both stand-ins for "plain Python" were alive all along.
    assert!(Path::new(&format!("/proc/{c}")).exists() && Path::new(&format!("/proc/{pl}")).exists());
    drop((client, plain, server, train));
}

#[test]
fn torchrun_ddp_over_gloo() {
    let Some(py) = python() else { return };
    let dir = TempDir::new("torch-ddp");
    let d = &dir.0;
    let torchrun = py.with_file_name("torchrun");
    let err = d.join("ddp.err");
    let agent = Group::spawn(
        Command::new(&torchrun)
            .args(["--nproc-per-node", "2"])
            .arg(script("train.py"))
            .args(["--workers", "1", "--data-dir"])
            .arg(d.join("data"))
            .arg("--ready")
            .arg(d.join("ready"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&err).unwrap()),
    );
    let r0: i64 = wait_file(&d.join("ready.0"), 400, "rank 0's first step", &err).parse().unwrap();
    let r1: i64 = wait_file(&d.join("ready.1"), 400, "rank 1's first step", &err).parse().unwrap();
    let done = |seen: &BTreeMap<i64, Seen>| {
        [r0, r1].iter().all(|p| {
            seen.get(p).is_some_and(|x| {
                x.ml && x.has_thread("pt_gloo_runloop", "gloo", None, None)
                    && x.has_thread("gloo_tcp_loop", "gloo", None, None)
            })
        })
    };
    let seen = observe(90, 10, done);
    let rep = report(&seen, &[agent.pid(), r0, r1]);
    for p in [r0, r1] {
        let x = seen.get(&p).unwrap_or_else(|| panic!("rank pid {p} never listed:\n{rep}"));
        // ML by RANK from its start; its maps are not scanned again once ML.
        assert!(x.ml && x.evidence.contains("env_rank"), "rank {p}:\n{rep}");
        assert!(x.has_thread("pt_gloo_runloop", "gloo", None, None), "rank {p}'s pt_gloo_runloop:\n{rep}");
        assert!(x.has_thread("gloo_tcp_loop", "gloo", None, None), "rank {p}'s gloo_tcp_loop:\n{rep}");
        assert!(x.main.iter().any(|(role, _)| role == "trainer"), "rank {p}'s main thread:\n{rep}");
    }
    drop(agent);
}
