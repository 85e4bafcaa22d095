//! The configuration file (`zernel.toml`): schema, defaults and validation.
//!
//! ```text
//!   zernel.toml ──read──> toml::from_str ──> Config ──validate()──> in force
//!        │                    │                           │
//!        └ missing/unreadable └ syntax, unknown key,      └ absurd value
//!          "PATH: cannot read"  bad type: "PATH:L:C: msg"   "PATH: key: msg"
//! ```
//!
//! Every error is one line that names the file and, where the parser knows
//! it, the line, column and key. Each section has its submodule here
//! (`[phase]` in phase.rs, `[observe]` in observe.rs, ...), which the stage
//! that reads it imports: the configuration comes first and imports no
//! later stage. No key is accepted that nothing reads: unknown keys are
//! errors.
//!
//! A missing `--config` means the built-in defaults, which equal the
//! commented configs/zernel.toml.

use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};

mod gpu;
mod observe;
mod phase;
mod policy;
mod source;
mod topology;

pub use gpu::{GpuConfig, ProviderKind};
pub use observe::{ObserveConfig, ThreadCounters};
pub use phase::PhaseConfig;
pub use policy::{PhasePolicy, PolicyConfig};
pub(crate) use source::{stamp, Stamp};
pub use source::{Mode, Source};
pub use topology::{GpuNodePin, TopologyConfig};

use crate::bpf_intf;
use crate::class::{Class, DEFAULT_SLICE_US, SLICE_US_RANGE};
use crate::rules::RuleConfig;

/// Default time slice of each class, in microseconds (used when a decision
/// carries no slice of its own).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SliceConfig {
    pub latency: u64,
    pub ml: u64,
    pub normal: u64,
    pub batch: u64,
}

impl Default for SliceConfig {
    fn default() -> Self {
        let us = |c: Class| DEFAULT_SLICE_US[c.index() as usize];
        Self { latency: us(Class::Latency), ml: us(Class::Ml), normal: us(Class::Normal), batch: us(Class::Batch) }
    }
}

impl SliceConfig {
    pub fn get(&self, class: Class) -> u64 {
        match class {
            Class::Latency => self.latency,
            Class::Ml => self.ml,
            Class::Normal => self.normal,
            Class::Batch => self.batch,
        }
    }
}

/// `[scheduler] gpu_open_hook`: which kernel hook tells of GPU device
/// opens (the opening process is ML from its threads' next enqueue).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuOpenHook {
    /// fentry on chrdev_open where the kernel's BTF has it, else BPF LSM
    /// file_open where BPF is an active LSM, else none.
    #[default]
    Auto,
    /// fentry on chrdev_open only.
    Fentry,
    /// BPF LSM file_open only (needs `bpf` in /sys/kernel/security/lsm).
    Lsm,
    /// None: GPU processes are found by the /proc scan (fds, maps,
    /// environment) alone.
    Off,
}

/// `[scheduler]`: what the BPF scheduler is loaded with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SchedulerConfig {
    /// Class of a thread with no decision (not ML, no rule).
    pub default_class: Class,
    /// A queue whose oldest task has waited this long is served before any
    /// higher class: the bound on how long a lower class can be starved.
    pub starvation_bound_ms: u64,
    /// A thread that wakes when no CPU is idle, with fewer tasks queued in
    /// its class than there are CPUs, takes its waker's CPU, else its own,
    /// from a task of its class or a lower one that runs in long bursts (at
    /// least this long between sleeps, on average or since it last woke: a
    /// hog), or that has run for a quarter of this. A latency or ml thread
    /// that is a hog itself takes only a lower class's CPU (a DataLoader
    /// worker does not cut its trainer short). A latency or ml thread that
    /// may take neither CPU takes one of the next 15 that runs a lower
    /// class, on its queue's NUMA node if one there may be cut short (a
    /// trainer back from a GPU kernel, its own CPU busy with its loader,
    /// takes a CPU hog's). A normal thread that sleeps within a starvation
    /// bound of waking (a shell, a monitoring agent, a fork-and-exec chain)
    /// takes an ml hog's CPU at a wakeup, at its first run and at the slice
    /// ends of a run it got that way, while the CPU time such threads use
    /// that way stays under 10 % of all CPUs' time (counters `interactive`,
    /// `interactive_us`).
    /// 0 = never: a wakeup waits for a slice to end.
    pub wakeup_preempt_us: u64,
    /// Capacity of the per-thread decision map. When it is full, further
    /// threads keep the default class and `map_full` counts them.
    pub task_map_size: u32,
    /// Decisions hold while the daemon's heartbeat (written every pass) is
    /// younger than this; a hung daemon's decisions fall back to the default
    /// class after it, and return when it beats again.
    pub decision_ttl_ms: u64,
    /// Per-class default slices, in microseconds.
    pub slice_us: SliceConfig,
    /// bpffs directory where the maps are pinned for `scx_zernel inspect`
    /// ("" = do not pin).
    pub pin_dir: String,
    /// Which hook tells of GPU device opens: "auto", "fentry", "lsm" or
    /// "off". One log line says which is used; a hook the kernel lacks is
    /// none (the /proc scan finds GPU processes).
    pub gpu_open_hook: GpuOpenHook,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            default_class: Class::Normal,
            starvation_bound_ms: 50,
            wakeup_preempt_us: 1000,
            task_map_size: bpf_intf::zernel_consts_ZERNEL_TASK_MAP_DEFAULT,
            decision_ttl_ms: 5000,
            slice_us: SliceConfig::default(),
            pin_dir: "/sys/fs/bpf/scx_zernel".into(),
            gpu_open_hook: GpuOpenHook::Auto,
        }
    }
}

