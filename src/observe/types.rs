//! The value types of a [`Snapshot`]: what one observer pass hands to the
//! phase detector, the rules engine and the policy.
//!
//! A snapshot is a plain table: `processes` sorted by pid and `threads`
//! sorted by (tgid, tid), each thread pointing at its process by index.
//! Strings that rarely change (comm, cmdline, cgroup) are `Arc<str>`, so a
//! pass copies pointers, not text.

use std::fmt;
use std::sync::Arc;

/// USER_HZ: the unit of `start_ticks` and of a process's CPU time in stat.
pub const USER_HZ: u64 = crate::bpf_intf::zernel_consts_ZERNEL_USER_HZ as u64;
pub(crate) const NS_PER_TICK: u64 = 1_000_000_000 / USER_HZ;

/// Converts USER_HZ ticks to nanoseconds.
pub(crate) fn ticks_to_ns(ticks: u64) -> u64 {
    ticks.saturating_mul(NS_PER_TICK)
}

/// What a thread does for the training job, from its name and its process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ThreadRole {
    /// A thread of a process that is not ML.
    NonMl,
    /// The main thread of an ML process: runs the training loop (or serves
    /// requests), launches kernels, usually runs the optimizer.
    Trainer,
    /// `pt_autograd_*`: the backward pass.
    Autograd,
    /// A DataLoader worker (`pt_data_worker`) or any thread of a DataLoader
    /// worker process.
    DataLoader,
    /// `pt_data_pin`: the pin-memory thread.
    PinMemory,
    /// NCCL's proxy progress thread (`NCCL Progress*`, needs NCCL_SET_THREAD_NAME=1).
    NcclProgress,
    /// NCCL's other named threads (`NCCL Service*`, `NCCL UDS*`, ...).
    NcclService,
    /// PyTorch's NCCL monitor threads (`pt_nccl_watchdg`, `pt_nccl_heartbt`).
    NcclMonitor,
    /// The gloo backend's collective threads: ProcessGroupGloo's workers
    /// (`pt_gloo_runloop`) and its TCP transport loop (`gloo_tcp_loop`).
    Gloo,
    /// Any other thread of an ML process.
    Other,
}

impl ThreadRole {
    /// Stable lower-case name, for logs and stats.
    pub fn as_str(self) -> &'static str {
        match self {
            ThreadRole::NonMl => "non_ml",
            ThreadRole::Trainer => "trainer",
            ThreadRole::Autograd => "autograd",
            ThreadRole::DataLoader => "data_loader",
            ThreadRole::PinMemory => "pin_memory",
            ThreadRole::NcclProgress => "nccl_progress",
            ThreadRole::NcclService => "nccl_service",
            ThreadRole::NcclMonitor => "nccl_monitor",
            ThreadRole::Gloo => "gloo",
            ThreadRole::Other => "other",
        }
    }

    /// A thread that works for the collective layer (NCCL/RCCL, gloo).
    pub(crate) fn is_collective(self) -> bool {
        matches!(self, ThreadRole::NcclProgress | ThreadRole::NcclService | ThreadRole::NcclMonitor | ThreadRole::Gloo)
    }

    /// A thread that feeds data (loader worker or pin-memory).
    pub(crate) fn is_loader(self) -> bool {
        matches!(self, ThreadRole::DataLoader | ThreadRole::PinMemory)
    }
}

impl fmt::Display for ThreadRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a process is considered ML. A small bit set; see the constants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct MlEvidence(u16);

impl MlEvidence {
    /// An fd to a GPU device (`/dev/nvidia*`, `/dev/kfd`, `/dev/dri/renderD*`).
    pub(crate) const DEVICE_FD: MlEvidence = MlEvidence(1 << 0);
    /// A GPU device file mapped in memory.
    pub(crate) const DEVICE_MAP: MlEvidence = MlEvidence(1 << 1);
    /// A GPU runtime or ML library mapped (libcuda, libcudart, libtorch_cuda...).
    pub(crate) const GPU_LIBRARY: MlEvidence = MlEvidence(1 << 2);
    /// A collective library mapped (libnccl, librccl).
    pub(crate) const COLLECTIVE_LIBRARY: MlEvidence = MlEvidence(1 << 3);
    /// A distributed-training variable in the environment (RANK, LOCAL_RANK, WORLD_SIZE).
    pub const ENV_RANK: MlEvidence = MlEvidence(1 << 4);
    /// CUDA_VISIBLE_DEVICES (or another configured variable) in the environment.
    pub(crate) const ENV_DEVICES: MlEvidence = MlEvidence(1 << 5);
    /// The GPU provider lists the process as a GPU user.
    pub(crate) const GPU_PROCESS: MlEvidence = MlEvidence(1 << 6);
    /// The parent (or an ancestor) is ML: DataLoader workers and the like.
    pub(crate) const PARENT: MlEvidence = MlEvidence(1 << 7);
    /// Forced by [`crate::observe::Observer::set_forced_ml`] (rules engine).
    pub(crate) const FORCED: MlEvidence = MlEvidence(1 << 8);
    /// The kernel saw the process open a GPU device (a ring buffer event of
    /// the BPF side), even one whose fd is gone or whose open failed.
    pub(crate) const DEVICE_OPEN: MlEvidence = MlEvidence(1 << 9);

