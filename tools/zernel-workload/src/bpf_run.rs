//! `zernel-workload bpf-run`: threads that spend nearly all their time
//! inside `migrate_disable()`, where the kernel runs a BPF program for
//! `BPF_PROG_TEST_RUN`. On a preemptible kernel (`preempt=full`) such a
//! thread is preempted there, and sched_ext enqueues it while it may not
//! leave its CPU: the case that a scheduler inserting into another CPU's
//! local queue must check (`is_migration_disabled()`).
//!
//! ```text
//! zernel-workload bpf-run --name NAME --secs S [--threads N]
//! ```
//!
//! The program is a socket filter that returns 0; each call runs it 20,000
//! times on a 64-byte packet. Prints `zernel-workload bpf-run calls N` at
//! the end (N summed over threads).

use libbpf_rs::libbpf_sys as sys;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Loads `r0 = 0; exit` as a socket filter; its fd.
fn load() -> Result<i32, String> {
    // struct bpf_insn { u8 code; u8 dst:4, src:4; s16 off; s32 imm; }
    let insns: [u64; 2] = [
        0xb7, // BPF_ALU64 | BPF_MOV | BPF_K: r0 = 0
        0x95, // BPF_JMP | BPF_EXIT
    ];
    // SAFETY: two 8-byte instructions laid out as struct bpf_insn; the
    // strings are NUL-terminated; libbpf copies what it reads.
    let fd = unsafe {
        sys::bpf_prog_load(
            sys::BPF_PROG_TYPE_SOCKET_FILTER,
            c"zt_ret0".as_ptr(),
            c"GPL".as_ptr(),
            insns.as_ptr() as *const sys::bpf_insn,
            insns.len() as _,
            std::ptr::null_mut(),
        )
    };
    if fd < 0 {
        return Err(format!("BPF_PROG_LOAD: {}", std::io::Error::from_raw_os_error(-fd)));
    }
    Ok(fd)
}

/// Runs program `fd` until `until`; the number of calls.
fn run(fd: i32, until: Instant) -> Result<u64, String> {
    let data = [0u8; 64];
    let mut calls = 0;
    while Instant::now() < until {
        let mut opts = sys::bpf_test_run_opts {
            sz: std::mem::size_of::<sys::bpf_test_run_opts>() as _,
            data_in: data.as_ptr().cast(),
            data_size_in: data.len() as u32,
            repeat: 20_000,
            ..Default::default()
        };
        // SAFETY: opts points at a bpf_test_run_opts of its stated size,
        // and data_in at data_size_in readable bytes.
        let rc = unsafe { sys::bpf_prog_test_run_opts(fd, &mut opts) };
        if rc < 0 {
            return Err(format!("BPF_PROG_TEST_RUN: {}", std::io::Error::from_raw_os_error(-rc)));
        }
        calls += 1;
    }
    Ok(calls)
}

pub fn bpf_run(name: &str, secs: u64, threads: u64) -> Result<u64, String> {
    let fd = load()?;
    let until = Instant::now() + std::time::Duration::from_secs(secs);
    let calls = AtomicU64::new(0);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads.max(1))
            .map(|_| {
                s.spawn(|| {
                    super::set_name(name);
                    let n = run(fd, until)?;
                    calls.fetch_add(n, Ordering::Relaxed);
                    Ok::<(), String>(())
                })
            })
            .collect();
        handles.into_iter().try_for_each(|h| h.join().unwrap_or_else(|_| Err("thread panicked".into())))
    })?;
    Ok(calls.into_inner())
}
