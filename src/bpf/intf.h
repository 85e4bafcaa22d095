/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * The one definition of everything shared between the BPF scheduler
 * (main.bpf.c) and the daemon (reaches Rust through bindgen as bpf_intf).
 */
#ifndef __ZERNEL_INTF_H
#define __ZERNEL_INTF_H

#ifndef __VMLINUX_H__
typedef unsigned char u8;
typedef unsigned int u32;
typedef int s32;
typedef unsigned long long u64;
typedef long long s64;
#endif

enum zernel_consts {
	ZERNEL_MAX_CPUS = 1024,
	ZERNEL_MAX_NODES = 16,
	ZERNEL_MAX_TENANTS = 16,
	/* Tenant queues: dsq id = ZERNEL_TENANT_DSQ + tenant * ZCLASS_NR + class. */
	ZERNEL_TENANT_DSQ = 0x10000,
	/* Tenant weights are relative to this one. */
	ZERNEL_WEIGHT_UNIT = 1024,
	/* Default capacity of the task_class map (daemon may resize). */
	ZERNEL_TASK_MAP_DEFAULT = 65536,
	/* USER_HZ: /proc/<pid>/stat start times are in these ticks. */
	ZERNEL_USER_HZ = 100,
	/* Default slice of each class, in microseconds (the daemon sets them). */
	ZERNEL_SLICE_US_LATENCY = 2000,
	ZERNEL_SLICE_US_ML = 4000,
	ZERNEL_SLICE_US_NORMAL = 3000,
	ZERNEL_SLICE_US_BATCH = 8000,
	/*
	 * Interactive wakeups (normal class, short bursts) may cut an ml hog
	 * short while the CPU time they use that way stays under this percent
	 * of all CPUs' time, counted over windows of the starvation bound.
	 */
	ZERNEL_INTERACTIVE_PCT = 10,
};

/*
 * Scheduling classes, highest priority first. Each class has one dispatch
 * queue per NUMA node: dsq id = node * ZCLASS_NR + class.
 */
enum zernel_class {
	ZCLASS_LATENCY = 0, /* latency-critical: kernel launchers, NCCL */
	ZCLASS_ML = 1,	    /* ML compute: data loaders, optimizer step */
	ZCLASS_NORMAL = 2,  /* everything else (the default) */
	ZCLASS_BATCH = 3,   /* background hogs */
	ZCLASS_NR = 4,
};

/* task_class.flags */
enum zernel_task_flags {
	ZFLAG_PREEMPT = 1 << 0, /* a wakeup may preempt a lower class */
	ZFLAG_JUDGED = 1 << 1,	/* gpu_procs: the daemon has judged the
				 * process; the mark no longer decides */
};

/*
 * One decision for one thread, written by the daemon, read by enqueue and
 * select_cpu. Keyed by TID. start_ticks ties the entry to one task's
 * lifetime: it must equal the task's start time in USER_HZ ticks (field 22
 * of /proc/<tid>/stat); an entry whose start time does not match belongs to
 * a recycled TID and is ignored (counted as map_stale), never deleted by
 * BPF: only the daemon and exit_task remove entries.
 */
struct task_class {
	u32 class;    /* enum zernel_class */
	u32 flags;    /* enum zernel_task_flags */
	u64 slice_ns; /* 0 = the class default */
	s32 cpu;      /* preferred CPU, -1 = none */
	s32 node;     /* preferred NUMA node, -1 = none */
	s32 tenant;   /* tenant index, -1 = none */
	u32 pad;
	u64 start_ticks; /* task start time in USER_HZ ticks */
	u64 applied; /* written by BPF: times this entry was looked up (once per wakeup, enqueue or kept slice end) */
};

/* Per-class counters. */
enum zernel_class_stat {
	ZSTAT_ENQUEUED =
		0, /* tasks queued in (or directly dispatched to) the class */
	ZSTAT_DISPATCHED,   /* tasks moved from the class queue to a CPU */
	ZSTAT_DIRECT,	    /* tasks sent straight to an idle CPU, or kept by
				   their CPU at a slice end with nothing else to run */
	ZSTAT_PREEMPTED,    /* wakeups that preempted a lower class */
	ZSTAT_STARVED,	    /* dispatches forced by the starvation bound */
	ZSTAT_WAKE_PREEMPT, /* wakeups that took a busy CPU (wake_victim) */
	ZSTAT_KEPT, /* slice ends where the task kept its CPU: no higher class
		     * waited, and it went before its queue's head or that
		     * queue was empty (keep_prev) */
	ZSTAT_CLASS_NR,
};

