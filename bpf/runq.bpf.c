/* SPDX-License-Identifier: GPL-2.0 OR BSD-3-Clause */
/* Run-queue latency per cgroup (wakeup or preemption to running), and whom the waits are
 * charged to: for each (victim cgroup, preemptor) the number of involuntary switches and the
 * time the victim then waited, and the waits after a wakeup, charged to what ran on the CPU
 * just before the victim got it. Cgroups are in the cpu hierarchy on v1 hosts. */
#include "common.h"

#define TASK_RUNNING 0

/* Preemptor ids that no cgroup can have: kernfs ids start at 1 (the root) and, on 64-bit,
 * stay far below 2^63. */
#define PREEMPTOR_IDLE 0ULL
#define PREEMPTOR_THROTTLED (~0ULL)
#define PREEMPTOR_KERNEL (~1ULL)

/* include/linux/sched.h; the value has not changed since 2.6. */
#define PF_KTHREAD 0x00200000

enum drop_reason {
	DROP_HIST_FULL = 0,    /* latency map full: a new cgroup's wait was not recorded */
	DROP_PAIR_FULL = 1,    /* pairs map full (or out of memory): a wait was not counted */
	DROP_STORAGE_FAIL = 2, /* task storage could not be created or taken (recursion) */
	DROP_DIRTY_FULL = 3,   /* a change could not be marked (dirty maps full): read later */
};

/* How the victim came to wait. */
enum wait_kind {
	WAIT_PREEMPTED = 0, /* switched out while runnable; preemptor took the CPU */
	WAIT_WOKEN = 1,     /* woken up; preemptor ran on the CPU until the victim got it */
};

struct pair_key {
	__u64 victim;
	__u64 preemptor;
	__u32 kind; /* enum wait_kind */
	__u32 pad;
};

struct pair_val {
	__u64 count;   /* waits: preempted, involuntary switches of victim in favour of
			* preemptor; woken, waits after a wakeup behind preemptor */
	__u64 wait_ns; /* their time */
	__u64 epoch;   /* of its last marked change, to mark it once an epoch (see mark) */
};

/* A victim's histogram (on one CPU in a slot, of all in the latency map) and the epoch of its
 * last marked change (see mark). */
struct cell {
	struct hist h;
	__u64 epoch;
};

/* Per-task: when it became runnable and, if it was preempted, who switched it out; if it
 * was woken, PREEMPTOR_THROTTLED when its quota had run out at the time. With the kernel's
 * stamps (kernel_stamps), ts is its run_delay as it last ran. */
struct stamp {
	__u64 ts; /* 0 when the task is not waiting */
	__u64 preemptor;
	__u32 preempted;
	__u32 pad;
};

/* A task's stamp lives in the entry of task_stamps that its pid indexes while it holds that
 * entry, and in its task storage (stamps) where another live task does. An array lookup is
 * inlined into the program and validated by the owner's task pointer and pid: the storage
 * helper it replaces cost about 30 ns of a 200 ns switch under PTI (BenchmarkSwitch). The
 * entries are as many as pids can be, up to a cap (max_entries, a power of two, and
 * task_stamp_mask set by the loader), so that below the cap no two live tasks share one. An
 * entry is taken with the task's first stamp and given back when the task is freed (runq_free)
 * or, a thread that execs, takes its process leader's pid (runq_exec). A task with a stamp in
 * the table has a mark in task storage (stamped), so that a switch to a task without any BPF
 * storage, one never preempted, reads one field of the task and no entry (under the pinned perf
 * bench, whose tasks are never preempted, looking in the table first read the same within
 * noise: 182-194 ns against 178-187). */
struct task_stamp {
	__u64 task; /* the owner; 0 when free */
	__u32 pid;
	__u32 pad;
	struct stamp s;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 32768);
	__type(key, __u32);
	__type(value, struct task_stamp);
} task_stamps SEC(".maps");

volatile const __u32 task_stamp_mask = 32767;

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct stamp);
} stamps SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, __u32);
} stamped SEC(".maps");

/* A pid's entry: pids made one after another (a process's threads, or two processes forked
 * together) are far apart, not on one cache line that their CPUs would write in turn (perf
 * bench's two processes: 40-50 ns a switch). Multiplying by an odd number permutes the
 * entries, so that no two pids below the cap share one. */
static __always_inline __u32 task_index(__u32 pid)
{
	return (pid * 0x9E3779B1U) & task_stamp_mask;
}

/* Whether t has any BPF storage, which a task with a stamp has (see task_stamps). */
static __always_inline bool has_storage(struct task_struct *t)
{
	return !bpf_core_field_exists(t->bpf_storage) || t->bpf_storage;
}

/* t's stamp, made (zeroed) when create is set and it has none: in its pid's entry when that is
 * free (taken by compare-and-swap, as two tasks may reach for it at once), else in its storage.
 * A task with a stamp in storage (made while another task held its entry) keeps it there. A
 * task's own stamp is not raced: its switches and wakeups hold its run queue's lock. */
