//! The candidate phase of one thread in one interval.
//!
//! Signals (all from the observer's snapshot):
//!
//! * `busy`: fraction of the interval the thread was runnable, on CPU or
//!   waiting for one (schedstat). Unlike on-CPU time it stays high for a
//!   CPU-bound thread on a contended machine.
//! * `vol/s`: voluntary context switches per second (status): each is a
//!   block (futex, I/O, sleep); `sw/s` adds the involuntary ones
//!   (preemptions, sched_yield).
//! * `read/s`: bytes read through syscalls per second (io rchar).
//! * GPU: the process's utilisation (per-process from NVML/file, else its
//!   visible devices), busy >= `gpu_busy_util_pct`, idle <= `gpu_idle_util_pct`.
//! * role (observe::roles) and the process's rank evidence.
//!
//! Rules, first match wins:
//!
//! ```text
//!  not ML ─────────────────────────────────────────────────────> Unknown
//!  no fresh sample ────────────────────────────────────────────> (no candidate)
//!  NCCL-named thread with sw/s >= nccl_min_switches_per_sec, or
//!    Other thread of a multi-rank process with vol/s >= it;
//!    and busy >= nccl_min_busy_frac ───────────────────────────> NcclCollective
//!  loader role, busy >= loader_min_busy or read/s >= loader_min ─> DataLoading
//!  trainer/other, GPU not busy, read/s >= inproc_load_min ──────> DataLoading
//!  trainer/autograd, GPU busy ──────────────────────────────────> GpuCompute
//!  trainer/autograd, GPU idle, busy >= optimizer_min_busy,
//!    vol/s <= optimizer_max_voluntary_per_sec ─────────────────> OptimizerStep
//!  otherwise ──────────────────────────────────────────────────> Unknown
//! ```
//! Why these are reachable on a live system: NCCL's proxy thread polls its
//! work queue during a collective, yielding and sleeping on a futex between
//! operations (hundreds to thousands of switches per second, a good share
//! of a CPU), and is idle otherwise; DataLoader workers read files and burn CPU decoding; the trainer
//! launches kernels while the GPU is busy (NVML says so); and the optimizer
//! step is the stretch where the trainer computes on the CPU (or only
//! launches tiny kernels in a tight loop) while the GPU sits idle.
//! Without GPU data (no NVML, no file) GpuCompute and OptimizerStep cannot
//! be told apart from other trainer work and are not reported.

use super::{Phase, PhaseConfig};
use crate::observe::{MlEvidence, ProcessView, ThreadRole, ThreadView};

/// The candidate phase of `t` (a thread of `p`), or None when the snapshot
/// carries no fresh sample for it.
pub fn classify(t: &ThreadView, p: &ProcessView, cfg: &PhaseConfig) -> Option<Phase> {
    if !t.ml {
        return Some(Phase::Unknown);
    }
    let d = t.delta?;
    // Too short to judge (a poll right after another).
    if d.interval_ns < cfg.loop_interval_ms * 1_000_000 / 2 {
        return None;
    }
    let busy = d.busy_frac();
    let vol_per_sec = d.detail.map_or(0.0, |x| x.voluntary_per_sec());
    let read_per_sec = d.detail.map_or(0.0, |x| x.read_bytes_per_sec());
    let gpu_busy = p.gpu.util_pct.is_some_and(|u| u >= cfg.gpu_busy_util_pct);
    let gpu_idle = p.gpu.util_pct.is_some_and(|u| u <= cfg.gpu_idle_util_pct);
    let multi_rank = p.env.world_size.is_some_and(|w| w > 1) || p.evidence.contains(MlEvidence::COLLECTIVE_LIBRARY);
    let role = t.role;
    let driver = matches!(role, ThreadRole::Trainer | ThreadRole::Autograd);

    let all_switches_per_sec = d.detail.map_or(0.0, |x| x.voluntary_per_sec() + x.involuntary_per_sec());
    let spin_wait = if role.is_collective() {
        all_switches_per_sec >= cfg.nccl_min_switches_per_sec
    } else {
        role == ThreadRole::Other && multi_rank && vol_per_sec >= cfg.nccl_min_switches_per_sec
    };
    if spin_wait && busy >= cfg.nccl_min_busy_frac {
        return Some(Phase::NcclCollective);
    }
    if role.is_loader()
        && (busy >= cfg.loader_min_busy_frac || read_per_sec >= cfg.loader_min_read_bytes_per_sec as f64)
    {
        return Some(Phase::DataLoading);
    }
    if matches!(role, ThreadRole::Trainer | ThreadRole::Other)
        && !gpu_busy
        && read_per_sec >= cfg.inproc_load_min_read_bytes_per_sec as f64
    {
        return Some(Phase::DataLoading);
    }
    if driver && gpu_busy {
        return Some(Phase::GpuCompute);
    }
    // An upper bound on switches needs a measured count: a thread not read in
    // detail this interval has none, which is not "no switches".
    if driver
        && gpu_idle
        && busy >= cfg.optimizer_min_busy_frac
        && d.detail.is_some()
        && vol_per_sec <= cfg.optimizer_max_voluntary_per_sec
    {
        return Some(Phase::OptimizerStep);
    }
    Some(Phase::Unknown)
}
