use std::time::Duration;

use super::*;
use crate::config::Config;
use crate::observe::fixture::{hog_and_web, TempDir};
use crate::pipeline::Pipeline;
use crate::topology::Topology;

/// CPU time of the calling thread: what a budget bounds, whatever the
/// machine's load does to the wall clock.
pub(super) fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec we pass.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn facts<'a>(tid: i32, comm: &'a str) -> ThreadFacts<'a> {
    ThreadFacts {
        pid: tid,
        tid,
        start_ticks: 7,
        comm,
        cmdline: "python train.py --rank 0",
        cgroup: "/train/job1",
        parent_comm: "bash",
        uid: 1000,
        gid: 1000,
        ml: true,
        evidence: MlEvidence::ENV_RANK,
        rank: Some(3),
        local_rank: Some(1),
        world_size: Some(8),
        role: ThreadRole::Trainer,
        phase: Phase::GpuCompute,
        gpus: &[0, 1],
        node: Some(1),
        tenant: Some("gpu-team"),
    }
}

fn builtin() -> Option<Decision> {
    Some(Decision { class: Class::Latency, slice_ns: 1_000_000, cpu: -1, node: 1, tenant: 0, preempt: true })
}

fn load(text: &str) -> Result<Script, String> {
    Script::load(Path::new("/etc/p.lua"), text, &["gpu-team", "web"], Class::Normal)
}

fn call(text: &str) -> (Verdict, ScriptStats) {
    let mut s = load(text).unwrap();
    let v = s.call(&facts(10, "python"), builtin());
    if let Some(e) = s.last_error() {
        println!("{e}");
    }
    (v, s.stats())
}

