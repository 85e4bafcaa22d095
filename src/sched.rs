//! The BPF side from user space: open, load, attach, write decisions, read
//! counters, and the pinned maps that `scx_zernel inspect` reads.
//!
//! ```text
//!   SchedulerConfig, topology ──> rodata (before load) ──> scx_ops_load! ──> scx_ops_attach!
//!   Decision per TID ──────────> task_class map (update only when changed)
//!   per-CPU `stats` map ───────> Counters (summed over CPUs)
//!   pin_dir/{task_class,stats} <── inspect (another process, read-only)
//!   /proc/devices ─────────────> gpu_majors map (after load)
//!   fentry chrdev_open | lsm file_open ─> events ring buffer ─> events() (non-blocking):
//!   tp_btf sched_process_{fork,exec,exit},
//!          task_rename, cgroup_attach_task ─> events ────────>   GPU opens, process events
//! ```
//!
//! GPU device opens: of the two hooks of main.bpf.c one is loaded, fentry
//! on chrdev_open where the kernel's BTF has that function, else BPF LSM
//! file_open where `bpf` is among the active LSMs (`scheduler.gpu_open_hook`
//! may name one, or none); with neither (or if its attach fails) one line
//! says so and GPU processes are found by the /proc scan alone. Process
//! events (a process forked, exec'd, or its leader exited; a thread
//! renamed; a task moved to another cgroup) come through the same ring
//! buffer, so that the observer finds new work and changes from them
//! instead of by listing /proc and polling names and cgroups. The ring
//! buffer is drained with `consume` (no wait) at the start of every pass.
//! Process events ask for no wakeup; a GPU open forces one, which a small
//! thread blocked in poll(2) on the ring buffer hands to the daemon's wait
//! (`ring_woken`), so that an idle daemon wakes once per pass, not on a
//! timer:
//!
//! ```text
//!   ring buffer epoll fd ──poll(2)──> waker thread ──token──> daemon's wait
//!        ^                                 ^                      │ events()
//!        └──────── drained ────────────────┴──── rearm() (next pass)
//! ```
//!
//! Nothing here knows about phases or /proc: a decision is a small value and
//! the map is keyed by TID, with the task's start time to tell a recycled TID
//! from the task the decision was made for.

use std::mem::{size_of, MaybeUninit};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use libbpf_rs::{AsRawLibbpf, MapCore, MapFlags, MapHandle, OpenObject};
use scx_utils::{compat, scx_ops_attach, scx_ops_load, scx_ops_open, uei_exited, uei_report, UserExitInfo};
use tracing::{info, warn};

use crate::bpf_intf;
use crate::bpf_skel::{BpfSkel, BpfSkelBuilder};
use crate::class::{Class, NR_CLASSES};
use crate::config::{GpuOpenHook, SchedulerConfig};
use crate::decisions::DecisionSink;
pub use crate::decisions::WriteError;
use crate::devices;
use crate::events::{GpuOpen, ProcEvent, ProcEventKind};
use crate::policy::Decision;
use crate::tenants::Tenants;
use crate::topology::Topology;

const SCHED_EXT: &str = "/sys/kernel/sched_ext";

/// How the BPF program is opened and loaded: command-line options, not
/// config keys (they do not change on reload).
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// ops.exit_dump_len: bytes of the kernel's debug dump on an error exit (0 = default).
    pub exit_dump_len: u32,
    /// libbpf's bpf_object_open_opts (--relaxed-maps, --pin-root-path, ...).
    pub libbpf: scx_utils::libbpf_clap_opts::LibbpfOpts,
}

impl LoadOptions {
    /// Checks what libbpf would otherwise ignore: an unreadable --kconfig
    /// file drops all the open options silently.
    pub fn new(exit_dump_len: u32, libbpf: scx_utils::libbpf_clap_opts::LibbpfOpts) -> Result<LoadOptions> {
        if let Some(k) = &libbpf.kconfig {
            std::fs::read_to_string(k).with_context(|| format!("--kconfig {k}: cannot read"))?;
        }
        for (flag, v) in [
            ("--pin-root-path", &libbpf.pin_root_path),
            ("--btf-custom-path", &libbpf.btf_custom_path),
            ("--bpf-token-path", &libbpf.bpf_token_path),
        ] {
            if v.as_deref().is_some_and(|v| v.contains('\0')) {
                bail!("{flag}: a path with a NUL byte");
            }
        }
        Ok(LoadOptions { exit_dump_len, libbpf })
    }
}

