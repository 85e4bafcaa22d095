//! Tenants: cgroup v2 subtrees that share the CPU in proportion to their GPUs
//! (or to an explicit weight).
//!
//! ```text
//!   [[tenants]] name, cgroup, gpus | weight
//!        │
//!        ├─ daemon: each thread whose process's cgroup is in a tenant's
//!        │          subtree gets `tenant = i` in its task_class entry
//!        └─ tenant_weight map: weight_i = UNIT * (weight or gpus)
//!                                   │
//!   BPF: tenant i's tasks queue in dsq TENANT+i; dispatch serves the tenant
//!        with work queued and the lowest vtime_i, where every slice adds
//!        runtime * UNIT / weight_i. Idle tenants are skipped (their share is
//!        lent to the others); a tenant coming back starts at the current
//!        vtime, so its share returns at once.
//! ```
//!
//! GPU counts: a tenant with neither `gpus` nor `weight` is weighted by the
//! GPUs its processes use right now (from the GPU provider). That count is
//! smoothed with an EWMA (`tenancy.demand_smoothing`), and the weights in
//! the kernel change only when some tenant's smoothed count moved by more
//! than `tenancy.rebalance_threshold` (relative) and the last change is
//! older than `tenancy.rebalance_cooldown_ms`: no flapping.
//!
//! The work of no tenant is one more share, the default share, weighted
//! `tenancy.default_weight` (like the root cgroup beside its children): an
//! untenanted CPU hog gets its weight's worth, not the tenants' CPU.
//! Latency-critical threads (kernel launchers, NCCL) belong to no share:
//! they run first. Inside a share, classes order its threads (ml > normal >
//! batch): each tenant has a queue per class.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::bpf_intf;

/// One `[[tenants]]` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// Name, for stats and logs.
    pub name: String,
    /// The tenant's cgroup v2 directory, relative to the cgroup2 mount
    /// ("/team-a") or absolute ("/sys/fs/cgroup/team-a"). Its whole subtree
    /// belongs to the tenant.
    pub cgroup: String,
    /// GPUs the tenant holds: its CPU share is proportional to this
    /// (Zernel's model). Absent (and no weight): the GPUs its processes use,
    /// measured live.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<u32>,
    /// An explicit weight instead of the GPU count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
}

const CGROUP_MOUNT: &str = "/sys/fs/cgroup";

impl TenantConfig {
    /// The cgroup path as /proc/<pid>/cgroup shows it ("/team-a").
    fn path(&self) -> String {
        let p = self.cgroup.strip_prefix(CGROUP_MOUNT).unwrap_or(&self.cgroup);
        let p = p.trim_end_matches('/');
        if p.is_empty() {
            "/".into()
        } else {
            p.into()
        }
    }

    /// Fixed relative CPU share; None = measured GPU count.
    pub fn share(&self) -> Option<u32> {
        self.weight.or(self.gpus)
    }
}

/// The configured tenants, in file order (index = BPF tenant id).
#[derive(Debug, Default, Clone)]
pub struct Tenants {
    names: Vec<String>,
    paths: Vec<String>,
    /// Configured share, None = measured GPUs.
    fixed: Vec<Option<u32>>,
    /// Weights in force (what the kernel has).
    weights: Vec<u64>,
    /// Weight of the default share (work of no tenant).
    default_weight: u64,
    /// Smoothed GPU count of measured tenants.
    demand: Vec<f64>,
    last_change: Option<Instant>,
}

const UNIT: u64 = bpf_intf::zernel_consts_ZERNEL_WEIGHT_UNIT as u64;

/// `[tenancy]`: how measured GPU counts become weights.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TenancyConfig {
    /// EWMA factor of a new GPU-count sample (0 < x <= 1; 1 = no smoothing).
    pub demand_smoothing: f64,
    /// Re-weight only when a tenant's smoothed count moved by more than this
    /// fraction of its weight in force.
    pub rebalance_threshold: f64,
    /// ...and the last re-weighting is at least this old (ms).
    pub rebalance_cooldown_ms: u64,
    /// Weight of the work of no tenant (one share beside the tenants', in
    /// the same units as a tenant's `weight`).
    pub default_weight: u32,
}

impl Default for TenancyConfig {
    fn default() -> Self {
        Self { demand_smoothing: 0.3, rebalance_threshold: 0.2, rebalance_cooldown_ms: 5000, default_weight: 1 }
    }
}