static __always_inline struct stamp *stamp_of(struct task_struct *t, bool create)
{
	if (!create && !has_storage(t))
		return NULL;
	__u32 idx = task_index(t->pid);
	struct task_stamp *e = bpf_map_lookup_elem(&task_stamps, &idx);
	if (e && e->task == (__u64)t && e->pid == t->pid)
		return &e->s;
	if (has_storage(t)) {
		struct stamp *s = bpf_task_storage_get(&stamps, t, 0, 0);
		if (s)
			return s;
	}
	if (!create)
		return NULL;
	if (e && !e->task && !__sync_val_compare_and_swap(&e->task, 0, (__u64)t)) {
		if (!bpf_task_storage_get(&stamped, t, 0, BPF_LOCAL_STORAGE_GET_F_CREATE)) {
			e->task = 0;
			return NULL;
		}
		e->pid = t->pid;
		__builtin_memset(&e->s, 0, sizeof(e->s));
		return &e->s;
	}
	return bpf_task_storage_get(&stamps, t, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
}

/* A task freed gives its entry back. Freed, not exited: a task can still be preempted, and
 * stamped, between its exit and its last switch. Its pid may have been taken by a task made
 * since, whose entry is its own. */
SEC("tp_btf/sched_process_free")
int BPF_PROG(runq_free, struct task_struct *p)
{
	__u32 idx = task_index(p->pid);
	struct task_stamp *e = bpf_map_lookup_elem(&task_stamps, &idx);
	if (e && e->task == (__u64)p && e->pid == p->pid)
		e->task = 0;
	return 0;
}

/* A thread other than its process's leader that execs takes the leader's pid, and the leader,
 * gone, its old one (de_thread): both entries are given back, and the thread takes one again
 * at its next stamp. */
SEC("tp_btf/sched_process_exec")
int BPF_PROG(runq_exec, struct task_struct *p, pid_t old_pid)
{
	if (old_pid == p->pid)
		return 0;
	__u32 idx = task_index(old_pid);
	struct task_stamp *e = bpf_map_lookup_elem(&task_stamps, &idx);
	if (e && e->task == (__u64)p)
		e->task = 0;
	idx = task_index(p->pid);
	e = bpf_map_lookup_elem(&task_stamps, &idx);
	if (e && e->task && e->task != (__u64)p && e->pid == p->pid)
		e->task = 0;
	return 0;
}

/* The histograms of victims without a slot (see slots) and the pairs without a place in one,
 * one value for all CPUs, added to atomically. Per-CPU maps took their size once per possible CPU
 * in the kernel's memory, allocated at load and charged to the agent's memory cgroup: at 4,096
 * cgroups and 16,384 pairs, about 1.8 MB a CPU, 170 MB on a 96-vCPU node (make test-vm's wide
 * boot measured 52 MB at a test's smaller sizes). Only the slots stay per-CPU, a few KB a CPU.
 * max_entries of both maps is set by the loader. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, struct cell);
} latency SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct pair_key);
	__type(value, struct pair_val);
} pairs SEC(".maps");

/* Each CPU's own histograms and pairs of the victims it sees most, ahead of the latency and
 * pairs hashes: a slot is an array index, found without hashing the key (a hash lookup was
 * about 30 ns of a switch, make bench), written without atomics, picked from the cgroup id and
 * taken by the first victim that lands on it while free. Victims whose slot another holds go to
 * the maps. Slots are freed when their cgroup is removed (runq_rmdir), so that a churn of
 * cgroups leaves them to the living. User space adds each cgroup's slots, on every CPU, to its
 * latency entry, and each pair's to its pairs entry.
 *
 * A victim's pairs are in its slot: a preemptor's is found by a short scan on the page of the
 * histogram, where a pair slot of its own, found by a hash of the pair, was another page and
 * about 20 ns of a switch under PTI (BenchmarkSwitch). A victim's pairs past SLOT_PAIRS go to
 * the pairs map. 512 bytes a slot. */
#define SLOT_PAIRS 4

struct slot_pair {
	__u64 preemptor;
	__u32 kind;  /* enum wait_kind */
	__u32 taken; /* 0 when free */
	struct pair_val val;
};

struct slot {
	__u64 cgroup; /* 0 when free */
	struct cell c;
	struct slot_pair pairs[SLOT_PAIRS];
};

/* How many of a slot's places a pair may take, set by the loader: a test takes fewer to send
 * pairs to the map. Read only when a pair takes a place. */
volatile const __u32 slot_pairs = SLOT_PAIRS;

/* max_entries, a power of two, is set by the loader, and slot_mask to one less. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 64);
	__type(key, __u32);
	__type(value, struct slot);
} slots SEC(".maps");

volatile const __u32 slot_mask = 63;
/* Set by the loader where the kernel has what runq_rmdir needs (bpf_loop, 5.17, and
 * bpf_map_lookup_percpu_elem, 5.19): without it slots would never be freed, and every cgroup
 * goes to the maps. */
volatile const bool use_slots = false;
/* Possible CPUs, set by the loader: runq_rmdir frees a cgroup's slot on each. */
volatile const __u32 nr_cpus = 1;
#define MAX_CPUS 8192

/* A cgroup's slot: high bits of its id times a 64-bit golden ratio (Fibonacci hashing),
 * which spreads ids handed out in sequence. */
static __always_inline __u32 slot_of(__u64 cg)
{
	return (__u32)((cg * 0x9E3779B97F4A7C15ULL) >> 40) & slot_mask;
}

/* The cgroup of the task each CPU switched to last (0: the idle task). User space reads it
 * with the maps: a cgroup on a CPU then may run on for long without a switch, which the
 * latency map would not show, so its counters are read at the next interval too. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} oncpu SEC(".maps");

/* Reading the maps whole costs their size (the slots' times the CPUs) at every interval, to
 * find the few cgroups that changed. So each change is marked, once an epoch per value (a
 * slot's or a shared entry's) and key, in a hash all CPUs share (dirty, dirty_pairs: key to the
 * epoch of the mark), and the reader runs runq_aggregate, which adds up the marked keys' shared
 * entries and slots on every CPU in the kernel and hands over only those sums: the bytes read
 * follow the cgroups and pairs that changed, not the CPUs.
 *
 * A mark is written after the change it announces (an update, under its bucket's lock) and the
 * aggregator deletes a mark before it sums: a mark written after the delete stays for the next
 * read, one written before it comes from a change the sum sees. A program that read the epoch
 * before the aggregator closed it may change a value after the sum without marking it (its CPU
 * marked it in that epoch already): keys marked in the epoch just closed go to a list (again,
 * again_pairs) with the count handed over, and are summed once more at the next read, handed
 * over only if their count grew. The epoch starts at 1, as cleared values are 0. */
volatile __u64 epoch = 1;

/* max_entries of the two is set by the loader, as latency's and pairs'. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, __u64);
} dirty SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct pair_key);
	__type(value, __u64);
} dirty_pairs SEC(".maps");

/* The keys to sum again at the next read, with the count handed over: lists that the
 * aggregator alone writes and reads (one runs at a time), so that the next read walks the keys
 * themselves, not the buckets of a hash sized for every cgroup (walking those was a twentieth of
 * the agent's CPU at 1,000 cgroups, make bench). Two halves, flipped at each read of their kind:
 * the one written at the last read is walked while the other is written. max_entries (twice
 * cgroups_out's and pairs_out's) is set by the loader, and again_half and again_pairs_half to
 * half of it. */
struct again_cgroup {
	__u64 cgroup;
	__u64 count;
};

struct again_pair {
	struct pair_key key;
	__u64 count;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 8192);
	__type(key, __u32);
	__type(value, struct again_cgroup);
} again SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 32768);
	__type(key, __u32);
	__type(value, struct again_pair);
} again_pairs SEC(".maps");

