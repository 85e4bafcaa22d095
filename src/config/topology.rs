//! `[topology]`: GPU -> NUMA node pins.

use serde::{Deserialize, Serialize};

/// `[topology]`: facts about the machine that sysfs gets wrong or does not know.
///
/// ```toml
/// [topology]
/// # GPU 0 (as NVML numbers it) is on node 1, and so is the GPU at PCI 0000:3b:00.0.
/// gpu_node = [{ gpu = 0, node = 1 }, { bus_id = "0000:3b:00.0", node = 1 }]
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TopologyConfig {
    /// Pins GPUs to NUMA nodes, overriding the `numa_node` sysfs reports (which is -1, unknown,
    /// on firmware without proximity info, and absent in a VM with no GPU). Each entry names
    /// the GPU by exactly one of `gpu` (index as NVML numbers it) or `bus_id` (PCI address in
    /// either sysfs or NVML spelling), plus `node`, which must be a node with online CPUs. A pin
    /// by index wins over a pin by bus id. Default: no pins.
    pub gpu_node: Vec<GpuNodePin>,
}

/// One `gpu_node` entry: `{ gpu = 0, node = 1 }` or `{ bus_id = "0000:3b:00.0", node = 1 }`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuNodePin {
    /// GPU index, as NVML (and `nvidia-smi`) numbers it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<u32>,
    /// PCI bus id, e.g. "0000:3b:00.0" or "00000000:3B:00.0".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bus_id: Option<String>,
    /// NUMA node the GPU is attached to.
    pub node: usize,
}
