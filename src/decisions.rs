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

use crate::pipeline::Change;
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
    /// tid -> the entry in the map.
    held: FxHashMap<u32, Entry>,
    /// tid -> the entry not written yet.
    pending: FxHashMap<u32, Entry>,
}

/// A thread's entry: its start time (USER_HZ ticks) and its decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    start_ticks: u64,
    decision: Decision,
}

impl Decisions {
    /// Applies the pipeline's changes (see
    /// [`Pipeline::changed`](crate::pipeline::Pipeline::changed)): writes
    /// a new or different decision, removes a withdrawn one, and retries
    /// the writes that failed before. Returns (written, full).
    pub fn apply(&mut self, sink: &impl DecisionSink, changed: &[Change]) -> (u64, u64) {
        let (mut written, mut full) = (0, 0);
        for c in changed {
            match c.decision {
                Some(decision) => {
                    let e = Entry { start_ticks: c.start_ticks, decision };
                    if self.held.get(&c.tid) != Some(&e) {
                        self.pending.insert(c.tid, e);
                    }
                }
                None => {
                    self.pending.remove(&c.tid);
                    // exit_task deletes the entry of an exiting thread, but a
                    // thread that exited between the observer's pass and our
                    // write got its entry after exit_task ran: delete anyway.
                    if self.held.remove(&c.tid).is_some() {
                        sink.remove(c.tid);
                    }
                }
            }
        }
        let held = &mut self.held;
        self.pending.retain(|tid, e| match sink.write(*tid, e.start_ticks, &e.decision) {
            Ok(()) => {
                held.insert(*tid, *e);
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
