// Package loader does what every tracer's loader does alike: prepare and load a bpf2go
// collection, attach its programs in order, read per-CPU values, delete keys, close.
package loader
