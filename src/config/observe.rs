//! `[observe]`: where and how often /proc is read, and what counts as ML evidence.

use serde::{Deserialize, Serialize};

/// `[observe] thread_counters`: where the counters of ML processes'
/// threads come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ThreadCounters {
    /// A BPF task iterator (one read per process per pass) when it loads
    /// (kernel 6.1+ with BTF, root, the initial pid namespace); else /proc.
    Kernel,
    /// /proc/<pid>/task/<tid>/ files, per thread.
    #[default]
    Proc,
}

/// The `[observe]` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ObserveConfig {
    /// Root of the proc filesystem. Tests point it at a fixture tree.
    pub proc_root: String,
    /// How often (ms) each non-ML process is re-read (comm, exe, cmdline,
    /// parent, thread count, cgroup). Rescans are staggered over the passes.
    /// ML processes are re-read every pass. With the kernel's process
    /// events (the scheduler attached), /proc is listed, and exe, cmdline
    /// and cgroup are re-read, every 5 of these.
    pub rescan_interval_ms: u64,
    /// Take the kernel's process events while the scheduler is attached
    /// (fork, exec and exit of processes, thread renames, cgroup moves;
    /// tracepoints, through a ring buffer): each is acted on at the next
    /// pass, and /proc listings, name checks and cgroup reads become a
    /// slow reconciliation (see `rescan_interval_ms` and
    /// `thread_name_interval_ms`). false: /proc alone finds them, on those
    /// intervals, as `scx_zernel observe` does.
    pub process_events: bool,
    /// Longest time (ms) between two checks of a thread's name (renames).
    /// A new thread is checked 200 ms (or this, if shorter) after it
    /// appears, then at doubling intervals up to this one. Active ML threads are checked every pass.
    /// With the kernel's process events, which tell of every rename, the
    /// checks only reconcile: up to 5 of these apart.
    pub thread_name_interval_ms: u64,
    /// Minimum time (ms) between two ML-evidence scans (fds and maps) of the
    /// same non-ML process. A scan only happens when the process's virtual
    /// size changed (a library or device got mapped) or it exec'd.
    pub evidence_interval_ms: u64,
    /// At most this many fds of a process are examined per evidence scan.
    pub max_fds_scanned: u32,
    /// /proc files kept open between passes (re-read with pread at offset 0).
    /// Beyond this files are opened and closed per read, which costs about
    /// twice as much. The soft RLIMIT_NOFILE is raised to fit, up to the hard
    /// limit.
    pub max_cached_fds: u32,
    /// A thread of an ML process is "active" in a pass when it was runnable
    /// (on CPU or queued) at least this fraction of the interval; only active
    /// threads get the detailed reads (stat, status, io).
    pub active_busy_frac: f64,
    /// A pool thread of an ML process (role "other": OpenMP, runtime
    /// helpers...) that has been inactive for a second is held back (0:
    /// every thread is sampled every pass). Every this many ms the
    /// process's total CPU time is checked: when the sampled threads do not
    /// account for 30 ms of it or more, the held threads are all sampled in
    /// that pass, so one waking up is noticed within this delay; each is
    /// also sampled at least every 90-150 intervals (its own jitter; 45-75
    /// s at 500 ms). Saves most of the cost of
    /// large idle pools. Threads with a known role (trainer, loaders,
    /// NCCL...) are sampled every pass.
    pub quiet_sample_interval_ms: u64,
    /// Where the counters of ML processes' threads come from: "proc" (a
    /// schedstat read per sampled thread per pass, stat, status and io for
    /// active ones) or "kernel" (a BPF task iterator: every thread of a
    /// process in one read per pass, so a held-back quiet thread is sampled
    /// in the first pass it was active in, whatever
    /// `quiet_sample_interval_ms`; /proc, with one log line, where it
    /// cannot be loaded or `proc_root` is not /proc). The read costs about
    /// 0.85 µs of CPU per thread at a 100 ms period (the threads' task
    /// structs are out of the cache by then), every thread every pass: less
    /// than /proc when most threads are
    /// sampled every pass (a job's named threads, or no quiet tier), more
    /// for a large pool of mostly idle threads, which /proc holds back.
    pub thread_counters: ThreadCounters,
    /// How many generations of descendants of an ML process are ML too
    /// (DataLoader workers are children). 0: no inheritance.
    pub ml_inherit_depth: u32,
    /// Path prefixes of GPU device files: an open fd or a mapping of one is
    /// ML evidence.
    pub ml_device_prefixes: Vec<String>,
    /// File-name prefixes of mapped libraries that are ML evidence.
    pub ml_libraries: Vec<String>,
    /// File-name prefixes of mapped collective libraries (also ML evidence;
    /// they mark a process as part of a multi-rank job).
    pub collective_libraries: Vec<String>,
    /// Environment variables that are ML evidence when set. RANK, LOCAL_RANK
    /// and WORLD_SIZE also give the process's rank; CUDA_VISIBLE_DEVICES,
    /// HIP_VISIBLE_DEVICES and ROCR_VISIBLE_DEVICES give its GPUs.
    pub ml_env_vars: Vec<String>,
}