volatile const __u32 again_half = 4096, again_pairs_half = 16384;
/* Entries in each half, and the half the last read wrote. */
__u32 again_n[2], again_pairs_n[2], again_last, again_pairs_last;

/* Entries the programs added to latency and pairs: the reader subtracts what it deleted, for
 * the maps' fill without walking them. */
__u64 latency_added, pairs_added;

/* Marks key changed in this epoch unless its value (whose epoch is *seen: a slot's, or the
 * shared entry's) was marked in it already. A full map is counted and tried again at the next
 * change. Two CPUs may both mark a shared entry; one that finds it marked by another CPU whose
 * mark a read has just taken is in the epoch just closed, which the reader sums again. */
static __always_inline void mark(void *map, const void *key, __u64 *seen)
{
	__u64 e = epoch;
	if (*seen == e)
		return;
	if (bpf_map_update_elem(map, key, &e, BPF_ANY)) {
		count_drop(DROP_DIRTY_FULL);
		return;
	}
	*seen = e;
}

/* Set by the loader from its probes of the same fields (features.HaveKernelStamps and
 * HaveSchedInfo; see kernel_stamps and queued_wait). A test clears them to trace the way a
 * kernel without them is traced. */
volatile const bool use_kernel_stamps = false;
volatile const bool use_enqueue_stamp = false;

/* Keep the enums in BTF so that bpf2go generates their Go constants. */
const enum drop_reason *unused_drop_reason __attribute__((unused));
const enum wait_kind *unused_wait_kind __attribute__((unused));

/* The task's cgroup id, as task_cgroup_id in common.h, by direct BTF loads: tp_btf arguments
 * are trusted pointers, and plain loads cost a fraction of the probe-read helper calls of
 * BPF_CORE_READ on this hot path. A NULL on the way faults safely and yields 0. */
static __always_inline __u64 cgroup_of(struct task_struct *t)
{
	if (cgroup_v1)
		return t->cgroups->subsys[bpf_core_enum_value(enum cgroup_subsys_id, cpu_cgrp_id)]
			->cgroup->kn->id;
	return t->cgroups->dfl_cgrp->kn->id;
}

/* Each CPU's cgroup ids of the tasks it switched to lately, by the pointer their walk starts
 * from (v1: the task's css of the cpu controller, v2: its cgroup), and the task it switched to
 * last with its id. The walk to a cgroup's id is four dependent loads on four pages, and where
 * the kernel flushes the TLB at every entry (PTI without PCID: this repository's test machines)
 * each page costs a walk of the page tables: the cache took 20-30 ns off a 200 ns switch
 * (BenchmarkSwitch). A css or cgroup freed may have its memory taken by one made later: every
 * cgroup made bumps cgroups_made (runq_mkdir), and a CPU whose cache is of an older count
 * empties it first. No task is in a new cgroup before its mkdir has returned. */
#define IDS_CACHED 8

struct recent_ids {
	__u64 made;        /* cgroups_made when the entries were filled */
	__u64 task;        /* the task this CPU switched to last, */
	__u64 task_cgroup; /* and its cgroup id */
	__u32 next;        /* the entry to fill next, round robin */
	__u32 pad;
	struct {
		__u64 key; /* the css or cgroup pointer; 0: free */
		__u64 id;
	} e[IDS_CACHED];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct recent_ids);
} recent_ids SEC(".maps");

__u64 cgroups_made;

