//! Observer tests on fake /proc trees.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::fixture::*;
use super::*;
use crate::gpu::{GpuDevice, GpuProcess, GpuProvider, NoGpu};

struct StaticGpu {
    devices: Vec<GpuDevice>,
    processes: Vec<GpuProcess>,
}

impl GpuProvider for StaticGpu {
    fn name(&self) -> &'static str {
        "static"
    }
    fn refresh(&mut self) {}
    fn devices(&self) -> &[GpuDevice] {
        &self.devices
    }
    fn processes(&self) -> &[GpuProcess] {
        &self.processes
    }
}

fn config(root: &Path) -> ObserveConfig {
    ObserveConfig {
        proc_root: root.to_string_lossy().into_owned(),
        rescan_interval_ms: 10,
        thread_name_interval_ms: 10,
        evidence_interval_ms: 10,
        quiet_sample_interval_ms: 0,
        ..Default::default()
    }
}

fn observer(root: &Path) -> Observer {
    Observer::new(&config(root))
}

/// Polls after a pause long enough for every rescan to be due.
fn poll(o: &mut Observer) -> Snapshot {
    poll_gpu(o, &NoGpu)
}

fn poll_gpu(o: &mut Observer, gpu: &dyn GpuProvider) -> Snapshot {
    std::thread::sleep(Duration::from_millis(15));
    o.poll(gpu).clone()
}

fn proc_of(s: &Snapshot, pid: i32) -> &ProcessView {
    s.process(pid).unwrap_or_else(|| panic!("pid {pid} missing from snapshot"))
}

fn thread_of(s: &Snapshot, tid: i32) -> &ThreadView {
    s.thread(tid).unwrap_or_else(|| panic!("tid {tid} missing from snapshot"))
}

/// A small machine: init, a shell, a trainer with threads and two loader
/// children, and processes with each kind of evidence.
fn machine(root: &Path) -> Vec<FakeProc> {
    let init = FakeProc::new(1, 0, "systemd");
    let mut kthread = FakeProc::new(2, 0, "kthreadd");
    kthread.kernel_thread = true;
    kthread.env.clear();
    kthread.maps.clear();
    kthread.fds.clear();
    let shell = FakeProc::new(100, 1, "bash");

    let mut trainer = FakeProc::new(200, 100, "python3");
    trainer.exe = "/usr/bin/python3.11".into();
    trainer.cmdline = vec!["python3".into(), "train.py".into()];
    trainer.env.push(("RANK".into(), "0".into()));
    trainer.env.push(("WORLD_SIZE".into(), "2".into()));
    trainer.env.push(("CUDA_VISIBLE_DEVICES".into(), "1".into()));
    trainer.threads.push(FakeThread::new(201, "pt_autograd_0"));
    trainer.threads.push(FakeThread::new(202, "NCCL Progress 0"));
    trainer.threads.push(FakeThread::new(203, "pt_data_pin"));
    trainer.threads.push(FakeThread::new(204, "python3"));

    // DataLoader worker renamed by PyTorch.
    let mut worker = FakeProc::new(210, 200, "pt_data_worker");
    worker.env = vec![("PATH".into(), "/usr/bin".into())];
    // Forked Python child: same interpreter and cmdline, no name.
    let mut forked = FakeProc::new(211, 200, "python3");
    forked.exe = trainer.exe.clone();
    forked.cmdline = trainer.cmdline.clone();

    let mut gpu_fd = FakeProc::new(300, 1, "cudaapp");
    gpu_fd.fds.push("/dev/nvidiactl".into());
    let mut lib = FakeProc::new(301, 1, "infer");
    lib.maps.push("/usr/local/cuda/lib64/libcudart.so.12.2.140".into());
    let mut nccl = FakeProc::new(302, 1, "allreduce");
    nccl.maps.push("/opt/nccl/lib/libnccl.so.2.19.3".into());
    let mut rocm = FakeProc::new(303, 1, "rocmapp");
    rocm.fds.push("/dev/kfd".into());

    let all = vec![init, kthread, shell, trainer, worker, forked, gpu_fd, lib, nccl, rocm];
    for p in &all {
        write_proc(root, p);
    }
    all
}

