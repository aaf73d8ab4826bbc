// Package tracefs makes tracefs available to classic tracepoints, which are looked up by name
// in its events directory. A host that has not mounted it gets it mounted for as long as it is
// needed, and then is left as it was found.
package tracefs

// DefaultDir is where tracefs is mounted when the host has not mounted it.
const DefaultDir = "/sys/kernel/tracing"
