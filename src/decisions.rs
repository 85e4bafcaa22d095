//! The decision diff: what the pipeline decided against what the
//! task_class map holds, so that only changed entries are written.
//!
//! ```text
//!   Pipeline::changed ──> Decisions::apply ──write (new or different)──> DecisionSink
//!                                          └─remove (thread gone, or no decision)─┘
//!   DecisionSink: the task_class map (Scheduler), or nothing (observe, benchmarks)
//! ```

use rustc_hash::FxHashMap;

use crate::policy::Decision;
use crate::sched::{self, Scheduler, WriteError};

/// Where decisions go: the task_class map (a [`Scheduler`]), or nowhere
/// (benchmarks, observe mode).
pub trait DecisionSink {
    fn write(&self, tid: u32, start_ticks: u64, d: &Decision) -> Result<(), WriteError>;
    fn remove(&self, tid: u32);
}

impl DecisionSink for Scheduler<'_> {
    fn write(&self, tid: u32, start_ticks: u64, d: &Decision) -> Result<(), WriteError> {
        Scheduler::write(self, tid, start_ticks, d)
    }
    fn remove(&self, tid: u32) {
        Scheduler::remove(self, tid)
    }
}

/// The decisions currently in the map, to write only what changes.
#[derive(Default)]
pub struct Decisions {
    /// tid -> (start time, decision, pass that last decided it)
    held: FxHashMap<u32, (u64, Decision, u64)>,
    pass: u64,
}

impl Decisions {
    /// Writes what changed; forgets what is gone. Returns (written, full).
    pub fn apply(&mut self, sink: &impl DecisionSink, decided: &[(u32, u64, Decision)]) -> (u64, u64) {
        let (mut written, mut full) = (0, 0);
        self.pass += 1;
        let pass = self.pass;
        for (tid, start, d) in decided {
            if let Some(h) = self.held.get_mut(tid) {
                if (h.0, h.1) == (*start, *d) {
                    h.2 = pass;
                    continue;
                }
            }
            match sink.write(*tid, *start, d) {
                Ok(()) => {
                    self.held.insert(*tid, (*start, *d, pass));
                    written += 1;
                }
                Err(WriteError::Full) => full += 1,
                Err(e) => sched::warn_write(*tid, &e),
            }
        }
        // Threads that lost their decision (phase back to Unknown) or
        // vanished. exit_task deletes the entry of an exiting thread, but a
        // thread that exited between the observer's pass and our write got
        // its entry after exit_task ran: delete in both cases.
        self.held.retain(|tid, h| {
            let keep = h.2 == pass;
            if !keep {
                sink.remove(*tid);
            }
            keep
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
