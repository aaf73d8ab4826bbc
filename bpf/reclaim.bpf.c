/* SPDX-License-Identifier: GPL-2.0 OR BSD-3-Clause */
/* Memory reclaim and OOM kills per cgroup: how long tasks stalled in direct reclaim, in memcg
 * reclaim (charging against a memory limit) and in direct compaction, and the pages reclaimed;
 * kswapd's wake-ups and sleeps; OOM kills with the killed task, its cgroup and the memcg whose
 * limit was hit. Cgroups are in the memory hierarchy on v1 hosts. */
#include "common.h"

/* include/linux/sched.h; the value has not changed since 2.6. */
#define PF_KTHREAD 0x00200000

/* How far up from a victim's memcg to look for the one that hit its limit: deeper than any
 * kubepods or nodectl layout. */
#define MAX_MEMCG_DEPTH 16

/* A memcg never seen before is taken for the one that hit its limit only if its usage is this
 * close to its limit, in pages: a charge that failed (up to a 2 MiB huge page) plus the per-CPU
 * charge stock. */
#define LIMIT_SLACK_PAGES 1024

enum drop_reason {
	DROP_STALL_FULL = 0,   /* stalls map full: a new cgroup's stall was not recorded */
	DROP_STORAGE_FAIL = 1, /* task storage could not be created: a stall was not timed */
	DROP_KILLS_FULL = 2,   /* kills map full: a new cgroup's OOM kill was not counted */
	DROP_RING_FULL = 3,    /* kill ring full: an OOM kill's details were lost (still counted) */
};

/* Where a task stalled. */
enum stall_kind {
	STALL_DIRECT = 0,     /* direct reclaim: the page allocator found too little free memory */
	STALL_MEMCG = 1,      /* memcg reclaim: a charge hit the memory limit of the cgroup or an ancestor */
	STALL_COMPACTION = 2, /* direct compaction: no free block of the order asked for */
	STALL_KINDS = 3,
};

/* Node-wide counters. */
enum counter {
	COUNTER_KSWAPD_WAKE = 0,
	COUNTER_KSWAPD_SLEEP = 1,
	COUNTERS = 2,
};

struct stall_key {
	__u64 cgroup;
	__u32 kind; /* enum stall_kind */
	__u32 pad;
};

struct stall_val {
	struct hist stall;
	__u64 pages; /* reclaimed (reclaim kinds only) */
};

/* One OOM kill, as the ring carries it. */
struct oom_kill {
	__u64 ts;        /* bpf_ktime_get_ns (CLOCK_MONOTONIC) */
	__u64 cgroup;    /* the victim's cgroup */
	__u64 limit;     /* the cgroup whose memory limit was hit; 0: none found (a global OOM) */
	__u64 usage;     /* that memcg's usage, pages, at the kill */
	__u64 max;       /* and its limit, pages */
	__u32 pid;       /* thread group id of the victim */
	__u32 tid;       /* the thread marked */
	__u32 trigger;   /* thread group id of the task whose allocation ran the OOM killer */
	__u32 pad;
	char comm[16];
	char trigger_comm[16];
};

/* Per task: when each kind of stall began, 0 when not stalled. */
struct stamps {
	__u64 ts[STALL_KINDS];
};

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct stamps);
} stamps SEC(".maps");

/* max_entries of stalls and kills is set by the loader. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, struct stall_key);
	__type(value, struct stall_val);
} stalls SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, __u64);
} kills SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, COUNTERS);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

/* Per memcg (kernfs id): its local OOM event count when last looked at, to tell which memcg's
 * count grew at a kill. LRU: memcgs are forgotten on their own. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, __u64);
} oom_seen SEC(".maps");

/* Thread groups already counted: a killed process's other threads are marked as victims too as
 * they exit, and must not count as more kills. Keyed by tgid and start time. */
struct victim_key {
	__u32 tgid;
	__u32 pad;
	__u64 start; /* the group leader's start time: tgids are reused */
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1024);
	__type(key, struct victim_key);
	__type(value, __u8);
} victims SEC(".maps");

