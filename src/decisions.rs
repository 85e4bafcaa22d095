//! The decision diff: what the pipeline decided against what the
//! task_class map holds, so that only changed entries are written.
//!
//! ```text
//!   Pipeline::changed ──> Decisions::apply ──write (new or different)──> DecisionSink
//!                                          └─remove (thread gone, or no decision)─┘
//!   DecisionSink: the task_class map (Scheduler), or nothing (observe, benchmarks)
//! ```

use rustc_hash::FxHashMap;
use tracing::warn;

use crate::policy::Decision;

/// Where decisions go: the task_class map (sched.rs's `Scheduler`), or
/// nowhere (benchmarks, observe mode).
pub trait DecisionSink {
    fn write(&self, tid: u32, start_ticks: u64, d: &Decision) -> Result<(), WriteError>;
    fn remove(&self, tid: u32);
}

/// Why a decision did not reach the map.
#[derive(Debug, PartialEq, Eq)]
pub enum WriteError {
    /// The map is at capacity (E2BIG): the thread keeps the default class.
    Full,
    Other(String),
}

/// Logs that a write failed for a reason other than a full map.
fn warn_write(tid: u32, e: &WriteError) {
    if let WriteError::Other(msg) = e {
        warn!("task_class update for tid {tid} failed: {msg}");
    }
}

/// The decisions currently in the map, and those whose write failed (the
/// map was full): retried every pass until written or withdrawn.
#[derive(Default)]
pub struct Decisions {
    /// tid -> (start time, decision) in the map.
    held: FxHashMap<u32, (u64, Decision)>,
    /// tid -> (start time, decision) not written yet.
    pending: FxHashMap<u32, (u64, Decision)>,
}

impl Decisions {
    /// Applies the pipeline's changes (see
    /// [`Pipeline::changed`](crate::pipeline::Pipeline::changed)): writes
    /// a new or different decision, removes a withdrawn one, and retries
    /// the writes that failed before. Returns (written, full).
    pub fn apply(&mut self, sink: &impl DecisionSink, changed: &[(u32, u64, Option<Decision>)]) -> (u64, u64) {
        let (mut written, mut full) = (0, 0);
        for (tid, start, d) in changed {
            match d {
                Some(d) => {
                    if self.held.get(tid) != Some(&(*start, *d)) {
                        self.pending.insert(*tid, (*start, *d));
                    }
                }
                None => {
                    self.pending.remove(tid);
                    // exit_task deletes the entry of an exiting thread, but a
                    // thread that exited between the observer's pass and our
                    // write got its entry after exit_task ran: delete anyway.
                    if self.held.remove(tid).is_some() {
                        sink.remove(*tid);
                    }
                }
            }
        }
        let held = &mut self.held;
        self.pending.retain(|tid, (start, d)| match sink.write(*tid, *start, d) {
            Ok(()) => {
                held.insert(*tid, (*start, *d));
                written += 1;
                false
            }
            Err(WriteError::Full) => {
                full += 1;
                true
            }
            Err(e) => {
                warn_write(*tid, &e);
                true
            }
        });
        (written, full)
    }

    /// Entries held in the map.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}
