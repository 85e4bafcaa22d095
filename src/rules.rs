//! Declarative rules: patterns on who a thread is, to a class.
//!
//! ```text
//!   [[rules]] (in file order)          thread identity
//!   comm / cmdline / cgroup  (regex)   ── comm, cmdline, cgroup path,
//!   parent_comm (regex), uid, gid          parent comm, uid, gid
//!            │                                   │
//!            └──────── first rule whose every given matcher holds ──> RuleVerdict
//! ```
//!
//! A rule with several matchers needs all of them; the first matching rule
//! wins. Rules are evaluated when a thread appears and again after exec or
//! rename (the observer reports those), never on every pass; the result is
//! cached by the daemon and reaches the kernel through the task_class map.
//! `tenant = NAME` charges the thread to a tenant whatever its cgroup.
//! `ml = true` makes a matching process an ML process, so that its threads'
//! phases are detected inside the class the rule gives.

use regex::Regex;
use serde::{Deserialize, Serialize};

use crate::class::{Class, SLICE_US_RANGE};

/// What a rule says about a thread (its class, slice and CPU; the policy combines it with the phase).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RuleVerdict {
    pub class: Option<Class>,
    pub slice_us: Option<u64>,
    pub cpu: Option<i32>,
}

/// One `[[rules]]` entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RuleConfig {
    /// A label for logs and stats.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Regex on the thread's name (comm, at most 15 characters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comm: Option<String>,
    /// Regex on the process command line, arguments joined by spaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmdline: Option<String>,
    /// Regex on the process's cgroup v2 path (e.g. "^/kubepods/").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    /// Regex on the parent process's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_comm: Option<String>,
    /// Real user id of the process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// Real group id of the process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
    /// Class to give the matching threads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<Class>,
    /// Slice in microseconds (default: the phase's, else the class's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slice_us: Option<u64>,
    /// Preferred CPU of the matching threads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<i32>,
    /// Treat the matching processes as ML processes (phase detection).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ml: bool,
    /// Charge the matching threads to this tenant (a `[[tenants]]` name),
    /// whatever their cgroup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

impl RuleConfig {
    fn compile(&self, tenants: &[&str]) -> Result<Rule, String> {
        let tenant = match &self.tenant {
            None => None,
            Some(t) => Some(
                tenants
                    .iter()
                    .position(|n| n == t)
                    .ok_or_else(|| format!("tenant = {t:?}: no [[tenants]] entry has that name"))?,
            ),
        };
        let re = |key: &str, v: &Option<String>| -> Result<Option<Regex>, String> {
            v.as_deref()
                .map(|p| Regex::new(p).map_err(|e| format!("{key} = {p:?}: {}", e.to_string().replace('\n', " "))))
                .transpose()
        };
        let rule = Rule {
            comm: re("comm", &self.comm)?,
            cmdline: re("cmdline", &self.cmdline)?,
            cgroup: re("cgroup", &self.cgroup)?,
            parent_comm: re("parent_comm", &self.parent_comm)?,
            uid: self.uid,
            gid: self.gid,
            verdict: RuleVerdict { class: self.class, slice_us: self.slice_us, cpu: self.cpu },
            ml: self.ml,
            tenant,
        };
        if rule.comm.is_none()
            && rule.cmdline.is_none()
            && rule.cgroup.is_none()
            && rule.parent_comm.is_none()
            && rule.uid.is_none()
            && rule.gid.is_none()
        {
            return Err("a rule needs at least one of comm, cmdline, cgroup, parent_comm, uid, gid".into());
        }
        if self.class.is_none() && self.slice_us.is_none() && self.cpu.is_none() && !self.ml && self.tenant.is_none() {
            return Err("a rule must set at least one of class, slice_us, cpu, ml, tenant".into());
        }
        if let Some(s) = self.slice_us {
            if !(SLICE_US_RANGE.0..=SLICE_US_RANGE.1).contains(&s) {
                return Err(format!("slice_us = {s} is out of range {}..={}", SLICE_US_RANGE.0, SLICE_US_RANGE.1));
            }
        }
        if let Some(c) = self.cpu {
            if !(0..crate::bpf_intf::zernel_consts_ZERNEL_MAX_CPUS as i32).contains(&c) {
                return Err(format!("cpu = {c} is not a CPU number"));
            }
        }
        Ok(rule)
    }
}

/// Who a thread is, as far as rules can tell.
#[derive(Debug, Clone, Copy)]
pub struct Identity<'a> {
    pub comm: &'a str,
    pub cmdline: &'a str,
    pub cgroup: &'a str,
    pub parent_comm: &'a str,
    pub uid: u32,
    pub gid: u32,
}

#[derive(Debug)]
struct Rule {
    comm: Option<Regex>,
    cmdline: Option<Regex>,
    cgroup: Option<Regex>,
    parent_comm: Option<Regex>,
    uid: Option<u32>,
    gid: Option<u32>,
    verdict: RuleVerdict,
    ml: bool,
    tenant: Option<usize>,
}