/* Kills are rare: a small ring, drained at every collection. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 16384);
} ring SEC(".maps");

/* Keep the types in BTF so that bpf2go generates their Go definitions. */
const enum drop_reason *unused_drop_reason __attribute__((unused));
const enum stall_kind *unused_stall_kind __attribute__((unused));
const enum counter *unused_counter __attribute__((unused));
const struct oom_kill *unused_oom_kill __attribute__((unused));

static __always_inline int memory_subsys(void)
{
	return bpf_core_enum_value(enum cgroup_subsys_id, memory_cgrp_id);
}

static __always_inline void count(__u32 c)
{
	__u64 *v = bpf_map_lookup_elem(&counters, &c);
	if (v)
		__sync_fetch_and_add(v, 1);
}

static __always_inline void stall_begin(__u32 kind)
{
	struct task_struct *t = bpf_get_current_task_btf();
	struct stamps *s = bpf_task_storage_get(&stamps, t, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!s) {
		count_drop(DROP_STORAGE_FAIL);
		return;
	}
	if (kind < STALL_KINDS)
		s->ts[kind] = bpf_ktime_get_ns();
}

static __always_inline void stall_end(__u32 kind, __u64 pages)
{
	struct task_struct *t = bpf_get_current_task_btf();
	struct stamps *s = bpf_task_storage_get(&stamps, t, 0, 0);
	if (!s || kind >= STALL_KINDS || !s->ts[kind])
		return; /* began before the tracer attached */
	__u64 delta = bpf_ktime_get_ns() - s->ts[kind];
	s->ts[kind] = 0;

	struct stall_key k = { .cgroup = task_cgroup_id(t, memory_subsys()), .kind = kind };
	struct stall_val *v = bpf_map_lookup_elem(&stalls, &k);
	if (!v) {
		static const struct stall_val zero;
		bpf_map_update_elem(&stalls, &k, &zero, BPF_NOEXIST);
		v = bpf_map_lookup_elem(&stalls, &k);
	}
	if (!v) {
		count_drop(DROP_STALL_FULL);
		return;
	}
	hist_add_shared(&v->stall, delta);
	__sync_fetch_and_add(&v->pages, pages);
}

SEC("tp_btf/mm_vmscan_direct_reclaim_begin")
int BPF_PROG(reclaim_direct_begin)
{
	stall_begin(STALL_DIRECT);
	return 0;
}

SEC("tp_btf/mm_vmscan_direct_reclaim_end")
int BPF_PROG(reclaim_direct_end, unsigned long nr_reclaimed)
{
	stall_end(STALL_DIRECT, nr_reclaimed);
	return 0;
}

SEC("tp_btf/mm_vmscan_memcg_reclaim_begin")
int BPF_PROG(reclaim_memcg_begin)
{
	stall_begin(STALL_MEMCG);
	return 0;
}

SEC("tp_btf/mm_vmscan_memcg_reclaim_end")
int BPF_PROG(reclaim_memcg_end, unsigned long nr_reclaimed)
{
	stall_end(STALL_MEMCG, nr_reclaimed);
	return 0;
}

/* compact_zone runs for kcompactd, proactive compaction and allocating tasks alike: only the
 * last stall a task. */
SEC("tp_btf/mm_compaction_begin")
int BPF_PROG(reclaim_compaction_begin, struct compact_control *cc)
{
	if (cc->direct_compaction)
		stall_begin(STALL_COMPACTION);
	return 0;
}

SEC("tp_btf/mm_compaction_end")
int BPF_PROG(reclaim_compaction_end, struct compact_control *cc)
{
	if (cc->direct_compaction)
		stall_end(STALL_COMPACTION, 0);
	return 0;
}

SEC("tp_btf/mm_vmscan_kswapd_wake")
int BPF_PROG(reclaim_kswapd_wake)
{
	count(COUNTER_KSWAPD_WAKE);
	return 0;
}

SEC("tp_btf/mm_vmscan_kswapd_sleep")
int BPF_PROG(reclaim_kswapd_sleep)
{
	count(COUNTER_KSWAPD_SLEEP);
	return 0;
}