SEC("tp_btf/cgroup_mkdir")
int BPF_PROG(runq_mkdir, struct cgroup *cgrp, const char *path)
{
	__sync_fetch_and_add(&cgroups_made, 1);
	return 0;
}

/* This CPU's cache, emptied if a cgroup was made since it was filled. */
static __always_inline struct recent_ids *recent_ids_here(void)
{
	__u32 zero = 0;
	struct recent_ids *r = bpf_map_lookup_elem(&recent_ids, &zero);
	if (!r)
		return NULL;
	__u64 made = cgroups_made;
	if (r->made != made) {
		__builtin_memset(r, 0, sizeof(*r));
		r->made = made;
	}
	return r;
}

/* cgroup_of(t), from this CPU's cache when the walk's start is in it. */
static __always_inline __u64 cgroup_cached(struct recent_ids *r, struct task_struct *t)
{
	if (!r)
		return cgroup_of(t);
	__u64 key;
	if (cgroup_v1)
		key = (__u64)t->cgroups->subsys[bpf_core_enum_value(enum cgroup_subsys_id, cpu_cgrp_id)];
	else
		key = (__u64)t->cgroups->dfl_cgrp;
	if (!key)
		return 0;
	for (int i = 0; i < IDS_CACHED; i++)
		if (r->e[i].key == key)
			return r->e[i].id;
	__u64 id = cgroup_of(t);
	__u32 i = r->next % IDS_CACHED;
	r->next = i + 1;
	r->e[i].id = id;
	r->e[i].key = key;
	return id;
}

/* The task's CFS runqueue or one of its ancestors is out of quota. throttle_count is raised on
 * every cfs_rq below a throttled one, both with the old throttling (which dequeues the group)
 * and with 6.18's task-based one, where the task may be switched out before or after its
 * throttle work dequeued it. */
static __always_inline bool throttled(struct task_struct *t)
{
	if (!bpf_core_field_exists(t->se.cfs_rq) ||
	    !bpf_core_field_exists(struct cfs_rq, throttle_count))
		return false;
	struct cfs_rq *cfs = t->se.cfs_rq;
	return cfs && cfs->throttle_count > 0;
}

/* Whether t's cgroup, or one of the three above it, began a throttling after since (the run
 * queue's clock): before 6.18 a task woken while its quota lasted stays queued through a
 * throttling that begins while it waits, which its wakeup's stamp cannot know (6.1 in make
 * test-vm: a capped sleeper's waits charged to its neighbour). A pod's quota throttles above
 * its containers' cgroups. */
static __always_inline bool throttled_since(struct task_struct *t, __u64 since)
{
	if (!bpf_core_field_exists(struct cfs_rq, throttled_clock) ||
	    !bpf_core_field_exists(struct sched_entity, parent))
		return false;
	struct sched_entity *se = &t->se;
	for (int i = 0; i < 4 && se; i++) {
		struct cfs_rq *cfs = se->cfs_rq;
		if (!cfs)
			return false;
		if (cfs->throttled_clock > since)
			return true;
		se = se->parent;
	}
	return false;
}

/* Whom a wait for t is charged to: the idle task, a kernel thread (kworker, ksoftirqd, jbd2,
 * kswapd: system work, whichever cgroup it sits in), or a user task's cgroup. A task is in
 * the cgroup its switch-in found it in, last: the task this CPU switched to last, and its
 * cgroup (one moved while it ran is charged to the one it ran in). */
static __always_inline __u64 preemptor_of(struct task_struct *t, struct recent_ids *r, __u64 last,
					  __u64 last_cgroup)
{
	if (!t->pid)
		return PREEMPTOR_IDLE;
	if (t->flags & PF_KTHREAD)
		return PREEMPTOR_KERNEL;
	return last == (__u64)t ? last_cgroup : cgroup_cached(r, t);
}

/* The histogram of cg's waits on this CPU: its slot's (*slot) when it holds it or takes it
 * now, else its entry in the latency map (also for id 0, an unreadable cgroup, which marks a
 * free slot), which all CPUs share: *slot is NULL. */
static __always_inline struct cell *victim_cell(__u64 cg, struct slot **slot)
{
	__u32 idx = slot_of(cg);
	struct slot *sl = use_slots ? bpf_map_lookup_elem(&slots, &idx) : NULL;
	*slot = sl;
	if (sl && cg) {
		if (sl->cgroup == cg)
			return &sl->c;
		if (!sl->cgroup) {
			/* Cleared before it is owned, so that a reader never sees the counts of
			 * the removed cgroup that held it under the new one's id. */
			__builtin_memset(&sl->c, 0, sizeof(*sl) - sizeof(sl->cgroup));
			barrier();
			sl->cgroup = cg;
			return &sl->c;
		}
	}
	*slot = NULL;
	struct cell *c = bpf_map_lookup_elem(&latency, &cg);
	if (c)
		return c;
	static const struct cell zero;
	/* EEXIST: another CPU raced us in, and the lookup below finds its entry. */
	if (!bpf_map_update_elem(&latency, &cg, &zero, BPF_NOEXIST))
		__sync_fetch_and_add(&latency_added, 1);
	return bpf_map_lookup_elem(&latency, &cg);
}

/* bpf_loop's step i over the slots of every CPU: frees the pairs of the one at i whose
 * preemptor is the removed cgroup *id. */
