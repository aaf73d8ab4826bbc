package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/nodectl/nodectl/agent"
	"github.com/nodectl/nodectl/host/cgroup"
	"github.com/nodectl/nodectl/internal/browsertest"
)

// Names on a shared node are anybody's: a cgroup's (a directory a tenant may name, with
// anything but a slash and a newline), a process's (its executable's file name, newline
// included). A cgroup named with HTML, quotes and a terminal's escape sequence holds a process
// so named that is OOM-killed: the agent's metrics still parse and carry the name as it is,
// the incident's JSON decodes to it (the process's name escaped as /proc/<pid>/status prints
// it), the text outputs hold no line the name forged and no escape sequence, and the
// post-mortem's page shows it as text (Chromium makes no request and runs no script of it).
func TestHostileNamesStayInert(t *testing.T) {
	requireRoot(t)
	layout, err := cgroup.Detect("/sys/fs/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	const leaf = `evil <img src=x onerror="console.error('pwned')"> & "q" \ ,=` + "\x1b]0;pwned\x07"
	root := testCgroups(t, layout, "test-hostile", map[string]cgroup.Limits{leaf: {MemoryBytes: 32 << 20, NoSwap: true}})
	cg := root + "/" + leaf
	// A shell under a name with a newline, a tag and quotes: the kernel's comm of the process.
	const comm = "<b>\nFORGED \"x'"
	exe := filepath.Join(t.TempDir(), comm)
	sh, err := os.ReadFile("/bin/sh")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(exe, sh, 0o755); err != nil {
		t.Fatal(err)
	}
	dataDir := filepath.Join(t.TempDir(), "agent")
	ag := startAgent(t, dataDir, "--metrics-listen", "127.0.0.1:0",
		"--incident-before", "2s", "--incident-after", "4s", "--incident-baseline", "4s")
	metrics := metricsURL(t, ag.log)
	time.Sleep(5 * time.Second)

	outgrow(t, layout, cg, exe)
	in := waitIncident(t, ag.sock, agent.TriggerOOMKill, cg, 60*time.Second)
	t.Logf("incident %s on %q: %q", in.ID, in.Cgroup, in.Evidence)
	if escaped := `<b>\nFORGED "x'`; !strings.Contains(in.Evidence, escaped) {
		t.Errorf("the incident's evidence %q, from its JSON, does not name the process %q as %q", in.Evidence, comm, escaped)
	}

	t.Run("metrics", func(t *testing.T) {
		parser := expfmt.NewTextParser(model.LegacyValidation)
		families, err := parser.TextToMetricFamilies(bytes.NewReader(scrape(t, metrics)))
		if err != nil {
			t.Fatalf("the metrics do not parse: %v", err)
		}
		var named int
		for _, f := range families {
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					if strings.HasSuffix(l.GetValue(), "/"+leaf) {
						named++
					}
					if !model.LabelValue(l.GetValue()).IsValid() {
						t.Errorf("%s: label %s=%q is not valid UTF-8", f.GetName(), l.GetName(), l.GetValue())
					}
				}
			}
		}
		if named == 0 {
			t.Errorf("no series is labelled with the workload of the cgroup %q", cg)
		}
	})

	t.Run("text", func(t *testing.T) {
		for _, args := range [][]string{
			{"agent", "incidents", "--socket", ag.sock},
			{"postmortem", "--socket", ag.sock, "--incident", in.ID},
		} {
			out, err := nodectl(t, args...)
			if err != nil {
				t.Fatalf("%s: %v", strings.Join(args[:2], " "), err)
			}
			if strings.ContainsRune(out, 0x1b) {
				t.Errorf("%s: the cgroup's escape sequence reached the terminal: %q", strings.Join(args[:2], " "), out)
			}
			for _, line := range strings.Split(out, "\n") {
				if strings.HasPrefix(line, "FORGED") {
					t.Errorf("%s: the process's name forged a line: %q", strings.Join(args[:2], " "), line)
				}
			}
		}
	})

	t.Run("json", func(t *testing.T) {
		out, err := nodectl(t, "postmortem", "--socket", ag.sock, "--incident", in.ID, "-o", "json")
		if err != nil {
			t.Fatal(err)
		}
		if !json.Valid([]byte(out)) {
			t.Fatalf("the post-mortem's JSON does not parse:\n%s", out)
		}
		if !strings.Contains(out, mustJSON(t, cg)) {
			t.Errorf("the post-mortem's JSON does not name the cgroup %q", cg)
		}
	})

	t.Run("html", func(t *testing.T) {
		html := filepath.Join(t.TempDir(), "postmortem.html")
		if _, err := nodectl(t, "postmortem", "--socket", ag.sock, "--incident", in.ID, "--html", html); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(html)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte("<img")) || bytes.Contains(b, []byte("<b>")) {
			t.Errorf("the page holds the names' tags unescaped")
		}
		for _, p := range browsertest.Open(t, html, "hostile-names").Problems {
			t.Errorf("chromium: %s", p)
		}
	})
	ag.stop(t)
}

// mustJSON is v encoded as JSON, without HTML escaping (as the CLI writes it).
func mustJSON(t *testing.T, v any) string {
	t.Helper()
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(b.String())
}