    const NAMES: [(MlEvidence, &'static str); 10] = [
        (Self::DEVICE_FD, "device_fd"),
        (Self::DEVICE_MAP, "device_map"),
        (Self::GPU_LIBRARY, "gpu_library"),
        (Self::COLLECTIVE_LIBRARY, "collective_library"),
        (Self::ENV_RANK, "env_rank"),
        (Self::ENV_DEVICES, "env_devices"),
        (Self::GPU_PROCESS, "gpu_process"),
        (Self::PARENT, "parent"),
        (Self::FORCED, "forced"),
        (Self::DEVICE_OPEN, "device_open"),
    ];

    pub(crate) const NONE: MlEvidence = MlEvidence(0);

    pub fn contains(self, other: MlEvidence) -> bool {
        self.0 & other.0 == other.0 && other.0 != 0
    }

    pub(crate) fn intersects(self, other: MlEvidence) -> bool {
        self.0 & other.0 != 0
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub(crate) fn bits(self) -> u16 {
        self.0
    }

    /// Evidence the process carries itself (not inherited, not forced).
    pub fn own(self) -> MlEvidence {
        MlEvidence(self.0 & !(Self::PARENT.0 | Self::FORCED.0))
    }

    /// Names of the set bits, e.g. `["device_fd", "env_rank"]`.
    pub fn names(self) -> Vec<&'static str> {
        Self::NAMES.iter().filter(|(bit, _)| self.contains(*bit)).map(|(_, name)| *name).collect()
    }
}

impl std::ops::BitOr for MlEvidence {
    type Output = MlEvidence;
    fn bitor(self, rhs: MlEvidence) -> MlEvidence {
        MlEvidence(self.0 | rhs.0)
    }
}

impl std::ops::BitOrAssign for MlEvidence {
    fn bitor_assign(&mut self, rhs: MlEvidence) {
        self.0 |= rhs.0;
    }
}

impl fmt::Display for MlEvidence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("none");
        }
        f.write_str(&self.names().join(","))
    }
}

/// What changed about a process or thread in this pass. Rules are evaluated
/// when this is non-empty, not on every pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Changes(u8);

impl Changes {
    pub(crate) const NONE: Changes = Changes(0);
    /// First seen in this pass.
    pub const NEW: Changes = Changes(1 << 0);
    /// comm changed (prctl/pthread_setname_np).
    pub(crate) const RENAMED: Changes = Changes(1 << 1);
    /// The process executed a new program (/proc/pid/exe changed).
    pub(crate) const EXEC: Changes = Changes(1 << 2);
    /// The process moved to another cgroup.
    pub(crate) const CGROUP: Changes = Changes(1 << 3);
    /// The ML flag (or the evidence behind it) changed.
    pub const ML: Changes = Changes(1 << 4);
    /// The parent changed (re-parented to a subreaper or init).
    pub(crate) const PARENT: Changes = Changes(1 << 5);
    /// The thread's role changed (its process became or stopped being a
    /// DataLoader process).
    pub(crate) const ROLE: Changes = Changes(1 << 6);

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn contains(self, other: Changes) -> bool {
        self.0 & other.0 == other.0 && other.0 != 0
    }
}

impl std::ops::BitOr for Changes {
    type Output = Changes;
    fn bitor(self, rhs: Changes) -> Changes {
        Changes(self.0 | rhs.0)
    }
}

impl std::ops::BitOrAssign for Changes {
    fn bitor_assign(&mut self, rhs: Changes) {
        self.0 |= rhs.0;
    }
}

/// Distributed-training settings read from a process environment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MlEnv {
    pub rank: Option<u32>,
    pub local_rank: Option<u32>,
    pub world_size: Option<u32>,
    /// CUDA_VISIBLE_DEVICES (or HIP/ROCR_VISIBLE_DEVICES) as written.
    pub visible_devices: Option<Arc<str>>,
}