/// Checks that this kernel can take a sched_ext scheduler and none is running.
pub(crate) fn check_kernel() -> Result<()> {
    let root = Path::new(SCHED_EXT);
    if !root.is_dir() {
        bail!(
            "this kernel has no sched_ext ({SCHED_EXT} is missing): scx_zernel needs Linux 6.12+ built with CONFIG_SCHED_CLASS_EXT=y"
        );
    }
    let state = std::fs::read_to_string(root.join("state")).unwrap_or_default();
    if state.trim() != "disabled" {
        let ops = std::fs::read_to_string(root.join("root/ops")).unwrap_or_default();
        bail!(
            "another sched_ext scheduler ({}) is {}; stop it first",
            if ops.trim().is_empty() { "unknown" } else { ops.trim() },
            state.trim()
        );
    }
    if unsafe { libc::geteuid() } != 0 {
        bail!("must run as root: loading a BPF scheduler needs CAP_SYS_ADMIN and CAP_BPF");
    }
    Ok(())
}

/// The map value for one decision.
/// Whether this kernel re-enqueues a CPU's local queue from any BPF program
/// (`scx_bpf_dsq_reenq`, 7.1+, or `scx_bpf_reenqueue_local___v2`, 6.19+), the
/// same kfuncs the BPF side's `scx_bpf_reenqueue_local_from_anywhere` tries.
fn reenqueue_from_anywhere() -> bool {
    ["scx_bpf_dsq_reenq", "scx_bpf_reenqueue_local___v2"].iter().any(|k| compat::ksym_exists(k).unwrap_or(false))
}

fn encode(d: &Decision, start_ticks: u64) -> bpf_intf::task_class {
    bpf_intf::task_class {
        class: d.class.index(),
        flags: if d.preempt { bpf_intf::zernel_task_flags_ZFLAG_PREEMPT } else { 0 },
        slice_ns: d.slice_ns,
        cpu: d.cpu,
        node: d.node,
        tenant: d.tenant,
        pad: 0,
        start_ticks,
        applied: 0,
    }
}

fn as_bytes<T: Copy>(v: &T) -> &[u8] {
    // SAFETY: T is a plain C struct generated by bindgen (no padding reads
    // matter to the kernel, which copies the value as bytes).
    unsafe { std::slice::from_raw_parts(v as *const T as *const u8, size_of::<T>()) }
}

fn from_bytes<T: Copy>(b: &[u8]) -> Option<T> {
    if b.len() < size_of::<T>() {
        return None;
    }
    // SAFETY: length checked; T is a plain C struct of integers.
    Some(unsafe { std::ptr::read_unaligned(b.as_ptr() as *const T) })
}

/// Counters of the BPF side, summed over CPUs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Counters {
    /// [class][enum zernel_class_stat]
    pub class: [[u64; bpf_intf::zernel_class_stat_ZSTAT_CLASS_NR as usize]; NR_CLASSES],
    /// [enum zernel_global_stat]
    pub global: [u64; bpf_intf::zernel_global_stat_ZGSTAT_NR as usize],
    /// CPU time used by each tenant's tasks, ns.
    pub tenant_ns: [u64; bpf_intf::zernel_consts_ZERNEL_MAX_TENANTS as usize],
}

/// Names of the per-class counters, in `enum zernel_class_stat` order.
pub(crate) const CLASS_STAT_NAMES: [&str; bpf_intf::zernel_class_stat_ZSTAT_CLASS_NR as usize] =
    ["enqueued", "dispatched", "direct", "preempted", "starved", "wake_preempt", "kept"];
/// Names of the global counters, in `enum zernel_global_stat` order.
pub(crate) const GLOBAL_STAT_NAMES: [&str; bpf_intf::zernel_global_stat_ZGSTAT_NR as usize] = [
    "map_hit",
    "map_miss",
    "map_stale",
    "pref_cpu",
    "pref_node",
    "idle_near",
    "idle_far",
    "steal",
    "kick",
    "exit_del",
    "tenant_dispatch",
    "map_expired",
    "migration_disabled",
    "cpu_taken",
    "inherited",
    "inherit_hit",
    "inherit_end",
    "first_dec",
    "enq_before_dec",
    "gpu_open",
    "gpu_hit",
    "event_lost",
    "wake_afield",
    "wake_afield_far",
    "interactive",
    "interactive_ns",
];

impl Counters {
    fn from_percpu(vals: &[Vec<u8>]) -> Counters {
        let mut c = Counters::default();
        for v in vals {
            let Some(s) = from_bytes::<bpf_intf::zernel_stats>(v) else { continue };
            for (dst, src) in c.class.iter_mut().zip(s.cls.iter()) {
                for (d, x) in dst.iter_mut().zip(src.iter()) {
                    *d += x;
                }
            }
            for (d, x) in c.global.iter_mut().zip(s.glob.iter()) {
                *d += x;
            }
            for (d, x) in c.tenant_ns.iter_mut().zip(s.tenant_ns.iter()) {
                *d += x;
            }
        }
        c
    }

    pub fn get(&self, class: Class, stat: usize) -> u64 {
        self.class[class.index() as usize][stat]
    }
}

fn read_counters(map: &dyn MapCore) -> Result<Counters> {
    let vals =
        map.lookup_percpu(&0u32.to_ne_bytes(), MapFlags::ANY).context("reading the stats map")?.unwrap_or_default();
    Ok(Counters::from_percpu(&vals))
}