impl TenancyConfig {
    pub fn validate(&self) -> Result<(), String> {
        if !(self.demand_smoothing > 0.0 && self.demand_smoothing <= 1.0) {
            return Err(format!("tenancy.demand_smoothing = {} must be in (0, 1]", self.demand_smoothing));
        }
        if !(0.0..=10.0).contains(&self.rebalance_threshold) {
            return Err(format!("tenancy.rebalance_threshold = {} must be within 0..=10", self.rebalance_threshold));
        }
        if self.rebalance_cooldown_ms > 3_600_000 {
            return Err(format!("tenancy.rebalance_cooldown_ms = {} exceeds one hour", self.rebalance_cooldown_ms));
        }
        if !(1..=10_000).contains(&self.default_weight) {
            return Err(format!("tenancy.default_weight = {} must be within 1..=10000", self.default_weight));
        }
        Ok(())
    }
}

impl Tenants {
    pub fn compile(cfg: &[TenantConfig]) -> Result<Tenants, String> {
        let max = bpf_intf::zernel_consts_ZERNEL_MAX_TENANTS as usize;
        if cfg.len() > max {
            return Err(format!("tenants: {} tenants configured, at most {max}", cfg.len()));
        }
        let mut t = Tenants::default();
        for (i, c) in cfg.iter().enumerate() {
            if c.name.is_empty() || t.names.contains(&c.name) {
                return Err(format!("tenants[{i}].name = {:?}: must be non-empty and unique", c.name));
            }
            if !c.cgroup.starts_with('/') || c.cgroup.contains("..") {
                return Err(format!("tenants[{i}].cgroup = {:?}: must be an absolute cgroup path", c.cgroup));
            }
            if let Some(share) = c.share() {
                if !(1..=10_000).contains(&share) {
                    let key = if c.weight.is_some() { "weight" } else { "gpus" };
                    return Err(format!("tenants[{i}].{key} = {share}: must be within 1..=10000"));
                }
            }
            t.names.push(c.name.clone());
            t.paths.push(c.path());
            t.fixed.push(c.share());
            // Measured tenants start at one GPU until the first rebalance.
            t.weights.push(u64::from(c.share().unwrap_or(1)) * UNIT);
            t.demand.push(1.0);
        }
        Ok(t)
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    pub fn name(&self, i: usize) -> &str {
        &self.names[i]
    }

    /// BPF weights, by tenant index.
    pub fn weights(&self) -> &[u64] {
        &self.weights
    }

    /// Sets the default share's weight (`tenancy.default_weight`).
    pub fn with_default_weight(mut self, weight: u32) -> Self {
        self.default_weight = u64::from(weight) * UNIT;
        self
    }

    /// BPF weight of the default share (index `len()` in the kernel).
    pub fn default_weight(&self) -> u64 {
        if self.default_weight == 0 {
            UNIT
        } else {
            self.default_weight
        }
    }

    /// Feeds one sample of the GPUs each tenant's processes use (by tenant
    /// index) at `now`; returns true when the weights in force changed.
    pub fn rebalance(&mut self, gpus_in_use: &[usize], cfg: &TenancyConfig, now: Instant) -> bool {
        let a = cfg.demand_smoothing;
        let mut moved = false;
        for i in 0..self.names.len() {
            if self.fixed[i].is_some() {
                continue;
            }
            let sample = gpus_in_use.get(i).copied().unwrap_or(0).max(1) as f64;
            self.demand[i] = a * sample + (1.0 - a) * self.demand[i];
            let target = self.demand[i] * UNIT as f64;
            let current = self.weights[i] as f64;
            moved |= (target - current).abs() > cfg.rebalance_threshold * current;
        }
        let cooled =
            self.last_change.is_none_or(|t| now.duration_since(t).as_millis() >= u128::from(cfg.rebalance_cooldown_ms));
        if !moved || !cooled {
            return false;
        }
        for i in 0..self.names.len() {
            if self.fixed[i].is_none() {
                self.weights[i] = (self.demand[i] * UNIT as f64).round().max(1.0) as u64;
            }
        }
        self.last_change = Some(now);
        true
    }

    /// Does any tenant take its weight from measured GPUs?
    pub fn measured(&self) -> bool {
        self.fixed.iter().any(Option::is_none)
    }

    /// The tenant whose subtree holds `cgroup` (deepest match wins).
    pub fn of_cgroup(&self, cgroup: &str) -> Option<usize> {
        self.paths
            .iter()
            .enumerate()
            .filter(|(_, p)| {
                p.as_str() == "/"
                    || cgroup == p.as_str()
                    || (cgroup.starts_with(p.as_str()) && cgroup.as_bytes().get(p.len()) == Some(&b'/'))
            })
            .max_by_key(|(_, p)| p.len())
            .map(|(i, _)| i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(name: &str, cgroup: &str, gpus: u32, weight: Option<u32>) -> TenantConfig {
        TenantConfig { name: name.into(), cgroup: cgroup.into(), gpus: Some(gpus), weight }
    }

    #[test]
    fn shares_follow_gpus_unless_weighted() {
        let ts = Tenants::compile(&[t("a", "/a", 3, None), t("b", "/sys/fs/cgroup/b/", 8, Some(1))]).unwrap();
        assert_eq!(ts.weights(), &[3 * 1024, 1024]);
        assert_eq!(ts.of_cgroup("/a"), Some(0));
        assert_eq!(ts.of_cgroup("/a/job-1/worker"), Some(0));
        assert_eq!(ts.of_cgroup("/ab"), None);
        assert_eq!(ts.of_cgroup("/b"), Some(1));
        assert_eq!(ts.of_cgroup("/"), None);
    }

    #[test]
    fn deepest_subtree_wins() {
        let ts = Tenants::compile(&[t("all", "/train", 1, None), t("vip", "/train/vip", 1, None)]).unwrap();
        assert_eq!(ts.of_cgroup("/train/vip/x"), Some(1));
        assert_eq!(ts.of_cgroup("/train/y"), Some(0));
    }

    #[test]
    fn measured_gpus_rebalance_with_smoothing_threshold_and_cooldown() {
        let auto = TenantConfig { name: "auto".into(), cgroup: "/auto".into(), gpus: None, weight: None };
        let mut ts = Tenants::compile(&[t("fixed", "/f", 2, None), auto]).unwrap();
        assert!(ts.measured());
        let cfg = TenancyConfig {
            demand_smoothing: 0.5,
            rebalance_threshold: 0.2,
            rebalance_cooldown_ms: 1000,
            default_weight: 1,
        };
        let t0 = Instant::now();
        let ms = |n| t0 + std::time::Duration::from_millis(n);
        // One GPU, as assumed at start: nothing moves.
        assert!(!ts.rebalance(&[0, 1], &cfg, ms(0)));
        // Four GPUs: the EWMA gives 2.5, past the threshold: re-weight.
        assert!(ts.rebalance(&[0, 4], &cfg, ms(100)));
        assert_eq!(ts.weights(), &[2 * 1024, 2560]);
        // Within the cooldown nothing changes although the demand grows.
        assert!(!ts.rebalance(&[0, 4], &cfg, ms(600)));
        assert_eq!(ts.weights()[1], 2560);
        // After it, the smoothed 3.625 is applied; the fixed tenant never moves.
        assert!(ts.rebalance(&[9, 4], &cfg, ms(1200)));
        assert_eq!(ts.weights(), &[2 * 1024, 3712]);
        // Small moves (below 20%) are ignored.
        assert!(!ts.rebalance(&[0, 4], &cfg, ms(5000)));
    }

    #[test]
    fn bad_tenants_name_the_key() {
        let e = Tenants::compile(&[t("a", "a", 1, None)]).unwrap_err();
        assert!(e.starts_with("tenants[0].cgroup"), "{e}");
        let e = Tenants::compile(&[t("a", "/a", 0, None)]).unwrap_err();
        assert!(e.starts_with("tenants[0].gpus = 0"), "{e}");
        let e = Tenants::compile(&[t("a", "/a", 1, None), t("a", "/b", 1, None)]).unwrap_err();
        assert!(e.starts_with("tenants[1].name"), "{e}");
        let many: Vec<_> = (0..17).map(|i| t(&format!("t{i}"), &format!("/t{i}"), 1, None)).collect();
        assert!(Tenants::compile(&many).unwrap_err().contains("at most 16"));
        let bad = TenancyConfig { default_weight: 0, ..TenancyConfig::default() };
        assert!(bad.validate().unwrap_err().starts_with("tenancy.default_weight = 0"));
    }

    #[test]
    fn default_share_weight() {
        let ts = Tenants::compile(&[t("a", "/a", 3, None)]).unwrap();
        assert_eq!(ts.default_weight(), 1024);
        assert_eq!(ts.with_default_weight(2).default_weight(), 2048);
    }
}
