//! Phase detector tests on synthetic snapshots.

use std::sync::Arc;

use super::*;
use crate::observe::{
    Changes, DetailDelta, GoneThread, MlEnv, MlEvidence, ProcessGpu, ProcessView, ThreadDelta, ThreadRole, ThreadView,
};

const MS: u64 = 1_000_000;
const INTERVAL: u64 = 100 * MS;

fn process(pid: i32, ml: bool, gpu_util: Option<u32>) -> ProcessView {
    ProcessView {
        pid,
        ppid: 1,
        start_ticks: 10,
        comm: Arc::from("python3"),
        cmdline: Arc::from("python3 train.py"),
        exe: Arc::from("/usr/bin/python3"),
        uid: 0,
        gid: 0,
        cgroup: Arc::from("/"),
        parent_comm: Arc::from("bash"),
        kernel_thread: false,
        ml,
        evidence: if ml { MlEvidence::ENV_RANK } else { MlEvidence::NONE },
        evidence_detail: Arc::from(""),
        env: MlEnv::default(),
        loader_process: false,
        gpu: ProcessGpu { devices: Arc::from([0]), util_pct: gpu_util, per_process: true },
        nr_threads: 1,
        changes: Changes::NONE,
    }
}

/// Activity of a thread over one interval.
#[derive(Clone, Copy, Default)]
struct Act {
    busy: f64,
    vol_per_sec: u64,
    read_per_sec: u64,
    invol_per_sec: u64,
}

fn thread(tid: i32, tgid: i32, role: ThreadRole, ml: bool, act: Option<Act>) -> ThreadView {
    ThreadView {
        tid,
        tgid,
        proc_index: 0,
        comm: Arc::from("t"),
        start_ticks: 100 + tid as u64,
        role,
        ml,
        gpus: Arc::from([0]),
        last_cpu: Some(0),
        delta: act.map(|a| {
            let busy_ns = (a.busy * INTERVAL as f64) as u64;
            ThreadDelta {
                interval_ns: INTERVAL,
                cpu_ns: busy_ns,
                runq_wait_ns: 0,
                timeslices: a.vol_per_sec / 10,
                detail: Some(DetailDelta {
                    interval_ns: INTERVAL,
                    voluntary_switches: a.vol_per_sec / 10,
                    involuntary_switches: a.invol_per_sec / 10,
                    read_bytes: a.read_per_sec / 10,
                }),
            }
        }),
        changes: Changes::NONE,
    }
}

fn snap(p: ProcessView, threads: Vec<ThreadView>) -> Snapshot {
    Snapshot { seq: 1, interval_ns: INTERVAL, processes: vec![p], threads, ..Default::default() }
}

fn one(cfg: &PhaseConfig, role: ThreadRole, gpu: Option<u32>, act: Act) -> Phase {
    let s = snap(process(10, true, gpu), vec![thread(11, 10, role, true, Some(act))]);
    classify(&s.threads[0], &s.processes[0], cfg).unwrap()
}

#[test]
fn no_switch_count_is_not_a_low_switch_count() {
    // A CPU-bound trainer whose GPU idles, but not read in detail this
    // interval (no status, so no voluntary switch count): not OptimizerStep.
    let c = PhaseConfig::default();
    let mut t = thread(11, 10, ThreadRole::Trainer, true, Some(Act { busy: 0.95, ..Act::default() }));
    if let Some(d) = t.delta.as_mut() {
        d.detail = None;
    }
    let s = snap(process(10, true, Some(0)), vec![t]);
    assert_eq!(classify(&s.threads[0], &s.processes[0], &c), Some(Phase::Unknown));
}

