// Package features probes, once per process, the kernel features the tracers choose between.
// Each probe returns nil when the feature is present, an error wrapping ebpf.ErrNotSupported
// when it is absent, and any other error when the probe could not tell.
package features
