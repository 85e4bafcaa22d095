//! What the kernel reports through the scheduler's ring buffer (main.bpf.c's
//! `struct zernel_event`): GPU device opens and process events (fork, exec,
//! exit, thread renames, cgroup moves). sched.rs decodes them; the observer
//! and the pipeline take them.

/// A GPU device open the kernel saw (the first of its process).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuOpen {
    pub pid: u32,
    pub tid: u32,
    pub major: u32,
    pub minor: u32,
    pub start_ticks: u64,
}

/// What the kernel told of a process (the scheduler's process events).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcEventKind {
    /// Forked.
    New,
    /// Exec'd another program.
    Exec,
    /// Its leader exited.
    Exit,
    /// Its thread `tid` was renamed.
    Rename,
    /// It (or its thread `tid`) moved to another cgroup.
    CgroupMove,
}

/// A process event: `pid` (its tgid), started at `start_ticks` (USER_HZ);
/// `tid` is the thread the event is about (renamed, moved, forked...).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcEvent {
    pub kind: ProcEventKind,
    pub pid: i32,
    pub tid: i32,
    pub start_ticks: u64,
}
