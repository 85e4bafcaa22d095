//! Thread roles from thread names.
//!
//! PyTorch and NCCL name their threads (comm, at most 15 bytes):
//!
//! ```text
//! name (prefix)          who sets it                         role
//! pt_main_thread         PyTorch main thread                 Trainer
//! pt_autograd_<n>        autograd engine, one per device     Autograd
//! pt_multiprocess*       DataLoader worker (truncated)       DataLoader
//! pt_data_worker         DataLoader worker (torch >= 2.1)    DataLoader
//! pt_thread_data_*       thread-based data workers           DataLoader
//! pt_data_pin            pin-memory thread                   PinMemory
//! pt_nccl_watchdg        ProcessGroupNCCL watchdog           NcclMonitor
//! pt_nccl_heartbt        ProcessGroupNCCL heartbeat monitor  NcclMonitor
//! NCCL Progress<dev>     NCCL proxy progress thread          NcclProgress
//! NCCL Service<dev>      NCCL proxy service thread           NcclService
//! NCCL <other>           other NCCL threads (UDS, IbAsync..) NcclService
//! pt_elastic             torchrun agent                      Other
//! ```
//! NCCL only names its threads with NCCL_SET_THREAD_NAME=1. The main thread
//! (tid == pid) of an ML process is the Trainer unless its name says
//! otherwise; every thread of a DataLoader worker process is a DataLoader.

use super::types::ThreadRole;

/// Role given by the name alone, if the name is a known one.
pub fn role_from_name(comm: &str) -> Option<ThreadRole> {
    const TABLE: &[(&str, ThreadRole)] = &[
        ("pt_main_thread", ThreadRole::Trainer),
        ("pt_autograd_", ThreadRole::Autograd),
        ("pt_multiprocess", ThreadRole::DataLoader),
        ("pt_data_worker", ThreadRole::DataLoader),
        ("pt_thread_data_", ThreadRole::DataLoader),
        ("pt_data_pin", ThreadRole::PinMemory),
        ("pt_nccl_", ThreadRole::NcclMonitor),
        ("NCCL Progress", ThreadRole::NcclProgress),
        ("NCCL ", ThreadRole::NcclService),
        ("pt_elastic", ThreadRole::Other),
    ];
    TABLE
        .iter()
        .find(|(prefix, _)| comm.starts_with(prefix))
        .map(|(_, role)| *role)
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
        assert_eq!(r("pt_multiprocess"), ThreadRole::DataLoader);
        assert_eq!(r("pt_data_worker"), ThreadRole::DataLoader);
        assert_eq!(r("pt_thread_data_3"), ThreadRole::DataLoader);
        assert_eq!(r("pt_data_pin"), ThreadRole::PinMemory);
        assert_eq!(r("pt_nccl_watchdg"), ThreadRole::NcclMonitor);
        assert_eq!(r("pt_nccl_heartbt"), ThreadRole::NcclMonitor);
        assert_eq!(r("NCCL Progress 0"), ThreadRole::NcclProgress);
        assert_eq!(r("NCCL Service  1"), ThreadRole::NcclService);
        assert_eq!(r("pt_main_thread"), ThreadRole::Trainer);
        assert_eq!(r("python3"), ThreadRole::Other);
    }

    #[test]
    fn main_thread_loader_process_and_non_ml() {
        assert_eq!(
            thread_role("python3", true, true, false),
            ThreadRole::Trainer
        );
        assert_eq!(
            thread_role("python3", true, true, true),
            ThreadRole::DataLoader
        );
        assert_eq!(
            thread_role("omp_thread", true, false, true),
            ThreadRole::DataLoader
        );
        assert_eq!(
            thread_role("pt_elastic", true, true, false),
            ThreadRole::Other
        );
        assert_eq!(
            thread_role("pt_autograd_0", false, false, false),
            ThreadRole::NonMl
        );
        assert!(is_loader_name("pt_multiprocess"));
        assert!(!is_loader_name("pt_data_pin"));
    }
}