/// GPU usage of one process, joined from the GPU provider and the
/// process's visible devices.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessGpu {
    /// Device indices (GPU provider numbering) the process uses or may use.
    pub devices: Arc<[u32]>,
    /// Utilisation the process causes (SM %), from the per-process list when
    /// the provider has it, else the busiest of `devices`. None: unknown.
    pub util_pct: Option<u32>,
    /// True when `util_pct` came from the per-process list.
    pub per_process: bool,
}

/// One process, ML or not. Every process is listed: the rules engine needs
/// comm, cmdline, cgroup, uid, gid and parent comm of each.
#[derive(Debug, Clone)]
pub struct ProcessView {
    pub pid: i32,
    pub ppid: i32,
    /// Start time in USER_HZ ticks since boot (with pid, the identity).
    pub start_ticks: u64,
    pub comm: Arc<str>,
    /// Arguments joined by spaces (capped at 4 KiB). Empty for kernel threads.
    pub cmdline: Arc<str>,
    /// Target of /proc/pid/exe, empty when unreadable.
    pub exe: Arc<str>,
    /// Effective uid and gid.
    pub uid: u32,
    pub gid: u32,
    /// cgroup v2 path ("0::" line of /proc/pid/cgroup), empty if none.
    pub cgroup: Arc<str>,
    pub parent_comm: Arc<str>,
    pub kernel_thread: bool,
    /// The process is treated as ML (own evidence, inherited or forced).
    pub ml: bool,
    pub evidence: MlEvidence,
    /// The first piece of evidence found, e.g. "fd /dev/nvidiactl".
    pub evidence_detail: Arc<str>,
    pub env: MlEnv,
    /// A DataLoader-like child of an ML process (all its threads are loaders).
    pub loader_process: bool,
    pub gpu: ProcessGpu,
    pub nr_threads: u32,
    /// What changed in this pass (NEW, EXEC, RENAMED, CGROUP, ML, PARENT).
    pub changes: Changes,
}

/// Counters of one thread since its previous sample. Counters from stat,
/// status and io are only read when the thread was active (see the module
/// doc), so they sit in `detail` with their own interval.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ThreadDelta {
    /// Wall time covered by `cpu_ns`, `runq_wait_ns`, `timeslices`.
    pub interval_ns: u64,
    /// Time on CPU (schedstat field 1).
    pub cpu_ns: u64,
    /// Time runnable but waiting for a CPU (schedstat field 2).
    pub runq_wait_ns: u64,
    /// Times scheduled onto a CPU (schedstat field 3).
    pub timeslices: u64,
    /// Counters that need stat/status/io, present when read in this pass.
    pub detail: Option<DetailDelta>,
}

impl ThreadDelta {
    /// Fraction of the interval the thread was runnable (on CPU or queued).
    /// Robust to CPU contention, unlike the on-CPU fraction alone.
    pub(crate) fn busy_frac(&self) -> f64 {
        if self.interval_ns == 0 {
            return 0.0;
        }
        ((self.cpu_ns + self.runq_wait_ns) as f64 / self.interval_ns as f64).min(1.0)
    }
}

/// Counters from stat, status and io, over `interval_ns` (since the previous
/// detailed read of the thread).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DetailDelta {
    pub interval_ns: u64,
    pub voluntary_switches: u64,
    pub involuntary_switches: u64,
    /// Bytes read through syscalls (rchar: files, pipes, sockets).
    pub read_bytes: u64,
}

impl DetailDelta {
    fn per_sec(&self, v: u64) -> f64 {
        if self.interval_ns == 0 {
            return 0.0;
        }
        v as f64 * 1e9 / self.interval_ns as f64
    }

    pub(crate) fn voluntary_per_sec(&self) -> f64 {
        self.per_sec(self.voluntary_switches)
    }

    pub(crate) fn involuntary_per_sec(&self) -> f64 {
        self.per_sec(self.involuntary_switches)
    }

    pub(crate) fn read_bytes_per_sec(&self) -> f64 {
        self.per_sec(self.read_bytes)
    }
}

/// One thread. Threads of non-ML processes are listed too (with `delta`
/// None): the rules engine needs their names when they appear or change.
#[derive(Debug, Clone)]
pub struct ThreadView {
    pub tid: i32,
    pub tgid: i32,
    /// Index of the thread's process in [`Snapshot::processes`].
    pub proc_index: usize,
    pub comm: Arc<str>,
    /// Start time in USER_HZ ticks (field 22 of stat): the BPF task_class
    /// entry of this thread must carry it.
    pub start_ticks: u64,
    pub role: ThreadRole,
    /// Copy of the process's ML flag.
    pub ml: bool,
    /// GPUs of the process (copy of its `gpu.devices`).
    pub gpus: Arc<[u32]>,
    /// CPU it last ran on (field 39 of stat), at its last detailed read.
    pub last_cpu: Option<u32>,
    /// Counters since the previous sample; None when not sampled in this
    /// pass (non-ML threads, first sight, quiet threads between samples).
    pub delta: Option<ThreadDelta>,
    /// NEW or RENAMED in this pass, ML when its process's ML flag changed, ROLE when its role did.
    pub changes: Changes,
}