/// The tunables the loaded BPF program holds (its read-only data, written
/// before load), as read back from the kernel: the `[scheduler]` values
/// after `--mode`, in the config's units.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Tunables {
    /// Per class, in `Class::ALL` order.
    pub slice_us: [u64; NR_CLASSES],
    pub starvation_bound_ms: u64,
    pub wakeup_preempt_us: u64,
    pub decision_ttl_ms: u64,
    pub default_class: u32,
    pub nr_cpus: u32,
    pub nr_nodes: u32,
    pub numa: bool,
    pub nr_tenants: u32,
}

fn read_tunables(map: &dyn MapCore) -> Result<Tunables> {
    let b = map.lookup(&0u32.to_ne_bytes(), MapFlags::ANY).context("reading the tunables map")?.unwrap_or_default();
    decode_tunables(&b)
}

fn decode_tunables(b: &[u8]) -> Result<Tunables> {
    use crate::bpf_skel::types::rodata;
    use std::mem::offset_of;
    // Field by field, at the skeleton's offsets: the kernel's copy of the
    // section may be shorter than the generated type (its tail).
    let bad = || anyhow!("the tunables map holds {} bytes, not this version's layout", b.len());
    let at = |off: usize| b.get(off..).ok_or_else(bad);
    let u64_at = |off: usize| from_bytes::<u64>(at(off)?).ok_or_else(bad);
    let u32_at = |off: usize| from_bytes::<u32>(at(off)?).ok_or_else(bad);
    let slices = offset_of!(rodata, class_slice_ns);
    let mut slice_us = [0; NR_CLASSES];
    for (i, s) in slice_us.iter_mut().enumerate() {
        *s = u64_at(slices + 8 * i)? / 1000;
    }
    Ok(Tunables {
        slice_us,
        starvation_bound_ms: u64_at(offset_of!(rodata, starve_ns))? / 1_000_000,
        wakeup_preempt_us: u64_at(offset_of!(rodata, wake_preempt_ns))? / 1000,
        decision_ttl_ms: u64_at(offset_of!(rodata, decision_ttl_ns))? / 1_000_000,
        default_class: u32_at(offset_of!(rodata, default_class))?,
        nr_cpus: u32_at(offset_of!(rodata, nr_cpus))?,
        nr_nodes: u32_at(offset_of!(rodata, nr_nodes))?,
        numa: *at(offset_of!(rodata, numa_enabled))?.first().ok_or_else(bad)? != 0,
        nr_tenants: u32_at(offset_of!(rodata, nr_tenants))?,
    })
}

/// One entry of the task_class map, as read back.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Entry {
    pub class: u32,
    pub slice_ns: u64,
    pub cpu: i32,
    pub node: i32,
    pub tenant: i32,
    pub preempt: bool,
    pub start_ticks: u64,
    pub applied: u64,
}

fn read_entry(map: &dyn MapCore, tid: u32) -> Result<Option<Entry>> {
    let v = map.lookup(&tid.to_ne_bytes(), MapFlags::ANY)?;
    Ok(v.and_then(|b| decode(&b)))
}

fn decode(b: &[u8]) -> Option<Entry> {
    from_bytes::<bpf_intf::task_class>(b).map(|t| Entry {
        class: t.class,
        slice_ns: t.slice_ns,
        cpu: t.cpu,
        node: t.node,
        tenant: t.tenant,
        preempt: t.flags & bpf_intf::zernel_task_flags_ZFLAG_PREEMPT != 0,
        start_ticks: t.start_ticks,
        applied: t.applied,
    })
}

/// Every (tid, entry) of the task_class map, read in batches: bucket by
/// bucket, so that entries deleted meanwhile (threads exiting) neither
/// restart the walk nor count twice, as a key-by-key walk would.
fn all_entries(map: &dyn MapCore) -> Result<Vec<(u32, Entry)>> {
    let mut out = Vec::new();
    for (k, v) in map.lookup_batch(4096, MapFlags::ANY, MapFlags::ANY)? {
        let (Ok(k), Some(e)) = (<[u8; 4]>::try_from(k.as_slice()), decode(&v)) else {
            continue;
        };
        out.push((u32::from_ne_bytes(k), e));
    }
    out.sort_by_key(|(t, _)| *t);
    Ok(out)
}

/// A GPU device open from the ring buffer.
fn decode_gpu_open(b: &[u8]) -> Option<GpuOpen> {
    let e = from_bytes::<bpf_intf::zernel_event>(b)?;
    (e.kind == bpf_intf::zernel_event_kind_ZEV_GPU_OPEN).then_some(GpuOpen {
        pid: e.pid,
        tid: e.tid,
        major: e.major,
        minor: e.minor,
        start_ticks: e.start_ticks,
    })
}

