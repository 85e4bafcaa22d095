//! `[phase]`: how often phases are evaluated, the hysteresis, and the
//! thresholds of the heuristics.

use serde::{Deserialize, Serialize};

/// The `[phase]` section: evaluation period, hysteresis and the thresholds
/// of the heuristics (see classify.rs for how each is used).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PhaseConfig {
    /// Period (ms) of the daemon's observe -> phase -> policy loop. Samples
    /// covering less than half of it (a poll right after another) are too
    /// short to judge and are ignored. `phase_eval_interval_ms`, its older
    /// name, is read too.
    #[serde(alias = "phase_eval_interval_ms")]
    pub loop_interval_ms: u64,
    /// A new phase must be the candidate this many consecutive intervals
    /// before it is adopted.
    pub phase_stability_count: u32,
    /// A process's GPU counts as busy at or above this utilisation (%).
    pub gpu_busy_util_pct: u32,
    /// A process's GPU counts as idle at or below this utilisation (%).
    pub gpu_idle_util_pct: u32,
    /// DataLoading: a loader thread runnable at least this fraction of the
    /// interval (reading, decoding, collating)...
    pub loader_min_busy_frac: f64,
    /// ...or reading at least this many bytes per second.
    pub loader_min_read_bytes_per_sec: u64,
    /// DataLoading in the trainer itself (num_workers = 0): a trainer or
    /// other ML thread reading at least this many bytes per second while its
    /// GPU is not busy.
    pub inproc_load_min_read_bytes_per_sec: u64,
    /// OptimizerStep: trainer thread runnable at least this fraction of the
    /// interval, with an idle GPU...
    pub optimizer_min_busy_frac: f64,
    /// ...and at most this many voluntary context switches per second.
    pub optimizer_max_voluntary_per_sec: f64,
    /// NcclCollective: an NCCL thread (by name) with at least this many
    /// context switches per second (futex waits between spins; under CPU
    /// contention also preemptions, which count here), or another thread of
    /// a multi-rank process with this many *voluntary* switches per second...
    pub nccl_min_switches_per_sec: f64,
    /// ...and runnable at least this fraction of the interval (spinning).
    pub nccl_min_busy_frac: f64,
}

impl Default for PhaseConfig {
    fn default() -> Self {
        PhaseConfig {
            loop_interval_ms: 100,
            phase_stability_count: 2,
            gpu_busy_util_pct: 30,
            gpu_idle_util_pct: 10,
            loader_min_busy_frac: 0.2,
            loader_min_read_bytes_per_sec: 1 << 20,
            inproc_load_min_read_bytes_per_sec: 32 << 20,
            optimizer_min_busy_frac: 0.6,
            optimizer_max_voluntary_per_sec: 50.0,
            nccl_min_switches_per_sec: 50.0,
            nccl_min_busy_frac: 0.1,
        }
    }
}

impl PhaseConfig {
    pub fn validate(&self) -> Result<(), String> {
        let frac = |key: &str, v: f64| {
            if (0.0..=1.0).contains(&v) {
                Ok(())
            } else {
                Err(format!("phase.{key} must be within 0.0..=1.0"))
            }
        };
        if !(10..=60_000).contains(&self.loop_interval_ms) {
            return Err("phase.loop_interval_ms must be within 10..=60000".into());
        }
        if self.phase_stability_count < 1 {
            return Err("phase.phase_stability_count must be >= 1".into());
        }
        if self.phase_stability_count > 1000 {
            return Err("phase.phase_stability_count must be <= 1000".into());
        }
        if !(1..=100).contains(&self.gpu_busy_util_pct) {
            return Err("phase.gpu_busy_util_pct must be within 1..=100".into());
        }
        if self.gpu_idle_util_pct >= self.gpu_busy_util_pct {
            return Err("phase.gpu_idle_util_pct must be < phase.gpu_busy_util_pct".into());
        }
        frac("loader_min_busy_frac", self.loader_min_busy_frac)?;
        frac("optimizer_min_busy_frac", self.optimizer_min_busy_frac)?;
        frac("nccl_min_busy_frac", self.nccl_min_busy_frac)?;
        for (key, v) in [
            ("optimizer_max_voluntary_per_sec", self.optimizer_max_voluntary_per_sec),
            ("nccl_min_switches_per_sec", self.nccl_min_switches_per_sec),
        ] {
            if !v.is_finite() || v < 0.0 {
                return Err(format!("phase.{key} must be a finite number >= 0"));
            }
        }
        Ok(())
    }
}
