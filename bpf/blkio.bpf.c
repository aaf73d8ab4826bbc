/* SPDX-License-Identifier: GPL-2.0 OR BSD-3-Clause */
/* Block request latency and volume per issuing cgroup, device and operation. The programs fire
 * per request (insert, issue, complete; merge to forget a request folded into another). */
#include "common.h"

enum blk_op {
	BLK_OP_READ = 0,
	BLK_OP_WRITE = 1,
	BLK_OP_FLUSH = 2,
	BLK_OP_DISCARD = 3,
	BLK_OP_OTHER = 4,
};

/* Indexes into the drops array (common.h). */
enum drop_reason {
	DROP_STATS_FULL = 0,    /* io map full: a completed request with a new key was not recorded */
	DROP_INFLIGHT_FULL = 1, /* in-flight table full: a request was not followed */
};

/* Keeps enum drop_reason in BTF so that bpf2go generates its Go constants. */
const enum drop_reason *unused_drop_reason __attribute__((unused));

#define MAX_INFLIGHT 16384
#define PF_KTHREAD 0x00200000
/* The op is the low REQ_OP_BITS (8, unchanged since 4.10) of cmd_flags. */
#define REQ_OP_MASK 0xff

struct blk_key {
	__u64 cgroup; /* blkio hierarchy on v1, default hierarchy on v2 */
	__u32 dev; /* whole disk (kernel dev_t) */
	enum blk_op op;
};

struct blk_stats {
	struct hist queue; /* insert to issue; 0 for requests that were never inserted */
	struct hist service; /* issue to complete */
	__u64 bytes;
	__u64 requests;
};

struct inflight {
	__u64 insert_ts; /* 0 when the request was issued directly */
	__u64 issue_ts;
	__u64 cgroup;
	__u32 weak; /* cgroup came from a root blkcg or a kernel thread: a later user task wins */
	__u32 pad;
};

/* Keyed by the request pointer; requests are preallocated per tag, so keys recur. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_INFLIGHT);
	__type(key, __u64);
	__type(value, struct inflight);
} inflight SEC(".maps");

/* max_entries is set by the loader. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 4096);
	__type(key, struct blk_key);
	__type(value, struct blk_stats);
} io SEC(".maps");

/* Before 5.17 the disk hung off the request, not the queue. */
struct request___old {
	struct gendisk *rq_disk;
};

static __always_inline __u32 rq_dev(struct request *rq)
{
	struct gendisk *disk;
	if (bpf_core_field_exists(struct request_queue, disk))
		disk = BPF_CORE_READ(rq, q, disk);
	else
		disk = BPF_CORE_READ((struct request___old *)rq, rq_disk);
	if (!disk)
		return 0;
	return ((__u32)BPF_CORE_READ(disk, major) << 20) | (__u32)BPF_CORE_READ(disk, first_minor);
}

/* The task's cgroup in the io hierarchy. A kernel without the io controller (no
 * CONFIG_BLK_CGROUP) has no blkio hierarchy either: the default hierarchy's id stands in. */
static __always_inline __u64 io_cgroup_id(struct task_struct *t)
{
	if (bpf_core_enum_value_exists(enum cgroup_subsys_id, io_cgrp_id))
		return task_cgroup_id(t, bpf_core_enum_value(enum cgroup_subsys_id, io_cgrp_id));
	return BPF_CORE_READ(t, cgroups, dfl_cgrp, kn, id);
}

/*
 * The cgroup to charge for rq. The bio's blkcg names who issued the I/O even when a kernel
 * thread submits it, so it comes first. Measured here (6.18, v1 blkio, mq-deadline): O_DIRECT
 * writes and writes that the writer's own fsync writes back both carry the writer's blkcg
 * (without cgroup writeback a sync writeback bio takes the current task's); buffered writes
 * that the flusher writes back later carry the root blkcg and stay in root, since v1 has no
 * cgroup writeback (on v2 with memory and io enabled, cgroup writeback tags them with the
 * dirtier). A user task is charged directly when its bio has no blkcg (no CONFIG_BLK_CGROUP),
 * the root blkcg, or its own io css: the same id on v1, and on v2 its own cgroup is finer when
 * the io controller is not enabled down to it. The test checks both kinds of write.
 */
