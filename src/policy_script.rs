//! `[policy] script`: a Lua policy hook, run in the daemon when a thread's
//! facts change, never per scheduling event.
//!
//! ```text
//!   per thread whose facts may have changed (see Pipeline::pass):
//!     facts (pid, tid, comm, cmdline, cgroup, uid, ML evidence, role, phase,
//!            GPUs, node, tenant) + built-in decision ──hash──> fingerprint
//!        │
//!        ├─ same fingerprint as last pass ──> cached verdict          (no Lua)
//!        └─ new or changed ──> decide(t) in the sandbox ──> verdict ──> cache
//!                                  │
//!            nil ─> built-in decision   false ─> no decision (default class)
//!            table ─> built-in decision with the table's fields replaced
//!            error / budget / memory ─> built-in decision, counted, logged once
//!        │
//!        └──> Decisions::diff ──> task_class map (as without a script)
//! ```
//!
//! The script is a Lua 5.4 chunk (mlua, vendored: no system library) that
//! defines a global function `decide(t)`. `t` holds the thread's facts:
//! `pid`, `tid`, `comm`, `cmdline`, `cgroup`, `parent_comm`, `uid`, `gid`,
//! `ml` (boolean), `evidence` (list of names such as "env_rank"), `rank`,
//! `local_rank`, `world_size` (nil when unset), `role` ("trainer",
//! "data_loader", "nccl_progress", "non_ml", ...), `phase` ("gpu_compute",
//! "data_loading", "nccl_collective", "optimizer_step", "unknown"), `gpus` (list
//! of GPU indices), `node` (the GPUs' NUMA node or nil), `tenant` (name or
//! nil) and `builtin`, the decision the daemon would make without the
//! script (a table like the one returned, or nil for none). It returns:
//!
//! | return   | decision |
//! |----------|----------|
//! | nil      | the built-in one |
//! | false    | none: the kernel's default class, no map entry |
//! | a table  | the built-in one (or one in `scheduler.default_class`) with the given fields replaced: `class` ("latency", "ml", "normal", "batch"), `slice_us` (0 = class default), `preempt`, `cpu` and `node` (-1 = none), `tenant` (a `[[tenants]]` name, or "" for none) |
//!
//! The sandbox: only the base functions that cannot reach outside (no
//! `load`, `loadfile`, `dofile`, `require`, `print`, `collectgarbage`,
//! `pcall`/`xpcall`, which would catch the budget's error) and the `string`
//! (without `dump`), `table`, `math` and `utf8` libraries: no `io`, `os`,
//! `package`, `debug` or `coroutine`. `setmetatable` refuses `__gc`
//! metamethods (finalizers run with hooks off, outside the budget). The
//! state's memory is capped at [`MEMORY_LIMIT`]; each call (and the loading
//! of the chunk) may run [`INSTRUCTION_BUDGET`] Lua instructions, counted
//! by a hook every [`HOOK_EVERY`]. The hook does not run inside a C
//! function, so the pattern functions (`find`, `match`, `gmatch`, `gsub`),
//! whose backtracking can take time far beyond their input's size, are
//! replaced by the same matcher written here (pattern.rs), which charges
//! its steps to the same budget; the other library functions do work in
//! proportion to what they return (`string.rep`, `table.concat`), which
//! the memory cap bounds.
//!
//! A failed call (a Lua error, the budget, the memory cap, a returned value
//! that is not a decision) keeps the built-in decision for that thread, is
//! counted ([`ScriptStats`]) and cached like a verdict (the script runs
//! again when the thread's facts change), and is logged once per version of
//! the script. A script that does not load (a syntax error, an error at its
//! top level, no `decide`) is an error naming the file and line: at start
//! the daemon does not start; on reload the reload is rejected and the
//! running script stays.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use mlua::{Function, HookTriggers, Lua, LuaOptions, StdLib, Table, Value, VmState};
use rustc_hash::{FxHashMap, FxHasher};
use tracing::warn;

