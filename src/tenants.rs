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
//! Latency-critical threads of a tenant (kernel launchers, NCCL) keep
//! their class and are not charged to a tenant queue: they run first.
//! Tenant queues are served after the ml and normal queues of tasks that
//! belong to no tenant (system services: light, and they must stay
//! responsive) and before the batch queue.

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
    /// (Zernel's model). Default 1.
    #[serde(default = "one")]
    pub gpus: u32,
    /// An explicit weight instead of the GPU count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
}

fn one() -> u32 {
    1
}

const CGROUP_MOUNT: &str = "/sys/fs/cgroup";

impl TenantConfig {
    /// The cgroup path as /proc/<pid>/cgroup shows it ("/team-a").
    fn path(&self) -> String {
        let p = self.cgroup.strip_prefix(CGROUP_MOUNT).unwrap_or(&self.cgroup);
        let p = p.trim_end_matches('/');
        if p.is_empty() { "/".into() } else { p.into() }
    }

    /// Relative CPU share.
    pub fn share(&self) -> u32 {
        self.weight.unwrap_or(self.gpus)
    }
}

/// The configured tenants, in file order (index = BPF tenant id).
#[derive(Debug, Default, Clone)]
pub struct Tenants {
    names: Vec<String>,
    paths: Vec<String>,
    weights: Vec<u64>,
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
            if !(1..=10_000).contains(&c.share()) {
                let key = if c.weight.is_some() { "weight" } else { "gpus" };
                return Err(format!("tenants[{i}].{key} = {}: must be within 1..=10000", c.share()));
            }
            t.names.push(c.name.clone());
            t.paths.push(c.path());
            t.weights.push(u64::from(c.share()) * u64::from(bpf_intf::zernel_consts_ZERNEL_WEIGHT_UNIT));
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
        TenantConfig { name: name.into(), cgroup: cgroup.into(), gpus, weight }
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
    fn bad_tenants_name_the_key() {
        let e = Tenants::compile(&[t("a", "a", 1, None)]).unwrap_err();
        assert!(e.starts_with("tenants[0].cgroup"), "{e}");
        let e = Tenants::compile(&[t("a", "/a", 0, None)]).unwrap_err();
        assert!(e.starts_with("tenants[0].gpus = 0"), "{e}");
        let e = Tenants::compile(&[t("a", "/a", 1, None), t("a", "/b", 1, None)]).unwrap_err();
        assert!(e.starts_with("tenants[1].name"), "{e}");
        let many: Vec<_> = (0..17).map(|i| t(&format!("t{i}"), &format!("/t{i}"), 1, None)).collect();
        assert!(Tenants::compile(&many).unwrap_err().contains("at most 16"));
    }
}
