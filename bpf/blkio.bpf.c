/* SPDX-License-Identifier: GPL-2.0 OR BSD-3-Clause */
/* Block request latency and volume per issuing cgroup, device and operation. The programs fire
 * per request (insert, issue, complete; merge to forget a request folded into another); one
 * more, run by the reader before each read, settles the requests whose completion the others
 * did not see. */
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
	/* A request ended without rq_complete running for it, found by the sweep: charged, if it
	 * was seen issued, with its bytes but no times. */
	DROP_COMPLETION_UNSEEN = 2,
	/* A request completed from the device without rq_issue having run for it: charged with
	 * its bytes but no times. */
	DROP_ISSUE_UNSEEN = 3,
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
	struct hist queue; /* insert to (last) issue; 0 for requests that were never inserted */
	struct hist service; /* issue to complete */
	__u64 bytes;
	__u64 requests; /* the timed ones, in both histograms, and the untimed */
	__u64 untimed; /* requests whose issue or completion no program saw: no times */
};

/*
 * The kernel does not run a tracing program at every firing of its tracepoint: not when the
 * program is already running on that CPU (a recursion miss), and, measured on 6.18 in a
 * sandboxed VM, hardly ever in the softirqs that run on top of the sandbox agent's own
 * threads, where tracefs still records the event and no miss is counted. A request whose completion runs
 * there would stay in flight here forever, its bytes charged to nobody. So each request's
 * lifetime has its own key, and the sweep, run at each read, settles the lifetimes that have
 * ended without rq_complete: their bytes and request are charged, untimed.
 *
 * A request struct is preallocated per tag and serves request after request; its
 * start_time_ns, set when it is allocated, tells them apart, and stays across a requeue. It
 * is 0 where the queue has neither an elevator nor I/O stats: there a struct's requests share
 * one key, and a request whose completion went unseen is only settled while its struct is free.
 */
struct rq_key {
	__u64 rq;
	__u64 start;
};

struct inflight {
	__u64 queue_ts; /* first insert, or first issue for a request issued directly */
	__u64 issue_ts; /* last issue; 0 while the request is not on the device */
	__u64 cgroup;
	__u32 weak; /* cgroup came from a root blkcg or a kernel thread: a later user task wins */
	__u32 bytes; /* left to complete: the request's length at its last issue */
	__u32 dev;
	enum blk_op op;
};

/* Entries are only added (BPF_NOEXIST), changed in place and deleted, so that an entry stays
 * the same element for the whole of its request's lifetime. Requests whose completion went
 * unseen stay until the next read sweeps them. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_INFLIGHT);
	__type(key, struct rq_key);
	__type(value, struct inflight);
} inflight SEC(".maps");

/* max_entries is set by the loader. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct blk_key);
	__type(value, struct blk_stats);
} io SEC(".maps");

/* Before 5.17 the disk hung off the request, not the queue. */
struct request___old {
	struct gendisk *rq_disk;
};

