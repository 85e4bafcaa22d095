//! Policy: from what is known of a thread to the decision the kernel applies.
//!
//! ```text
//!   rule match ──(class, slice, cpu)──┐
//!   phase ─────(policy table)─────────┼──> Decision { class, slice, cpu, node, preempt }
//!   GPU's NUMA node ──────────────────┘
//! ```
//!
//! The policy table maps each ML phase to a class (its priority), a latency
//! target and a preempt flag. The slice is derived from the latency target:
//! half of it, so that a runnable thread of the same class that has just
//! been passed over runs again within the target. A rule gives the class;
//! the phase then refines slice and preemption inside that class. A thread
//! of an ML process in no known phase (a trainer with no GPU data, an
//! inference server, a pool thread) gets `policy.ml_unknown`'s class (ml by
//! default), so a job is never queued below its own DataLoader workers. A
//! thread of no ML process with neither a rule nor a placement gets no
//! decision (the kernel's default class applies and no map entry is spent
//! on it).

use crate::class::Class;
use crate::config::{PhasePolicy, PolicyConfig};
use crate::phase::Phase;
use crate::rules::RuleVerdict;

impl PolicyConfig {
    /// The policy of a phase; None for Unknown.
    pub(crate) fn for_phase(&self, phase: Phase) -> Option<&PhasePolicy> {
        match phase {
            Phase::DataLoading => Some(&self.data_loading),
            Phase::GpuCompute => Some(&self.gpu_compute),
            Phase::NcclCollective => Some(&self.nccl_collective),
            Phase::OptimizerStep => Some(&self.optimizer_step),
            Phase::Unknown => None,
        }
    }
}

/// One thread's decision: exactly what is written to the task_class map.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Decision {
    pub class: Class,
    /// 0 = the class default.
    pub slice_ns: u64,
    /// Preferred CPU, -1 = none.
    pub cpu: i32,
    /// Preferred NUMA node, -1 = none.
    pub node: i32,
    /// Tenant index, -1 = none.
    pub tenant: i32,
    pub preempt: bool,
}

impl PolicyConfig {
    /// The decision for a thread, or None when the kernel default applies.
    /// A thread of an ML process with neither rule nor phase gets
    /// `ml_unknown`'s class. Any other thread with a GPU node or a tenant
    /// but neither rule nor phase still gets a decision, in
    /// `default_class`, so that it is placed near its GPU and charged to its
    /// tenant.
    pub fn decide(&self, f: &Facts, default_class: Class) -> Option<Decision> {
        let pp = self.for_phase(f.phase);
        let rule = f.rule.unwrap_or_default();
        let placed = f.node.is_some() || f.tenant.is_some() || rule.cpu.is_some() || rule.slice_us.is_some();
        let ml_unknown = if f.ml { self.ml_unknown } else { None };
        let class = match (rule.class, pp, ml_unknown) {
            (Some(c), _, _) => c,
            (None, Some(p), _) => p.class,
            (None, None, Some(c)) => c,
            (None, None, None) if placed => default_class,
            (None, None, None) => return None,
        };
        let slice_ns = match (rule.slice_us, pp) {
            (Some(us), _) => us * 1000,
            (None, Some(p)) => p.latency_target_us * 1000 / 2,
            (None, None) => 0,
        };
        Some(Decision {
            class,
            slice_ns,
            cpu: rule.cpu.unwrap_or(-1),
            node: f.node.map_or(-1, |n| n as i32),
            tenant: f.tenant.map_or(-1, |t| t as i32),
            preempt: pp.is_some_and(|p| p.preempt),
        })
    }
}