static __always_inline struct mem_cgroup *memcg_of_css(struct cgroup_subsys_state *css)
{
	/* css is the first member of struct mem_cgroup; the offset is relocated all the same. */
	return (void *)css - bpf_core_field_offset(struct mem_cgroup, css);
}

/* Fills k->limit, usage and max with the memcg that hit its limit: walking up from the
 * victim's memcg, the nearest whose local OOM event count grew since the last kill looked at
 * it. The kernel raises it (memcg_memory_event(memcg, MEMCG_OOM)) on the memcg over its limit
 * just before it picks a victim there. A memcg seen for the first time may carry OOM events
 * from before the tracer attached, so it must also be at its limit (memory, or memory+swap on
 * v1). A global OOM raises no memcg's count. */
static __always_inline void find_limit(struct task_struct *victim, struct oom_kill *k)
{
	int oom = bpf_core_enum_value(enum memcg_memory_event, MEMCG_OOM);
	struct cgroup_subsys_state *css = BPF_CORE_READ(victim, cgroups, subsys[memory_subsys()]);

	for (int i = 0; i < MAX_MEMCG_DEPTH && css; i++) {
		struct mem_cgroup *m = memcg_of_css(css);
		struct cgroup_subsys_state *parent = BPF_CORE_READ(css, parent);
		if (!parent)
			break; /* the root memcg has no limit */
		__u64 id = BPF_CORE_READ(css, cgroup, kn, id);
		long events = 0;
		if (oom >= 0 && oom < 16)
			bpf_probe_read_kernel(&events, sizeof(events), &m->memory_events_local[oom]);
		__u64 now = events;
		__u64 *seen = bpf_map_lookup_elem(&oom_seen, &id);
		bool grew = seen ? now > *seen : now > 0;
		__u64 usage = BPF_CORE_READ(m, memory.usage.counter);
		__u64 max = BPF_CORE_READ(m, memory.max);
		if (grew && !seen && usage + LIMIT_SLACK_PAGES < max) {
			__u64 su = BPF_CORE_READ(m, memsw.usage.counter);
			__u64 sm = BPF_CORE_READ(m, memsw.max);
			if (!cgroup_v1 || su + LIMIT_SLACK_PAGES < sm)
				grew = false;
		}
		bpf_map_update_elem(&oom_seen, &id, &now, BPF_ANY);
		if (grew && !k->limit) {
			k->limit = id;
			k->usage = usage;
			k->max = max;
		}
		css = parent;
	}
}

SEC("tp_btf/mark_victim")
int BPF_PROG(reclaim_mark_victim, struct task_struct *task)
{
	struct victim_key vk = {
		.tgid = task->tgid,
		.start = task->group_leader->start_time,
	};
	__u8 one = 1;
	if (bpf_map_lookup_elem(&victims, &vk))
		return 0; /* another thread of a process already counted */
	bpf_map_update_elem(&victims, &vk, &one, BPF_ANY);

	__u64 cg = task_cgroup_id(task, memory_subsys());
	__u64 *n = bpf_map_lookup_elem(&kills, &cg);
	if (!n) {
		__u64 zero = 0;
		/* EEXIST means another CPU raced us in: the lookup below finds its entry. */
		bpf_map_update_elem(&kills, &cg, &zero, BPF_NOEXIST);
		n = bpf_map_lookup_elem(&kills, &cg);
	}
	if (n)
		__sync_fetch_and_add(n, 1);
	else
		count_drop(DROP_KILLS_FULL);

	struct oom_kill *k = bpf_ringbuf_reserve(&ring, sizeof(*k), 0);
	if (!k) {
		count_drop(DROP_RING_FULL);
		return 0;
	}
	__builtin_memset(k, 0, sizeof(*k));
	k->ts = bpf_ktime_get_ns();
	k->cgroup = cg;
	k->pid = task->tgid;
	k->tid = task->pid;
	bpf_probe_read_kernel_str(k->comm, sizeof(k->comm), task->comm);
	struct task_struct *cur = bpf_get_current_task_btf();
	k->trigger = cur->tgid;
	bpf_probe_read_kernel_str(k->trigger_comm, sizeof(k->trigger_comm), cur->comm);
	find_limit(task, k);
	bpf_ringbuf_submit(k, 0);
	return 0;
}
