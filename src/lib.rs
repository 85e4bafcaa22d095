//! scx_zernel: an ML-aware sched_ext scheduler.
//!
//! See the module docs for each stage of the pipeline:
//!
//! ```text
//! zernel.toml ──> config ─────────────────────────────────────┐
//!                                                             v
//! /proc, GPU ──> observe ──> phase ──> policy (+rules, Lua script) ──> decisions (diff) ──> task_class map
//! sysfs ───────> topology ──────────────┘                                                      │
//!                                                                                              v
//!                        stats <── counters <── main.bpf.c: select_cpu / enqueue / dispatch
//! ```

pub mod class;
pub mod config;
pub mod daemon;
pub mod decisions;
mod devices;
mod events;
pub mod gpu;
pub mod inspect;
pub mod logging;
pub mod observe;
pub mod observe_cmd;
pub mod openmetrics;
pub mod phase;
pub mod pipeline;
pub mod policy;
pub mod policy_script;
pub mod reload;
mod rules;
pub mod sched;
pub mod stats;
mod tenants;
pub mod topology;

/// Unit tests' temporary directories (the file the integration tests share).
#[cfg(test)]
#[path = "../tests/common/tempdir.rs"]
mod tempdir;

/// Structs and constants shared with the BPF side (generated from src/bpf/intf.h).
#[allow(non_upper_case_globals, non_camel_case_types, non_snake_case, dead_code)]
pub mod bpf_intf {
    include!(concat!(env!("OUT_DIR"), "/bpf_intf.rs"));
}

/// The libbpf-rs skeleton of src/bpf/main.bpf.c.
#[allow(non_upper_case_globals, non_camel_case_types, non_snake_case, dead_code, clippy::all)]
mod bpf_skel {
    include!(concat!(env!("OUT_DIR"), "/bpf_skel.rs"));
}

#[allow(non_upper_case_globals, non_camel_case_types, non_snake_case, dead_code, clippy::all)]
mod threads_skel {
    include!(concat!(env!("OUT_DIR"), "/threads_skel.rs"));
}
