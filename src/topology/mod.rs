//! Machine topology: CPUs, NUMA nodes and which node each GPU hangs off.
//!
//! Everything is read once, at start-up, from plain sysfs files below a `sysfs_root` (normally
//! `/sys`; unit tests point it at a fixture tree in a temp dir):
//!
//! ```text
//! <root>/devices/system/cpu/online              "0-3": the online CPUs
//! <root>/devices/system/node/nodeN/cpulist      "0-1": the CPUs of node N; no node/ directory
//!                                               means one node 0 holding every CPU
//! <root>/bus/pci/devices/DDDD:BB:DD.F/          vendor 0x10de (NVIDIA) or 0x1002 (AMD) and class
//!                                               0x0300xx, 0x0302xx or 0x0380xx: a GPU;
//!                                               numa_node (-1 = unknown), local_cpulist
//!
//! gpu_node(i): config pin { gpu = i } ─────────────────────────────────────> node
//!                │ none
//!              device list (i, bus id) ──> config pin { bus_id } ──────────> node
//!                                            │ none
//!                                          sysfs numa_node of that bus id ─> node, or None
//! ```
//!
//! GPU *indices* are never taken from directory order: the GPU provider hands over its own device
//! list with [`Topology::set_gpu_devices`], and each index is matched by PCI bus id (normalised,
//! so NVML's `00000000:3B:00.0` matches sysfs's `0000:3b:00.0`). `gpu_node` pins from the config
//! ([`TopologyConfig`]) win over sysfs; they are how firmware that reports `numa_node = -1` is
//! corrected, and how a VM without any GPU is told "GPU 0 is on node 1".
//!
//! Missing or garbled files never panic: a file
//! that matters for the whole machine (no CPU found) is an error, anything else is skipped with a
//! `tracing::warn!`.

mod config;
mod pci;
#[cfg(test)]
mod tests;

use crate::config::TopologyConfig;
pub use pci::{Gpu, GpuVendor, PciAddr};

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

use anyhow::{bail, Context, Result};
use tracing::warn;

/// Where sysfs is mounted on a real machine.
pub(crate) const SYSFS_ROOT: &str = "/sys";

/// The largest CPU id a cpulist may name (the kernel's NR_CPUS is at most 8192); guards against
/// garbage like "0-4294967295" allocating gigabytes.
const MAX_CPUS: usize = 1 << 16;

/// One online CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cpu {
    /// Kernel CPU id.
    pub id: usize,
    /// NUMA node id.
    pub node: usize,
}

/// The machine's layout; see the module doc.
#[derive(Debug, Clone, Default)]
pub struct Topology {
    /// Online CPUs, ascending id.
    cpus: Vec<Cpu>,
    /// Node id -> its online CPUs (ascending); only nodes with at least one online CPU.
    nodes: BTreeMap<usize, Vec<usize>>,
    /// GPUs found in PCI sysfs, ascending bus id.
    gpus: Vec<Gpu>,
    /// GPU index -> PCI address, from the GPU provider's device list.
    gpu_addrs: BTreeMap<u32, PciAddr>,
    /// Config pins by GPU index and by PCI address.
    pins_by_index: BTreeMap<u32, usize>,
    pins_by_addr: BTreeMap<PciAddr, usize>,
}

impl Topology {
    /// Reads CPUs, nodes and GPUs below `sysfs_root` (use [`SYSFS_ROOT`] on a real machine).
    /// Fails only if no online CPU can be found.
    pub fn read(sysfs_root: &Path) -> Result<Topology> {
        let cpu_dir = sysfs_root.join("devices/system/cpu");
        let online = online_cpus(&cpu_dir)?;
        let node_of = cpu_nodes(&sysfs_root.join("devices/system/node"), &online);

        let cpus: Vec<Cpu> = online.iter().map(|&id| Cpu { id, node: node_of[&id] }).collect();

        let mut nodes: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for cpu in &cpus {
            nodes.entry(cpu.node).or_default().push(cpu.id);
        }

        Ok(Topology { cpus, nodes, gpus: pci::scan_gpus(&sysfs_root.join("bus/pci/devices")), ..Default::default() })
    }

    /// Number of online CPUs.
    pub(crate) fn nr_cpus(&self) -> usize {
        self.cpus.len()
    }

    /// Online CPUs, ascending id.
    #[cfg(test)]
    pub(crate) fn cpus(&self) -> &[Cpu] {
        &self.cpus
    }

