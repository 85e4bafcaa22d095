/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * scx_zernel: the observer's thread counters, read from the kernel.
 *
 * A task iterator. The daemon attaches it once per ML process (the link's
 * filter is the process: BPF_TASK_ITER_TGID, kernel 6.1+) and reads it once
 * per pass: one record per thread (struct zernel_thread_rec, intf.h) with
 * what /proc/<pid>/task/<tid>/{schedstat,stat,status,io} would show.
 *
 *   daemon pass ──> read(iter fd of process P) ──> zernel_threads(P's 1st
 *                   thread), zernel_threads(2nd), ... ──> records
 *
 * That is one read() per process in place of one to four preads per thread
 * (the kernel formats no text and the daemon parses none). It needs no
 * sched_ext: `scx_zernel observe` uses it on any kernel with BTF, and the
 * daemon falls back to /proc where it cannot be loaded.
 */
#include <vmlinux.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include "intf.h"

char _license[] SEC("license") = "GPL";

#define NSEC_PER_TICK (1000000000ULL / ZERNEL_USER_HZ)

SEC("iter/task")
int zernel_threads(struct bpf_iter__task *ctx)
{
	struct task_struct *t = ctx->task;
	struct zernel_thread_rec r = {};

	if (!t)
		return 0;
	r.tid = t->pid;
	r.tgid = t->tgid;
	r.start_ticks = t->start_boottime / NSEC_PER_TICK;
	r.cpu_ns = t->se.sum_exec_runtime;
	/* Kernels without CONFIG_SCHED_INFO show 0 for these in schedstat. */
	if (bpf_core_field_exists(t->sched_info)) {
		r.runq_ns = t->sched_info.run_delay;
		r.slices = t->sched_info.pcount;
	}
	r.nvcsw = t->nvcsw;
	r.nivcsw = t->nivcsw;
	/* Without CONFIG_TASK_XACCT /proc has no I/O counters either. */
	if (bpf_core_field_exists(t->ioac))
		r.rchar = t->ioac.rchar;
	r.cpu = -1;
	if (bpf_core_field_exists(t->thread_info.cpu))
		r.cpu = t->thread_info.cpu;
	bpf_probe_read_kernel_str(r.comm, sizeof(r.comm), t->comm);
	bpf_seq_write(ctx->meta->seq, &r, sizeof(r));
	return 0;
}
