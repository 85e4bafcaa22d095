//! Per-thread ML phase detection with hysteresis.
//!
//! Each pass, every thread of an ML process gets a *candidate* phase from
//! its deltas, its role and its process's GPU use (classify.rs); a candidate
//! becomes the thread's phase only after `phase_stability_count`
//! consecutive intervals:
//!
//! ```text
//!  snapshot ──> classify(thread, process) ──> candidate
//!                                               │
//!     candidate == phase ────────────────────> stay, streak = 0
//!     candidate == pending ──> streak += 1 ──> streak >= N ? adopt (PhaseChange)
//!     otherwise ─────────────> pending = candidate, streak = 1
//! ```
//! A thread without a fresh sample (quiet thread between samples, first
//! sight) gives no candidate and keeps its phase and streak. Threads of
//! non-ML processes are always [`Phase::Unknown`] and are not tracked (they
//! cost nothing per pass). A thread that stops being ML goes back to
//! Unknown at once (with a PhaseChange). Gone threads are forgotten
//! silently; a recycled tid (new start time) starts over.
//!
//! The detector also keeps, for stats, how many threads are in each phase,
//! how many transitions into each phase happened, and the thread-time spent
//! in each phase.

mod classify;
#[cfg(test)]
mod tests;

use rustc_hash::FxHashMap;
use std::fmt;

use crate::config::PhaseConfig;
use crate::observe::Snapshot;
pub use classify::classify;

/// What an ML thread is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Phase {
    /// Reading and decoding input (DataLoader workers, pin memory).
    DataLoading,
    /// Driving the GPU: launching kernels and waiting for them.
    GpuCompute,
    /// Taking part in a collective (all-reduce): spin/wait cycles.
    NcclCollective,
    /// CPU-bound optimizer step while the GPU idles.
    OptimizerStep,
    /// None of the above, or not an ML thread.
    #[default]
    Unknown,
}

impl Phase {
    /// The number of phases: the size of per-phase arrays.
    pub(crate) const COUNT: usize = 5;

    /// Position in per-phase arrays (`0..COUNT`).
    pub fn index(self) -> usize {
        self as usize
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::DataLoading => "data_loading",
            Phase::GpuCompute => "gpu_compute",
            Phase::NcclCollective => "nccl_collective",
            Phase::OptimizerStep => "optimizer_step",
            Phase::Unknown => "unknown",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A thread's adopted phase changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PhaseChange {
    pub tid: i32,
    pub tgid: i32,
    /// Start time of the thread (USER_HZ ticks), for the BPF map entry.
    pub start_ticks: u64,
    pub from: Phase,
    pub to: Phase,
}

/// Counters for stats, indexed by [`Phase::index`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PhaseStats {
    /// Tracked (ML) threads currently in each phase.
    pub threads: [u64; Phase::COUNT],
    /// Transitions into each phase since start.
    pub entered: [u64; Phase::COUNT],
    /// All transitions since start.
    pub transitions: u64,
    /// Thread-time (ns) spent in each phase since start.
    pub time_ns: [u64; Phase::COUNT],
}

impl PhaseStats {
    /// Tracked threads currently in `phase`.
    pub(crate) fn threads_in(&self, phase: Phase) -> u64 {
        self.threads[phase.index()]
    }
}

#[derive(Debug, Clone, Copy)]
struct Track {
    tgid: i32,
    start_ticks: u64,
    phase: Phase,
    pending: Phase,
    streak: u32,
    seen: u64,
}

/// Every this many passes the detector looks at every thread, not only
/// those with news, and drops tracks of threads that are gone.
const SWEEP_EVERY: u64 = 10;

/// Tracks the phase of every ML thread.
#[derive(Debug)]
pub struct PhaseDetector {
    cfg: PhaseConfig,
    tracks: FxHashMap<i32, Track>,
    stats: PhaseStats,
    generation: u64,
}

impl PhaseDetector {
    pub fn new(cfg: PhaseConfig) -> PhaseDetector {
        PhaseDetector { cfg, tracks: FxHashMap::default(), stats: PhaseStats::default(), generation: 0 }
    }

