//! What wakes the daemon to reload its configuration: SIGHUP, or a change
//! of the config file seen by inotify (the notify crate).
//!
//! ```text
//!   SIGHUP ─────────────> signal thread ──Trigger::Signal──┐
//!   config's directory ─> inotify ──(close-write, rename,  ├──> channel ──> the loop wakes at once
//!                         remove of any entry)─Trigger::File┘     (select with the stats requests)
//! ```
//!
//! The directory is watched, not the file: editors and `kubectl` replace a
//! file by renaming another over it (a ConfigMap swaps a `..data` symlink),
//! which a watch on the old inode would miss. On an event on any entry of
//! the directory the loop compares the file's [`Stamp`] (device, inode,
//! size, mtime, through symlinks), and wakes and reloads only if it changed
//! (a busy directory such as /tmp costs a stat per event, not a pass);
//! SIGHUP reloads in any case. Plain writes (`IN_MODIFY`) are not
//! acted on: the file is read when the writer closes it (`IN_CLOSE_WRITE`),
//! never half-written.
//!
//! Where inotify cannot be had (no watch left, a filesystem without it), the
//! loop falls back to comparing the stamp once a second, and says so.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use anyhow::{Context, Result};
use crossbeam::channel::{unbounded, Receiver, Sender};
use notify::event::{AccessKind, AccessMode, EventKind, ModifyKind};
use notify::{RecommendedWatcher, RecursiveMode, Watcher};

/// Why the loop was woken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// SIGHUP: reload whatever the file's stamp says.
    Signal,
    /// Something changed in the config file's directory: reload if the
    /// file's stamp changed.
    File,
}

/// What identifies a version of the config file: (device, inode, size,
/// mtime) of what the path resolves to; None if it cannot be read.
pub type Stamp = Option<(u64, u64, u64, SystemTime)>;

pub fn stamp(path: &Path) -> Stamp {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.dev(), m.ino(), m.len(), m.modified().ok()?))
}

/// The triggers of one daemon: SIGHUP and, with a config file, its
/// directory's inotify watch.
pub struct ReloadWatch {
    rx: Receiver<Trigger>,
    tx: Sender<Trigger>,
    watcher: Option<RecommendedWatcher>,
    /// The directories watched.
    dirs: Vec<PathBuf>,
    signals: Option<signal_hook::iterator::Handle>,
}