use crate::class::{Class, SLICE_US_RANGE};
use crate::observe::{MlEvidence, ThreadRole};
use crate::phase::Phase;
use crate::policy::Decision;

/// Bytes the Lua state may hold (chunk, globals, a call's garbage).
pub(crate) const MEMORY_LIMIT: usize = 16 << 20;
/// Lua instructions one call of `decide` (or the loading of the chunk) may run.
pub(crate) const INSTRUCTION_BUDGET: u32 = 1_000_000;
/// The instruction hook runs every this many instructions.
pub(crate) const HOOK_EVERY: u32 = 1000;

/// What the script is told about a thread.
#[derive(Debug, Clone, Copy)]
pub struct ThreadFacts<'a> {
    pub pid: i32,
    pub tid: i32,
    /// Start time (a recycled tid is another thread).
    pub start_ticks: u64,
    pub comm: &'a str,
    pub cmdline: &'a str,
    pub cgroup: &'a str,
    pub parent_comm: &'a str,
    pub uid: u32,
    pub gid: u32,
    pub ml: bool,
    pub evidence: MlEvidence,
    pub rank: Option<u32>,
    pub local_rank: Option<u32>,
    pub world_size: Option<u32>,
    pub role: ThreadRole,
    pub phase: Phase,
    pub gpus: &'a [u32],
    pub node: Option<usize>,
    /// Tenant name.
    pub tenant: Option<&'a str>,
}

impl ThreadFacts<'_> {
    /// A hash of everything the script sees, the built-in decision included:
    /// the script runs again for a thread only when this changes.
    pub fn fingerprint(&self, builtin: &Option<Decision>) -> u64 {
        let mut h = FxHasher::default();
        (self.pid, self.tid, self.start_ticks, self.comm, self.cmdline, self.cgroup, self.parent_comm).hash(&mut h);
        (self.uid, self.gid, self.ml, self.evidence.bits(), self.rank, self.local_rank, self.world_size).hash(&mut h);
        (self.role, self.phase, self.gpus, self.node, self.tenant, builtin).hash(&mut h);
        h.finish()
    }
}

/// Why a call gave no verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// A Lua error, the memory cap, or a returned value that is not a decision.
    Error,
    /// The instruction budget ran out.
    Budget,
}

/// What the script said about a thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// nil: the built-in decision.
    Keep,
    /// A table (Some) or false (None).
    Set(Option<Decision>),
    /// The call failed: the built-in decision.
    Failed(Failure),
}

impl Verdict {
    /// The decision in force given the built-in one.
    pub fn apply(self, builtin: Option<Decision>) -> Option<Decision> {
        match self {
            Verdict::Set(d) => d,
            Verdict::Keep | Verdict::Failed(_) => builtin,
        }
    }

    /// A word for `scx_zernel observe`.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Keep => "keep",
            Verdict::Set(Some(_)) => "set",
            Verdict::Set(None) => "none",
            Verdict::Failed(Failure::Error) => "error",
            Verdict::Failed(Failure::Budget) => "budget",
        }
    }
}

/// Counters since start (cumulative).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScriptStats {
    /// Calls of `decide`.
    pub calls: u64,
    /// Calls that failed (budget included).
    pub errors: u64,
    /// Calls stopped by the instruction budget.
    pub budget_exceeded: u64,
}

impl ScriptStats {
    pub fn add(&mut self, o: &ScriptStats) {
        self.calls += o.calls;
        self.errors += o.errors;
        self.budget_exceeded += o.budget_exceeded;
    }
}

/// The decision as a Lua table (the `builtin` field).
fn decision_table(lua: &Lua, d: &Decision, tenants: &[String]) -> mlua::Result<Table> {
    let t = lua.create_table_with_capacity(0, 6)?;
    t.set("class", d.class.name())?;
    t.set("slice_us", d.slice_ns / 1000)?;
    t.set("preempt", d.preempt)?;
    t.set("cpu", d.cpu)?;
    t.set("node", d.node)?;
    if d.tenant >= 0 {
        t.set("tenant", tenants.get(d.tenant as usize).map(String::as_str))?;
    }
    Ok(t)
}