#[test]
fn ml_evidence_roles_and_loaders() {
    let dir = TempDir::new("observe-evidence");
    machine(dir.path());
    let mut o = observer(dir.path());
    let s = poll(&mut o);

    for pid in [1, 2, 100] {
        let p = proc_of(&s, pid);
        assert!(!p.ml, "pid {pid} must not be ML: {}", p.evidence);
        assert!(p.evidence.is_empty());
    }
    assert!(proc_of(&s, 2).kernel_thread);

    let t = proc_of(&s, 200);
    assert!(t.ml);
    assert!(t.evidence.contains(MlEvidence::ENV_RANK) && t.evidence.contains(MlEvidence::ENV_DEVICES));
    assert!(!t.evidence.contains(MlEvidence::PARENT));
    assert_eq!(t.env.rank, Some(0));
    assert_eq!(t.env.world_size, Some(2));
    assert!(!t.loader_process);
    assert_eq!(t.cmdline.as_ref(), "python3 train.py");
    assert_eq!(t.cgroup.as_ref(), "/user.slice/session-1.scope");
    assert_eq!((t.uid, t.gid), (1000, 1000));
    assert_eq!(t.parent_comm.as_ref(), "bash");

    for (pid, ev) in [
        (300, MlEvidence::DEVICE_FD),
        (301, MlEvidence::GPU_LIBRARY),
        (302, MlEvidence::COLLECTIVE_LIBRARY),
        (303, MlEvidence::DEVICE_FD),
    ] {
        let p = proc_of(&s, pid);
        assert!(p.ml, "pid {pid}");
        assert!(p.evidence.contains(ev), "pid {pid}: {}", p.evidence);
        assert!(!p.evidence_detail.is_empty());
    }
    assert_eq!(proc_of(&s, 300).evidence_detail.as_ref(), "fd /dev/nvidiactl");

    let w = proc_of(&s, 210);
    assert!(w.ml && w.loader_process, "pt_data_worker child is a loader");
    assert!(w.evidence.contains(MlEvidence::PARENT));
    let f = proc_of(&s, 211);
    assert!(f.ml && f.loader_process, "forked python child is a loader");

    let role = |tid| thread_of(&s, tid).role;
    assert_eq!(role(200), ThreadRole::Trainer);
    assert_eq!(role(201), ThreadRole::Autograd);
    assert_eq!(role(202), ThreadRole::NcclProgress);
    assert_eq!(role(203), ThreadRole::PinMemory);
    assert_eq!(role(204), ThreadRole::Other);
    assert_eq!(role(210), ThreadRole::DataLoader);
    assert_eq!(role(211), ThreadRole::DataLoader);
    assert_eq!(role(100), ThreadRole::NonMl);
    assert!(thread_of(&s, 201).ml && !thread_of(&s, 100).ml);
    assert_eq!(thread_of(&s, 201).start_ticks, 1201);
    // Every process and thread is NEW on the first pass, nothing on the second.
    assert!(s.processes.iter().all(|p| p.changes.contains(Changes::NEW)));
    assert!(s.threads.iter().all(|t| t.changes.contains(Changes::NEW)));
    let s2 = poll(&mut o);
    assert_eq!(s2.changed_processes().count(), 0, "{:?}", s2.changed_processes().map(|p| p.pid).collect::<Vec<_>>());
    assert_eq!(s2.changed_threads().count(), 0);
    assert_eq!(s2.threads.len(), s.threads.len());
}

#[test]
fn inheritance_depth_and_forcing() {
    let dir = TempDir::new("observe-forced");
    let root = dir.path();
    let mut ml = FakeProc::new(10, 1, "trainer");
    ml.env.push(("LOCAL_RANK".into(), "0".into()));
    let child = FakeProc::new(11, 10, "helper");
    let grandchild = FakeProc::new(12, 11, "helper2");
    let plain = FakeProc::new(20, 1, "myjob");
    let plain_child = FakeProc::new(21, 20, "myjob-child");
    for p in [&ml, &child, &grandchild, &plain, &plain_child] {
        write_proc(root, p);
    }
    let cfg = ObserveConfig { ml_inherit_depth: 1, ..config(root) };
    let mut o = Observer::new(&cfg);
    let s = poll(&mut o);
    assert!(proc_of(&s, 11).ml, "child inherits");
    assert!(!proc_of(&s, 11).loader_process, "not a loader: neither named nor forked python");
    assert!(!proc_of(&s, 12).ml, "grandchild beyond ml_inherit_depth = 1");
    assert!(!proc_of(&s, 20).ml);

    assert!(o.set_forced_ml(20, Some(true)));
    assert!(o.set_forced_ml(10, Some(false)));
    assert!(!o.set_forced_ml(999, Some(true)));
    let s = poll(&mut o);
    let p = proc_of(&s, 20);
    assert!(p.ml && p.evidence.contains(MlEvidence::FORCED));
    assert!(p.changes.contains(Changes::ML));
    assert!(thread_of(&s, 20).ml && thread_of(&s, 20).changes.contains(Changes::ML));
    assert_eq!(thread_of(&s, 20).role, ThreadRole::Trainer);
    assert!(proc_of(&s, 21).ml, "children of a forced process inherit");
    assert!(!proc_of(&s, 10).ml, "forced non-ML wins over evidence");
    assert!(!proc_of(&s, 11).ml, "and stops inheritance");

    o.set_forced_ml(10, None);
    let s = poll(&mut o);
    assert!(proc_of(&s, 10).ml && proc_of(&s, 11).ml);
}

