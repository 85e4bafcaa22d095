/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * scx_zernel: the kernel half of an ML-aware scheduler.
 *
 * The daemon decides, per thread, a class, a slice, a preferred CPU/node and
 * whether a wakeup may preempt; it writes that decision into the task_class
 * map. This file applies it:
 *
 *   wakeup ──> zernel_select_cpu: preferred CPU if idle ─> idle CPU on the
 *              preferred node ─> idle CPU near prev (LLC, node, any)
 *              └─ idle CPU found: straight to its local queue
 *   enqueue ─> zernel_enqueue: preempt flag and a CPU running a lower class?
 *              └─ yes: head of that CPU's local queue, current task preempted
 *              └─ a wakeup, no idle CPU, a short queue (or a crowded
 *                 normal one it would head: then only hogs are cut short),
 *                 and its waker's CPU (else its own) runs a hog of its
 *                 class or lower (or a task that ran long enough), or for
 *                 an ML wakee a nearby CPU runs a lower class: head of that
 *                 CPU's local queue, its task preempted (wake_victim)
 *              └─ a normal wakeup, new task or interactive run's slice
 *                 end, of a task that sleeps within a starvation bound,
 *                 none of the above, within the interactive budget: a
 *                 CPU running an ml hog, its task preempted
 *                 (interactive_victim)
 *              └─ else: dsq[node][class], in task vtime order (see
 *                      queue_vtime()); claim and kick an idle CPU, its
 *                      node first (see claim_idle())
 *   slice end ─> zernel_dispatch, before the task is queued again: it
 *              keeps its CPU for another slice if the next task would come
 *              from its own queue and it goes before that queue's head, or
 *              if nothing is queued on its node or waits on a saturated
 *              one (see keep_prev()); else zernel_enqueue again. Alone on
 *              its CPU (SCX_OPS_ENQ_LAST): a task on the wrong node moves
 *              to its node's idle CPU; any other keeps its CPU (local
 *              queue)
 *   preempted inside migrate_disable() ─> zernel_enqueue
 *              (SCX_OPS_ENQ_MIGRATION_DISABLED): its own node's class
 *              queue, never another CPU's local queue
 *   fork/clone ─> zernel_init_task: the child starts with its creator's
 *              decision (class, tenant, node), bounded by decision_ttl,
 *              until the daemon writes its own entry (see inherit())
 *   GPU device open ─> zernel_chrdev_open / zernel_file_open: the process
 *              is marked ML (gpu_procs) and the daemon told (events ring
 *              buffer) (see gpu_open())
 *   process fork, exec, leader exit ─> zernel_proc_{fork,exec,exit}: the
 *              daemon told (events), which finds new work from these
 *              instead of listing /proc (see proc_event())
 *   thread rename, cgroup move ─> zernel_task_rename, zernel_cgroup_attach:
 *              the daemon told (events), which re-reads that name or
 *              cgroup instead of polling them
 *   lookup ─> entry (start time matches) | inherited | GPU-open mark | none
 *   RT task takes a CPU ─> zernel_rt_takes_cpu (sched_switch, 6.19+) or
 *              zernel_cpu_release (older kernels): its local queue goes
 *              back through zernel_enqueue, to run on another CPU
 *   CPU free ─> zernel_dispatch:
 *              1. any queue whose head waited > its bound (oldest first;
 *                 checked every starve_ns / 8, every dispatch while one
 *                 is found)
 *              2. own node's latency queue (above all shares)
 *              3. shares: the share with queued work and the least
 *                 weighted CPU time (vtime += runtime * UNIT / weight);
 *                 inside it, ml > normal > batch
 *                 (at 2 and 3, a task whose slice ended and that is
 *                 still runnable ranks as if it were queued: it keeps the
 *                 CPU unless a higher class, a task ahead of it in its own
 *                 queue, or a share with less vtime waits)
 *              4. other nodes' queues, same order, from nodes with no idle
 *                 CPU (steal: work-conserving, but a node's own idle CPUs
 *                 get its work first)
 *
 * Shares: each tenant (a cgroup the daemon puts its threads in) is one
 * share, and the work of no tenant is one more (the default share, weight
 * [tenancy] default_weight), like the root cgroup beside its children.
 * Latency-critical threads belong to no share: they run first. A tenant has
 * one queue per class (dsq TENANT + tenant * NR + class), so its classes
 * still order its threads; the default share's queues are the node queues.
 * Shares get the CPU in proportion to their weights; a share with nothing
 * queued is skipped, so the others use its share (borrowing), and one that
 * comes back starts at the current virtual time, so it gets its share back
 * at once, with no credit for the time it was idle. With no tenants the
 * default share is the only one and the class order alone decides.
 *
 * Decisions hold while the daemon lives: it writes a heartbeat every pass,
 * and once that is older than decision_ttl_ns every lookup gives the
 * default class (map_expired counts them) until the daemon beats again.
 *
 * A decision is tied to one task's lifetime by its start time: an entry
 * whose start time differs from the task's belongs to a recycled TID and is
 * ignored (and counted as map_stale), not deleted. zernel_exit_task deletes the entry of every exiting task, so the
 * map holds at most one entry per live thread the daemon classified.
 */
#include <scx/common.bpf.h>
#include "intf.h"

char _license[] SEC("license") = "GPL";

UEI_DEFINE(uei);

/* Tunables, set by the daemon before load. */
const volatile u64 class_slice_ns[ZCLASS_NR] = {
	ZERNEL_SLICE_US_LATENCY * 1000ULL,
	ZERNEL_SLICE_US_ML * 1000ULL,
	ZERNEL_SLICE_US_NORMAL * 1000ULL,
	ZERNEL_SLICE_US_BATCH * 1000ULL,
};
const volatile u64 starve_ns = 50000000;
const volatile u64 wake_preempt_ns = 1000000;
const volatile u64 decision_ttl_ns = 5000000000ULL;
const volatile u32 default_class = ZCLASS_NORMAL;
const volatile u32 nr_cpus = 1;
const volatile u32 nr_nodes = 1;
const volatile bool numa_enabled;
const volatile u32 nr_tenants; /* shares 0..nr_tenants-1; nr_tenants = default */
const volatile s32 cpu_node[ZERNEL_MAX_CPUS];
/* The daemon's process (0: none); see lookup_decision(). */
const volatile u32 daemon_tgid;

#define NSEC_PER_TICK (1000000000ULL / ZERNEL_USER_HZ)
/* How many CPUs an ML wakeup looks at for a lower class to cut short. */
#define WAKE_AFIELD_CPUS 16

/* Decisions from user space, keyed by TID. Resized by the daemon. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, ZERNEL_TASK_MAP_DEFAULT);
	__type(key, u32);
	__type(value, struct task_class);
} task_class SEC(".maps");

/*
 * GPU device opens. gpu_majors: character majors the daemon found GPU
 * drivers under in /proc/devices (and 195, NVIDIA's), each with the first
 * minor that counts (DRM: 128, the render nodes). gpu_procs: processes
 * (tgid) that opened one, with the decision their threads get while the
 * map holds none (class ml), until the daemon has judged them (it sets
 * ZFLAG_JUDGED: the mark stays, so that later opens by the same process
 * send no more events). events: one record per process marked, for the
 * daemon.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, u32);
	__type(value, u32);
} gpu_majors SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, u32);
	__type(value, struct task_class);
} gpu_procs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 64 * 1024);
} events SEC(".maps");

/* Counters, summed over CPUs by the daemon. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct zernel_stats);
} stats SEC(".maps");

/*
 * Share weights, written by the daemon: tenants by index, the default share
 * at index nr_tenants (0 = unset: one unit).
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, ZERNEL_MAX_TENANTS + 1);
	__type(key, u32);
	__type(value, u64);
} tenant_weight SEC(".maps");

/*
 * The daemon's heartbeat: bpf_ktime_get_ns() time (CLOCK_MONOTONIC) of its
 * last sign of life, written by the daemon at least every pass.
 */
u64 heartbeat_ns;

/* When zernel_dispatch next peeks the queue heads for starved tasks. */
u64 next_starve_scan;

/*
 * The interactive budget (see interactive_victim()): the CPU time
 * interactive runs used since the current window began, plus what earlier
 * windows used beyond their allowance.
 */
u64 interactive_window_at;
u64 interactive_used_ns;

/* Per-share virtual time (weighted CPU time), and the newest one served. */
u64 share_vtime[ZERNEL_MAX_TENANTS + 1];
u64 vtime_now;

/*
 * Task virtual time clocks, one per class and share (the latency class has
 * no share: row 0): the largest vtime a task of that class and share started
 * running with. See queue_vtime().
 */
#define NR_VCLOCKS  ((ZERNEL_MAX_TENANTS + 2) * ZCLASS_NR)
#define VCLOCK_NONE NR_VCLOCKS
u64 vclock[NR_VCLOCKS];

/*
 * What each task was last queued with (read when it runs and stops), and how
 * long it runs between sleeps.
 */