/// A loaded script: its Lua state, its `decide`, and the verdicts cached per thread.
pub struct Script {
    path: PathBuf,
    text: String,
    tenants: Vec<String>,
    default_class: Class,
    lua: Lua,
    decide: Function,
    /// Hook ticks left in the current call, shared with the pattern functions.
    meter: pattern::Meter,
    /// tid -> (fingerprint, verdict, pass last seen)
    cache: FxHashMap<u32, (u64, Verdict, u64)>,
    pass: u64,
    stats: ScriptStats,
    /// Failures of this version logged: at most one.
    logged: u32,
    /// The message of the last failed call.
    #[cfg(test)]
    last_error: Option<String>,
}

/// The first line of a Lua error, prefixed with the file unless Lua named it.
fn one_line(path: &Path, e: &mlua::Error) -> String {
    let msg = match e {
        mlua::Error::SyntaxError { message, .. } => message.clone(),
        mlua::Error::RuntimeError(m) => m.clone(),
        mlua::Error::CallbackError { cause, .. } => return one_line(path, cause),
        mlua::Error::MemoryError(_) => format!("more than {} MiB of memory", MEMORY_LIMIT >> 20),
        other => other.to_string(),
    };
    let first = msg.lines().next().unwrap_or("").trim().to_string();
    let p = path.display().to_string();
    if first.starts_with(&p) {
        first
    } else {
        format!("{p}: {first}")
    }
}

const SANDBOX_PRELUDE: &str = r#"
for _, name in ipairs({ "load", "loadfile", "dofile", "require", "print", "collectgarbage",
                        "pcall", "xpcall", "warn", "package", "debug", "io", "os", "coroutine" }) do
  _G[name] = nil
end
string.dump = nil
local raw_setmetatable, rawget, type, error = setmetatable, rawget, type, error
setmetatable = function(t, mt)
  if type(mt) == "table" and rawget(mt, "__gc") ~= nil then
    error("__gc metamethods are not allowed in a policy script", 2)
  end
  return raw_setmetatable(t, mt)
end
"#;

impl Script {
    /// Reads and loads the script at `path`. `tenants` are the `[[tenants]]`
    /// names (a decision's `tenant` is one of them); `default_class` is the
    /// class of a decision the script makes for a thread with no built-in one.
    pub fn open(path: &Path, tenants: &[&str], default_class: Class) -> Result<Script, String> {
        let text =
            std::fs::read_to_string(path).map_err(|e| format!("{}: cannot read policy script: {e}", path.display()))?;
        Script::load(path, &text, tenants, default_class)
    }