/// A process event from the ring buffer, as the observer takes it.
fn decode_proc_event(b: &[u8]) -> Option<ProcEvent> {
    let e = from_bytes::<bpf_intf::zernel_event>(b)?;
    let kind = match e.kind {
        bpf_intf::zernel_event_kind_ZEV_PROC_NEW => ProcEventKind::New,
        bpf_intf::zernel_event_kind_ZEV_PROC_EXEC => ProcEventKind::Exec,
        bpf_intf::zernel_event_kind_ZEV_PROC_EXIT => ProcEventKind::Exit,
        bpf_intf::zernel_event_kind_ZEV_TASK_RENAME => ProcEventKind::Rename,
        bpf_intf::zernel_event_kind_ZEV_CGROUP_MOVE => ProcEventKind::CgroupMove,
        _ => return None,
    };
    Some(ProcEvent {
        kind,
        pid: i32::try_from(e.pid).ok()?,
        tid: i32::try_from(e.tid).ok()?,
        start_ticks: e.start_ticks,
    })
}

/// Which hook sees GPU device opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OpenHook {
    Fentry,
    Lsm,
    /// None, and why.
    None(&'static str),
}

impl OpenHook {
    /// The hook `want` names, if this kernel has it; else none, and why.
    fn detect(want: GpuOpenHook) -> OpenHook {
        let fentry = || kernel_has_func("chrdev_open");
        // (An LSM program attaches whether or not BPF is an active LSM, and
        // then never runs: the list is the only way to know.)
        let lsm = || match std::fs::read_to_string("/sys/kernel/security/lsm") {
            Ok(s) if s.trim().split(',').any(|l| l == "bpf") => Ok(()),
            Ok(_) => Err("BPF is not an active LSM on this kernel"),
            Err(_) => Err("cannot read /sys/kernel/security/lsm (securityfs not mounted?)"),
        };
        match want {
            GpuOpenHook::Off => OpenHook::None("scheduler.gpu_open_hook is \"off\""),
            GpuOpenHook::Fentry if fentry() => OpenHook::Fentry,
            GpuOpenHook::Fentry => OpenHook::None("this kernel has no chrdev_open in its BTF"),
            GpuOpenHook::Lsm => lsm().map_or_else(OpenHook::None, |()| OpenHook::Lsm),
            GpuOpenHook::Auto if fentry() => OpenHook::Fentry,
            GpuOpenHook::Auto => lsm()
                .map_or(OpenHook::None("this kernel has neither chrdev_open in its BTF nor BPF LSM"), |()| {
                    OpenHook::Lsm
                }),
        }
    }
}

/// Whether the kernel's BTF has a function `name` (an fentry target).
fn kernel_has_func(name: &str) -> bool {
    let Ok(c) = std::ffi::CString::new(name) else { return false };
    // SAFETY: libbpf returns a BTF object or NULL; it is freed once.
    unsafe {
        let btf = libbpf_rs::libbpf_sys::btf__load_vmlinux_btf();
        if btf.is_null() {
            return false;
        }
        let id = libbpf_rs::libbpf_sys::btf__find_by_name_kind(btf, c.as_ptr(), libbpf_rs::libbpf_sys::BTF_KIND_FUNC);
        libbpf_rs::libbpf_sys::btf__free(btf);
        id > 0
    }
}

/// A thread blocked in poll(2) on the ring buffer's epoll fd that tells the
/// daemon's wait when a record asked for a wakeup. After a token it waits
/// for `rearm` before it polls again: a ring buffer the daemon has not
/// drained yet stays readable, and the thread would spin on it.
struct RingWaker {
    thread: Option<std::thread::JoinHandle<()>>,
    /// Written to stop the thread.
    stop: std::os::fd::OwnedFd,
    woken: crossbeam::channel::Receiver<()>,
    rearm: crossbeam::channel::Sender<()>,
    /// A token was taken and the thread waits for `rearm`.
    armed: bool,
}