struct task_ctx {
	u32 class;
	s32 tenant;
	/*
	 * The decision select_cpu looked up for a wakeup it left to enqueue
	 * (no idle CPU): enqueue uses it instead of a second lookup.
	 */
	struct task_class dec;
	u32 dec_state;	  /* enum dec_state */
	u64 started_at;	  /* when it last started running, 0 = not running */
	u64 burst_ns;	  /* CPU time since it last woke */
	u64 avg_burst_ns; /* moving average of burst_ns at each sleep */
	/*
	 * Inherited at creation (zernel_init_task): the creator's decision
	 * (class, tenant, node; class slice, no preferred CPU, no preempt
	 * flag), used while the map holds no entry for this task, until
	 * inh_until (bpf_ktime_get_ns() time; 0 = none inherited).
	 */
	struct task_class inh;
	u64 inh_until;
	u32 enq_undecided; /* enqueues with no decision, until the first with one */
	u32 vclock;	   /* the clock its vtime counts against, VCLOCK_NONE */
	u64 enq_at;	   /* when it last went into a class queue */
	bool forked;	   /* created after attach (init_task with fork) */
	bool decided;	   /* had an enqueue with a decision */
	bool ran;	   /* has run at least once */
	bool interactive; /* runs on a CPU it took as an interactive wakeup */
};

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct task_ctx);
} task_ctxs SEC(".maps");

enum dec_state {
	DEC_NONE = 0, /* nothing carried over: enqueue looks up */
	DEC_HIT,      /* dec holds the decision */
	DEC_MISS,     /* there is no decision (default class) */
};

/*
 * What each CPU runs: a wakeup with the preempt flag picks a CPU running a
 * lower class; any other wakeup one running a hog, or a task that has run
 * for wake_preempt_ns / 4 (wake_victim).
 */
struct cpu_ctx {
	u32 class;
	s32 tenant;
	u64 started_at;	 /* when its task started, 0 = none (or claimed) */
	bool long_burst; /* its task ran >= wake_preempt_ns since it woke,
			  * or does on average between sleeps */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct cpu_ctx);
} cpu_ctxs SEC(".maps");

static __always_inline struct zernel_stats *stats_get(void)
{
	u32 zero = 0;

	return bpf_map_lookup_elem(&stats, &zero);
}

static __always_inline void count_class_event(u32 class, u32 idx)
{
	struct zernel_stats *s = stats_get();

	if (s && class < ZCLASS_NR && idx < ZSTAT_CLASS_NR)
		s->cls[class][idx]++;
}

static __always_inline void count_event_add(u32 idx, u64 n)
{
	struct zernel_stats *s = stats_get();

	if (s && idx < ZGSTAT_NR)
		s->glob[idx] += n;
}

static __always_inline void count_event(u32 idx)
{
	count_event_add(idx, 1);
}

static __always_inline u64 dsq_id(u32 node, u32 class)
{
	return (u64)node * ZCLASS_NR + class;
}

static __always_inline s32 node_of(s32 cpu)
{
	u32 idx = (u32)cpu;

	/* Unsigned and masked: the verifier needs a bounded index. */
	if (idx >= ZERNEL_MAX_CPUS)
		return 0;
	return cpu_node[idx & (ZERNEL_MAX_CPUS - 1)];
}

/*
 * The decision for @p, or NULL when there is none, or when it belongs to an
 * earlier task with the same TID: that one is ignored and counted, never
 * deleted here. Only its writer (the daemon) and exit_task remove entries:
 * a delete here could remove the fresh entry the daemon has just written
 * for the new task in place of the stale one, and the daemon would never
 * know that the thread lost its decision.
 */
/*
 * Is the daemon's heartbeat older than decision_ttl_ns? A hung (or stopped)
 * daemon no longer keeps its decisions up to date: every thread falls back
 * to the default class until it beats again.
 */
static __always_inline bool decisions_expired(void)
{
	return (s64)(bpf_ktime_get_ns() - heartbeat_ns) > (s64)decision_ttl_ns;
}

/* Is @tctx's inherited decision still in force (not past its bound)? */
static __always_inline bool inherit_live(const struct task_ctx *tctx, u64 now)
{
	return tctx->inh_until && (s64)(now - tctx->inh_until) < 0;
}

/*
 * The decision @tctx's task inherited, for a lookup that found no entry:
 * NULL when none, when the daemon is not beating, or past its bound (then
 * it is dropped and counted once as inherit_end).
 */
static struct task_class *inherited(struct task_ctx *tctx)
{
	if (!tctx || !tctx->inh_until || decisions_expired())
		return NULL;
	if (!inherit_live(tctx, bpf_ktime_get_ns())) {
		tctx->inh_until = 0;
		count_event(ZGSTAT_INHERIT_END);
		return NULL;
	}
	count_event(ZGSTAT_INHERIT_HIT);
	return &tctx->inh;
}

/* The start time of @p's process (its main thread), USER_HZ ticks. */
static __always_inline u64 proc_start_ticks(struct task_struct *p)
{
	return BPF_CORE_READ(p, group_leader, start_boottime) / NSEC_PER_TICK;
}

/*
 * The mark of @p's process if it opened a GPU device (and is the process
 * that did: same start time), NULL otherwise or while the daemon is not
 * beating. @count: count the use (gpu_hit).
 */
static struct task_class *gpu_mark(struct task_struct *p, bool count)
{
	struct task_class *g;
	u32 tgid = p->tgid;

	g = bpf_map_lookup_elem(&gpu_procs, &tgid);
	if (!g || (g->flags & ZFLAG_JUDGED) ||
	    g->start_ticks != proc_start_ticks(p) || decisions_expired())
		return NULL;
	if (count) {
		__sync_fetch_and_add(&g->applied, 1);
		count_event(ZGSTAT_GPU_HIT);
	}
	return g;
}

/* No entry for @p: what it inherited, else its process's GPU mark. */
static struct task_class *no_entry(struct task_struct *p, struct task_ctx *tctx)
{
	struct task_class *tc = inherited(tctx);

	return tc ? tc : gpu_mark(p, true);
}

/*
 * The daemon's own threads: the latency class, with no entry. They run in
 * short bursts between sleeps; in a lower class, a node whose CPUs ML jobs
 * keep busy would serve them only at the starvation bound, and the passes
 * that keep the decisions (and the heartbeat) current would fall behind.
 */
struct task_class daemon_dec = {
	.class = ZCLASS_LATENCY,
	.cpu = -1,
	.node = -1,
	.tenant = -1,
};

static struct task_class *lookup_decision(struct task_struct *p,
					  struct task_ctx *tctx)
{
	struct task_class *tc;
	u32 tid = p->pid;

	if (daemon_tgid && p->tgid == daemon_tgid)
		return &daemon_dec;
	tc = bpf_map_lookup_elem(&task_class, &tid);
	if (!tc) {
		count_event(ZGSTAT_MAP_MISS);
		return no_entry(p, tctx);
	}
	if (tc->start_ticks != p->start_boottime / NSEC_PER_TICK) {
		count_event(ZGSTAT_MAP_STALE);
		return no_entry(p, tctx);
	}
	if (decisions_expired()) {
		count_event(ZGSTAT_MAP_EXPIRED);
		return NULL;
	}
	/* The daemon's own decision: what was inherited is refined for good. */
	if (tctx)
		tctx->inh_until = 0;
	__sync_fetch_and_add(&tc->applied, 1);
	count_event(ZGSTAT_MAP_HIT);
	return tc;
}

/*
 * For tasks created since attach: enqueues with no decision until the
 * first with one (counted once, when that comes). With inheritance, a child
 * of a task with a decision has none.
 */
static __always_inline void note_enqueue(struct task_ctx *tctx,
					 const struct task_class *tc)
{
	if (!tctx || !tctx->forked || tctx->decided)
		return;
	if (!tc) {
		tctx->enq_undecided++;
		return;
	}
	tctx->decided = true;
	count_event(ZGSTAT_FIRST_DEC);
	count_event_add(ZGSTAT_ENQ_BEFORE_DEC, tctx->enq_undecided);
}

static __always_inline u32 class_of(const struct task_class *tc)
{
	if (tc && tc->class < ZCLASS_NR)
		return tc->class;
	return default_class < ZCLASS_NR ? default_class : ZCLASS_NORMAL;
}

static __always_inline u64 slice_of(const struct task_class *tc, u32 class)
{
	if (tc && tc->slice_ns)
		return tc->slice_ns;
	if (class < ZCLASS_NR)
		return class_slice_ns[class];
	return SCX_SLICE_DFL;
}

static __always_inline void remember(struct task_ctx *tctx, u32 class,
				     s32 tenant)
{
	if (tctx) {
		tctx->class = class;
		tctx->tenant = tenant;
	}
}

/* The tenant @tc puts its task in, -1 for none. */
static __always_inline s32 tenant_of(const struct task_class *tc, u32 class)
{
	if (!tc || tc->tenant < 0 || tc->tenant >= ZERNEL_MAX_TENANTS ||
	    class == ZCLASS_LATENCY)
		return -1;
	return tc->tenant;
}

static __always_inline u64 weight_of(u32 share)
{
	u64 *w = bpf_map_lookup_elem(&tenant_weight, &share);

	return w && *w ? *w : ZERNEL_WEIGHT_UNIT;
}