static long free_slot_pairs(__u64 i, void *ctx)
{
	__u64 id = *(__u64 *)ctx;
	__u32 cpu = i / (slot_mask + 1);
	__u32 idx = i & slot_mask;
	struct slot *sl = bpf_map_lookup_percpu_elem(&slots, &idx, cpu);
	if (!sl || !sl->cgroup)
		return 0;
	for (int j = 0; j < SLOT_PAIRS; j++)
		if (sl->pairs[j].taken && sl->pairs[j].preemptor == id)
			sl->pairs[j].taken = 0;
	return 0;
}

/* A removed cgroup of the hierarchy the ids are from gives up its slot, with its pairs, and
 * its place as preemptor in other victims' slots, on every CPU. It has no task left to wait,
 * so no CPU writes its slot meanwhile (a pair of it as preemptor may still be charged, to a
 * task that waited behind it since before: counted anew, of a cgroup that is gone); the CPU
 * that takes a slot or a pair's place next clears it (victim_cell, pair_get). The other
 * hierarchies' ids are numbered apart and may be equal. */
SEC("tp_btf/cgroup_rmdir")
int BPF_PROG(runq_rmdir, struct cgroup *cgrp, const char *path)
{
	struct task_struct *t = bpf_get_current_task_btf();
	struct cgroup *ours = cgroup_v1 ?
		t->cgroups->subsys[bpf_core_enum_value(enum cgroup_subsys_id, cpu_cgrp_id)]->cgroup :
		t->cgroups->dfl_cgrp;
	if (!ours || cgrp->root != ours->root)
		return 0;
	__u64 id = cgrp->kn->id;
	__u32 idx = slot_of(id);
	for (__u32 cpu = 0; cpu < nr_cpus && cpu < MAX_CPUS; cpu++) {
		struct slot *sl = bpf_map_lookup_percpu_elem(&slots, &idx, cpu);
		if (sl && sl->cgroup == id)
			sl->cgroup = 0;
	}
	/* A cgroup preempts any other: every slot of every CPU, a few µs a CPU, once per removed
	 * cgroup. */
	bpf_loop(nr_cpus * (slot_mask + 1), free_slot_pairs, &id, 0);
	return 0;
}

/* The counters of pair k on this CPU: its place in its victim's slot (sl, or NULL) when it
 * holds one or takes a free one now, else its entry in the pairs map, which all CPUs share:
 * *shared says so. */
static __always_inline struct pair_val *pair_get(struct pair_key *k, struct slot *sl, bool *shared)
{
	*shared = false;
	if (sl) {
		int free = -1;
		for (int j = 0; j < SLOT_PAIRS; j++) {
			struct slot_pair *p = &sl->pairs[j];
			if (!p->taken) {
				if (free < 0)
					free = j;
				continue;
			}
			if (p->preemptor == k->preemptor && p->kind == k->kind)
				return &p->val;
		}
		if (free >= 0 && free < SLOT_PAIRS && free < slot_pairs) {
			/* Cleared, then taken. */
			struct slot_pair *p = &sl->pairs[free];
			p->val.count = 0;
			p->val.wait_ns = 0;
			p->val.epoch = 0;
			p->preemptor = k->preemptor;
			p->kind = k->kind;
			barrier();
			p->taken = 1;
			return &p->val;
		}
	}
	*shared = true;
	struct pair_val *v = bpf_map_lookup_elem(&pairs, k);
	if (v)
		return v;
	static const struct pair_val zero;
	if (!bpf_map_update_elem(&pairs, k, &zero, BPF_NOEXIST))
		__sync_fetch_and_add(&pairs_added, 1);
	return bpf_map_lookup_elem(&pairs, k);
}

/* Now, by the clock of the run queue t is on: the scheduler has just updated it at every
 * wakeup and switch, and reading it costs three loads where bpf_ktime_get_ns cost a helper
 * call and a clocksource read (make bench). It is the clock the kernel's own enqueue stamp
 * is in (queued_wait). 0 when t has no CFS queue, which no wait is stamped with. Kernels
 * whose CFS queues do not point to their run queue use the monotonic clock throughout. */
static __always_inline __u64 clock_of(struct task_struct *t)
{
	if (!bpf_core_field_exists(struct cfs_rq, rq))
		return bpf_ktime_get_ns();
	struct cfs_rq *cfs = t->se.cfs_rq;
	return cfs ? cfs->rq->clock : 0;
}

static __always_inline void stamp_wakeup(struct task_struct *t)
{
	struct stamp *s = stamp_of(t, true);
	if (!s) {
		count_drop(DROP_STORAGE_FAIL);
		return;
	}
	/* A task preempted while it was going to sleep can be woken while it waits: keep the
	 * preemption, it is still waiting since then. */
	if (s->ts && s->preempted)
		return;
	s->ts = clock_of(t);
	s->preempted = 0;
	s->preemptor = throttled(t) ? PREEMPTOR_THROTTLED : PREEMPTOR_IDLE;
}

SEC("tp_btf/sched_wakeup")
int BPF_PROG(runq_wakeup, struct task_struct *p)
{
	stamp_wakeup(p);
	return 0;
}

/* sched_wakeup is attached only where the kernel lacks the stamps (kernel_stamps) and
 * sched_wakeup_new only where it keeps no enqueue time (queued_wait): creating a task's
 * storage here cost every fork about 2 µs, more than the reference tracer's hash insert. */
SEC("tp_btf/sched_wakeup_new")
int BPF_PROG(runq_wakeup_new, struct task_struct *p)
{
	stamp_wakeup(p);
	return 0;
}