impl RingWaker {
    fn start(ring_epoll_fd: i32) -> Result<RingWaker> {
        // SAFETY: eventfd returns a new fd or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            bail!("eventfd: {}", std::io::Error::last_os_error());
        }
        // SAFETY: fd is a new, valid fd that nothing else owns.
        let stop = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        let (wtx, woken) = crossbeam::channel::bounded(1);
        let (rearm, rrx) = crossbeam::channel::bounded::<()>(1);
        let thread = std::thread::Builder::new()
            .name("zernel-ring".into())
            .spawn(move || loop {
                let mut fds = [
                    libc::pollfd { fd: ring_epoll_fd, events: libc::POLLIN, revents: 0 },
                    libc::pollfd { fd, events: libc::POLLIN, revents: 0 },
                ];
                // SAFETY: two valid pollfds; both fds outlive the thread
                // (Scheduler's drop stops and joins it before closing them).
                let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
                if n < 0 {
                    let e = std::io::Error::last_os_error();
                    if e.kind() == std::io::ErrorKind::Interrupted {
                        continue;
                    }
                    // Keep the channel open until stop: a closed one would
                    // end the daemon's wait at once, every time.
                    warn!("the ring buffer's waker stopped ({e}): GPU opens are seen at the next pass");
                    let mut stop = [libc::pollfd { fd, events: libc::POLLIN, revents: 0 }];
                    // SAFETY: one valid pollfd, as above.
                    while unsafe { libc::poll(stop.as_mut_ptr(), 1, -1) } < 0 {
                        std::thread::sleep(std::time::Duration::from_secs(1));
                    }
                    return;
                }
                if fds[1].revents != 0 || wtx.send(()).is_err() || rrx.recv().is_err() {
                    return;
                }
            })
            .context("starting the ring buffer's waker thread")?;
        Ok(RingWaker { thread: Some(thread), stop, woken, rearm, armed: false })
    }

    fn stop(&mut self) {
        use std::os::fd::AsRawFd;
        let one: u64 = 1;
        // SAFETY: writes 8 bytes to our eventfd.
        unsafe { libc::write(self.stop.as_raw_fd(), (&one as *const u64).cast(), 8) };
        // The thread may wait for a rearm: closing the channel ends that.
        let (dead, _) = crossbeam::channel::bounded(1);
        drop(std::mem::replace(&mut self.rearm, dead));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A loaded and attached scheduler.
pub(crate) struct Scheduler<'a> {
    /// Dropped first: the waker thread (stopped and joined in drop), the
    /// hook, then the ring buffer, before the skeleton.
    waker: Option<RingWaker>,
    open_link: Option<libbpf_rs::Link>,
    events: Option<libbpf_rs::RingBuffer<'static>>,
    opens: crossbeam::channel::Receiver<GpuOpen>,
    procs: crossbeam::channel::Receiver<ProcEvent>,
    skel: BpfSkel<'a>,
    link: Option<libbpf_rs::Link>,
    pin_dir: Option<PathBuf>,
    /// Tenant queues created at load; reloads cannot change the count.
    nr_tenants: usize,
}

impl<'a> Scheduler<'a> {
    /// Opens, configures, loads and attaches the BPF scheduler.
    pub fn init(
        cfg: &SchedulerConfig,
        load: &LoadOptions,
        topo: &Topology,
        tenants: &Tenants,
        open_object: &'a mut MaybeUninit<OpenObject>,
    ) -> Result<Self> {
        scx_utils::try_set_rlimit_infinity();
        let builder = BpfSkelBuilder::default();
        let open_opts = load.libbpf.clone().into_bpf_open_opts();
        let mut skel = scx_ops_open!(builder, open_object, zernel_ops, open_opts)?;

        let nr_cpus = (*scx_utils::NR_CPU_IDS).min(bpf_intf::zernel_consts_ZERNEL_MAX_CPUS as usize);
        let nr_nodes = topo.nr_nodes().clamp(1, bpf_intf::zernel_consts_ZERNEL_MAX_NODES as usize);
        let numa = nr_nodes > 1;
        let rodata = skel.maps.rodata_data.as_mut().unwrap();
        for class in Class::ALL {
            rodata.class_slice_ns[class.index() as usize] = cfg.slice_us.get(class) * 1000;
        }
        rodata.starve_ns = cfg.starvation_bound_ms * 1_000_000;
        rodata.wake_preempt_ns = cfg.wakeup_preempt_us * 1000;
        rodata.decision_ttl_ns = cfg.decision_ttl_ms * 1_000_000;
        rodata.default_class = cfg.default_class.index();
        rodata.nr_cpus = nr_cpus as u32;
        rodata.nr_nodes = nr_nodes as u32;
        rodata.numa_enabled = numa;
        rodata.nr_tenants = tenants.len() as u32;
        rodata.daemon_tgid = std::process::id();
        for cpu in 0..nr_cpus {
            rodata.cpu_node[cpu] = topo.cpu_node(cpu).unwrap_or(0).min(nr_nodes - 1) as i32;
        }
        skel.maps.task_class.set_max_entries(cfg.task_map_size)?;
        let hook = OpenHook::detect(cfg.gpu_open_hook);
        skel.progs.zernel_chrdev_open.set_autoload(hook == OpenHook::Fentry);
        skel.progs.zernel_file_open.set_autoload(hook == OpenHook::Lsm);
        skel.progs.zernel_chrdev_open.set_autoattach(false);
        skel.progs.zernel_file_open.set_autoattach(false);
        let ops = skel.struct_ops.zernel_ops_mut();
        ops.exit_dump_len = load.exit_dump_len;
        // ENQ_LAST: a task alone on its CPU still passes through enqueue at
        // every slice end, so that it can move to its preferred node.
        // ENQ_MIGRATION_DISABLED: a task preempted inside migrate_disable()
        // does too (by default the kernel puts it in its CPU's local queue,
        // ahead of every class queue); 0 on kernels before 6.15, whose
        // enqueue always sees such tasks.
        ops.flags = *compat::SCX_OPS_ENQ_LAST
            | *compat::SCX_OPS_ENQ_MIGRATION_DISABLED
            | if numa { *compat::SCX_OPS_BUILTIN_IDLE_PER_NODE } else { 0 };
        // A higher class taking a CPU: kernels that can re-enqueue a local
        // queue from anywhere (6.19+) deprecate ops.cpu_release, so there the
        // sched_switch hook does the hand-back instead.
        if reenqueue_from_anywhere() {
            ops.cpu_release = std::ptr::null_mut();
            skel.progs.zernel_rt_takes_cpu.set_autoload(true);
        }
        // scx_ops_attach! attaches the struct_ops map itself (and keeps its
        // link); libbpf's skeleton attach must leave it alone, or it warns
        // that the map's skeleton link is uninitialized.
        // SAFETY: a valid open map of this skeleton, before load.
        unsafe {
            libbpf_rs::libbpf_sys::bpf_map__set_autoattach(skel.maps.zernel_ops.as_libbpf_object().as_ptr(), false);
        }

        let skel = scx_ops_load!(skel, zernel_ops, uei)?;
        let (tx, opens) = crossbeam::channel::unbounded();
        let (ptx, procs) = crossbeam::channel::unbounded();
        let mut sched = Scheduler {
            waker: None,
            open_link: None,
            events: None,
            opens,
            procs,
            skel,
            link: None,
            pin_dir: None,
            nr_tenants: tenants.len(),
        };
        sched.set_tenant_weights(tenants)?;
        for g in devices::read() {
            sched.skel.maps.gpu_majors.update(&g.major.to_ne_bytes(), &g.first_minor.to_ne_bytes(), MapFlags::ANY)?;
        }
        let mut rb = libbpf_rs::RingBufferBuilder::new();
        rb.add(&sched.skel.maps.events, move |b: &[u8]| {
            if let Some(o) = decode_gpu_open(b) {
                let _ = tx.send(o);
            } else if let Some(e) = decode_proc_event(b) {
                let _ = ptx.send(e);
            }
            0
        })?;
        let rb = rb.build()?;
        sched.waker = Some(RingWaker::start(rb.epoll_fd())?);
        sched.events = Some(rb);
        sched.heartbeat();
        if !cfg.pin_dir.is_empty() {
            sched.pin(Path::new(&cfg.pin_dir))?;
        }
        sched.link = Some(scx_ops_attach!(sched.skel, zernel_ops)?);
        sched.attach_open_hook(hook);
        info!(
            "scx_zernel attached: {nr_cpus} CPUs, {nr_nodes} node(s), starvation bound {} ms, wakeup_preempt_us {}, map {} entries",
            cfg.starvation_bound_ms, cfg.wakeup_preempt_us, cfg.task_map_size
        );
        Ok(sched)
    }

