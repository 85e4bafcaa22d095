//! GPU data: which GPUs exist, how busy they are, and which processes use
//! them.
//!
//! ```text
//!  [gpu] provider = "auto" ──> NVML loads? ──yes──> NvmlProvider
//!                                  │no
//!                              file set? ──yes──> FileProvider
//!                                  │no
//!                                NoGpu (no data, not an error)
//! ```
//! The daemon calls [`GpuProvider::refresh`] once per pass, then hands the
//! provider to the observer's `poll`, which joins the
//! per-process list with the processes it sees (pid -> device, SM %).
//!
//! **NVML** (`libnvidia-ml.so.1`) is loaded at run time by nvml-wrapper:
//! on a machine without the NVIDIA driver the provider reports nothing and
//! says so once at info level. Per-process SM utilisation comes from
//! `nvmlDeviceGetProcessUtilization` over the last `nvml_sample_window_ms`
//! (the most recent sample of each pid wins); processes with a context but
//! no recent sample are listed with 0 %.
//!
//! **File** provider: a JSON file re-read on every refresh, written by
//! simulations and tests (the `zernel-workload` fake GPU writes it):
//!
//! ```json
//! {
//!   "devices":   [ { "index": 0, "uuid": "GPU-fake-0", "pci_bus_id": "00000000:3B:00.0", "util": 87 } ],
//!   "processes": [ { "pid": 4242, "device": 0, "sm_util": 85 } ]
//! }
//! ```
//! Every field is optional (index defaults to the position in the list,
//! strings to "", numbers to 0; percentages are capped at 100; unknown
//! fields are ignored). A missing file means no GPU data; a file that does
//! not parse (caught mid-write) leaves the previous data in place. Writers
//! should write a temporary file and rename it.

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::config::{GpuConfig, ProviderKind};

/// One GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuDevice {
    /// Provider index (NVML index; for CUDA_VISIBLE_DEVICES ordinals).
    pub index: u32,
    pub uuid: String,
    /// PCI bus id, e.g. "00000000:3B:00.0" (topology maps it to a NUMA node).
    pub pci_bus_id: String,
    /// Whole-device utilisation in % over the provider's sample period.
    pub util_pct: u32,
}

/// One process using one GPU.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuProcess {
    pub pid: u32,
    /// Index of the device (see [`GpuDevice::index`]).
    pub device: u32,
    /// SM utilisation caused by this process, in %.
    pub sm_util_pct: u32,
}

/// A source of GPU data.
pub trait GpuProvider: Send {
    /// "nvml", "file" or "none".
    fn name(&self) -> &'static str;
    /// Re-reads the data. Failures are logged and leave no or old data.
    fn refresh(&mut self);
    fn devices(&self) -> &[GpuDevice];
    /// Per-process usage; a process may appear once per device it uses.
    fn processes(&self) -> &[GpuProcess];
}

/// Builds the provider `cfg` asks for. Never fails: without data the
/// provider is [`NoGpu`].
pub fn open(cfg: &GpuConfig) -> Box<dyn GpuProvider> {
    let file = || -> Box<dyn GpuProvider> { Box::new(FileProvider::new(PathBuf::from(&cfg.file))) };
    match cfg.provider {
        ProviderKind::None => Box::new(NoGpu),
        ProviderKind::File => file(),
        ProviderKind::Nvml => match NvmlProvider::new(cfg.nvml_sample_window_ms) {
            Some(p) => Box::new(p),
            None => Box::new(NoGpu),
        },
        ProviderKind::Auto => match NvmlProvider::new(cfg.nvml_sample_window_ms) {
            Some(p) => Box::new(p),
            None if !cfg.file.trim().is_empty() => file(),
            None => Box::new(NoGpu),
        },
    }
}

/// No GPU data.
#[derive(Debug, Default)]
pub struct NoGpu;

impl GpuProvider for NoGpu {
    fn name(&self) -> &'static str {
        "none"
    }
    fn refresh(&mut self) {}
    fn devices(&self) -> &[GpuDevice] {
        &[]
    }
    fn processes(&self) -> &[GpuProcess] {
        &[]
    }
}

