//! What wakes the daemon to reload its configuration: SIGHUP, or a change
//! of the config file seen by inotify (the inotify crate).
//!
//! ```text
//!   SIGHUP ─────────────> signal thread ──Trigger::Signal──────────────┐
//!   config's directory ─> inotify (close-write, rename, delete,         ├─> channel ──> the loop
//!                         symlink create) ─> zernel-inotify thread:     │   wakes at once
//!                         the entry one of the names watched? ─yes─ File┘   (select with the
//!                                                                            stats requests)
//! ```
//!
//! The directory is watched, not the file: editors and `kubectl` replace a
//! file by renaming another over it (a ConfigMap swaps a `..data` symlink),
//! which a watch on the old inode would miss. The kernel is asked only for
//! the events that can complete a change of an entry (`IN_CLOSE_WRITE`,
//! `IN_MOVED_FROM`/`TO`, `IN_DELETE`, `IN_CREATE`; plain writes, opens and
//! attribute changes are not even queued), and the thread passes on only
//! those of the entries that lead to the file: its own name and, when it
//! is a symlink with a relative target, that target's first component (a
//! ConfigMap's `..data`). A busy directory such as /tmp, or the directory
//! the daemon's own log is written to, then costs a read of the event in
//! that thread, not a stat and a wakeup of the loop. For the events passed
//! on, the loop compares the file's [`Stamp`] (device, inode, size, mtime,
//! through symlinks), and wakes and reloads only if it changed; SIGHUP
//! reloads in any case. A file is read when the writer closes it
//! (`IN_CLOSE_WRITE`), never half-written: a created regular file is not
//! acted on until then, a created symlink is (it is complete at once).
//!
//! The thread reads the queue at most once per [`READ_PAUSE`]: the first
//! event after a quiet spell is passed on at once, those that follow it
//! within the pause are read together after it. A directory that churns
//! (a GPU file provider's writer replacing its file by rename hundreds of
//! times a second, beside the config) then costs about ten reads a second,
//! not a wakeup per event. Beside the sized pipeline and 4 CPU hogs on 2
//! vCPUs under TCG, with the config in the directory of the pipeline's GPU
//! file, the daemon used 0.47-0.54 s of CPU per run of about 7.5 s when
//! the thread read every event, 0.32 s with the pause, and 0.30-0.37 s
//! with the config in a directory of its own (3 runs each, one boot).
//!
//! Where inotify cannot be had (no watch left, a filesystem without it), the
//! loop falls back to comparing the stamp once a second, and says so.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use crossbeam::channel::{unbounded, Receiver, Sender};
use inotify::{EventMask, Inotify, WatchDescriptor, WatchMask, Watches};
use tracing::warn;

use crate::config::{stamp, Source, Stamp};

/// Why the loop was woken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// SIGHUP: reload whatever the file's stamp says.
    Signal,
    /// An entry leading to the config file (or the policy script) changed:
    /// reload if the file's stamp changed.
    File,
}

/// The events that can complete a change of a directory's entry.
const DIR_EVENTS: WatchMask = WatchMask::CLOSE_WRITE
    .union(WatchMask::MOVED_FROM)
    .union(WatchMask::MOVED_TO)
    .union(WatchMask::DELETE)
    .union(WatchMask::CREATE)
    .union(WatchMask::DELETE_SELF)
    .union(WatchMask::MOVE_SELF)
    .union(WatchMask::ONLYDIR);

/// After a read of the event queue, the inotify thread waits this long
/// before the next: a burst of events in the directory costs one read per
/// pause, and a change of the file is seen at most this much later (the
/// daemon's loop runs every 100 ms by default anyway).
const READ_PAUSE: Duration = Duration::from_millis(100);

/// Room for the events of one pause of a busy directory (an event takes
/// 16 bytes and its name, padded).
const EVENT_BUF: usize = 64 << 10;

/// Each watched directory and the names of interest in it, shared with the
/// inotify thread.
type Names = Arc<Mutex<HashMap<WatchDescriptor, (PathBuf, Vec<OsString>)>>>;