    /// Loads `text` as the script at `path` (named in errors).
    pub fn load(path: &Path, text: &str, tenants: &[&str], default_class: Class) -> Result<Script, String> {
        let lua = Lua::new_with(StdLib::STRING | StdLib::TABLE | StdLib::MATH | StdLib::UTF8, LuaOptions::default())
            .map_err(|e| format!("{}: cannot create the Lua state: {e}", path.display()))?;
        lua.load(SANDBOX_PRELUDE)
            .set_name("=sandbox")
            .exec()
            .map_err(|e| format!("{}: cannot set up the sandbox: {e}", path.display()))?;
        lua.set_memory_limit(MEMORY_LIMIT).map_err(|e| format!("{}: {e}", path.display()))?;
        let meter = pattern::Meter {
            ticks_left: Arc::new(AtomicU32::new(0)),
            exceeded: Arc::new(AtomicBool::new(false)),
            carry: Arc::new(AtomicU64::new(0)),
            message: Arc::from(format!("instruction budget of {INSTRUCTION_BUDGET} exceeded")),
        };
        pattern::install(&lua, meter.clone())
            .map_err(|e| format!("{}: cannot set up the sandbox: {e}", path.display()))?;
        {
            let (left, exceeded) = (meter.ticks_left.clone(), meter.exceeded.clone());
            lua.set_hook(HookTriggers::new().every_nth_instruction(HOOK_EVERY), move |_, _| {
                // Once out, every later tick fails too.
                if left.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1)).is_err() {
                    exceeded.store(true, Ordering::Relaxed);
                    return Err(mlua::Error::RuntimeError(format!(
                        "instruction budget of {INSTRUCTION_BUDGET} exceeded"
                    )));
                }
                Ok(VmState::Continue)
            })
            .map_err(|e| format!("{}: {e}", path.display()))?;
        }
        let mut s = Script {
            path: path.to_path_buf(),
            text: text.to_string(),
            tenants: tenants.iter().map(|t| t.to_string()).collect(),
            default_class,
            decide: lua.create_function(|_, ()| Ok(())).map_err(|e| e.to_string())?,
            lua,
            meter,
            cache: FxHashMap::default(),
            pass: 0,
            stats: ScriptStats::default(),
            logged: 0,
            #[cfg(test)]
            last_error: None,
        };
        s.arm();
        s.lua.load(text).set_name(format!("@{}", path.display())).exec().map_err(|e| {
            if s.meter.exceeded.load(Ordering::Relaxed) {
                format!("{}: its top level ran out of the instruction budget ({INSTRUCTION_BUDGET})", path.display())
            } else {
                one_line(path, &e)
            }
        })?;
        match s.lua.globals().get::<Value>("decide") {
            Ok(Value::Function(f)) => s.decide = f,
            _ => return Err(format!("{}: defines no function decide(t)", path.display())),
        }
        Ok(s)
    }

    /// Whether `path`/`text` with these tenants is this script (a reload
    /// that leaves it as it is keeps the state and the cached verdicts).
    pub(crate) fn is_same(&self, path: &Path, text: &str, tenants: &[&str], default_class: Class) -> bool {
        self.path == path
            && self.text == text
            && self.tenants.iter().eq(tenants.iter().copied())
            && self.default_class == default_class
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn stats(&self) -> ScriptStats {
        self.stats
    }

    /// Why the last failed call failed.
    #[cfg(test)]
    pub(crate) fn last_error(&self) -> Option<&str> {
        self.last_error.as_deref()
    }

    /// A new budget for the next piece of Lua.
    fn arm(&self) {
        self.meter.ticks_left.store(INSTRUCTION_BUDGET / HOOK_EVERY, Ordering::Relaxed);
        self.meter.exceeded.store(false, Ordering::Relaxed);
        self.meter.carry.store(0, Ordering::Relaxed);
    }

    /// Starts a pass over every thread: the verdicts of threads not decided
    /// again before [`end_pass`](Self::end_pass) are forgotten.
    pub fn begin_pass(&mut self) {
        self.pass += 1;
    }

    /// Forgets the verdicts of threads not decided since [`begin_pass`](Self::begin_pass).
    pub fn end_pass(&mut self) {
        let pass = self.pass;
        self.cache.retain(|_, e| e.2 == pass);
    }

    /// Forgets a thread's verdict (it is gone, or its tid was recycled).
    pub(crate) fn forget(&mut self, tid: u32) {
        self.cache.remove(&tid);
    }

    /// The verdict cached for a thread in the last pass.
    pub fn verdict(&self, tid: u32) -> Option<Verdict> {
        self.cache.get(&tid).map(|e| e.1)
    }

    /// The decision for a thread: the cached verdict if its facts are the
    /// ones it was given for, else the script's new one.
    pub fn decide(&mut self, f: &ThreadFacts, builtin: Option<Decision>) -> Option<Decision> {
        let tid = f.tid as u32;
        let fp = f.fingerprint(&builtin);
        let pass = self.pass;
        if let Some(e) = self.cache.get_mut(&tid) {
            if e.0 == fp {
                e.2 = pass;
                return e.1.apply(builtin);
            }
        }
        let v = self.call(f, builtin);
        self.cache.insert(tid, (fp, v, pass));
        v.apply(builtin)
    }

    /// Runs `decide` once, uncached.
    pub fn call(&mut self, f: &ThreadFacts, builtin: Option<Decision>) -> Verdict {
        self.stats.calls += 1;
        self.arm();
        let r = self
            .facts_table(f, builtin)
            .and_then(|t| self.decide.call::<Value>(t))
            .and_then(|v| self.parse(v, builtin));
        let v = match r {
            Ok(Ok(v)) => return v,
            Ok(Err(msg)) => (Failure::Error, format!("{}: decide returned {msg}", self.path.display())),
            Err(_) if self.meter.exceeded.load(Ordering::Relaxed) => (
                Failure::Budget,
                format!(
                    "{}: decide ran out of the instruction budget ({INSTRUCTION_BUDGET} instructions)",
                    self.path.display()
                ),
            ),
            Err(e) => (Failure::Error, one_line(&self.path, &e)),
        };
        self.stats.errors += 1;
        if v.0 == Failure::Budget {
            self.stats.budget_exceeded += 1;
        }
        if self.logged == 0 {
            self.logged += 1;
            warn!(
                "policy script failed for tid {} ({:?}): {}; the built-in decision is kept (logged once per version of the script, counted in script_errors)",
                f.tid, f.comm, v.1
            );
        }
        #[cfg(test)]
        {
            self.last_error = Some(v.1);
        }
        Verdict::Failed(v.0)
    }

    fn facts_table(&self, f: &ThreadFacts, builtin: Option<Decision>) -> mlua::Result<Table> {
        let lua = &self.lua;
        let t = lua.create_table_with_capacity(0, 22)?;
        t.set("pid", f.pid)?;
        t.set("tid", f.tid)?;
        t.set("comm", f.comm)?;
        t.set("cmdline", f.cmdline)?;
        t.set("cgroup", f.cgroup)?;
        t.set("parent_comm", f.parent_comm)?;
        t.set("uid", f.uid)?;
        t.set("gid", f.gid)?;
        t.set("ml", f.ml)?;
        t.set("evidence", lua.create_sequence_from(f.evidence.names())?)?;
        t.set("rank", f.rank)?;
        t.set("local_rank", f.local_rank)?;
        t.set("world_size", f.world_size)?;
        t.set("role", f.role.as_str())?;
        t.set("phase", f.phase.as_str())?;
        t.set("gpus", lua.create_sequence_from(f.gpus.iter().copied())?)?;
        t.set("node", f.node)?;
        t.set("tenant", f.tenant)?;
        if let Some(d) = &builtin {
            t.set("builtin", decision_table(lua, d, &self.tenants)?)?;
        }
        Ok(t)
    }

    /// The returned value as a verdict; Err(why) for one that is not a decision.
    fn parse(&self, v: Value, builtin: Option<Decision>) -> mlua::Result<Result<Verdict, String>> {
        let t = match v {
            Value::Nil => return Ok(Ok(Verdict::Keep)),
            Value::Boolean(false) => return Ok(Ok(Verdict::Set(None))),
            Value::Table(t) => t,
            other => return Ok(Err(format!("a {} (expected nil, false or a table)", other.type_name()))),
        };
        let mut d = builtin.unwrap_or(Decision {
            class: self.default_class,
            slice_ns: 0,
            cpu: -1,
            node: -1,
            tenant: -1,
            preempt: false,
        });
        for pair in t.pairs::<Value, Value>() {
            let (k, v) = pair?;
            let key = match &k {
                Value::String(s) => s.to_string_lossy(),
                other => return Ok(Err(format!("a table with a {} key", other.type_name()))),
            };
            let int = |v: &Value| match v {
                Value::Integer(i) => Some(*i),
                Value::Number(n) if n.fract() == 0.0 && n.abs() < 1e15 => Some(*n as i64),
                _ => None,
            };
            match key.as_str() {
                "class" => {
                    let name = match &v {
                        Value::String(s) => s.to_string_lossy(),
                        _ => String::new(),
                    };
                    match Class::ALL.iter().find(|c| c.name() == name) {
                        Some(&c) => d.class = c,
                        None => return Ok(Err(format!("class = {name:?}: expected latency, ml, normal or batch"))),
                    }
                }
                "slice_us" => match int(&v) {
                    Some(0) => d.slice_ns = 0,
                    Some(us) if (SLICE_US_RANGE.0 as i64..=SLICE_US_RANGE.1 as i64).contains(&us) => {
                        d.slice_ns = us as u64 * 1000
                    }
                    _ => {
                        return Ok(Err(format!(
                            "slice_us = {}: expected 0 or {}..={}",
                            v.to_string().unwrap_or_default(),
                            SLICE_US_RANGE.0,
                            SLICE_US_RANGE.1
                        )))
                    }
                },
                "preempt" => match v {
                    Value::Boolean(b) => d.preempt = b,
                    _ => return Ok(Err(format!("preempt = a {}: expected a boolean", v.type_name()))),
                },
                "cpu" | "node" => {
                    let max = if key == "cpu" {
                        crate::bpf_intf::zernel_consts_ZERNEL_MAX_CPUS
                    } else {
                        crate::bpf_intf::zernel_consts_ZERNEL_MAX_NODES
                    } as i64;
                    match int(&v) {
                        Some(n) if (-1..max).contains(&n) => {
                            if key == "cpu" {
                                d.cpu = n as i32
                            } else {
                                d.node = n as i32
                            }
                        }
                        _ => {
                            return Ok(Err(format!(
                                "{key} = {}: expected -1..{max}",
                                v.to_string().unwrap_or_default()
                            )))
                        }
                    }
                }
                "tenant" => {
                    let name = match &v {
                        Value::String(s) => s.to_string_lossy(),
                        _ => return Ok(Err(format!("tenant = a {}: expected a tenant name", v.type_name()))),
                    };
                    if name.is_empty() {
                        d.tenant = -1;
                    } else {
                        match self.tenants.iter().position(|t| *t == name) {
                            Some(i) => d.tenant = i as i32,
                            None => return Ok(Err(format!("tenant = {name:?}: no [[tenants]] entry has that name"))),
                        }
                    }
                }
                other => {
                    return Ok(Err(format!(
                        "a table with an unknown key {other:?} (expected class, slice_us, preempt, cpu, node, tenant)"
                    )))
                }
            }
        }
        Ok(Ok(Verdict::Set(Some(d))))
    }
}

/// What a configuration's `script` means for the running one.
pub(crate) enum Reopened {
    /// The same file, text and tenants: the running script (its state and
    /// cached verdicts) stays.
    Same,
    /// Another script, or none (`script = ""`).
    New(Option<Box<Script>>),
}

/// The script a configuration asks for, given the running one. Err (one
/// line, naming the file and line) leaves the caller's script as it is.
pub(crate) fn reopen(
    current: Option<&Script>,
    path: &str,
    tenants: &[&str],
    default_class: Class,
) -> Result<Reopened, String> {
    if path.is_empty() {
        return Ok(if current.is_none() { Reopened::Same } else { Reopened::New(None) });
    }
    let path = Path::new(path);
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("{}: cannot read policy script: {e}", path.display()))?;
    match current {
        Some(s) if s.is_same(path, &text, tenants, default_class) => Ok(Reopened::Same),
        _ => Script::load(path, &text, tenants, default_class).map(|s| Reopened::New(Some(Box::new(s)))),
    }
}

mod pattern;
#[cfg(test)]
mod tests;