/* Before 5.16 the request's reference count was a refcount_t. */
struct request___refcount {
	refcount_t ref;
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

static __always_inline enum blk_op rq_op(struct request *rq)
{
	__u32 op = BPF_CORE_READ(rq, cmd_flags) & REQ_OP_MASK;
	return op <= BLK_OP_DISCARD ? op : BLK_OP_OTHER;
}

static __always_inline __u64 rq_start(struct request *rq)
{
	if (bpf_core_field_exists(rq->start_time_ns))
		return BPF_CORE_READ(rq, start_time_ns);
	return 0;
}

static __always_inline struct rq_key rq_key(struct request *rq)
{
	struct rq_key k = { .rq = (__u64)rq, .start = rq_start(rq) };
	return k;
}

/* Whether the request was started (issued), from its state at its completion. */
static __always_inline bool rq_started(struct request *rq)
{
	if (!bpf_core_field_exists(rq->state))
		return false;
	return BPF_CORE_READ(rq, state) != bpf_core_enum_value(enum mq_rq_state, MQ_RQ_IDLE);
}

/*
 * Whether the request of k has ended: its struct was freed (the last reference dropped, which
 * is after its completion) or has been allocated again (another start time). A requeued
 * request keeps its reference and start time. A struct freed with its queue reads as anything,
 * most likely not k's start time, or fails to read as 0.
 */
static __always_inline bool rq_ended(const struct rq_key *k)
{
	struct request *rq = (struct request *)k->rq;
	if (rq_start(rq) != k->start)
		return true;
	int refs;
	if (bpf_core_field_exists(rq->ref.counter))
		refs = BPF_CORE_READ(rq, ref.counter);
	else
		refs = BPF_CORE_READ((struct request___refcount *)rq, ref.refs.counter);
	return refs == 0;
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

/* A weak cgroup gives way to the current task's, if that one is not weak. */
static __always_inline void upgrade_cgroup(struct inflight *v, struct request *rq)
{
	if (!v->weak)
		return;
	__u32 weak;
	__u64 cg = rq_cgroup(rq, &weak);
	if (!weak) {
		v->cgroup = cg;
		v->weak = 0;
	}
}

/* Starts following rq, first seen at now (an insert, or an issue when issue_ts is now). */
static __always_inline void follow(struct request *rq, const struct rq_key *k, __u64 now,
				   __u64 issue_ts)
{
	struct inflight v = {
		.queue_ts = now,
		.issue_ts = issue_ts,
		.bytes = BPF_CORE_READ(rq, __data_len),
		.dev = rq_dev(rq),
		.op = rq_op(rq),
	};
	v.cgroup = rq_cgroup(rq, &v.weak);
	if (bpf_map_update_elem(&inflight, k, &v, BPF_NOEXIST))
		count_drop(DROP_INFLIGHT_FULL);
}

SEC("tp_btf/block_rq_insert")
int BPF_PROG(rq_insert, struct request *rq)
{
	struct rq_key k = rq_key(rq);
	struct inflight *v = bpf_map_lookup_elem(&inflight, &k);
	if (!v) {
		follow(rq, &k, bpf_ktime_get_ns(), 0);
		return 0;
	}
	/* Requeued and inserted again, often from kblockd: the same request, whose queue time
	 * runs on from when it was first seen, which keeps who issued it, and which is off the
	 * device until issued again. */
	v->issue_ts = 0;
	upgrade_cgroup(v, rq);
	return 0;
}

SEC("tp_btf/block_rq_issue")
int BPF_PROG(rq_issue, struct request *rq)
{
	struct rq_key k = rq_key(rq);
	__u64 now = bpf_ktime_get_ns();
	struct inflight *v = bpf_map_lookup_elem(&inflight, &k);
	if (!v) {
		/* Issued without passing the scheduler (no elevator, or direct issue): no queue
		 * time. */
		follow(rq, &k, now, now);
		return 0;
	}
	/*
	 * Inserted, or issued before and requeued: a driver that cannot take a request (a full
	 * virtio ring) hands it back, and it is issued again later, once or many times. It is
	 * still one request, counted once at its completion. Its service time runs from the
	 * last issue, when the device took it for good; the earlier attempts and the waits
	 * between them are the device not taking it, counted in its queue time, from when it
	 * was first seen to the last issue.
	 */
	v->issue_ts = now;
	v->bytes = BPF_CORE_READ(rq, __data_len);
	upgrade_cgroup(v, rq);
	return 0;
}

/* A request merged into another is freed without completing; its bytes are the other's. */
SEC("tp_btf/block_rq_merge")
int BPF_PROG(rq_merge, struct request *rq)
{
	struct rq_key k = rq_key(rq);
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

/* Charges bytes of v's request to its key, and the request itself once done: with its queue
 * and service times up to now when timed, else as untimed. */
static __always_inline void charge(const struct inflight *v, __u64 bytes, bool done, bool timed,
				   __u64 now)
{
	struct blk_key key = { .cgroup = v->cgroup, .dev = v->dev, .op = v->op };
	struct blk_stats *s = stats_get(&key);
	if (!s) {
		count_drop(DROP_STATS_FULL);
		return;
	}
	__sync_fetch_and_add(&s->bytes, bytes);
	if (!done)
		return;
	__sync_fetch_and_add(&s->requests, 1);
	if (!timed) {
		__sync_fetch_and_add(&s->untimed, 1);
		return;
	}
	hist_add_shared(&s->queue, v->issue_ts - v->queue_ts);
	hist_add_shared(&s->service, now - v->issue_ts);
}

SEC("tp_btf/block_rq_complete")
int BPF_PROG(rq_complete, struct request *rq, blk_status_t error, unsigned int nr_bytes)
{
	struct rq_key k = rq_key(rq);
	struct inflight *v = bpf_map_lookup_elem(&inflight, &k);
	if (!v)
		return 0; /* issued before we attached */
	/* Issued, even if rq_issue did not see it, when the request was started. */
	bool issued = v->issue_ts || rq_started(rq);
	/* A partial completion (nr_bytes short of what remains) keeps the request in flight. */
	if (nr_bytes < BPF_CORE_READ(rq, __data_len)) {
		if (issued) {
			charge(v, nr_bytes, false, false, 0);
			v->bytes = v->bytes > nr_bytes ? v->bytes - nr_bytes : 0;
		}
		return 0;
	}
	struct inflight c = *v;
	/* Whoever deletes the entry charges the request. The sweep only takes requests that
	 * have ended, which this one has not until it returns, so this always wins. */
	if (bpf_map_delete_elem(&inflight, &k))
		return 0;
	if (!issued)
		return 0; /* ended without being issued */
	if (!c.issue_ts)
		count_drop(DROP_ISSUE_UNSEEN);
	charge(&c, nr_bytes, true, c.issue_ts != 0, bpf_ktime_get_ns());
	return 0;
}

/*
 * Settles one entry of the in-flight table if its request ended without rq_complete (see
 * struct rq_key). A request seen issued is charged its bytes left to complete, untimed; one
 * never seen issued was merged, failed or was issued unseen, and is charged nothing. Either
 * way the unseen completion is counted.
 */
static long sweep_one(struct bpf_map *map, const struct rq_key *kp, const struct inflight *vp,
		      void *unused)
{
	struct rq_key k = *kp;
	struct inflight v = *vp;
	if (!rq_ended(&k))
		return 0;
	/* The entry may be going as the sweep finds it, deleted by its completion before the
	 * struct was freed: then the delete fails, and the completion charged the request. */
	if (bpf_map_delete_elem(&inflight, &k))
		return 0;
	count_drop(DROP_COMPLETION_UNSEEN);
	if (v.issue_ts)
		charge(&v, v.bytes, true, false, 0);
	return 0;
}

/* Attached to nothing: the reader runs it (BPF_PROG_TEST_RUN) before each read. */
SEC("raw_tp")
int sweep(void *ctx)
{
	bpf_for_each_map_elem(&inflight, sweep_one, NULL, 0);
	return 0;
}
