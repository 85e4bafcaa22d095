//! ML evidence: why a process is considered an ML process.
//!
//! ```text
//!  /proc/<pid>/environ ── RANK, LOCAL_RANK, WORLD_SIZE ──────────> ENV_RANK
//!                      └─ CUDA_VISIBLE_DEVICES (HIP_/ROCR_) ─────> ENV_DEVICES
//!  /proc/<pid>/fd/*    ── -> /dev/nvidia*, /dev/kfd, renderD* ───> DEVICE_FD
//!  /proc/<pid>/maps    ── libcuda, libcudart, libtorch_cuda ─────> GPU_LIBRARY
//!                      ├─ libnccl, librccl ──────────────────────> COLLECTIVE_LIBRARY
//!                      └─ /dev/nvidia* mapped ───────────────────> DEVICE_MAP
//! ```
//! The environment is fixed at exec, so it is read when a process is first
//! seen and after each exec. fds and maps change while a program runs
//! (`import torch` maps the CUDA libraries, CUDA init opens and maps the
//! devices), so they are re-read, but only when the process's virtual size
//! changed since the last scan (a mapping was added or removed), at most
//! every `evidence_interval_ms`. A maps file is first searched as raw bytes
//! with one regex; only when a needle is present is it parsed (with procfs)
//! to find the exact mapping.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;

use procfs::process::{FDTarget, MMapPath, MemoryMaps};
use procfs::FromRead;

use super::procfile::{DirFile, FdBudget, ReadBuf};
use super::types::{MlEnv, MlEvidence};
use crate::config::ObserveConfig;

/// Evidence found by one scan, with a human-readable first item.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Found {
    pub evidence: MlEvidence,
    pub detail: Option<String>,
}

impl Found {
    fn add(&mut self, ev: MlEvidence, detail: impl FnOnce() -> String) {
        if self.detail.is_none() {
            self.detail = Some(detail());
        }
        self.evidence |= ev;
    }

    pub fn merge(&mut self, other: Found) {
        if self.detail.is_none() {
            self.detail = other.detail;
        }
        self.evidence |= other.evidence;
    }
}

const RANK_VARS: [&str; 3] = ["RANK", "LOCAL_RANK", "WORLD_SIZE"];
const DEVICE_VARS: [&str; 3] = ["CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"];

/// Matches environment, fd targets and mappings against the configured
/// evidence lists.
#[derive(Debug)]
pub struct EvidenceMatcher {
    device_prefixes: Vec<String>,
    libraries: Vec<String>,
    collective_libraries: Vec<String>,
    env_vars: Vec<String>,
    max_fds: usize,
    /// Any needle of the three lists, as raw bytes: the cheap pre-filter.
    maps_prefilter: regex::bytes::Regex,
}

impl EvidenceMatcher {
    pub fn new(cfg: &ObserveConfig) -> EvidenceMatcher {
        let needles: Vec<String> = cfg
            .ml_device_prefixes
            .iter()
            .chain(&cfg.ml_libraries)
            .chain(&cfg.collective_libraries)
            .map(|s| regex::escape(s))
            .collect();
        let pattern = if needles.is_empty() { "$^".to_string() } else { needles.join("|") };
        EvidenceMatcher {
            device_prefixes: cfg.ml_device_prefixes.clone(),
            libraries: cfg.ml_libraries.clone(),
            collective_libraries: cfg.collective_libraries.clone(),
            env_vars: cfg.ml_env_vars.clone(),
            max_fds: cfg.max_fds_scanned as usize,
            maps_prefilter: regex::bytes::Regex::new(&pattern).expect("escaped literals"),
        }
    }