/* The share of a task of @class in @tenant; -1 for latency (no share). */
static __always_inline s32 share_of(u32 class, s32 tenant)
{
	if (class == ZCLASS_LATENCY)
		return -1;
	return tenant >= 0 ? tenant : nr_tenants;
}

static __always_inline u64 *share_vt(s32 share)
{
	if (share < 0 || share > ZERNEL_MAX_TENANTS)
		return NULL;
	return &share_vtime[share];
}

/* The queue of @class in @share (the default share: @node's queues). */
static __always_inline u64 share_dsq(u32 share, u32 node, u32 class)
{
	if (share < nr_tenants)
		return ZERNEL_TENANT_DSQ + share * ZCLASS_NR + class;
	return dsq_id(node, class);
}

/* Tasks queued in @share's ml, normal and batch queues (on @node). */
static u64 share_queued(u32 share, u32 node)
{
	u64 n = 0;
	u32 c;

	bpf_for(c, ZCLASS_ML, ZCLASS_NR)
		n += scx_bpf_dsq_nr_queued(share_dsq(share, node, c));
	return n;
}

/*
 * How long the head of a share's queue may wait. Between shares the weights
 * decide; the bound only catches a share whose weight is so small that its
 * tasks would wait for ever: ten times the class bound. With no tenants
 * there is one share and the class bound holds.
 */
static __always_inline u64 share_bound(void)
{
	return nr_tenants ? starve_ns * 10 : starve_ns;
}

/* Claims an idle CPU on @node that @p may use; -1 if none. */
static s32 claim_idle_on(struct task_struct *p, s32 node)
{
	return __COMPAT_scx_bpf_pick_idle_cpu_node(p->cpus_ptr, node,
						   SCX_PICK_IDLE_IN_NODE);
}

static __always_inline const struct cpumask *idle_mask(u32 node)
{
	return numa_enabled ? __COMPAT_scx_bpf_get_idle_cpumask_node(node) :
			      scx_bpf_get_idle_cpumask();
}

/*
 * An idle CPU @p may use, on @node first, without claiming it; -1 if none.
 */
static s32 find_idle(struct task_struct *p, u32 node)
{
	const struct cpumask *idle;
	u32 i, cpu;

	bpf_for(i, 0, nr_nodes) {
		u32 n = (node + i) % nr_nodes;

		idle = idle_mask(n);
		cpu = bpf_cpumask_any_and_distribute(idle, p->cpus_ptr);
		scx_bpf_put_idle_cpumask(idle);
		if (cpu < nr_cpus)
			return cpu;
	}
	return -1;
}

/*
 * Claims an idle CPU @p may use, on @node first; -1 if none. Claimed, so
 * that a wakeup's select_cpu cannot pick the same CPU before it has taken
 * the work it is kicked for: it would put its task in that CPU's local
 * queue, behind the task the CPU then takes from the class queue, while
 * another CPU goes idle.
 */
static s32 claim_idle(struct task_struct *p, u32 node)
{
	u32 i;
	s32 cpu;

	if (!numa_enabled)
		return scx_bpf_pick_idle_cpu(p->cpus_ptr, 0);
	bpf_for(i, 0, nr_nodes) {
		cpu = claim_idle_on(p, (node + i) % nr_nodes);
		if (cpu >= 0)
			return cpu;
	}
	return -1;
}

/*
 * May @p run on some CPU of @node (one this machine has)? A thread whose
 * GPU is on another node than the CPUs it is pinned to (taskset, numactl,
 * an OpenMP pool) must queue where it can run: in its preferred node's
 * queue it would be served only by the starvation bound.
 */
static bool may_run_on_node(struct task_struct *p, s32 node)
{
	u32 cpu;

	if (node < 0 || node >= nr_nodes)
		return false;
	if (p->nr_cpus_allowed >= nr_cpus)
		return true;
	bpf_for(cpu, 0, nr_cpus) {
		if (node_of(cpu) == node &&
		    bpf_cpumask_test_cpu(cpu, p->cpus_ptr))
			return true;
	}
	return false;
}

/* Has @node no idle CPU? Only then may other nodes steal its work early. */
static bool node_saturated(u32 node)
{
	const struct cpumask *idle = idle_mask(node);
	bool empty = bpf_cpumask_empty(idle);

	scx_bpf_put_idle_cpumask(idle);
	return empty;
}

s32 BPF_STRUCT_OPS(zernel_select_cpu, struct task_struct *p, s32 prev_cpu,
		   u64 wake_flags)
{
	struct task_ctx *tctx = bpf_task_storage_get(&task_ctxs, p, 0, 0);
	struct task_class *tc = lookup_decision(p, tctx);
	u32 class = class_of(tc);
	bool is_idle = false;
	s32 cpu = -1;

	/* 1. The preferred CPU, when allowed and idle. */
	if (tc && tc->cpu >= 0 && tc->cpu < nr_cpus &&
	    bpf_cpumask_test_cpu(tc->cpu, p->cpus_ptr) &&
	    scx_bpf_test_and_clear_cpu_idle(tc->cpu)) {
		cpu = tc->cpu;
		count_event(ZGSTAT_PREF_CPU);
		goto direct;
	}

	/* 2. An idle CPU on the preferred node (one this machine has). */
	if (tc && tc->node >= 0 && tc->node < nr_nodes && numa_enabled) {
		cpu = claim_idle_on(p, tc->node);
		if (cpu >= 0) {
			count_event(ZGSTAT_PREF_NODE);
			goto direct;
		}
	}

	/* 3. The kernel's choice near prev_cpu: prev, its LLC, node, any. */
	cpu = scx_bpf_select_cpu_dfl(p, prev_cpu, wake_flags, &is_idle);
	if (!is_idle) {
		/* enqueue follows: hand it the decision. */
		if (tctx) {
			tctx->dec_state = tc ? DEC_HIT : DEC_MISS;
			if (tc)
				tctx->dec = *tc;
		}
		return cpu;
	}
	count_event(node_of(cpu) == node_of(prev_cpu) ? ZGSTAT_IDLE_NEAR :
							ZGSTAT_IDLE_FAR);
direct:
	scx_bpf_dsq_insert(p, SCX_DSQ_LOCAL, slice_of(tc, class), 0);
	count_class_event(class, ZSTAT_ENQUEUED);
	note_enqueue(tctx, tc);
	count_class_event(class, ZSTAT_DIRECT);
	remember(tctx, class, tenant_of(tc, class));
	return cpu;
}

/*
 * A CPU @p may run on whose current task is of a lower class than @class,
 * trying @p's own CPU first; -1 if none.
 */
static s32 find_victim(struct task_struct *p, u32 class)
{
	s32 start = scx_bpf_task_cpu(p);
	u32 i, zero = 0;

	bpf_for(i, 0, nr_cpus) {
		s32 cpu = (start + i) % nr_cpus;
		struct cpu_ctx *cctx;

		if (!bpf_cpumask_test_cpu(cpu, p->cpus_ptr))
			continue;
		cctx = bpf_map_lookup_percpu_elem(&cpu_ctxs, &zero, cpu);
		if (cctx && cctx->class > class)
			return cpu;
	}
	return -1;
}

/*
 * Does @tctx's task run in long bursts (a hog)? It has used wake_preempt_ns
 * since it last woke, or does on average between sleeps. (A wakee's current
 * burst is 0: it closed when the task slept.)
 */
static __always_inline bool runs_long(const struct task_ctx *tctx)
{
	return tctx->avg_burst_ns >= wake_preempt_ns ||
	       tctx->burst_ns >= wake_preempt_ns;
}

/*
 * May a wakeup of @class in @tenant (@hog: its task runs in long bursts) cut
 * @cpu's task short (@hogs_only: only a task that runs in long bursts)? If
 * so and @claim, the CPU is claimed for it (started_at = 0).
 */
static bool claim_victim(struct task_struct *p, s32 cpu, u32 class, s32 tenant,
			 bool hog, u64 now, bool claim, bool hogs_only)
{
	struct cpu_ctx *cctx;
	u32 zero = 0;

	if (cpu < 0 || !bpf_cpumask_test_cpu(cpu, p->cpus_ptr))
		return false;
	cctx = bpf_map_lookup_percpu_elem(&cpu_ctxs, &zero, cpu);
	if (!cctx || !cctx->started_at || cctx->class < class ||
	    (nr_tenants && class != ZCLASS_LATENCY && cctx->tenant != tenant))
		return false;
	if (hog && cctx->class == class && class != ZCLASS_NORMAL)
		return false;
	if (!cctx->long_burst &&
	    (hogs_only ||
	     (s64)(now - cctx->started_at) < (s64)(wake_preempt_ns / 4)))
		return false;
	if (claim)
		cctx->started_at = 0;
	return true;
}

