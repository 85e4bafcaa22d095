//! The `[topology]` config section.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{PciAddr, Topology};

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

/// Pins keyed by GPU index and by PCI address.
pub(super) type Pins = (BTreeMap<u32, usize>, BTreeMap<PciAddr, usize>);

impl TopologyConfig {
    /// Checks every pin against `topo`; the error names the offending key, e.g.
    /// `topology.gpu_node[1].node = 3: no such node with online CPUs (nodes: [0, 1])`.
    pub fn validate(&self, topo: &Topology) -> Result<(), String> {
        let nodes = topo.nodes();
        for (i, pin) in self.gpu_node.iter().enumerate() {
            if !nodes.contains(&pin.node) {
                return Err(format!(
                    "topology.gpu_node[{i}].node = {}: no such node with online CPUs (nodes: {nodes:?})",
                    pin.node
                ));
            }
        }
        self.pins().map(|_| ())
    }

    /// The pins as maps; errors on an entry with neither or both of `gpu`/`bus_id`, a bad bus
    /// id, or a GPU pinned twice.
    pub(super) fn pins(&self) -> Result<Pins, String> {
        let (mut by_index, mut by_addr) = (BTreeMap::new(), BTreeMap::new());
        let mut seen_index: BTreeMap<u32, usize> = BTreeMap::new();
        let mut seen_addr: BTreeMap<PciAddr, usize> = BTreeMap::new();
        for (i, pin) in self.gpu_node.iter().enumerate() {
            match (pin.gpu, &pin.bus_id) {
                (Some(gpu), None) => {
                    if let Some(j) = seen_index.insert(gpu, i) {
                        return Err(format!("topology.gpu_node[{i}].gpu = {gpu}: already pinned by gpu_node[{j}]"));
                    }
                    by_index.insert(gpu, pin.node);
                }
                (None, Some(bus_id)) => {
                    let addr: PciAddr = bus_id.parse().map_err(|e| format!("topology.gpu_node[{i}].bus_id: {e}"))?;
                    if let Some(j) = seen_addr.insert(addr, i) {
                        return Err(format!(
                            "topology.gpu_node[{i}].bus_id = {bus_id:?}: already pinned by gpu_node[{j}]"
                        ));
                    }
                    by_addr.insert(addr, pin.node);
                }
                _ => return Err(format!("topology.gpu_node[{i}]: set exactly one of `gpu` or `bus_id`")),
            }
        }
        Ok((by_index, by_addr))
    }
}
