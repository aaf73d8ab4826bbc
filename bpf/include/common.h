/* SPDX-License-Identifier: GPL-2.0 OR BSD-3-Clause */
/* Shared helpers for nodectl's BPF programs: log2 histograms, cgroup identity, drop counters. */
#ifndef NODECTL_COMMON_H
#define NODECTL_COMMON_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>

/* Number of log2 buckets: bucket i holds values in [2^i, 2^(i+1)) nanoseconds (bucket 0 also
 * holds 0); 2^39 ns is about nine minutes, so the last bucket collects anything longer. */
#define HIST_SLOTS 40

struct hist {
	__u64 slots[HIST_SLOTS];
	__u64 count;
	__u64 sum_ns;
};

/* Set by the loader before load. cgroup_v1 selects the v1 hierarchy of the controller each
 * object names (cpu for run-queue, blkio for I/O and fsync); otherwise the v2 id is used. */
volatile const bool cgroup_v1 = false;

static __always_inline __u32 log2_slot(__u64 v)
{
	__u32 r = 0;
	/* Branch-light integer log2, bounded for the verifier. */
	if (v >> 32) { v >>= 32; r += 32; }
	if (v >> 16) { v >>= 16; r += 16; }
	if (v >> 8) { v >>= 8; r += 8; }
	if (v >> 4) { v >>= 4; r += 4; }
	if (v >> 2) { v >>= 2; r += 2; }
	if (v >> 1) { r += 1; }
	if (r >= HIST_SLOTS)
		r = HIST_SLOTS - 1;
	return r;
}

/* Adds a value to a histogram of a per-CPU map, which only this CPU writes. */
static __always_inline void hist_add(struct hist *h, __u64 delta_ns)
{
	__u32 slot = log2_slot(delta_ns);
	if (slot < HIST_SLOTS)
		h->slots[slot] += 1;
	h->count += 1;
	h->sum_ns += delta_ns;
}

/* Adds a value to a histogram all CPUs share. The maps of rare events (fsync calls, block
 * requests, reclaim stalls) are shared rather than per-CPU: a per-CPU map is read once per
 * possible CPU at every interval, 96 copies of each entry on a 96-vCPU node, where an atomic add
 * costs the event tens of ns at most. */
static __always_inline void hist_add_shared(struct hist *h, __u64 delta_ns)
{
	__u32 slot = log2_slot(delta_ns);
	if (slot < HIST_SLOTS)
		__sync_fetch_and_add(&h->slots[slot], 1);
	__sync_fetch_and_add(&h->count, 1);
	__sync_fetch_and_add(&h->sum_ns, delta_ns);
}

/* Kernfs id of the task's cgroup: on v1 hosts the cgroup of the given controller's hierarchy,
 * on v2 hosts the default hierarchy's. Both equal the inode number of the cgroup directory. */
static __always_inline __u64 task_cgroup_id(struct task_struct *t, int subsys)
{
	if (cgroup_v1)
		return BPF_CORE_READ(t, cgroups, subsys[subsys], cgroup, kn, id);
	return BPF_CORE_READ(t, cgroups, dfl_cgrp, kn, id);
}

/* Look up a histogram for key, inserting a zeroed one when absent. Returns NULL when
 * the map is full; the caller counts that as a drop. */
static __always_inline struct hist *hist_get(void *map, const void *key)
{
	struct hist *h = bpf_map_lookup_elem(map, key);
	if (h)
		return h;
	static const struct hist zero;
	/* EEXIST means another CPU raced us in: the lookup below finds its entry. */
	bpf_map_update_elem(map, key, &zero, BPF_NOEXIST);
	return bpf_map_lookup_elem(map, key);
}

/* Drop counters, one per reason, shared by the CPUs: drops are rare, and one copy reads the
 * same on any number of CPUs where a per-CPU array was read once per CPU at every interval. */
#define DROP_REASONS 4
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, DROP_REASONS);
	__type(key, __u32);
	__type(value, __u64);
} drops SEC(".maps");

static __always_inline void count_drop(__u32 reason)
{
	__u64 *v = bpf_map_lookup_elem(&drops, &reason);
	if (v)
		__sync_fetch_and_add(v, 1);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#endif