/*
 * Wakeup preemption, EEVDF-like. A task that wakes when no CPU is idle would
 * otherwise wait for some CPU's slice to end (and slices end at scheduler
 * ticks). Instead it takes the CPU its wakeup is handled on (its waker's, or
 * its own for a timer or a remote wakeup), else its own CPU (the one it last
 * ran on, where select_cpu left it), if the task running there is of its
 * class or a lower one and either runs in long bursts (a CPU hog: it has used
 * wake_preempt_ns since it last woke, or does on average) or has run for a
 * quarter of wake_preempt_ns.
 *
 *   wakeup, no idle CPU, fewer tasks queued than CPUs
 *     └─> waker's CPU, else own CPU: class >= its class (> if the wakee is
 *         a latency or ml hog), and a hog or ran >= wake_preempt_ns/4?
 *         └─ yes: head of its local queue, its task preempted; the CPU is
 *                 claimed (started_at = 0) until its next task starts
 *         └─ no, a latency or ml wakee: of the WAKE_AFIELD_CPUS - 1 CPUs
 *                 after its own, the first that runs a lower class, as
 *                 above, on its queue's node, else the first off it (a
 *                 normal wakee with its queue crowded: the first that
 *                 runs a normal or lower hog)
 *         └─ no:  the class queue, like any other task
 *
 * The waker's CPU first: a waker often sleeps right after its wakeup (a
 * worker that posts a request to its dispatcher, then waits for the next),
 * so its CPU is the one about to be free. Taking the wakee's own CPU first
 * cut short a task that still had work there, while the waker's CPU went
 * idle: under schbench (one message thread, two workers, two vCPUs) that
 * cost 10 % of the requests/s. No CPU further afield for the normal class
 * while its queue has room: that made schbench's tail latency worse (an
 * IPI to a busy CPU, where the task would soon have found its own CPU free)
 * and each wakeup dearer. With the queue crowded (may_cut_short()), the
 * wakee would wait out a slice instead, so it looks further for a hog (a
 * timer wakeup is handled on the wakee's own CPU, so only one CPU was
 * tried). On 2 vCPUs, in one boot: schbench's wakeup p99 fell from 719 to
 * 480 us (medians of 9 runs), and cyclictest's threads beside a CPU hog per
 * vCPU and a shell reading /proc waited 441-519 us per wakeup, against
 * 504-524 us with only the waker's and their own CPU (3 runs each).
 *
 * A latency or ml wakee that may take neither looks further, at the
 * WAKE_AFIELD_CPUS - 1 CPUs after its own, for one running a lower class
 * that may be cut short (as the RT class pushes a woken task to a CPU
 * running a lower one). One on the node of its queue (@node: its preferred
 * node, else its own CPU's) goes first, so a thread placed near its GPU or
 * its memory stays there; only when none there may be cut short does it
 * take the first one off that node (counted as wake_afield_far), as a
 * dispatch steals from another node's queue rather than leave a CPU idle.
 * On a machine with one node every CPU is on it. A timer wakeup is handled
 * on the wakee's own CPU: a trainer back from a GPU kernel, whose own CPU
 * runs one of its DataLoader workers, otherwise waited in its queue while a
 * CPU hog ran out its slice on another CPU (the sized pipeline beside 4 hogs
 * on 2 vCPUs: 20 such waits a step).
 *
 * Whatever the wakee's own bursts, with one exception: when only tasks that
 * run in short bursts could preempt, schbench's workers (bursts of over 1 ms
 * under emulation) waited out the slice of whatever ran, and their wakeup
 * p99 was 4.9 times EEVDF's; letting them preempt brought it to EEVDF's. The
 * exception: a wakee that runs in long bursts itself, in the latency or ml
 * class, cuts short only a lower class. Those classes hold ML jobs, and a
 * job must not be ordered against itself: a DataLoader worker, woken for the
 * next batch, takes a CPU hog's CPU, not the CPU of its trainer's forward
 * pass. In the normal class, where tasks with no decision go, it is EEVDF's
 * sharing between sleepers and runners.
 *
 * What bounds it: a preemption needs a wakeup, and a preempted task goes back
 * to its queue without one (where the starvation bound covers it), so it
 * cannot take its CPU back in turn; a task that is not a hog keeps its CPU
 * for wake_preempt_ns / 4 at least; while the wakee's queue holds as many
 * tasks as there are CPUs, only a normal-class wakee that runs in short
 * bursts and would head that queue preempts, and only a hog
 * (may_cut_short()); batch tasks never preempt; with tenants, a task preempts
 * only tasks of its own share (between shares the weights decide). Returns
 * the CPU, -1 if none qualifies.
 */
static s32 wake_victim(struct task_struct *p, struct task_ctx *tctx, u32 class,
		       s32 tenant, s32 node, u64 now, bool hogs_only)
{
	s32 here = bpf_get_smp_processor_id(), own = scx_bpf_task_cpu(p);
	s32 far = -1;
	bool hog = runs_long(tctx);
	u32 i, n;

	if (claim_victim(p, here, class, tenant, hog, now, true, hogs_only))
		return here;
	if (own != here &&
	    claim_victim(p, own, class, tenant, hog, now, true, hogs_only))
		return own;
	if (class > ZCLASS_NORMAL || (class == ZCLASS_NORMAL && !hogs_only))
		return -1;
	/*
	 * Further afield, a lower class only (as a hog: see above; in the
	 * normal class, a hog of it), its queue's node first: the first CPU
	 * off it is only remembered.
	 */
	n = nr_cpus < WAKE_AFIELD_CPUS ? nr_cpus : WAKE_AFIELD_CPUS;
	bpf_for(i, 1, n) {
		s32 cpu = (own + i) % nr_cpus;
		bool near = node_of(cpu) == node;

		if (cpu == here || (!near && far >= 0) ||
		    !claim_victim(p, cpu, class, tenant, true, now, near,
				  hogs_only))
			continue;
		if (!near) {
			far = cpu;
			continue;
		}
		count_event(ZGSTAT_WAKE_AFIELD);
		return cpu;
	}
	if (far >= 0 &&
	    claim_victim(p, far, class, tenant, true, now, true, hogs_only)) {
		count_event(ZGSTAT_WAKE_AFIELD);
		count_event(ZGSTAT_WAKE_AFIELD_FAR);
		return far;
	}
	return -1;
}

/*
 * Interactive wakeups. The class order alone serves a normal-class task
 * beside an ml job that keeps every CPU busy only at the starvation bound:
 * an operator's shell, a monitoring agent, a fork-and-exec chain waits
 * up to starve_ns at each wakeup, and again at each slice end. 40
 * sequential `cat` processes from a shell beside 4 ml CPU hogs on 2 vCPUs
 * took 11-19 s, against 1.0-1.4 s under EEVDF (3.3-3.9 s with this, where
 * the budget below binds: a cat costs 10 ms of CPU under emulation), and a
 * 2 ms sleeper waited 78 ms per timeslice (1.4 ms with this, 0.15 ms under
 * EEVDF; tests/vm/cases/interactive.sh). So a normal-class task that
 * sleeps within a starvation bound of waking (interactive_run()) may, at a
 * wakeup, at its first run after a fork, and at the slice ends of a run it
 * got this way, cut short a CPU running an ml hog (a task in long bursts: a
 * DataLoader worker, never a trainer between GPU kernels) of its own share,
 * as wake_victim() would a hog of its own class:
 *
 *   normal wakeup, new task or slice end of an interactive run; no idle
 *   CPU and no normal or lower victim (wake_victim)
 *     └─> budget left this window? waker's CPU, then own CPU and the
 *         WAKE_AFIELD_CPUS - 1 after it: the first running an ml hog
 *         └─ yes: head of its local queue, the hog preempted; the CPU
 *                 time the task uses until it sleeps is charged
 *         └─ no:  its queue, as before
 *
 * The budget bounds what this costs ML jobs: the time used this way is at
 * most ZERNEL_INTERACTIVE_PCT % of all CPUs' time, over windows of one
 * starvation bound (time used beyond a window's allowance is carried into
 * the next). A normal task that runs a whole bound without sleeping, or
 * does on average, is a hog and takes no CPU this way; the latency class
 * and ml tasks in short bursts are never cut short by it. Off with wakeup
 * preemption (wakeup_preempt_us = 0).
 */
static __always_inline bool interactive_run(const struct task_ctx *tctx,
					    u64 enq_flags, bool was)
{
	if (!tctx || !wake_preempt_ns || tctx->burst_ns >= starve_ns ||
	    tctx->avg_burst_ns >= starve_ns)
		return false;
	return (enq_flags & SCX_ENQ_WAKEUP) || was ||
	       (tctx->forked && !tctx->ran);
}

static bool interactive_budget(u64 now)
{
	u64 allow = starve_ns * nr_cpus * ZERNEL_INTERACTIVE_PCT / 100;

	if ((s64)(now - interactive_window_at) >= (s64)starve_ns) {
		u64 used = interactive_used_ns;

		interactive_used_ns = used > allow ? used - allow : 0;
		interactive_window_at = now;
	}
	return interactive_used_ns < allow;
}

/* Does @cpu (one @p may use) run an ml hog of @tenant's share? Claims it. */
static bool claim_ml_hog(struct task_struct *p, s32 cpu, s32 tenant)
{
	struct cpu_ctx *cctx;
	u32 zero = 0;

	if (cpu < 0 || !bpf_cpumask_test_cpu(cpu, p->cpus_ptr))
		return false;
	cctx = bpf_map_lookup_percpu_elem(&cpu_ctxs, &zero, cpu);
	if (!cctx || !cctx->started_at || cctx->class != ZCLASS_ML ||
	    !cctx->long_burst || (nr_tenants && cctx->tenant != tenant))
		return false;
	cctx->started_at = 0;
	return true;
}

