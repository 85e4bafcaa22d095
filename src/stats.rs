//! Statistics: one derived struct ([`Metrics`]) served by scx_stats, printed
//! by `--stats`, read by `--monitor`.
//!
//! ```text
//!   BPF per-CPU counters ─┐
//!   daemon counters ──────┼─> Metrics ──> scx_stats server (unix socket) ──> --monitor, --stats
//!   phase detector ───────┘
//! ```
//!
//! The kernel's and the daemon's counters are cumulative since attach. The
//! stats server serves them as deltas, like the scx schedulers: each client
//! (`--monitor`) gets what happened since its own last read, and `--stats`
//! prints what happened since its last line; gauges (map entries, threads,
//! phases, tenants' shares) are served as they are. The metrics endpoint
//! serves the cumulative values (Prometheus counters).

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use scx_stats::prelude::*;
use scx_stats_derive::{stat_doc, Stats};
use serde::{Deserialize, Serialize};

use crate::class::Class;
use crate::pipeline::Pipeline;
use crate::sched::Counters;

/// One tenant's CPU over the last stats interval.
#[stat_doc]
#[derive(Clone, Debug, Default, Serialize, Deserialize, Stats)]
pub struct TenantMetrics {
    #[stat(desc = "Weight in force (GPUs or configured weight)")]
    pub weight: f64,
    #[stat(desc = "Share of the tenants' CPU time it used (%)")]
    pub share_pct: f64,
    #[stat(desc = "Share its weight entitles it to (%)")]
    pub entitled_pct: f64,
    #[stat(desc = "CPU used beyond its entitlement, lent by idle tenants (%)")]
    pub borrowed_pct: f64,
    #[stat(desc = "Entitlement it left to others (%)")]
    pub lent_pct: f64,
}

impl TenantMetrics {
    /// From the CPU time each tenant used over one interval and the weights.
    pub fn compute(used_ns: &[u64], weights: &[u64]) -> Vec<TenantMetrics> {
        let used: u64 = used_ns.iter().sum();
        let wsum: u64 = weights.iter().sum();
        used_ns
            .iter()
            .zip(weights)
            .map(|(&u, &w)| {
                let share = if used > 0 { u as f64 * 100.0 / used as f64 } else { 0.0 };
                let entitled = if wsum > 0 { w as f64 * 100.0 / wsum as f64 } else { 0.0 };
                TenantMetrics {
                    weight: w as f64 / f64::from(crate::bpf_intf::zernel_consts_ZERNEL_WEIGHT_UNIT),
                    share_pct: share,
                    entitled_pct: entitled,
                    borrowed_pct: (share - entitled).max(0.0),
                    lent_pct: (entitled - share).max(0.0),
                }
            })
            .collect()
    }
}