// ---------------------------------------------------------------- file ----

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct FileDevice {
    index: Option<u32>,
    uuid: String,
    pci_bus_id: String,
    util: u32,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct FileProcess {
    pid: u32,
    device: u32,
    sm_util: u32,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct FileData {
    devices: Vec<FileDevice>,
    processes: Vec<FileProcess>,
}

/// Reads GPU data from a JSON file on every refresh (see the module doc).
#[derive(Debug)]
pub struct FileProvider {
    path: PathBuf,
    devices: Vec<GpuDevice>,
    processes: Vec<GpuProcess>,
    reported_missing: bool,
}

impl FileProvider {
    pub fn new(path: PathBuf) -> FileProvider {
        FileProvider { path, devices: Vec::new(), processes: Vec::new(), reported_missing: false }
    }

    /// Parses the file format; Err on malformed JSON.
    fn parse(text: &str) -> Result<(Vec<GpuDevice>, Vec<GpuProcess>), serde_json::Error> {
        let data: FileData = serde_json::from_str(text)?;
        let devices = data
            .devices
            .into_iter()
            .enumerate()
            .map(|(i, d)| GpuDevice {
                index: d.index.unwrap_or(i as u32),
                uuid: d.uuid,
                pci_bus_id: d.pci_bus_id,
                util_pct: d.util.min(100),
            })
            .collect();
        let processes = data
            .processes
            .into_iter()
            .filter(|p| p.pid > 0)
            .map(|p| GpuProcess { pid: p.pid, device: p.device, sm_util_pct: p.sm_util.min(100) })
            .collect();
        Ok((devices, processes))
    }
}

impl GpuProvider for FileProvider {
    fn name(&self) -> &'static str {
        "file"
    }

    fn refresh(&mut self) {
        match std::fs::read_to_string(&self.path) {
            Ok(text) => {
                self.reported_missing = false;
                match Self::parse(&text) {
                    Ok((d, p)) => {
                        self.devices = d;
                        self.processes = p;
                    }
                    // Probably caught mid-write: keep the previous data.
                    Err(e) => tracing::debug!("gpu file {}: {e}", self.path.display()),
                }
            }
            Err(e) => {
                if !self.reported_missing {
                    tracing::info!("gpu file {}: {e}; no GPU data until it appears", self.path.display());
                    self.reported_missing = true;
                }
                self.devices.clear();
                self.processes.clear();
            }
        }
    }

    fn devices(&self) -> &[GpuDevice] {
        &self.devices
    }

    fn processes(&self) -> &[GpuProcess] {
        &self.processes
    }
}

// ---------------------------------------------------------------- NVML ----

/// NVML through nvml-wrapper (libnvidia-ml loaded at run time).
pub(crate) struct NvmlProvider {
    nvml: nvml_wrapper::Nvml,
    window_us: u64,
    devices: Vec<GpuDevice>,
    processes: Vec<GpuProcess>,
    /// Errors already logged (by device), to log each once.
    logged: std::collections::HashSet<(u32, &'static str)>,
}

impl NvmlProvider {
    /// None (logged once at info) when NVML cannot be loaded or initialised.
    pub fn new(window_ms: u64) -> Option<NvmlProvider> {
        match nvml_wrapper::Nvml::init() {
            Ok(nvml) => {
                tracing::info!("gpu: using NVML");
                Some(NvmlProvider {
                    nvml,
                    window_us: window_ms * 1000,
                    devices: Vec::new(),
                    processes: Vec::new(),
                    logged: Default::default(),
                })
            }
            Err(e) => {
                tracing::info!("gpu: NVML not available ({e}); no NVML GPU data");
                None
            }
        }
    }

    fn log_once(&mut self, dev: u32, what: &'static str, e: &dyn std::fmt::Display) {
        if self.logged.insert((dev, what)) {
            tracing::info!("gpu: NVML {what} on device {dev}: {e}");
        }
    }
}

impl GpuProvider for NvmlProvider {
    fn name(&self) -> &'static str {
        "nvml"
    }

    fn refresh(&mut self) {
        let count = match self.nvml.device_count() {
            Ok(c) => c,
            Err(e) => {
                self.log_once(u32::MAX, "device_count", &e);
                self.devices.clear();
                self.processes.clear();
                return;
            }
        };
        let now_us = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0);
        let since = now_us.saturating_sub(self.window_us);
        let mut devices = Vec::with_capacity(count as usize);
        let mut processes: Vec<(GpuProcess, u64)> = Vec::new();
        let mut errors: Vec<(u32, &'static str, String)> = Vec::new();
        for index in 0..count {
            let dev = match self.nvml.device_by_index(index) {
                Ok(d) => d,
                Err(e) => {
                    errors.push((index, "device_by_index", e.to_string()));
                    continue;
                }
            };
            // uuid and bus id never change: keep the previous ones.
            let known = self.devices.iter().find(|d| d.index == index);
            let uuid = known.map(|d| d.uuid.clone()).unwrap_or_else(|| dev.uuid().unwrap_or_default());
            let pci_bus_id = known
                .map(|d| d.pci_bus_id.clone())
                .unwrap_or_else(|| dev.pci_info().map(|p| p.bus_id).unwrap_or_default());
            let util_pct = match dev.utilization_rates() {
                Ok(u) => u.gpu.min(100),
                Err(e) => {
                    errors.push((index, "utilization_rates", e.to_string()));
                    0
                }
            };
            devices.push(GpuDevice { index, uuid, pci_bus_id, util_pct });
            if let Ok(list) = dev.running_compute_processes() {
                for p in list {
                    processes.push((GpuProcess { pid: p.pid, device: index, sm_util_pct: 0 }, 0));
                }
            }
            match dev.process_utilization_stats(since) {
                Ok(samples) => {
                    for s in samples {
                        let cur =
                            (GpuProcess { pid: s.pid, device: index, sm_util_pct: s.sm_util.min(100) }, s.timestamp);
                        match processes.iter_mut().find(|(p, _)| p.pid == s.pid && p.device == index) {
                            Some(slot) if slot.1 <= s.timestamp => *slot = cur,
                            Some(_) => {}
                            None => processes.push(cur),
                        }
                    }
                }
                Err(nvml_wrapper::error::NvmlError::NotFound) => {}
                Err(e) => errors.push((index, "process_utilization_stats", e.to_string())),
            }
        }
        for (dev, what, e) in errors {
            self.log_once(dev, what, &e);
        }
        self.devices = devices;
        self.processes = processes.into_iter().map(|(p, _)| p).collect();
    }

    fn devices(&self) -> &[GpuDevice] {
        &self.devices
    }

    fn processes(&self) -> &[GpuProcess] {
        &self.processes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tempdir::TempDir;

    #[test]
    fn file_provider_reads_and_tolerates_bad_input() {
        let dir = TempDir::new("gpu-parse");
        let path = dir.path().join("gpu.json");
        let _ = std::fs::remove_file(&path);
        let mut p = FileProvider::new(path.clone());
        p.refresh();
        assert!(p.devices().is_empty() && p.processes().is_empty(), "missing file: no data");

        std::fs::write(
            &path,
            r#"{"devices":[{"index":1,"uuid":"GPU-x","pci_bus_id":"0000:3b:00.0","util":250},{"uuid":"GPU-y"}],
               "processes":[{"pid":42,"device":1,"sm_util":77},{"pid":0,"device":0}], "extra": true}"#,
        )
        .unwrap();
        p.refresh();
        assert_eq!(p.devices().len(), 2);
        assert_eq!(
            p.devices()[0],
            GpuDevice { index: 1, uuid: "GPU-x".into(), pci_bus_id: "0000:3b:00.0".into(), util_pct: 100 }
        );
        assert_eq!(p.devices()[1].index, 1, "index defaults to the position");
        assert_eq!(p.processes(), &[GpuProcess { pid: 42, device: 1, sm_util_pct: 77 }]);

        // Caught mid-write: previous data stays.
        std::fs::write(&path, r#"{"devices":[{"index":0,"ut"#).unwrap();
        p.refresh();
        assert_eq!(p.processes().len(), 1);

        // Partial but valid: missing sections are empty.
        std::fs::write(&path, r#"{"devices":[{"util":5}]}"#).unwrap();
        p.refresh();
        assert_eq!(p.devices()[0].util_pct, 5);
        assert!(p.processes().is_empty());

        std::fs::remove_file(&path).unwrap();
        p.refresh();
        assert!(p.devices().is_empty());
    }

    #[test]
    fn config_selection_and_validation() {
        let cfg = GpuConfig { provider: ProviderKind::File, file: String::new(), ..Default::default() };
        assert!(cfg.validate().unwrap_err().contains("gpu.file"));
        let cfg = GpuConfig { nvml_sample_window_ms: 0, ..Default::default() };
        assert!(cfg.validate().unwrap_err().contains("gpu.nvml_sample_window_ms"));
        GpuConfig::default().validate().unwrap();

        let cfg: GpuConfig = toml::from_str("provider = \"none\"").unwrap();
        assert_eq!(open(&cfg).name(), "none");
        let cfg: GpuConfig = toml::from_str("provider = \"file\"\nfile = \"/nonexistent/gpu.json\"").unwrap();
        assert_eq!(open(&cfg).name(), "file");
        assert!(toml::from_str::<GpuConfig>("provider = \"cuda\"").is_err());
        assert!(toml::from_str::<GpuConfig>("unknown = 1").is_err());
        // No NVML on this host: "auto" falls back to the file, then to none.
        if nvml_wrapper::Nvml::init().is_err() {
            let cfg: GpuConfig = toml::from_str("file = \"/nonexistent/gpu.json\"").unwrap();
            assert_eq!(open(&cfg).name(), "file");
            assert_eq!(open(&GpuConfig::default()).name(), "none");
            let cfg: GpuConfig = toml::from_str("provider = \"nvml\"").unwrap();
            assert_eq!(open(&cfg).name(), "none");
        }
    }
}