    /// Attaches the GPU-open hook chosen at load; one line either way.
    fn attach_open_hook(&mut self, hook: OpenHook) {
        let (prog, what) = match hook {
            OpenHook::Fentry => (&self.skel.progs.zernel_chrdev_open, "fentry on chrdev_open"),
            OpenHook::Lsm => (&self.skel.progs.zernel_file_open, "BPF LSM file_open"),
            OpenHook::None(why) => {
                info!("GPU device opens: none ({why}); GPU processes are found by the /proc scan");
                return;
            }
        };
        match prog.attach() {
            Ok(l) => {
                self.open_link = Some(l);
                info!("GPU device opens seen by {what}");
            }
            Err(e) => {
                info!("GPU device opens: attaching {what} failed ({e}); GPU processes are found by the /proc scan")
            }
        }
    }

    /// What the kernel told of since the last call (no wait), from one drain
    /// of the ring buffer: GPU device opens and process events.
    pub fn events(&self) -> (Vec<GpuOpen>, Vec<ProcEvent>) {
        if let Some(rb) = &self.events {
            let _ = rb.consume();
        }
        (self.opens.try_iter().collect(), self.procs.try_iter().collect())
    }

    /// Ready when a ring buffer record asked for a wakeup (a GPU open; a
    /// process event rides along, it asks for none). Take it with
    /// [`Self::take_wakeup`]; the next one comes after [`Self::rearm`].
    pub(crate) fn ring_woken(&self) -> crossbeam::channel::Receiver<()> {
        match &self.waker {
            Some(w) => w.woken.clone(),
            None => crossbeam::channel::never(),
        }
    }

    /// Marks the wakeup token as taken (the waker thread waits for rearm).
    pub(crate) fn take_wakeup(&mut self) {
        if let Some(w) = &mut self.waker {
            w.armed = true;
        }
    }

    /// Lets the waker thread poll again, once per pass at most: at the start
    /// of the pass, after its drain.
    pub(crate) fn rearm(&mut self) {
        if let Some(w) = &mut self.waker {
            if std::mem::take(&mut w.armed) {
                let _ = w.rearm.try_send(());
            }
        }
    }

