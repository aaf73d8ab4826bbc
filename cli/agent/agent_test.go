package agent

import (
	"io"
	"strings"
	"testing"
)

// A bad setting is refused before anything starts, naming the flag, its value and what it
// must be.
func TestAgentRefusesBadSettings(t *testing.T) {
	for name, c := range map[string]struct {
		args []string
		want string
	}{
		"short interval":      {[]string{"--interval", "10ms"}, "--interval 10ms: must be at least 100ms"},
		"no cgroups":          {[]string{"--max-cgroups", "0"}, "--max-cgroups 0: must be at least 1"},
		"negative size":       {[]string{"--retention-size", "-1"}, "--retention-size -1: must not be negative"},
		"negative age":        {[]string{"--retention-age", "-1h"}, "--retention-age -1h0m0s: must not be negative"},
		"short segment":       {[]string{"--segment-span", "2s"}, "--segment-span 2s: must be at least 10s"},
		"short series idle":   {[]string{"--series-idle", "0s"}, "--series-idle 0s: must be at least 10s"},
		"stall trigger":       {[]string{"--trigger-runq-stall", "0s"}, "--trigger-runq-stall"},
		"window after":        {[]string{"--incident-after", "-1s"}, "--incident-after"},
		"psi share above one": {[]string{"--trigger-memory-psi-full", "2"}, "--trigger-memory-psi-full"},
		"lease trigger":       {[]string{"--trigger-lease-late", "1ms"}, "--trigger-lease-late 1ms: must be at least 100ms"},
		"no node name":        {[]string{"--kubeconfig", "/dev/null", "--node-name", ""}, "--node-name: required"},
		"no kubeconfig":       {[]string{"--kubeconfig", "/nonexistent/kubeconfig", "--node-name", "n1"}, "--kubeconfig /nonexistent/kubeconfig"},
		"cri socket":          {[]string{"--kubeconfig", "/dev/null", "--node-name", "n1", "--cri-socket", "/dev/null"}, "--cri-socket /dev/null: not a socket"},
	} {
		t.Run(name, func(t *testing.T) {
			cmd := New()
			cmd.SetArgs(c.args)
			cmd.SetOut(io.Discard)
			cmd.SetErr(io.Discard)
			err := cmd.Execute()
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%v: %v, want an error with %q", c.args, err, c.want)
			}
		})
	}
}