/// Valid range of `scheduler.decision_ttl_ms`: longer than a few of the
/// daemon's heartbeats (at least every 100 ms), at most an hour.
pub(crate) const DECISION_TTL_MS_RANGE: std::ops::RangeInclusive<u64> = 500..=3_600_000;

impl SchedulerConfig {
    fn validate(&self) -> Result<(), String> {
        if !(1..=10_000).contains(&self.starvation_bound_ms) {
            return Err(format!(
                "scheduler.starvation_bound_ms = {} is out of range 1..=10000 (the kernel watchdog ejects at 30 s)",
                self.starvation_bound_ms
            ));
        }
        if self.wakeup_preempt_us != 0 && !(SLICE_US_RANGE.0..=SLICE_US_RANGE.1).contains(&self.wakeup_preempt_us) {
            return Err(format!(
                "scheduler.wakeup_preempt_us = {} is out of range: 0 (off) or {}..={}",
                self.wakeup_preempt_us, SLICE_US_RANGE.0, SLICE_US_RANGE.1
            ));
        }
        if !(1024..=4_194_304).contains(&self.task_map_size) {
            return Err(format!("scheduler.task_map_size = {} is out of range 1024..=4194304", self.task_map_size));
        }
        if !DECISION_TTL_MS_RANGE.contains(&self.decision_ttl_ms) {
            return Err(format!(
                "scheduler.decision_ttl_ms = {} is out of range {}..={}",
                self.decision_ttl_ms,
                DECISION_TTL_MS_RANGE.start(),
                DECISION_TTL_MS_RANGE.end()
            ));
        }
        for class in Class::ALL {
            let v = self.slice_us.get(class);
            if !(SLICE_US_RANGE.0..=SLICE_US_RANGE.1).contains(&v) {
                return Err(format!(
                    "scheduler.slice_us.{class} = {v} is out of range {}..={}",
                    SLICE_US_RANGE.0, SLICE_US_RANGE.1
                ));
            }
        }
        Ok(())
    }
}

/// The whole configuration file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub scheduler: SchedulerConfig,
    pub observe: ObserveConfig,
    pub phase: PhaseConfig,
    pub gpu: GpuConfig,
    pub topology: TopologyConfig,
    pub policy: PolicyConfig,
    pub rules: Vec<RuleConfig>,
    pub tenancy: crate::tenants::TenancyConfig,
    pub tenants: Vec<crate::tenants::TenantConfig>,
}

/// A configuration error: always one line, naming the file.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

/// 1-based line and column of a byte offset.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.rfind('\n').map_or(before.len(), |nl| before.len() - nl - 1) + 1;
    (line, col)
}

