//! `scx_zernel observe` on this host (no root, no sched_ext): runs
//! `zernel-workload train` (with the file GPU provider) next to a plain
//! shell busy loop and reads the JSON passes. The workload's threads must be
//! listed with their roles, the trainer must reach GpuCompute and a
//! DataLoader worker DataLoading, each with its policy class; the shell
//! loop must never be listed.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{spawn_sh, spawn_shell_loop, spawn_train, Reaped, TempDir};
use scx_zernel::config::Config;
use serde_json::Value;

/// A config using the file GPU provider on `gpu_file`. Mode 0644: as root,
/// scx_zernel refuses a config others can write.
fn write_config(dir: &Path, gpu_file: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("zernel.toml");
    std::fs::write(&path, format!("[gpu]\nprovider = \"file\"\nfile = {:?}\n", gpu_file.display().to_string()))
        .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    path
}

fn observe(args: &[&str], config: &Path, stderr: &Path) -> Reaped {
    Reaped(
        Command::new(env!("CARGO_BIN_EXE_scx_zernel"))
            .arg("observe")
            .args(args)
            .arg("--config")
            .arg(config)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(stderr).unwrap())
            .spawn()
            .expect("starting scx_zernel observe"),
    )
}

/// One thread row as seen in some pass.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Row {
    pid: i64,
    tid: i64,
    comm: String,
    role: String,
    phase: String,
    class: String,
}

#[test]
fn observe_shows_the_workload_phases_and_decisions() {
    let dir = TempDir::new("json");
    let gpu_file = dir.0.join("gpu.json");
    let config = write_config(&dir.0, &gpu_file);
    let policy = Config::default().policy;
    let (gpu_class, load_class) = (policy.gpu_compute.class.name(), policy.data_loading.class.name());

    let train = spawn_train(&gpu_file, &dir.0, 90);
    let hog = spawn_shell_loop();
    let (train_pid, hog_pid) = (train.0.id() as i64, hog.0.id() as i64);

    let stderr = dir.0.join("stderr");
    let mut obs = observe(&["--count", "900", "--json", "--all"], &config, &stderr);
    let lines = BufReader::new(obs.0.stdout.take().unwrap()).lines();

    let mut rows: BTreeSet<Row> = BTreeSet::new();
    let mut workers: BTreeSet<i64> = BTreeSet::new();
    let mut passes = 0u64;
    let seen = |rows: &BTreeSet<Row>, workers: &BTreeSet<i64>, f: &dyn Fn(&Row) -> bool| {
        rows.iter().any(|r| (r.pid == train_pid || workers.contains(&r.pid)) && f(r))
    };
    let done = |rows: &BTreeSet<Row>, workers: &BTreeSet<i64>| {
        seen(rows, workers, &|r| r.pid == train_pid && r.comm == "pt_main_thread" && r.role == "trainer")
            && seen(rows, workers, &|r| r.comm == "NCCL Progress 0" && r.role == "nccl_progress")
            && seen(rows, workers, &|r| workers.contains(&r.pid) && r.role == "data_loader")
            && seen(rows, workers, &|r| r.comm == "pt_main_thread" && r.phase == "gpu_compute" && r.class == gpu_class)
            && seen(rows, workers, &|r| workers.contains(&r.pid) && r.phase == "data_loading" && r.class == load_class)
    };

    let start = Instant::now();
    for line in lines {
        let line = line.expect("reading observe's output");
        let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        passes += 1;
        assert_eq!(v["pass"].as_u64(), Some(passes), "passes are numbered from 1: {line}");
        for p in v["processes"].as_array().expect("processes") {
            let pid = p["pid"].as_i64().unwrap();
            assert_ne!(pid, hog_pid, "the shell loop is listed: {p}");
            if p["ppid"].as_i64() == Some(train_pid) {
                workers.insert(pid);
            }
            if pid == train_pid {
                assert_eq!(p["ml"], Value::Bool(true), "{p}");
                assert!(p["evidence"].as_array().unwrap().iter().any(|e| e == "env_rank"), "{p}");
            }
            for t in p["threads"].as_array().expect("threads") {
                let class = t["decision"]["class"].as_str().unwrap_or("-").to_string();
                rows.insert(Row {
                    pid,
                    tid: t["tid"].as_i64().unwrap(),
                    comm: t["comm"].as_str().unwrap().to_string(),
                    role: t["role"].as_str().unwrap().to_string(),
                    phase: t["phase"].as_str().unwrap().to_string(),
                    class,
                });
            }
        }
        if (done(&rows, &workers) && passes >= 30) || start.elapsed() > Duration::from_secs(80) {
            break;
        }
    }
    drop(obs);

    let report: String = rows
        .iter()
        .filter(|r| r.pid == train_pid || workers.contains(&r.pid))
        .map(|r| format!("  {:>7} {:>7} {:<16} {:<14} {:<16} {}\n", r.pid, r.tid, r.comm, r.role, r.phase, r.class))
        .collect();
    let mut err = String::new();
    let _ = std::fs::File::open(&stderr).and_then(|mut f| f.read_to_string(&mut err));
    assert!(
        done(&rows, &workers),
        "after {passes} passes ({:?}) not everything was seen (trainer pid {train_pid}, workers {workers:?}):\n\
         {report}stderr:\n{err}",
        start.elapsed()
    );
    assert!(passes >= 30, "only {passes} passes; stderr:\n{err}");
    assert!(workers.len() >= 2, "both DataLoader workers listed: {workers:?}");
    // Phases only where they belong.
    for r in &rows {
        if r.phase == "gpu_compute" {
            assert_eq!(r.comm, "pt_main_thread", "GpuCompute on the wrong thread:\n{report}");
        }
        if r.phase == "data_loading" {
            assert!(workers.contains(&r.pid), "DataLoading outside the workers:\n{report}");
        }
    }
    // The shell loop was running all along.
    assert!(Path::new(&format!("/proc/{hog_pid}")).exists());
}