    /// Evidence and rank/device settings from an environment.
    pub fn scan_environ(&self, env: &HashMap<OsString, OsString>) -> (Found, MlEnv) {
        let get = |k: &str| {
            env.get(std::ffi::OsStr::new(k)).map(|v| v.to_string_lossy().trim().to_string()).filter(|v| !v.is_empty())
        };
        let mut found = Found::default();
        for var in &self.env_vars {
            if let Some(value) = get(var) {
                let ev = if var.ends_with("VISIBLE_DEVICES") { MlEvidence::ENV_DEVICES } else { MlEvidence::ENV_RANK };
                found.add(ev, || format!("env {var}={value}"));
            }
        }
        let num = |k| get(k).and_then(|v| v.parse::<u32>().ok());
        let ml_env = MlEnv {
            rank: num(RANK_VARS[0]),
            local_rank: num(RANK_VARS[1]),
            world_size: num(RANK_VARS[2]),
            visible_devices: DEVICE_VARS.iter().find_map(|k| get(k)).map(Arc::from),
        };
        (found, ml_env)
    }

    fn device_match<'p>(&self, path: &'p Path) -> Option<&'p str> {
        let s = path.to_str()?;
        self.device_prefixes.iter().find(|p| s.starts_with(p.as_str())).map(|_| s)
    }

    /// Scans up to `max_fds_scanned` fds of a process for GPU devices.
    pub fn scan_fds(&self, proc_dir: &Path, buf: &mut ReadBuf) -> Found {
        let mut found = Found::default();
        let fd_dir = proc_dir.join("fd");
        let mut fds = Vec::new();
        // Read once per scan: a zero budget makes DirFile open and close.
        let no_cache = FdBudget::new(0);
        if DirFile::default().list_numeric(|| fd_dir.clone(), &no_cache, buf, &mut fds).is_err() {
            return found;
        }
        for fd in fds.into_iter().take(self.max_fds) {
            let Ok(link) = std::fs::read_link(fd_dir.join(fd.to_string())) else {
                continue;
            };
            let Some(link) = link.to_str() else { continue };
            if let Ok(FDTarget::Path(path)) = FDTarget::from_str(link) {
                if let Some(dev) = self.device_match(&path) {
                    found.add(MlEvidence::DEVICE_FD, || format!("fd {dev}"));
                    break;
                }
            }
        }
        found
    }

    /// Evidence from the text of /proc/<pid>/maps.
    pub fn scan_maps(&self, maps: &[u8]) -> Found {
        let mut found = Found::default();
        if !self.maps_prefilter.is_match(maps) {
            return found;
        }
        let Ok(maps) = MemoryMaps::from_read(maps) else {
            return found;
        };
        for map in maps.iter() {
            let MMapPath::Path(path) = &map.pathname else {
                continue;
            };
            if let Some(dev) = self.device_match(path) {
                found.add(MlEvidence::DEVICE_MAP, || format!("map {dev}"));
                continue;
            }
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            if self.collective_libraries.iter().any(|l| name.starts_with(l.as_str())) {
                found.add(MlEvidence::COLLECTIVE_LIBRARY, || format!("map {}", path.display()));
            } else if self.libraries.iter().any(|l| name.starts_with(l.as_str())) {
                found.add(MlEvidence::GPU_LIBRARY, || format!("map {}", path.display()));
            }
        }
        found
    }
}

/// True when `cmdline` is a Python multiprocessing child started with the
/// "spawn" or "forkserver" method (they carry `--multiprocessing-fork`).
pub fn is_multiprocessing_child(cmdline: &str) -> bool {
    cmdline.contains("--multiprocessing-fork") || cmdline.contains("multiprocessing.spawn")
}

/// True when `exe` looks like a Python interpreter.
pub fn is_python(exe: &str) -> bool {
    Path::new(exe)
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("python") || n.starts_with("pypy"))
}