    /// The adopted phase of a thread (Unknown when not tracked).
    pub fn phase(&self, tid: i32) -> Phase {
        self.tracks.get(&tid).map_or(Phase::Unknown, |t| t.phase)
    }

    pub fn stats(&self) -> &PhaseStats {
        &self.stats
    }

    /// Number of tracked (ML) threads.
    #[cfg(test)]
    pub(crate) fn tracked(&self) -> usize {
        self.tracks.len()
    }

    fn adopt(stats: &mut PhaseStats, tid: i32, t: &mut Track, to: Phase, out: &mut Vec<PhaseChange>) {
        out.push(PhaseChange { tid, tgid: t.tgid, start_ticks: t.start_ticks, from: t.phase, to });
        stats.entered[to.index()] += 1;
        stats.transitions += 1;
        t.phase = to;
        t.streak = 0;
    }

    /// Feeds one snapshot; returns the phase changes it caused.
    ///
    /// Only threads with something new (a sample, a change) are looked at;
    /// every [`SWEEP_EVERY`] passes all are, and tracks of threads no
    /// longer in the snapshot or no longer ML are dropped.
    pub fn update(&mut self, snap: &Snapshot) -> Vec<PhaseChange> {
        self.generation += 1;
        let generation = self.generation;
        let sweep = generation % SWEEP_EVERY == 1;
        let mut out = Vec::new();
        for g in &snap.gone {
            if self.tracks.get(&g.tid).is_some_and(|t| t.start_ticks == g.start_ticks) {
                self.tracks.remove(&g.tid);
            }
        }
        // Time is charged to the phase each thread held during the interval.
        for (p, n) in self.stats.threads.iter().enumerate() {
            self.stats.time_ns[p] += n * snap.interval_ns;
        }
        let need = self.cfg.phase_stability_count.max(1);
        // (Threads of untouched processes hold no delta and no change.)
        let visit = snap.threads_to_visit(sweep, &[]);
        for t in visit.into_iter().flat_map(|r| &snap.threads[r]) {
            if !sweep && t.delta.is_none() && t.changes.is_empty() {
                continue;
            }
            if !t.ml {
                // One that stopped being ML (forced off, exec) is Unknown at
                // once.
                if let Some(mut tr) = self.tracks.remove(&t.tid) {
                    if tr.phase != Phase::Unknown {
                        Self::adopt(&mut self.stats, t.tid, &mut tr, Phase::Unknown, &mut out);
                    }
                }
                continue;
            }
            let fresh = Track {
                tgid: t.tgid,
                start_ticks: t.start_ticks,
                phase: Phase::Unknown,
                pending: Phase::Unknown,
                streak: 0,
                seen: generation,
            };
            let tr = self.tracks.entry(t.tid).or_insert_with(|| {
                self.stats.time_ns[Phase::Unknown.index()] += snap.interval_ns;
                fresh
            });
            if tr.start_ticks != t.start_ticks {
                *tr = fresh;
            }
            tr.seen = generation;
            let Some(cand) = classify(t, snap.process_of(t), &self.cfg) else {
                continue;
            };
            if cand == tr.phase {
                tr.streak = 0;
                continue;
            }
            if cand == tr.pending && tr.streak > 0 {
                tr.streak += 1;
            } else {
                tr.pending = cand;
                tr.streak = 1;
            }
            if tr.streak >= need {
                Self::adopt(&mut self.stats, t.tid, tr, cand, &mut out);
            }
        }
        // Threads no longer ML go back to Unknown at once; threads that
        // vanished without being reported gone are dropped too.
        if sweep {
            let stats = &mut self.stats;
            self.tracks.retain(|&tid, t| {
                if t.seen == generation {
                    return true;
                }
                if t.phase != Phase::Unknown {
                    Self::adopt(stats, tid, t, Phase::Unknown, &mut out);
                }
                false
            });
        }
        self.stats.threads = [0; Phase::COUNT];
        for t in self.tracks.values() {
            self.stats.threads[t.phase.index()] += 1;
        }
        out
    }
}