#[test]
fn text_table_count_and_sigint() {
    let dir = TempDir::new("text");
    let config = write_config(&dir.0, &dir.0.join("no-gpu.json"));
    let stderr = dir.0.join("stderr");

    // --count: three tables, plain text (not a terminal: no escapes), exit 0.
    let mut obs = observe(&["--count", "3", "--interval-ms", "50"], &config, &stderr);
    let mut out = String::new();
    obs.0.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    let status = obs.0.wait().unwrap();
    let err = std::fs::read_to_string(&stderr).unwrap_or_default();
    assert!(status.success(), "{status}; stderr:\n{err}");
    for n in 1..=3 {
        assert!(out.contains(&format!("scx_zernel observe: pass {n} at ")), "{out}");
    }
    assert!(!out.contains("pass 4 "), "{out}");
    assert!(!out.contains('\x1b'), "escape codes in piped output");

    // Without --count it runs until SIGINT, then exits 0.
    let mut obs = observe(&["--json"], &config, &stderr);
    let mut lines = BufReader::new(obs.0.stdout.take().unwrap()).lines();
    let first = lines.next().expect("a first pass").unwrap();
    assert!(serde_json::from_str::<Value>(&first).is_ok(), "{first}");
    unsafe { libc::kill(obs.0.id() as i32, libc::SIGINT) };
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = obs.0.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "observe did not exit on SIGINT");
        // Keep draining so a full pipe cannot block it.
        if lines.next().is_none() {
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    assert!(status.success(), "{status}");
}

/// A launcher that re-executes itself with RANK set (the same program with
/// the same arguments, a new environment), found before that exec: not ML
/// at first, ML by its new environment after it.
#[test]
fn a_program_re_executing_itself_with_rank_set_becomes_ml() {
    let dir = TempDir::new("reexec");
    let config = write_config(&dir.0, &dir.0.join("no-gpu.json"));
    let stderr = dir.0.join("stderr");
    // $0 is the script, $1 the file that lets it re-execute; the exec
    // repeats its own arguments, so only the environment differs.
    const SCRIPT: &str = r#"if [ -z "$RANK" ]; then
  while [ ! -e "$1" ]; do sleep 0.05; done
  exec env RANK=0 WORLD_SIZE=1 sh -c "$0" "$0" "$1"
fi
while [ -e "$1" ]; do sleep 0.1; done"#;
    let go = dir.0.join("go");
    // spawn() returns once sh runs: it cannot re-execute before `go` exists.
    let launcher = spawn_sh(SCRIPT, &[SCRIPT.as_ref(), go.as_os_str()]);
    let pid = launcher.0.id() as i64;

    let mut obs = observe(&["--json", "--interval-ms", "100", "--count", "900"], &config, &stderr);
    let lines = BufReader::new(obs.0.stdout.take().unwrap()).lines();
    let (mut passes, mut ml) = (0u64, None::<(u64, Value)>);
    let start = Instant::now();
    for line in lines {
        let line = line.expect("reading observe's output");
        let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        passes += 1;
        let p = v["processes"].as_array().expect("processes").iter().find(|p| p["pid"].as_i64() == Some(pid)).cloned();
        if passes == 1 {
            // The first pass found it (listing /proc) before its exec.
            assert!(p.is_none(), "listed as ML before its exec: {p:?}");
            std::fs::write(&go, "").unwrap();
        } else if let Some(p) = p {
            ml = Some((passes, p));
            break;
        }
        if start.elapsed() > Duration::from_secs(60) {
            break;
        }
    }
    drop(obs);
    let mut err = String::new();
    let _ = std::fs::File::open(&stderr).and_then(|mut f| f.read_to_string(&mut err));
    let (pass, p) = ml.unwrap_or_else(|| {
        panic!(
            "the launcher (pid {pid}) was not ML in {passes} passes ({:?}) after its exec; stderr:\n{err}",
            start.elapsed()
        )
    });
    assert_eq!(p["comm"], "sh", "{p}");
    assert_eq!(p["ml"], Value::Bool(true), "{p}");
    assert_eq!(p["evidence"], serde_json::json!(["env_rank"]), "{p}");
    assert!(pass <= 100, "ML only at pass {pass}: {p}");
}
