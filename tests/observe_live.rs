//! Live test of the observer and the phase detector on this host: runs
//! `zernel-workload train` (with the file GPU provider) next to a plain
//! shell busy loop, and checks that each of the four ML phases is detected
//! on the thread that does that work, and nowhere else, once with each
//! source of thread counters: the kernel's task iterator (as root, which it
//! needs: the test asserts it is the one used) and /proc. Needs no
//! sched_ext.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

mod common;

use common::{spawn_shell_loop, spawn_train, TempDir};
use scx_zernel::config::PhaseConfig;
use scx_zernel::gpu::{FileProvider, GpuProvider};
use scx_zernel::observe::{MlEvidence, ObserveConfig, Observer, ThreadCounters, ThreadRole};
use scx_zernel::phase::{Phase, PhaseDetector};

/// What we saw of one thread.
#[derive(Default, Debug)]
struct Seen {
    comm: String,
    tgid: i32,
    phases: BTreeSet<Phase>,
    timeline: String,
}

#[test]
fn four_phases_on_the_right_threads_with_kernel_counters() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("four_phases_on_the_right_threads_with_kernel_counters: skipped (the task iterator needs root)");
        return;
    }
    four_phases(ThreadCounters::Kernel);
}

#[test]
fn four_phases_on_the_right_threads_with_proc_counters() {
    four_phases(ThreadCounters::Proc);
}

/// The four phases on the right threads and a hog that stays Unknown,
/// with `thread_counters = counters` (which the observer must use).
fn four_phases(counters: ThreadCounters) {
    let dir = TempDir::new(&format!("observe-live-{counters:?}"));
    let gpu_file = dir.0.join("gpu.json");
    let train = spawn_train(&gpu_file, &dir.0, 40);
    let hog = spawn_shell_loop();
    let (train_pid, hog_pid) = (train.0.id() as i32, hog.0.id() as i32);

    let mut observer = Observer::new(&ObserveConfig { thread_counters: counters, ..ObserveConfig::default() });
    assert_eq!(observer.thread_counters(), counters, "the observer reads ML threads' counters from {counters:?}");
    let mut gpu = FileProvider::new(gpu_file);
    let phase_cfg = PhaseConfig::default();
    let period = Duration::from_millis(phase_cfg.loop_interval_ms);
    let mut detector = PhaseDetector::new(phase_cfg);
    let mut seen: BTreeMap<i32, Seen> = BTreeMap::new();
    let mut workers: BTreeSet<i32> = BTreeSet::new();
    let mut hog_checked = 0;

    let start = Instant::now();
    let done = |seen: &BTreeMap<i32, Seen>, workers: &BTreeSet<i32>| {
        let has = |pred: &dyn Fn(&Seen) -> bool, p| seen.values().any(|s| pred(s) && s.phases.contains(&p));
        has(&|s| s.comm == "pt_main_thread", Phase::GpuCompute)
            && has(&|s| s.comm == "pt_main_thread", Phase::OptimizerStep)
            && has(&|s| s.comm == "NCCL Progress 0", Phase::NcclCollective)
            && has(&|s| workers.contains(&s.tgid), Phase::DataLoading)
    };
    while start.elapsed() < Duration::from_secs(35) {
        let pass = Instant::now();
        gpu.refresh();
        let snap = observer.poll(&gpu);
        detector.update(snap);
        for p in &snap.processes {
            if p.ppid == train_pid {
                workers.insert(p.pid);
            }
        }
        for t in &snap.threads {
            let ours = t.tgid == train_pid || workers.contains(&t.tgid) || t.tgid == hog_pid;
            if !ours {
                continue;
            }
            let phase = detector.phase(t.tid);
            let s = seen.entry(t.tid).or_default();
            s.comm = t.comm.to_string();
            s.tgid = t.tgid;
            s.phases.insert(phase);
            s.timeline.push(match phase {
                Phase::DataLoading => 'L',
                Phase::GpuCompute => 'G',
                Phase::NcclCollective => 'N',
                Phase::OptimizerStep => 'O',
                Phase::Unknown => '.',
            });
            if t.tgid == hog_pid {
                let p = snap.process_of(t);
                assert!(!p.ml, "the shell loop is not ML: {}", p.evidence);
                assert_eq!(t.role, ThreadRole::NonMl);
                hog_checked += 1;
            }
            if t.tgid == train_pid && t.tid == train_pid && t.comm.as_ref() == "pt_main_thread" {
                let p = snap.process_of(t);
                assert!(p.ml && p.evidence.contains(MlEvidence::ENV_RANK), "trainer evidence: {}", p.evidence);
                assert_eq!(t.role, ThreadRole::Trainer);
            }
            if workers.contains(&t.tgid) && t.comm.as_ref() == "pt_data_worker" {
                assert!(snap.process_of(t).loader_process);
                assert_eq!(t.role, ThreadRole::DataLoader);
            }
        }
        if done(&seen, &workers) && hog_checked >= 30 {
            break;
        }
        std::thread::sleep(period.saturating_sub(pass.elapsed()));
    }

    let report: String =
        seen.iter().map(|(tid, s)| format!("  {tid:>7} {:<16} (tgid {}) {}\n", s.comm, s.tgid, s.timeline)).collect();
    eprintln!("phases per thread (L=loading G=gpu N=nccl O=optimizer .=unknown):\n{report}");
    assert!(done(&seen, &workers), "not every phase was detected on its thread:\n{report}");
    assert!(hog_checked >= 30, "the shell loop was observed {hog_checked} times");

    for (tid, s) in &seen {
        let only = |phase: Phase, ok: bool| {
            assert!(!s.phases.contains(&phase) || ok, "{phase} on the wrong thread {tid} {}:\n{report}", s.comm);
        };
        let trainer_main = s.comm == "pt_main_thread";
        only(Phase::GpuCompute, trainer_main);
        only(Phase::OptimizerStep, trainer_main);
        only(Phase::NcclCollective, s.comm == "NCCL Progress 0");
        only(Phase::DataLoading, workers.contains(&s.tgid));
        if s.tgid == hog_pid {
            assert_eq!(s.phases, BTreeSet::from([Phase::Unknown]), "the shell loop stays Unknown");
        }
    }
    assert!(workers.len() >= 2, "both DataLoader workers seen: {workers:?}");
}