#[test]
fn deltas_of_ml_threads() {
    let dir = TempDir::new("observe-deltas");
    let root = dir.path();
    let mut p = FakeProc::new(50, 1, "trainer");
    p.env.push(("RANK".into(), "0".into()));
    p.threads.push(FakeThread::new(51, "NCCL Progress 0"));
    p.threads.push(FakeThread::new(52, "idle"));
    let mut plain = FakeProc::new(60, 1, "daemon");
    plain.threads[0].cpu_ns = 5_000_000;
    write_proc(root, &p);
    write_proc(root, &plain);

    let mut o = observer(root);
    let s = poll(&mut o);
    assert!(s.threads.iter().all(|t| t.delta.is_none()), "no delta on first sight");

    // The NCCL thread spins and waits; the idle one does nothing.
    let t = p.thread(51);
    t.cpu_ns += 40_000_000;
    t.runq_ns += 2_000_000;
    t.slices += 30;
    t.voluntary += 25;
    t.involuntary += 5;
    t.rchar += 4096;
    t.cpu = 1;
    write_proc(root, &p);
    plain.threads[0].cpu_ns += 10_000_000;
    write_proc(root, &plain);

    let s = poll(&mut o);
    let n = thread_of(&s, 51);
    let d = n.delta.expect("ML thread sampled");
    assert!(d.interval_ns >= 10_000_000, "interval {}", d.interval_ns);
    // Capped at the interval when the fake counters exceed it.
    assert_eq!(d.cpu_ns, 40_000_000.min(d.interval_ns));
    assert_eq!(d.runq_wait_ns, 2_000_000);
    assert_eq!(d.timeslices, 30);
    let dd = d.detail.expect("active thread gets a detailed read");
    assert_eq!((dd.voluntary_switches, dd.involuntary_switches), (25, 5));
    assert_eq!(dd.read_bytes, 4096);
    assert_eq!(n.last_cpu, Some(1));

    let idle = thread_of(&s, 52).delta.expect("sampled every pass");
    assert_eq!(idle.cpu_ns, 0);
    assert!(idle.detail.is_none(), "quiet threads skip the detailed read");
    assert!(thread_of(&s, 60).delta.is_none(), "non-ML threads are not sampled");

    // Counters that go backwards (absurd) re-baseline instead of wrapping.
    p.thread(51).cpu_ns = 1;
    write_proc(root, &p);
    let s = poll(&mut o);
    assert!(thread_of(&s, 51).delta.is_none());
    let s = poll(&mut o);
    assert_eq!(thread_of(&s, 51).delta.unwrap().cpu_ns, 0);
}

#[test]
fn a_stopped_process_is_not_sampled_and_resumes_with_fresh_baselines() {
    let dir = TempDir::new("observe-stopped");
    let root = dir.path();
    let (mut p, mut o) = trainer_with_pool_thread(root, 80, Duration::from_millis(200));
    // Running: both threads are sampled every pass (the positive control).
    p.thread(81).cpu_ns += 5_000_000;
    write_proc(root, &p);
    let s = poll(&mut o);
    assert!(thread_of(&s, 80).delta.is_some() && thread_of(&s, 81).delta.is_some(), "sampled while running");

    // SIGSTOP: every thread in state T. No thread is sampled.
    for t in &mut p.threads {
        t.state = 'T';
    }
    write_proc(root, &p);
    for _ in 0..3 {
        let s = poll(&mut o);
        assert!(proc_of(&s, 80).ml, "still an ML process");
        assert!(thread_of(&s, 80).delta.is_none() && thread_of(&s, 81).delta.is_none(), "stopped: not sampled");
    }

    // SIGCONT, and the worker runs before the next pass: that pass takes
    // baselines (no delta spans the stop), the one after reports only what
    // ran since.
    for t in &mut p.threads {
        t.state = 'S';
    }
    p.thread(81).cpu_ns += 7_000_000;
    write_proc(root, &p);
    let s = poll(&mut o);
    assert!(thread_of(&s, 81).delta.is_none(), "the first pass after the stop is a baseline");
    std::thread::sleep(Duration::from_millis(20));
    p.thread(81).cpu_ns += 3_000_000;
    write_proc(root, &p);
    let s = poll(&mut o);
    assert_eq!(thread_of(&s, 81).delta.map(|d| d.cpu_ns), Some(3_000_000), "only what ran since the baseline");
    assert_eq!(thread_of(&s, 80).delta.map(|d| d.cpu_ns), Some(0));
}

/// An ML process `pid` (a trainer with RANK set) with one pool thread,
/// `pid + 1`, observed once with `quiet_sample_interval_ms = quiet`.
fn trainer_with_pool_thread(root: &Path, pid: i32, quiet: Duration) -> (FakeProc, Observer) {
    let mut p = FakeProc::new(pid, 1, "trainer");
    p.env.push(("RANK".into(), "0".into()));
    p.threads.push(FakeThread::new(pid + 1, "omp_worker"));
    write_proc(root, &p);
    let cfg = ObserveConfig { quiet_sample_interval_ms: quiet.as_millis() as u64, ..config(root) };
    let mut o = Observer::new(&cfg);
    poll(&mut o);
    (p, o)
}

#[test]
fn quiet_pool_threads_are_sampled_less_often() {
    let dir = TempDir::new("observe-quiet");
    let root = dir.path();
    // Checks of the process's CPU time every 200 ms (quiet threads' own
    // fallback: 18-30 s, out of this test's reach).
    let (mut p, mut o) = trainer_with_pool_thread(root, 70, Duration::from_millis(200));
    // Quiet for more than a second: then the pool thread is held back; the
    // trainer keeps being sampled every pass.
    let start = std::time::Instant::now();
    let mut sampled = 0;
    while start.elapsed() < Duration::from_millis(1300) {
        let s = poll(&mut o);
        sampled += thread_of(&s, 71).delta.is_some() as u32;
    }
    assert!(sampled >= 10, "sampled every pass while not yet quiet long enough: {sampled}");
    let s = poll(&mut o);
    assert_eq!(thread_of(&s, 71).role, ThreadRole::Other);
    assert!(thread_of(&s, 71).delta.is_none(), "quiet pool thread not due");
    assert!(thread_of(&s, 70).delta.is_some(), "the trainer is never tiered");

    // A check (every 200 ms) compares the process's CPU time with what the
    // samples account for. The trainer's own time is accounted for: the
    // quiet thread stays held back. (A sample never reports more CPU time
    // than wall time: the test waits as long as it claims.)
    let check = |o: &mut Observer, p: &FakeProc| {
        write_proc(root, p);
        std::thread::sleep(Duration::from_millis(210));
        poll(o).clone()
    };
    p.thread(70).cpu_ns += 50_000_000;
    let s = check(&mut o, &p);
    assert_eq!(thread_of(&s, 70).delta.map(|d| d.cpu_ns > 0), Some(true));
    assert!(thread_of(&s, 71).delta.is_none(), "accounted for: not sampled");
    // Unaccounted time (the quiet thread's) below three clock ticks, net of
    // a 5 % drain (the trickle of idle pools), is not enough...
    p.thread(71).cpu_ns += 20_000_000;
    let s = check(&mut o, &p);
    assert!(thread_of(&s, 71).delta.is_none(), "20 ms unaccounted in 210 ms: the quiet thread is not sampled yet");
    // ... but as soon as it adds up to them, the check that sees it samples
    // the quiet threads.
    p.thread(71).cpu_ns += 40_000_000;
    let s = check(&mut o, &p);
    let d = thread_of(&s, 71).delta.expect("sampled once the unaccounted time adds up to 30 ms");
    assert_eq!(d.cpu_ns, 60_000_000);
    assert!(d.detail.is_some(), "and read in detail: it was active");
}

