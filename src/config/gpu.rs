//! `[gpu]`: where GPU data comes from.

use serde::{Deserialize, Serialize};

/// `[gpu] provider`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    /// NVML if it loads, else the file provider if `file` is set, else none.
    #[default]
    Auto,
    Nvml,
    File,
    None,
}

/// The `[gpu]` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GpuConfig {
    /// Where GPU data comes from: "auto", "nvml", "file" or "none".
    pub provider: ProviderKind,
    /// JSON file of the file provider (format in gpu.rs's module doc). Required
    /// with provider = "file"; with "auto", used when NVML is absent.
    pub file: String,
    /// NVML: per-process utilisation samples younger than this (ms) count.
    pub nvml_sample_window_ms: u64,
}

impl Default for GpuConfig {
    fn default() -> Self {
        GpuConfig { provider: ProviderKind::Auto, file: String::new(), nvml_sample_window_ms: 1000 }
    }
}

impl GpuConfig {
    pub fn validate(&self) -> Result<(), String> {
        if self.provider == ProviderKind::File && self.file.trim().is_empty() {
            return Err("gpu.file must be set when gpu.provider = \"file\"".into());
        }
        if !(10..=60_000).contains(&self.nvml_sample_window_ms) {
            return Err("gpu.nvml_sample_window_ms must be within 10..=60000".into());
        }
        Ok(())
    }
}
