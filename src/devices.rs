//! Which character devices are GPUs: the majors the BPF side watches for
//! opens (`gpu_majors` map), read from /proc/devices once at start.
//!
//! ```text
//!   /proc/devices "Character devices:" ──> names: nvidia*, kfd, drm ──┐
//!   195 (NVIDIA's fixed major, also without its module loaded) ───────┼─> [(major, first minor)]
//!                                                                     v
//!                          gpu_majors map (BPF: device open with major M, minor >= first?)
//! ```
//!
//! DRM (226) counts only from minor 128 on, the render nodes
//! (`/dev/dri/renderD128`...) that compute jobs open; its primary nodes
//! (`/dev/dri/card0`) are a display server's. Unknown lines and the block
//! devices section are skipped.

/// NVIDIA's character major (LANANA), the same whether its module is loaded or not.
pub const NVIDIA_MAJOR: u32 = 195;
/// DRM's first render-node minor (its major, 226, is read from /proc/devices).
pub const DRM_RENDER_MINOR: u32 = 128;

/// One watched major: opens of (major, minor >= `first_minor`) are GPU opens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuMajor {
    pub major: u32,
    pub first_minor: u32,
    pub name: String,
}

/// Is this /proc/devices name a GPU driver's?
fn gpu_name(name: &str) -> Option<u32> {
    match name {
        "drm" => Some(DRM_RENDER_MINOR),
        "kfd" => Some(0),
        n if n.starts_with("nvidia") => Some(0),
        _ => None,
    }
}

/// The GPU majors in a /proc/devices text, with NVIDIA's 195 always there.
pub fn parse(text: &str) -> Vec<GpuMajor> {
    let mut out = vec![GpuMajor { major: NVIDIA_MAJOR, first_minor: 0, name: "nvidia".into() }];
    let mut chars = false;
    for line in text.lines() {
        let line = line.trim();
        if line.ends_with(':') {
            chars = line == "Character devices:";
            continue;
        }
        if !chars {
            continue;
        }
        let mut f = line.split_whitespace();
        let (Some(Ok(major)), Some(name)) = (f.next().map(str::parse::<u32>), f.next()) else { continue };
        let Some(first_minor) = gpu_name(name) else { continue };
        match out.iter_mut().find(|g| g.major == major) {
            Some(g) => g.first_minor = g.first_minor.min(first_minor),
            None => out.push(GpuMajor { major, first_minor, name: name.to_string() }),
        }
    }
    out
}

/// The GPU majors of this machine (just 195 if /proc/devices cannot be read).
pub fn read() -> Vec<GpuMajor> {
    parse(&std::fs::read_to_string("/proc/devices").unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_majors_from_proc_devices() {
        let text = "Character devices:\n  1 mem\n  4 tty\n195 nvidia\n195 nvidia-frontend\n226 drm\n\
                    235 kfd\n508 nvidia-uvm\n509 nvidia-caps\n x bad\n\nBlock devices:\n  8 sd\n510 nvidia-fake\n";
        let got: Vec<(u32, u32)> = parse(text).iter().map(|g| (g.major, g.first_minor)).collect();
        assert_eq!(got, [(195, 0), (226, 128), (235, 0), (508, 0), (509, 0)]);
    }

    #[test]
    fn nvidia_without_its_module_and_unreadable_input() {
        for text in ["", "garbage\n", "Character devices:\n  1 mem\n"] {
            let got = parse(text);
            assert_eq!(got.len(), 1, "{text:?}");
            assert_eq!((got[0].major, got[0].first_minor), (NVIDIA_MAJOR, 0));
        }
    }
}