#[test]
fn quiet_threads_fall_back_to_a_sample_every_factor_quiet_intervals() {
    let dir = TempDir::new("observe-quiet-fallback");
    let root = dir.path();
    let interval = Duration::from_millis(10);
    // tid 171: its jitter is 75 + 171 % 50 = 96 % of the fallback.
    let fallback = interval * QUIET_FALLBACK_FACTOR * 96 / 100;
    let (_p, mut o) = trainer_with_pool_thread(root, 170, interval);
    // Sampled every pass until it has been quiet for a second; the pass
    // after its last sample holds it back.
    let start = std::time::Instant::now();
    let mut last = start;
    loop {
        let t = std::time::Instant::now();
        let s = poll(&mut o);
        if thread_of(&s, 171).delta.is_some() {
            last = t;
        } else if t.duration_since(start) > Duration::from_secs(1) {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(5), "the pool thread never went quiet");
        std::thread::sleep(Duration::from_millis(5));
    }
    // No activity the samples miss: only the fallback samples it, not
    // before its time, and not much after.
    let sampled_at = loop {
        let t = std::time::Instant::now();
        let s = poll(&mut o);
        if thread_of(&s, 171).delta.is_some() {
            break t;
        }
        assert!(t.duration_since(last) < fallback + Duration::from_millis(500), "held back past its fallback");
        std::thread::sleep(Duration::from_millis(5));
    };
    let after = sampled_at.duration_since(last);
    assert!(
        after + Duration::from_millis(20) >= fallback,
        "sampled {after:?} after its last sample, before the fallback ({fallback:?})"
    );
}

#[test]
fn vanishing_pids_threads_and_garbage() {
    let dir = TempDir::new("observe-vanish");
    let root = dir.path();
    let mut p = FakeProc::new(80, 1, "trainer");
    p.env.push(("RANK".into(), "0".into()));
    p.threads.push(FakeThread::new(81, "pt_autograd_0"));
    p.threads.push(FakeThread::new(82, "worker"));
    let q = FakeProc::new(90, 1, "bash");
    write_proc(root, &p);
    write_proc(root, &q);
    // Garbage: a pid dir with unparsable stat, one with nothing in it, a
    // non-numeric entry.
    std::fs::create_dir_all(root.join("95/task/95")).unwrap();
    std::fs::write(root.join("95/task/95/stat"), "garbage").unwrap();
    std::fs::create_dir_all(root.join("96")).unwrap();
    std::fs::create_dir_all(root.join("self")).unwrap();

    let mut o = observer(root);
    let s = poll(&mut o);
    assert!(s.process(95).is_none() && s.process(96).is_none());
    assert_eq!(s.threads.iter().filter(|t| t.tgid == 80).count(), 3);

    // A thread exits.
    p.threads.retain(|t| t.tid != 82);
    remove_thread(root, 80, 82);
    write_proc(root, &p);
    let s = poll(&mut o);
    assert_eq!(s.gone, vec![GoneThread { tid: 82, tgid: 80, start_ticks: 1082 }]);
    assert!(s.thread(82).is_none());

    // A new thread appears and is NEW with its name.
    p.threads.push(FakeThread::new(83, "pt_data_pin"));
    write_proc(root, &p);
    let s = poll(&mut o);
    let t = thread_of(&s, 83);
    assert!(t.changes.contains(Changes::NEW));
    assert_eq!((t.comm.as_ref(), t.role), ("pt_data_pin", ThreadRole::PinMemory));

    // A process exits: all its threads are gone.
    remove_proc(root, 80);
    let s = poll(&mut o);
    let mut gone: Vec<i32> = s.gone.iter().map(|g| g.tid).collect();
    gone.sort();
    assert_eq!(gone, vec![80, 81, 83]);
    assert!(s.process(80).is_none());
    assert!(s.process(90).is_some());

    // Files turning into garbage under a known process: skipped, no panic.
    std::fs::write(root.join("90/task/90/stat"), "90 (bash) S").unwrap();
    std::fs::write(root.join("90/task/90/comm"), [0xff, 0xfe, b'\n']).unwrap();
    let s = poll(&mut o);
    assert!(s.process(90).is_some());
    // The proc root itself vanishing keeps the previous view.
    let s = {
        let mut o2 = Observer::new(&config(&root.join("nope")));
        poll(&mut o2)
    };
    assert!(s.processes.is_empty());
}

