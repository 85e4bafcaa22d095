//! PCI addresses and GPU discovery in `<root>/bus/pci/devices/`.

use std::fmt;
use std::fs;
use std::path::Path;
use std::str::FromStr;

use tracing::warn;

use super::{parse_cpulist, read_trimmed};

/// A PCI address, `domain:bus:device.function`. Parsing accepts both the sysfs spelling
/// (`0000:3b:00.0`) and NVML's (`00000000:3B:00.0`: 8-digit domain, upper case); both give the
/// same value, which prints in the sysfs spelling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PciAddr {
    pub domain: u32,
    pub bus: u8,
    pub device: u8,
    pub function: u8,
}

impl FromStr for PciAddr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim_matches(|c: char| c == '\0' || c.is_whitespace());
        let err = || format!("{s:?} is not a PCI bus id like 0000:3b:00.0");
        let hex = |part: &str, max_digits: usize| -> Result<u32, String> {
            if part.is_empty() || part.len() > max_digits {
                return Err(err());
            }
            u32::from_str_radix(part, 16).map_err(|_| err())
        };
        let mut it = t.split(':');
        let (Some(dom), Some(bus), Some(devfn), None) = (it.next(), it.next(), it.next(), it.next()) else {
            return Err(err());
        };
        let (dev, func) = devfn.split_once('.').ok_or_else(err)?;
        let (domain, bus, device, function) = (hex(dom, 8)?, hex(bus, 2)?, hex(dev, 2)?, hex(func, 1)?);
        if device > 0x1f || function > 7 {
            return Err(err());
        }
        Ok(PciAddr { domain, bus: bus as u8, device: device as u8, function: function as u8 })
    }
}

impl fmt::Display for PciAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04x}:{:02x}:{:02x}.{:x}", self.domain, self.bus, self.device, self.function)
    }
}

/// GPU vendors recognised by PCI vendor id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuVendor {
    /// 0x10de
    Nvidia,
    /// 0x1002
    Amd,
}

/// A GPU found in PCI sysfs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    /// Its PCI address (the sysfs directory name).
    pub addr: PciAddr,
    pub vendor: GpuVendor,
    /// PCI class, e.g. 0x030200 for a 3D controller.
    pub class: u32,
    /// `numa_node`; `None` when the firmware reports -1, or the file is missing or garbled.
    pub numa_node: Option<usize>,
    /// `local_cpulist`: CPUs close to the GPU; empty when absent.
    pub local_cpus: Vec<usize>,
}

/// PCI class prefixes (class >> 8) that are GPUs: VGA (0x0300), 3D controller (0x0302), and
/// other display controller (0x0380, which some AMD Instinct boards report).
const GPU_CLASSES: [u32; 3] = [0x0300, 0x0302, 0x0380];

/// Reads a "0x10de"-style hex file.
fn read_hex(path: &Path) -> Option<u32> {
    let s = read_trimmed(path)?;
    u32::from_str_radix(s.strip_prefix("0x").unwrap_or(&s), 16).ok()
}

/// Every NVIDIA/AMD display or 3D device below `pci_dir`, ascending address. A missing
/// directory is no GPU; a garbled entry is skipped with a warning.
pub(super) fn scan_gpus(pci_dir: &Path) -> Vec<Gpu> {
    let Ok(entries) = fs::read_dir(pci_dir) else {
        tracing::debug!("topology: no {}", pci_dir.display());
        return Vec::new();
    };
    let mut gpus = Vec::new();
    for e in entries.flatten() {
        let dir = e.path();
        let vendor = match read_hex(&dir.join("vendor")) {
            Some(0x10de) => GpuVendor::Nvidia,
            Some(0x1002) => GpuVendor::Amd,
            _ => continue,
        };
        let Some(class) = read_hex(&dir.join("class")) else {
            warn!("topology: {}: unreadable class", dir.display());
            continue;
        };
        if !GPU_CLASSES.contains(&(class >> 8)) {
            continue;
        }
        let addr = match e.file_name().to_string_lossy().parse::<PciAddr>() {
            Ok(a) => a,
            Err(err) => {
                warn!("topology: {}: {err}", dir.display());
                continue;
            }
        };
        let numa_node = match read_trimmed(&dir.join("numa_node")).map(|s| s.parse::<i64>()) {
            Some(Ok(n)) if n >= 0 => usize::try_from(n).ok(),
            Some(Ok(_)) | None => None,
            Some(Err(_)) => {
                warn!("topology: {}/numa_node is garbled; node unknown", dir.display());
                None
            }
        };
        let local_cpus = match read_trimmed(&dir.join("local_cpulist")).map(|s| parse_cpulist(&s)) {
            Some(Ok(list)) => list,
            Some(Err(err)) => {
                warn!("topology: {}/local_cpulist: {err}", dir.display());
                Vec::new()
            }
            None => Vec::new(),
        };
        gpus.push(Gpu { addr, vendor, class, numa_node, local_cpus });
    }
    gpus.sort_by_key(|g| g.addr);
    gpus
}