    fn cpu(&self, cpu: usize) -> Option<&Cpu> {
        self.cpus.binary_search_by_key(&cpu, |c| c.id).ok().map(|i| &self.cpus[i])
    }

    /// NUMA node of `cpu`, or `None` if it is not an online CPU.
    pub(crate) fn cpu_node(&self, cpu: usize) -> Option<usize> {
        self.cpu(cpu).map(|c| c.node)
    }

    /// Ids of the nodes that have at least one online CPU, ascending. Memory-only nodes (CXL,
    /// HBM) are left out: the scheduler cannot place a thread on them.
    pub(crate) fn nodes(&self) -> Vec<usize> {
        self.nodes.keys().copied().collect()
    }

    /// One past the highest id in [`Self::nodes`]: the size of an array indexed by node id.
    /// Equals `nodes().len()` when node ids are contiguous (as they almost always are).
    pub(crate) fn nr_nodes(&self) -> usize {
        self.nodes.keys().next_back().map_or(1, |&n| n + 1)
    }

    /// Online CPUs of `node`, ascending (empty for an unknown or CPU-less node).
    #[cfg(test)]
    pub(crate) fn node_cpus(&self, node: usize) -> &[usize] {
        self.nodes.get(&node).map(Vec::as_slice).unwrap_or(&[])
    }

    /// GPUs found in PCI sysfs, ascending bus id (this order is *not* the GPU index order).
    pub fn gpus(&self) -> &[Gpu] {
        &self.gpus
    }

    /// Records the GPU provider's device list, `(index, PCI bus id)` as NVML reports it, e.g.
    /// `(0, "00000000:3B:00.0")`. Replaces any earlier list. Bus ids that do not parse are
    /// skipped with a warning.
    pub(crate) fn set_gpu_devices<S: AsRef<str>>(&mut self, devices: &[(u32, S)]) {
        self.gpu_addrs.clear();
        for (index, bus_id) in devices {
            match bus_id.as_ref().parse::<PciAddr>() {
                Ok(addr) => {
                    if !self.gpus.iter().any(|g| g.addr == addr) {
                        tracing::debug!("topology: GPU {index} ({addr}) not found in PCI sysfs");
                    }
                    self.gpu_addrs.insert(*index, addr);
                }
                Err(e) => warn!("topology: GPU {index}: {e}"),
            }
        }
    }

    /// PCI address of GPU `gpu_index`, from the device list given to [`Self::set_gpu_devices`].
    #[cfg(test)]
    pub(crate) fn gpu_addr(&self, gpu_index: u32) -> Option<PciAddr> {
        self.gpu_addrs.get(&gpu_index).copied()
    }

    /// Checks `cfg` against this machine and installs its GPU -> node pins (replacing earlier ones).
    pub(crate) fn apply_config(&mut self, cfg: &TopologyConfig) -> Result<(), String> {
        cfg.validate(self)?;
        let (by_index, by_addr) = cfg.pins()?;
        for addr in by_addr.keys() {
            if !self.gpus.iter().any(|g| g.addr == *addr) {
                warn!("topology: gpu_node pin for {addr}: no such GPU in PCI sysfs (yet)");
            }
        }
        self.pins_by_index = by_index;
        self.pins_by_addr = by_addr;
        Ok(())
    }

    /// NUMA node of GPU `gpu_index`: a config pin by index, else a config pin by its bus id,
    /// else the `numa_node` sysfs reports for its bus id. `None` if none of those knows, or if
    /// sysfs names a node with no online CPU.
    pub(crate) fn gpu_node(&self, gpu_index: u32) -> Option<usize> {
        if let Some(&node) = self.pins_by_index.get(&gpu_index) {
            return Some(node);
        }
        let addr = self.gpu_addrs.get(&gpu_index)?;
        if let Some(&node) = self.pins_by_addr.get(addr) {
            return Some(node);
        }
        let node = self.gpus.iter().find(|g| g.addr == *addr)?.numa_node?;
        self.nodes.contains_key(&node).then_some(node)
    }

    /// The node to prefer for a thread that uses `gpu_indices`: the node of the *first* GPU in
    /// the slice whose node is known (GPUs with unknown nodes are skipped). A process spread over
    /// GPUs on several nodes thus follows the GPU it lists first, e.g. its `cuda:0`. `None` if no
    /// listed GPU has a known node.
    pub(crate) fn preferred_node_for_gpus(&self, gpu_indices: &[u32]) -> Option<usize> {
        gpu_indices.iter().find_map(|&g| self.gpu_node(g))
    }
}