/* The CPU an interactive wakeup of @p takes (see above); -1 if none. */
static s32 interactive_victim(struct task_struct *p, s32 tenant, u64 now)
{
	s32 here = bpf_get_smp_processor_id(), own = scx_bpf_task_cpu(p);
	u32 i, n;

	if (!interactive_budget(now))
		return -1;
	if (claim_ml_hog(p, here, tenant))
		return here;
	n = nr_cpus < WAKE_AFIELD_CPUS ? nr_cpus : WAKE_AFIELD_CPUS;
	bpf_for(i, 0, n) {
		s32 cpu = (own + i) % nr_cpus;

		if (cpu != here && claim_ml_hog(p, cpu, tenant))
			return cpu;
	}
	return -1;
}

/* Does a task with vtime @vt go before @dsq's head (a queued one)? */
static __always_inline bool before_head(u64 dsq, u64 vt)
{
	struct task_struct *head = __COMPAT_scx_bpf_dsq_peek(dsq);

	return head && (s64)(vt - head->scx.dsq_vtime) < 0;
}

/* Would a task with vtime @vt be @dsq's head, were it queued there? */
static __always_inline bool would_head(u64 dsq, u64 vt)
{
	return !scx_bpf_dsq_nr_queued(dsq) || before_head(dsq, vt);
}

/* The clock of @class in @share; NR_VCLOCKS if there is none. */
static __always_inline u32 vclock_of(u32 class, s32 share)
{
	u32 q = (u32)(share + 1) * ZCLASS_NR + class;

	return q < NR_VCLOCKS && class < ZCLASS_NR ? q : NR_VCLOCKS;
}

/* The vtime a task of @class with vtime @vt queues with against clock @q. */
static __always_inline u64 vtime_against(struct task_ctx *tctx, u32 q,
					 u32 class, u64 vt)
{
	u64 clock, floor;

	if (q >= NR_VCLOCKS || class >= ZCLASS_NR)
		return vt;
	clock = vclock[q];
	if (!tctx || tctx->vclock != q)
		return clock;
	floor = clock - class_slice_ns[class];
	return (s64)(vt - floor) < 0 ? floor : vt;
}

/*
 * Task vtime: the order inside a class queue. A task's vtime
 * (p->scx.dsq_vtime) grows by its CPU time, weighted by its nice level
 * (zernel_stopping); the queue serves the least first, so a task that ran
 * less than the others in its queue goes first. Each class and share has a
 * clock, the largest vtime a task of it started running with
 * (zernel_running). A task that slept comes back no further behind its
 * clock than one class slice: the credit of a sleeper, like EEVDF's lag, and
 * what lets a task that sleeps pass CPU hogs, where a FIFO would queue
 * it behind every hog's slice. A task new to a clock (just created, or its
 * class or tenant changed) starts at it: no credit and no debt.
 *
 *   enqueue: vtime = max(own vtime, clock - class slice); new: clock
 *   running: clock = max(clock, vtime)
 *   stopping: vtime += runtime * 100 / weight
 *
 * The starvation bound does not read the vtime: it reads each queue head's
 * enqueue time (enq_at).
 */
static u64 queue_vtime(struct task_struct *p, struct task_ctx *tctx, u32 class,
		       s32 share)
{
	u32 q = vclock_of(class, share);
	u64 vt = vtime_against(tctx, q, class, p->scx.dsq_vtime);

	if (tctx && q < NR_VCLOCKS)
		tctx->vclock = q;
	return vt;
}

/*
 * May the wakeup of @p, bound for queue @dsq (@class, @share), cut a running
 * task short (wake_victim)? Yes while @dsq holds fewer tasks than there are
 * CPUs. A crowded queue is served in order, or the tasks cut short would go
 * behind each new wakee again and again; but a wakee that runs in short
 * bursts and would head it anyway (its vtime, with a sleeper's credit, goes
 * before the head's) is next in that order: in the normal class it may
 * still cut short a task that runs in long bursts (*@hogs_only), and nothing
 * else. Without that, a thread that sleeps and wakes (cyclictest's, beside a
 * CPU hog per vCPU and a shell that reads /proc) lost wakeup preemption
 * whenever two more tasks were runnable: it waited about twice as long per
 * wakeup as under EEVDF. The ML classes keep their crowded queues in order:
 * with the exception there too, a sized pipeline beside hogs (whose queue
 * fills with its own loaders) ran 17 % slower at the median of 4 pairs.
 */
static __always_inline bool may_cut_short(struct task_struct *p,
					  struct task_ctx *tctx, u64 dsq,
					  u32 class, s32 share, bool *hogs_only)
{
	*hogs_only = scx_bpf_dsq_nr_queued(dsq) >= nr_cpus;
	if (!*hogs_only)
		return true;
	/* Crowded, so not empty: its head decides. */
	return class == ZCLASS_NORMAL && !runs_long(tctx) &&
	       before_head(dsq, vtime_against(tctx, vclock_of(class, share),
					      class, p->scx.dsq_vtime));
}

/* What @used ns of CPU time add to @p's vtime: weighted by its nice level. */
static __always_inline u64 task_vtime_of(struct task_struct *p, u64 used)
{
	return used * 100 / (p->scx.weight ?: 100);
}

void BPF_STRUCT_OPS(zernel_enqueue, struct task_struct *p, u64 enq_flags)
{
	struct task_ctx *tctx = bpf_task_storage_get(&task_ctxs, p, 0, 0);
	u64 now = bpf_ktime_get_ns(), slice, dsq;
	struct task_class *tc;
	s32 node, cpu, idle, tenant, share;
	u32 class;
	bool md, hogs_only, was_interactive = false;

	/* A wakeup's decision, looked up by select_cpu; else look it up. */
	if (tctx && tctx->dec_state != DEC_NONE && (enq_flags & SCX_ENQ_WAKEUP))
		tc = tctx->dec_state == DEC_HIT ? &tctx->dec : NULL;
	else
		tc = lookup_decision(p, tctx);
	if (tctx) {
		tctx->dec_state = DEC_NONE;
		/* A run it got as an interactive wakeup ends here. */
		was_interactive = tctx->interactive;
		tctx->interactive = false;
	}
	class = class_of(tc);
	slice = slice_of(tc, class);
	tenant = tenant_of(tc, class);
	remember(tctx, class, tenant);
	count_class_event(class, ZSTAT_ENQUEUED);
	note_enqueue(tctx, tc);
	/*
	 * Preempted inside migrate_disable() (SCX_OPS_ENQ_MIGRATION_DISABLED
	 * sends such tasks here too), @p may run only on its own CPU, though
	 * its cpumask may still show every CPU: no other CPU's local queue
	 * (the kernel would end the scheduler), no preferred node, no idle
	 * CPU to kick. Its own node's class queue keeps it in class order;
	 * other CPUs skip it there.
	 */
	md = is_migration_disabled(p);
	if (md)
		count_event(ZGSTAT_MIGRATION_DISABLED);

	/*
	 * A wakeup preempts a CPU that runs a lower class: no waiting a whole
	 * slice. Only wakeups: a CPU-bound thread at the end of its slice
	 * queues like any other, or spinners with the flag would take every
	 * CPU back from the tasks the starvation bound lets run.
	 */
	if (!md && tc && (tc->flags & ZFLAG_PREEMPT) &&
	    (enq_flags & SCX_ENQ_WAKEUP) && !(enq_flags & SCX_ENQ_REENQ)) {
		cpu = find_victim(p, class);
		if (cpu >= 0) {
			scx_bpf_dsq_insert(p, SCX_DSQ_LOCAL_ON | cpu, slice,
					   enq_flags | SCX_ENQ_PREEMPT);
			count_class_event(class, ZSTAT_PREEMPTED);
			return;
		}
	}

	node = !md && tc && may_run_on_node(p, tc->node) ?
		       tc->node :
		       node_of(scx_bpf_task_cpu(p));

	/*
	 * Slice end with nothing else for this CPU (SCX_ENQ_LAST): keep
	 * running here, unless the task's node is another one and has an idle
	 * CPU the task may use (it moves there). Queued instead, a task pinned
	 * to this CPU would wait with its CPU idle until something kicked it.
	 */
	if (enq_flags & SCX_ENQ_LAST) {
		cpu = scx_bpf_task_cpu(p);
		idle = node != node_of(cpu) ? find_idle(p, node) : -1;
		if (idle < 0 || node_of(idle) != node) {
			scx_bpf_dsq_insert(p, SCX_DSQ_LOCAL, slice, enq_flags);
			count_class_event(class, ZSTAT_DIRECT);
			return;
		}
	}

	share = share_of(class, tenant);
	dsq = share < 0 ? dsq_id(node, class) : share_dsq(share, node, class);
	if (nr_tenants && share >= 0) {
		u64 *vt = share_vt(share);

		/*
		 * Back from idle: no credit for the idle time beyond a lag of
		 * one starvation bound (a share whose queues were empty only
		 * because all its tasks were running keeps its place).
		 */
		if (vt && !share_queued(share, node) &&
		    (s64)(*vt + starve_ns - vtime_now) < 0)
			*vt = vtime_now - starve_ns;
	}

	/*
	 * An idle CPU, the task's node first, claimed (see claim_idle()):
	 * from then on it no longer counts as idle for node_saturated()
	 * either, so another node may steal the task first, which the kicked
	 * CPU then finds gone. None idle: a wakeup may cut the task of its
	 * waker's or its own CPU short (wake_victim), within the bounds of
	 * may_cut_short() when its queue is crowded; failing that, an
	 * interactive one of the normal class an ml hog's CPU, within the
	 * interactive budget (interactive_victim).
	 */
	idle = md ? -1 : claim_idle(p, node);
	if (idle < 0 && wake_preempt_ns && (enq_flags & SCX_ENQ_WAKEUP) &&
	    class < ZCLASS_BATCH && tctx &&
	    may_cut_short(p, tctx, dsq, class, share, &hogs_only)) {
		cpu = wake_victim(p, tctx, class, tenant, node, now, hogs_only);
		if (cpu >= 0) {
			scx_bpf_dsq_insert(p, SCX_DSQ_LOCAL_ON | cpu, slice,
					   enq_flags | SCX_ENQ_PREEMPT);
			count_class_event(class, ZSTAT_WAKE_PREEMPT);
			return;
		}
	}
	if (idle < 0 && class == ZCLASS_NORMAL && !md &&
	    interactive_run(tctx, enq_flags, was_interactive)) {
		cpu = interactive_victim(p, tenant, now);
		if (cpu >= 0) {
			tctx->interactive = true;
			scx_bpf_dsq_insert(p, SCX_DSQ_LOCAL_ON | cpu, slice,
					   enq_flags | SCX_ENQ_PREEMPT);
			count_event(ZGSTAT_INTERACTIVE);
			return;
		}
	}

	if (tctx)
		tctx->enq_at = now;
	scx_bpf_dsq_insert_vtime(p, dsq, slice,
				 queue_vtime(p, tctx, class, share), enq_flags);

	/* Work conservation: wake the idle CPU. */
	if (idle >= 0) {
		scx_bpf_kick_cpu(idle, SCX_KICK_IDLE);
		count_event(ZGSTAT_KICK);
	}
}

