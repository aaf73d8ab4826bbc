// Package buildinfo is what the build stamps into nodectl.
package buildinfo

// Version is nodectl's version, set at build time with -ldflags
// "-X github.com/nodectl/nodectl/cli/internal/buildinfo.Version=...".
var Version = "dev"