impl ThreadView {
    /// Becomes a copy of `src` (the same thread), sharing a name already
    /// shared instead of cloning it. The process's fields (`proc_index`,
    /// `ml`, `gpus`) are left to the caller, which sets them from the
    /// process.
    pub(crate) fn update_from(&mut self, src: &ThreadView) {
        // Exhaustive: a new field must be handled here.
        let ThreadView { tid, tgid, proc_index: _, comm, start_ticks, role, ml: _, gpus: _, last_cpu, delta, changes } =
            src;
        if !Arc::ptr_eq(&self.comm, comm) {
            self.comm = comm.clone();
        }
        self.tid = *tid;
        self.tgid = *tgid;
        self.start_ticks = *start_ticks;
        self.role = *role;
        self.last_cpu = *last_cpu;
        self.delta = *delta;
        self.changes = *changes;
    }
}

/// A thread that existed in the previous pass and is gone now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GoneThread {
    pub tid: i32,
    pub tgid: i32,
    pub start_ticks: u64,
}

/// A GPU as the provider sees it (copied into the snapshot for topology/stats).
pub use crate::gpu::GpuDevice;

/// The result of one observer pass.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Pass number, from 1.
    pub seq: u64,
    /// Wall time since the previous pass started (0 on the first pass).
    pub interval_ns: u64,
    /// How long this pass took.
    pub pass_ns: u64,
    /// Sorted by pid.
    pub processes: Vec<ProcessView>,
    /// Sorted by (tgid, tid).
    pub threads: Vec<ThreadView>,
    /// Threads gone since the previous pass.
    pub gone: Vec<GoneThread>,
    pub gpus: Vec<GpuDevice>,
    /// `threads[spans[i]]` are the threads of `processes[i]`.
    pub spans: Vec<std::ops::Range<usize>>,
    /// Indices of the processes whose view or any of whose threads' views
    /// may have changed in this pass; the other processes' threads hold
    /// no changes and no delta. None: any may have (every thread is to be
    /// looked at).
    pub touched: Option<Vec<usize>>,
}

impl Snapshot {
    /// The process of a thread.
    pub fn process_of(&self, t: &ThreadView) -> &ProcessView {
        &self.processes[t.proc_index]
    }

    /// Looks a process up by pid (binary search).
    pub fn process(&self, pid: i32) -> Option<&ProcessView> {
        self.processes.binary_search_by_key(&pid, |p| p.pid).ok().map(|i| &self.processes[i])
    }

    /// Looks a thread up by tid (linear: for tests and tools).
    pub fn thread(&self, tid: i32) -> Option<&ThreadView> {
        self.threads.iter().find(|t| t.tid == tid)
    }

    /// The threads to look at for changes, deltas, or a change of
    /// process: those of the touched processes and of the processes
    /// `also` lists (pids), in snapshot order; all threads when the
    /// observer did not say which processes it touched, or `all`.
    pub fn threads_to_visit(&self, all: bool, also: &[i32]) -> Vec<std::ops::Range<usize>> {
        let touched = match &self.touched {
            Some(t) if !all && self.spans.len() == self.processes.len() => t,
            _ => return std::iter::once(0..self.threads.len()).collect(),
        };
        let mut procs = touched.clone();
        procs.extend(also.iter().filter_map(|&pid| self.processes.binary_search_by_key(&pid, |p| p.pid).ok()));
        procs.sort_unstable();
        procs.dedup();
        procs.into_iter().map(|i| self.spans[i].clone()).collect()
    }

    /// Threads of ML processes.
    pub fn ml_threads(&self) -> impl Iterator<Item = &ThreadView> {
        self.threads.iter().filter(|t| t.ml)
    }

    /// Processes new or changed in this pass.
    #[cfg(test)]
    pub(crate) fn changed_processes(&self) -> impl Iterator<Item = &ProcessView> {
        self.processes.iter().filter(|p| !p.changes.is_empty())
    }

    /// Threads new or renamed in this pass.
    #[cfg(test)]
    pub(crate) fn changed_threads(&self) -> impl Iterator<Item = &ThreadView> {
        self.threads.iter().filter(|t| !t.changes.is_empty())
    }
}