/* Moves the head of @dsq to this CPU; counts it for @class. */
static __always_inline bool dispatch_from(u64 dsq, u32 class, u32 stat)
{
	if (!scx_bpf_dsq_move_to_local(dsq, 0))
		return false;
	count_class_event(class, ZSTAT_DISPATCHED);
	if (stat < ZSTAT_CLASS_NR)
		count_class_event(class, stat);
	return true;
}

/*
 * The share with queued work (its queues on @node for the default share)
 * and the least virtual time; -1 if none.
 */
static s32 pick_share(u32 node)
{
	s32 best = -1;
	u64 best_vt = 0;
	u32 sh;

	bpf_for(sh, 0, nr_tenants + 1) {
		u64 *vt = share_vt(sh);

		if (!vt || !share_queued(sh, node))
			continue;
		if (best < 0 || (s64)(*vt - best_vt) < 0) {
			best = sh;
			best_vt = *vt;
		}
	}
	if (best >= 0 && (s64)(best_vt - vtime_now) > 0)
		vtime_now = best_vt;
	return best;
}

/* Moves the head of @share's highest class queue to this CPU. */
static bool dispatch_share(u32 share, u32 node)
{
	u32 c;

	bpf_for(c, ZCLASS_ML, ZCLASS_NR) {
		if (dispatch_from(share_dsq(share, node, c), c,
				  ZSTAT_CLASS_NR)) {
			if (share < nr_tenants)
				count_event(ZGSTAT_TENANT_DISP);
			return true;
		}
	}
	return false;
}

/*
 * Has @dsq's head waited longer than @bound and than *@oldest? Then it is
 * the pick.
 */
static __always_inline bool older(u64 dsq, u64 bound, u64 now, u64 *oldest)
{
	struct task_struct *head = __COMPAT_scx_bpf_dsq_peek(dsq);
	struct task_ctx *tctx;
	u64 waited;

	if (!head)
		return false;
	tctx = bpf_task_storage_get(&task_ctxs, head, 0, 0);
	if (!tctx)
		return false;
	waited = now - tctx->enq_at;
	if ((s64)waited <= (s64)bound || waited <= *oldest)
		return false;
	*oldest = waited;
	return true;
}

/*
 * Slice end of a task that is still runnable. The kernel asks its CPU for
 * the next task before the task goes back to its queue (ops.dispatch comes
 * before ops.stopping and ops.enqueue), so taking the head of the queue
 * unconditionally would take the CPU from a task that ranks ahead of that
 * head in its own queue: with two nice-0 and two nice-10 hogs on two CPUs,
 * a CPU whose nice-0 hog's slice ends while the other runs finds only the
 * nice-10 ones queued, and nice 0 gets 2x the CPU of nice 10, not 9x. So
 * dispatch ranks it as if it were queued (rank_prev) and it keeps its CPU
 * for another slice (keep_prev) if it would be served next (prev_first):
 * no higher class waits, and it goes before its own queue's head (its
 * vtime, this slice charged, is the lower) or that queue is empty. Nothing
 * queued on its node at all: it keeps its CPU too, unless a saturated node
 * has work to steal (step 4 comes first: that work is waiting, the task at
 * its slice end has run).
 *
 * A lower class never takes the CPU at a slice end. Before, a queue emptied
 * by its own task's running looked like a class with nothing to run: an ML
 * thread at the end of its slice gave its CPU to a queued CPU hog of the
 * normal class and waited in its queue for that hog's slice to end, tick
 * after tick (PyTorch inference beside 4 hogs on 2 vCPUs: its two threads
 * waited 160 ms per 290 ms request). Lower classes get the CPU the higher
 * ones leave, and the starvation bound (step 1), which comes first. That
 * bound serves a queue's head, the least vtime: in a class it alone serves,
 * a low-weight task waits until the others' vtime passes its own, several
 * bounds, not one.
 */
struct rank {
	struct task_ctx *tctx;
	u32 class;
	s32 share;
	u64 vt; /* its vtime in its class queue, this slice charged */
};

/*
 * @prev's rank if it is still runnable, may stay on @cpu and was started by
 * this scheduler; false otherwise.
 */
static bool rank_prev(struct task_struct *prev, s32 cpu, u64 now,
		      struct rank *r)
{
	struct task_ctx *tctx;
	u64 used;

	if (!prev || !(prev->scx.flags & SCX_TASK_QUEUED) ||
	    !bpf_cpumask_test_cpu(cpu, prev->cpus_ptr))
		return false;
	tctx = bpf_task_storage_get(&task_ctxs, prev, 0, 0);
	if (!tctx || !tctx->started_at)
		return false;
	used = now - tctx->started_at;
	r->tctx = tctx;
	r->class = tctx->class < ZCLASS_NR ? tctx->class : ZCLASS_NORMAL;
	r->share = share_of(r->class, tctx->tenant);
	r->vt = vtime_against(tctx, vclock_of(r->class, r->share), r->class,
			      prev->scx.dsq_vtime + task_vtime_of(prev, used));
	return true;
}

/*
 * Does a task ranked @r keep its CPU, @sh being the share pick_share()
 * chose on @node (one with queued work)? It ranks as if it were queued:
 *
 *   another share chosen ─> keep if its own share's vtime is the lower
 *                           (then its share has nothing queued, or it
 *                           would have been chosen: the task heads it)
 *   its own share ─> no higher class queued, and it would head its own
 *                    class queue (goes before the head, or that is empty)
 *
 * So a lower class never takes the CPU at a slice end: the starvation bound
 * (step 1) serves it.
 */
static bool prev_first(const struct rank *r, s32 sh, u32 node)
{
	u64 *mine, *chosen;
	u32 c;

	if (r->share != sh) {
		mine = share_vt(r->share);
		chosen = share_vt(sh);
		return mine && chosen && (s64)(*mine - *chosen) < 0;
	}
	bpf_for(c, ZCLASS_ML, ZCLASS_NR) {
		u64 dsq = share_dsq(sh, node, c);

		if (c == r->class)
			return would_head(dsq, r->vt);
		if (scx_bpf_dsq_nr_queued(dsq))
			return false;
	}
	return false;
}

/*
 * Keeps @prev, ranked @r, on its CPU for another slice, if its decision
 * still gives that rank (a new class or tenant takes effect through
 * zernel_enqueue) and names no other node it may run on.
 */
static bool keep_prev(struct task_struct *prev, const struct rank *r, u32 node)
{
	struct task_class *tc = lookup_decision(prev, r->tctx);
	u32 class = class_of(tc);

	if (class != r->class ||
	    share_of(class, tenant_of(tc, class)) != r->share)
		return false;
	if (tc && tc->node != (s32)node && may_run_on_node(prev, tc->node))
		return false;
	prev->scx.slice = slice_of(tc, class);
	count_class_event(class, ZSTAT_KEPT);
	return true;
}