impl Default for ObserveConfig {
    fn default() -> Self {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect();
        ObserveConfig {
            proc_root: "/proc".into(),
            rescan_interval_ms: 1000,
            process_events: true,
            thread_name_interval_ms: 5000,
            evidence_interval_ms: 2000,
            max_fds_scanned: 1024,
            max_cached_fds: 32768,
            active_busy_frac: 0.01,
            quiet_sample_interval_ms: 500,
            thread_counters: ThreadCounters::Proc,
            ml_inherit_depth: 4,
            ml_device_prefixes: s(&["/dev/nvidia", "/dev/kfd", "/dev/dri/renderD"]),
            ml_libraries: s(&["libcuda.so", "libcudart", "libtorch_cuda", "libamdhip64"]),
            collective_libraries: s(&["libnccl", "librccl"]),
            ml_env_vars: s(&["RANK", "LOCAL_RANK", "WORLD_SIZE", "CUDA_VISIBLE_DEVICES"]),
        }
    }
}

impl ObserveConfig {
    /// Rejects values that cannot work, naming the key.
    pub fn validate(&self) -> Result<(), String> {
        if self.proc_root.is_empty() {
            return Err("observe.proc_root must not be empty".into());
        }
        if !(10..=600_000).contains(&self.rescan_interval_ms) {
            return Err("observe.rescan_interval_ms must be within 10..=600000".into());
        }
        if !(10..=3_600_000).contains(&self.thread_name_interval_ms) {
            return Err("observe.thread_name_interval_ms must be within 10..=3600000".into());
        }
        if !(10..=3_600_000).contains(&self.evidence_interval_ms) {
            return Err("observe.evidence_interval_ms must be within 10..=3600000".into());
        }
        if !(1..=1_000_000).contains(&self.max_fds_scanned) {
            return Err("observe.max_fds_scanned must be within 1..=1000000".into());
        }
        if self.max_cached_fds > 4_000_000 {
            return Err("observe.max_cached_fds must be <= 4000000".into());
        }
        if !(0.0..=1.0).contains(&self.active_busy_frac) {
            return Err("observe.active_busy_frac must be within 0.0..=1.0".into());
        }
        if self.quiet_sample_interval_ms > 60_000 {
            return Err("observe.quiet_sample_interval_ms must be <= 60000".into());
        }
        if self.ml_inherit_depth > 64 {
            return Err("observe.ml_inherit_depth must be <= 64".into());
        }
        for (key, list) in [
            ("ml_device_prefixes", &self.ml_device_prefixes),
            ("ml_libraries", &self.ml_libraries),
            ("collective_libraries", &self.collective_libraries),
            ("ml_env_vars", &self.ml_env_vars),
        ] {
            if list.iter().any(|s| s.trim().is_empty()) {
                return Err(format!("observe.{key} must not contain empty strings"));
            }
        }
        if self.ml_env_vars.iter().any(|v| v.contains('=')) {
            return Err("observe.ml_env_vars entries must be variable names (no '=')".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_valid_and_parses_from_empty() {
        ObserveConfig::default().validate().unwrap();
        let c: ObserveConfig = toml::from_str("").unwrap();
        assert_eq!(c, ObserveConfig::default());
    }

    #[test]
    fn rejects_absurd_values_naming_the_key() {
        let c = ObserveConfig { rescan_interval_ms: 0, ..Default::default() };
        assert!(c.validate().unwrap_err().contains("observe.rescan_interval_ms"));
        let c = ObserveConfig { active_busy_frac: 1.5, ..Default::default() };
        assert!(c.validate().unwrap_err().contains("observe.active_busy_frac"));
        let c = ObserveConfig { ml_libraries: vec!["".into()], ..Default::default() };
        assert!(c.validate().unwrap_err().contains("observe.ml_libraries"));
        assert!(toml::from_str::<ObserveConfig>("bogus = 1").is_err());
    }
}