#[stat_doc]
#[derive(Clone, Debug, Default, Serialize, Deserialize, Stats)]
#[stat(top)]
pub struct Metrics {
    #[stat(desc = "Tasks queued in the latency class")]
    pub latency_enqueued: u64,
    #[stat(desc = "Tasks queued in the ml class")]
    pub ml_enqueued: u64,
    #[stat(desc = "Tasks queued in the normal class")]
    pub normal_enqueued: u64,
    #[stat(desc = "Tasks queued in the batch class")]
    pub batch_enqueued: u64,
    #[stat(desc = "Dispatches from the latency queues")]
    pub latency_dispatched: u64,
    #[stat(desc = "Dispatches from the ml queues")]
    pub ml_dispatched: u64,
    #[stat(desc = "Dispatches from the normal queues")]
    pub normal_dispatched: u64,
    #[stat(desc = "Dispatches from the batch queues")]
    pub batch_dispatched: u64,
    #[stat(
        desc = "Tasks sent straight to an idle CPU, or kept by their CPU at a slice end with nothing else to run (all classes)"
    )]
    pub direct: u64,
    #[stat(desc = "Wakeups that preempted a lower class (all classes)")]
    pub preempted: u64,
    #[stat(desc = "Wakeups that took a busy CPU from a hog or a task that had run long enough (all classes)")]
    pub wake_preempted: u64,
    #[stat(desc = "Dispatches forced by the starvation bound (all classes)")]
    pub starved: u64,
    #[stat(
        desc = "Slice ends where the task kept its CPU: no higher class waited, and it went before its own queue's head or that queue was empty (all classes)"
    )]
    pub kept: u64,
    #[stat(desc = "Dispatches stolen from another NUMA node's queues")]
    pub steals: u64,
    #[stat(
        desc = "Wakeups that took a CPU other than their waker's and their own: latency or ml ones a lower class's, normal ones with their queue crowded a hog's (also in wake_preempted)"
    )]
    pub wake_afield: u64,
    #[stat(desc = "Of those, a CPU off the node of the wakee's queue, where none would do")]
    pub wake_afield_far: u64,
    #[stat(
        desc = "Interactive runs (normal class, sleeping within a starvation bound of waking: at a wakeup, a new task's first run, or a slice end of such a run) that took an ml hog's CPU, within the interactive budget"
    )]
    pub interactive: u64,
    #[stat(desc = "CPU time those interactive wakeups used, microseconds")]
    pub interactive_us: u64,
    #[stat(desc = "Lookups (wakeups, enqueues, kept slice ends) that found no decision (default class)")]
    pub map_misses: u64,
    #[stat(desc = "Lookups that found another task's entry (TID recycled): ignored")]
    pub map_stale: u64,
    #[stat(desc = "Tasks created (fork or clone) with their creator's decision, before the daemon saw them")]
    pub inherited: u64,
    #[stat(desc = "Lookups with no entry served by an inherited decision")]
    pub inherit_hits: u64,
    #[stat(desc = "Inherited decisions that ran out (decision_ttl after the fork) with no entry written")]
    pub inherit_ends: u64,
    #[stat(desc = "Tasks created since attach whose first enqueue with a decision came (entry or inherited)")]
    pub first_decisions: u64,
    #[stat(desc = "Enqueues of those tasks with no decision before it")]
    pub enq_before_decision: u64,
    #[stat(desc = "Processes marked ML by the kernel when they opened a GPU device")]
    pub gpu_opens: u64,
    #[stat(desc = "Lookups with no entry served by a GPU-open mark (class ml)")]
    pub gpu_open_hits: u64,
    #[stat(desc = "Decisions the daemon holds in the task_class map")]
    pub map_entries: u64,
    #[stat(desc = "Capacity of the task_class map")]
    pub map_capacity: u64,
    #[stat(desc = "Decisions written to the map")]
    pub decisions_written: u64,
    #[stat(desc = "Decisions not written because the map was full")]
    pub map_full: u64,
    #[stat(desc = "Threads observed in the last pass")]
    pub threads: u64,
    #[stat(desc = "Threads in ML processes")]
    pub ml_threads: u64,
    #[stat(desc = "Threads in the DataLoading phase")]
    pub phase_data_loading: u64,
    #[stat(desc = "Threads in the GpuCompute phase")]
    pub phase_gpu_compute: u64,
    #[stat(desc = "Threads in the NcclCollective phase")]
    pub phase_nccl_collective: u64,
    #[stat(desc = "Threads in the OptimizerStep phase")]
    pub phase_optimizer_step: u64,
    #[stat(desc = "Phase transitions since start")]
    pub phase_transitions: u64,
    #[stat(desc = "Duration of the last observer pass (us)")]
    pub observe_pass_us: u64,
    #[stat(desc = "Process events (fork, exec, exit) the kernel told the observer of")]
    pub proc_events: u64,
    #[stat(desc = "Listings of /proc (with process events: reconciliations only)")]
    pub proc_listings: u64,
    #[stat(desc = "Config reloads applied")]
    pub reloads: u64,
    #[stat(desc = "Config reloads rejected (old config kept)")]
    pub reloads_rejected: u64,
    #[stat(desc = "Calls of the policy script (threads whose facts changed)")]
    pub script_calls: u64,
    #[stat(desc = "Policy script calls that failed: the built-in decision was kept")]
    pub script_errors: u64,
    #[stat(desc = "Policy script calls stopped by the instruction budget (also in script_errors)")]
    pub script_budget_exceeded: u64,
    #[stat(desc = "Per-tenant CPU shares over the last second")]
    pub tenants: BTreeMap<String, TenantMetrics>,
}