void BPF_STRUCT_OPS(zernel_dispatch, s32 cpu, struct task_struct *prev)
{
	u64 now = bpf_ktime_get_ns(), oldest = 0, starved = 0;
	u32 mynode = node_of(cpu), n, c, t, starved_class = 0;
	bool found = false, ranked;
	struct rank r;
	s32 sh;

	/*
	 * 1. The starvation bound: serve the queue whose head waited longest.
	 * Peeking every queue head costs more than the rest of a dispatch,
	 * so it is done every starve_ns / 8, and at every dispatch while the
	 * last scan found a starved queue (then several CPUs help drain it).
	 */
	if ((s64)(now - next_starve_scan) < 0)
		goto classes;
	bpf_for(t, 0, nr_tenants) {
		bpf_for(c, ZCLASS_ML, ZCLASS_NR) {
			u64 dsq = share_dsq(t, 0, c);

			if (older(dsq, share_bound(), now, &oldest)) {
				starved = dsq;
				starved_class = c;
				found = true;
			}
		}
	}
	bpf_for(n, 0, nr_nodes) {
		bpf_for(c, 0, ZCLASS_NR) {
			u64 bound = c == ZCLASS_LATENCY ? starve_ns :
							  share_bound();

			if (older(dsq_id(n, c), bound, now, &oldest)) {
				starved = dsq_id(n, c);
				starved_class = c;
				found = true;
			}
		}
	}
	if (!found)
		next_starve_scan = now + starve_ns / 8;
	if (found && dispatch_from(starved, starved_class, ZSTAT_STARVED))
		return;

classes:
	/* A task at its slice end keeps its CPU if it heads its own queue. */
	ranked = rank_prev(prev, cpu, now, &r);

	/* 2. This node's latency queue: above all shares. */
	if (ranked && r.class == ZCLASS_LATENCY &&
	    would_head(dsq_id(mynode, ZCLASS_LATENCY), r.vt) &&
	    keep_prev(prev, &r, mynode))
		return;
	if (dispatch_from(dsq_id(mynode, ZCLASS_LATENCY), ZCLASS_LATENCY,
			  ZSTAT_CLASS_NR))
		return;

	/* 3. Shares: the one with queued work and the lowest vtime. */
	sh = pick_share(mynode);
	if (sh >= 0) {
		if (ranked && prev_first(&r, sh, mynode) &&
		    keep_prev(prev, &r, mynode))
			return;
		if (dispatch_share(sh, mynode))
			return;
	}

	/*
	 * 4. Steal from other nodes rather than idle, but only from a node
	 * that has no idle CPU of its own (one of those has been kicked to take
	 * the work); the starvation bound above covers the rest.
	 */
	bpf_for(n, 0, nr_nodes) {
		if (n == mynode || !node_saturated(n))
			continue;
		bpf_for(c, 0, ZCLASS_NR) {
			if (dispatch_from(dsq_id(n, c), c, ZSTAT_CLASS_NR)) {
				count_event(ZGSTAT_STEAL);
				return;
			}
		}
	}

	/* 5. Nothing to run here or to steal: the task keeps its CPU. */
	if (ranked)
		keep_prev(prev, &r, mynode);
}

void BPF_STRUCT_OPS(zernel_running, struct task_struct *p)
{
	struct task_ctx *tctx = bpf_task_storage_get(&task_ctxs, p, 0, 0);
	u64 now = bpf_ktime_get_ns();
	struct cpu_ctx *cctx;
	u32 zero = 0;

	cctx = bpf_map_lookup_elem(&cpu_ctxs, &zero);
	if (cctx) {
		cctx->class = tctx ? tctx->class : default_class;
		cctx->tenant = tctx ? tctx->tenant : -1;
		cctx->long_burst = tctx && runs_long(tctx);
		cctx->started_at = now;
	}
	if (!tctx)
		return;
	tctx->started_at = now;
	tctx->ran = true;
	if (tctx->vclock < NR_VCLOCKS) {
		u64 *clock = &vclock[tctx->vclock];

		if ((s64)(p->scx.dsq_vtime - *clock) > 0)
			*clock = p->scx.dsq_vtime;
	}
}

/*
 * Adds the CPU time @p just used to its burst (closed when it sleeps) and
 * to its vtime (see queue_vtime()), and charges a tenant's task to its
 * tenant.
 */
void BPF_STRUCT_OPS(zernel_stopping, struct task_struct *p, bool runnable)
{
	struct task_ctx *tctx = bpf_task_storage_get(&task_ctxs, p, 0, 0);
	struct zernel_stats *s;
	struct cpu_ctx *cctx;
	u32 t, zero = 0;
	u64 used, *vt;
	s32 sh;

	cctx = bpf_map_lookup_elem(&cpu_ctxs, &zero);
	if (cctx)
		cctx->started_at = 0;
	if (!tctx || !tctx->started_at)
		return;
	used = bpf_ktime_get_ns() - tctx->started_at;
	tctx->started_at = 0;
	tctx->burst_ns += used;
	if (tctx->interactive) {
		__sync_fetch_and_add(&interactive_used_ns, used);
		count_event_add(ZGSTAT_INTERACTIVE_NS, used);
		if (!runnable)
			tctx->interactive = false;
	}
	p->scx.dsq_vtime += task_vtime_of(p, used);
	if (!runnable) {
		tctx->avg_burst_ns =
			(tctx->avg_burst_ns * 3 + tctx->burst_ns) / 4;
		tctx->burst_ns = 0;
	}
	sh = share_of(tctx->class, tctx->tenant);
	vt = share_vt(sh);
	if (!nr_tenants || !vt)
		return;
	__sync_fetch_and_add(vt, used * ZERNEL_WEIGHT_UNIT / weight_of(sh));
	if (tctx->tenant < 0)
		return;
	t = tctx->tenant & (ZERNEL_MAX_TENANTS - 1);
	s = stats_get();
	if (s)
		s->tenant_ns[t] += used;
}

/*
 * A higher sched class (an RT or deadline task) takes a CPU: the tasks in
 * its local queue would wait behind it. Send them back through
 * zernel_enqueue (SCX_ENQ_REENQ), which queues them where another CPU can
 * take them.
 *
 * Kernels 6.19 and later deprecate ops.cpu_release (they warn at every
 * attach) and can re-enqueue from anywhere: there the daemon loads
 * zernel_rt_takes_cpu, on the sched_switch tracepoint, and drops
 * zernel_cpu_release from the ops; older kernels keep zernel_cpu_release.
 * Either way ZGSTAT_CPU_TAKEN counts the hand-backs.
 */
#define ZERNEL_MAX_RT_PRIO 100 /* prio below it: RT, deadline or stop class */

void BPF_STRUCT_OPS(zernel_cpu_release, s32 cpu,
		    struct scx_cpu_release_args *args)
{
	scx_bpf_reenqueue_local();
	count_event(ZGSTAT_CPU_TAKEN);
}

SEC("?tp_btf/sched_switch")
int BPF_PROG(zernel_rt_takes_cpu, bool preempt, struct task_struct *prev,
	     struct task_struct *next)
{
	if (next->prio >= ZERNEL_MAX_RT_PRIO)
		return 0;
	if (!scx_bpf_reenqueue_local_from_anywhere())
		count_event(ZGSTAT_CPU_TAKEN);
	return 0;
}

/*
 * @t's decision now, as lookup_decision would resolve it for @t (its entry,
 * checked against its start time; else what it inherited, within its
 * bound; else its process's GPU mark; nothing while the daemon is not
 * beating), without counting. The
 * bound of an inherited one goes in *@until: a grandchild inherits until
 * the same time, so a chain of forks cannot stretch it.
 */
static struct task_class *decision_of(struct task_struct *t, u64 now,
				      u64 *until)
{
	struct task_ctx *tctx;
	struct task_class *tc;
	u32 tid = t->pid;

	tc = bpf_map_lookup_elem(&task_class, &tid);
	if (tc && tc->start_ticks == t->start_boottime / NSEC_PER_TICK)
		return tc;
	tctx = bpf_task_storage_get(&task_ctxs, t, 0, 0);
	if (tctx && inherit_live(tctx, now)) {
		*until = tctx->inh_until;
		return &tctx->inh;
	}
	return gpu_mark(t, false);
}

/*
 * Fork inheritance. A task created while scx_zernel runs (@args->fork; the
 * tasks present at attach come here without it) starts with the decision
 * its creator holds, the current task (the thread that called fork or
 * clone), or else its process's main thread's entry:
 *
 *   fork/clone ─> zernel_init_task(child): creator's entry (start time
 *     matches) | creator's inherited decision | main thread's entry
 *     └─ found, daemon beating: child's inh = class, tenant, node
 *        (class slice, no CPU, no preempt flag), until
 *        min(now + decision_ttl, the creator's own bound); counted
 *        (inherited)
 *   lookup with no entry ─> inh, while before inh_until (inherit_hit)
 *   first entry the daemon writes for the child ─> replaces it for good
 *
 * So a DataLoader worker or a new thread of an ML process is in its class
 * from its first enqueue, not after the daemon's next passes. A child the
 * daemon gives no entry (a shell a trainer spawns) keeps the inherited
 * decision at most decision_ttl after the fork that started the chain
 * (inherit_end counts the ends): the bound that already limits how long a
 * decision outlives the daemon's attention.
 */