#[test]
fn a_device_open_told_by_the_kernel_makes_a_process_ml() {
    let dir = TempDir::new("observe-devopen");
    let root = dir.path();
    let mut p = FakeProc::new(30, 1, "job");
    write_proc(root, &p);
    let mut o = observer(root);
    assert!(!proc_of(&poll(&mut o), 30).ml);
    // Another incarnation's start time: ignored.
    o.note_device_open(30, p.start + 1, "device open 195:0 by tid 30");
    assert!(!proc_of(&poll(&mut o), 30).ml);
    o.note_device_open(30, p.start, "device open 195:0 by tid 30");
    let s = poll(&mut o);
    let v = proc_of(&s, 30);
    assert!(v.ml && v.evidence.contains(MlEvidence::DEVICE_OPEN), "{}", v.evidence);
    assert_eq!(v.evidence.to_string(), "device_open");
    assert_eq!(v.evidence_detail.as_ref(), "device open 195:0 by tid 30");
    assert!(thread_of(&s, 30).ml);
    // Told before the observer has seen the process: applied at discovery.
    let q = FakeProc::new(31, 1, "late");
    o.note_device_open(31, q.start, "device open 226:128 by tid 31");
    write_proc(root, &q);
    assert!(proc_of(&poll(&mut o), 31).ml);
    // An exec: another program, which opened nothing.
    p.exe = "/usr/bin/other".into();
    write_proc(root, &p);
    let s = poll(&mut o);
    assert!(!proc_of(&s, 30).ml, "{}", proc_of(&s, 30).evidence);
}

#[test]
fn with_process_events_new_work_comes_from_the_events_not_from_listings() {
    let dir = TempDir::new("observe-events");
    let root = dir.path();
    let mut p = FakeProc::new(60, 1, "first");
    write_proc(root, &p);
    // A rescan interval of 10 s: the reconciliation listing comes every 50 s.
    let cfg = ObserveConfig { rescan_interval_ms: 10_000, ..config(root) };
    let mut o = Observer::new(&cfg);
    o.set_process_events(true);
    assert!(poll(&mut o).process(60).is_some(), "the first pass lists /proc");
    assert_eq!(o.discovery_counts(), (0, 1));
    // A process the kernel did not tell of is not found by a listing...
    let q = FakeProc::new(61, 60, "forked");
    write_proc(root, &q);
    assert!(poll(&mut o).process(61).is_none());
    // ... one it told of is, at the next pass, without a listing.
    o.note_process_events(&[ProcEvent { kind: ProcEventKind::New, pid: 61, tid: 61, start_ticks: q.start }]);
    let s = poll(&mut o);
    assert!(proc_of(&s, 61).changes.contains(Changes::NEW));
    assert_eq!(o.discovery_counts(), (1, 1));
    // An exec told: the new program is read at once (no rescan is due).
    p.exe = "/usr/bin/second".into();
    p.cmdline = vec!["second".into()];
    write_proc(root, &p);
    assert_eq!(proc_of(&poll(&mut o), 60).cmdline.as_ref(), "first");
    o.note_process_events(&[ProcEvent { kind: ProcEventKind::Exec, pid: 60, tid: 60, start_ticks: p.start }]);
    let s = poll(&mut o);
    assert!(proc_of(&s, 60).changes.contains(Changes::EXEC));
    assert_eq!(proc_of(&s, 60).cmdline.as_ref(), "second");
    // An exit told: its threads are gone at the next pass.
    remove_proc(root, 61);
    o.note_process_events(&[ProcEvent { kind: ProcEventKind::Exit, pid: 61, tid: 61, start_ticks: q.start }]);
    let s = poll(&mut o);
    assert!(s.process(61).is_none());
    assert_eq!(s.gone.iter().map(|g| g.tid).collect::<Vec<_>>(), vec![61]);
    // A recycled pid told as new: the old process is gone, the new one found.
    p.start += 500;
    p.comm = "reused".into();
    p.threads[0].start += 500;
    p.threads[0].comm = "reused".into();
    write_proc(root, &p);
    o.note_process_events(&[ProcEvent { kind: ProcEventKind::New, pid: 60, tid: 60, start_ticks: p.start }]);
    let s = poll(&mut o);
    assert_eq!(s.gone.iter().map(|g| (g.tid, g.start_ticks)).collect::<Vec<_>>(), vec![(60, 1060)]);
    assert!(proc_of(&s, 60).changes.contains(Changes::NEW));
    assert_eq!(proc_of(&s, 60).comm.as_ref(), "reused");
    // Lost events: the next pass lists /proc and finds what they missed.
    write_proc(root, &FakeProc::new(62, 1, "missed"));
    assert!(poll(&mut o).process(62).is_none());
    o.note_events_lost();
    assert!(poll(&mut o).process(62).is_some());
    assert_eq!(o.discovery_counts(), (4, 2));
    // Without events, a listing finds a new process at once.
    o.set_process_events(false);
    poll(&mut o);
    write_proc(root, &FakeProc::new(63, 1, "listed"));
    assert!(poll(&mut o).process(63).is_some());
}