static __always_inline __u64 rq_cgroup(struct request *rq, __u32 *weak)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	struct cgroup_subsys_state *css = NULL, *own = NULL;
	if (bpf_core_field_exists(struct bio, bi_blkg)) {
		struct blkcg_gq *blkg = BPF_CORE_READ(rq, bio, bi_blkg);
		/* blkcg starts with its css: the pointers are the same. */
		if (blkg)
			css = (struct cgroup_subsys_state *)BPF_CORE_READ(blkg, blkcg);
	}
	if (bpf_core_enum_value_exists(enum cgroup_subsys_id, io_cgrp_id))
		own = BPF_CORE_READ(task, cgroups,
				    subsys[bpf_core_enum_value(enum cgroup_subsys_id, io_cgrp_id)]);
	bool root = !css || !BPF_CORE_READ(css, parent);
	bool kthread = BPF_CORE_READ(task, flags) & PF_KTHREAD;
	if (!kthread && (root || css == own)) {
		*weak = 0;
		return io_cgroup_id(task);
	}
	if (!css) {
		*weak = 1;
		return io_cgroup_id(task);
	}
	*weak = root;
	return BPF_CORE_READ(css, cgroup, kn, id);
}

SEC("tp_btf/block_rq_insert")
int BPF_PROG(rq_insert, struct request *rq)
{
	__u64 k = (__u64)rq;
	struct inflight v = { .insert_ts = bpf_ktime_get_ns() };
	v.cgroup = rq_cgroup(rq, &v.weak);
	/* A requeued request is inserted again, often from kblockd: keep who issued it. */
	struct inflight *old = bpf_map_lookup_elem(&inflight, &k);
	if (old && v.weak && !old->weak) {
		v.cgroup = old->cgroup;
		v.weak = 0;
	}
	if (bpf_map_update_elem(&inflight, &k, &v, BPF_ANY))
		count_drop(DROP_INFLIGHT_FULL);
	return 0;
}

SEC("tp_btf/block_rq_issue")
int BPF_PROG(rq_issue, struct request *rq)
{
	__u64 k = (__u64)rq;
	__u64 now = bpf_ktime_get_ns();
	struct inflight *v = bpf_map_lookup_elem(&inflight, &k);
	if (v) {
		v->issue_ts = now;
		if (v->weak) {
			__u32 weak;
			__u64 cg = rq_cgroup(rq, &weak);
			if (!weak) {
				v->cgroup = cg;
				v->weak = 0;
			}
		}
		return 0;
	}
	/* Issued without passing the scheduler (no elevator, or direct issue): no queue time. */
	struct inflight n = { .issue_ts = now };
	n.cgroup = rq_cgroup(rq, &n.weak);
	if (bpf_map_update_elem(&inflight, &k, &n, BPF_ANY))
		count_drop(DROP_INFLIGHT_FULL);
	return 0;
}

/* A request merged into another is freed without completing. */
SEC("tp_btf/block_rq_merge")
int BPF_PROG(rq_merge, struct request *rq)
{
	__u64 k = (__u64)rq;
	bpf_map_delete_elem(&inflight, &k);
	return 0;
}

static __always_inline struct blk_stats *stats_get(const struct blk_key *k)
{
	struct blk_stats *s = bpf_map_lookup_elem(&io, k);
	if (s)
		return s;
	static const struct blk_stats zero;
	bpf_map_update_elem(&io, k, &zero, BPF_NOEXIST);
	return bpf_map_lookup_elem(&io, k);
}

SEC("tp_btf/block_rq_complete")
int BPF_PROG(rq_complete, struct request *rq, blk_status_t error, unsigned int nr_bytes)
{
	__u64 k = (__u64)rq;
	struct inflight *v = bpf_map_lookup_elem(&inflight, &k);
	if (!v)
		return 0; /* issued before we attached */
	if (!v->issue_ts) {
		bpf_map_delete_elem(&inflight, &k); /* ended without being issued */
		return 0;
	}
	__u64 now = bpf_ktime_get_ns();
	__u32 op = BPF_CORE_READ(rq, cmd_flags) & REQ_OP_MASK;
	struct blk_key key = {
		.cgroup = v->cgroup,
		.dev = rq_dev(rq),
		.op = op <= BLK_OP_DISCARD ? op : BLK_OP_OTHER,
	};
	/* A partial completion (nr_bytes short of what remains) keeps the request in flight. */
	bool done = nr_bytes >= BPF_CORE_READ(rq, __data_len);
	__u64 queue = v->insert_ts ? v->issue_ts - v->insert_ts : 0;
	__u64 service = now - v->issue_ts;
	if (done)
		bpf_map_delete_elem(&inflight, &k);
	struct blk_stats *s = stats_get(&key);
	if (!s) {
		count_drop(DROP_STATS_FULL);
		return 0;
	}
	s->bytes += nr_bytes;
	if (done) {
		hist_add(&s->queue, queue);
		hist_add(&s->service, service);
		s->requests += 1;
	}
	return 0;
}