/* The kernel keeps every stamp the waits need itself: each task's enqueue time and the waits
 * a migration between CPUs split off (CONFIG_SCHED_INFO: sched_info.last_queued, run_delay, in
 * the run queue's clock), and a task whose quota ran out is switched out runnable, like a
 * preempted one (the task-based throttling of 6.18: task_struct.throttle_node). Then no
 * program runs on a wakeup: a task's wait is its time queued on the CPU it runs on plus
 * run_delay's growth since it last ran (see sched_switch). The loader probes the same fields
 * (features.HaveKernelStamps) to leave sched_wakeup unattached. */
static __always_inline bool kernel_stamps(void)
{
	return use_kernel_stamps && bpf_core_field_exists(struct sched_info, last_queued) &&
	       bpf_core_field_exists(struct sched_info, run_delay) &&
	       bpf_core_field_exists(struct cfs_rq, rq) &&
	       bpf_core_field_exists(struct task_struct, throttle_node);
}

/* Whether the kernel stamped t's enqueue (CONFIG_SCHED_INFO: the rq clock then, read before
 * sched_info_arrive clears it), and how long t has been queued on this CPU since: a wait of
 * 0 ns (picked before the clock moved) is a wait too, as the kernel counts it. */
static __always_inline bool queued_wait(struct task_struct *t, __u64 now, __u64 *wait)
{
	if (!use_enqueue_stamp || !bpf_core_field_exists(t->sched_info.last_queued) ||
	    !bpf_core_field_exists(struct cfs_rq, rq))
		return false;
	__u64 queued = t->sched_info.last_queued;
	*wait = now > queued ? now - queued : 0;
	return queued != 0;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(runq_switch, bool preempt, struct task_struct *prev, struct task_struct *next,
	     unsigned int prev_state)
{
	__u64 now = clock_of(next);
	struct recent_ids *r = recent_ids_here();
	__u64 last = 0, last_cgroup = 0;
	__u64 cg = next->pid ? cgroup_cached(r, next) : 0;
	if (r) {
		last = r->task;
		last_cgroup = r->task_cgroup;
		r->task = (__u64)next;
		r->task_cgroup = cg;
	}
	struct stamp *s;

	/* prev stays runnable: preempted, out of its slice, yielding or throttled. Checked by
	 * state, not only by the preempt flag: on 6.18 a busy task whose slice ran out switches
	 * with preempt false and TASK_RUNNING, as the reschedule happens on return to user space.
	 * The idle task never waits. With the kernel's stamps ts is prev's run_delay, which it
	 * was at its switch-in (see there); else the time. */
	if (prev->pid && (preempt || prev_state == TASK_RUNNING)) {
		s = stamp_of(prev, true);
		if (s) {
			s->ts = kernel_stamps() ? prev->sched_info.run_delay : now;
			s->preempted = 1;
			s->preemptor = throttled(prev)		     ? PREEMPTOR_THROTTLED :
				       !next->pid		     ? PREEMPTOR_IDLE :
				       (next->flags & PF_KTHREAD) ? PREEMPTOR_KERNEL :
								    cg;
		} else {
			count_drop(DROP_STORAGE_FAIL);
		}
	}

	__u32 zero = 0;
	__u64 *cur = bpf_map_lookup_elem(&oncpu, &zero);
	if (cur)
		*cur = cg;
	if (!next->pid)
		return 0;
	s = stamp_of(next, false);
	__u64 delta = 0, woken_at = 0;
	__u64 preemptor = PREEMPTOR_IDLE;
	bool preempted = false;
	if (kernel_stamps()) {
		/* The wait so far on this CPU, and what migrations split off since the task last
		 * ran: run_delay's growth since then. ts is run_delay as sched_info_arrive leaves
		 * it once this switch is done, kept only for a task with a stamp: one that was
		 * preempted once since the tracer started (a task that only ever sleeps gets none,
		 * and forks and wakeups allocate nothing; its waits a migration split are counted
		 * from the migration). */
		if (!queued_wait(next, now, &delta))
			return 0;
		if (s) {
			__u64 delay = next->sched_info.run_delay;
			__u64 split = delay - s->ts;
			s->ts = delay + delta;
			delta += split;
			preempted = s->preempted;
			if (preempted)
				preemptor = s->preemptor;
			s->preempted = 0;
		}
	} else if (s) {
		if (!s->ts)
			return 0;
		delta = now > s->ts ? now - s->ts : 0;
		woken_at = s->ts;
		s->ts = 0;
		preemptor = s->preemptor;
		preempted = s->preempted;
		s->preempted = 0;
	} else {
		/* A task's first wait after its fork, which no stamp of ours saw: where the kernel
		 * keeps its enqueue time no program runs on sched_wakeup_new, and the task gets
		 * a stamp only when it is first preempted or woken. A wait a migration split is
		 * counted from the migration. */
		if (!queued_wait(next, now, &delta))
			return 0;
	}

	bool shared;
	struct slot *sl;
	struct cell *c = victim_cell(cg, &sl);
	if (c) {
		shared = !sl;
		if (shared)
			hist_add_shared(&c->h, delta);
		else
			hist_add(&c->h, delta);
		mark(&dirty, &cg, &c->epoch);
	} else {
		count_drop(DROP_HIST_FULL);
	}

	struct pair_key k = { .victim = cg, .preemptor = preemptor };
	if (!preempted) {
		/* Woken: charged to the last task that held the CPU before next, unless its
		 * quota was out at the wakeup or ran out while it waited (throttled_since; 6.18's
		 * throttling switches the task out instead, a preemption). From an idle CPU it
		 * waited for nobody, and costs no lookup. */
		k.kind = WAIT_WOKEN;
		if (k.preemptor != PREEMPTOR_THROTTLED)
			k.preemptor = woken_at && throttled_since(next, woken_at) ? PREEMPTOR_THROTTLED :
										    preemptor_of(prev, r, last, last_cgroup);
		if (k.preemptor == PREEMPTOR_IDLE)
			return 0;
	}
	/* The preemption is counted here too, not when it happened: one switch then adds at
	 * most one pair (with per-CPU maps a second insert in the same switch failed: their
	 * allocator keeps about one free value per CPU at hand). */
	struct pair_val *v = pair_get(&k, sl, &shared);
	if (!v) {
		count_drop(DROP_PAIR_FULL);
		return 0;
	}
	if (shared) {
		__sync_fetch_and_add(&v->count, 1);
		__sync_fetch_and_add(&v->wait_ns, delta);
	} else {
		v->count += 1;
		v->wait_ns += delta;
	}
	mark(&dirty_pairs, &k, &v->epoch);
	return 0;
}

/* What runq_aggregate hands over: each changed cgroup's histogram and pair summed over the CPUs
 * (slots included), and the cgroups on a CPU, out_cgroups, out_pairs and out_oncpu of each.
 * Sized by the loader: as dirty, dirty_pairs and the possible CPUs. */
struct cgroup_sum {
	__u64 cgroup;
	struct hist h;
};

struct pair_sum {
	struct pair_key key;
	struct pair_val val;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct cgroup_sum);
} cgroups_out SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct pair_sum);
} pairs_out SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} oncpu_out SEC(".maps");