#[test]
fn renames_and_cgroup_moves_told_by_the_kernel_are_read_at_the_next_pass() {
    let dir = TempDir::new("observe-told");
    let root = dir.path();
    let mut p = FakeProc::new(80, 1, "server");
    p.threads.push(FakeThread::new(81, "worker"));
    write_proc(root, &p);
    // Rescans an hour apart, and no name check in the next 150 ms (the
    // first comes 150-250 ms after discovery): only the events can tell.
    let cfg = ObserveConfig { thread_name_interval_ms: 3_600_000, rescan_interval_ms: 3_600_000, ..config(root) };
    let mut o = Observer::new(&cfg);
    o.set_process_events(true);
    poll(&mut o);
    let start = p.start;
    let told = |kind, tid| ProcEvent { kind, pid: 80, tid, start_ticks: start };
    // A thread renamed and the process moved, not told: not seen.
    p.thread(81).comm = "pt_data_worker".into();
    p.cgroup = "/jobs/a".into();
    write_proc(root, &p);
    let s = poll(&mut o);
    assert_eq!(thread_of(&s, 81).comm.as_ref(), "worker");
    assert_eq!(proc_of(&s, 80).cgroup.as_ref(), "/user.slice/session-1.scope");
    // Told: both read in the next pass.
    o.note_process_events(&[told(ProcEventKind::Rename, 81), told(ProcEventKind::CgroupMove, 80)]);
    let s = poll(&mut o);
    assert_eq!(thread_of(&s, 81).comm.as_ref(), "pt_data_worker");
    assert!(thread_of(&s, 81).changes.contains(Changes::RENAMED));
    assert_eq!(proc_of(&s, 80).cgroup.as_ref(), "/jobs/a");
    assert!(proc_of(&s, 80).changes.contains(Changes::CGROUP));
    // The main thread's rename told: the process is renamed too.
    p.comm = "server-2".into();
    p.thread(80).comm = "server-2".into();
    write_proc(root, &p);
    o.note_process_events(&[told(ProcEventKind::Rename, 80)]);
    let s = poll(&mut o);
    assert_eq!(proc_of(&s, 80).comm.as_ref(), "server-2");
    assert!(proc_of(&s, 80).changes.contains(Changes::RENAMED));
    assert_eq!(thread_of(&s, 80).comm.as_ref(), "server-2");
    // A thread started after the listing, renamed: listed then, named.
    p.threads.push(FakeThread::new(82, "pt_data_worker_1"));
    write_proc(root, &p);
    assert!(poll(&mut o).thread(82).is_none(), "no rescan is due");
    o.note_process_events(&[told(ProcEventKind::Rename, 82)]);
    assert_eq!(thread_of(&poll(&mut o), 82).comm.as_ref(), "pt_data_worker_1");
    // Another incarnation's events, and events while they are off, are
    // ignored.
    p.thread(81).comm = "other".into();
    write_proc(root, &p);
    o.note_process_events(&[ProcEvent { start_ticks: start + 1, ..told(ProcEventKind::Rename, 81) }]);
    assert_eq!(thread_of(&poll(&mut o), 81).comm.as_ref(), "pt_data_worker");
    o.set_process_events(false);
    o.note_process_events(&[told(ProcEventKind::Rename, 81)]);
    assert_eq!(thread_of(&poll(&mut o), 81).comm.as_ref(), "pt_data_worker");
}

#[test]
fn pid_reuse_is_a_new_process() {
    let dir = TempDir::new("observe-reuse");
    let root = dir.path();
    let mut p = FakeProc::new(40, 1, "first");
    write_proc(root, &p);
    let mut o = observer(root);
    poll(&mut o);
    p.start += 500;
    p.comm = "second".into();
    p.threads[0].start += 500;
    p.threads[0].comm = "second".into();
    write_proc(root, &p);
    let s = poll(&mut o);
    assert_eq!(s.gone, vec![GoneThread { tid: 40, tgid: 40, start_ticks: 1040 }]);
    let np = proc_of(&s, 40);
    assert!(np.changes.contains(Changes::NEW));
    assert_eq!(np.comm.as_ref(), "second");
    assert_eq!(thread_of(&s, 40).start_ticks, 1540);
}

#[test]
fn a_process_rename_reaches_its_main_thread_at_the_rescan() {
    let dir = TempDir::new("observe-rename-main");
    let root = dir.path();
    let mut p = FakeProc::new(50, 1, "before");
    p.threads.push(FakeThread::new(51, "helper"));
    write_proc(root, &p);
    // Name checks back off from 150-250 ms: the next passes (15 ms apart)
    // fall before the threads' first check, so only the rescan can see it.
    let cfg = ObserveConfig { thread_name_interval_ms: 3_600_000, ..config(root) };
    let mut o = Observer::new(&cfg);
    poll(&mut o);
    p.comm = "after".into();
    p.thread(50).comm = "after".into();
    p.thread(51).comm = "helper-2".into();
    write_proc(root, &p);
    let s = poll(&mut o);
    assert_eq!(proc_of(&s, 50).comm.as_ref(), "after");
    let main = thread_of(&s, 50);
    assert_eq!(main.comm.as_ref(), "after", "the main thread's rules see the new name");
    assert!(main.changes.contains(Changes::RENAMED));
    assert_eq!(thread_of(&s, 51).comm.as_ref(), "helper", "other threads wait for their name check");
}

