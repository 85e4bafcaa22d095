//! Checking the `[topology]` config section against the machine, and its pins as maps.

use std::collections::BTreeMap;

use super::{PciAddr, Topology};
use crate::config::TopologyConfig;

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