static void inherit(struct task_ctx *tctx)
{
	struct task_struct *cur = bpf_get_current_task_btf();
	u64 now = bpf_ktime_get_ns(), until = now + decision_ttl_ns;
	struct task_struct *leader;
	struct task_class *src;
	u32 tid;

	if (decisions_expired())
		return;
	src = decision_of(cur, now, &until);
	if (!src) {
		leader = cur->group_leader;
		tid = BPF_CORE_READ(leader, pid);
		src = bpf_map_lookup_elem(&task_class, &tid);
		if (src &&
		    src->start_ticks != BPF_CORE_READ(leader, start_boottime) /
						NSEC_PER_TICK)
			src = NULL;
	}
	if (!src)
		return;
	tctx->inh.class = src->class;
	tctx->inh.tenant = src->tenant;
	tctx->inh.node = src->node;
	tctx->inh.cpu = -1;
	tctx->inh.flags = 0;
	tctx->inh.slice_ns = 0;
	tctx->inh_until = until;
	count_event(ZGSTAT_INHERITED);
}

s32 BPF_STRUCT_OPS(zernel_init_task, struct task_struct *p,
		   struct scx_init_task_args *args)
{
	struct task_ctx *tctx;

	tctx = bpf_task_storage_get(&task_ctxs, p, 0,
				    BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!tctx)
		return -ENOMEM;
	tctx->class = default_class;
	tctx->tenant = -1;
	tctx->vclock = VCLOCK_NONE;
	if (args->fork) {
		tctx->forked = true;
		inherit(tctx);
	}
	return 0;
}

/*
 * One record into `events` for the daemon: @kind about @p's process
 * (started at @start_ticks), with device numbers for a GPU open (else 0).
 * A full ring buffer loses it (event_lost).
 */
static __always_inline void send_event(u32 kind, struct task_struct *p,
				       u64 start_ticks, u32 major, u32 minor,
				       u64 flags)
{
	struct zernel_event *ev;

	ev = bpf_ringbuf_reserve(&events, sizeof(*ev), 0);
	if (!ev) {
		count_event(ZGSTAT_EVENT_LOST);
		return;
	}
	ev->kind = kind;
	ev->pid = p->tgid;
	ev->tid = p->pid;
	ev->major = major;
	ev->minor = minor;
	ev->pad = 0;
	ev->start_ticks = start_ticks;
	bpf_ringbuf_submit(ev, flags);
}

/*
 * GPU device opens, on the generic open path of character devices: a
 * process that opens a device whose major the daemon listed (minor from
 * the first that counts) is marked ML at once, for all its threads (their
 * next lookup with no entry gives class ml: gpu_hit), and the daemon is told
 * through the ring buffer, once per process, so that it classifies it in
 * its next pass instead of at its next evidence scan:
 *
 *   open(/dev/nvidia0) ─> chrdev_open (fentry) | file_open (BPF LSM)
 *     └─ major in gpu_majors, minor >= its first? process not marked yet?
 *        └─ gpu_procs[tgid] = class ml, start time;  gpu_open++
 *           events <── {GPU_OPEN, pid, tid, major, minor, start}
 *   daemon: event ─> the process is ML (evidence device_open) ─> its
 *           threads' entries ─> the mark judged (no longer decides)
 *
 * The hook runs before the driver's open: an attempt counts even when the
 * open then fails (no driver behind the node). With no GPU driver and no
 * such node nothing is ever marked.
 */
static __always_inline void gpu_open(u32 rdev)
{
	struct task_struct *cur = bpf_get_current_task_btf();
	u32 major = rdev >> 20, minor = rdev & ((1U << 20) - 1), tgid;
	struct task_class mark = {
		.class = ZCLASS_ML,
		.cpu = -1,
		.node = -1,
		.tenant = -1,
	};
	struct task_class *g;
	u32 *first;

	first = bpf_map_lookup_elem(&gpu_majors, &major);
	if (!first || minor < *first)
		return;
	tgid = cur->tgid;
	mark.start_ticks = proc_start_ticks(cur);
	g = bpf_map_lookup_elem(&gpu_procs, &tgid);
	if (g && g->start_ticks == mark.start_ticks)
		return;
	if (bpf_map_update_elem(&gpu_procs, &tgid, &mark, BPF_ANY))
		return;
	count_event(ZGSTAT_GPU_OPEN);
	/* Wakes the daemon even with process events queued before it. */
	send_event(ZEV_GPU_OPEN, cur, mark.start_ticks, major, minor,
		   BPF_RB_FORCE_WAKEUP);
}

SEC("fentry/chrdev_open")
int BPF_PROG(zernel_chrdev_open, struct inode *inode, struct file *filp)
{
	gpu_open(inode->i_rdev);
	return 0;
}

#define ZERNEL_S_IFMT  0170000
#define ZERNEL_S_IFCHR 0020000

SEC("lsm/file_open")
int BPF_PROG(zernel_file_open, struct file *file)
{
	struct inode *inode = file->f_inode;

	if ((BPF_CORE_READ(inode, i_mode) & ZERNEL_S_IFMT) == ZERNEL_S_IFCHR)
		gpu_open(BPF_CORE_READ(inode, i_rdev));
	return 0;
}

/*
 * Process events: a process forked, exec'd or exited. The daemon learns of
 * new and changed processes from these at its next pass, instead of by
 * listing /proc, which it then does only as a slow reconciliation:
 *
 *   fork (child is a thread-group leader) ─> {PROC_NEW, tgid, start}
 *   exec ─> {PROC_EXEC, tgid, start}      leader exit ─> {PROC_EXIT, ...}
 *
 * No wakeup: the daemon drains the ring buffer itself (every 20 ms). A full
 * ring buffer loses the event (event_lost); the daemon then lists /proc.
 */
static __always_inline void proc_event(u32 kind, struct task_struct *p)
{
	send_event(kind, p, proc_start_ticks(p), 0, 0, BPF_RB_NO_WAKEUP);
}

SEC("tp_btf/sched_process_fork")
int BPF_PROG(zernel_proc_fork, struct task_struct *parent,
	     struct task_struct *child)
{
	if (child->pid == child->tgid)
		proc_event(ZEV_PROC_NEW, child);
	return 0;
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(zernel_proc_exec, struct task_struct *p)
{
	proc_event(ZEV_PROC_EXEC, p);
	return 0;
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(zernel_proc_exit, struct task_struct *p)
{
	if (p->pid == p->tgid)
		proc_event(ZEV_PROC_EXIT, p);
	return 0;
}

/*
 * A thread renamed (prctl(PR_SET_NAME), a write to its comm file, an exec)
 * or a task moved to another cgroup: the daemon re-reads that thread's name,
 * or that process's cgroup, at its next pass, so that its periodic name
 * checks and cgroup reads are only a slow reconciliation.
 */
SEC("tp_btf/task_rename")
int BPF_PROG(zernel_task_rename, struct task_struct *task, const char *comm)
{
	proc_event(ZEV_TASK_RENAME, task);
	return 0;
}

SEC("tp_btf/cgroup_attach_task")
int BPF_PROG(zernel_cgroup_attach, struct cgroup *dst, const char *path,
	     struct task_struct *task, bool threadgroup)
{
	proc_event(ZEV_CGROUP_MOVE, task);
	return 0;
}

void BPF_STRUCT_OPS(zernel_exit_task, struct task_struct *p,
		    struct scx_exit_task_args *args)
{
	u32 tid = p->pid;

	if (!bpf_map_delete_elem(&task_class, &tid))
		count_event(ZGSTAT_EXIT_DEL);
}

s32 BPF_STRUCT_OPS_SLEEPABLE(zernel_init)
{
	u32 n, c;
	s32 ret;

	bpf_for(n, 0, nr_nodes) {
		bpf_for(c, 0, ZCLASS_NR) {
			ret = scx_bpf_create_dsq(dsq_id(n, c),
						 numa_enabled ? n : -1);
			if (ret) {
				scx_bpf_error("failed to create dsq %u/%u: %d",
					      n, c, ret);
				return ret;
			}
		}
	}
	bpf_for(n, 0, nr_tenants) {
		bpf_for(c, ZCLASS_ML, ZCLASS_NR) {
			ret = scx_bpf_create_dsq(share_dsq(n, 0, c), -1);
			if (ret) {
				scx_bpf_error(
					"failed to create tenant dsq %u/%u: %d",
					n, c, ret);
				return ret;
			}
		}
	}
	return 0;
}

void BPF_STRUCT_OPS(zernel_exit, struct scx_exit_info *ei)
{
	UEI_RECORD(uei, ei);
}

SCX_OPS_DEFINE(zernel_ops, .select_cpu = (void *)zernel_select_cpu,
	       .enqueue = (void *)zernel_enqueue,
	       .dispatch = (void *)zernel_dispatch,
	       .running = (void *)zernel_running,
	       .stopping = (void *)zernel_stopping,
	       .cpu_release = (void *)zernel_cpu_release,
	       .init_task = (void *)zernel_init_task,
	       .exit_task = (void *)zernel_exit_task,
	       .init = (void *)zernel_init, .exit = (void *)zernel_exit,
	       .name = "zernel");