__u32 out_cgroups, out_pairs, out_oncpu;

/* One key being summed: which, where its sum goes, and its slot. */
struct agg {
	__u64 cgroup;
	struct pair_key pair;
	__u32 out;
	__u32 slot;
	__u64 closed; /* the epoch the aggregator closed */
	__u32 half;   /* of the again lists, being walked or written */
};

/* Whether output array out has an entry i. */
static __always_inline bool room(void *out, __u32 i)
{
	return bpf_map_lookup_elem(out, &i) != NULL;
}

static __always_inline void hist_sum(struct hist *to, const struct hist *from)
{
	for (int i = 0; i < HIST_SLOTS; i++)
		to->slots[i] += from->slots[i];
	to->count += from->count;
	to->sum_ns += from->sum_ns;
}

/* bpf_loop's step over CPUs: adds CPU cpu's slot of a->cgroup. */
static long sum_cgroup_on(__u64 cpu, void *ctx)
{
	struct agg *a = ctx;
	struct cgroup_sum *o = bpf_map_lookup_elem(&cgroups_out, &a->out);
	if (!o)
		return 1;
	struct slot *sl = bpf_map_lookup_percpu_elem(&slots, &a->slot, cpu);
	if (sl && sl->cgroup == a->cgroup)
		hist_sum(&o->h, &sl->c.h);
	return 0;
}

static long sum_pair_on(__u64 cpu, void *ctx)
{
	struct agg *a = ctx;
	struct pair_sum *o = bpf_map_lookup_elem(&pairs_out, &a->out);
	if (!o)
		return 1;
	struct slot *sl = bpf_map_lookup_percpu_elem(&slots, &a->slot, cpu);
	if (!sl || sl->cgroup != a->pair.victim)
		return 0;
	for (int j = 0; j < SLOT_PAIRS; j++) {
		struct slot_pair *p = &sl->pairs[j];
		if (p->taken && p->preemptor == a->pair.preemptor && p->kind == a->pair.kind) {
			o->val.count += p->val.count;
			o->val.wait_ns += p->val.wait_ns;
		}
	}
	return 0;
}

/* The walks below delete the element they are at and insert into no map they walk: an element
 * freed and taken again at once would lead the walk into another chain. */

/* Sums cgroup cg into the next output and hands it over if its count is above base. False
 * when the output is full. */
static __always_inline bool hand_cgroup(__u64 cg, __u64 base, struct agg *a, __u64 *count)
{
	__u32 i = out_cgroups;
	struct cgroup_sum *o = bpf_map_lookup_elem(&cgroups_out, &i);
	if (!o)
		return false;
	__builtin_memset(o, 0, sizeof(*o));
	o->cgroup = cg;
	a->cgroup = cg;
	a->out = i;
	a->slot = slot_of(cg);
	struct cell *c = bpf_map_lookup_elem(&latency, &cg);
	if (c)
		hist_sum(&o->h, &c->h);
	if (use_slots)
		bpf_loop(nr_cpus, sum_cgroup_on, a, 0);
	*count = o->h.count;
	if (o->h.count > base)
		out_cgroups = i + 1;
	return true;
}

/* A marked cgroup: deleted, summed and handed over; if it was marked in the epoch just closed
 * (or since), listed to be summed again at the next read. A key listed at the last read and
 * marked again is summed here, not there (aggregate_cgroup_again), and handed over whatever its
 * count: a mark comes after a change. */