// Here rather than in pipeline.rs: the stats read the stages, the stages
// import nothing of the stats.
impl Pipeline {
    /// Fills the pipeline's share of `m` (threads, phases, the policy
    /// script's counters, the observer's discoveries).
    pub fn fill_metrics(&self, m: &mut Metrics) {
        m.set_pipeline(&self.counts());
    }
}

impl Metrics {
    /// Fills the daemon-side fields from the pipeline's counts.
    pub(crate) fn set_pipeline(&mut self, c: &crate::pipeline::PipelineCounts) {
        self.threads = c.threads;
        self.ml_threads = c.ml_threads;
        self.phase_data_loading = c.phase_data_loading;
        self.phase_gpu_compute = c.phase_gpu_compute;
        self.phase_nccl_collective = c.phase_nccl_collective;
        self.phase_optimizer_step = c.phase_optimizer_step;
        self.phase_transitions = c.phase_transitions;
        self.observe_pass_us = c.observe_pass_us;
        self.script_calls = c.script.calls;
        self.script_errors = c.script.errors;
        self.script_budget_exceeded = c.script.budget_exceeded;
        self.proc_events = c.proc_events;
        self.proc_listings = c.proc_listings;
    }

    /// Fills the kernel-side fields from the BPF counters.
    pub(crate) fn set_counters(&mut self, c: &Counters) {
        use crate::bpf_intf as i;
        let sum = |stat: u32| Class::ALL.iter().map(|&k| c.get(k, stat as usize)).sum::<u64>();
        let enq = i::zernel_class_stat_ZSTAT_ENQUEUED as usize;
        let disp = i::zernel_class_stat_ZSTAT_DISPATCHED as usize;
        self.latency_enqueued = c.get(Class::Latency, enq);
        self.ml_enqueued = c.get(Class::Ml, enq);
        self.normal_enqueued = c.get(Class::Normal, enq);
        self.batch_enqueued = c.get(Class::Batch, enq);
        self.latency_dispatched = c.get(Class::Latency, disp);
        self.ml_dispatched = c.get(Class::Ml, disp);
        self.normal_dispatched = c.get(Class::Normal, disp);
        self.batch_dispatched = c.get(Class::Batch, disp);
        self.direct = sum(i::zernel_class_stat_ZSTAT_DIRECT);
        self.preempted = sum(i::zernel_class_stat_ZSTAT_PREEMPTED);
        self.starved = sum(i::zernel_class_stat_ZSTAT_STARVED);
        self.kept = sum(i::zernel_class_stat_ZSTAT_KEPT);
        self.wake_preempted = sum(i::zernel_class_stat_ZSTAT_WAKE_PREEMPT);
        self.steals = c.global[i::zernel_global_stat_ZGSTAT_STEAL as usize];
        self.wake_afield = c.global[i::zernel_global_stat_ZGSTAT_WAKE_AFIELD as usize];
        self.wake_afield_far = c.global[i::zernel_global_stat_ZGSTAT_WAKE_AFIELD_FAR as usize];
        self.interactive = c.global[i::zernel_global_stat_ZGSTAT_INTERACTIVE as usize];
        self.interactive_us = c.global[i::zernel_global_stat_ZGSTAT_INTERACTIVE_NS as usize] / 1000;
        self.map_misses = c.global[i::zernel_global_stat_ZGSTAT_MAP_MISS as usize];
        self.map_stale = c.global[i::zernel_global_stat_ZGSTAT_MAP_STALE as usize];
        self.inherited = c.global[i::zernel_global_stat_ZGSTAT_INHERITED as usize];
        self.inherit_hits = c.global[i::zernel_global_stat_ZGSTAT_INHERIT_HIT as usize];
        self.inherit_ends = c.global[i::zernel_global_stat_ZGSTAT_INHERIT_END as usize];
        self.first_decisions = c.global[i::zernel_global_stat_ZGSTAT_FIRST_DEC as usize];
        self.enq_before_decision = c.global[i::zernel_global_stat_ZGSTAT_ENQ_BEFORE_DEC as usize];
        self.gpu_opens = c.global[i::zernel_global_stat_ZGSTAT_GPU_OPEN as usize];
        self.gpu_open_hits = c.global[i::zernel_global_stat_ZGSTAT_GPU_HIT as usize];
    }