    /// Marks the GPU open of a process as judged by the daemon: its threads'
    /// entries (or none) decide from now on; the mark stays, so that its
    /// later opens send no more events.
    pub(crate) fn unmark_gpu(&self, pid: u32) {
        let map = &self.skel.maps.gpu_procs;
        let key = pid.to_ne_bytes();
        let Ok(Some(b)) = map.lookup(&key, MapFlags::ANY) else { return };
        let Some(mut v) = from_bytes::<bpf_intf::task_class>(&b) else { return };
        v.flags |= bpf_intf::zernel_task_flags_ZFLAG_JUDGED;
        let _ = map.update(&key, as_bytes(&v), MapFlags::EXIST);
    }

    fn pin(&mut self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating pin directory {}", dir.display()))?;
        for (name, map) in [
            ("task_class", &mut self.skel.maps.task_class),
            ("stats", &mut self.skel.maps.stats),
            ("tunables", &mut self.skel.maps.rodata),
        ] {
            let p = dir.join(name);
            let _ = std::fs::remove_file(&p); // a stale pin from a killed run
            map.pin(&p).with_context(|| format!("pinning {}", p.display()))?;
        }
        self.pin_dir = Some(dir.to_path_buf());
        Ok(())
    }

    /// Writes one thread's decision.
    pub fn write(&self, tid: u32, start_ticks: u64, d: &Decision) -> Result<(), WriteError> {
        let v = encode(d, start_ticks);
        self.skel.maps.task_class.update(&tid.to_ne_bytes(), as_bytes(&v), MapFlags::ANY).map_err(|e| match e.kind() {
            libbpf_rs::ErrorKind::TooBig => WriteError::Full,
            _ => WriteError::Other(e.to_string()),
        })
    }

    /// Writes the shares' weights: the tenants' (same count as at load), then
    /// the default share's at index `nr_tenants`.
    pub(crate) fn set_tenant_weights(&self, tenants: &Tenants) -> Result<()> {
        if tenants.len() != self.nr_tenants {
            bail!(
                "the number of tenants changed ({} -> {}): restart scx_zernel to apply",
                self.nr_tenants,
                tenants.len()
            );
        }
        for (i, w) in tenants.weights().iter().enumerate() {
            self.skel.maps.tenant_weight.update(&(i as u32).to_ne_bytes(), &w.to_ne_bytes(), MapFlags::ANY)?;
        }
        let (i, w) = (self.nr_tenants as u32, tenants.default_weight());
        self.skel.maps.tenant_weight.update(&i.to_ne_bytes(), &w.to_ne_bytes(), MapFlags::ANY)?;
        Ok(())
    }

    /// Tells the kernel the daemon is alive: its decisions hold for
    /// `decision_ttl_ms` from now.
    pub(crate) fn heartbeat(&mut self) {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: clock_gettime writes one timespec. CLOCK_MONOTONIC is
        // bpf_ktime_get_ns()'s clock.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        let now = ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64;
        if let Some(bss) = self.skel.maps.bss_data.as_mut() {
            bss.heartbeat_ns = now;
        }
    }

    /// Forgets a thread's decision (absent is fine: exit_task may have been first).
    pub fn remove(&self, tid: u32) {
        let _ = self.skel.maps.task_class.delete(&tid.to_ne_bytes());
    }

    pub fn counters(&self) -> Result<Counters> {
        read_counters(&self.skel.maps.stats)
    }

    pub(crate) fn map_capacity(&self) -> u32 {
        self.skel.maps.task_class.max_entries()
    }

    /// Did the BPF side exit (error, watchdog, sysrq)?
    pub(crate) fn exited(&mut self) -> bool {
        uei_exited!(&self.skel, uei)
    }

    /// Detaches and reports why the BPF side exited.
    pub fn shutdown(mut self) -> Result<UserExitInfo> {
        self.link.take();
        self.unpin();
        uei_report!(&self.skel, uei)
    }

    fn unpin(&mut self) {
        if let Some(dir) = self.pin_dir.take() {
            for name in PINNED {
                let _ = std::fs::remove_file(dir.join(name));
            }
            let _ = std::fs::remove_dir(&dir);
        }
    }
}

impl Drop for Scheduler<'_> {
    fn drop(&mut self) {
        if let Some(w) = &mut self.waker {
            w.stop();
        }
        self.link.take();
        self.unpin();
    }
}

/// Read-only access to a running instance's pinned maps (`scx_zernel inspect`).
pub(crate) struct Pinned {
    task_class: MapHandle,
    stats: MapHandle,
    tunables: MapHandle,
}

/// The maps pinned under `scheduler.pin_dir`.
const PINNED: [&str; 3] = ["task_class", "stats", "tunables"];

impl Pinned {
    pub fn open(dir: &Path) -> Result<Pinned> {
        let open = |name: &str| {
            let p = dir.join(name);
            MapHandle::from_pinned_path(&p)
                .map_err(|e| anyhow!("{}: {e} (is scx_zernel running, and are you root?)", p.display()))
        };
        Ok(Pinned { task_class: open("task_class")?, stats: open("stats")?, tunables: open("tunables")? })
    }