static long aggregate_cgroup(struct bpf_map *map, __u64 *key, __u64 *marked, struct agg *a)
{
	__u64 cg = *key, was = *marked, count;
	if (!room(&cgroups_out, out_cgroups))
		return 1; /* the rest stay marked for the next read */
	bpf_map_delete_elem(&dirty, &cg);
	if (!hand_cgroup(cg, 0, a, &count))
		return 1;
	__u32 n = again_n[a->half & 1];
	if (was >= a->closed && n < again_half) {
		__u32 i = (a->half & 1) * again_half + n;
		struct again_cgroup *l = bpf_map_lookup_elem(&again, &i);
		if (l) {
			l->cgroup = cg;
			l->count = count;
			again_n[a->half & 1] = n + 1;
		}
	}
	return 0;
}

/* bpf_loop's step i over the cgroups listed at the last read: summed once more, handed over
 * if their count grew, unless marked since. */
static long aggregate_cgroup_again(__u64 i, void *ctx)
{
	struct agg *a = ctx;
	__u32 at = (a->half & 1) * again_half + (__u32)i;
	struct again_cgroup *l = bpf_map_lookup_elem(&again, &at);
	if (!l)
		return 1;
	__u64 cg = l->cgroup, count;
	if (bpf_map_lookup_elem(&dirty, &cg))
		return 0;
	if (!room(&cgroups_out, out_cgroups))
		return 1;
	hand_cgroup(cg, l->count, a, &count);
	return 0;
}

static __always_inline bool hand_pair(struct pair_key *k, __u64 base, struct agg *a, __u64 *count)
{
	__u32 i = out_pairs;
	struct pair_sum *o = bpf_map_lookup_elem(&pairs_out, &i);
	if (!o)
		return false;
	__builtin_memset(o, 0, sizeof(*o));
	o->key = *k;
	a->pair = *k;
	a->out = i;
	a->slot = slot_of(k->victim);
	struct pair_val *v = bpf_map_lookup_elem(&pairs, k);
	if (v) {
		o->val.count += v->count;
		o->val.wait_ns += v->wait_ns;
	}
	if (use_slots)
		bpf_loop(nr_cpus, sum_pair_on, a, 0);
	*count = o->val.count;
	if (o->val.count > base)
		out_pairs = i + 1;
	return true;
}

static long aggregate_pair(struct bpf_map *map, struct pair_key *key, __u64 *marked, struct agg *a)
{
	struct pair_key k = *key;
	__u64 was = *marked, count;
	if (!room(&pairs_out, out_pairs))
		return 1;
	bpf_map_delete_elem(&dirty_pairs, &k);
	if (!hand_pair(&k, 0, a, &count))
		return 1;
	__u32 n = again_pairs_n[a->half & 1];
	if (was >= a->closed && n < again_pairs_half) {
		__u32 i = (a->half & 1) * again_pairs_half + n;
		struct again_pair *l = bpf_map_lookup_elem(&again_pairs, &i);
		if (l) {
			l->key = k;
			l->count = count;
			again_pairs_n[a->half & 1] = n + 1;
		}
	}
	return 0;
}

static long aggregate_pair_again(__u64 i, void *ctx)
{
	struct agg *a = ctx;
	__u32 at = (a->half & 1) * again_pairs_half + (__u32)i;
	struct again_pair *l = bpf_map_lookup_elem(&again_pairs, &at);
	if (!l)
		return 1;
	struct pair_key k = l->key;
	__u64 count;
	if (bpf_map_lookup_elem(&dirty_pairs, &k))
		return 0;
	if (!room(&pairs_out, out_pairs))
		return 1;
	hand_pair(&k, l->count, a, &count);
	return 0;
}

static long collect_oncpu(__u64 cpu, void *ctx)
{
	__u32 zero = 0;
	__u64 *cg = bpf_map_lookup_percpu_elem(&oncpu, &zero, cpu);
	if (!cg || !*cg)
		return 0;
	__u32 i = out_oncpu;
	__u64 *o = bpf_map_lookup_elem(&oncpu_out, &i);
	if (!o)
		return 1;
	*o = *cg;
	out_oncpu = i + 1;
	return 0;
}

/* Attached to nothing: the reader runs it (BPF_PROG_TEST_RUN) at each read, with ctx[0] 1 to
 * hand over the pairs too (else they stay marked for a later read), and reads the outputs. A
 * key past an output's size waits, still marked, for the next read. */
SEC("raw_tp")
int runq_aggregate(__u64 *ctx)
{
	struct agg a = { .closed = __sync_fetch_and_add(&epoch, 1) };
	bool with_pairs = ctx[0];
	out_cgroups = 0;
	out_pairs = 0;
	out_oncpu = 0;
	/* The list of the last read first: what does not fit in the output is not summed again,
	 * where a marked key left over waits for the next read. Then the other half is written. */
	a.half = again_last;
	bpf_loop(again_n[a.half & 1], aggregate_cgroup_again, &a, 0);
	a.half = again_last = a.half ^ 1;
	again_n[a.half & 1] = 0;
	bpf_for_each_map_elem(&dirty, aggregate_cgroup, &a, 0);
	if (with_pairs) {
		a.half = again_pairs_last;
		bpf_loop(again_pairs_n[a.half & 1], aggregate_pair_again, &a, 0);
		a.half = again_pairs_last = a.half ^ 1;
		again_pairs_n[a.half & 1] = 0;
		bpf_for_each_map_elem(&dirty_pairs, aggregate_pair, &a, 0);
	}
	bpf_loop(nr_cpus, collect_oncpu, NULL, 0);
	return 0;
}