impl Config {
    /// Parses and validates `text`; `origin` names the file in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let cfg: Config = toml::from_str(text).map_err(|e| {
            let msg = e.message().replace('\n', " ");
            match e.span() {
                Some(span) => {
                    let (l, c) = line_col(text, span.start);
                    ConfigError(format!("{origin}:{l}:{c}: {msg}"))
                }
                None => ConfigError(format!("{origin}: {msg}")),
            }
        })?;
        cfg.validate().map_err(|e| ConfigError(format!("{origin}: {e}")))?;
        Ok(cfg)
    }

    /// Reads, parses and validates a file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let origin = path.display().to_string();
        let text =
            std::fs::read_to_string(path).map_err(|e| ConfigError(format!("{origin}: cannot read config: {e}")))?;
        Config::parse(&text, &origin)
    }

    /// Checks the values the type system cannot.
    pub(crate) fn validate(&self) -> Result<(), String> {
        self.scheduler.validate()?;
        self.observe.validate()?;
        self.phase.validate()?;
        self.gpu.validate()?;
        self.policy.validate()?;
        self.tenancy.validate()?;
        crate::tenants::Tenants::compile(&self.tenants)?;
        crate::rules::Rules::compile(&self.rules, &self.tenant_names())?;
        Ok(())
    }

    /// The `[[tenants]]` names, in order (rules refer to tenants by name).
    pub(crate) fn tenant_names(&self) -> Vec<&str> {
        self.tenants.iter().map(|t| t.name.as_str()).collect()
    }

    /// The configuration as TOML (for `--dump-config`).
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# cannot serialize: {e}\n"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_file_is_the_defaults() {
        assert_eq!(Config::parse("", "z.toml").unwrap(), Config::default());
    }

    #[test]
    fn shipped_config_parses_and_equals_defaults() {
        let text = include_str!("../../configs/zernel.toml");
        let cfg = Config::parse(text, "configs/zernel.toml").unwrap();
        assert_eq!(cfg, Config::default());
    }

    #[test]
    fn unknown_key_names_file_line_and_key() {
        let e = Config::parse("[scheduler]\nstarvation_bound_ms = 10\nbogus = 1\n", "a.toml").unwrap_err().0;
        assert!(e.starts_with("a.toml:3:1: "), "{e}");
        assert!(e.contains("bogus"), "{e}");
        assert!(!e.contains('\n'));
    }

    #[test]
    fn malformed_toml_names_line() {
        let e = Config::parse("[scheduler\n", "b.toml").unwrap_err().0;
        assert!(e.starts_with("b.toml:1:"), "{e}");
    }

    #[test]
    fn bad_class_value_is_rejected() {
        let e = Config::parse("[scheduler]\ndefault_class = \"nope\"\n", "c.toml").unwrap_err().0;
        assert!(e.starts_with("c.toml:2:"), "{e}");
        assert!(e.contains("nope"), "{e}");
    }

    #[test]
    fn absurd_values_are_rejected_with_key() {
        for (text, key) in [
            ("[scheduler]\nstarvation_bound_ms = 0\n", "scheduler.starvation_bound_ms"),
            ("[scheduler]\ntask_map_size = 1000000000\n", "scheduler.task_map_size"),
            ("[scheduler.slice_us]\nbatch = 0\n", "scheduler.slice_us.batch"),
            ("[scheduler]\nwakeup_preempt_us = 10\n", "scheduler.wakeup_preempt_us"),
            ("[scheduler]\nwakeup_preempt_us = 5000000\n", "scheduler.wakeup_preempt_us"),
            ("[scheduler]\ndecision_ttl_ms = 100\n", "scheduler.decision_ttl_ms"),
            ("[tenancy]\ndefault_weight = 0\n", "tenancy.default_weight"),
        ] {
            let e = Config::parse(text, "d.toml").unwrap_err().0;
            assert!(e.starts_with("d.toml: ") && e.contains(key), "{e}");
        }
        // 0 turns wakeup preemption off; it is not out of range.
        assert_eq!(
            Config::parse("[scheduler]\nwakeup_preempt_us = 0\n", "f.toml").unwrap().scheduler.wakeup_preempt_us,
            0
        );
        let e = Config::parse("[scheduler]\nstarvation_bound_ms = -5\n", "e.toml").unwrap_err().0;
        assert!(e.starts_with("e.toml:2:"), "{e}");
    }

    #[test]
    fn missing_file_names_path() {
        let e = Config::load(Path::new("/nonexistent/zernel.toml")).unwrap_err().0;
        assert!(e.starts_with("/nonexistent/zernel.toml: cannot read config"), "{e}");
    }

    #[test]
    fn class_index_roundtrip() {
        for c in Class::ALL {
            assert_eq!(Class::from_index(c.index()), Some(c));
        }
        assert_eq!(Class::from_index(4), None);
    }
}

/// Property test: no input makes the parser panic, and every error is one
/// line naming the file. Inputs are the shipped config mutated at random
/// (byte flips, cuts, splices, duplicated lines) by a fixed-seed generator.
#[cfg(test)]
mod fuzz {
    use super::*;

    struct XorShift(u64);

    impl XorShift {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n.max(1) as u64) as usize
        }
    }

    const TOKENS: [&str; 12] =
        ["=", "[", "]", "\"", "\n", "-1", "1e309", "[[rules]]", "class = \"x\"", "{", "18446744073709551616", "\u{0}"];

    #[test]
    fn no_input_panics_and_errors_are_one_line() {
        let base = include_str!("../../configs/zernel.toml").as_bytes().to_vec();
        let mut rng = XorShift(0x5eed_2e41);
        let (mut ok, mut err) = (0, 0);
        for _ in 0..4000 {
            let mut b = base.clone();
            for _ in 0..=rng.below(4) {
                let at = rng.below(b.len());
                match rng.below(4) {
                    0 if at < b.len() => b[at] = rng.next() as u8,
                    0 | 1 => b.truncate(at),
                    2 => {
                        let t = TOKENS[rng.below(TOKENS.len())].as_bytes();
                        b.splice(at..at, t.iter().copied());
                    }
                    _ => {
                        let end = (at + rng.below(200)).min(b.len());
                        let chunk = b[at..end].to_vec();
                        b.splice(at..at, chunk);
                    }
                }
            }
            let text = String::from_utf8_lossy(&b);
            match Config::parse(&text, "f.toml") {
                Ok(_) => ok += 1,
                Err(e) => {
                    err += 1;
                    assert!(e.0.starts_with("f.toml"), "{e}");
                    assert!(!e.0.contains('\n'), "multi-line error: {e}");
                }
            }
        }
        assert!(ok > 0 && err > 0, "mutations should give both outcomes: {ok} ok, {err} errors");
    }
}