#[test]
fn a_settled_process_is_left_out_of_the_pass_until_one_of_its_threads_changes() {
    let dir = TempDir::new("observe-settled");
    let root = dir.path();
    let mut big = FakeProc::new(60, 1, "server");
    for tid in 61..=260 {
        big.threads.push(FakeThread::new(tid, "worker"));
    }
    write_proc(root, &big);
    write_proc(root, &FakeProc::new(70, 1, "other"));
    let mut o = observer(root);
    let index = |s: &Snapshot| s.processes.iter().position(|p| p.pid == 60).expect("pid 60");
    let touched = |s: &Snapshot| s.touched.clone().expect("the observer says which processes it touched");
    // New, then the pass that clears the new threads' changes, then settled.
    let s = poll(&mut o);
    assert!(touched(&s).contains(&index(&s)));
    let mut settled = false;
    for _ in 0..5 {
        let s = poll(&mut o);
        if !touched(&s).contains(&index(&s)) {
            settled = true;
            assert!(s.threads[s.spans[index(&s)].clone()].iter().all(|t| t.delta.is_none() && t.changes.is_empty()));
            assert_eq!(s.spans[index(&s)].len(), 201);
            break;
        }
    }
    assert!(settled, "an unchanged process was walked in every pass");
    // One thread renames itself: the process is touched, the rename seen.
    big.thread(150).comm = "pt_data_worker".into();
    write_proc(root, &big);
    let s = poll(&mut o);
    assert!(touched(&s).contains(&index(&s)), "a renamed thread's process is touched");
    assert_eq!(s.changed_threads().map(|t| t.tid).collect::<Vec<_>>(), vec![150]);
    assert_eq!(thread_of(&s, 150).comm.as_ref(), "pt_data_worker");
    let visit = s.threads_to_visit(false, &[]);
    assert!(visit.iter().any(|r| s.threads[r.clone()].iter().any(|t| t.tid == 150)));
    // Its change cleared in the next pass, then settled again.
    let s = poll(&mut o);
    assert!(s.changed_threads().next().is_none());
    let s = poll(&mut o);
    assert!(!touched(&s).contains(&index(&s)));
}

#[test]
fn renames_and_exec_are_reported_once() {
    let dir = TempDir::new("observe-rename");
    let root = dir.path();
    let mut p = FakeProc::new(30, 1, "launcher");
    p.threads.push(FakeThread::new(31, "worker"));
    write_proc(root, &p);
    let mut o = observer(root);
    poll(&mut o);

    // A thread renames itself.
    p.thread(31).comm = "pt_autograd_0".into();
    write_proc(root, &p);
    let s = poll(&mut o);
    let t = thread_of(&s, 31);
    assert!(t.changes.contains(Changes::RENAMED));
    assert_eq!(t.comm.as_ref(), "pt_autograd_0");
    assert_eq!(t.role, ThreadRole::NonMl, "process is not ML");
    assert!(poll(&mut o).changed_threads().next().is_none());

    // The process execs an ML program.
    p.threads.truncate(1);
    remove_thread(root, 30, 31);
    p.comm = "python3".into();
    p.threads[0].comm = "python3".into();
    p.exe = "/usr/bin/python3".into();
    p.cmdline = vec!["python3".into(), "train.py".into()];
    p.env.push(("WORLD_SIZE".into(), "4".into()));
    write_proc(root, &p);
    let s = poll(&mut o);
    let v = proc_of(&s, 30);
    assert!(v.changes.contains(Changes::EXEC), "{:?}", v.changes);
    assert!(v.ml && v.evidence.contains(MlEvidence::ENV_RANK));
    assert_eq!(v.env.world_size, Some(4));
    assert_eq!(v.cmdline.as_ref(), "python3 train.py");
    assert_eq!(s.gone.iter().map(|g| g.tid).collect::<Vec<_>>(), vec![31]);
    assert_eq!(thread_of(&s, 30).role, ThreadRole::Trainer);

    // A cgroup move.
    p.cgroup = "/system.slice/train.service".into();
    write_proc(root, &p);
    let s = poll(&mut o);
    assert!(proc_of(&s, 30).changes.contains(Changes::CGROUP));
    assert_eq!(proc_of(&s, 30).cgroup.as_ref(), "/system.slice/train.service");
}

#[test]
fn a_program_re_executing_itself_with_a_new_environment_is_read_again() {
    // A launcher that re-executes itself with RANK set (same binary, same
    // arguments), first seen before its exec.
    let dir = TempDir::new("observe-reexec");
    let root = dir.path();
    let mut p = FakeProc::new(40, 1, "launcher");
    write_proc(root, &p);
    let mut o = observer(root);
    assert!(!proc_of(&poll(&mut o), 40).ml);
    // The environment file alone changing is not read again (only an
    // exec makes a new environment).
    std::fs::write(root.join("40/environ"), "PATH=/usr/bin\0RANK=0\0").unwrap();
    assert!(!proc_of(&poll(&mut o), 40).ml);
    // The exec: a new stack and environment, the same exe and cmdline.
    p.env.push(("RANK".into(), "0".into()));
    p.stack += 0x1000;
    write_proc(root, &p);
    let s = poll(&mut o);
    let v = proc_of(&s, 40);
    assert!(v.changes.contains(Changes::EXEC), "{:?}", v.changes);
    assert!(v.ml && v.evidence.contains(MlEvidence::ENV_RANK), "{}", v.evidence);
    assert_eq!(v.env.rank, Some(0));
    assert_eq!(thread_of(&s, 40).role, ThreadRole::Trainer);
    assert!(!poll(&mut o).process(40).unwrap().changes.contains(Changes::EXEC), "the exec is reported once");
    // Its main thread exits while another runs on: stat shows no address
    // space, which is no exec; the environment's evidence stays.
    p.stack = 0;
    write_proc(root, &p);
    std::fs::write(root.join("40/environ"), "").unwrap();
    let s = poll(&mut o);
    let v = proc_of(&s, 40);
    assert!(!v.changes.contains(Changes::EXEC), "{:?}", v.changes);
    assert!(v.ml && v.evidence.contains(MlEvidence::ENV_RANK), "{}", v.evidence);
}