    /// What the counters counted since `prev`, an earlier snapshot of the
    /// same daemon; gauges as they are now. A counter below its earlier value
    /// started again (the BPF side restarted): its whole value is new.
    pub(crate) fn delta(&self, prev: &Metrics) -> Metrics {
        let d = |now: u64, then: u64| if now >= then { now - then } else { now };
        Metrics {
            latency_enqueued: d(self.latency_enqueued, prev.latency_enqueued),
            ml_enqueued: d(self.ml_enqueued, prev.ml_enqueued),
            normal_enqueued: d(self.normal_enqueued, prev.normal_enqueued),
            batch_enqueued: d(self.batch_enqueued, prev.batch_enqueued),
            latency_dispatched: d(self.latency_dispatched, prev.latency_dispatched),
            ml_dispatched: d(self.ml_dispatched, prev.ml_dispatched),
            normal_dispatched: d(self.normal_dispatched, prev.normal_dispatched),
            batch_dispatched: d(self.batch_dispatched, prev.batch_dispatched),
            direct: d(self.direct, prev.direct),
            preempted: d(self.preempted, prev.preempted),
            wake_preempted: d(self.wake_preempted, prev.wake_preempted),
            kept: d(self.kept, prev.kept),
            starved: d(self.starved, prev.starved),
            steals: d(self.steals, prev.steals),
            wake_afield: d(self.wake_afield, prev.wake_afield),
            wake_afield_far: d(self.wake_afield_far, prev.wake_afield_far),
            interactive: d(self.interactive, prev.interactive),
            interactive_us: d(self.interactive_us, prev.interactive_us),
            map_misses: d(self.map_misses, prev.map_misses),
            map_stale: d(self.map_stale, prev.map_stale),
            inherited: d(self.inherited, prev.inherited),
            inherit_hits: d(self.inherit_hits, prev.inherit_hits),
            inherit_ends: d(self.inherit_ends, prev.inherit_ends),
            first_decisions: d(self.first_decisions, prev.first_decisions),
            enq_before_decision: d(self.enq_before_decision, prev.enq_before_decision),
            gpu_opens: d(self.gpu_opens, prev.gpu_opens),
            gpu_open_hits: d(self.gpu_open_hits, prev.gpu_open_hits),
            decisions_written: d(self.decisions_written, prev.decisions_written),
            map_full: d(self.map_full, prev.map_full),
            phase_transitions: d(self.phase_transitions, prev.phase_transitions),
            proc_events: d(self.proc_events, prev.proc_events),
            proc_listings: d(self.proc_listings, prev.proc_listings),
            reloads: d(self.reloads, prev.reloads),
            reloads_rejected: d(self.reloads_rejected, prev.reloads_rejected),
            script_calls: d(self.script_calls, prev.script_calls),
            script_errors: d(self.script_errors, prev.script_errors),
            script_budget_exceeded: d(self.script_budget_exceeded, prev.script_budget_exceeded),
            ..self.clone()
        }
    }

