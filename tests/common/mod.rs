//! Helpers shared by the host integration tests: child processes that are
//! always reaped, temporary directories that are always removed, and the two
//! workloads the live tests run side by side.

#![allow(dead_code)]

use std::path::Path;
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

/// `zernel-workload train` with two DataLoader workers, writing its fake GPU
/// to `gpu_file` and its data under `dir`.
pub fn spawn_train(gpu_file: &Path, dir: &Path, secs: u32) -> Reaped {
    Reaped(
        Command::new(env!("CARGO_BIN_EXE_zernel-workload"))
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

/// A plain shell busy loop with no ML evidence in its environment.
pub fn spawn_shell_loop() -> Reaped {
    Reaped(
        Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .env_remove("RANK")
            .env_remove("LOCAL_RANK")
            .env_remove("WORLD_SIZE")
            .env_remove("CUDA_VISIBLE_DEVICES")
            .spawn()
            .expect("starting sh"),
    )
}