impl Rule {
    fn matches(&self, id: &Identity) -> bool {
        let re = |r: &Option<Regex>, s: &str| r.as_ref().is_none_or(|r| r.is_match(s));
        re(&self.comm, id.comm)
            && re(&self.cmdline, id.cmdline)
            && re(&self.cgroup, id.cgroup)
            && re(&self.parent_comm, id.parent_comm)
            && self.uid.is_none_or(|u| u == id.uid)
            && self.gid.is_none_or(|g| g == id.gid)
    }
}

/// What the first matching rule says.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Match {
    /// Index of the rule in the file.
    pub index: usize,
    pub verdict: RuleVerdict,
    pub ml: bool,
    /// Tenant index the rule charges the thread to.
    pub tenant: Option<usize>,
}

/// The compiled rule list.
#[derive(Debug, Default)]
pub struct Rules {
    rules: Vec<Rule>,
}

impl Rules {
    /// Compiles the rules; `tenants` are the `[[tenants]]` names, in order.
    pub fn compile(cfg: &[RuleConfig], tenants: &[&str]) -> Result<Rules, String> {
        let rules = cfg
            .iter()
            .enumerate()
            .map(|(i, r)| r.compile(tenants).map_err(|e| format!("rules[{i}]: {e}")))
            .collect::<Result<_, _>>()?;
        Ok(Rules { rules })
    }

    /// The first rule that matches, if any.
    pub fn first_match(&self, id: &Identity) -> Option<Match> {
        self.rules.iter().position(|r| r.matches(id)).and_then(|i| self.at(i))
    }

    /// What rule `index` says (the Match it gives every thread it matches).
    pub fn at(&self, index: usize) -> Option<Match> {
        self.rules.get(index).map(|r| Match { index, verdict: r.verdict, ml: r.ml, tenant: r.tenant })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id<'a>(comm: &'a str, cmdline: &'a str, cgroup: &'a str, uid: u32) -> Identity<'a> {
        Identity { comm, cmdline, cgroup, parent_comm: "bash", uid, gid: 100 }
    }

    fn rules(toml_text: &str) -> Result<Rules, String> {
        #[derive(Deserialize)]
        struct F {
            rules: Vec<RuleConfig>,
        }
        let f: F = toml::from_str(toml_text).map_err(|e| e.to_string())?;
        Rules::compile(&f.rules, &["gpu-team"])
    }

    #[test]
    fn first_match_wins_and_all_matchers_must_hold() {
        let r = rules(
            r#"
            [[rules]]
            comm = "^hog"
            uid = 1000
            class = "batch"
            [[rules]]
            comm = "^hog"
            class = "normal"
            slice_us = 700
            [[rules]]
            cgroup = "^/train/"
            class = "latency"
            cpu = 2
            ml = true
            "#,
        )
        .unwrap();
        let m = r.first_match(&id("hog1", "", "/", 1000)).unwrap();
        assert_eq!((m.index, m.verdict.class), (0, Some(Class::Batch)));
        let m = r.first_match(&id("hog1", "", "/", 0)).unwrap();
        assert_eq!((m.index, m.verdict.slice_us), (1, Some(700)));
        let m = r.first_match(&id("python", "python t.py", "/train/job1", 0)).unwrap();
        assert_eq!((m.index, m.verdict.cpu, m.ml), (2, Some(2), true));
        assert!(r.first_match(&id("bash", "", "/", 0)).is_none());
    }

    #[test]
    fn bad_rules_are_rejected_with_their_index() {
        let e = rules("[[rules]]\nclass = \"batch\"\n").unwrap_err();
        assert!(e.starts_with("rules[0]: a rule needs"), "{e}");
        let e = rules("[[rules]]\ncomm = \"x\"\n[[rules]]\ncomm = \"(\"\nclass = \"ml\"\n").unwrap_err();
        assert!(e.starts_with("rules[0]: a rule must set"), "{e}");
        let e = rules("[[rules]]\ncomm = \"(\"\nclass = \"ml\"\n").unwrap_err();
        assert!(e.starts_with("rules[0]: comm = \"(\""), "{e}");
        assert!(!e.contains('\n'));
        let e = rules("[[rules]]\ncomm = \"a\"\ncpu = -1\n").unwrap_err();
        assert!(e.contains("cpu = -1"), "{e}");
        let e = rules("[[rules]]\ncomm = \"a\"\ntenant = \"nobody\"\n").unwrap_err();
        assert!(e.starts_with("rules[0]: tenant = \"nobody\""), "{e}");
        let m = rules("[[rules]]\nuid = 7\ntenant = \"gpu-team\"\n").unwrap().first_match(&id("x", "", "/", 7));
        assert_eq!(m.map(|m| m.tenant), Some(Some(0)));
    }
}