/// The inotify side: the thread reading the events, the watches, and the
/// names it passes events on for.
struct DirWatch {
    watches: Watches,
    names: Names,
    stop: Arc<AtomicBool>,
    /// Reads of the event queue so far.
    reads: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The triggers of one daemon: SIGHUP and, with a config file, its
/// directory's inotify watch.
pub(crate) struct ReloadWatch {
    rx: Receiver<Trigger>,
    tx: Sender<Trigger>,
    inotify: Option<DirWatch>,
    signals: Option<signal_hook::iterator::Handle>,
}

/// The directory of a file ("." for a bare name).
fn dir_of(file: &Path) -> PathBuf {
    match file.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// The entries of `file`'s directory whose change can change what `file`
/// reads: its own name and, for a symlink with a relative target, the
/// target's first component (`..data/zernel.toml` -> `..data`).
fn names_of(file: &Path) -> Vec<OsString> {
    let mut names: Vec<OsString> = file.file_name().map(|n| n.to_os_string()).into_iter().collect();
    if let Ok(target) = std::fs::read_link(file) {
        if let Some(Component::Normal(first)) = target.components().next() {
            if !names.iter().any(|n| n == first) {
                names.push(first.to_os_string());
            }
        }
    }
    names
}

/// Whether an event may have changed one of `names` (see the module doc).
fn relevant(mask: EventMask, name: Option<&std::ffi::OsStr>, names: &[OsString], dir: &Path) -> bool {
    if mask.intersects(EventMask::Q_OVERFLOW | EventMask::DELETE_SELF | EventMask::MOVE_SELF) {
        return true;
    }
    let Some(name) = name else { return false };
    if !names.iter().any(|n| n == name) {
        return false;
    }
    if mask.contains(EventMask::CREATE) {
        // Complete at once only if it is a symlink; a regular file is
        // taken at its IN_CLOSE_WRITE.
        return std::fs::symlink_metadata(dir.join(name)).is_ok_and(|m| m.file_type().is_symlink());
    }
    true
}

impl DirWatch {
    /// An inotify instance watching `file`'s directory, and its thread
    /// (started only once the watch is in place).
    fn start(tx: Sender<Trigger>, file: &Path) -> Result<DirWatch> {
        let mut inotify = Inotify::init().context("creating an inotify instance")?;
        let names: Names = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let reads = Arc::new(AtomicU64::new(0));
        let mut w = DirWatch { watches: inotify.watches(), names, stop, reads, thread: None };
        w.add(file)?;
        let (names_t, stop_t, reads_t) = (w.names.clone(), w.stop.clone(), w.reads.clone());
        let thread = std::thread::Builder::new()
            .name("zernel-inotify".into())
            .spawn(move || {
                let mut buf = vec![0u8; EVENT_BUF];
                while !stop_t.load(Ordering::Acquire) {
                    reads_t.fetch_add(1, Ordering::Relaxed);
                    let events = match inotify.read_events_blocking(&mut buf) {
                        Ok(ev) => ev,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                        Err(e) => {
                            warn!(
                                "reading inotify events: {e}; changes of the config file are looked for once a second"
                            );
                            return;
                        }
                    };
                    let names = names_t.lock().unwrap_or_else(|e| e.into_inner());
                    let mut hit = false;
                    for ev in events {
                        hit |= match names.get(&ev.wd) {
                            Some((dir, wanted)) => relevant(ev.mask, ev.name, wanted, dir),
                            // The queue's overflow has no watch.
                            None => ev.mask.contains(EventMask::Q_OVERFLOW),
                        };
                    }
                    drop(names);
                    if hit && tx.send(Trigger::File).is_err() {
                        return;
                    }
                    std::thread::sleep(READ_PAUSE);
                }
            })
            .context("starting the inotify thread")?;
        w.thread = Some(thread);
        Ok(w)
    }

    /// Watches `file`'s directory, passing on the events of its names.
    fn add(&mut self, file: &Path) -> Result<()> {
        let dir = dir_of(file);
        let wd =
            self.watches.add(&dir, DIR_EVENTS).with_context(|| format!("watching {} with inotify", dir.display()))?;
        let mut names = self.names.lock().unwrap_or_else(|e| e.into_inner());
        let entry = names.entry(wd).or_insert_with(|| (dir.clone(), Vec::new()));
        for n in names_of(file) {
            if !entry.1.contains(&n) {
                entry.1.push(n);
            }
        }
        Ok(())
    }
}

impl Drop for DirWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Removing a watch queues IN_IGNORED, which ends the thread's read.
        let wds: Vec<WatchDescriptor> = self.names.lock().unwrap_or_else(|e| e.into_inner()).keys().cloned().collect();
        let mut removed = false;
        for wd in wds {
            removed |= self.watches.remove(wd).is_ok();
        }
        // (A directory removed meanwhile took its watch, and the thread
        // saw that IN_IGNORED already; with none left to remove, it is
        // left blocked rather than joined forever.)
        if let (Some(t), true) = (self.thread.take(), removed) {
            let _ = t.join();
        }
    }
}

