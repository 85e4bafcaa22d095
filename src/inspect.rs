//! `scx_zernel inspect`: what the kernel holds right now, read from the maps
//! a running instance pinned under `scheduler.pin_dir`. One fact a line, so
//! that scripts can grep it:
//!
//! ```text
//! counter <class> <stat> <value>     per-class counters (summed over CPUs)
//! global <name> <value>              global counters
//! tenant <name> cpu_ns <n>         CPU time used by each tenant's tasks
//! map_entries <n> / map_capacity <n> task_class fill level
//! tunable <key> <value>              what the loaded program was given: the
//!                                    [scheduler] keys after --mode (slice_us.<class>,
//!                                    starvation_bound_ms, wakeup_preempt_us, decision_ttl_ms,
//!                                    default_class), and nr_cpus, nr_nodes, numa,
//!                                    nr_tenants
//! tid=<t> class=<c> slice_us=<n> cpu=<n> node=<n> tenant=<n> preempt=<0|1> applied=<n>   (--tid, --entries)
//! ```

use std::path::Path;

use anyhow::{bail, Result};

use crate::class::Class;
use crate::config::Config;
use crate::sched::{Entry, Pinned, CLASS_STAT_NAMES, GLOBAL_STAT_NAMES};

/// A class index as the kernel holds it: its name, `#N` if it is none.
fn class_name(index: u32) -> String {
    Class::from_index(index).map_or_else(|| format!("#{index}"), |c| c.name().to_string())
}

/// One line describing a decision held by the kernel.
pub(crate) fn format_entry(tid: u32, e: &Entry) -> String {
    let class = class_name(e.class);
    format!(
        "tid={tid} class={class} slice_us={} cpu={} node={} tenant={} preempt={} applied={}",
        e.slice_ns / 1000,
        e.cpu,
        e.node,
        e.tenant,
        u8::from(e.preempt),
        e.applied
    )
}

pub fn run(cfg: &Config, tid: Option<u32>, entries: bool) -> Result<()> {
    if cfg.scheduler.pin_dir.is_empty() {
        bail!("scheduler.pin_dir is empty: the running instance pins no maps to inspect");
    }
    let maps = Pinned::open(Path::new(&cfg.scheduler.pin_dir))?;
    if let Some(tid) = tid {
        match maps.entry(tid)? {
            Some(e) => println!("{}", format_entry(tid, &e)),
            None => bail!("tid {tid}: no entry (default class)"),
        }
        return Ok(());
    }
    if entries {
        for (tid, e) in maps.entries()? {
            println!("{}", format_entry(tid, &e));
        }
        return Ok(());
    }
    let c = maps.counters()?;
    for class in Class::ALL {
        for (i, name) in CLASS_STAT_NAMES.iter().enumerate() {
            println!("counter {class} {name} {}", c.get(class, i));
        }
    }
    for (i, name) in GLOBAL_STAT_NAMES.iter().enumerate() {
        println!("global {name} {}", c.global[i]);
    }
    for (i, t) in cfg.tenants.iter().enumerate() {
        println!("tenant {} cpu_ns {}", t.name, c.tenant_ns[i]);
    }
    println!("map_entries {}", maps.map_entries()?);
    println!("map_capacity {}", maps.map_capacity());
    let t = maps.tunables()?;
    for class in Class::ALL {
        println!("tunable slice_us.{class} {}", t.slice_us[class.index() as usize]);
    }
    println!("tunable starvation_bound_ms {}", t.starvation_bound_ms);
    println!("tunable wakeup_preempt_us {}", t.wakeup_preempt_us);
    println!("tunable decision_ttl_ms {}", t.decision_ttl_ms);
    println!("tunable default_class {}", class_name(t.default_class));
    println!("tunable nr_cpus {}", t.nr_cpus);
    println!("tunable nr_nodes {}", t.nr_nodes);
    println!("tunable numa {}", u8::from(t.numa));
    println!("tunable nr_tenants {}", t.nr_tenants);
    Ok(())
}