#[test]
fn each_phase_has_a_trigger() {
    let c = PhaseConfig::default();
    let spin_wait = Act { busy: 0.5, vol_per_sec: 2000, ..Act::default() };
    assert_eq!(one(&c, ThreadRole::NcclProgress, Some(80), spin_wait), Phase::NcclCollective);
    assert_eq!(one(&c, ThreadRole::NcclMonitor, None, spin_wait), Phase::NcclCollective);
    let decoding = Act { busy: 0.9, vol_per_sec: 20, ..Act::default() };
    assert_eq!(one(&c, ThreadRole::DataLoader, None, decoding), Phase::DataLoading);
    let reading = Act { busy: 0.05, vol_per_sec: 200, read_per_sec: 50 << 20, ..Act::default() };
    assert_eq!(one(&c, ThreadRole::PinMemory, Some(90), reading), Phase::DataLoading);
    assert_eq!(one(&c, ThreadRole::Trainer, Some(0), reading), Phase::DataLoading, "num_workers=0");
    let launching = Act { busy: 0.1, vol_per_sec: 300, ..Act::default() };
    assert_eq!(one(&c, ThreadRole::Trainer, Some(95), launching), Phase::GpuCompute);
    assert_eq!(one(&c, ThreadRole::Autograd, Some(95), launching), Phase::GpuCompute);
    let cpu_bound = Act { busy: 0.95, vol_per_sec: 5, ..Act::default() };
    assert_eq!(one(&c, ThreadRole::Trainer, Some(0), cpu_bound), Phase::OptimizerStep);
    // An NCCL thread starved by contention: few waits, many preemptions.
    let starved = Act { busy: 0.9, vol_per_sec: 30, invol_per_sec: 60, ..Act::default() };
    assert_eq!(one(&c, ThreadRole::NcclProgress, None, starved), Phase::NcclCollective);
}

#[test]
fn near_misses_stay_unknown() {
    let c = PhaseConfig::default();
    let cpu_bound = Act { busy: 0.95, vol_per_sec: 5, ..Act::default() };
    // GPU state unknown: cannot tell an optimizer step.
    assert_eq!(one(&c, ThreadRole::Trainer, None, cpu_bound), Phase::Unknown);
    // GPU half busy: neither busy nor idle.
    assert_eq!(one(&c, ThreadRole::Trainer, Some(20), cpu_bound), Phase::Unknown);
    // Blocking often: not an optimizer.
    let blocking = Act { busy: 0.95, vol_per_sec: 500, ..Act::default() };
    assert_eq!(one(&c, ThreadRole::Trainer, Some(0), blocking), Phase::Unknown);
    // An idle loader.
    assert_eq!(one(&c, ThreadRole::DataLoader, None, Act::default()), Phase::Unknown);
    // Spin/wait in an "Other" thread of a single-rank process is not a collective.
    let spin_wait = Act { busy: 0.5, vol_per_sec: 2000, ..Act::default() };
    assert_eq!(one(&c, ThreadRole::Other, None, spin_wait), Phase::Unknown);
    // ...but it is in a multi-rank one.
    let mut p = process(10, true, None);
    p.env.world_size = Some(8);
    let s = snap(p.clone(), vec![thread(11, 10, ThreadRole::Other, true, Some(spin_wait))]);
    assert_eq!(classify(&s.threads[0], &s.processes[0], &c), Some(Phase::NcclCollective));
    // ...unless it only gets preempted (a CPU-bound pool thread).
    let preempted = Act { busy: 1.0, invol_per_sec: 300, ..Act::default() };
    let s = snap(p, vec![thread(11, 10, ThreadRole::Other, true, Some(preempted))]);
    assert_eq!(classify(&s.threads[0], &s.processes[0], &c), Some(Phase::Unknown));
    // An idle NCCL watchdog waking every 100 ms.
    let watchdog = Act { busy: 0.001, vol_per_sec: 10, ..Act::default() };
    assert_eq!(one(&c, ThreadRole::NcclMonitor, None, watchdog), Phase::Unknown);
    // A busy GPU does not make helper threads compute.
    let launching = Act { busy: 0.1, vol_per_sec: 300, ..Act::default() };
    assert_eq!(one(&c, ThreadRole::Other, Some(95), launching), Phase::Unknown);
    // No sample: no candidate. Non-ML: Unknown.
    let s = snap(process(10, true, None), vec![thread(11, 10, ThreadRole::Trainer, true, None)]);
    assert_eq!(classify(&s.threads[0], &s.processes[0], &c), None);
    let s = snap(process(10, false, Some(100)), vec![thread(11, 10, ThreadRole::NonMl, false, Some(cpu_bound))]);
    assert_eq!(classify(&s.threads[0], &s.processes[0], &c), Some(Phase::Unknown));
    // A sample much shorter than the evaluation interval is ignored.
    let mut s = snap(process(10, true, Some(0)), vec![thread(11, 10, ThreadRole::Trainer, true, Some(cpu_bound))]);
    s.threads[0].delta.as_mut().unwrap().interval_ns = 10 * MS;
    assert_eq!(classify(&s.threads[0], &s.processes[0], &c), None);
}

