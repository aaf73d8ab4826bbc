/* SPDX-License-Identifier: GPL-2.0 OR BSD-3-Clause */
/* Cgroups as the kernel makes and removes them: each mkdir's and rmdir's kernfs id, hierarchy
 * and path, on a ring, so that the agent names the ids its other programs record without
 * opening cgroups by file handle (which needs CAP_DAC_READ_SEARCH) or walking the tree. */
#include "common.h"

/* Longer paths are sent cut and marked; the reader falls back to a walk for them. Pod
 * cgroups' paths are under 200 bytes with either kubelet cgroup driver. */
#define CGNAME_PATH_MAX 256

enum drop_reason {
	DROP_RING_FULL = 0, /* ring full: a mkdir or rmdir was not sent (the reader walks) */
};

enum cg_op {
	CG_MKDIR = 0,
	CG_RMDIR = 1,
};

struct cg_event {
	__u64 id;        /* kernfs id: the cgroup directory's inode number */
	__u32 hierarchy; /* the cgroup root's hierarchy id: 0 for v2, as /proc/self/cgroup's first field */
	__u16 op;        /* enum cg_op */
	__u16 len;       /* of path, without its NUL; CGNAME_PATH_MAX: cut */
	char path[CGNAME_PATH_MAX];
};

/* Mkdirs come in bursts (a pod's sandbox and containers, in every v1 hierarchy): room for
 * about a thousand events between two reads. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} ring SEC(".maps");

const enum drop_reason *unused_drop_reason __attribute__((unused));
const enum cg_op *unused_cg_op __attribute__((unused));
const struct cg_event *unused_cg_event __attribute__((unused));

static __always_inline int send(struct cgroup *cgrp, const char *path, __u16 op)
{
	struct cg_event *e = bpf_ringbuf_reserve(&ring, sizeof(*e), 0);
	if (!e) {
		count_drop(DROP_RING_FULL);
		return 0;
	}
	e->id = BPF_CORE_READ(cgrp, kn, id);
	e->hierarchy = BPF_CORE_READ(cgrp, root, hierarchy_id);
	e->op = op;
	long n = bpf_probe_read_kernel_str(e->path, sizeof(e->path), path);
	/* n counts the NUL; a path that filled the buffer was cut. */
	e->len = n <= 0 ? 0 : (n >= CGNAME_PATH_MAX ? CGNAME_PATH_MAX : n - 1);
	bpf_ringbuf_submit(e, 0);
	return 0;
}

/* The path is the kernel's own (cgroup_path: from the hierarchy's root), made for the trace
 * event whenever a probe is attached. */
SEC("tp_btf/cgroup_mkdir")
int BPF_PROG(cgroup_mkdir, struct cgroup *cgrp, const char *path)
{
	return send(cgrp, path, CG_MKDIR);
}

SEC("tp_btf/cgroup_rmdir")
int BPF_PROG(cgroup_rmdir, struct cgroup *cgrp, const char *path)
{
	return send(cgrp, path, CG_RMDIR);
}
