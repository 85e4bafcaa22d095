//! `zernel-workload entry`: writes one decision straight into a running
//! scheduler's pinned task_class map, as the daemon would, but with a start
//! time of our choosing. With `--start-offset 0` it is a valid entry for the
//! thread; with any other offset it is the entry of an earlier task that had
//! the same TID (a recycled TID), which the kernel must ignore, count as
//! map_stale, and leave in place (only its writer may remove it). `--node`
//! sets the preferred node (default -1, none), also one the machine lacks.
//!
//! ```text
//! zernel-workload entry --map PIN_DIR/task_class --tid T --class N [--start-offset TICKS] [--node N]
//! ```

use scx_zernel::bpf_intf::task_class;

/// The thread's start time in USER_HZ ticks (field 22 of /proc/<tid>/stat).
fn start_ticks(tid: u32) -> Result<u64, String> {
    let stat = std::fs::read_to_string(format!("/proc/{tid}/stat")).map_err(|e| format!("/proc/{tid}/stat: {e}"))?;
    let after_comm = stat.rsplit_once(") ").ok_or("no comm in stat")?.1;
    // Field 3 (state) is the first after comm: field 22 is the 20th.
    after_comm.split(' ').nth(19).and_then(|f| f.parse().ok()).ok_or_else(|| format!("/proc/{tid}/stat: no start time"))
}

pub fn write(map: &str, tid: u32, class: u32, offset: u64, node: i32) -> Result<(), String> {
    use libbpf_rs::{MapCore, MapFlags, MapHandle};
    let start = start_ticks(tid)? + offset;
    let v =
        task_class { class, flags: 0, slice_ns: 0, cpu: -1, node, tenant: -1, pad: 0, start_ticks: start, applied: 0 };
    // SAFETY: task_class is plain old data (bindgen of intf.h).
    let bytes = unsafe { std::slice::from_raw_parts((&v as *const task_class).cast::<u8>(), size_of::<task_class>()) };
    let m = MapHandle::from_pinned_path(map).map_err(|e| format!("{map}: {e}"))?;
    m.update(&tid.to_ne_bytes(), bytes, MapFlags::ANY).map_err(|e| format!("{map}: {e}"))?;
    println!("zernel-workload entry tid={tid} class={class} node={node} start_ticks={start} (offset {offset})");
    Ok(())
}
