//! Helpers shared by the host integration tests (and bench/observe.rs):
//! child processes that are always reaped, temporary directories that are
//! always removed, the zernel-workload binary, and the two workloads the
//! live tests run side by side.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// Kills and reaps a child on drop, so a failing assertion leaves nothing behind.
pub struct Reaped(pub Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

mod tempdir;
pub use tempdir::TempDir;

/// The zernel-workload binary. It is a crate of its own in the workspace
/// (tools/zernel-workload), so cargo does not build it for this package's
/// tests: `cargo build --workspace` (with the tests' profile) puts it in the
/// tests' target directory, one level above their executables (deps/).
pub fn workload_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own executable");
    let dir = exe.parent().and_then(Path::parent).expect("the test's executable is in <target>/<profile>/deps");
    let bin = dir.join("zernel-workload");
    assert!(
        bin.is_file(),
        "{} is missing: build it with `cargo build --workspace` (add --release for `cargo test --release` \
         and `cargo bench`) before running these tests",
        bin.display()
    );
    bin
}

/// `zernel-workload train` with two DataLoader workers, writing its fake GPU
/// to `gpu_file` and its data under `dir`.
pub fn spawn_train(gpu_file: &Path, dir: &Path, secs: u32) -> Reaped {
    Reaped(
        Command::new(workload_bin())
            .args(["train", "--secs", &secs.to_string(), "--workers", "2", "--gpu-file"])
            .arg(gpu_file)
            .arg("--data-dir")
            .arg(dir.join("data"))
            .env_remove("RANK")
            .stdout(Stdio::null())
            .spawn()
            .expect("starting zernel-workload"),
    )
}

/// Removes the variables that are ML evidence by default (`observe.ml_env_vars`:
/// rank, GPU list) from `cmd`'s environment.
pub fn without_ml_env(cmd: &mut Command) -> &mut Command {
    for var in scx_zernel::config::ObserveConfig::default().ml_env_vars {
        cmd.env_remove(var);
    }
    cmd
}

/// `sh -c SCRIPT ARGS...` with no ML evidence in its environment.
pub fn spawn_sh(script: &str, args: &[&std::ffi::OsStr]) -> Reaped {
    Reaped(without_ml_env(Command::new("sh").args(["-c", script]).args(args)).spawn().expect("starting sh"))
}

/// A plain shell busy loop with no ML evidence in its environment.
pub fn spawn_shell_loop() -> Reaped {
    spawn_sh("while :; do :; done", &[])
}