fn trainer_snap(gpu: Option<u32>, act: Option<Act>) -> Snapshot {
    snap(process(10, true, gpu), vec![thread(10, 10, ThreadRole::Trainer, true, act)])
}

#[test]
fn hysteresis_needs_n_consecutive_intervals() {
    let cfg = PhaseConfig { phase_stability_count: 3, ..Default::default() };
    let mut d = PhaseDetector::new(cfg);
    let compute = || trainer_snap(Some(90), Some(Act { busy: 0.1, vol_per_sec: 300, ..Act::default() }));
    let optim = || trainer_snap(Some(0), Some(Act { busy: 0.95, ..Act::default() }));

    assert!(d.update(&compute()).is_empty());
    assert!(d.update(&compute()).is_empty());
    assert_eq!(d.phase(10), Phase::Unknown);
    // A sample-less pass neither adopts nor breaks the streak.
    assert!(d.update(&trainer_snap(Some(90), None)).is_empty());
    let ch = d.update(&compute());
    assert_eq!(
        ch,
        vec![PhaseChange { tid: 10, tgid: 10, start_ticks: 110, from: Phase::Unknown, to: Phase::GpuCompute }]
    );
    assert_eq!(d.phase(10), Phase::GpuCompute);

    // Two optimizer intervals, interrupted: no change.
    d.update(&optim());
    d.update(&optim());
    d.update(&compute());
    d.update(&optim());
    d.update(&optim());
    assert_eq!(d.phase(10), Phase::GpuCompute);
    let ch = d.update(&optim());
    assert_eq!(ch.len(), 1);
    assert_eq!((ch[0].from, ch[0].to), (Phase::GpuCompute, Phase::OptimizerStep));

    let st = d.stats();
    assert_eq!(st.transitions, 2);
    assert_eq!(st.entered[Phase::GpuCompute.index()], 1);
    assert_eq!(st.entered[Phase::OptimizerStep.index()], 1);
    assert_eq!(st.threads[Phase::OptimizerStep.index()], 1);
    // Time is charged to the phase held during each interval: 4 passes
    // Unknown, then 6 passes GpuCompute.
    assert_eq!(st.time_ns[Phase::Unknown.index()], 4 * INTERVAL);
    assert_eq!(st.time_ns[Phase::GpuCompute.index()], 6 * INTERVAL);
}

#[test]
fn stability_count_one_adopts_immediately() {
    let cfg = PhaseConfig { phase_stability_count: 1, ..Default::default() };
    let mut d = PhaseDetector::new(cfg);
    let ch = d.update(&trainer_snap(Some(90), Some(Act { busy: 0.1, vol_per_sec: 300, ..Act::default() })));
    assert_eq!(ch.len(), 1);
    assert_eq!(d.phase(10), Phase::GpuCompute);
}