/// Resolves a visible-devices list ("0,2", "GPU-8a1b...", "MIG-...") to
/// provider device indices, given (index, uuid) of each device.
pub fn resolve_visible_devices(list: &str, devices: &[(u32, &str)]) -> Vec<u32> {
    let mut out = Vec::new();
    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let idx = if let Ok(n) = item.parse::<i64>() {
            if n < 0 {
                // CUDA stops at the first invalid ordinal.
                break;
            }
            devices.iter().find(|(i, _)| i64::from(*i) == n).map(|(i, _)| *i)
        } else {
            devices
                .iter()
                .find(|(_, uuid)| !uuid.is_empty() && (uuid.starts_with(item) || item.starts_with(uuid)))
                .map(|(i, _)| *i)
        };
        if let Some(i) = idx {
            if !out.contains(&i) {
                out.push(i);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matcher() -> EvidenceMatcher {
        EvidenceMatcher::new(&ObserveConfig::default())
    }

    #[test]
    fn environment_evidence_and_rank() {
        let env: HashMap<OsString, OsString> =
            [("RANK", "3"), ("WORLD_SIZE", "8"), ("CUDA_VISIBLE_DEVICES", "1,0"), ("HOME", "/")]
                .iter()
                .map(|(k, v)| (OsString::from(k), OsString::from(v)))
                .collect();
        let (found, ml) = matcher().scan_environ(&env);
        assert!(found.evidence.contains(MlEvidence::ENV_RANK));
        assert!(found.evidence.contains(MlEvidence::ENV_DEVICES));
        assert_eq!(ml.rank, Some(3));
        assert_eq!(ml.world_size, Some(8));
        assert_eq!(ml.local_rank, None);
        assert_eq!(ml.visible_devices.as_deref(), Some("1,0"));

        let plain: HashMap<OsString, OsString> =
            [(OsString::from("PATH"), OsString::from("/bin"))].into_iter().collect();
        let (found, _) = matcher().scan_environ(&plain);
        assert!(found.evidence.is_empty());
    }

    #[test]
    fn maps_libraries_and_devices() {
        let maps = b"7f0000000000-7f0000001000 r-xp 00000000 08:01 1234 /usr/lib/x86_64-linux-gnu/libcuda.so.535.1\n\
7f0000002000-7f0000003000 r--p 00000000 08:01 1235 /opt/nccl/lib/libnccl.so.2\n\
7f0000004000-7f0000005000 rw-s 00000000 00:05 99 /dev/nvidiactl\n\
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0 [stack]\n";
        let found = matcher().scan_maps(maps);
        assert!(found.evidence.contains(MlEvidence::GPU_LIBRARY));
        assert!(found.evidence.contains(MlEvidence::COLLECTIVE_LIBRARY));
        assert!(found.evidence.contains(MlEvidence::DEVICE_MAP));
        assert_eq!(found.detail.as_deref(), Some("map /usr/lib/x86_64-linux-gnu/libcuda.so.535.1"));

        let plain = b"55d000000000-55d000001000 r-xp 00000000 08:01 1 /usr/bin/bash\n\
7f0000000000-7f0000001000 r-xp 00000000 08:01 2 /usr/lib/libc.so.6\n";
        assert!(matcher().scan_maps(plain).evidence.is_empty());
        // A needle inside an unrelated name does not count.
        let tricky = b"7f0000000000-7f0000001000 r-xp 00000000 08:01 2 /home/u/notes-about-libcuda.so.txt\n";
        assert!(matcher().scan_maps(tricky).evidence.is_empty());
    }

    #[test]
    fn visible_devices_resolution() {
        let devs = [(0, "GPU-aaaa-1111"), (1, "GPU-bbbb-2222"), (2, "GPU-cccc-3333")];
        assert_eq!(resolve_visible_devices("2,0", &devs), vec![2, 0]);
        assert_eq!(resolve_visible_devices("GPU-bbbb", &devs), vec![1]);
        assert_eq!(resolve_visible_devices("1,-1,2", &devs), vec![1]);
        assert_eq!(resolve_visible_devices("7", &devs), Vec::<u32>::new());
        assert_eq!(resolve_visible_devices("", &devs), Vec::<u32>::new());
    }

    #[test]
    fn python_children() {
        assert!(is_python("/usr/bin/python3.11"));
        assert!(!is_python("/usr/bin/bash"));
        assert!(is_multiprocessing_child(
            "/usr/bin/python3 -c from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5) --multiprocessing-fork"
        ));
    }
}
