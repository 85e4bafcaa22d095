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
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use crossbeam::channel::{unbounded, Receiver, Sender};
use notify::event::{AccessKind, AccessMode, EventKind, ModifyKind};
use notify::{RecommendedWatcher, RecursiveMode, Watcher};
use tracing::warn;

use crate::config::{stamp, Source, Stamp};

/// Why the loop was woken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// SIGHUP: reload whatever the file's stamp says.
    Signal,
    /// Something changed in the config file's directory: reload if the
    /// file's stamp changed.
    File,
}

/// The triggers of one daemon: SIGHUP and, with a config file, its
/// directory's inotify watch.
pub(crate) struct ReloadWatch {
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
    pub(crate) fn on_sighup(&mut self) -> Result<()> {
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
    pub(crate) fn on_file(&mut self, config: &Path) -> Result<()> {
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
    pub(crate) fn on_file_too(&mut self, file: &Path) -> Result<()> {
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
    pub(crate) fn watches_file(&self) -> bool {
        self.watcher.is_some()
    }

    /// The channel the triggers arrive on.
    pub fn receiver(&self) -> &Receiver<Trigger> {
        &self.rx
    }

    /// Takes every trigger waiting: (any at all, any SIGHUP among them).
    #[cfg(test)]
    pub(crate) fn drain(&self) -> (bool, bool) {
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

/// The loop's side of a reload: what woke it (SIGHUP, an inotify event in
/// the config's directory) and the stamp of the file last loaded. An event
/// that left the file as it was (another file of a busy directory such as
/// /tmp) neither wakes the loop nor reloads. Without inotify the stamp is
/// compared once a second instead.
pub struct Reloader {
    watch: ReloadWatch,
    stamp: Stamp,
    last_poll: Instant,
    changed: bool,
    sighup: bool,
    /// The policy script and the stamp it had at the last reload; the
    /// flag says it is compared once a second (its directory is not watched).
    script: Option<(PathBuf, Stamp, bool)>,
}

/// How often the stamp is compared when inotify is not available.
const POLL_WITHOUT_INOTIFY: Duration = Duration::from_secs(1);

impl Reloader {
    /// Wakes on SIGHUP, and on changes of the source's file if it has one.
    pub fn new(source: &Source) -> Result<Reloader> {
        let mut watch = ReloadWatch::new();
        watch.on_sighup()?;
        if let Some(path) = &source.path {
            if let Err(e) = watch.on_file(path) {
                warn!("{}: {e:#}; changes of the file are looked for once a second", path.display());
            }
        }
        Ok(Reloader {
            watch,
            stamp: source.stamp(),
            last_poll: Instant::now(),
            changed: false,
            sighup: false,
            script: None,
        })
    }

    /// Also reloads when the policy script changes (`""`: none); called
    /// with the script of the configuration in force.
    pub fn watch_script(&mut self, path: &str) {
        if path.is_empty() {
            self.script = None;
            return;
        }
        let p = PathBuf::from(path);
        if self.script.as_ref().is_some_and(|s| s.0 == p) {
            return;
        }
        let polled = match self.watch.on_file_too(&p) {
            Ok(()) => false,
            Err(e) => {
                warn!("{path}: {e:#}; changes of the policy script are looked for once a second");
                true
            }
        };
        self.script = Some((p.clone(), stamp(&p), polled));
    }

    /// Whether the policy script differs from the one last loaded.
    fn script_changed(&self) -> bool {
        self.script.as_ref().is_some_and(|(p, st, _)| stamp(p) != *st)
    }

    /// Where the triggers arrive; hand each to [`note`](Self::note).
    pub fn receiver(&self) -> &Receiver<Trigger> {
        self.watch.receiver()
    }

    /// Takes a trigger; returns whether a reload is now due (the loop
    /// should wake): always after SIGHUP, after a file event only if the
    /// file's stamp differs from the one last loaded (a stat, no read).
    pub fn note(&mut self, source: &Source, t: Trigger) -> bool {
        match t {
            Trigger::Signal => self.sighup = true,
            Trigger::File => self.changed |= source.stamp() != self.stamp || self.script_changed(),
        }
        self.sighup || self.changed
    }

    /// Whether to reload now (see [`note`](Self::note)); the triggers
    /// still queued are taken first. Without inotify, compares the stamp
    /// once a second.
    pub fn due(&mut self, source: &Source) -> bool {
        for t in self.watch.receiver().try_iter().collect::<Vec<_>>() {
            self.note(source, t);
        }
        let polled = !self.watch.watches_file() || self.script.as_ref().is_some_and(|s| s.2);
        if polled && self.last_poll.elapsed() >= POLL_WITHOUT_INOTIFY {
            self.last_poll = Instant::now();
            self.changed |= source.stamp() != self.stamp || self.script_changed();
        }
        let due = std::mem::take(&mut self.sighup) | std::mem::take(&mut self.changed);
        if due {
            self.stamp = source.stamp();
            if let Some(s) = &mut self.script {
                s.1 = stamp(&s.0);
            }
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Mode;
    use crate::tempdir::TempDir;

    fn wait(w: &ReloadWatch, within: Duration) -> Option<Trigger> {
        w.receiver().recv_timeout(within).ok()
    }

    #[test]
    fn replaced_written_and_removed_files_wake_partial_writes_do_not() {
        let tmp = TempDir::new("reload");
        let dir = tmp.path();
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
    }

    #[test]
    fn an_unwatchable_directory_is_an_error_naming_it() {
        let mut w = ReloadWatch::new();
        let e = w.on_file(Path::new("/nonexistent-zernel-dir/zernel.toml")).unwrap_err();
        assert!(format!("{e:#}").contains("/nonexistent-zernel-dir"), "{e:#}");
        assert!(!w.watches_file());
    }

    #[test]
    fn only_a_changed_file_makes_a_reload_due() {
        use std::time::Duration;
        let tmp = TempDir::new("reload-due");
        let dir = tmp.path();
        let cfg = dir.join("zernel.toml");
        let rule = |c: &str| format!("[[rules]]\ncomm = \"{c}\"\nclass = \"batch\"\n");
        std::fs::write(&cfg, rule("^a$")).unwrap();
        let source = Source { path: Some(cfg.clone()), mode: Mode::Auto };
        let mut r = Reloader::new(&source).unwrap();
        // The next file event.
        let next_file_event = |r: &Reloader| loop {
            match r.receiver().recv_timeout(Duration::from_secs(5)).expect("no event within 5 s") {
                Trigger::File => break Trigger::File,
                Trigger::Signal => continue,
            }
        };

        std::fs::write(dir.join("other.log"), "x").unwrap();
        let t = next_file_event(&r);
        assert!(!r.note(&source, t), "another file's change made a reload due");

        std::fs::write(&cfg, rule("^b$")).unwrap();
        let t = next_file_event(&r);
        assert!(r.note(&source, t));
        assert!(r.due(&source));
        // Taken: not due again until the file changes again.
        std::thread::sleep(Duration::from_millis(100));
        while let Ok(Trigger::File) = r.receiver().try_recv() {}
        assert!(!r.due(&source));
    }
}
