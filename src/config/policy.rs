//! `[policy]`: the phase table and the policy script.

use serde::{Deserialize, Serialize};

use crate::class::{Class, SLICE_US_RANGE};

/// How one phase is scheduled.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PhasePolicy {
    /// The class (priority) threads in this phase are queued in.
    pub class: Class,
    /// May a wakeup of such a thread preempt a CPU running a lower class?
    pub preempt: bool,
    /// How long such a thread may wait for a CPU, in microseconds; the slice
    /// is half of it.
    pub latency_target_us: u64,
}

/// `[policy]`: the phase table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    /// The class of an ML process's threads that are in no known phase
    /// (Unknown): a trainer or an inference server when no GPU data is
    /// available, intra-op pool threads. Slice: the class default; no
    /// preemption. "none": no decision for them (the default class).
    #[serde(with = "class_or_none")]
    pub ml_unknown: Option<Class>,
    /// DataLoader workers reading and decoding: keep the input pipeline fed.
    pub data_loading: PhasePolicy,
    /// The thread launching GPU kernels: wake it at once, the GPU waits on it.
    pub gpu_compute: PhasePolicy,
    /// Collective progress threads: every rank waits on the slowest.
    pub nccl_collective: PhasePolicy,
    /// The CPU-bound optimizer step: throughput, longer slices.
    pub optimizer_step: PhasePolicy,
    /// A Lua policy script ("" = none), run when a thread's facts change;
    /// see policy_script.rs.
    pub script: String,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self {
            ml_unknown: Some(Class::Ml),
            data_loading: PhasePolicy { class: Class::Ml, preempt: false, latency_target_us: 8000 },
            gpu_compute: PhasePolicy { class: Class::Latency, preempt: true, latency_target_us: 2000 },
            nccl_collective: PhasePolicy { class: Class::Latency, preempt: true, latency_target_us: 1000 },
            optimizer_step: PhasePolicy { class: Class::Ml, preempt: false, latency_target_us: 16000 },
            script: String::new(),
        }
    }
}

impl PolicyConfig {
    pub fn validate(&self) -> Result<(), String> {
        for (key, p) in [
            ("data_loading", &self.data_loading),
            ("gpu_compute", &self.gpu_compute),
            ("nccl_collective", &self.nccl_collective),
            ("optimizer_step", &self.optimizer_step),
        ] {
            let lo = SLICE_US_RANGE.0 * 2;
            if !(lo..=SLICE_US_RANGE.1).contains(&p.latency_target_us) {
                return Err(format!(
                    "policy.{key}.latency_target_us = {} is out of range {lo}..={}",
                    p.latency_target_us, SLICE_US_RANGE.1
                ));
            }
        }
        Ok(())
    }
}

/// `policy.ml_unknown` in TOML: a class name, or "none".
mod class_or_none {
    use serde::{de::Error, Deserialize, Deserializer, Serializer};

    use crate::class::Class;

    pub fn serialize<S: Serializer>(v: &Option<Class>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(v.map_or("none", Class::name))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Class>, D::Error> {
        let name = String::deserialize(d)?;
        if name == "none" {
            return Ok(None);
        }
        match Class::ALL.iter().find(|c| c.name() == name) {
            Some(&c) => Ok(Some(c)),
            None => {
                Err(D::Error::custom(format!("unknown class '{name}', expected none, latency, ml, normal or batch")))
            }
        }
    }
}