#[test]
fn the_facts_reach_the_script_and_its_table_replaces_fields() {
    let (v, _) = call(
        r#"
        function decide(t)
          assert(t.pid == 10 and t.tid == 10 and t.comm == "python" and t.uid == 1000 and t.gid == 1000)
          assert(t.cmdline:find("--rank 0") and t.cgroup == "/train/job1" and t.parent_comm == "bash")
          assert(t.ml == true and t.evidence[1] == "env_rank" and t.rank == 3 and t.local_rank == 1 and t.world_size == 8)
          assert(t.role == "trainer" and t.phase == "gpu_compute" and t.gpus[1] == 0 and t.gpus[2] == 1 and #t.gpus == 2)
          assert(t.node == 1 and t.tenant == "gpu-team")
          local b = t.builtin
          assert(b.class == "latency" and b.slice_us == 1000 and b.preempt == true and b.cpu == -1 and b.node == 1 and b.tenant == "gpu-team")
          return { class = "batch", slice_us = 20000, tenant = "web", cpu = 3 }
        end
        "#,
    );
    let want = Decision { class: Class::Batch, slice_ns: 20_000_000, cpu: 3, node: 1, tenant: 1, preempt: true };
    assert_eq!(v, Verdict::Set(Some(want)));
    // nil keeps, false removes; a table without a built-in decision starts from the default class.
    assert_eq!(call("function decide(t) return nil end").0, Verdict::Keep);
    assert_eq!(call("function decide(t) return false end").0, Verdict::Set(None));
    let mut s = load("function decide(t) return { preempt = true } end").unwrap();
    let v = s.call(&facts(1, "x"), None);
    let want = Decision { class: Class::Normal, slice_ns: 0, cpu: -1, node: -1, tenant: -1, preempt: true };
    assert_eq!(v, Verdict::Set(Some(want)));
    assert_eq!(Verdict::Keep.apply(builtin()), builtin());
    assert_eq!(Verdict::Failed(Failure::Error).apply(builtin()), builtin());
}

#[test]
fn the_sandbox_has_no_io_os_require_or_loaders() {
    for name in [
        "io",
        "os",
        "require",
        "package",
        "debug",
        "load",
        "loadfile",
        "dofile",
        "print",
        "collectgarbage",
        "pcall",
        "xpcall",
        "coroutine",
        "string.dump",
    ] {
        let text = format!("function decide(t) if {name} ~= nil then return {{ class = \"batch\" }} end end");
        assert_eq!(call(&text).0, Verdict::Keep, "{name} is reachable");
    }
    // What is there works.
    let (v, _) = call(
        r#"function decide(t) return { slice_us = math.max(100, #string.rep("x", 3) * 100) + #table.concat({"a"}) - 1 } end"#,
    );
    assert!(matches!(v, Verdict::Set(Some(d)) if d.slice_ns == 300_000), "{v:?}");
    // Reaching for io is an error, kept as the built-in decision.
    let (v, st) = call(r#"function decide(t) return io.open("/etc/passwd") end"#);
    assert_eq!((v, st.errors), (Verdict::Failed(Failure::Error), 1));
    // Finalizers (which run outside the budget) are refused.
    let (v, _) = call("function decide(t) setmetatable({}, { __gc = function() end }) end");
    assert_eq!(v, Verdict::Failed(Failure::Error));
    assert_eq!(call("function decide(t) setmetatable({}, { __index = {} }) end").0, Verdict::Keep);
}

#[test]
fn an_endless_loop_runs_out_of_the_budget_and_keeps_the_builtin_decision() {
    // Other threads take a few thousand instructions: more than one hook tick.
    let mut s = load(
        "function decide(t) if t.comm == 'spin' then while true do end end local n = 0 for i = 1, 2000 do n = n + i end return { class = 'batch' } end",
    )
    .unwrap();
    let t0 = thread_cpu_time();
    let d = s.decide(&facts(10, "spin"), builtin());
    let took = thread_cpu_time() - t0;
    assert!(took < Duration::from_secs(2), "the budget took {took:?} of CPU");
    assert_eq!(d, builtin());
    assert_eq!(s.verdict(10), Some(Verdict::Failed(Failure::Budget)));
    assert_eq!(s.stats(), ScriptStats { calls: 1, errors: 1, budget_exceeded: 1 });
    assert_eq!(s.logged, 1);
    // The next call has a budget of its own.
    assert_eq!(s.decide(&facts(11, "other"), builtin()).map(|d| d.class), Some(Class::Batch), "{:?}", s.last_error());
    // An endless loop at the top level does not load.
    let e = load("while true do end\nfunction decide(t) end").err().unwrap();
    assert!(e.starts_with("/etc/p.lua: its top level ran out of the instruction budget"), "{e}");
}

#[test]
fn a_backtracking_pattern_runs_out_of_the_budget_and_keeps_the_builtin_decision() {
    // One C call of Lua's own string.find takes over a second on this
    // (found nothing, no error); the metered one stops at the budget.
    let mut s = load(
        "function decide(t) if t.comm == 'bt' then return { class = string.rep('a', 300):find('.-.-.-b') and 'batch' or 'latency' } end return { class = 'batch' } end",
    )
    .unwrap();
    // Unmetered, the find returns nil and the class is latency; metered,
    // the budget stops it (how soon: pattern.rs's test).
    assert_eq!(s.decide(&facts(10, "bt"), builtin()), builtin());
    assert_eq!(s.verdict(10), Some(Verdict::Failed(Failure::Budget)));
    assert_eq!(s.stats(), ScriptStats { calls: 1, errors: 1, budget_exceeded: 1 });
    // Patterns of an ordinary policy cost little of it.
    let (v, st) = call(
        "function decide(t) for i = 1, 200 do if not ('python train.py --rank=3 --epochs=90'):match('%-%-rank=(%d+)') then error('no rank') end end return { class = 'ml' } end",
    );
    assert_eq!((v.as_str(), st.errors), ("set", 0));
}

#[test]
fn the_memory_cap_stops_a_greedy_call() {
    let (v, st) = call("function decide(t) local s = 'x' for i = 1, 40 do s = s .. s end return { slice_us = #s } end");
    assert_eq!((v, st.errors, st.budget_exceeded), (Verdict::Failed(Failure::Error), 1, 0));
    let mut s =
        load("big = {} function decide(t) for i = 1, 2000 do big[#big + 1] = string.rep('y', 10000) .. i end end")
            .unwrap();
    assert_eq!(s.call(&facts(1, "a"), None), Verdict::Failed(Failure::Error));
    assert!(s.lua.used_memory() <= MEMORY_LIMIT);
}

#[test]
fn errors_and_bad_returns_keep_the_builtin_decision_are_counted_and_logged_once() {
    for text in [
        "function decide(t) error('boom') end",
        "function decide(t) return 3 end",
        "function decide(t) return { class = 'fast' } end",
        "function decide(t) return { slice_us = 10 } end",
        "function decide(t) return { cpu = 5000 } end",
        "function decide(t) return { tenant = 'nobody' } end",
        "function decide(t) return { colour = 'red' } end",
        "function decide(t) return { preempt = 1 } end",
    ] {
        let mut s = load(text).unwrap();
        assert_eq!(s.decide(&facts(1, "a"), builtin()), builtin(), "{text}");
        assert_eq!(s.logged, 1, "{text}");
        assert_eq!(s.decide(&facts(2, "b"), builtin()), builtin(), "{text}");
        assert_eq!(s.logged, 1, "logged twice: {text}");
        assert_eq!(s.stats(), ScriptStats { calls: 2, errors: 2, budget_exceeded: 0 }, "{text}");
    }
}

#[test]
fn a_script_that_does_not_load_is_an_error_with_its_line() {
    let e = load("function decide(t)\n  local x = 1\n  return {class = \n end end\n").err().unwrap();
    assert!(e.starts_with("/etc/p.lua:4:"), "{e}");
    assert!(!e.contains('\n'), "{e}");
    let e = load("x = 1\nlocal y = nil + 1\nfunction decide(t) end\n").err().unwrap();
    assert!(e.starts_with("/etc/p.lua:2:"), "{e}");
    assert!(!e.contains('\n'), "{e}");
    let e = load("function decid(t) end").err().unwrap();
    assert_eq!(e, "/etc/p.lua: defines no function decide(t)");
    let e = load("os.exit(1)\nfunction decide(t) end").err().unwrap();
    assert!(e.starts_with("/etc/p.lua:1:"), "{e}");
    let e = Script::open(Path::new("/nonexistent/p.lua"), &[], Class::Normal).err().unwrap();
    assert!(e.starts_with("/nonexistent/p.lua: cannot read policy script"), "{e}");
}

#[test]
fn the_script_runs_again_only_when_a_threads_facts_change() {
    let mut s = load("calls = 0\nfunction decide(t) calls = calls + 1 return { class = 'batch' } end").unwrap();
    let lua_calls = |s: &Script| s.lua.globals().get::<i64>("calls").unwrap();
    let f = facts(10, "python");
    s.begin_pass();
    assert_eq!(s.decide(&f, builtin()).map(|d| d.class), Some(Class::Batch));
    s.end_pass();
    // Same facts: cached.
    s.begin_pass();
    assert_eq!(s.decide(&f, builtin()).map(|d| d.class), Some(Class::Batch));
    s.end_pass();
    assert_eq!((lua_calls(&s), s.stats().calls), (1, 1));
    // A phase change, a rename, a cgroup move, another built-in decision: called again.
    let changed = [
        ThreadFacts { phase: Phase::DataLoading, ..f },
        ThreadFacts { comm: "renamed", ..f },
        ThreadFacts { cgroup: "/other", ..f },
        ThreadFacts { cmdline: "python serve.py", ..f },
        ThreadFacts { start_ticks: 8, ..f },
    ];
    for (i, g) in changed.iter().enumerate() {
        s.begin_pass();
        s.decide(g, builtin());
        s.end_pass();
        assert_eq!(lua_calls(&s), 2 + i as i64, "{g:?}");
    }
    s.begin_pass();
    s.decide(&changed[4], None);
    s.end_pass();
    assert_eq!(lua_calls(&s), 7);
    // A thread not seen in a pass is forgotten.
    s.begin_pass();
    s.end_pass();
    assert_eq!(s.verdict(10), None);
}

fn classes(p: &Pipeline) -> Vec<(u32, Class)> {
    let mut v: Vec<(u32, Class)> = p.decisions().map(|(tid, _, d)| (tid, d.class)).collect();
    v.sort();
    v
}

#[test]
fn the_pipeline_runs_the_script_for_changed_threads_and_reloads_it() {
    let dir = TempDir::new("policy-script");
    let proc_root = dir.path().join("proc");
    std::fs::create_dir(&proc_root).unwrap();
    hog_and_web(&proc_root);
    let script = dir.path().join("policy.lua");
    let v1 = "function decide(t)\n if t.comm:find('^hog') then return { class = 'batch' } end\n if t.comm == 'web' then return { class = 'latency' } end\nend\n";
    std::fs::write(&script, v1).unwrap();
    let mut cfg = Config::default();
    cfg.observe.proc_root = proc_root.display().to_string();
    cfg.policy.script = script.display().to_string();
    let mut p = Pipeline::new(cfg.clone(), Topology::default()).unwrap();
    p.pass();
    assert_eq!(classes(&p), vec![(100, Class::Batch), (101, Class::Batch), (200, Class::Latency)]);
    assert_eq!(p.script_verdict(200).map(Verdict::as_str), Some("set"));
    let calls = |p: &Pipeline| {
        let mut m = crate::stats::Metrics::default();
        p.fill_metrics(&mut m);
        m.script_calls
    };
    assert_eq!(calls(&p), 3);
    p.pass();
    assert_eq!(calls(&p), 3, "a second pass with the same facts called the script");

    // An edited script: new verdicts.
    std::fs::write(
        &script,
        "function decide(t)\n if t.comm == 'web' then return { class = 'batch' } end\n return false\nend\n",
    )
    .unwrap();
    p.reconfigure(cfg.clone()).unwrap();
    p.pass();
    assert_eq!(classes(&p), vec![(200, Class::Batch)]);
    assert_eq!(calls(&p), 6, "the counters are cumulative over reloads");

    // A broken edit: rejected with its line, the running script stays.
    std::fs::write(&script, "function decide(t)\n return {class = \n").unwrap();
    let e = format!("{:#}", p.reconfigure(cfg.clone()).unwrap_err());
    assert!(e.starts_with(&format!("{}:3:", script.display())), "{e}");
    p.pass();
    assert_eq!(classes(&p), vec![(200, Class::Batch)]);
    // And at start, the daemon does not start.
    let e = format!("{:#}", Pipeline::new(cfg, Topology::default()).err().unwrap());
    assert!(e.starts_with(&format!("{}:3:", script.display())), "{e}");
}