/* Global counters. */
enum zernel_global_stat {
	ZGSTAT_MAP_HIT =
		0, /* lookups (one per wakeup, enqueue or kept slice end) that found an entry */
	ZGSTAT_MAP_MISS, /* lookups with no entry (default class) */
	ZGSTAT_MAP_STALE, /* lookups that found another task's entry (TID recycled): ignored */
	ZGSTAT_PREF_CPU, /* select_cpu used the preferred CPU */
	ZGSTAT_PREF_NODE, /* select_cpu found an idle CPU on the preferred node */
	ZGSTAT_IDLE_NEAR,   /* ... on prev_cpu's node (prev, its LLC, node) */
	ZGSTAT_IDLE_FAR,    /* ... on another node */
	ZGSTAT_STEAL,	    /* dispatches from another node's queue */
	ZGSTAT_KICK,	    /* idle CPUs kicked on enqueue */
	ZGSTAT_EXIT_DEL,    /* entries deleted by exit_task */
	ZGSTAT_TENANT_DISP, /* dispatches from tenant queues */
	ZGSTAT_MAP_EXPIRED, /* lookups that found an entry while the daemon's
			     * heartbeat was older than decision_ttl: default class */
	ZGSTAT_MIGRATION_DISABLED, /* enqueues of a task that may not migrate
				    * (preempted inside migrate_disable()) */
	ZGSTAT_CPU_TAKEN,	   /* a higher class (RT, deadline) took a CPU:
				    * its local queue was handed back */
	ZGSTAT_INHERITED,	   /* tasks created (fork or clone) with their
				    * creator's decision: class, tenant, node */
	ZGSTAT_INHERIT_HIT, /* lookups with no entry served by an inherited decision */
	ZGSTAT_INHERIT_END,    /* inherited decisions that ran out (decision_ttl
				* after the fork that started them) with no entry */
	ZGSTAT_FIRST_DEC,      /* tasks created since attach whose enqueue first
				* came with a decision (entry or inherited) */
	ZGSTAT_ENQ_BEFORE_DEC, /* ... their enqueues with none before it */
	ZGSTAT_GPU_OPEN,       /* processes marked ML by a GPU device open */
	ZGSTAT_GPU_HIT, /* lookups with no entry served by that mark (class ml) */
	ZGSTAT_EVENT_LOST, /* events the ring buffer had no room for */
	/* wakeups that took a CPU other than their waker's and their own
	 * (wake_victim): latency and ML wakees a lower class's, normal ones
	 * with their queue crowded a hog's */
	ZGSTAT_WAKE_AFIELD,
	ZGSTAT_WAKE_AFIELD_FAR, /* ... of those, a CPU off the node of the
				 * wakee's queue (none on it would do) */
	ZGSTAT_INTERACTIVE,	/* normal-class wakeups, first runs of new
				 * tasks and slice ends of such runs that took
				 * an ml hog's CPU, within ZERNEL_INTERACTIVE_PCT */
	ZGSTAT_INTERACTIVE_NS,	/* ... the CPU time they used that way, ns */
	ZGSTAT_NR,
};

/*
 * One thread's counters, as the observer's task iterator (threads.bpf.c)
 * writes them: what /proc/<pid>/task/<tid>/{schedstat,stat,status,io}
 * show, for every thread of one process in one read().
 */
struct zernel_thread_rec {
	u32 tid;
	u32 tgid;
	s32 cpu; /* CPU it last ran on (stat 39), -1 = unknown */
	u32 pad;
	u64 start_ticks; /* USER_HZ ticks since boot (stat 22) */
	u64 cpu_ns;	 /* schedstat 1: CPU time */
	u64 runq_ns;	 /* schedstat 2: time runnable, waiting */
	u64 slices;	 /* schedstat 3: times it got a CPU */
	u64 nvcsw;	 /* status: voluntary_ctxt_switches */
	u64 nivcsw;	 /* status: nonvoluntary_ctxt_switches */
	u64 rchar;	 /* io: rchar (0 without task I/O accounting) */
	char comm[16];	 /* comm, NUL-terminated (TASK_COMM_LEN) */
};

/* Ring buffer events (the `events` map), BPF to the daemon. */
enum zernel_event_kind {
	ZEV_GPU_OPEN = 1,    /* a process opened a GPU device (first time) */
	ZEV_PROC_NEW = 2,    /* a process was forked (pid = its tgid) */
	ZEV_PROC_EXEC = 3,   /* a process exec'd a new program */
	ZEV_PROC_EXIT = 4,   /* a process's leader exited */
	ZEV_TASK_RENAME = 5, /* a thread (tid) was renamed */
	ZEV_CGROUP_MOVE = 6, /* a process or thread moved to another cgroup */
};

struct zernel_event {
	u32 kind; /* enum zernel_event_kind */
	u32 pid;  /* process (tgid) */
	u32 tid; /* the thread that opened it (forked, exec'd, exited, was renamed or moved) */
	u32 major; /* device numbers (GPU_OPEN; else 0) */
	u32 minor;
	u32 pad;
	u64 start_ticks; /* the process's start time, USER_HZ ticks */
};

/* Value of the per-CPU `stats` array map (one element). */
struct zernel_stats {
	u64 cls[ZCLASS_NR][ZSTAT_CLASS_NR];
	u64 glob[ZGSTAT_NR];
	u64 tenant_ns[ZERNEL_MAX_TENANTS]; /* CPU time used per tenant */
};

#endif /* __ZERNEL_INTF_H */
