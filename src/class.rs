//! The scheduling classes, as the BPF side numbers them (`enum
//! zernel_class` in src/bpf/intf.h, the one definition), and the bounds of
//! a slice.
//!
//! ```text
//!   intf.h: ZCLASS_LATENCY < ZCLASS_ML < ZCLASS_NORMAL < ZCLASS_BATCH (ZCLASS_NR)
//!              │ discriminants and the count come from the generated bindings:
//!              v a class added there does not compile here until it is named
//!   Class::Latency, Class::Ml, Class::Normal, Class::Batch (Class::ALL)
//! ```

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::bpf_intf;

/// Number of classes (`ZCLASS_NR`).
pub(crate) const NR_CLASSES: usize = bpf_intf::zernel_class_ZCLASS_NR as usize;

/// A scheduling class, highest priority first: `enum zernel_class`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
#[repr(u32)]
pub enum Class {
    /// Latency-critical: GPU kernel launchers, collective progress threads.
    Latency = bpf_intf::zernel_class_ZCLASS_LATENCY,
    /// ML compute: data loaders, optimizer steps.
    Ml = bpf_intf::zernel_class_ZCLASS_ML,
    /// Everything else; the default.
    Normal = bpf_intf::zernel_class_ZCLASS_NORMAL,
    /// Background work that yields to all of the above (within the starvation bound).
    Batch = bpf_intf::zernel_class_ZCLASS_BATCH,
}

impl Class {
    /// Every class, in the BPF side's order (its index).
    pub(crate) const ALL: [Class; NR_CLASSES] = [Class::Latency, Class::Ml, Class::Normal, Class::Batch];

    /// The index used by the BPF side (`enum zernel_class`).
    pub fn index(self) -> u32 {
        self as u32
    }

    pub(crate) fn from_index(i: u32) -> Option<Class> {
        Class::ALL.get(i as usize).copied()
    }

    pub fn name(self) -> &'static str {
        match self {
            Class::Latency => "latency",
            Class::Ml => "ml",
            Class::Normal => "normal",
            Class::Batch => "batch",
        }
    }
}

// ALL is in index order (the arrays indexed by class depend on it).
const _: () = {
    let mut i = 0;
    while i < NR_CLASSES {
        assert!(Class::ALL[i] as usize == i);
        i += 1;
    }
};

impl fmt::Display for Class {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Default slice of each class in microseconds, by index (intf.h's
/// `ZERNEL_SLICE_US_*`, which main.bpf.c starts with too).
pub(crate) const DEFAULT_SLICE_US: [u64; NR_CLASSES] = [
    bpf_intf::zernel_consts_ZERNEL_SLICE_US_LATENCY as u64,
    bpf_intf::zernel_consts_ZERNEL_SLICE_US_ML as u64,
    bpf_intf::zernel_consts_ZERNEL_SLICE_US_NORMAL as u64,
    bpf_intf::zernel_consts_ZERNEL_SLICE_US_BATCH as u64,
];

/// Valid range of a slice, in microseconds.
pub(crate) const SLICE_US_RANGE: (u64, u64) = (50, 1_000_000);
