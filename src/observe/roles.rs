//! Thread roles from thread names.
//!
//! The names PyTorch 2.15 and NCCL 2.x give their threads (comm, at most 15
//! bytes), each seen in a real run (CPU training with DataLoader workers,
//! torchrun DDP over gloo) or read from the library that sets it:
//!
//! ```text
//! name (prefix)      set by                                               role
//! pt_data_worker     torch/utils/data/_utils/worker.py (DataLoader worker) DataLoader
//! pt_data_pin        torch/utils/data/_utils/pin_memory.py                 PinMemory
//! pt_autograd_<n>    libtorch_cpu: autograd engine, one per device         Autograd
//! pt_gloo_runloop    libtorch_cpu: ProcessGroupGloo worker threads         Gloo
//! gloo_tcp_loop      libtorch_cpu: gloo's TCP transport event loop         Gloo
//! pt_nccl_watchdg    libtorch_cuda: ProcessGroupNCCL watchdog              NcclMonitor
//! pt_nccl_heartbt    libtorch_cuda: ProcessGroupNCCL heartbeat monitor     NcclMonitor
//! NCCL Progress<n>   libnccl.so.2: proxy progress thread                   NcclProgress
//! NCCL <other>       libnccl.so.2: Service, UDS Service, IbAsync, RAS...   NcclService
//! pt_elastic         torch/distributed/run.py (the torchrun agent)         Other
//! pt_tcpstore*       libtorch_cpu: TCPStore server (pt_tcpstore_uv)        Other
//! ```
//! The main thread keeps the interpreter's name (`python3`): PyTorch does not
//! rename it. So the main thread (tid == pid) of an ML process is the
//! Trainer unless its name says otherwise, and every thread of a DataLoader
//! worker process is a DataLoader (a worker's helper threads keep the name
//! `pt_data_worker` they inherit). NCCL names its threads only with
//! NCCL_SET_THREAD_NAME=1.

use super::types::ThreadRole;

/// Role given by the name alone, if the name is a known one.
pub fn role_from_name(comm: &str) -> Option<ThreadRole> {
    const TABLE: &[(&str, ThreadRole)] = &[
        ("pt_data_worker", ThreadRole::DataLoader),
        ("pt_data_pin", ThreadRole::PinMemory),
        ("pt_autograd_", ThreadRole::Autograd),
        ("pt_gloo_runloop", ThreadRole::Gloo),
        ("gloo_tcp_loop", ThreadRole::Gloo),
        ("pt_nccl_", ThreadRole::NcclMonitor),
        ("NCCL Progress", ThreadRole::NcclProgress),
        ("NCCL ", ThreadRole::NcclService),
        ("pt_elastic", ThreadRole::Other),
        ("pt_tcpstore", ThreadRole::Other),
    ];
    TABLE.iter().find(|(prefix, _)| comm.starts_with(prefix)).map(|(_, role)| *role)
}

/// True when a process name marks a DataLoader worker process.
pub fn is_loader_name(comm: &str) -> bool {
    role_from_name(comm) == Some(ThreadRole::DataLoader)
}

/// The role of one thread.
///
/// * `ml`: its process is ML;
/// * `main_thread`: tid == pid;
/// * `loader_process`: its process is a DataLoader worker.
pub fn thread_role(comm: &str, ml: bool, main_thread: bool, loader_process: bool) -> ThreadRole {
    if !ml {
        return ThreadRole::NonMl;
    }
    match role_from_name(comm) {
        Some(role) => role,
        None if loader_process => ThreadRole::DataLoader,
        None if main_thread => ThreadRole::Trainer,
        None => ThreadRole::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pytorch_and_nccl_names() {
        let r = |c| thread_role(c, true, false, false);
        assert_eq!(r("pt_autograd_0"), ThreadRole::Autograd);
        assert_eq!(r("pt_data_worker"), ThreadRole::DataLoader);
        assert_eq!(r("pt_data_pin"), ThreadRole::PinMemory);
        assert_eq!(r("pt_gloo_runloop"), ThreadRole::Gloo);
        assert_eq!(r("gloo_tcp_loop"), ThreadRole::Gloo);
        assert_eq!(r("pt_nccl_watchdg"), ThreadRole::NcclMonitor);
        assert_eq!(r("pt_nccl_heartbt"), ThreadRole::NcclMonitor);
        assert_eq!(r("NCCL Progress 0"), ThreadRole::NcclProgress);
        assert_eq!(r("NCCL Service  1"), ThreadRole::NcclService);
        assert_eq!(r("pt_tcpstore_uv"), ThreadRole::Other);
        assert_eq!(r("python3"), ThreadRole::Other);
        // Names no PyTorch 2.15 thread carries are nobody's.
        assert_eq!(role_from_name("pt_main_thread"), None);
        assert_eq!(role_from_name("pt_multiprocess"), None);
    }

    #[test]
    fn main_thread_loader_process_and_non_ml() {
        assert_eq!(thread_role("python3", true, true, false), ThreadRole::Trainer);
        assert_eq!(thread_role("python3", true, true, true), ThreadRole::DataLoader);
        assert_eq!(thread_role("omp_thread", true, false, true), ThreadRole::DataLoader);
        assert_eq!(thread_role("pt_elastic", true, true, false), ThreadRole::Other);
        assert_eq!(thread_role("pt_autograd_0", false, false, false), ThreadRole::NonMl);
        assert!(is_loader_name("pt_data_worker"));
        assert!(!is_loader_name("pt_data_pin"));
    }
}
