//! Where the configuration comes from: the file (held to root's ownership
//! rules when the daemon runs as root) and scx_loader's `--mode` preset
//! applied on top of it.
//!
//! ```text
//!   --config FILE ──> check_owner ──> Config::load ──> Mode::apply ──> Config
//!   [policy] script ─> check_owner ─┘
//! ```

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use tracing::warn;

use super::{Config, ConfigError, SliceConfig};
use crate::class::SLICE_US_RANGE;

/// What identifies a version of the config file: (device, inode, size,
/// mtime) of what the path resolves to; None if it cannot be read.
pub(crate) type Stamp = Option<(u64, u64, u64, SystemTime)>;

pub(crate) fn stamp(path: &Path) -> Stamp {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.dev(), m.ino(), m.len(), m.modified().ok()?))
}

/// Presets for scx_loader's modes, applied on top of the config file.
///
/// | mode       | slices | starvation bound | wakeup_preempt_us          |
/// |------------|--------|------------------|----------------------------|
/// | auto       | as is  | as is            | as is                      |
/// | lowlatency | half   | at most 20 ms    | as is                      |
/// | gaming     | half   | at most 20 ms    | doubled: a thread with bursts of a few ms (a frame) is cut short as a hog less often |
/// | server     | double | as is            | as is                      |
/// | powersave  | double | as is            | 0: no wakeup preemption, fewer switches and IPIs |
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    Auto,
    Gaming,
    Lowlatency,
    Powersave,
    Server,
}

impl Mode {
    fn apply(self, cfg: &mut Config) {
        let sched = &mut cfg.scheduler;
        let scale = |s: &mut SliceConfig, num: u64, den: u64| {
            for v in [&mut s.latency, &mut s.ml, &mut s.normal, &mut s.batch] {
                *v = (*v * num / den).clamp(SLICE_US_RANGE.0, SLICE_US_RANGE.1);
            }
        };
        match self {
            Mode::Auto => {}
            Mode::Gaming | Mode::Lowlatency => {
                scale(&mut sched.slice_us, 1, 2);
                sched.starvation_bound_ms = sched.starvation_bound_ms.min(20);
                if self == Mode::Gaming {
                    sched.wakeup_preempt_us = (sched.wakeup_preempt_us * 2).min(SLICE_US_RANGE.1);
                }
            }
            Mode::Server => scale(&mut sched.slice_us, 2, 1),
            Mode::Powersave => {
                scale(&mut sched.slice_us, 2, 1);
                sched.wakeup_preempt_us = 0;
            }
        }
    }
}

/// Where the configuration comes from: a file (or the defaults) and a mode.
#[derive(Debug, Clone)]
pub struct Source {
    pub path: Option<PathBuf>,
    pub mode: Mode,
}

impl Source {
    pub fn load(&self) -> Result<Config, ConfigError> {
        let mut cfg = match &self.path {
            Some(p) => {
                check_owner(p)?;
                Config::load(p)?
            }
            None => Config::default(),
        };
        // The script decides as much as the file: the same ownership rules.
        if !cfg.policy.script.is_empty() {
            check_owner(Path::new(&cfg.policy.script))?;
        }
        self.mode.apply(&mut cfg);
        Ok(cfg)
    }

    pub(crate) fn stamp(&self) -> Stamp {
        stamp(self.path.as_deref()?)
    }
}

/// A root daemon must not take orders from a file others can change. As
/// root (effective uid 0), a config file is refused when
///   - it is writable by group or others, or
///   - its directory is writable by group or others without the sticky bit
///     (anyone there could rename another file over it), or
///   - it is owned by anyone but root and the user who ran `sudo`
///     (SUDO_UID): that user's own file, e.g. in a checkout, is accepted
///     with a warning.
///
/// Symlinks are followed (the file and directory judged are the target's).
fn check_owner(path: &Path) -> Result<(), ConfigError> {
    use std::os::unix::fs::MetadataExt;
    if unsafe { libc::geteuid() } != 0 {
        return Ok(());
    }
    // A missing file is reported by the loader, with its own message.
    let Ok(file) = std::fs::metadata(path) else { return Ok(()) };
    let real = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let dir = real.parent().and_then(|d| std::fs::metadata(d).ok()).map(|m| Perm { uid: m.uid(), mode: m.mode() });
    let sudo_uid = std::env::var("SUDO_UID").ok().and_then(|v| v.parse().ok());
    let verdict = judge_owner(Perm { uid: file.uid(), mode: file.mode() }, dir, sudo_uid);
    match verdict {
        Ok(None) => Ok(()),
        Ok(Some(warning)) => {
            warn!("{}: {warning}", path.display());
            Ok(())
        }
        Err(why) => Err(ConfigError(format!("{}: refusing a config file {why}", path.display()))),
    }
}

/// Owner and mode bits of a file or directory.
#[derive(Debug, Clone, Copy)]
struct Perm {
    uid: u32,
    mode: u32,
}

