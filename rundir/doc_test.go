package rundir_test

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/nodectl/nodectl/rundir"
)

// docSection is the text of docs/run-format.md from the heading to the next heading of the
// same or a higher level.
func docSection(t *testing.T, doc, heading string) string {
	t.Helper()
	i := strings.Index(doc, "\n"+heading+"\n")
	if i < 0 {
		t.Fatalf("docs/run-format.md has no %q", heading)
	}
	rest := doc[i+len(heading)+2:]
	level := strings.Repeat("#", strings.Count(strings.Fields(heading)[0], "#"))
	if j := regexp.MustCompile(`\n` + level + ` `).FindStringIndex(rest); j != nil {
		rest = rest[:j[0]]
	}
	return rest
}

// tableRow is the cells after the first of the table row whose first cell is `key`.
func tableRow(t *testing.T, section, key string) string {
	t.Helper()
	for line := range strings.Lines(section) {
		if strings.HasPrefix(line, "| `"+key+"` |") {
			return line
		}
	}
	t.Fatalf("docs/run-format.md has no table row for %q", key)
	return ""
}

var backticked = regexp.MustCompile("`([^`]+)`")

func quotedIn(s string) []string {
	var out []string
	for _, m := range backticked.FindAllStringSubmatch(s, -1) {
		out = append(out, m[1])
	}
	return out
}

// sameSet reports the names only one side has.
func sameSet(t *testing.T, what string, code, doc []string) {
	t.Helper()
	for _, c := range code {
		if !slices.Contains(doc, c) {
			t.Errorf("%s %q is in package rundir but not in docs/run-format.md", what, c)
		}
	}
	for _, d := range doc {
		if !slices.Contains(code, d) {
			t.Errorf("%s %q is in docs/run-format.md but not in package rundir", what, d)
		}
	}
}

// TestDocMatchesPackage holds docs/run-format.md and this package to the same names: every
// record type, workload kind, scenario and metric is documented, and nothing documented is
// missing from the code.
func TestDocMatchesPackage(t *testing.T) {
	b, err := os.ReadFile("../docs/run-format.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	consts := contractConsts(t)
	named := func(prefix string) []string {
		var out []string
		for name, v := range consts {
			if strings.HasPrefix(name, prefix) {
				out = append(out, v)
			}
		}
		return out
	}

	records := docSection(t, doc, "## records.jsonl")
	sameSet(t, "record type", named("Type"), quotedIn(strings.SplitN(tableRow(t, records, "type"), "|", 5)[3]))

	meta := docSection(t, doc, "## meta.json")
	sameSet(t, "workload kind", rundir.Kinds, quotedIn(strings.SplitN(tableRow(t, meta, "kind"), "|", 4)[2]))
	sameSet(t, "workload kind", rundir.Kinds, named("Kind"))
	sameSet(t, "scenario", rundir.Scenarios, quotedIn(strings.SplitN(tableRow(t, meta, "scenario"), "|", 5)[3]))
	sameSet(t, "scenario", rundir.Scenarios, named("Scenario"))

	// Every metric has a row of its own in the Metrics section.
	var documented []string
	for line := range strings.Lines(docSection(t, doc, "## Metrics")) {
		if m := regexp.MustCompile("^\\| `([a-z0-9_]+)` \\|").FindStringSubmatch(line); m != nil {
			documented = append(documented, m[1])
		}
	}
	sameSet(t, "metric", named("Metric"), documented)

	// Every event name is documented where its producer is.
	for name, v := range consts {
		if strings.HasPrefix(name, "Event") && name != "EventStart" && name != "EventEnd" && !strings.Contains(doc, "`"+v+"`") {
			t.Errorf("event %q (rundir.%s) is not in docs/run-format.md", v, name)
		}
	}
	density := docSection(t, doc, "### `event`")
	sameSet(t, "density-config label", rundir.DensityConfigKeys, quotedIn(strings.SplitN(tableRow(t, density, rundir.EventDensityConfig), "|", 5)[3]))
}