/// Online CPU ids, ascending: from `cpu/online`, else (with a warning) from the `cpuN`
/// directories whose `online` file is not "0".
fn online_cpus(cpu_dir: &Path) -> Result<Vec<usize>> {
    let online_file = cpu_dir.join("online");
    let cpus = match read_trimmed(&online_file).map(|s| parse_cpulist(&s)) {
        Some(Ok(cpus)) => cpus,
        other => {
            if let Some(Err(e)) = other {
                warn!("topology: {}: {e}; listing cpuN directories", online_file.display());
            } else {
                warn!("topology: cannot read {}; listing cpuN directories", online_file.display());
            }
            let mut cpus: Vec<usize> = fs::read_dir(cpu_dir)
                .with_context(|| format!("cannot list {}", cpu_dir.display()))?
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.strip_prefix("cpu")?.parse().ok())
                .filter(|id: &usize| read_trimmed(&cpu_dir.join(format!("cpu{id}/online"))).as_deref() != Some("0"))
                .collect();
            cpus.sort_unstable();
            cpus
        }
    };
    if cpus.is_empty() {
        bail!("no online CPU found below {}", cpu_dir.display());
    }
    Ok(cpus)
}

/// Node of every online CPU. No readable `node/` directory (a kernel without NUMA) or no
/// `nodeN` in it: everything on node 0. A CPU no node lists goes to the lowest node, with a
/// warning.
fn cpu_nodes(node_dir: &Path, online: &[usize]) -> BTreeMap<usize, usize> {
    let mut node_of: BTreeMap<usize, usize> = BTreeMap::new();
    let mut node_ids = BTreeSet::new();
    match fs::read_dir(node_dir) {
        Ok(entries) => {
            for e in entries.flatten() {
                let name = e.file_name();
                let Some(node) = name.to_str().and_then(|n| n.strip_prefix("node")?.parse().ok()) else {
                    continue;
                };
                node_ids.insert(node);
                let file = e.path().join("cpulist");
                let list = match read_trimmed(&file).map(|s| parse_cpulist(&s)) {
                    Some(Ok(list)) => list,
                    Some(Err(e)) => {
                        warn!("topology: {}: {e}", file.display());
                        continue;
                    }
                    None => {
                        warn!("topology: cannot read {}", file.display());
                        continue;
                    }
                };
                for cpu in list {
                    if let Some(old) = node_of.insert(cpu, node) {
                        warn!("topology: cpu{cpu} listed by node{old} and node{node}");
                        node_of.insert(cpu, old.min(node));
                    }
                }
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => warn!("topology: cannot list {}: {e}; assuming one node", node_dir.display()),
    }
    let fallback = node_ids.first().copied().unwrap_or(0);
    online
        .iter()
        .map(|&cpu| {
            let node = node_of.get(&cpu).copied().unwrap_or_else(|| {
                if !node_ids.is_empty() {
                    warn!("topology: cpu{cpu} is in no node's cpulist; using node {fallback}");
                }
                fallback
            });
            (cpu, node)
        })
        .collect()
}

/// Parses a kernel cpulist such as "0-3,8,10-11" (ascending, deduplicated). Empty input is an
/// empty list (a CPU-less node's cpulist is just "\n").
pub(crate) fn parse_cpulist(s: &str) -> Result<Vec<usize>, String> {
    let mut cpus = BTreeSet::new();
    for part in s.trim_matches(|c: char| c == '\0' || c.is_whitespace()).split(',') {
        let part = part.trim();
        if part.is_empty() {
            continue;
        }
        let num = |t: &str| {
            t.trim()
                .parse::<usize>()
                .ok()
                .filter(|&n| n < MAX_CPUS)
                .ok_or_else(|| format!("bad cpulist {s:?}: {t:?} is not a CPU id"))
        };
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (num(a)?, num(b)?),
            None => (num(part)?, num(part)?),
        };
        if lo > hi {
            return Err(format!("bad cpulist {s:?}: range {part:?} runs backwards"));
        }
        cpus.extend(lo..=hi);
    }
    Ok(cpus.into_iter().collect())
}

/// A sysfs file's content without surrounding whitespace, or `None` if unreadable.
fn read_trimmed(path: &Path) -> Option<String> {
    fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}