/// What is known of a thread when its decision is made.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Facts {
    /// The thread's process is an ML process.
    pub ml: bool,
    pub rule: Option<RuleVerdict>,
    pub phase: Phase,
    /// NUMA node of the thread's GPU.
    pub node: Option<usize>,
    /// Tenant index.
    pub tenant: Option<usize>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_ml_phase_has_a_decision_and_unknown_has_none() {
        let p = PolicyConfig::default();
        assert_eq!(
            p.decide(&Facts { ml: false, rule: None, phase: Phase::Unknown, node: None, tenant: None }, Class::Normal),
            None
        );
        let gc = p
            .decide(&Facts { ml: false, rule: None, phase: Phase::GpuCompute, node: None, tenant: None }, Class::Normal)
            .unwrap();
        assert_eq!((gc.class, gc.preempt, gc.slice_ns, gc.node), (Class::Latency, true, 1_000_000, -1));
        let nc = p
            .decide(
                &Facts { ml: false, rule: None, phase: Phase::NcclCollective, node: Some(1), tenant: None },
                Class::Normal,
            )
            .unwrap();
        assert_eq!((nc.class, nc.node), (Class::Latency, 1));
        assert_eq!(
            p.decide(
                &Facts { ml: false, rule: None, phase: Phase::DataLoading, node: None, tenant: None },
                Class::Normal
            )
            .unwrap()
            .class,
            Class::Ml
        );
        let os = p
            .decide(
                &Facts { ml: false, rule: None, phase: Phase::OptimizerStep, node: None, tenant: None },
                Class::Normal,
            )
            .unwrap();
        assert_eq!((os.class, os.preempt, os.slice_ns), (Class::Ml, false, 8_000_000));
    }

    #[test]
    fn rule_class_wins_and_phase_refines() {
        let p = PolicyConfig::default();
        let r = RuleVerdict { class: Some(Class::Batch), slice_us: None, cpu: Some(3) };
        let d = p
            .decide(
                &Facts { ml: false, rule: Some(r), phase: Phase::GpuCompute, node: None, tenant: None },
                Class::Normal,
            )
            .unwrap();
        assert_eq!((d.class, d.preempt, d.slice_ns, d.cpu), (Class::Batch, true, 1_000_000, 3));
        let d = p
            .decide(&Facts { ml: false, rule: Some(r), phase: Phase::Unknown, node: None, tenant: None }, Class::Normal)
            .unwrap();
        assert_eq!((d.class, d.preempt, d.slice_ns), (Class::Batch, false, 0));
        let r = RuleVerdict { slice_us: Some(500), ..Default::default() };
        let d = p
            .decide(
                &Facts { ml: false, rule: Some(r), phase: Phase::DataLoading, node: None, tenant: None },
                Class::Normal,
            )
            .unwrap();
        assert_eq!((d.class, d.slice_ns), (Class::Ml, 500_000));
        // A rule with only a slice keeps the default class.
        let d = p
            .decide(&Facts { ml: false, rule: Some(r), phase: Phase::Unknown, node: None, tenant: None }, Class::Batch)
            .unwrap();
        assert_eq!((d.class, d.slice_ns), (Class::Batch, 500_000));
        // A GPU's node alone gives a placement in the default class.
        let d = p
            .decide(&Facts { ml: false, rule: None, phase: Phase::Unknown, node: Some(1), tenant: None }, Class::Normal)
            .unwrap();
        assert_eq!((d.class, d.node, d.slice_ns, d.preempt, d.tenant), (Class::Normal, 1, 0, false, -1));
        // A tenant alone too, and the tenant rides along with a phase.
        let d = p.decide(&Facts { tenant: Some(2), ..Default::default() }, Class::Batch).unwrap();
        assert_eq!((d.class, d.tenant), (Class::Batch, 2));
        let d = p
            .decide(&Facts { tenant: Some(0), phase: Phase::DataLoading, ..Default::default() }, Class::Normal)
            .unwrap();
        assert_eq!((d.class, d.tenant), (Class::Ml, 0));
        // Nothing to say: no decision.
        assert_eq!(p.decide(&Facts { rule: Some(RuleVerdict::default()), ..Default::default() }, Class::Normal), None);
    }

    #[test]
    fn ml_threads_in_no_phase_get_the_ml_unknown_class() {
        let mut p = PolicyConfig::default();
        let unknown = Facts { ml: true, ..Default::default() };
        let d = p.decide(&unknown, Class::Normal).unwrap();
        assert_eq!((d.class, d.slice_ns, d.preempt), (Class::Ml, 0, false));
        // A phase, or a rule's class, wins over it.
        let gc = Facts { ml: true, phase: Phase::GpuCompute, ..Default::default() };
        assert_eq!(p.decide(&gc, Class::Normal).unwrap().class, Class::Latency);
        let r = RuleVerdict { class: Some(Class::Batch), ..Default::default() };
        assert_eq!(p.decide(&Facts { rule: Some(r), ..unknown }, Class::Normal).unwrap().class, Class::Batch);
        // Not for threads of other processes.
        assert_eq!(p.decide(&Facts::default(), Class::Normal), None);
        // "none" turns it off.
        p.ml_unknown = None;
        assert_eq!(p.decide(&unknown, Class::Normal), None);
        let c: PolicyConfig = toml::from_str("ml_unknown = \"none\"").unwrap();
        assert_eq!(c.ml_unknown, None);
        let c: PolicyConfig = toml::from_str("ml_unknown = \"batch\"").unwrap();
        assert_eq!(c.ml_unknown, Some(Class::Batch));
        let e = toml::from_str::<PolicyConfig>("ml_unknown = \"fast\"").unwrap_err().to_string();
        assert!(e.contains("unknown class 'fast'"), "{e}");
        assert_eq!(toml::from_str::<PolicyConfig>("").unwrap(), PolicyConfig::default());
    }

    #[test]
    fn latency_target_range_is_checked() {
        let mut p = PolicyConfig::default();
        p.optimizer_step.latency_target_us = 10;
        assert!(p.validate().unwrap_err().contains("policy.optimizer_step.latency_target_us"));
    }
}