/// The directory of a file ("." for a bare name).
fn dir_of(file: &Path) -> PathBuf {
    match file.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Whether an inotify event may have changed a file (see the module doc).
fn relevant(kind: &EventKind) -> bool {
    matches!(
        kind,
        EventKind::Access(AccessKind::Close(AccessMode::Write))
            | EventKind::Modify(ModifyKind::Name(_))
            | EventKind::Remove(_)
    )
}

impl ReloadWatch {
    /// A watch with no sources yet.
    pub fn new() -> ReloadWatch {
        let (tx, rx) = unbounded();
        ReloadWatch { rx, tx, watcher: None, dirs: Vec::new(), signals: None }
    }

    /// Wakes on SIGHUP from now on.
    pub fn on_sighup(&mut self) -> Result<()> {
        let mut signals =
            signal_hook::iterator::Signals::new([signal_hook::consts::SIGHUP]).context("installing SIGHUP")?;
        self.signals = Some(signals.handle());
        let tx = self.tx.clone();
        std::thread::Builder::new()
            .name("zernel-sighup".into())
            .spawn(move || {
                for _ in signals.forever() {
                    if tx.send(Trigger::Signal).is_err() {
                        break;
                    }
                }
            })
            .context("starting the SIGHUP thread")?;
        Ok(())
    }

    /// Wakes on changes in `config`'s directory from now on. An error
    /// (inotify unavailable) leaves the watch without this source.
    pub fn on_file(&mut self, config: &Path) -> Result<()> {
        let dir = dir_of(config);
        let tx = self.tx.clone();
        let mut watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
            if let Ok(ev) = res {
                if relevant(&ev.kind) {
                    let _ = tx.send(Trigger::File);
                }
            }
        })
        .context("creating an inotify watch")?;
        watcher
            .watch(&dir, RecursiveMode::NonRecursive)
            .with_context(|| format!("watching {} with inotify", dir.display()))?;
        self.watcher = Some(watcher);
        self.dirs = vec![dir];
        Ok(())
    }

    /// Also wakes on changes in `file`'s directory (the policy script's),
    /// with the triggers of [`on_file`](Self::on_file).
    pub fn on_file_too(&mut self, file: &Path) -> Result<()> {
        let dir = dir_of(file);
        if self.dirs.contains(&dir) {
            return Ok(());
        }
        let Some(w) = &mut self.watcher else { return self.on_file(file) };
        w.watch(&dir, RecursiveMode::NonRecursive)
            .with_context(|| format!("watching {} with inotify", dir.display()))?;
        self.dirs.push(dir);
        Ok(())
    }

    /// Whether changes of the file wake the loop (else it must poll).
    pub fn watches_file(&self) -> bool {
        self.watcher.is_some()
    }

    /// The channel the triggers arrive on.
    pub fn receiver(&self) -> &Receiver<Trigger> {
        &self.rx
    }

    /// Takes every trigger waiting: (any at all, any SIGHUP among them).
    pub fn drain(&self) -> (bool, bool) {
        let (mut any, mut signal) = (false, false);
        for t in self.rx.try_iter() {
            any = true;
            signal |= t == Trigger::Signal;
        }
        (any, signal)
    }
}

impl Default for ReloadWatch {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for ReloadWatch {
    fn drop(&mut self) {
        if let Some(h) = self.signals.take() {
            h.close();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn wait(w: &ReloadWatch, within: Duration) -> Option<Trigger> {
        w.receiver().recv_timeout(within).ok()
    }

    #[test]
    fn replaced_written_and_removed_files_wake_partial_writes_do_not() {
        let dir = std::env::temp_dir().join(format!("zernel-reload-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = dir.join("zernel.toml");
        std::fs::write(&cfg, "").unwrap();
        let mut w = ReloadWatch::new();
        w.on_file(&cfg).unwrap();
        assert!(w.watches_file());
        let s0 = stamp(&cfg);

        // Opened for writing, written, not yet closed: nothing.
        let mut f = std::fs::OpenOptions::new().write(true).truncate(true).open(&cfg).unwrap();
        std::io::Write::write_all(&mut f, b"[[rules]]\n").unwrap();
        assert_eq!(wait(&w, Duration::from_millis(200)), None);
        drop(f);
        let t = Instant::now();
        assert_eq!(wait(&w, Duration::from_secs(2)), Some(Trigger::File));
        assert!(t.elapsed() < Duration::from_millis(100), "{:?}", t.elapsed());
        w.drain();

        // Replaced by a rename: woken, and the stamp differs (new inode).
        let tmp = dir.join(".zernel.toml.new");
        std::fs::write(&tmp, "# new\n").unwrap();
        w.drain();
        std::fs::rename(&tmp, &cfg).unwrap();
        assert_eq!(wait(&w, Duration::from_secs(2)), Some(Trigger::File));
        assert_ne!(stamp(&cfg), s0);

        std::fs::remove_file(&cfg).unwrap();
        assert_eq!(wait(&w, Duration::from_secs(2)), Some(Trigger::File));
        assert_eq!(stamp(&cfg), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_unwatchable_directory_is_an_error_naming_it() {
        let mut w = ReloadWatch::new();
        let e = w.on_file(Path::new("/nonexistent-zernel-dir/zernel.toml")).unwrap_err();
        assert!(format!("{e:#}").contains("/nonexistent-zernel-dir"), "{e:#}");
        assert!(!w.watches_file());
    }
}
