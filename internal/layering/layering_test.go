package layering

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/nodectl/nodectl/"

// rules says, by package (the longest matching prefix of its path in the module), which of the
// module's packages it may import; a prefix ending in "/" covers the packages below it.
// docs/ARCHITECTURE.md explains each line.
var rules = map[string][]string{
	// Errors of a bad setting, shared by every package below the CLI.
	"internal/badvalue": {},
	"internal/maproom":  {},
	// Files replaced whole and durably, on renameio.
	"internal/atomicfile": {},
	// CPU and memory amounts in Kubernetes notation, for every command's flags.
	"internal/quantity": {},
	// Paths as /proc/swaps and mountinfo print them.
	"internal/procpath": {},
	// Times, sizes, shares and ratios as a person reads them: explanations and renderers.
	"internal/human": {},
	// Names anybody may choose, kept off a terminal's controls.
	"internal/printable": {},
	// The one /metrics server (the agent, tune watch).
	"internal/metricserver": {},
	// The pages of the process's own binary that its start mapped, given back.
	"internal/exepages": {},
	// Tests' helper: a page opened in headless Chromium.
	"internal/browsertest": {},

	// The run format is the contract, with the histogram it stores (rundir/hist): it depends
	// on nothing.
	"rundir": {},

	// The host's plumbing: where its filesystems are, cgroups, system daemons, swap files,
	// block devices, and which pod and container a cgroup is (path forms, and the names the CRI
	// and the API server give their ids).
	"host":          {},
	"host/blockdev": {},
	"host/swapfile": {"host/blockdev"},
	"host/kubeid":   {},
	"host/cgroup":   {},
	"host/daemons":  {"host/cgroup"},

	// The recording pipeline, bottom up: the kernel's readers (tracers and samplers), the
	// collector they feed, the session that assembles them, and record, the whole node
	// recorded for a while.
	"record/trace":   {"record/trace", "host/blockdev", "host/cgroup", "rundir"},
	"record/sample":  {"host/cgroup", "host/swapfile", "rundir"},
	"record/collect": {"rundir"},
	"record/session": {"record/trace", "record/sample", "record/collect", "host/cgroup", "host", "rundir"},
	"record":         {"host/cgroup", "host", "rundir"},

	// The agent's API: its protobufs depend on nothing; its server and client on the records.
	"api/agent/v1": {},
	// The always-on agent (package agent) assembles a session, the flight recorder, the API
	// and the exporter, and analyzes its incidents through agent/recorded (their reports are the
	// analyzer's); it names pods
	// through agent/cri and agent/kube. Its parts below stand alone.
	"agent":           {"host", "record", "analyzer", "internal/metricserver", "internal/exepages", "rundir", "api/agent/v1"},
	"agent/exporter":  {"host/kubeid", "rundir"},
	"agent/flightrec": {"rundir"},
	// The read side of what the agent recorded (windows of its flight recorder, its meta, its
	// incidents), for the CLI without the daemon: a data directory, or a running agent through
	// its API (agent/rpc).
	"agent/recorded": {"agent/flightrec", "agent/rpc", "analyzer", "rundir", "api/agent/v1"},
	"agent/rpc":      {"rundir", "api/agent/v1"},
	// Kubernetes' view of the node: the CRI (containers to pods) and the API server (pods,
	// the node's Lease and Node). Readers of their own, for the agent to join with cgroups.
	"agent/cri":  {},
	"agent/kube": {},
	// The readers' API over client-go's fake, for tests only.
	"agent/kube/kubefake": {},

	// The analyzer reads runs offline: never the node.
	"analyzer": {"rundir"},

	// Reports render the analyzer's findings and tables (text, JSON, HTML) and a run's records;
	// they never read the node.
	"report": {"analyzer", "rundir"},

	// The tuner changes the node through the host's plumbing; it neither runs workloads nor
	// analyzes.
	"tuner": {"tuner", "host/cgroup", "host/daemons", "host", "host/swapfile"},

	// Scenarios drive workloads and record them; they honour the tuner's state and change
	// host settings through its backends, but leave explaining to the analyzer.
	"stress": {"stress", "host", "record", "rundir", "tuner"},
	// Validation runs a scenario before and after a tuning profile and compares the runs:
	// the one scenario package that analyzes.
	"stress/validate": {"stress", "tuner", "analyzer", "rundir"},

	// Commands may use everything below them, but not each other, except through cli/internal and
	// the main package that assembles them.
	"cli/": {"agent/recorded", "agent/rpc", "agent/kube", "api/agent/v1", "analyzer", "host", "internal/metricserver", "record", "report", "rundir", "stress", "tuner", "cli/internal/"},
	// cli/agent runs the daemon.
	"cli/agent":   {"agent", "analyzer", "api/agent/v1", "host", "internal/metricserver", "record", "rundir", "cli/internal/"},
	"cli/nodectl": {"cli/", "agent", "analyzer", "host", "rundir", "stress", "tuner"},
	// Benchmarks run the real binary; the post-mortem one also analyzes in process.
	"bench/": {"agent", "host", "record", "bench/internal/"},

	// The cluster tests' harness (a real control plane and kubelet) stands apart: it runs
	// Kubernetes, not nodectl, so the code under test cannot lean on it.
	"testcluster": {},
	// The VM lane builds the test binaries and boots them; it imports nothing of nodectl's.
	"testvm": {},
	// Build tools (make image) wrap the binary; they import nothing of nodectl's.
	"build/": {},
	// deploy/ holds manifests; its test renders them with kustomize.
	"deploy": {},
}