    pub(crate) fn tunables(&self) -> Result<Tunables> {
        read_tunables(&self.tunables)
    }

    pub fn counters(&self) -> Result<Counters> {
        read_counters(&self.stats)
    }

    pub fn entry(&self, tid: u32) -> Result<Option<Entry>> {
        read_entry(&self.task_class, tid)
    }

    pub(crate) fn map_entries(&self) -> Result<usize> {
        Ok(all_entries(&self.task_class)?.len())
    }

    /// Every (tid, entry) in the map.
    pub fn entries(&self) -> Result<Vec<(u32, Entry)>> {
        all_entries(&self.task_class)
    }

    pub(crate) fn map_capacity(&self) -> u32 {
        self.task_class.max_entries()
    }
}

impl DecisionSink for Scheduler<'_> {
    fn write(&self, tid: u32, start_ticks: u64, d: &Decision) -> Result<(), WriteError> {
        Scheduler::write(self, tid, start_ticks, d)
    }
    fn remove(&self, tid: u32) {
        Scheduler::remove(self, tid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bpf_skel::types::rodata;
    use std::mem::offset_of;
    use std::time::Duration;

    /// An eventfd stands in for the ring buffer's epoll fd: readable once
    /// written, until read.
    #[test]
    fn ring_waker_gives_one_token_per_rearm_and_stops() {
        // SAFETY: a new eventfd, closed at the end.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        assert!(efd >= 0);
        let quiet = Duration::from_millis(300);
        let mut w = RingWaker::start(efd).unwrap();
        assert!(w.woken.recv_timeout(quiet).is_err(), "a token while nothing was readable");
        let one: u64 = 1;
        // SAFETY: 8 bytes to our eventfd.
        assert_eq!(unsafe { libc::write(efd, (&one as *const u64).cast(), 8) }, 8);
        w.woken.recv_timeout(Duration::from_secs(5)).expect("no token once readable");
        // Still readable (nobody drained it): no second token before rearm.
        assert!(w.woken.recv_timeout(quiet).is_err(), "a second token before rearm");
        w.rearm.send(()).unwrap();
        w.woken.recv_timeout(Duration::from_secs(5)).expect("no token after rearm, still readable");
        // Stopped while it waits for a rearm, then while it polls: both join.
        w.stop();
        assert!(w.thread.is_none());
        let mut w = RingWaker::start(efd).unwrap();
        let mut buf = 0u64;
        // SAFETY: reads the eventfd's 8-byte counter (drains it).
        assert_eq!(unsafe { libc::read(efd, (&mut buf as *mut u64).cast(), 8) }, 8);
        std::thread::sleep(Duration::from_millis(50));
        w.stop();
        assert!(w.thread.is_none());
        // SAFETY: our eventfd, no longer used.
        unsafe { libc::close(efd) };
    }

    /// The bytes of a read-only data section as the kernel would hold them.
    fn section(len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        let mut put = |off: usize, v: &[u8]| b[off..off + v.len()].copy_from_slice(v);
        for (i, us) in [700u64, 1500, 2500, 20000].iter().enumerate() {
            put(offset_of!(rodata, class_slice_ns) + 8 * i, &(us * 1000).to_ne_bytes());
        }
        put(offset_of!(rodata, starve_ns), &80_000_000u64.to_ne_bytes());
        put(offset_of!(rodata, wake_preempt_ns), &400_000u64.to_ne_bytes());
        put(offset_of!(rodata, decision_ttl_ns), &2_500_000_000u64.to_ne_bytes());
        put(offset_of!(rodata, default_class), &3u32.to_ne_bytes());
        put(offset_of!(rodata, nr_cpus), &8u32.to_ne_bytes());
        put(offset_of!(rodata, nr_nodes), &2u32.to_ne_bytes());
        put(offset_of!(rodata, numa_enabled), &[1]);
        put(offset_of!(rodata, nr_tenants), &3u32.to_ne_bytes());
        b
    }

    #[test]
    fn tunables_decode_in_config_units() {
        let t = decode_tunables(&section(size_of::<rodata>())).unwrap();
        assert_eq!(
            t,
            Tunables {
                slice_us: [700, 1500, 2500, 20000],
                starvation_bound_ms: 80,
                wakeup_preempt_us: 400,
                decision_ttl_ms: 2500,
                default_class: 3,
                nr_cpus: 8,
                nr_nodes: 2,
                numa: true,
                nr_tenants: 3,
            }
        );
        // The kernel's copy may end before the generated type does.
        let short = offset_of!(rodata, nr_tenants) + 4;
        assert_eq!(decode_tunables(&section(short)).unwrap(), t);
    }

    #[test]
    fn truncated_tunables_are_an_error_not_a_panic() {
        for len in [0, 7, offset_of!(rodata, nr_tenants) + 3] {
            let e = decode_tunables(&vec![0; len]).unwrap_err().to_string();
            assert!(e.contains(&format!("holds {len} bytes")), "{e}");
        }
    }
}