    pub fn format<W: Write>(&self, w: &mut W) -> Result<()> {
        writeln!(
            w,
            "[zernel] enq lat/ml/nrm/bat {}/{}/{}/{} disp {}/{}/{}/{} | direct {} kept {} preempt {} wake-preempt {} (afield {} far {}) interactive {} starved {} steal {} | \
             map {}/{} miss {} stale {} written {} full {} | inherited {} hit {} end {}",
            self.latency_enqueued,
            self.ml_enqueued,
            self.normal_enqueued,
            self.batch_enqueued,
            self.latency_dispatched,
            self.ml_dispatched,
            self.normal_dispatched,
            self.batch_dispatched,
            self.direct,
            self.kept,
            self.preempted,
            self.wake_preempted,
            self.wake_afield,
            self.wake_afield_far,
            self.interactive,
            self.starved,
            self.steals,
            self.map_entries,
            self.map_capacity,
            self.map_misses,
            self.map_stale,
            self.decisions_written,
            self.map_full,
            self.inherited,
            self.inherit_hits,
            self.inherit_ends,
        )?;
        writeln!(
            w,
            "[zernel] threads {} ml {} | phase load/gpu/nccl/optim {}/{}/{}/{} transitions {} | pass {} us | proc events {} listings {} | reloads {} rejected {} | script calls {} errors {} budget {}",
            self.threads,
            self.ml_threads,
            self.phase_data_loading,
            self.phase_gpu_compute,
            self.phase_nccl_collective,
            self.phase_optimizer_step,
            self.phase_transitions,
            self.observe_pass_us,
            self.proc_events,
            self.proc_listings,
            self.reloads,
            self.reloads_rejected,
            self.script_calls,
            self.script_errors,
            self.script_budget_exceeded,
        )?;
        for (name, t) in &self.tenants {
            writeln!(
                w,
                "[zernel] tenant {name}: weight {:.2} share {:.1}% entitled {:.1}% borrowed {:.1}% lent {:.1}%",
                t.weight, t.share_pct, t.entitled_pct, t.borrowed_pct, t.lent_pct
            )?;
        }
        Ok(())
    }
}

/// The scx_stats server's description: one "top" op answering with Metrics,
/// as deltas since the same client's last read (the first read: since it
/// connected).
pub fn server_data() -> StatsServerData<(), Metrics> {
    let open: Box<dyn StatsOpener<(), Metrics>> = Box::new(move |(req_ch, res_ch)| {
        req_ch.send(())?;
        let mut prev = res_ch.recv()?;
        let read: Box<dyn StatsReader<(), Metrics>> = Box::new(move |_args, (req_ch, res_ch)| {
            req_ch.send(())?;
            let now = res_ch.recv()?;
            let delta = now.delta(&prev);
            prev = now;
            delta.to_json()
        });
        Ok(read)
    });
    StatsServerData::new()
        .add_meta(TenantMetrics::meta())
        .add_meta(Metrics::meta())
        .add_ops("top", StatsOps { open, close: None })
}

/// Prints the running scheduler's stats every `intv` (client side only).
pub fn monitor(intv: Duration, shutdown: Arc<AtomicBool>) -> Result<()> {
    scx_utils::monitor_stats::<Metrics>(
        &[],
        intv,
        || shutdown.load(Ordering::Relaxed),
        |m| m.format(&mut std::io::stdout()),
    )
}

#[cfg(test)]
mod tests {
    use super::{Metrics, TenantMetrics};

    #[test]
    fn deltas_count_since_the_last_read_and_gauges_stay() {
        let prev = Metrics { batch_enqueued: 400, starved: 7, map_entries: 30, threads: 90, ..Default::default() };
        let now = Metrics { batch_enqueued: 520, starved: 7, map_entries: 25, threads: 91, ..Default::default() };
        let d = now.delta(&prev);
        assert_eq!((d.batch_enqueued, d.starved), (120, 0));
        assert_eq!((d.map_entries, d.threads), (25, 91));
        // The BPF side restarted: its counters start again from 0.
        let restarted = Metrics { batch_enqueued: 15, ..Default::default() };
        assert_eq!(restarted.delta(&prev).batch_enqueued, 15);
    }

    #[test]
    fn borrowed_and_lent_follow_use_against_entitlement() {
        // Weights 3:1; b idle: a uses everything, borrows b's 25%.
        let t = TenantMetrics::compute(&[1000, 0], &[3072, 1024]);
        assert_eq!((t[0].share_pct, t[0].entitled_pct, t[0].borrowed_pct), (100.0, 75.0, 25.0));
        assert_eq!((t[1].share_pct, t[1].lent_pct, t[1].weight), (0.0, 25.0, 1.0));
        // Nothing ran: no shares, nothing borrowed.
        let t = TenantMetrics::compute(&[0, 0], &[1024, 1024]);
        assert_eq!((t[0].share_pct, t[0].borrowed_pct, t[0].lent_pct), (0.0, 0.0, 50.0));
    }
}
