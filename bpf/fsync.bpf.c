/* SPDX-License-Identifier: GPL-2.0 OR BSD-3-Clause */
/* fsync family latency per cgroup, device and syscall, taken at one of two sets of hooks
 * (the loader attaches one):
 *  - ext4's own tracepoints around ext4_sync_file, where every fsync of a file on ext4 goes
 *    (the syscalls, msync, io_uring, an overlay's fsync of its upper file): they cost nothing
 *    outside a sync;
 *  - the syscall tracepoints of fsync, fdatasync and sync_file_range, for any filesystem. Any
 *    syscall tracepoint enabled puts every syscall of every task on the traced slow path,
 *    which cost getppid about 80 ns more on 6.18 (make bench): they are the fallback for
 *    nodes with other writable block filesystems. */
#include "common.h"

enum fsync_syscall {
	SYSCALL_FSYNC = 0,
	SYSCALL_FDATASYNC = 1,
	SYSCALL_SYNC_FILE_RANGE = 2,
};

/* Indexes into the drops array (common.h). */
enum drop_reason {
	DROP_LATENCY_FULL = 0,  /* latency map full: a call with a new key was not recorded */
	DROP_INFLIGHT_FULL = 1, /* too many threads inside these syscalls at once: a call was lost */
};

/* Keeps enum drop_reason in BTF so that bpf2go generates its Go constants. */
const enum drop_reason *unused_drop_reason __attribute__((unused));

#define MAX_INFLIGHT 16384

struct fsync_key {
	__u64 cgroup; /* blkio hierarchy on v1, default hierarchy on v2 */
	__u32 dev; /* superblock device (kernel dev_t) of the file, 0 when unreadable */
	enum fsync_syscall syscall;
};

struct inflight {
	__u64 ts;
	__u32 dev;
	enum fsync_syscall syscall;
};

/* Keyed by pid_tgid: a thread is in at most one syscall at a time. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_INFLIGHT);
	__type(key, __u64);
	__type(value, struct inflight);
} inflight SEC(".maps");

/* max_entries is set by the loader. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct fsync_key);
	__type(value, struct hist);
} latency SEC(".maps");

/* The task's cgroup in the io hierarchy. A kernel without the io controller (no
 * CONFIG_BLK_CGROUP) has no blkio hierarchy either: the default hierarchy's id stands in. */
static __always_inline __u64 io_cgroup_id(struct task_struct *t)
{
	if (bpf_core_enum_value_exists(enum cgroup_subsys_id, io_cgrp_id))
		return task_cgroup_id(t, bpf_core_enum_value(enum cgroup_subsys_id, io_cgrp_id));
	return BPF_CORE_READ(t, cgroups, dfl_cgrp, kn, id);
}

/* The device of the filesystem holding fd: current->files->fdt->fd[fd]->f_inode->i_sb->s_dev. */
static __always_inline __u32 fd_dev(struct task_struct *task, unsigned long fd)
{
	struct fdtable *fdt = BPF_CORE_READ(task, files, fdt);
	if (!fdt)
		return 0;
	if (fd >= BPF_CORE_READ(fdt, max_fds))
		return 0;
	struct file **fds = BPF_CORE_READ(fdt, fd);
	struct file *f = NULL;
	if (bpf_probe_read_kernel(&f, sizeof(f), &fds[fd]) || !f)
		return 0;
	return BPF_CORE_READ(f, f_inode, i_sb, s_dev);
}

static __always_inline int begin(__u32 dev, enum fsync_syscall sc)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct inflight v = { .ts = bpf_ktime_get_ns(), .dev = dev, .syscall = sc };
	if (bpf_map_update_elem(&inflight, &id, &v, BPF_ANY))
		count_drop(DROP_INFLIGHT_FULL);
	return 0;
}

static __always_inline int enter(struct trace_event_raw_sys_enter *ctx, enum fsync_syscall sc)
{
	return begin(fd_dev((struct task_struct *)bpf_get_current_task(), ctx->args[0]), sc);
}

static __always_inline int leave(void)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct inflight *v = bpf_map_lookup_elem(&inflight, &id);
	if (!v)
		return 0; /* entered before we attached, or the entry was dropped */
	__u64 delta = bpf_ktime_get_ns() - v->ts;
	struct fsync_key k = {
		.cgroup = io_cgroup_id((struct task_struct *)bpf_get_current_task()),
		.dev = v->dev,
		.syscall = v->syscall,
	};
	bpf_map_delete_elem(&inflight, &id);
	struct hist *h = hist_get(&latency, &k);
	if (!h) {
		count_drop(DROP_LATENCY_FULL);
		return 0;
	}
	hist_add_shared(h, delta);
	return 0;
}

SEC("tracepoint/syscalls/sys_enter_fsync")
int enter_fsync(struct trace_event_raw_sys_enter *ctx)
{
	return enter(ctx, SYSCALL_FSYNC);
}

SEC("tracepoint/syscalls/sys_exit_fsync")
int exit_fsync(void *ctx)
{
	return leave();
}

SEC("tracepoint/syscalls/sys_enter_fdatasync")
int enter_fdatasync(struct trace_event_raw_sys_enter *ctx)
{
	return enter(ctx, SYSCALL_FDATASYNC);
}

SEC("tracepoint/syscalls/sys_exit_fdatasync")
int exit_fdatasync(void *ctx)
{
	return leave();
}

SEC("tracepoint/syscalls/sys_enter_sync_file_range")
int enter_sync_file_range(struct trace_event_raw_sys_enter *ctx)
{
	return enter(ctx, SYSCALL_SYNC_FILE_RANGE);
}

SEC("tracepoint/syscalls/sys_exit_sync_file_range")
int exit_sync_file_range(void *ctx)
{
	return leave();
}

/* ext4_sync_file's own: the file's device is at hand (an overlay's fsync arrives here with
 * its upper file, on the real disk), and datasync tells fdatasync from fsync. */
SEC("tp_btf/ext4_sync_file_enter")
int BPF_PROG(ext4_sync_enter, struct file *file, int datasync)
{
	return begin(file->f_inode->i_sb->s_dev, datasync ? SYSCALL_FDATASYNC : SYSCALL_FSYNC);
}

SEC("tp_btf/ext4_sync_file_exit")
int BPF_PROG(ext4_sync_exit, struct inode *inode, int ret)
{
	return leave();
}