impl ReloadWatch {
    /// A watch with no sources yet.
    pub fn new() -> ReloadWatch {
        let (tx, rx) = unbounded();
        ReloadWatch { rx, tx, inotify: None, signals: None }
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

    /// Wakes on changes of `file` (through its directory) from now on. An
    /// error (inotify unavailable, no such directory) leaves the watch
    /// without this file.
    pub(crate) fn on_file(&mut self, file: &Path) -> Result<()> {
        match &mut self.inotify {
            Some(w) => w.add(file),
            None => {
                self.inotify = Some(DirWatch::start(self.tx.clone(), file)?);
                Ok(())
            }
        }
    }

    /// Whether changes of the file wake the loop (else it must poll): a
    /// watch is in place and its thread still reads.
    pub(crate) fn watches_file(&self) -> bool {
        self.inotify.as_ref().is_some_and(|w| w.thread.as_ref().is_some_and(|t| !t.is_finished()))
    }

    /// The channel the triggers arrive on.
    pub fn receiver(&self) -> &Receiver<Trigger> {
        &self.rx
    }

    /// Reads of the inotify queue so far (0 without a watch).
    #[cfg(test)]
    fn queue_reads(&self) -> u64 {
        self.inotify.as_ref().map_or(0, |w| w.reads.load(Ordering::Relaxed))
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
        let polled = match self.watch.on_file(&p) {
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

    /// A temporary directory holding an empty zernel.toml, and a watch of it.
    fn watched(name: &str) -> (TempDir, PathBuf, ReloadWatch) {
        let tmp = TempDir::new(name);
        let cfg = tmp.path().join("zernel.toml");
        std::fs::write(&cfg, "").unwrap();
        let mut w = ReloadWatch::new();
        w.on_file(&cfg).unwrap();
        (tmp, cfg, w)
    }

    #[test]
    fn replaced_written_and_removed_files_wake_partial_writes_do_not() {
        let (tmp, cfg, w) = watched("reload");
        let dir = tmp.path();
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
    fn other_entries_of_the_directory_wake_nothing() {
        let (tmp, cfg, w) = watched("reload-busy");
        let dir = tmp.path();

        // A busy directory: a log written to, a file replaced by rename
        // (as the GPU file provider's writers do), another removed.
        let mut log = std::fs::File::create(dir.join("sched.log")).unwrap();
        for i in 0..20 {
            std::io::Write::write_all(&mut log, format!("line {i}\n").as_bytes()).unwrap();
            std::fs::write(dir.join(".gpu.json.tmp"), format!("{{\"n\":{i}}}")).unwrap();
            std::fs::rename(dir.join(".gpu.json.tmp"), dir.join("gpu.json")).unwrap();
        }
        std::fs::remove_file(dir.join("gpu.json")).unwrap();
        drop(log);
        assert_eq!(wait(&w, Duration::from_millis(300)), None, "another entry's change woke the loop");

        // The positive control, in the same watch: the file itself.
        std::fs::write(&cfg, "# changed\n").unwrap();
        assert_eq!(wait(&w, Duration::from_secs(2)), Some(Trigger::File));
    }

    #[test]
    fn a_churning_directory_costs_a_read_per_pause_not_per_event() {
        let (tmp, cfg, w) = watched("reload-churn");
        let dir = tmp.path();
        // Let the thread block in its first read.
        std::thread::sleep(Duration::from_millis(50));
        let r0 = w.queue_reads();
        // 3,000 events: a GPU file replaced by rename, 1,000 times.
        let t = Instant::now();
        for i in 0..1000 {
            std::fs::write(dir.join("gpu.json.tmp"), format!("{{\"n\":{i}}}")).unwrap();
            std::fs::rename(dir.join("gpu.json.tmp"), dir.join("gpu.json")).unwrap();
        }
        std::thread::sleep(READ_PAUSE * 3);
        let (took, reads) = (t.elapsed(), w.queue_reads() - r0);
        let most = (took.as_millis() / READ_PAUSE.as_millis()) as u64 + 2;
        assert!(reads >= 1, "the events were not read");
        assert!(reads <= most, "{reads} reads for 3,000 events in {took:?}: want at most {most}");
        assert_eq!(wait(&w, Duration::ZERO), None, "another entry's change woke the loop");
        // The file itself still wakes the loop, within a pause.
        let t = Instant::now();
        std::fs::write(&cfg, "# changed\n").unwrap();
        assert_eq!(wait(&w, Duration::from_secs(2)), Some(Trigger::File));
        assert!(t.elapsed() < READ_PAUSE * 2, "{:?}", t.elapsed());
    }

    #[test]
    fn a_configmap_style_symlink_swap_wakes() {
        // zernel.toml -> ..data/zernel.toml, ..data -> ..v1: kubectl
        // updates a ConfigMap by renaming a new ..data over the old one.
        let tmp = TempDir::new("reload-configmap");
        let dir = tmp.path();
        for v in ["..v1", "..v2"] {
            std::fs::create_dir(dir.join(v)).unwrap();
            std::fs::write(dir.join(v).join("zernel.toml"), format!("# {v}\n")).unwrap();
        }
        std::os::unix::fs::symlink("..v1", dir.join("..data")).unwrap();
        let cfg = dir.join("zernel.toml");
        std::os::unix::fs::symlink("..data/zernel.toml", &cfg).unwrap();
        let mut w = ReloadWatch::new();
        w.on_file(&cfg).unwrap();
        let s0 = stamp(&cfg);

        std::os::unix::fs::symlink("..v2", dir.join("..data_tmp")).unwrap();
        assert_eq!(wait(&w, Duration::from_millis(300)), None, "..data_tmp's creation woke the loop");
        std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
        assert_eq!(wait(&w, Duration::from_secs(2)), Some(Trigger::File));
        assert_ne!(stamp(&cfg), s0);

        // Removed, then created again as a symlink: both wake.
        std::fs::remove_file(&cfg).unwrap();
        assert_eq!(wait(&w, Duration::from_secs(2)), Some(Trigger::File));
        std::os::unix::fs::symlink("..v1/zernel.toml", &cfg).unwrap();
        assert_eq!(wait(&w, Duration::from_secs(2)), Some(Trigger::File));
        assert_eq!(stamp(&cfg), stamp(&dir.join("..v1/zernel.toml")));
    }

    #[test]
    fn dropping_the_watch_ends_its_thread() {
        let tmp = TempDir::new("reload-drop");
        let cfg = tmp.path().join("zernel.toml");
        std::fs::write(&cfg, "").unwrap();
        let mut w = ReloadWatch::new();
        w.on_file(&cfg).unwrap();
        let handle = w.inotify.as_mut().and_then(|d| d.thread.take()).expect("a thread");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            drop(w);
            tx.send(()).unwrap();
        });
        rx.recv_timeout(Duration::from_secs(5)).expect("drop did not return");
        let t = Instant::now();
        while !handle.is_finished() {
            assert!(t.elapsed() < Duration::from_secs(5), "the inotify thread still runs after drop");
            std::thread::sleep(Duration::from_millis(10));
        }
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

        // A trigger while the file is as loaded (another of its names
        // changed, or it was renamed away and back): no reload due.
        assert!(!r.note(&source, Trigger::File), "an unchanged file made a reload due");

        // Same size as before: the mtime must move past the kernel's
        // timestamp granularity for the stamp to differ.
        std::thread::sleep(Duration::from_millis(20));
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
