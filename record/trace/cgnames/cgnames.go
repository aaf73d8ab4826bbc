// Package cgnames follows the cgroups the kernel makes and removes (the cgroup_mkdir and
// cgroup_rmdir tracepoints, with the kernel's own path of each), so that the agent names the
// kernfs ids its other programs record without CAP_DAC_READ_SEARCH (opening a cgroup by file
// handle) and without walking every hierarchy at each new id (host/cgroup.Resolver.Follow).
package cgnames
