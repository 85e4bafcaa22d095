// Compiles src/bpf/main.bpf.c (the scheduler) and src/bpf/threads.bpf.c
// (the observer's task iterator) into libbpf-rs skeletons and generates the
// Rust bindings for the structs and constants shared through src/bpf/intf.h.
// Also records the commit built (ZERNEL_GIT_SHA, empty outside a git
// checkout) for the version banner.
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !s.is_empty()).then_some(s)
}

fn main() {
    let sha = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_default();
    println!("cargo:rustc-env=ZERNEL_GIT_SHA={sha}");
    // Rebuilt when HEAD moves: HEAD itself, and the branch it points to
    // (its loose ref, or packed-refs once packed). Only existing files: a
    // missing one would rerun this script on every build.
    let branch = git(&["symbolic-ref", "-q", "HEAD"]);
    let mut watch = vec![git(&["rev-parse", "--git-path", "HEAD"])];
    if let Some(b) = &branch {
        watch.push(git(&["rev-parse", "--git-path", b]));
        watch.push(git(&["rev-parse", "--git-path", "packed-refs"]));
    }
    for path in watch.into_iter().flatten().filter(|p| std::path::Path::new(p).exists()) {
        println!("cargo:rerun-if-changed={path}");
    }

    scx_cargo::BpfBuilder::new()
        .unwrap()
        .enable_intf("src/bpf/intf.h", "bpf_intf.rs")
        .enable_skel("src/bpf/main.bpf.c", "bpf")
        .build()
        .unwrap();
    // The observer's task iterator: an object of its own, loadable on a
    // kernel without sched_ext.
    scx_cargo::BpfBuilder::new().unwrap().enable_skel("src/bpf/threads.bpf.c", "threads").build().unwrap();
}