#[test]
fn late_gpu_initialisation_is_noticed() {
    let dir = TempDir::new("observe-late");
    let root = dir.path();
    let mut p = FakeProc::new(33, 1, "python3");
    write_proc(root, &p);
    let mut o = observer(root);
    assert!(!proc_of(&poll(&mut o), 33).ml);
    // `import torch; torch.cuda.init()`: libraries and device mapped, vsize grows.
    p.maps.push("/usr/lib/python3/site-packages/torch/lib/libtorch_cuda.so".into());
    p.fds.push("/dev/nvidia0".into());
    p.vsize += 1 << 30;
    write_proc(root, &p);
    let s = poll(&mut o);
    let v = proc_of(&s, 33);
    assert!(v.ml && v.evidence.contains(MlEvidence::GPU_LIBRARY) && v.evidence.contains(MlEvidence::DEVICE_FD));
    assert!(v.changes.contains(Changes::ML));
}

#[test]
fn gpu_data_is_joined_to_processes() {
    let dir = TempDir::new("observe-gpu");
    let root = dir.path();
    machine(root);
    let gpu = StaticGpu {
        devices: vec![
            GpuDevice { index: 0, uuid: "GPU-a".into(), pci_bus_id: "0000:01:00.0".into(), util_pct: 10 },
            GpuDevice { index: 1, uuid: "GPU-b".into(), pci_bus_id: "0000:02:00.0".into(), util_pct: 90 },
        ],
        processes: vec![
            GpuProcess { pid: 301, device: 0, sm_util_pct: 42 },
            GpuProcess { pid: 100, device: 1, sm_util_pct: 5 },
        ],
    };
    let mut o = Observer::new(&config(root));
    let s = poll_gpu(&mut o, &gpu);
    assert_eq!(s.gpus.len(), 2);
    let t = proc_of(&s, 200);
    assert_eq!(
        t.gpu,
        ProcessGpu { devices: Arc::from([1]), util_pct: Some(90), per_process: false },
        "CUDA_VISIBLE_DEVICES=1"
    );
    assert_eq!(&*thread_of(&s, 201).gpus, &[1], "threads carry their process's GPUs");
    let l = proc_of(&s, 301);
    assert_eq!(l.gpu, ProcessGpu { devices: Arc::from([0]), util_pct: Some(42), per_process: true });
    let sh = proc_of(&s, 100);
    assert!(sh.ml && sh.evidence.contains(MlEvidence::GPU_PROCESS), "listed GPU users are ML");
    assert_eq!(proc_of(&s, 1).gpu, ProcessGpu::default());
}

#[test]
fn proc_is_listed_only_when_tasks_come_or_go() {
    let dir = TempDir::new("observe-loadavg");
    let root = dir.path();
    let load = |latest: u32, tasks: u32| {
        std::fs::write(root.join("loadavg"), format!("0.10 0.20 0.30 1/{tasks} {latest}\n")).unwrap();
    };
    load(100, 50);
    write_proc(root, &FakeProc::new(10, 1, "first"));
    let cfg = ObserveConfig { rescan_interval_ms: 60_000, ..config(root) };
    let mut o = Observer::new(&cfg);
    assert!(poll(&mut o).process(10).is_some());
    // A process appears but loadavg has not moved (as if read before the
    // fork): not listed yet.
    write_proc(root, &FakeProc::new(20, 1, "second"));
    assert!(poll(&mut o).process(20).is_none());
    // The kernel's latest pid moves: /proc is listed.
    load(101, 51);
    let s = poll(&mut o);
    assert!(s.process(20).unwrap().changes.contains(Changes::NEW));
    // An exit moves the task count.
    remove_proc(root, 10);
    load(101, 50);
    let s = poll(&mut o);
    assert!(s.process(10).is_none());
    assert_eq!(s.gone, vec![GoneThread { tid: 10, tgid: 10, start_ticks: 1010 }]);
}

#[test]
fn thread_names_are_rechecked_with_back_off() {
    let dir = TempDir::new("observe-names");
    let root = dir.path();
    let mut p = FakeProc::new(10, 1, "app");
    p.threads.push(FakeThread::new(11, "app"));
    write_proc(root, &p);
    let cfg = ObserveConfig { thread_name_interval_ms: 60_000, ..config(root) };
    let mut o = Observer::new(&cfg);
    poll(&mut o);
    // Renamed right after it started: seen at the first check, ~200 ms later.
    p.thread(11).comm = "worker-1".into();
    write_proc(root, &p);
    assert!(poll(&mut o).changed_threads().next().is_none(), "not checked every pass");
    std::thread::sleep(Duration::from_millis(250));
    let s = poll(&mut o);
    assert_eq!(thread_of(&s, 11).comm.as_ref(), "worker-1");
    assert!(thread_of(&s, 11).changes.contains(Changes::RENAMED));
    // The next check is ~400 ms later, not at the next pass.
    p.thread(11).comm = "worker-2".into();
    write_proc(root, &p);
    assert_eq!(thread_of(&poll(&mut o), 11).comm.as_ref(), "worker-1");
    std::thread::sleep(Duration::from_millis(550));
    assert_eq!(thread_of(&poll(&mut o), 11).comm.as_ref(), "worker-2");
}
