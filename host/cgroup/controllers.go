package cgroup

// Controller names, as in Layout.Dir and Resolver.Path: a v1 hierarchy is found by the
// controller it carries.
const (
	CPU     = "cpu"
	CPUAcct = "cpuacct"
	CPUSet  = "cpuset"
	Memory  = "memory"
	Blkio   = "blkio"
	Pids    = "pids"
	Freezer = "freezer"
)