// tests may also import these, by the same prefixes as rules: helpers and the packages a test
// provokes or checks an effect with.
var tests = map[string][]string{
	"agent/cri":      {"host/cgroup"},                             // containers in real cgroups
	"agent/exporter": {"record/collect", "internal/metricserver"}, // a collector's snapshots, served
	"agent/kube":     {"testcluster"},                             // a real API server
	"record/sample":  {"analyzer"},                                // swap thrashing, as the analyzer names it
	"bench/":         {"rundir", "api/agent/v1"},                  // the agent's API, asked as a client asks it
	"cli/nodectl":    {"internal/browsertest"},
	"report":         {"internal/browsertest"},
	// The cluster suite: the agent's and the analyzer's types, read back from the cluster.
	"testcluster/e2e": {"testcluster", "agent", "analyzer", "rundir"},
}

// everyone may import these: they depend on nothing of the module.
var everyone = []string{"internal/badvalue", "internal/maproom", "internal/atomicfile", "internal/quantity", "internal/human", "internal/procpath", "internal/printable"}

// ruleFor is the rule of the longest prefix matching pkg.
func ruleFor(pkg string) (string, []string, bool) { return longest(rules, pkg) }

// longest is the entry of m with the longest prefix matching pkg.
func longest(m map[string][]string, pkg string) (string, []string, bool) {
	best, found := "", false
	for prefix := range m {
		if covers(prefix, pkg) && (!found || len(prefix) > len(best)) {
			best, found = prefix, true
		}
	}
	return best, m[best], found
}

// covers says whether prefix names pkg: the package itself or, with a trailing "/" or as a
// path element, the packages below it.
func covers(prefix, pkg string) bool {
	if strings.HasSuffix(prefix, "/") {
		return strings.HasPrefix(pkg, prefix)
	}
	return pkg == prefix || strings.HasPrefix(pkg, prefix+"/")
}

// Every package's files, its tests' too, import only what its rule allows, and every
// allowance of a rule is used by some import: a rule says what is, not what once was.
func TestImportsFollowTheHouseMap(t *testing.T) {
	root := filepath.Join("..", "..")
	fset := token.NewFileSet()
	seen := map[string]bool{}
	used := map[string]map[string]bool{}      // rule prefix -> allowances imported
	testsUsed := map[string]map[string]bool{} // the same of tests
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() != ".." && strings.HasPrefix(d.Name(), ".") {
			return filepath.SkipDir // .git, .scratch
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") {
			return nil
		}
		rel, _ := filepath.Rel(root, filepath.Dir(path))
		pkg := filepath.ToSlash(rel)
		if strings.HasPrefix(pkg, "internal/layering") {
			return nil
		}
		prefix, allowed, ok := ruleFor(pkg)
		test := strings.HasSuffix(path, "_test.go")
		tprefix, extra := "", []string(nil)
		if test {
			tprefix, extra, _ = longest(tests, pkg)
		}
		if !ok {
			if !seen[pkg] {
				t.Errorf("package %s has no import rule: add it here and to docs/ARCHITECTURE.md", pkg)
				seen[pkg] = true
			}
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			dep, ok := strings.CutPrefix(p, module)
			if !ok || dep == pkg || covers(pkg, dep) || slices.Contains(everyone, dep) {
				continue // outside the module, the package's own internals, or shared by all
			}
			if a, ok := allowance(allowed, dep); ok {
				use(used, prefix, a)
			} else if a, ok := allowance(extra, dep); ok {
				use(testsUsed, tprefix, a)
			} else {
				t.Errorf("%s imports %s, which the rule for %s does not allow (allowed: %s; to tests also: %s)",
					path, dep, prefix, strings.Join(allowed, ", "), strings.Join(extra, ", "))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for prefix, allowed := range rules {
		for _, a := range allowed {
			if !used[prefix][a] {
				t.Errorf("the rule for %s allows %s, which none of its files imports: remove it here and in docs/ARCHITECTURE.md", prefix, a)
			}
		}
	}
	for prefix, allowed := range tests {
		for _, a := range allowed {
			if !testsUsed[prefix][a] {
				t.Errorf("the tests of %s may import %s, which none of them does: remove it", prefix, a)
			}
		}
	}
}

// allowance is the most specific of allowed that covers dep.
func allowance(allowed []string, dep string) (string, bool) {
	best, found := "", false
	for _, a := range allowed {
		if covers(a, dep) && (!found || len(a) > len(best)) {
			best, found = a, true
		}
	}
	return best, found
}

func use(used map[string]map[string]bool, prefix, allowance string) {
	if used[prefix] == nil {
		used[prefix] = map[string]bool{}
	}
	used[prefix][allowance] = true
}

// The rules themselves: the prefixes match what they should.
func TestRuleFor(t *testing.T) {
	for pkg, want := range map[string]string{
		"record/trace/runq": "record/trace",
		"cli/stress":        "cli/",
		"cli/nodectl":       "cli/nodectl",
		"tuner/cpuset":      "tuner",
		"agent":             "agent",
		"agent/rpc":         "agent/rpc",
		"stress/validate":   "stress/validate",
		"stress/launch":     "stress",
		"rundir":            "rundir",
	} {
		if got, _, _ := ruleFor(pkg); got != want {
			t.Errorf("rule for %s is %q, want %q", pkg, got, want)
		}
	}
}