#[test]
fn non_ml_gone_and_recycled_threads() {
    let cfg = PhaseConfig { phase_stability_count: 1, ..Default::default() };
    let mut d = PhaseDetector::new(cfg);
    let cpu_bound = Some(Act { busy: 0.95, ..Act::default() });
    // Non-ML threads are never tracked, whatever they do.
    let s = snap(process(20, false, Some(0)), vec![thread(20, 20, ThreadRole::NonMl, false, cpu_bound)]);
    assert!(d.update(&s).is_empty());
    assert_eq!(d.tracked(), 0);

    d.update(&trainer_snap(Some(0), cpu_bound));
    assert_eq!(d.phase(10), Phase::OptimizerStep);
    // The process stops being ML: back to Unknown at once.
    let mut s = trainer_snap(Some(0), cpu_bound);
    s.processes[0].ml = false;
    s.threads[0].ml = false;
    let ch = d.update(&s);
    assert_eq!(ch.len(), 1);
    assert_eq!(ch[0].to, Phase::Unknown);
    assert_eq!(d.tracked(), 0);

    // Gone threads are forgotten.
    d.update(&trainer_snap(Some(0), cpu_bound));
    assert_eq!(d.tracked(), 1);
    let mut s = trainer_snap(Some(0), None);
    s.threads.clear();
    s.gone.push(GoneThread { tid: 10, tgid: 10, start_ticks: 110 });
    d.update(&s);
    assert_eq!(d.tracked(), 0);
    assert_eq!(d.phase(10), Phase::Unknown);

    // A recycled tid (new start time: the observer reports it NEW) starts
    // over.
    d.update(&trainer_snap(Some(0), cpu_bound));
    let mut s = trainer_snap(Some(0), None);
    s.threads[0].start_ticks = 999;
    s.threads[0].changes = Changes::NEW;
    d.update(&s);
    assert_eq!(d.phase(10), Phase::Unknown);

    // Threads missing from snapshots without a gone entry are dropped too,
    // by the sweep every SWEEP_EVERY passes.
    d.update(&trainer_snap(Some(0), cpu_bound));
    assert_eq!(d.tracked(), 1);
    let mut s = trainer_snap(Some(0), None);
    s.threads.clear();
    for _ in 0..super::SWEEP_EVERY {
        d.update(&s);
    }
    assert_eq!(d.tracked(), 0);
}

#[test]
fn config_validation_names_the_key() {
    PhaseConfig::default().validate().unwrap();
    let c = PhaseConfig { phase_stability_count: 0, ..Default::default() };
    assert_eq!(c.validate().unwrap_err(), "phase.phase_stability_count must be >= 1");
    let c = PhaseConfig { gpu_idle_util_pct: 50, ..Default::default() };
    assert!(c.validate().unwrap_err().contains("phase.gpu_idle_util_pct"));
    let c = PhaseConfig { nccl_min_busy_frac: -0.1, ..Default::default() };
    assert!(c.validate().unwrap_err().contains("phase.nccl_min_busy_frac"));
    let c = PhaseConfig { nccl_min_switches_per_sec: f64::NAN, ..Default::default() };
    assert!(c.validate().unwrap_err().contains("phase.nccl_min_switches_per_sec"));
    let c = PhaseConfig { loop_interval_ms: 0, ..Default::default() };
    assert!(c.validate().unwrap_err().contains("phase.loop_interval_ms"));
    let parsed: PhaseConfig = toml::from_str("phase_stability_count = 4").unwrap();
    assert_eq!(parsed.phase_stability_count, 4);
    assert_eq!(parsed.gpu_busy_util_pct, 30);
    assert!(toml::from_str::<PhaseConfig>("phase_stabilty_count = 4").is_err());
    // The loop period's older name still reads, as the same key.
    let parsed: PhaseConfig = toml::from_str("phase_eval_interval_ms = 250").unwrap();
    assert_eq!(parsed.loop_interval_ms, 250);
}
