//! Config reload latency on the daemon's side, without BPF: the daemon's own
//! [`Reloader`] and [`apply_reload`] drive a [`Pipeline`] the way the loop
//! does (wait on the triggers, then reload if due), and the time from the
//! event (the file replaced, written in place, or SIGHUP) to the new rules
//! being in force must be under 100 ms. A rewrite with the same content and
//! no SIGHUP reloads nothing; an invalid file is rejected and the old rules
//! stay.

mod common;

use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use scx_zernel::config::{Mode, Source};
use scx_zernel::daemon::apply_reload;
use scx_zernel::pipeline::Pipeline;
use scx_zernel::reload::Reloader;
use scx_zernel::topology::Topology;

/// The loop's wait-and-reload, on a thread: sends (ok, first rule's comm
/// pattern, when) after each reload.
fn daemon_side(source: Source) -> (mpsc::Receiver<(bool, String, Instant)>, mpsc::Sender<()>) {
    let (tx, rx) = mpsc::channel();
    let (stop_tx, stop_rx) = mpsc::channel::<()>();
    let (ready_tx, ready_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let topo = Topology::read(Path::new("/sys")).unwrap();
        let mut pipeline = Pipeline::new(source.load().unwrap(), topo).unwrap();
        let mut reloader = Reloader::new(&source).unwrap();
        ready_tx.send(()).unwrap();
        while stop_rx.try_recv().is_err() {
            if let Ok(t) = reloader.receiver().recv_timeout(Duration::from_millis(50)) {
                reloader.note(&source, t);
            }
            if reloader.due(&source) {
                let ok = apply_reload(&mut pipeline, &source);
                let comm = pipeline.cfg.rules.first().and_then(|r| r.comm.clone()).unwrap_or_default();
                tx.send((ok, comm, Instant::now())).unwrap();
            }
        }
    });
    ready_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    (rx, stop_tx)
}

fn rule(comm: &str) -> String {
    format!("[[rules]]\ncomm = \"{comm}\"\nclass = \"batch\"\n")
}

#[test]
fn reloads_take_effect_within_100ms_of_the_event() {
    let dir = common::TempDir::new("reload");
    let cfg = dir.0.join("zernel.toml");
    std::fs::write(&cfg, rule("^first$")).unwrap();
    let (applied, _stop) = daemon_side(Source { path: Some(cfg.clone()), mode: Mode::Auto });
    let limit = Duration::from_millis(100);
    let next = || applied.recv_timeout(Duration::from_secs(5)).expect("no reload within 5 s");

    // Replaced atomically (editors, ConfigMaps): rename over it.
    let tmp = dir.0.join(".zernel.toml.tmp");
    std::fs::write(&tmp, rule("^second$")).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let t0 = Instant::now();
    std::fs::rename(&tmp, &cfg).unwrap();
    let (ok, comm, at) = next();
    let took = at - t0;
    println!("rename -> new rules applied: {took:?}");
    assert!(ok && comm == "^second$", "{ok} {comm}");
    assert!(took < limit, "rename: {took:?}");

    // Written in place.
    std::thread::sleep(Duration::from_millis(100));
    let t0 = Instant::now();
    std::fs::write(&cfg, rule("^third$")).unwrap();
    let (ok, comm, at) = next();
    let took = at - t0;
    println!("write in place -> new rules applied: {took:?}");
    assert!(ok && comm == "^third$", "{ok} {comm}");
    assert!(took < limit, "write: {took:?}");

    // An invalid file: rejected, the old rules stay.
    std::thread::sleep(Duration::from_millis(100));
    std::fs::write(&cfg, "[[rules]]\ncomm = \"(\"\nclass = \"batch\"\n").unwrap();
    let (ok, comm, _) = next();
    assert!(!ok && comm == "^third$", "{ok} {comm}");

    // SIGHUP, the file unchanged since.
    std::fs::write(&cfg, rule("^fourth$")).unwrap();
    let _ = next();
    std::thread::sleep(Duration::from_millis(100));
    let t0 = Instant::now();
    unsafe { libc::raise(libc::SIGHUP) };
    let (ok, comm, at) = next();
    let took = at - t0;
    println!("SIGHUP -> reloaded: {took:?}");
    assert!(ok && comm == "^fourth$", "{ok} {comm}");
    assert!(took < limit, "SIGHUP: {took:?}");

    // Another file in the directory changing neither wakes the loop nor reloads.
    std::fs::write(dir.0.join("other"), "x").unwrap();
    assert!(applied.recv_timeout(Duration::from_millis(500)).is_err(), "reloaded for another file");
}

/// The policy script is watched too: an edit of the script alone (in a
/// directory of its own) reloads it, and a broken edit is rejected with its
/// line while the running script goes on deciding.
#[test]
fn an_edit_of_the_policy_script_alone_reloads_it() {
    let dir = common::TempDir::new("reload-script");
    std::fs::create_dir(dir.0.join("scripts")).unwrap();
    let script = dir.0.join("scripts/policy.lua");
    std::fs::write(&script, "function decide(t) return nil end\n").unwrap();
    let cfg = dir.0.join("zernel.toml");
    std::fs::write(&cfg, format!("[policy]\nscript = \"{}\"\n", script.display())).unwrap();
    let source = Source { path: Some(cfg.clone()), mode: Mode::Auto };
    let topo = Topology::read(Path::new("/sys")).unwrap();
    let mut pipeline = Pipeline::new(source.load().unwrap(), topo).unwrap();
    let mut reloader = Reloader::new(&source).unwrap();
    reloader.watch_script(&pipeline.cfg.policy.script);
    let me = unsafe { libc::gettid() } as u32;
    let verdict = |p: &mut Pipeline| {
        p.pass();
        p.script_verdict(me).map(|v| v.as_str())
    };
    assert_eq!(verdict(&mut pipeline), Some("keep"));
    // Waits (<= 5 s) until a reload is due, then applies it.
    let reload = |pipeline: &mut Pipeline, reloader: &mut Reloader| {
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(5) {
            if let Ok(t) = reloader.receiver().recv_timeout(Duration::from_millis(50)) {
                reloader.note(&source, t);
            }
            if reloader.due(&source) {
                return Some(apply_reload(pipeline, &source));
            }
        }
        None
    };

    std::thread::sleep(Duration::from_millis(100));
    std::fs::write(&script, "function decide(t) return false end\n").unwrap();
    assert_eq!(reload(&mut pipeline, &mut reloader), Some(true), "the script's edit did not reload");
    assert_eq!(verdict(&mut pipeline), Some("none"));

    std::thread::sleep(Duration::from_millis(100));
    std::fs::write(&script, "function decide(t)\n  return {\n").unwrap();
    assert_eq!(reload(&mut pipeline, &mut reloader), Some(false), "a broken script was not rejected");
    assert_eq!(verdict(&mut pipeline), Some("none"), "the running script did not stay");
}