/// [`check_owner`]'s rules, on metadata: Ok(Some(warning)) for a file the
/// sudo user owns, Err(why) for an unsafe one.
fn judge_owner(file: Perm, dir: Option<Perm>, sudo_uid: Option<u32>) -> Result<Option<String>, String> {
    if file.mode & 0o022 != 0 {
        return Err(format!("writable by group or others (mode {:o}): chmod go-w it", file.mode & 0o7777));
    }
    if let Some(d) = dir {
        if d.mode & 0o022 != 0 && d.mode & 0o1000 == 0 {
            return Err(format!(
                "in a directory writable by group or others without the sticky bit (mode {:o}): others could replace it",
                d.mode & 0o7777
            ));
        }
    }
    match file.uid {
        0 => Ok(None),
        uid if Some(uid) == sudo_uid && uid != 0 => Ok(Some(format!(
            "owned by uid {uid}, the user who ran sudo, not root: that user can change how this machine is scheduled"
        ))),
        uid => Err(format!("owned by uid {uid}, neither root nor the user who ran sudo (SUDO_UID)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (slice_us.latency, .batch, starvation_bound_ms, wakeup_preempt_us)
    fn preset(mode: Mode, cfg: &Config) -> (u64, u64, u64, u64) {
        let mut c = cfg.clone();
        mode.apply(&mut c);
        c.validate().unwrap();
        let s = &c.scheduler;
        (s.slice_us.latency, s.slice_us.batch, s.starvation_bound_ms, s.wakeup_preempt_us)
    }

    #[test]
    fn config_ownership_as_root() {
        let p = |uid, mode| Perm { uid, mode };
        let dir = Some(p(0, 0o40755));
        // Root's file in a root directory.
        assert_eq!(judge_owner(p(0, 0o100644), dir, None), Ok(None));
        assert_eq!(judge_owner(p(0, 0o100600), dir, Some(1000)), Ok(None));
        // The sudo user's own file (a checkout): accepted, with a warning.
        let w = judge_owner(p(1000, 0o100644), Some(p(1000, 0o40755)), Some(1000)).unwrap().unwrap();
        assert!(w.contains("uid 1000, the user who ran sudo"), "{w}");
        // Another user's file, or one with no sudo in the picture.
        let e = judge_owner(p(1001, 0o100644), dir, Some(1000)).unwrap_err();
        assert!(e.contains("owned by uid 1001, neither root nor the user who ran sudo"), "{e}");
        assert!(judge_owner(p(1000, 0o100644), dir, None).is_err());
        // Writable by group or others, whoever owns it.
        for mode in [0o100664, 0o100646, 0o100666] {
            let e = judge_owner(p(0, mode), dir, None).unwrap_err();
            assert!(e.starts_with("writable by group or others"), "{mode:o}: {e}");
            assert!(judge_owner(p(1000, mode), dir, Some(1000)).is_err(), "{mode:o}");
        }
        // A directory others can write: refused, unless it has the sticky bit (/tmp).
        let e = judge_owner(p(1000, 0o100644), Some(p(1000, 0o40777)), Some(1000)).unwrap_err();
        assert!(e.contains("directory writable by group or others without the sticky bit (mode 777)"), "{e}");
        assert!(judge_owner(p(0, 0o100644), Some(p(0, 0o40775)), None).is_err());
        assert_eq!(judge_owner(p(0, 0o100644), Some(p(0, 0o41777)), None), Ok(None));
        assert!(judge_owner(p(1000, 0o100644), Some(p(0, 0o41777)), Some(1000)).unwrap().is_some());
        // SUDO_UID=0 makes no one else root.
        assert!(judge_owner(p(1000, 0o100644), dir, Some(0)).is_err());
    }

    #[test]
    fn mode_presets_are_distinct_and_stay_valid() {
        let d = Config::default();
        let (l, b, bound, w) = preset(Mode::Auto, &d);
        assert_eq!(preset(Mode::Lowlatency, &d), (l / 2, b / 2, bound.min(20), w));
        assert_eq!(preset(Mode::Gaming, &d), (l / 2, b / 2, bound.min(20), w * 2));
        assert_eq!(preset(Mode::Server, &d), (l * 2, b * 2, bound, w));
        assert_eq!(preset(Mode::Powersave, &d), (l * 2, b * 2, bound, 0));

        // At the ends of the ranges the presets clamp; off stays off.
        let mut edge = Config::default();
        edge.scheduler.slice_us.latency = SLICE_US_RANGE.0;
        edge.scheduler.slice_us.batch = SLICE_US_RANGE.1;
        edge.scheduler.wakeup_preempt_us = SLICE_US_RANGE.1;
        assert_eq!(preset(Mode::Gaming, &edge).0, SLICE_US_RANGE.0);
        assert_eq!(preset(Mode::Gaming, &edge).3, SLICE_US_RANGE.1);
        assert_eq!(preset(Mode::Server, &edge).1, SLICE_US_RANGE.1);
        edge.scheduler.wakeup_preempt_us = 0;
        assert_eq!(preset(Mode::Gaming, &edge).3, 0);
    }
}
